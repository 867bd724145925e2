#!/usr/bin/env python3
"""Offline check of deploy/: every Kubernetes manifest parses, has the
fields its kind requires with the right types (a small schema of the parts
we use), and the objects fit together the way `pslite exec` expects
(headless Service, pod names, PSLITE_WORLD_SIZE = pod count,
PS_BIND_HOST=0.0.0.0, a readiness probe on the node's port). Each kind fits
its use: a Job (batch: restartPolicy Never, backoffLimit 0) and a
StatefulSet only for long-running servers (it restarts pods that exit, so it
must not run a batch example, and it has the recovery settings: PS_RESEND=1,
PS_RECOVERY_TIMEOUT); both have heartbeats, with the same values. Where
`kubectl` is installed, `kubectl apply --dry-run=client` runs on every file
too (it needs an API server for the kinds' mapping: without one it is
reported as skipped, with the reason). deploy/slurm/*.sbatch: bash syntax,
`srun --label ... pslite exec`, enough tasks for the servers. Prints one
summary line; exits 1 with the problems otherwise. Needs PyYAML (Debian:
python3-yaml)."""

import pathlib
import re
import shutil
import subprocess
import sys

import yaml

# kind -> (apiVersion, {dotted path: type}) for the fields we rely on.
SCHEMA = {
    "Service": ("v1", {"metadata.name": str, "spec.selector": dict, "spec.ports": list}),
    "StatefulSet": ("apps/v1", {
        "metadata.name": str, "spec.serviceName": str, "spec.replicas": int,
        "spec.selector.matchLabels": dict, "spec.template.metadata.labels": dict,
        "spec.template.spec.containers": list,
    }),
    "Job": ("batch/v1", {
        "metadata.name": str, "spec.completions": int, "spec.parallelism": int,
        "spec.completionMode": str, "spec.template.metadata.labels": dict,
        "spec.template.spec.containers": list, "spec.template.spec.restartPolicy": str,
    }),
}
CONTAINER = {"name": str, "image": str, "command": list, "env": list, "readinessProbe": dict}
# Programs of this repository that end on their own (apps/examples): a
# StatefulSet would run them again and again.
BATCH_EXAMPLES = {p.stem for p in (pathlib.Path(__file__).resolve().parents[2] / "apps" / "examples").glob("*.rs")}
# What kubectl says when no API server answers.
NO_API_SERVER = ("connection refused", "couldn't get current server API group list",
                 "unable to recognize", "no configuration has been provided", "failed to download openapi")


def get(obj, path):
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def check(doc, where, services, problems):
    kind = doc.get("kind")
    if kind not in SCHEMA:
        problems.append(f"{where}: unknown kind {kind!r}")
        return None
    api, fields = SCHEMA[kind]
    if doc.get("apiVersion") != api:
        problems.append(f"{where}: {kind} needs apiVersion {api}, has {doc.get('apiVersion')!r}")
    for path, typ in fields.items():
        value = get(doc, path)
        if not isinstance(value, typ) or isinstance(value, bool):
            problems.append(f"{where}: {kind}.{path} must be a {typ.__name__}, got {value!r}")
    name = get(doc, "metadata.name")
    if kind == "Service":
        if get(doc, "spec.clusterIP") != "None":
            problems.append(f"{where}: Service {name} must be headless (clusterIP: None)")
        if get(doc, "spec.publishNotReadyAddresses") is not True:
            problems.append(f"{where}: Service {name} needs publishNotReadyAddresses: true")
        services[name] = get(doc, "spec.selector") or {}
        return f"Service {name}"
    labels = get(doc, "spec.template.metadata.labels") or {}
    if kind == "StatefulSet":
        pods = get(doc, "spec.replicas")
        service = get(doc, "spec.serviceName")
        if get(doc, "spec.selector.matchLabels") != labels:
            problems.append(f"{where}: selector does not match the template's labels")
    else:
        pods = get(doc, "spec.completions")
        service = get(doc, "spec.template.spec.subdomain")
        if get(doc, "spec.completionMode") != "Indexed":
            problems.append(f"{where}: the Job must be Indexed (JOB_COMPLETION_INDEX is the rank)")
        if get(doc, "spec.parallelism") != pods:
            problems.append(f"{where}: parallelism must equal completions (all nodes run at once)")
    restart = get(doc, "spec.template.spec.restartPolicy")
    if kind == "Job":
        if restart != "Never" or get(doc, "spec.backoffLimit") != 0:
            problems.append(f"{where}: a batch Job runs each node once: restartPolicy Never, backoffLimit 0")
    elif restart not in (None, "Always"):
        problems.append(f"{where}: a StatefulSet's pods always restart (restartPolicy Always)")
    for c in get(doc, "spec.template.spec.containers") or []:
        for field, typ in CONTAINER.items():
            if not isinstance(c.get(field), typ):
                problems.append(f"{where}: container {c.get('name')!r} needs {field} ({typ.__name__})")
        env = {}
        for e in c.get("env") or []:
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                problems.append(f"{where}: env entry without a name: {e!r}")
                continue
            if ("value" in e) == ("valueFrom" in e):
                problems.append(f"{where}: env {e['name']} needs exactly one of value, valueFrom")
            if "value" in e and not isinstance(e["value"], str):
                problems.append(f"{where}: env {e['name']} value must be a string (quote it)")
            env[e["name"]] = e.get("value", e.get("valueFrom"))
        command = c.get("command") or []
        if command[:2] != ["pslite", "exec"]:
            problems.append(f"{where}: the container must run `pslite exec ...`")
        want = {"PSLITE_WORLD_SIZE": str(pods), "PSLITE_SERVICE": service, "PS_BIND_HOST": "0.0.0.0"}
        for var, value in want.items():
            if env.get(var) != value:
                problems.append(f"{where}: env {var} must be {value!r}, is {env.get(var)!r}")
        if get(env.get("POD_IP"), "fieldRef.fieldPath") != "status.podIP":
            problems.append(f"{where}: POD_IP must come from status.podIP")
        port = int(env.get("PORT") or 0)
        if get(c, "readinessProbe.tcpSocket.port") != port:
            problems.append(f"{where}: the readiness probe must check PORT ({port})")
        if "--servers" in command:
            servers = int(command[command.index("--servers") + 1])
            if pods < servers + 2:
                problems.append(f"{where}: {pods} pods cannot hold a scheduler, {servers} servers and a worker")
        interval, timeout = env.get("PS_HEARTBEAT_INTERVAL"), env.get("PS_HEARTBEAT_TIMEOUT")
        if not (isinstance(interval, str) and isinstance(timeout, str)
                and interval.isdigit() and timeout.isdigit() and 0 < int(interval) < int(timeout)):
            problems.append(f"{where}: needs PS_HEARTBEAT_INTERVAL < PS_HEARTBEAT_TIMEOUT (dead pods noticed)")
        program = pathlib.PurePath(command[-1]).name if command else ""
        if kind == "StatefulSet":
            if program in BATCH_EXAMPLES:
                problems.append(f"{where}: a StatefulSet restarts pods that exit: the batch program "
                                f"{program!r} belongs in a Job")
            if env.get("PS_RESEND") != "1" or not env.get("PS_RECOVERY_TIMEOUT"):
                problems.append(f"{where}: restarted pods rejoin by recovery: set PS_RESEND=1 and PS_RECOVERY_TIMEOUT")
        shared = {k: v for k, v in env.items() if k.startswith(("PS_HEARTBEAT_", "PS_BIND_HOST", "DMLC_PS_ROOT_PORT", "PORT"))}
    return (kind, name, service, labels, where, shared)


def main():
    folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/kubernetes")
    files = sorted(folder.glob("*.yaml"))
    problems, services, seen, workloads = [], {}, [], []
    if not files:
        problems.append(f"no manifests in {folder}")
    for f in files:
        try:
            docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        except yaml.YAMLError as e:
            problems.append(f"{f.name}: not YAML: {e}")
            continue
        for i, doc in enumerate(docs):
            result = check(doc, f"{f.name}#{i}", services, problems)
            if isinstance(result, tuple):
                workloads.append(result)
                seen.append(f"{result[0]} {result[1]}")
            elif result:
                seen.append(result)
    for kind, name, service, labels, where, shared in workloads:
        if service not in services:
            problems.append(f"{where}: {kind} {name} names Service {service!r}, which no manifest defines")
        elif any(labels.get(k) != v for k, v in services[service].items()):
            problems.append(f"{where}: Service {service} does not select the pods of {kind} {name}")
        first = workloads[0]
        if shared != first[5]:
            problems.append(f"{where}: settings {shared} differ from {first[4]}'s {first[5]}")
    kubectl = kubectl_dry_run(files, problems)
    slurm = check_slurm(folder.parent / "slurm", problems)
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"{len(files)} files: {', '.join(seen)}: schema and cross-checks ok; {kubectl}; {slurm}")


def kubectl_dry_run(files, problems):
    """`kubectl apply --dry-run=client` on every file, where kubectl exists."""
    if shutil.which("kubectl") is None:
        return "kubectl dry run skipped: no kubectl"
    for f in files:
        try:
            r = subprocess.run(["kubectl", "apply", "--dry-run=client", "-f", str(f)],
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            problems.append(f"{f.name}: kubectl apply --dry-run=client took over 60 s")
            continue
        if r.returncode == 0:
            continue
        if any(s in r.stderr for s in NO_API_SERVER):
            return ("kubectl dry run skipped: no API server reachable (kubectl's client dry run "
                    "asks one for the kinds' mapping)")
        problems.append(f"{f.name}: kubectl apply --dry-run=client: {r.stderr.strip()}")
    return "kubectl apply --dry-run=client ok"


def check_slurm(folder, problems):
    """deploy/slurm batch scripts: bash syntax, srun --label running pslite exec."""
    scripts = sorted(folder.glob("*.sbatch"))
    for f in scripts:
        text = f.read_text()
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"{f.name}: not valid bash: {r.stderr.strip()}")
        runs = [line for line in text.splitlines() if line.lstrip().startswith("srun ")]
        if not runs:
            problems.append(f"{f.name}: no srun line")
        for line in runs:
            words = line.split()
            if "--label" not in words and "-l" not in words:
                problems.append(f"{f.name}: srun without --label (output lines would not say their rank)")
            if "pslite exec" not in line:
                problems.append(f"{f.name}: srun must run `pslite exec ...`")
            servers = re.search(r"--servers[ =](\d+)", line)
            tasks = re.search(r"^#SBATCH --ntasks[ =](\d+)", text, re.M)
            if servers and tasks and int(tasks.group(1)) < int(servers.group(1)) + 2:
                problems.append(f"{f.name}: {tasks.group(1)} tasks cannot hold a scheduler, "
                                f"{servers.group(1)} servers and a worker")
    return f"{len(scripts)} Slurm script{'s' if len(scripts) != 1 else ''} ok"


if __name__ == "__main__":
    main()
