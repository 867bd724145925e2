"""Fixtures of pslite's Python tests: clusters launched the way users launch
them (`pslite launch`, or single nodes with a DMLC_* environment), every
process bounded in time.

The `pslite` binary and the Rust examples come from $PSLITE_BIN_DIR
(default <repo>/target/release, built by `cargo build --release --bins
--examples`); the Python nodes run under this interpreter (its directory goes
first on PATH, so the examples' `#!/usr/bin/env python3` finds it too).
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYDIR)
BIN = os.environ.get("PSLITE_BIN_DIR") or os.path.join(REPO, "target", "release")
PSLITE = os.path.join(BIN, "pslite")
EXAMPLES = os.path.join(PYDIR, "examples")
NODES = os.path.join(HERE, "nodes")

#: Seconds any one cluster or node may take before the test fails.
BOUND = 120


def rust_example(name):
    path = os.path.join(BIN, "examples", name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run `cargo build --release --bins --examples`")
    return path


def node_script(name):
    return os.path.join(NODES, name)


def env(**extra):
    """The environment of a node or launcher: this Python first on PATH,
    no DMLC_* leftovers, `extra` added (None removes)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e["PYTHONUNBUFFERED"] = "1"
    for k, v in extra.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = str(v)
    return e


def launch(servers, workers, program, *args, options=(), timeout=BOUND, **extra):
    """Runs `pslite launch -s S -w W [options] -- program args`; returns the
    completed process (stdout and stderr as text)."""
    if not os.access(PSLITE, os.X_OK):
        pytest.fail(f"{PSLITE} is missing: run `cargo build --release --bins --examples`")
    if program.endswith(".py"):
        program, args = sys.executable, (program, *args)
    argv = [PSLITE, "launch", "--servers", str(servers), "--workers", str(workers),
            "--timeout", str(timeout), *options, "--", program, *args]
    return subprocess.run(argv, env=env(**extra), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout + 30)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """Nodes started one by one with their DMLC_* environment (for tests
    that kill or signal one node), each in its own process group; whatever
    is left is killed at the end."""

    def __init__(self, servers, workers, **extra):
        self.port = free_port()
        self.base = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=self.port,
                         DMLC_NUM_SERVER=servers, DMLC_NUM_WORKER=workers,
                         DMLC_NODE_HOST="127.0.0.1", **extra)
        self.procs = []

    def start(self, role, argv, **extra):
        p = subprocess.Popen(argv, env=env(DMLC_ROLE=role, **self.base, **extra),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.procs.append(p)
        return p

    def scheduler(self, **extra):
        return self.start("scheduler", [PSLITE, "scheduler"], **extra)

    def python(self, role, script, **extra):
        return self.start(role, [sys.executable, script], **extra)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


@pytest.fixture
def cluster():
    made = []

    def make(servers, workers, **extra):
        c = Cluster(servers, workers, **extra)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def read_until(proc, marker, timeout):
    """Lines of `proc`'s output up to the first containing `marker` (fails
    after `timeout` seconds)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    lines = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            pytest.fail(f"no line with {marker!r} within {timeout} s; got:\n" + "".join(lines))
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"output ended before {marker!r}; got:\n" + "".join(lines))
        lines.append(line)
        if marker in line:
            return lines
