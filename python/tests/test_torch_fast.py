"""pslite.torch's start and its sums (issue 40 items 3 and 7):
`pslite launch --torch` runs the scheduler and the servers natively (they
never run the user's script, so never import torch), and a float64 job at
W = 4 repeats bit for bit (the servers add a round's parts in rank order,
not in arrival order). Skipped without torch (python/test.sh installs it)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import PSLITE, env, launch, node_script

pytest.importorskip("torch")


def test_torch_launch_runs_the_scheduler_and_servers_natively():
    run = launch(2, 2, node_script("roles_ran.py"), options=["--torch"])
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    ran = re.findall(r"\] RAN (\w+) ", run.stdout)
    # The script ran on the two workers only: the scheduler and the two
    # servers were `pslite scheduler` and `pslite torch-server`, so no
    # process but the workers' imported torch.
    assert sorted(ran) == ["worker", "worker"], out
    assert sorted(re.findall(r"WORKER (\d) of 2", run.stdout)) == ["0", "1"], out
    assert "scheduler: cluster of 2 servers and 2 workers formed" in run.stdout, out
    # The hint is for a launch without --torch (the scheduler ran the script).
    assert "pslite launch --torch" not in out


def test_torch_server_refuses_another_role():
    run = subprocess.run([PSLITE, "torch-server"],
                         env=env(DMLC_ROLE="worker", DMLC_NUM_SERVER=1, DMLC_NUM_WORKER=1,
                                 DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=9),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert run.returncode != 0
    assert "DMLC_ROLE" in run.stderr and "torch-server" in run.stderr, run.stderr


def test_torch_and_own_server_program_conflict():
    run = subprocess.run([PSLITE, "launch", "--torch", "--server-program", "x", "--", "y"],
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=60)
    assert run.returncode == 2, run.stderr
    assert "--server-program" in run.stderr, run.stderr


def params_digest():
    run = launch(2, 4, node_script("same_sums.py"), options=["--torch"])
    assert run.returncode == 0, run.stdout + run.stderr
    digests = re.findall(r"PARAMS (\w+)", run.stdout)
    assert len(digests) == 4 and len(set(digests)) == 1, run.stdout
    return digests[0]


def test_repeated_float64_runs_at_four_workers_are_bit_identical():
    # Each worker's data has its own scale and a random pause before each
    # backward pass, so the parts reach the servers in another order each
    # run; summed in arrival order, three runs gave three digests.
    first = params_digest()
    assert params_digest() == first


def test_torch_launch_from_the_venvs_pslite():
    # From pip the command is `python -m pslite`: its scheduler and servers
    # are `python -m pslite scheduler` and `... torch-server` (no torch).
    pslite = os.path.join(os.path.dirname(sys.executable), "pslite")
    assert os.access(pslite, os.X_OK), f"{pslite}: pip install ./python puts it there"
    run = subprocess.run([pslite, "launch", "-s", "1", "-w", "2", "--torch", "--timeout", "120",
                          "--", "python", node_script("roles_ran.py")],
                         env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=150)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert sorted(re.findall(r"\] RAN (\w+) ", run.stdout)) == ["worker", "worker"], out
