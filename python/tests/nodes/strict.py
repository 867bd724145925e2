#!/usr/bin/env python3
"""Strict inputs and out=, as one node of `pslite launch -s 1 -w 1`.

Keys must be integers >= 0 (floats, negative ints and bools refused with
InvalidInput naming the element, at once); values of another dtype are
converted only when exact (else InvalidInput naming the first inexact
element), or with cast=True; Python floats round to the worker's dtype but
never overflow. pull(out=) and push_pull(out=) fill a caller's writable
array (take() returns it; a read-only, wrongly typed or wrongly sized one
is refused). Prints `PASS strict <role>`.
"""

import time

import numpy as np

import pslite
from checks import expect, raises, run_node


def serve(po):
    server = pslite.KVServer(po)
    server.set_request_handle(pslite.DefaultHandle())
    return [server]


def refused(fn, *want):
    t = time.monotonic()
    e = raises(pslite.InvalidInput, fn)
    expect(time.monotonic() - t < 1.0, "slow refusal")
    for w in want:
        expect(w in str(e), f"{w!r} not in {e}")
    return e


def work(po):
    kv = pslite.KVWorker(po)
    one = np.ones(2, dtype=np.float32)
    refused(lambda: kv.push([1.5, 2.7], one), "keys must be integers", "float64")
    refused(lambda: kv.push(np.array([1.0, 2.0]), one), "keys must be integers")
    refused(lambda: kv.push([-1], one[:1]), "keys must be from 0", "keys[0] = -1")
    refused(lambda: kv.push([-1, 2, 3], np.ones(3, dtype=np.float32)), "keys[0] = -1")
    refused(lambda: kv.push([1, 2], np.array([1e40, 1.0])), "vals[0] = 1e+40", "float32")
    refused(lambda: kv.push([1, 2], [1e40, 1.0]), "vals[0]")
    refused(lambda: kv.push([1, 2], np.array([0.1, 0.5])), "vals[0] = 0.1", "cast=True")
    refused(lambda: kv.push([1, 2], one, lens=[3, -1]), "lens")
    ints = pslite.KVWorker(po, customer_id=1, dtype="int64")
    refused(lambda: ints.push([5], [1.5]), "vals[0] = 1.5")
    # Exact conversions go through; so do Python floats (rounded) and cast=True.
    kv.push(np.array([1, 2], dtype=np.int64), np.array([0.5, 2.0])).wait()
    kv.push([1, 2], [0.25, 1.0]).wait()
    kv.push([1, 2], np.array([0.1, 0.0]), cast=True).wait()
    kv.push([2**64 - 1], [1.0]).wait()  # the largest key, as a Python int
    got = kv.pull([1, 2]).take().vals
    expect(np.allclose(got, [0.85, 3.0]), f"{got}")

    # out=: filled in place, returned by take(), checked.
    out = np.zeros(2, dtype=np.float32)
    req = kv.pull([1, 2], out=out)
    req.wait()
    expect(np.allclose(out, [0.85, 3.0]) and req.take().vals is out, f"{out}")
    vals = np.array([1.0, 1.0], dtype=np.float32)
    kv.push_pull([1, 2], vals, out=vals).wait()
    expect(np.allclose(vals, [1.85, 4.0]), f"{vals}")
    frozen = kv.pull([1, 2]).take().vals
    refused(lambda: kv.pull([1, 2], out=frozen), "read-only")
    refused(lambda: kv.pull([1, 2], out=np.zeros(2)), "dtype float32")
    refused(lambda: kv.pull([1, 2], out=np.zeros(4, dtype=np.float32)[::2]), "C-contiguous")
    refused(lambda: kv.pull([1, 2], out=out, callback=print), "do not go together")
    e = raises(pslite.InvalidInput, lambda: kv.pull([1, 2], out=np.zeros(3, np.float32)).wait())
    expect("out= has 3 elements and the pull returned 2" in str(e), str(e))
    try:
        import torch
    except ImportError:
        print("no torch: tensor out= not checked", flush=True)
    else:
        t = torch.zeros(2)
        kv.pull([1, 2], out=t).wait()
        expect(torch.allclose(t, torch.tensor([1.85, 4.0])), f"{t}")
        pushed = torch.tensor([1.0, 1.0])
        kv.push([1, 2], pushed).wait()  # a CPU tensor is sent as it is


po = run_node(serve, work)
print(f"PASS strict {po.role}", flush=True)
