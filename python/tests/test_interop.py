"""A Python pslite worker in a cluster of MXNet 1.9.1's C++ ps-lite: MXNet's
scheduler and servers, the Python worker beside an MXNet worker (one big
array split over both servers, sums merged across implementations).

Uses tests/interop's harness: setup_venv.sh makes the MXNet venv (PyPI),
run_interop.py runs the job. Holds /tmp/pslite-interop.lock while it runs,
as every interop job on a shared machine does."""

import fcntl
import os
import subprocess
import sys

from conftest import REPO, env, node_script

INTEROP = os.path.join(REPO, "tests", "interop")


def test_python_worker_with_mxnet_servers(tmp_path):
    setup = subprocess.run([os.path.join(INTEROP, "setup_venv.sh")], capture_output=True,
                           text=True, timeout=900)
    assert setup.returncode == 0, "MXNet venv setup failed:\n" + setup.stderr
    mx_python = setup.stdout.strip().splitlines()[-1]
    worker = f"{sys.executable} {node_script('mx_worker.py')}"
    with open("/tmp/pslite-interop.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run = subprocess.run(
            ["timeout", "-k", "10", "180", mx_python, os.path.join(INTEROP, "run_interop.py"),
             "--label", "python-worker", "--servers", "2", "--workers", "2",
             "--worker", worker, "--worker", "mx", "--timeout", "120",
             "--logdir", str(tmp_path)],
            env=env(), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and "PASS python-worker" in run.stdout, run.stdout + run.stderr
    log = (tmp_path / "worker0.log").read_text()
    assert "PASS [py-worker rank" in log and "] all checks" in log, log
    assert "store refused by a C++ scheduler" in log, log
