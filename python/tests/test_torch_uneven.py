"""pslite.torch with uneven inputs (issue 40 item 2): workers with fewer
batches call `pt.join()` and the job equals one process under DDP's and
Horovod's rule (joined workers count as zeros, the mean divides by every
worker); without join(), the worker still training fails within seconds,
naming the finished rank and the parameter that waits. The workers run
python/tests/nodes/uneven.py. Skipped without torch."""

import re
import time

import pytest

from conftest import launch, node_script

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("replicas", [1, 2])
def test_join_lets_a_worker_with_fewer_batches_finish(replicas):
    # PS_REPLICAS=2: each server also backs up the other's range and sees
    # every join of it (joins count per range; they once counted twice).
    options = ("--torch",) if replicas > 1 else ()
    run = launch(2, 2, node_script("uneven.py"), "join", options=options,
                 PS_REPLICAS=str(replicas))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "join: equals one process under the rules" in run.stdout, out
    assert len(re.findall(r"PASS uneven [01]", run.stdout)) == 2, out


@pytest.mark.parametrize("mode", ["nojoin", "nojoin-ddp"])
def test_without_join_the_waiting_worker_fails_in_seconds_naming_rank_and_parameter(mode):
    began = time.monotonic()
    run = launch(2, 2, node_script("uneven.py"), mode, timeout=90)
    elapsed = time.monotonic() - began
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    finished = re.search(r"FINISHED ([0-9.]+)", run.stdout)
    refused = re.search(r"REFUSED ([0-9.]+) (.*)", run.stdout)
    assert finished and refused, out
    waited = float(refused.group(1)) - float(finished.group(1))
    assert waited < 10, f"rank 0 failed {waited:.1f} s after rank 1 finished:\n{out}"
    message = refused.group(2)
    assert "worker rank 1" in message, message
    assert re.search(r"parameter (a|b)\.(weight|bias)", message), message
    assert "pslite.torch.join()" in message, message
    assert "WorkerFinished" in out, out
    assert elapsed < 90, f"the job took {elapsed:.0f} s to stop"
