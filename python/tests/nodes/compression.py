#!/usr/bin/env python3
"""Gradient compression from Python (issue 30 item 3), as one node of
`pslite launch -s 1 -w 1`: the server is a float32 sum store (app 0,
DefaultHandle). The worker checks `pslite.Compression`'s options and
refusals, compressors whose result it can predict exactly (onebit on values
of one magnitude, 2bit on values at the threshold, topk on values with as
many non-zeros as it keeps), error feedback (topk:0.25 over 32 pushes of one
gradient: with it every value arrives and the sum is near 32x the gradient;
without it only the top quarter ever does), an answer compressed at the
pull's request (and the server's error feedback on such answers, asked
per request), and the KVWorker-wide setting with a per-request
override. Prints `PASS compression <role>`.
"""

import numpy as np

import pslite
from checks import expect, raises, run_node

N = 64


def keys(block):
    """64 fresh keys per block (each check its own)."""
    return np.arange(block * 1000, block * 1000 + N, dtype=np.uint64)


def serve(po):
    store = pslite.KVServer(po)
    store.set_request_handle(pslite.DefaultHandle())
    return [store]


def pull(kv, k, **kw):
    return np.array(kv.pull(k, **kw).take().vals)


def options(po):
    c = pslite.Compression("topk:0.25")
    expect(c.kind == "topk" and str(c) == "topk:0.25", repr(c))
    expect(c.error_feedback and not c.compress_answers, repr(c))
    c = pslite.Compression("2bit", error_feedback=False, compress_answers=True)
    expect(str(c) == "2bit:0.5" and not c.error_feedback and c.compress_answers, repr(c))
    expect(pslite.Compression("onebit") == pslite.Compression("onebit"), "equality")
    for bad in ("fourbit", "topk:0", "topk:1.5", "2bit:-1", "onebit:3", "randomk:x"):
        e = raises(pslite.InvalidInput, pslite.Compression, bad)
        print(f"Compression({bad!r}): {e}", flush=True)
    kv = pslite.KVWorker(po, customer_id=9, compression="randomk:0.1")
    expect(kv.compression == pslite.Compression("randomk:0.1"), repr(kv.compression))
    kv.compression = None
    expect(kv.compression is None, repr(kv.compression))
    raises(pslite.InvalidInput, setattr, kv, "compression", 3)
    kv.close()
    e = raises(pslite.InvalidInput, pslite.KVWorker, po, customer_id=8, dtype="int32",
               compression="onebit")
    expect("f32 and f64" in str(e), str(e))


def exact(kv):
    rng = np.random.default_rng(7)
    signs = np.where(rng.random(N) < 0.5, -1.0, 1.0).astype(np.float32)
    # onebit: one magnitude, so sign x mean magnitude is exact.
    kv.push(keys(1), 0.75 * signs, compression="onebit").wait()
    expect(np.array_equal(pull(kv, keys(1)), 0.75 * signs), "onebit")
    # 2bit: values at +-threshold or 0 are exact.
    v = (signs * 0.5 * (rng.random(N) < 0.7)).astype(np.float32)
    kv.push(keys(2), v, compression="2bit:0.5").wait()
    expect(np.array_equal(pull(kv, keys(2)), v), "2bit")
    # topk: as many non-zeros as it keeps.
    v = np.zeros(N, dtype=np.float32)
    v[rng.permutation(N)[:16]] = rng.standard_normal(16).astype(np.float32)
    kv.push(keys(3), v, compression=pslite.Compression("topk:16")).wait()
    expect(np.array_equal(pull(kv, keys(3)), v), "topk")


def error_feedback(po, kv):
    g = np.linspace(0.25, 1.0, N) * np.where(np.arange(N) % 2, 1, -1)
    g = g.astype(np.float32)
    off = pslite.Compression("topk:0.25", error_feedback=False)
    for _ in range(32):
        kv.push(keys(4), g, compression="topk:0.25").wait()
        kv.push(keys(5), g, compression=off).wait()
    with_ef, without = pull(kv, keys(4)), pull(kv, keys(5))
    top = np.argsort(-np.abs(g), kind="stable")[:16]
    want = np.zeros(N, dtype=np.float32)
    want[top] = 32 * g[top]
    expect(np.allclose(without, want), f"without error feedback: {without}")
    expect(np.count_nonzero(with_ef) == N, f"with error feedback some never arrived: {with_ef}")
    err = np.abs(with_ef - 32 * g).sum() / np.abs(32 * g).sum()
    # What is left out is at most about one push's worth per value (0.05
    # by a model of it; without error feedback 0.64).
    expect(err < 0.1, f"with error feedback the sum is {err:.2f} off 32x the gradient")
    print(f"error feedback: relative error {err:.3f} (without: "
          f"{np.abs(without - 32 * g).sum() / np.abs(32 * g).sum():.3f})", flush=True)


def answers(kv):
    rng = np.random.default_rng(8)
    v = rng.standard_normal(N).astype(np.float32)
    kv.push(keys(6), v, compression="none").wait()
    expect(np.array_equal(pull(kv, keys(6)), v), "an uncompressed push")
    got = pull(kv, keys(6), compression=pslite.Compression("topk:8", compress_answers=True))
    top = np.argsort(-np.abs(v))[:8]
    want = np.zeros(N, dtype=np.float32)
    want[top] = v[top]
    expect(np.array_equal(got, want), f"a compressed answer: {got}")
    # The server's error feedback on its answers (asked per request): 2bit
    # at threshold 1 answers 0.3 as 0, but with feedback every fourth
    # answer carries what the three before left out.
    kv.push(keys(9), np.full(N, 0.3, dtype=np.float32), compression="none").wait()
    plain = pslite.Compression("2bit:1", compress_answers=True)
    fed = pslite.Compression("2bit:1", compress_answers=True, answer_feedback=True)
    expect(fed.answer_feedback and not plain.answer_feedback, repr(fed))
    expect(not pull(kv, keys(9), compression=plain).any(), "2bit answers 0.3 as 0")
    total = sum(pull(kv, keys(9), compression=fed) for _ in range(4))
    expect(np.allclose(total, 1.0), f"four answers with feedback add up to {total}")


def worker_wide(po):
    kv = pslite.KVWorker(po, customer_id=2, compression=pslite.Compression(
        "onebit", error_feedback=False))
    v = np.linspace(-1, 1, N).astype(np.float32)
    kv.push(keys(7), v).wait()
    got = pull(kv, keys(7))
    expect(np.allclose(np.abs(got), np.abs(v).mean()), f"the worker's onebit: {got}")
    kv.push(keys(8), v, compression="none").wait()
    expect(np.array_equal(pull(kv, keys(8)), v), "the request's 'none' over the worker's")
    kv.close()


def work(po):
    options(po)
    kv = pslite.KVWorker(po)
    exact(kv)
    error_feedback(po, kv)
    answers(kv)
    worker_wide(po)


po = run_node(serve, work)
print(f"PASS compression {po.role}", flush=True)
