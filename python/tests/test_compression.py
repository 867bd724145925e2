"""Gradient compression from Python (issue 30 item 3): `pslite.Compression`,
KVWorker's `compression=` (worker-wide and per request, answers compressed
at a pull's request, error feedback) against a Rust sum store, and
`pslite.torch.DistributedOptimizer(compression=...)` training the digits
example past its threshold with identical models on every worker."""

import os
import re

import pytest

from conftest import EXAMPLES, launch, node_script


def test_kvworker_compression_round_trips_and_error_feedback():
    run = launch(1, 1, node_script("compression.py"))
    assert run.returncode == 0, run.stdout + run.stderr
    passed = [l for l in run.stdout.splitlines() if "PASS compression" in l]
    assert len(passed) == 3, run.stdout + run.stderr
    assert "error feedback: relative error" in run.stdout, run.stdout


# onebit gets 0.93 with momentum correction (on by default); the casts
# fp16 and bf16 (Horovod's Compression.fp16) what uncompressed training gets.
@pytest.mark.parametrize("compression,threshold",
                         [("onebit", 0.93), ("topk:0.1", 0.9), ("fp16", 0.95), ("bf16", 0.95)])
def test_distributed_optimizer_with_compression_reaches_the_threshold(compression, threshold):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    digits = os.path.join(EXAMPLES, "train_digits.py")
    run = launch(2, 2, digits, "--compression", compression, "--threshold", str(threshold),
                 timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    acc = [float(a) for a in re.findall(r"test accuracy ([0-9.]+) after", run.stdout)]
    assert len(acc) == 2 and min(acc) >= threshold, run.stdout
    assert acc[0] == acc[1], "the workers' models differ"
    if compression in ("fp16", "bf16"):
        assert "momentum correction off" in run.stdout + run.stderr, "a cast holds nothing back"
