"""pslite.torch with mixed precision (issue 40 items 1 and 3): GradScaler's
update equals one process's on the global batch (exact in float64: the
plain form and Horovod's synchronize + skip_synchronize), autocast
bfloat16, bfloat16 and float16 parameters (also with fp16 and bf16
compression), gradient_predivide_factor. The
checks run in python/tests/nodes/amp_equal.py on every worker. Skipped
without torch."""

import re

import pytest

from conftest import launch, node_script

torch = pytest.importorskip("torch")

LINES = [
    "GradScaler plain form: equals one process on the global batch",
    "synchronize + skip_synchronize: equals one process, each gradient pushed once",
    "GradScaler: an overflow on one worker skips the step on every worker",
    "autocast bfloat16 + GradScaler: the update is one process's",
    "torch.bfloat16 parameters: the gradient is the float32 mean rounded once",
    "torch.float16 parameters: the gradient is the float32 mean rounded once",
    # fp16 and bf16 compression (16 bits on the wire both ways): the same.
    "torch.float16 parameters with fp16: the gradient is the float32 mean rounded once",
    "torch.bfloat16 parameters with bf16: the gradient is the float32 mean rounded once",
    "gradient_predivide_factor: (sum of g/f) * f/size exactly",
    "skip_synchronize: a step before the sums is refused",
]


def test_mixed_precision_equals_one_process():
    # 96-byte parts: every layer is cut into parts spread over both servers.
    run = launch(2, 2, node_script("amp_equal.py"), PSLITE_PARTITION_BYTES=96)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    for line in LINES:
        assert run.stdout.count(line) == 2, f"{line!r} missing:\n{out}"
    assert len(re.findall(r"PASS amp [01]", run.stdout)) == 2, out
