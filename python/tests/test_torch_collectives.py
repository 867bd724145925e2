"""pslite.torch beside DistributedOptimizer (issue 40 items 4-6, 8, 9):
torchrun's variables read back, collectives equal their definitions,
mismatched models named in the user's terms, sparse embeddings averaged
exactly, a DistributedDataParallel-style wrapper equal to one process, and
plain `python` running as one worker of size 1. The nodes are
nodes/torch_coll.py. Skipped without torch."""

import subprocess
import sys

import pytest

from conftest import BOUND, env, launch, node_script

torch = pytest.importorskip("torch")

SCRIPT = node_script("torch_coll.py")


def run_mode(mode, servers, workers, **extra):
    run = launch(servers, workers, SCRIPT, mode, **extra)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(f"PASS {mode}") == workers, run.stdout + run.stderr
    return run


def test_workers_read_torchruns_variables_back():
    run = run_mode("topology", 1, 3)
    for r in range(3):
        assert f"topology rank {r} of 3: local {r} of 3" in run.stdout, run.stdout


def test_the_topology_of_workers_on_several_hosts():
    from pslite._torch_collectives import topology_of

    hosts = [b"a", b"b", b"a", b"b", b"a"]
    assert [topology_of(hosts, r) for r in range(5)] == [
        (0, 3, 0, 2), (0, 2, 1, 2), (1, 3, 0, 2), (1, 2, 1, 2), (2, 3, 0, 1)]


def test_collectives_equal_their_definitions():
    # 96-byte parts: every tensor of 40 values is cut and spread over both servers.
    run = run_mode("collectives", 2, 3, PSLITE_PARTITION_BYTES=96)
    assert run.stdout.count("equal their definitions") == 3, run.stdout


def test_mismatched_models_are_named_with_both_shapes_and_dtypes():
    run = run_mode("mismatch", 1, 2)
    out = run.stdout
    # broadcast_parameters goes in name order (a.bias first), DistributedOptimizer in the model's.
    for what, name, shape in (("broadcast_parameters", "a.bias", "(32,)"),
                              ("DistributedOptimizer", "a.weight", "(32, 10)")):
        lines = [line for line in out.splitlines() if f"MISMATCH dtype {what}:" in line]
        assert len(lines) == 2, out
        for line in lines:
            assert f"parameter {name} is float32 of shape {shape} on rank 0 and float64 " \
                   f"of shape {shape} on rank 1" in line, line
        lines = [line for line in out.splitlines() if f"MISMATCH hidden {what}:" in line]
        assert len(lines) == 2, out
        small = shape.replace("32", "16")
        for line in lines:
            assert f"parameter {name} is float32 of shape {shape} on rank 0 and float32 of " \
                   f"shape {small} on rank 1" in line, line


def test_sparse_embeddings_are_averaged_exactly():
    run = run_mode("sparse", 1, 2, PSLITE_PARTITION_BYTES=96)
    assert run.stdout.count("equals one process") == 2, run.stdout


@pytest.mark.parametrize("workers", [2, 3])
def test_distributed_data_parallel_equals_one_process(workers):
    run = run_mode("ddp", 2, workers, PSLITE_PARTITION_BYTES=96)
    assert run.stdout.count("equals one process") == workers, run.stdout


def test_plain_python_runs_as_one_worker_of_size_1():
    run = subprocess.run([sys.executable, SCRIPT, "single"], env=env(), capture_output=True,
                         text=True, timeout=BOUND)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS single 0" in run.stdout, run.stdout + run.stderr
    lines = [line for line in run.stderr.splitlines() if "pslite launch" in line]
    assert len(lines) == 1 and "size 1" in lines[0], run.stderr
