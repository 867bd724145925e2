"""Failures raise the exception named after their Rust kind, with the Rust
message; Ctrl-C during a wait raises KeyboardInterrupt within 0.5 s."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import NODES, env, free_port, node_script, read_until, rust_example

WAITER = node_script("waiter.py")
#: The issue's bound on Ctrl-C during a wait.
CTRL_C_BOUND = 0.5


def lone_worker(**extra):
    """A worker's environment whose scheduler does not exist."""
    base = dict(DMLC_ROLE="worker", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=free_port(),
                DMLC_NUM_SERVER=1, DMLC_NUM_WORKER=1, DMLC_NODE_HOST="127.0.0.1")
    base.update(extra)
    return env(**base)


def test_missing_scheduler_raises_timeout_with_rusts_message():
    e = lone_worker(PS_START_TIMEOUT=2, WAITER_MODE="start")
    py = subprocess.run([sys.executable, WAITER], env=e, capture_output=True, text=True,
                        timeout=60)
    m = re.search(r"^raised (\w+): (.*)$", py.stdout, re.M)
    assert m, py.stdout + py.stderr
    assert m.group(1) == "StartTimeout", py.stdout  # a pslite.Timeout, a TimeoutError
    assert "no node table from the scheduler at 127.0.0.1:" in m.group(2)
    assert "(PS_START_TIMEOUT)" in m.group(2)
    rust = subprocess.run([rust_example("kv_app")], env=e, capture_output=True, text=True,
                          timeout=60)
    assert rust.returncode == 1
    # The same message, but for the port each node picked for itself.
    own_port = re.compile(r"(advertises, 127\.0\.0\.1):\d+")
    assert own_port.sub(r"\1:P", f"error: {m.group(2)}") in own_port.sub(r"\1:P", rust.stderr)


def test_bad_environment_raises_config_error_with_rusts_message():
    e = lone_worker(DMLC_NUM_SERVER="x")
    code = "import pslite\ntry:\n    pslite.Postoffice.from_env()\nexcept pslite.ConfigError as e:\n" \
           "    assert isinstance(e, ValueError)\n    print(e)\n"
    py = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                        timeout=60, cwd=NODES)
    assert py.returncode == 0 and "DMLC_NUM_SERVER" in py.stdout, py.stdout + py.stderr
    rust = subprocess.run([rust_example("kv_app")], env=e, capture_output=True, text=True,
                          timeout=60)
    assert rust.returncode == 2
    assert rust.stderr.strip() == f"error: {py.stdout.strip()}"


def test_errors_before_start_raise_the_class_of_their_variant():
    # One class per variant of pslite::Error, under the broader ones that
    # `except` clauses name (features.py checks those of a running cluster).
    code = "import pslite\npo = pslite.Postoffice.from_env()\n" \
           "try:\n    po.my_rank()\nexcept pslite.NotStarted as e:\n" \
           "    print(type(e).__name__, isinstance(e, RuntimeError), e)\n"
    py = subprocess.run([sys.executable, "-c", code], env=lone_worker(), capture_output=True,
                        text=True, timeout=60, cwd=NODES)
    assert py.stdout.startswith("NotStarted True the postoffice has not started"), \
        py.stdout + py.stderr
    import pslite
    assert issubclass(pslite.BarrierTimeout, pslite.Timeout)
    assert issubclass(pslite.StoreTimeout, pslite.Timeout)
    assert issubclass(pslite.StoreTimeout, pslite.StoreError)
    assert issubclass(pslite.DuplicateKey, ValueError)


DEAD_SERVER = "node 8 is dead and no replacement arrived within 1 s (PS_RECOVERY_TIMEOUT)"


@pytest.mark.parametrize("victim, mode, kind, says", [
    ("server", "request", "PeerDead", DEAD_SERVER),
    # By int timestamp, its Request object gone: the failure is not lost.
    ("server", "pull_int", "PeerDead", DEAD_SERVER),
    ("scheduler", "request", "SchedulerLost", "lost the scheduler at 127.0.0.1:"),
])
def test_killed_peer_fails_the_wait(cluster, victim, mode, kind, says):
    c = cluster(1, 1, PS_HEARTBEAT_INTERVAL=1, PS_HEARTBEAT_TIMEOUT=2, PS_RECOVERY_TIMEOUT=1)
    scheduler = c.scheduler()
    server = c.python("server", WAITER)
    worker = c.python("worker", WAITER, WAITER_MODE=mode)
    read_until(server, "serving", 60)
    read_until(worker, "waiting", 60)
    os.killpg((server if victim == "server" else scheduler).pid, signal.SIGKILL)
    lines = read_until(worker, "raised", 60)
    assert lines[-1].startswith(f"raised {kind}: "), lines
    assert says in lines[-1], lines
    assert worker.wait(30) == 0


def interrupt(proc):
    """Sends SIGINT; returns seconds until the node says it was interrupted."""
    t = time.monotonic()
    proc.send_signal(signal.SIGINT)
    read_until(proc, "interrupted", 10)
    return time.monotonic() - t


@pytest.mark.parametrize("mode", ["request", "take", "pull_int"])
def test_ctrl_c_during_a_request_wait(cluster, mode):
    c = cluster(1, 1)
    c.scheduler()
    server = c.python("server", WAITER)
    worker = c.python("worker", WAITER, WAITER_MODE=mode)
    read_until(server, "serving", 60)
    read_until(worker, "waiting", 60)
    time.sleep(0.3)  # let it settle into the wait (any moment would do)
    took = interrupt(worker)
    assert took < CTRL_C_BOUND, f"KeyboardInterrupt came {took:.2f} s after SIGINT"
    assert worker.wait(30) == 0


def test_ctrl_c_during_start():
    worker = subprocess.Popen([sys.executable, WAITER], env=lone_worker(WAITER_MODE="start"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        read_until(worker, "waiting", 60)
        time.sleep(0.3)
        took = interrupt(worker)
        assert took < CTRL_C_BOUND, f"KeyboardInterrupt came {took:.2f} s after SIGINT"
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
