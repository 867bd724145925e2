"""A worker of test_torch_embedding.py (`pslite launch --torch`): the
servers' embedding tables checked against NumPy and torch.nn. Each worker
checks tables of its own (names with its rank), so workers never change
each other's rows; both create table "shared" alike (accepted) and rank 1
then creates "conflict" with other settings than rank 0 (refused). Rank 0
alone checks expiry and admission (the statistics are the servers'); in
the cache check rank 1 pushes and rank 0 reads through a cache. Prints
"PASS <check>" per check and "PASS embedding" at the end; EMB_CASE picks
another run (replicas, save and load, export, no tables: see the tests)."""

import os
import sys

import numpy as np
import torch

import pslite
import pslite.torch as pt

CASE = os.environ.get("EMB_CASE", "all")
GOLDEN = 0x9E3779B97F4A7C15
ROW = 0xD1B54A32D192ED03
M64 = (1 << 64) - 1


def mix(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def key_of(table, i):
    return mix((i & M64) ^ mix(table ^ GOLDEN))


def uniform_row(seed, key, dim, low, high):
    """embedding/init.rs's uniform row, written out again."""
    s = mix(seed ^ mix(key ^ ROW))
    out = []
    for j in range(dim):
        w = mix((s + (j + 1) * GOLDEN) & M64)
        u = (w >> 40) / float(1 << 24)
        out.append(np.float32(low + (high - low) * u))
    return np.array(out, dtype=np.float32)


def ms(g):
    return np.float32(np.mean(g.astype(np.float64) ** 2))


def step_ref(opt, w, state, g):
    """One row's update as the servers write it (float32, the mean of g^2
    in float64 rounded once)."""
    f = np.float32
    if isinstance(opt, pt.SGD):
        return w - f(opt.lr) * g
    if isinstance(opt, pt.RowWiseAdaGrad):
        state["G"] = f(state.get("G", f(opt.initial_accumulator)) + ms(g))
        s = f(opt.lr) / (np.sqrt(state["G"]) + f(opt.eps))
        return w - f(s) * g
    b1, b2 = f(opt.betas[0]), f(opt.betas[1])
    t = state["t"] = state.get("t", 0) + 1
    state["v"] = f(b2 * f(state.get("v", f(0))) + (f(1) - b2) * ms(g))
    state["m"] = (b1 * state.get("m", np.zeros_like(w)) + (f(1) - b1) * g).astype(np.float32)
    bc1 = f(1 - float(b1) ** t)
    bc2 = f(1 - float(b2) ** t)
    s = f(opt.lr) / (bc1 * (np.sqrt(f(state["v"] / bc2)) + f(opt.eps)))
    return (w - f(s) * state["m"]).astype(np.float32)


def close(got, want, what, rtol=2e-5, atol=1e-6):
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        err = np.abs(got - want).max() if got.shape == want.shape else "shape"
        raise AssertionError(f"{what}: got\n{got}\nwant\n{want}\n(max error {err})")


def refused(bad):
    """Each (call, says) raises InvalidInput whose text names `says`."""
    for call, says in bad:
        try:
            call()
        except pslite.InvalidInput as e:
            assert says in str(e), (says, e)
        else:
            raise AssertionError(f"not refused ({says})")


def rows(module, ids):
    with torch.no_grad():
        if isinstance(module, pt.EmbeddingBag):
            ids = torch.as_tensor(ids, dtype=torch.int64)
            return module(ids.view(-1, 1)).numpy()
        return module(torch.as_tensor(ids, dtype=torch.int64)).numpy()


def misuse_before_init():
    bag = pt.EmbeddingBag(4, name="early")
    try:
        bag(torch.tensor([[1, 2]]))
    except pslite.NotStarted as e:
        assert "init" in str(e), e
    else:
        raise AssertionError("a forward before pslite.torch.init() was not refused")
    print("PASS before init", flush=True)


def check_duplicates(r):
    # Row-wise AdaGrad: a row pushed once with the summed gradient differs
    # from one pushed per occurrence (the accumulator would grow twice).
    opt = pt.RowWiseAdaGrad(lr=0.5)
    emb = pt.Embedding(3, optimizer=opt, init="zeros", name=f"dup.{r}")
    ids = torch.tensor([5, 5, 7, 5, -5])
    coef = torch.arange(15, dtype=torch.float32).view(5, 3) / 10 - 0.6
    (emb(ids) * coef).sum().backward()
    emb.flush()
    c = coef.numpy()
    for i, occurrences in ((5, [0, 1, 3]), (7, [2]), (-5, [4])):
        g = c[occurrences].sum(axis=0)
        close(rows(emb, [i])[0], step_ref(opt, np.zeros(3, np.float32), {}, g), f"id {i}")
    print("PASS duplicates", flush=True)


def check_initializers(r):
    n, dim = 2000, 8
    ids = torch.arange(n) * 7919 - 10**12
    zeros = pt.Embedding(dim, init="zeros", name=f"zeros.{r}", optimizer=pt.SGD(1.0))
    assert not rows(zeros, ids).any()
    uni = pt.EmbeddingBag(5, init=("uniform", -0.5, 1.5), seed=3, name=f"uni.{r}")
    got = rows(uni, ids[:50])
    for i, row in zip(ids[:50].tolist(), got):
        want = uniform_row(3, key_of(uni.table, i), 5, -0.5, 1.5)
        assert np.array_equal(row, want), (i, row, want)
    normal = pt.Embedding(dim, init=("normal", 0.2), seed=11, name=f"normal.{r}")
    vals = rows(normal, ids)
    assert abs(vals.mean()) < 0.01 and abs(vals.std() - 0.2) < 0.01, (vals.mean(), vals.std())
    again = rows(normal, ids)  # pulled again: the same rows
    assert np.array_equal(vals, again)
    print("PASS initializers", flush=True)


def check_optimizers(r):
    rng = np.random.default_rng(r)
    for k, opt in enumerate((pt.SGD(0.3),
                             pt.RowWiseAdaGrad(lr=0.2, eps=1e-3, initial_accumulator=0.1),
                             pt.RowWiseAdam(lr=0.05, betas=(0.8, 0.95), eps=1e-6))):
        dim, universe = 5, 12
        emb = pt.Embedding(dim, optimizer=opt, init=("uniform", -1, 1), name=f"opt{k}.{r}")
        w = {i: rows(emb, [i])[0].copy() for i in range(universe)}
        state = {i: {} for i in range(universe)}
        for step in range(4):
            ids = rng.integers(0, universe, size=10)  # duplicates, rows left out
            coef = rng.standard_normal((10, dim)).astype(np.float32)
            (emb(torch.from_numpy(ids)) * torch.from_numpy(coef)).sum().backward()
            for i in np.unique(ids):
                g = coef[ids == i].sum(axis=0, dtype=np.float32)
                w[i] = step_ref(opt, w[i], state[i], g)
        got = rows(emb, list(range(universe)))
        close(got, np.stack([w[i] for i in range(universe)]), f"{opt!r} after 4 steps")
    print("PASS optimizers", flush=True)


def check_pooling(r):
    n, dim = 20, 4
    for mode in ("sum", "mean"):
        bag = pt.EmbeddingBag(dim, mode=mode, optimizer=pt.SGD(1.0), name=f"pool.{mode}.{r}")
        view = pt.Embedding(dim, optimizer=pt.SGD(1.0), name=f"pool.{mode}.{r}")  # same table
        w = torch.from_numpy(rows(view, list(range(n))).copy())
        ref = torch.nn.EmbeddingBag.from_pretrained(w.clone(), mode=mode, freeze=False)
        inp = torch.tensor([3, 1, 3, 19, 0, 7, 7, 7, 2])
        offsets = torch.tensor([0, 3, 3, 5])  # an empty bag
        weights = torch.linspace(0.5, 2.0, inp.numel()) if mode == "sum" else None
        out = bag(inp, offsets, per_sample_weights=weights)
        want = ref(inp, offsets, per_sample_weights=weights)
        close(out.detach(), want.detach(), f"{mode} 1-D")
        coef = torch.randn(out.shape)
        (out * coef).sum().backward()
        (want * coef).sum().backward()
        bag.flush()
        close(rows(view, list(range(n))), (w - ref.weight.grad).numpy(), f"{mode} gradient")
        two_d = torch.tensor([[1, 2, 2], [19, 0, 5]])
        close(bag(two_d).detach(), torch.nn.EmbeddingBag.from_pretrained(
            torch.from_numpy(rows(view, list(range(n)))), mode=mode)(two_d), f"{mode} 2-D")
        # A prefetched batch gives the same rows.
        bag.prefetch(two_d)
        close(bag(two_d).detach(), bag(two_d.clone()).detach(), f"{mode} prefetched")
    print("PASS pooling", flush=True)


def check_ids(r):
    emb = pt.Embedding(2, optimizer=pt.SGD(1.0), init="zeros", name=f"ids.{r}")
    ids = torch.tensor([-1, 2**63 - 1, -2**63, 0, 1])
    coef = torch.arange(10, dtype=torch.float32).view(5, 2) + 1
    (emb(ids) * coef).sum().backward()
    close(rows(emb, ids), -coef.numpy(), "64-bit ids")
    out = emb(ids.view(5, 1, 1))
    assert out.shape == (5, 1, 1, 2), out.shape
    bad = [(lambda: emb(ids.float()), "int64"),
           (lambda: emb([1, 2]), "torch.Tensor"),
           (lambda: pt.EmbeddingBag(2, name=f"ids.{r}.bag")(ids, torch.tensor([0, 3, 2])),
            "never decrease"),
           (lambda: pt.EmbeddingBag(2, name=f"ids.{r}.bag")(ids), "offsets"),
           (lambda: pt.EmbeddingBag(2, mode="max"), "mode"),
           (lambda: pt.Embedding(2, init=("laplace", 1)), "init"),
           (lambda: pt.Embedding(2, optimizer=torch.optim.SGD), "optimizer")]
    refused(bad)
    print("PASS ids", flush=True)


def check_spread(r):
    emb = pt.Embedding(1, init="zeros", optimizer=pt.SGD(1.0), name=f"spread.{r}")
    before = pt.embedding_stats()
    ids = torch.from_numpy(np.random.default_rng(5).integers(-2**63, 2**63 - 1, 4000))
    rows(emb, ids)
    after = pt.embedding_stats()
    made = [a["rows"] - b["rows"] for a, b in zip(after, before)]
    if r == 0 and len(made) == 2:
        print(f"rows per server: {made}", flush=True)
    assert all(m > 0 for m in made), made
    print("PASS spread", flush=True)


def check_conflict(r):
    pt.EmbeddingBag(6, name="shared", optimizer=pt.RowWiseAdam())
    pt.barrier()
    if r == 1:
        try:
            pt.EmbeddingBag(6, name="shared", optimizer=pt.RowWiseAdam(lr=0.5))
        except pslite.RequestRefused as e:
            assert '"shared"' in str(e) and "lr=0.5" in str(e), e
            print(f"refused: {e}", flush=True)
        else:
            raise AssertionError("a conflicting table was accepted")
    pt.barrier()
    print("PASS conflict", flush=True)


def check_memory(r, n=200_000, dim=16):
    if r != 0:
        return
    n = int(os.environ.get("EMB_MEMORY_ROWS", n))
    emb = pt.Embedding(dim, init="zeros", name="memory")
    before = pt.embedding_stats()
    ids = torch.arange(n)
    for at in range(0, n, 50_000):
        rows(emb, ids[at:at + 50_000])
    after = pt.embedding_stats()
    made = sum(a["rows"] - b["rows"] for a, b in zip(after, before))
    store = sum(a["store_bytes"] - b["store_bytes"] for a, b in zip(after, before))
    rss = sum(a["rss_bytes"] - b["rss_bytes"] for a, b in zip(after, before))
    assert made == n, (made, n)
    print(f"MEMORY rows={n} dim={dim} row_bytes={dim * 4} store_bytes_per_row={store / n:.1f} "
          f"rss_bytes_per_row={rss / n:.1f} target={1.2 * dim * 4 + 16:.1f}", flush=True)
    print("PASS memory", flush=True)


def stats_delta(before, key):
    return sum(a[key] - b[key] for a, b in zip(pt.embedding_stats(), before))


def step(module, ids, grad=1.0):
    """One training step of `module` alone: every row of `ids` gets `grad`."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    if isinstance(module, pt.EmbeddingBag):
        ids = ids.view(-1, 1)  # bags of one
    (module(ids) * grad).sum().backward()
    module.flush()


def check_expiry(r):
    """Rows untouched for expire_after steps (a step: a push from each of
    the 2 workers, per key range) read as new rows, are removed, and come
    back from the initializer. Rank 0 only: the statistics are the
    servers' (every table's)."""
    if r != 0:
        return
    low, high, seed, dim = -0.5, 0.5, 4, 3
    emb = pt.Embedding(dim, optimizer=pt.SGD(1.0), init=("uniform", low, high), seed=seed,
                       expire_after=2, name="expiry")
    ticker = list(range(64))  # pushed every step, to both servers' ranges
    halves = {key_of(emb.table, i) >> 63 for i in ticker}
    assert halves == {0, 1}, halves
    targets = list(range(1000, 1010))
    fresh = np.stack([uniform_row(seed, key_of(emb.table, i), dim, low, high) for i in targets])
    before = pt.embedding_stats()
    step(emb, ticker + targets)  # push 1 of each range
    close(rows(emb, targets), fresh - 1, "trained")
    for _ in range(3):
        step(emb, ticker)  # pushes 2..4: 3 pushes without the targets
    close(rows(emb, targets), fresh - 1, "kept for 2 steps (4 pushes) less one")
    step(emb, ticker)  # push 5: 4 pushes without them, 2 steps of 2 workers
    assert np.array_equal(rows(emb, targets), fresh), "expired rows read as new ones"
    step(emb, ticker)  # push 6: the sweep (every 2 pushes) removes them
    assert stats_delta(before, "rows_expired") == len(targets), pt.embedding_stats()
    step(emb, targets, 0.25)
    close(rows(emb, targets), fresh - 0.25, "pushed again: a new row")
    bad = [(lambda: pt.Embedding(2, expire_after=-1), "expire_after"),
           (lambda: pt.Embedding(2, admit_after=1 << 20), "admit_after"),
           (lambda: pt.Embedding(2, cache_staleness=2), "cache_rows")]
    refused(bad)
    print(f"expiry: {stats_delta(before, 'rows_expired')} rows expired", flush=True)
    print("PASS expiry", flush=True)


def check_admission(r):
    """An id gets its row at the admit_after-th push that carries it; pulls
    before answer zeros and the pushes' gradients are dropped."""
    if r != 0:
        return
    low, high, seed = -0.5, 0.5, 9
    emb = pt.EmbeddingBag(2, optimizer=pt.SGD(1.0), init=("uniform", low, high), seed=seed,
                          admit_after=3, name="admission")
    before = pt.embedding_stats()
    for n in (1, 2):
        step(emb, [5, 6])
        assert not rows(emb, [5, 6]).any(), f"not admitted after {n} pushes: zeros"
    assert stats_delta(before, "candidates") == 2, pt.embedding_stats()
    assert stats_delta(before, "gradients_dropped") == 4, pt.embedding_stats()
    assert stats_delta(before, "rows") == 0
    step(emb, [5], 0.5)  # the third push of id 5
    close(rows(emb, [5])[0], uniform_row(seed, key_of(emb.table, 5), 2, low, high) - 0.5,
          "admitted at the third push")
    assert not rows(emb, [6]).any()
    assert stats_delta(before, "rows_admitted") == 1, pt.embedding_stats()
    assert stats_delta(before, "rows") == 1, pt.embedding_stats()
    print("PASS admission", flush=True)


def check_cache(r, staleness=2, steps=10):
    """Rank 1 pushes a gradient of 1 to row 7 each step; rank 0 reads it
    through a cache of staleness 2: it pulls every third forward and reads
    the row as the servers held it then (never more than 2 steps old). A
    cache of staleness 0 trains exactly as no cache."""
    name = "cache.shared"
    pt.barrier()  # rank 0's checks of the servers' statistics are over
    if r == 1:
        writer = pt.Embedding(1, optimizer=pt.SGD(1.0), init="zeros", name=name)
    else:
        reader = pt.Embedding(1, optimizer=pt.SGD(1.0), init="zeros", name=name,
                              cache_rows=16, cache_staleness=staleness)
        plain = pt.Embedding(1, optimizer=pt.SGD(1.0), init="zeros", name=name)
    for k in range(1, steps + 1):
        if r == 1:
            step(writer, [7])
        pt.barrier()
        if r == 0:
            got = float(rows(reader, [7, 8])[0, 0])
            pulled_at = k - (k - 1) % (staleness + 1)
            assert got == -pulled_at, (k, got, pulled_at)
            assert -k <= got <= -(k - staleness), (k, got)
            assert float(rows(plain, [7])[0, 0]) == -k
        pt.barrier()
    if r == 0:
        want = 2 * (steps + staleness) // (staleness + 1)
        assert reader.rows_pulled == want, (reader.rows_pulled, want)
        assert plain.rows_pulled == steps, plain.rows_pulled
        print(f"cache: {reader.rows_pulled} rows pulled over {steps} forwards with "
              f"staleness {staleness}, {2 * steps} without a cache", flush=True)
        # Staleness 0: the same rows and pulls as without a cache.
        rng = np.random.default_rng(3)
        # (zeros: two tables' rows differ by their keys' initial values only)
        a = pt.Embedding(4, optimizer=pt.RowWiseAdaGrad(lr=0.1), name="cache.a", init="zeros")
        b = pt.Embedding(4, optimizer=pt.RowWiseAdaGrad(lr=0.1), name="cache.b", init="zeros",
                         cache_rows=64, cache_staleness=0)
        for _ in range(5):
            ids = torch.from_numpy(rng.integers(0, 30, size=12))
            coef = torch.randn(12, 4)
            out_a, out_b = a(ids), b(ids)
            assert torch.equal(out_a, out_b)
            (out_a * coef).sum().backward()
            (out_b * coef).sum().backward()
        assert np.array_equal(rows(a, range(30)), rows(b, range(30)))
        assert a.rows_pulled == b.rows_pulled
    print("PASS cache", flush=True)


def staleness(r, steps=12):
    """PS_STALENESS=s with `pt.embedding_clock()`: each worker adds 1 a step
    to its own row (SGD, lr 1, gradient -1), reads every worker's row and
    checks none is more than s steps behind; rank 1 is a straggler."""
    import time

    s = int(os.environ["PS_STALENESS"])
    w = pt.size()
    emb = pt.Embedding(1, optimizer=pt.SGD(lr=1.0), init="zeros", name="clocks")
    everyone = torch.arange(w)
    gap = 0
    for c in range(steps):
        (emb(torch.tensor([r])) * -1.0).sum().backward()
        seen = rows(emb, everyone)[:, 0]
        for other, v in enumerate(seen):
            behind = c - int(v)
            gap = max(gap, behind)
            assert other == r or behind <= s, (r, c, other, behind, s)
        if r == 1:
            time.sleep(0.03)  # a straggler (load, not synchronisation)
        assert pt.embedding_clock() == c + 1
    emb.flush()
    print(f"PASS staleness rank {r} gap {gap}", flush=True)


def replicas(r):
    """Rows trained, the test kills a server (stdin says when), the rows
    read back exactly and training goes on. A table with expiry and
    admission goes on deciding as before the kill: a count made before it
    admits an id after it, and rows expire at the push they would have."""
    opt = pt.RowWiseAdaGrad(lr=0.1)
    emb = pt.EmbeddingBag(4, optimizer=opt, name="kept", seed=1)
    ids = torch.arange(300) * 1_000_003
    for k in range(3):
        (emb(ids.view(-1, 3)) * (k + 1)).sum().backward()
    emb.flush()
    before = rows(emb, ids)
    # 1 worker, expire_after=3: 3 pushes of a range without a row expire it.
    life = pt.Embedding(2, optimizer=pt.SGD(1.0), init=("uniform", -0.5, 0.5), seed=3,
                        expire_after=3, admit_after=2, name="kept.life")
    ticker, targets = list(range(64)), list(range(1000, 1010))
    assert {key_of(life.table, i) >> 63 for i in ticker} == {0, 1}
    fresh = np.stack([uniform_row(3, key_of(life.table, i), 2, -0.5, 0.5) for i in targets])
    step(life, ticker)  # push 1 of each range: ticker counted
    step(life, ticker + targets)  # push 2: ticker admitted, targets counted
    life_before = rows(life, ticker)
    assert life_before.any() and not rows(life, targets).any()
    print("READY", flush=True)
    sys.stdin.readline()
    after = rows(emb, ids)
    assert np.array_equal(before, after), "rows changed or were lost with the server"
    (emb(ids.view(-1, 3))).sum().backward()
    emb.flush()
    assert not np.array_equal(rows(emb, ids), after)
    assert np.array_equal(rows(life, ticker), life_before), "expiring rows lost"
    step(life, targets)  # push 3: the targets' second, counted before the kill
    close(rows(life, targets), fresh - 1, "admitted after the kill")
    step(life, targets)  # push 4: 2 pushes without the ticker
    assert np.array_equal(rows(life, ticker), life_before), "expired too early"
    step(life, targets)  # push 5: 3 pushes without the ticker: expired (zeros: admission)
    assert not rows(life, ticker).any(), "not expired after the kill"
    print("PASS replicas", flush=True)


def checkpoint(r, case):
    """Rows trained and checkpointed (save), or read back after the restore
    (load); one more step after it must agree too (Adam's moments and step
    counts are in the checkpoint)."""
    emb = pt.EmbeddingBag(4, optimizer=pt.RowWiseAdam(lr=0.05), name="ck", seed=2)
    ids = torch.arange(200) * 31 - 100
    saved = os.environ["EMB_ROWS"]
    if case == "save":
        for step in range(3):
            (emb(ids.view(-1, 4)) * (step + 1)).sum().backward()
        # A prefetch and the last backward's push still in flight:
        # pt.checkpoint() waits for both before its barrier.
        emb.prefetch(ids.view(-1, 4))
        (emb(ids.view(-1, 4)) * 4).sum().backward()
        info = pt.checkpoint("emb")
        print(f"checkpoint {info['id']} written to {info['dir']} ({len(info['files'])} files)",
              flush=True)
        np.save(saved + ".0.npy", rows(emb, ids))
    else:
        got = rows(emb, ids)
        assert np.array_equal(got, np.load(saved + ".0.npy")), "restored rows differ"
    (emb(ids.view(-1, 4)) * 0.5).sum().backward()
    emb.flush()
    after = rows(emb, ids)
    if case == "save":
        np.save(saved + ".1.npy", after)
    else:
        assert np.array_equal(after, np.load(saved + ".1.npy")), "a step after the restore"
    print(f"PASS checkpoint {case}", flush=True)


def export(r):
    """Each worker trains tables of its own and one both share, takes a
    checkpoint, and writes (EMB_ROWS.<rank>.npz) the rows the servers held
    then and the pooled outputs of its modules for batches with ids never
    trained; the test exports the checkpoint and compares."""
    user = pt.EmbeddingBag(6, mode="mean", optimizer=pt.RowWiseAdam(lr=0.05),
                           init=("normal", 0.1), name=f"user.{r}", seed=7)
    item = pt.Embedding(3, optimizer=pt.RowWiseAdaGrad(lr=0.2), name=f"item.{r}")
    shared = pt.EmbeddingBag(2, optimizer=pt.SGD(0.1), init="zeros", name="shared")
    rng = np.random.default_rng(r)
    universe = rng.integers(-2**62, 2**62, 300)
    batches = [rng.choice(universe, (16, 5)) for _ in range(4)]
    for batch in map(torch.from_numpy, batches):
        loss = user(batch).square().sum() + item(batch).sum() + shared(batch[:, :2]).sum()
        loss.backward()
    pt.checkpoint("export")
    ids = np.unique(np.concatenate(batches))
    shared_ids = np.unique(np.concatenate([b[:, :2] for b in batches]))
    out = {"ids": ids, "user": rows(user, ids), "item": rows(item, ids),
           "shared_ids": shared_ids, "shared": rows(shared, shared_ids)}
    # Batches with ids never trained: their rows are made now, after the
    # checkpoint (the export answers them with the initial rows too).
    bags = torch.from_numpy(np.concatenate([rng.choice(universe, (8, 3)),
                                            rng.integers(0, 10**6, (8, 2))], axis=1))
    flat, offsets = bags.view(-1), torch.tensor([0, 4, 4, 9, 20, 33])
    weights = torch.linspace(0.1, 1.0, flat.numel())
    with torch.no_grad():
        out.update(bags=bags.numpy(), offsets=offsets.numpy(), weights=weights.numpy(),
                   user_bags=user(bags).numpy(), item_bags=item(bags).numpy(),
                   shared_bags=shared(flat, offsets, per_sample_weights=weights).numpy())
    np.savez(f"{os.environ['EMB_ROWS']}.{r}.npz", **out)
    pt.barrier()
    print("PASS export", flush=True)


def main():
    if CASE == "all":
        misuse_before_init()
    pt.init()
    r = pt.rank()
    if CASE == "replicas":
        replicas(r)
        return
    if CASE in ("save", "load"):
        checkpoint(r, CASE)
        return
    if CASE == "export":
        export(r)
        return
    if CASE == "no tables":
        print(f"checkpoint {pt.checkpoint('nothing')['id']}", flush=True)
        return
    if CASE == "memory":
        check_memory(r)
        return
    if CASE == "staleness":
        staleness(r)
        return
    check_duplicates(r)
    check_initializers(r)
    check_optimizers(r)
    check_pooling(r)
    check_ids(r)
    check_spread(r)
    check_conflict(r)
    check_expiry(r)
    check_admission(r)
    check_cache(r)
    check_memory(r)
    print("PASS embedding", flush=True)


main()
