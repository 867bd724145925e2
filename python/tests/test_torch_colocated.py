"""Colocated mode (issue 39 item 3): `pslite launch --colocate` starts no
server process; each worker's process also serves a slice of the keys.
Training equals one process on the global batch (exact in float64) as with
servers of their own, with the native scheduler (--torch) or the script's,
and the digits example reaches its threshold."""

import os

import pytest

from conftest import EXAMPLES, launch, node_script

pytest.importorskip("torch")


@pytest.mark.parametrize("workers,options", [(2, ("--torch",)), (3, ())])
def test_colocated_training_equals_one_process(workers, options):
    # 96-byte parts: every layer is cut into parts spread over every server.
    run = launch(workers, workers, node_script("dp_equal.py"),
                 options=("--colocate", *options), PSLITE_PARTITION_BYTES=96)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert run.stdout.count("PASS dp") == workers, out
    assert "float64: data-parallel equals one process" in run.stdout, out
    assert "[server" not in out, out  # no server process ran


def test_colocated_digits_reach_the_threshold():
    pytest.importorskip("sklearn")
    run = launch(2, 2, os.path.join(EXAMPLES, "train_digits.py"), "--epochs", "6",
                 options=("--colocate", "--torch"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(": ok") == 2, run.stdout + run.stderr


def test_colocate_refuses_a_different_number_of_servers():
    run = launch(3, 2, node_script("dp_equal.py"), options=("--colocate",))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "leave out --servers, or give --servers 2" in run.stderr
