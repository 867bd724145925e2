"""Clusters of Python nodes, and of Python and Rust nodes, under `pslite launch`."""

import os

import pytest

from conftest import EXAMPLES, launch, node_script, rust_example

KV_APP = os.path.join(EXAMPLES, "kv_app.py")


def assert_exact(run, workers):
    assert run.returncode == 0, run.stdout + run.stderr
    exact = [l for l in run.stdout.splitlines() if "sums exact" in l]
    assert len(exact) == workers, run.stdout + run.stderr


@pytest.mark.parametrize("handle", ["rust", "python"])
def test_kv_app_python_nodes(handle):
    """The README's job: every node Python, exact sums (servers summing in
    Rust without the GIL, or in a Python request handle)."""
    run = launch(2, 2, KV_APP, KV_APP_HANDLE=handle, KV_APP_REPEAT=20)
    assert_exact(run, 2)


def test_python_workers_rust_servers():
    run = launch(2, 2, rust_example("kv_app"), options=["--worker-program", KV_APP],
                 KV_APP_REPEAT=20)
    assert_exact(run, 2)


def test_rust_workers_python_servers():
    run = launch(2, 2, rust_example("kv_app"), options=["--server-program", KV_APP],
                 KV_APP_HANDLE="python", KV_APP_REPEAT=20)
    assert_exact(run, 2)


def test_python_nodes_with_rust_scheduler():
    run = launch(1, 2, KV_APP, options=["--scheduler-program", "pslite"], KV_APP_REPEAT=10)
    assert_exact(run, 2)


def test_api_features():
    """dtypes, lens, cmd and priority, callbacks, push_pull, SimpleApp, the
    store and its watch, a request handle answering later from another
    thread (see nodes/features.py)."""
    run = launch(2, 2, node_script("features.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    passed = [l for l in run.stdout.splitlines() if "PASS" in l]
    assert len(passed) == 2, run.stdout + run.stderr


def test_request_objects():
    """pslite.Request: wait, take, done, num_responses, timeouts, callbacks,
    and ps-lite's int timestamps (see nodes/requests.py)."""
    run = launch(2, 1, node_script("requests.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    passed = [l for l in run.stdout.splitlines() if "PASS requests" in l]
    assert len(passed) == 4, run.stdout + run.stderr  # scheduler, 2 servers, worker
