#!/usr/bin/env python3
"""Launch one ps-lite `dist_sync` job on 127.0.0.1: 1 scheduler + N servers + M workers.

By default every node is MXNet 1.9.1 (mx_node.py under the venv python). Any role can be
swapped for another program (e.g. the Rust pslite binaries) with --scheduler/--server/--worker:
the command runs through `sh -c` with the same DMLC_* environment MXNet gets. --server and
--worker may be repeated; the i-th one is used for the i-th instance, "mx" means mx_node.py,
and instances without one are MXNet. (ps-lite ranks follow the nodes' port order, not the
launch order.)

Each process runs under `timeout` in its own process group; whatever is still alive at the end
is killed by group id. Prints per-process results, then exactly one line
`PASS <label>` or `FAIL <label> (<reason>)`; exit status 0 only on PASS.
A node passes if it exits 0; an MXNet worker must also print its final PASS line.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MX_NODE = os.path.join(HERE, "mx_node.py")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds, per process (default 120)")
    ap.add_argument("--python", default=os.environ.get("PSLITE_INTEROP_PYTHON", sys.executable),
                    help="python with mxnet (default: this interpreter or $PSLITE_INTEROP_PYTHON)")
    ap.add_argument("--scheduler", default="mx", help="command for the scheduler, or 'mx'")
    ap.add_argument("--server", action="append", default=[], help="command for server i (repeatable)")
    ap.add_argument("--worker", action="append", default=[], help="command for worker i (repeatable)")
    ap.add_argument("--label", default=None, help="name in the PASS/FAIL line (default: mxnet-only or mixed)")
    ap.add_argument("--verbose", type=int, default=None, help="PS_VERBOSE for every node (1 or 2)")
    ap.add_argument("--env", action="append", default=[], help="extra KEY=VALUE for every node")
    ap.add_argument("--logdir", default=None, help="keep per-process logs here (default: temp dir, removed on PASS)")
    ap.add_argument("--show-logs", action="store_true", help="print every process log at the end")
    a = ap.parse_args()

    cmds = {"scheduler": [a.scheduler]}
    cmds["server"] = [(a.server[i] if i < len(a.server) else "mx") for i in range(a.servers)]
    cmds["worker"] = [(a.worker[i] if i < len(a.worker) else "mx") for i in range(a.workers)]
    all_mx = all(c == "mx" for v in cmds.values() for c in v)
    label = a.label or ("mxnet-only" if all_mx else "mixed")

    logdir = a.logdir or tempfile.mkdtemp(prefix="pslite-interop-")
    os.makedirs(logdir, exist_ok=True)
    port = free_port()

    base_env = dict(os.environ)
    base_env.update({
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(a.servers),
        "DMLC_NUM_WORKER": str(a.workers),
        "DMLC_NODE_HOST": "127.0.0.1",
        "DMLC_INTERFACE": "lo",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": base_env.get("OMP_NUM_THREADS", "1"),
    })
    for v in ("DMLC_RANK", "PORT", "DMLC_LOCAL", "DMLC_PS_VAN_TYPE", "DMLC_ROLE"):
        base_env.pop(v, None)
    if a.verbose is not None:
        base_env["PS_VERBOSE"] = str(a.verbose)
    for kv in a.env:
        k, _, v = kv.partition("=")
        base_env[k] = v

    procs = []  # (name, cmd, Popen, logpath, is_mx)
    t_start = time.time()
    for role in ("scheduler", "server", "worker"):
        for i, c in enumerate(cmds[role]):
            name = role if role == "scheduler" else "%s%d" % (role, i)
            env = dict(base_env, DMLC_ROLE=role)
            is_mx = c == "mx"
            argv = [a.python, MX_NODE] if is_mx else ["sh", "-c", c]
            argv = ["timeout", "-k", "5", "%g" % a.timeout] + argv
            logpath = os.path.join(logdir, name + ".log")
            f = open(logpath, "wb")
            p = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            f.close()
            procs.append((name, c, p, logpath, is_mx))

    # wait: all exit, or the deadline; once one node fails, give the rest a short grace
    deadline = t_start + a.timeout + 10
    first_fail = None
    while time.time() < deadline:
        running = [x for x in procs if x[2].poll() is None]
        if not running:
            break
        if first_fail is None:
            bad = [x for x in procs if x[2].returncode not in (None, 0)]
            if bad:
                first_fail = time.time()
                deadline = min(deadline, first_fail + 15)
        time.sleep(0.2)
    killed = []
    for name, _, p, _, _ in procs:
        if p.poll() is None:
            killed.append(name)
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group we created for this child only
            except ProcessLookupError:
                pass
    for _, _, p, _, _ in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    elapsed = time.time() - t_start

    problems = []
    for name, c, p, logpath, is_mx in procs:
        with open(logpath, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        rc = p.returncode
        ok = rc == 0 and name not in killed
        why = ""
        if name in killed:
            why = "killed at deadline"
        elif rc == 124:
            why = "timed out"
        elif rc != 0:
            why = "exit %s" % rc
        if ok and is_mx and name.startswith("worker") and "all checks" not in text:
            ok, why = False, "no final PASS line"
        if ok and is_mx and "FAIL [" in text:
            ok, why = False, "printed FAIL"
        print("%-10s %-4s %s%s" % (name, "ok" if ok else "BAD", "mxnet" if is_mx else c,
                                   "" if ok else "  (%s)" % why))
        if not ok:
            problems.append("%s %s" % (name, why))
        if a.show_logs or not ok:
            lines = text.splitlines()
            shown = lines if a.show_logs else lines[-25:]
            for ln in shown:
                print("    | " + ln)
    keep = problems or a.logdir is not None or a.show_logs
    print("%sport: %d  elapsed: %.1fs" % ("logs: %s  " % logdir if keep else "", port, elapsed))
    if problems:
        print("FAIL %s (%s)" % (label, "; ".join(problems)))
        return 1
    if a.logdir is None and not a.show_logs:
        shutil.rmtree(logdir, ignore_errors=True)
    print("PASS %s" % label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
