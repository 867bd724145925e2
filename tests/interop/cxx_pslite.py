#!/usr/bin/env python3
"""C++ ps-lite's own test programs under `pslite launch`, and C++ nodes beside
a pslite scheduler, on 127.0.0.1.

Builds dmlc/ps-lite's library and test programs (`tests/test_*.cc`) from a
checkout (`--ps-lite DIR`, else PSLITE_CXX_SRC, else shared/third_party/
ps-lite beside the clone or its parent) into target/ps-lite, as that checkout's README says
(`make ps test` against the system's libzmq and protobuf; Debian: g++ make
libzmq3-dev libprotobuf-dev protobuf-compiler), once per checkout. Then:

- `launch/PROGRAM`: test_connection, test_simple_app and test_kv_app, each
  `--runs` times (default 20) under `pslite launch -s 2 -w 2` with C++
  ps-lite's own scheduler: every run exits 0 and no node logs "unknown typed
  message" (the launcher never sends a C++ scheduler what it does not know);
- `pslite-scheduler/PROGRAM`: test_connection and test_kv_app with pslite's
  scheduler (`--scheduler-program pslite`) and C++ servers and workers,
  `--runs` times: the C++ nodes leaving at the end are no deaths
  (test_simple_app's scheduler sends the requests, so it needs its own);
- `cxx-server-killed`: a pslite scheduler, a C++ server (test_connection) and
  a pslite worker (store_watch, which waits until killed); the C++ server is
  killed with SIGKILL once the cluster formed: the scheduler declares it dead
  (it sends no heartbeats; its connection closed) within 10 s and, with
  PS_RECOVERY_TIMEOUT=2, ends the job's last barrier saying so, instead of
  waiting forever.

Prints one line per case (`PASS name (figures)` or `FAIL name (why)`), then
`N passed, N failed`; exits 1 if any failed. Without a compiler, the tools or
the test programs' sources it prints `SKIP` with the reason and exits 0 (CI
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
PROGRAMS = ["test_connection", "test_simple_app", "test_kv_app"]
UNKNOWN = "unknown typed message"


def skip(why):
    print(f"SKIP C++ ps-lite under pslite launch ({why})")
    sys.exit(0)


def build(src):
    """The test programs' directory under target/ps-lite, built from `src`."""
    if not (src / "src" / "meta.proto").exists():
        skip(f"{src} is not a ps-lite checkout: give --ps-lite or PSLITE_CXX_SRC")
    if not list((src / "tests").glob("test_*.cc")):
        skip(f"{src}/tests has no test_*.cc: a checkout with ps-lite's test programs is needed")
    for tool in ("g++", "make", "protoc"):
        if shutil.which(tool) is None:
            skip(f"{tool} not found (Debian: g++ make libzmq3-dev libprotobuf-dev protobuf-compiler)")
    out = ROOT / "target" / "ps-lite"
    stamp = out / ".pslite-built-from"
    tests = out / "tests"
    if stamp.exists() and stamp.read_text() == str(src.resolve()) and all(
        (tests / p).exists() for p in PROGRAMS
    ):
        return tests
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns(".git", "build", "deps"))
    made = subprocess.run(
        ["make", "-C", str(out), "-j2", "DEPS_PATH=/usr", "PROTOC=" + shutil.which("protoc"), "ps", "test"],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        print(made.stdout[-3000:], made.stderr[-3000:], sep="\n")
        print("FAIL build (make ps test failed; is libzmq3-dev and libprotobuf-dev installed?)")
        sys.exit(1)
    stamp.write_text(str(src.resolve()))
    return tests


def launch(bins, program, extra, timeout=60):
    """(exit code, output) of one `pslite launch -s 2 -w 2` run."""
    cmd = [str(bins / "pslite"), "launch", "-s", "2", "-w", "2", "--timeout", str(timeout), *extra, "--", str(program)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
        return run.returncode, run.stdout + run.stderr
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")


def repeated(name, bins, program, extra, runs, logs):
    failures = []
    started = time.monotonic()
    for i in range(runs):
        code, out = launch(bins, program, extra)
        why = None
        if code != 0:
            why = f"exit {code}"
        elif UNKNOWN in out.lower():
            why = "a node logged an unknown typed message"
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
        server = start("server", [str(tests / "test_connection")])
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
        said = sched.wait_line("node 8", 0)
        if code == 0:
            return False, "the scheduler exited 0 although its last barrier lost node 8"
        return True, f"declared dead {declared:.1f} s after SIGKILL; scheduler exit {code}: {said.strip()}"
    finally:
        for node in nodes:
            node.kill()
        text = "".join(f"=== {i}\n{n.output()}" for i, n in enumerate(nodes))
        (logs / "cxx-server-killed.log").write_text(text)


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
    args = parser.parse_args()
    bins = pathlib.Path(args.bin_dir)
    for needed in (bins / "pslite", bins / "examples" / "store_watch"):
        if not needed.exists():
            print(f"FAIL setup ({needed} missing: cargo build --release -p pslite -p pslite-cli --bins --examples)")
            sys.exit(1)
    tests = build(pathlib.Path(args.ps_lite))
    logs = pathlib.Path(tempfile.mkdtemp(prefix="pslite-cxx-"))
    cases = []
    for program in PROGRAMS:
        cases.append((f"launch/{program}", lambda p=program: repeated(f"launch/{p}", bins, tests / p, [], args.runs, logs)))
    # test_simple_app's scheduler sends the requests: it needs its own.
    for program in ["test_connection", "test_kv_app"]:
        name = f"pslite-scheduler/{program}"
        extra = ["--scheduler-program", "pslite"]
        cases.append((name, lambda p=program, n=name: repeated(n, bins, tests / p, extra, args.runs, logs)))
    cases.append(("cxx-server-killed", lambda: server_killed(bins, tests, logs)))
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
