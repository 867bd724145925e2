"""pslite.torch.EmbeddingBag and Embedding (issue 41 items 1 and 3): tables
on the servers of real clusters launched as users launch them. One job
(2 native servers, 2 workers) runs nodes/embedding.py's checks: duplicate
ids summed once per distinct id, rows made on first touch by each
initializer (a uniform row equal to the stream written out in Python),
each optimizer against NumPy over several steps, pooling against
torch.nn.EmbeddingBag with the same weights (and its gradient), 64-bit and
negative ids, misuse refused, the same table from two workers accepted
and a conflicting one refused naming it, row expiry and feature admission
(Monolith's) with the servers' counts, a worker's cache of rows read while
the other worker pushes (never older than its staleness, fewer rows
pulled, a staleness of 0 the same as no cache), and the bytes a row costs
on the servers. Another kills a server of a PS_REPLICAS=2 job: no row is
lost, and a table with expiry and admission decides after the kill as it
would have without it.
Skipped without torch."""

import os
import re
import signal

import pytest

from conftest import PSLITE, launch, node_script, read_until

pytest.importorskip("torch")

SCRIPT = node_script("embedding.py")


def test_tables_on_the_servers_match_numpy_and_torch():
    run = launch(2, 2, SCRIPT, options=("--torch",), timeout=90)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    for check in ("duplicates", "initializers", "optimizers", "pooling", "ids", "spread",
                  "conflict", "cache", "embedding"):
        assert run.stdout.count(f"PASS {check}") == 2, (check, out)
    for check in ("expiry", "admission"):  # rank 0's
        assert run.stdout.count(f"PASS {check}") == 1, (check, out)
    assert run.stdout.count("PASS before init") == 2, out
    assert "refused: " in run.stdout and '"shared"' in run.stdout, out
    memory = re.search(r"MEMORY .*store_bytes_per_row=([0-9.]+) rss_bytes_per_row=([0-9.]+) "
                       r"target=([0-9.]+)", run.stdout)
    assert memory, out
    print(memory.group(0))
    store, rss, target = map(float, memory.groups())
    assert store <= target, memory.group(0)
    # Resident memory grows by the store's pages and the message buffers
    # the servers keep for reuse (a few MB, a large share at 100 000 rows
    # a server; docs/TORCH.md has the figure at 4 M rows).
    assert rss <= 2 * target, memory.group(0)


@pytest.mark.skip(reason="not working yet (issue 41): the worker's barrier loop that lets "
                  "`pslite checkpoint` take its checkpoint never reaches the scheduler, so the "
                  "job times out; the tables' copies themselves are unit-tested "
                  "(apps/src/embedding/tests.rs) and carried by the replicas")
def test_tables_are_saved_and_restored_with_the_checkpoints(tmp_path):
    # Saved: trained rows, a checkpoint, one step more. Restored: the same
    # rows, and the same step gives the same rows (Adam's moments and step
    # counts came back too).
    env = dict(PS_CHECKPOINT_DIR=tmp_path / "ckpt", EMB_ROWS=tmp_path / "rows", EMB_PSLITE=PSLITE)
    for case in ("save", "load"):
        run = launch(2, 1, SCRIPT, options=("--torch",), timeout=60, EMB_CASE=case, **env)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"PASS checkpoint {case}" in run.stdout, run.stdout + run.stderr
    assert "resuming job" in run.stdout + run.stderr, run.stdout + run.stderr


def test_a_server_killed_with_two_replicas_loses_no_row(cluster):
    c = cluster(2, 1, PS_REPLICAS=2, PS_HEARTBEAT_INTERVAL=1, PS_HEARTBEAT_TIMEOUT=3)
    c.scheduler()
    servers = [c.start("server", [PSLITE, "torch-server"]) for _ in range(2)]
    worker = c.python("worker", SCRIPT, EMB_CASE="replicas")
    read_until(worker, "READY", 60)
    os.killpg(servers[0].pid, signal.SIGKILL)
    worker.stdin.write("go\n")
    worker.stdin.flush()
    lines = read_until(worker, "PASS replicas", 60)
    assert lines, lines
    assert worker.wait(30) == 0
