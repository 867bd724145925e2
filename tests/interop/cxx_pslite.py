#!/usr/bin/env python3
"""C++ ps-lite programs under `pslite launch`, and C++ nodes beside a pslite
scheduler, on 127.0.0.1.

The programs are ours (tests/interop/cxx/: `connection`, `simple_app`,
`kv_app`, written against ps-lite's public API to do what ps-lite's
test_connection, test_simple_app and test_kv_app do, and to check what each
node can check); the library is C++ ps-lite, built from a checkout
(`--ps-lite DIR`, else PSLITE_CXX_SRC, else shared/third_party/ps-lite
beside the clone or its parent) into target/cxxinterop as
tests/bench/summary.py builds it (protoc, then g++ against the system's
libzmq and protobuf; Debian: g++ libzmq3-dev libprotobuf-dev
protobuf-compiler). Then:

- `launch/PROGRAM`: connection, simple_app and kv_app, each `--runs` times
  (default 20) under `pslite launch -s 2 -w 2` with C++ ps-lite's own
  scheduler: every run exits 0 and no node logs "unknown typed message"
  (the launcher never sends a C++ scheduler what it does not know);
- `pslite-scheduler/PROGRAM`: the three with pslite's scheduler
  (`--scheduler-program pslite`) and C++ servers and workers, `--runs`
  times (simple_app's requests then come from worker 0: `simple_app
  worker`): the C++ nodes leaving at the end are no deaths;
- `cxx-server-killed`: a pslite scheduler, a C++ server (connection) and a
  pslite worker (store_watch, which waits until killed); the C++ server is
  killed with SIGKILL once the cluster formed: the scheduler declares it
  dead (it sends no heartbeats; its connection closed) within 10 s and,
  with PS_RECOVERY_TIMEOUT=2, ends the job's last barrier saying so,
  instead of waiting forever.
- `cxx-servers-compression`: pslite's scheduler, two C++ servers (kv_app)
  and two pslite workers (kv_app with `KV_APP_COMPRESSION=onebit`): a C++
  server cannot read compressed values, so the workers send them as they
  are (the sums stay exact) and each worker says so once per server.

`--race` runs `kv_app late` without pslite (ps-lite's own tracker-style
start: every node started by hand beside a C++ scheduler) to show C++
ps-lite's own start-up race (see kv_app.cc); it is not a case of the test.

Prints one line per case (`PASS name (figures)` or `FAIL name (why)`), then
`N passed, N failed`; exits 1 if any failed. Without a compiler, the tools
or the ps-lite checkout it prints `SKIP` with the reason and exits 0 (CI
installs the packages; see .ci/run).

    tests/interop/cxx_pslite.py [--runs 20] [--ps-lite DIR] [--bin-dir target/release] [--only NAME]
"""

import argparse
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAMS = ["connection", "simple_app", "kv_app"]
SOURCES = ROOT / "tests" / "interop" / "cxx"
UNKNOWN = "unknown typed message"


def skip(why):
    print(f"SKIP C++ ps-lite under pslite launch ({why})")
    sys.exit(0)


def run_tool(cmd):
    made = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if made.returncode != 0:
        print(made.stdout[-3000:], made.stderr[-3000:], sep="\n")
        print(f"FAIL build ({' '.join(str(c) for c in cmd[:3])} ... failed; are libzmq3-dev and libprotobuf-dev installed?)")
        sys.exit(1)


def build(src):
    """Our programs' directory under target/cxxinterop, built against the
    ps-lite checkout `src` (as tests/bench/summary.py builds it)."""
    if not (src / "src" / "meta.proto").exists():
        skip(f"{src} is not a ps-lite checkout: give --ps-lite or PSLITE_CXX_SRC")
    for tool in ("g++", "protoc"):
        if shutil.which(tool) is None:
            skip(f"{tool} not found (Debian: g++ libzmq3-dev libprotobuf-dev protobuf-compiler)")
    out = ROOT / "target" / "cxxinterop"
    lib = out / "ps-lite"
    stamp = out / ".built-from"
    objects = [out / f"{name}.o" for name in ("customer", "postoffice", "van", "meta.pb")]
    if not (stamp.exists() and stamp.read_text() == str(src.resolve()) and all(o.exists() for o in objects)):
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(src, lib, ignore=shutil.ignore_patterns(".git", "build", "deps"))
        run_tool(["protoc", "--cpp_out=" + str(lib / "src"), "--proto_path=" + str(lib / "src"), lib / "src" / "meta.proto"])
        for name, obj in zip(("customer", "postoffice", "van", "meta.pb"), objects):
            run_tool(["g++", *FLAGS(lib), "-c", lib / "src" / f"{name}.cc", "-o", obj])
        stamp.write_text(str(src.resolve()))
    for program in PROGRAMS:
        binary = out / program
        source = SOURCES / f"{program}.cc"
        newest = max(source.stat().st_mtime, (SOURCES / "common.h").stat().st_mtime)
        if binary.exists() and binary.stat().st_mtime > newest:
            continue
        run_tool(["g++", *FLAGS(lib), "-I", SOURCES, source, *objects, "-lzmq", "-lprotobuf", "-pthread", "-o", binary])
    return out


def FLAGS(lib):
    return ["-std=c++14", "-O2", "-w", "-I", str(lib / "src"), "-I", str(lib / "include")]


def launch(bins, program, extra, timeout=60):
    """(exit code, output) of one `pslite launch -s 2 -w 2` run of `program`
    (a command: the binary and its arguments)."""
    cmd = [str(bins / "pslite"), "launch", "-s", "2", "-w", "2", "--timeout", str(timeout), *extra, "--", *map(str, program)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
        return run.returncode, run.stdout + run.stderr
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")


# The lines a passing run prints, and how many (2 servers, 2 workers; the
# scheduler counts when it is ours).
PASSED = {
    "connection": (" finalized", 4),
    "simple_app": (" handled ", 2),
    "kv_app": (": exact", 2),
}


def repeated(name, bins, program, extra, runs, logs):
    failures = []
    started = time.monotonic()
    line, count = PASSED[pathlib.Path(program[0]).name]
    for i in range(runs):
        code, out = launch(bins, program, extra)
        why = None
        if code != 0:
            why = f"exit {code}"
        elif UNKNOWN in out.lower():
            why = "a node logged an unknown typed message"
        elif out.count(line) < count:
            why = f"{out.count(line)} lines with {line.strip()!r}, expected {count} or more"
        if why:
            log = logs / f"{name.replace('/', '-')}-{i}.log"
            log.write_text(out)
            failures.append(f"run {i + 1}: {why} ({log})")
    took = time.monotonic() - started
    figures = f"{runs - len(failures)}/{runs} in {took:.0f} s"
    if failures:
        return False, f"{figures}; " + "; ".join(failures[:3])
    return True, figures


class Node:
    """A process started by hand, its output collected by a thread."""

    def __init__(self, cmd, env):
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.lines = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()

    def wait_line(self, needle, limit):
        deadline = time.monotonic() + limit
        with self.changed:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def output(self):
        with self.changed:
            return "".join(self.lines)

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_killed(bins, tests, logs):
    """See the module docs: `cxx-server-killed`."""
    port = free_port()
    base = dict(os.environ)
    base.update(
        DMLC_NUM_SERVER="1",
        DMLC_NUM_WORKER="1",
        DMLC_PS_ROOT_URI="127.0.0.1",
        DMLC_PS_ROOT_PORT=str(port),
        DMLC_NODE_HOST="127.0.0.1",
        PS_VERBOSE="1",
        PS_RECOVERY_TIMEOUT="2",
        PS_START_TIMEOUT="30",
    )
    nodes = []

    def start(role, cmd):
        env = dict(base, DMLC_ROLE=role)
        node = Node(cmd, env)
        nodes.append(node)
        return node

    try:
        sched = start("scheduler", [str(bins / "pslite"), "scheduler"])
        server = start("server", [str(tests / "connection")])
        worker = start("worker", [str(bins / "examples" / "store_watch"), "never-set"])
        if worker.wait_line("watching never-set", 30) is None:
            return False, "the cluster did not form within 30 s"
        killed = time.monotonic()
        server.kill()
        server.proc.wait(10)
        dead = sched.wait_line("node 8 is dead", 10)
        if dead is None:
            return False, "the scheduler did not declare the killed C++ server dead within 10 s"
        declared = time.monotonic() - killed
        try:
            code = sched.proc.wait(20)
        except subprocess.TimeoutExpired:
            return False, "the scheduler still waits in its last barrier 20 s after the death"
        said = sched.wait_line("barrier over group", 0) or sched.wait_line("node 8", 0)
        if code == 0:
            return False, "the scheduler exited 0 although its last barrier lost node 8"
        return True, f"declared dead {declared:.1f} s after SIGKILL; scheduler exit {code}: {said.strip()}"
    finally:
        for node in nodes:
            node.kill()
        text = "".join(f"=== {i}\n{n.output()}" for i, n in enumerate(nodes))
        (logs / "cxx-server-killed.log").write_text(text)


def servers_compression(bins, tests, logs):
    """See the module docs: `cxx-servers-compression`."""
    env = dict(os.environ, KV_APP_COMPRESSION="onebit", KV_APP_KEYS="1000", KV_APP_REPEAT="5")
    cmd = [
        str(bins / "pslite"), "launch", "-s", "2", "-w", "2", "--timeout", "60",
        "--scheduler-program", "pslite", "--server-program", str(tests / "kv_app"),
        "--", str(bins / "examples" / "kv_app"),
    ]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
        code, out = run.returncode, run.stdout + run.stderr
    except subprocess.TimeoutExpired as e:
        code, out = None, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    told = out.count("does not read compressed values")
    exact = out.count("sums exact")
    why = None
    if code != 0:
        why = f"exit {code}"
    elif exact != 2:
        why = f"{exact} workers with exact sums, expected 2"
    elif told != 4:
        why = f"{told} lines saying a server does not read compressed values, expected 4 (once per worker and server)"
    if why:
        (logs / "cxx-servers-compression.log").write_text(out)
        return False, why
    return True, "sums exact, each worker told once per C++ server"


def race(tests, runs):
    """`kv_app late` started by hand (no pslite at all: a C++ scheduler, 2
    servers, 2 workers), `runs` times: how often C++ ps-lite's own start-up
    race fails a run."""
    failed = []
    for i in range(runs):
        port = free_port()
        base = dict(os.environ, DMLC_NUM_SERVER="2", DMLC_NUM_WORKER="2", DMLC_PS_ROOT_URI="127.0.0.1",
                    DMLC_PS_ROOT_PORT=str(port), DMLC_NODE_HOST="127.0.0.1")
        procs = [subprocess.Popen([str(tests / "kv_app"), "late"], env=dict(base, DMLC_ROLE=role),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for role in ["scheduler", "server", "server", "worker", "worker"]]
        outs = []
        codes = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            outs.append(out)
            codes.append(p.returncode)
        if any(c != 0 for c in codes):
            why = next((line for out in outs for line in out.splitlines() if "Check failed" in line or "timeout" in line),
                       f"exit codes {codes}")
            failed.append(f"run {i + 1}: {why.strip()}")
    print(f"kv_app late without pslite: {runs - len(failed)}/{runs} passed")
    for f in failed[:5]:
        print(f"  {f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    beside = [up / "shared" / "third_party" / "ps-lite" for up in (ROOT.parent, ROOT.parent.parent)]
    parser.add_argument(
        "--ps-lite",
        default=os.environ.get("PSLITE_CXX_SRC") or str(next((b for b in beside if b.exists()), beside[0])),
    )
    parser.add_argument("--bin-dir", default=str(ROOT / "target" / "release"))
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this")
    parser.add_argument("--race", action="store_true", help="run `kv_app late` without pslite (see the module docs)")
    args = parser.parse_args()
    bins = pathlib.Path(args.bin_dir)
    for needed in (bins / "pslite", bins / "examples" / "store_watch", bins / "examples" / "kv_app"):
        if not needed.exists():
            print(f"FAIL setup ({needed} missing: cargo build --release -p pslite -p pslite-cli --bins --examples)")
            sys.exit(1)
    tests = build(pathlib.Path(args.ps_lite))
    if args.race:
        race(tests, args.runs)
        return
    logs = pathlib.Path(tempfile.mkdtemp(prefix="pslite-cxx-"))
    cases = []
    for program in PROGRAMS:
        name = f"launch/{program}"
        cases.append((name, lambda p=program, n=name: repeated(n, bins, [tests / p], [], args.runs, logs)))
    # simple_app's requests come from worker 0 when the scheduler is not ours.
    for program, extra_args in [("connection", []), ("simple_app", ["worker"]), ("kv_app", [])]:
        name = f"pslite-scheduler/{program}"
        cmd = [tests / program, *extra_args]
        extra = ["--scheduler-program", "pslite"]
        cases.append((name, lambda c=cmd, n=name: repeated(n, bins, c, extra, args.runs, logs)))
    cases.append(("cxx-server-killed", lambda: server_killed(bins, tests, logs)))
    cases.append(("cxx-servers-compression", lambda: servers_compression(bins, tests, logs)))
    passed = failed = 0
    for name, case in cases:
        if args.only and args.only not in name:
            continue
        ok, detail = case()
        print(f"{'PASS' if ok else 'FAIL'} {name} ({detail})", flush=True)
        passed += ok
        failed += not ok
    if failed == 0:
        shutil.rmtree(logs, ignore_errors=True)
    else:
        print(f"logs of the failed runs: {logs}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
