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
import subprocess

import numpy as np
import pytest

from conftest import PSLITE, launch, node_script, read_until

torch = pytest.importorskip("torch")
import pslite  # noqa: E402
import pslite.torch as pt  # noqa: E402

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


def test_tables_are_saved_and_restored_with_the_checkpoints(tmp_path):
    # Saved: trained rows, pt.checkpoint() (a lone worker: its barrier goes
    # to the scheduler, where the checkpoint is taken), one step more.
    # Restored: the same rows, and the same step gives the same rows
    # (Adam's moments and step counts came back too).
    env = dict(PS_CHECKPOINT_DIR=tmp_path / "ckpt", EMB_ROWS=tmp_path / "rows")
    for case in ("save", "load"):
        run = launch(2, 1, SCRIPT, options=("--torch",), timeout=60, EMB_CASE=case, **env)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"PASS checkpoint {case}" in run.stdout, run.stdout + run.stderr
    assert "resuming job" in run.stdout + run.stderr, run.stdout + run.stderr


def export(ckpt, out):
    return subprocess.run([PSLITE, "checkpoint", "export", str(ckpt), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)


def test_an_exported_checkpoint_answers_lookups_in_one_process(tmp_path):
    # Two workers train tables of their own and one they share, take a
    # checkpoint and note the rows the servers held and their modules'
    # pooled outputs; the checkpoint exported is loaded here (no job).
    ckpt, rows, out = tmp_path / "ckpt", tmp_path / "rows", tmp_path / "served"
    run = launch(2, 2, SCRIPT, options=("--torch",), timeout=60, EMB_CASE="export",
                 PS_CHECKPOINT_DIR=ckpt, EMB_ROWS=rows)
    assert run.returncode == 0 and run.stdout.count("PASS export") == 2, run.stdout + run.stderr
    done = export(ckpt, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exported 5 tables" in done.stdout, done.stdout
    tables = pt.load_tables(out)
    assert sorted(tables) == ["item.0", "item.1", "shared", "user.0", "user.1"], tables
    assert tables["user.1"].init == ("normal", pytest.approx(0.1)) and tables["user.1"].seed == 7
    assert isinstance(tables["item.0"].optimizer, pt.RowWiseAdaGrad)
    saved = [np.load(f"{rows}.{r}.npz") for r in range(2)]
    shared_ids = np.union1d(saved[0]["shared_ids"], saved[1]["shared_ids"])
    assert np.array_equal(tables["shared"].ids, shared_ids)
    for r, s in enumerate(saved):
        # Exactly the ids trained before the checkpoint, with the servers' rows.
        for name in ("user", "item"):
            t = tables[f"{name}.{r}"]
            assert np.array_equal(t.ids, s["ids"]), name
            assert np.array_equal(t.lookup(s["ids"]), s[name]), name
        assert np.array_equal(tables["shared"].lookup(s["shared_ids"]), s["shared"])
        # The modules answered from the export give the trained modules'
        # outputs, ids never trained (their initial rows) included.
        bags = torch.from_numpy(s["bags"])
        user = pt.EmbeddingBag.from_export(out, f"user.{r}", mode="mean")
        item = pt.Embedding.from_export(out, f"item.{r}")
        shared = pt.EmbeddingBag.from_export(out, "shared")
        with torch.no_grad():
            assert torch.equal(user(bags), torch.from_numpy(s["user_bags"]))
            assert torch.equal(item(bags), torch.from_numpy(s["item_bags"]))
            got = shared(bags.view(-1), torch.from_numpy(s["offsets"]),
                         per_sample_weights=torch.from_numpy(s["weights"]))
            assert torch.equal(got, torch.from_numpy(s["shared_bags"]))
    # Unknown ids: the initial row (above), zeros, or refused.
    t = tables["user.0"]
    unseen = np.array([10**15 + 1, 10**15 + 2])
    assert not pt.EmbeddingBag.from_export(out, "user.0", unknown="zeros")(
        torch.from_numpy(unseen).view(1, 2)).any()
    assert t.lookup(unseen).any() and not t.lookup(unseen, unknown="zeros").any()
    with pytest.raises(pslite.InvalidInput, match="not in the export"):
        t.lookup(unseen, unknown="error")
    with pytest.raises(pslite.InvalidInput, match="not 'nope'"):
        pt.Embedding.from_export(out, "nope")


def test_bad_exports_are_refused_saying_why(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "served"
    done = export(tmp_path / "missing", out)
    assert done.returncode == 1 and "is not a directory" in done.stderr, done.stderr
    with pytest.raises(pslite.InvalidInput, match="tables.json does not exist"):
        pt.load_tables(tmp_path / "missing")
    # A checkpoint of a job that made no table.
    run = launch(1, 1, SCRIPT, options=("--torch",), timeout=60, EMB_CASE="no tables",
                 PS_CHECKPOINT_DIR=ckpt)
    assert run.returncode == 0, run.stdout + run.stderr
    done = export(ckpt, out)
    assert done.returncode == 1 and "holds no embedding table" in done.stderr, done.stderr
    assert "panicked" not in done.stderr
    # A server's file changed by one byte: refused naming it, nothing written.
    (server_file,) = (ckpt / "checkpoint-000001").glob("*.ckpt")
    data = bytearray(server_file.read_bytes())
    data[len(data) // 2] ^= 0x40
    server_file.write_bytes(bytes(data))
    done = export(ckpt, out)
    assert done.returncode == 1 and server_file.name in done.stderr, done.stderr
    assert "corrupt" in done.stderr and not out.exists(), done.stderr


def test_a_damaged_export_is_refused_naming_the_file(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "served"
    run = launch(1, 1, SCRIPT, options=("--torch",), timeout=60, EMB_CASE="save",
                 PS_CHECKPOINT_DIR=ckpt, EMB_ROWS=tmp_path / "rows")
    assert run.returncode == 0, run.stdout + run.stderr
    assert export(ckpt, out).returncode == 0
    assert len(pt.load_tables(out)["ck"]) == 200
    rows = out / "ck.rows.npy"
    whole = rows.read_bytes()
    rows.write_bytes(whole[:-7])  # truncated
    with pytest.raises(pslite.InvalidInput, match="ck.rows.npy"):
        pt.load_tables(out)
    rows.write_bytes(b"not numpy" + whole[9:])
    with pytest.raises(pslite.InvalidInput, match="ck.rows.npy"):
        pt.load_tables(out)
    (out / "ck.ids.npy").unlink()
    with pytest.raises(pslite.InvalidInput, match="ck.ids.npy"):
        pt.load_tables(out)


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


@pytest.mark.parametrize("s", [0, 2])
def test_bounded_staleness_keeps_the_rows_within_s_steps(s):
    # PS_STALENESS with pt.embedding_clock(): no worker reads another's row
    # more than s steps behind, and the straggler makes the bound reached.
    run = launch(2, 3, SCRIPT, options=("--torch",), timeout=90, EMB_CASE="staleness",
                 PS_STALENESS=s)
    assert run.returncode == 0, run.stdout + run.stderr
    gaps = [int(g) for g in re.findall(r"PASS staleness rank \d+ gap (\d+)", run.stdout)]
    assert len(gaps) == 3, run.stdout + run.stderr
    assert max(gaps) == s, run.stdout
