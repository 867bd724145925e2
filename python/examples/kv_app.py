#!/usr/bin/env python3
"""ps-lite's test_kv_app in Python: exact sums through pslite's Python API.

Servers run the default sum store (`pslite.DefaultHandle`, in Rust; with
KV_APP_HANDLE=python the same store written in NumPy as a Python request
handle). Each
worker pushes the values of its own keys REPEAT times (10 requests in
flight), pulls them and checks they are exactly REPEAT times the pushed
values, then runs REPEAT serialized push-pulls and checks each returns
exactly the running total. Keys are spread over the whole key space and
offset by the worker's rank, so workers never share a key and the sums are
exact for any cluster size; values are small integers, which float32 adds
exactly.

    pslite launch -s 2 -w 2 -- python python/examples/kv_app.py

Environment: KV_APP_KEYS (default 10000), KV_APP_REPEAT (default 50),
KV_APP_HANDLE (rust or python). Its nodes mix with Rust kv_app's (the same
workload): `pslite launch -s 2 -w 2 --worker-program
python/examples/kv_app.py -- target/release/examples/kv_app`.
Exits 0 only if every sum is exact.
"""

import os
import sys

import numpy as np

import pslite


def values(seed, n):
    """Deterministic integer-valued floats in 0..1000."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1000, size=n).astype(np.float32)


def check(what, got, pushed, times):
    want = pushed * np.float32(times)
    if got.shape != want.shape:
        raise SystemExit(f"{what}: {got.size} values for {want.size} keys")
    wrong = np.flatnonzero(got != want)
    if wrong.size:
        i = wrong[0]
        raise SystemExit(
            f"{what}: {wrong.size} of {got.size} values wrong; first at key index {i}: "
            f"{got[i]} != {pushed[i]} x {times}")


class SumStore:
    """ps-lite's default handle in NumPy: pushes add into the store, pulls
    read it (one value per key; a key never pushed reads as zero)."""

    def __init__(self):
        self.keys = np.zeros(0, dtype=np.uint64)
        self.vals = np.zeros(0, dtype=np.float32)

    def __call__(self, meta, pairs, server):
        keys = pairs.keys
        at = np.searchsorted(self.keys, keys)
        if self.keys.size:
            known = (at < self.keys.size) & (self.keys[np.minimum(at, self.keys.size - 1)] == keys)
        else:
            known = np.zeros(keys.size, dtype=bool)
        if meta.push:
            new = ~known
            if new.any():
                self.keys = np.insert(self.keys, at[new], keys[new])
                self.vals = np.insert(self.vals, at[new], 0)
                at = np.searchsorted(self.keys, keys)
                known = np.ones(keys.size, dtype=bool)
            self.vals[at] += pairs.vals
        if meta.pull:
            out = np.zeros(keys.size, dtype=np.float32)
            out[known] = self.vals[at[known]]
            server.response(meta, pslite.KVPairs(keys, out))
        else:
            server.response(meta)


def run_worker(po, num, repeat):
    kv = pslite.KVWorker(po)
    rank = po.my_rank()
    step = np.uint64(np.iinfo(np.uint64).max // num)
    keys = np.arange(num, dtype=np.uint64) * step + np.uint64(rank)
    vals = values(rank + 7, num)
    pending = []
    for i in range(repeat):
        pending.append(kv.push(keys, vals))
        if i >= 10:
            kv.wait(pending[i - 10])
    for ts in pending:
        kv.wait(ts)
    check("pull", kv.take_pull(kv.pull(keys)).vals, vals, repeat)
    for r in range(1, repeat + 1):
        out = kv.take_pull(kv.push_pull(keys, vals))
        check("push_pull", out.vals, vals, repeat + r)
    print(f"worker rank {rank}: push, pull and push_pull sums exact", flush=True)


def main():
    num = int(os.environ.get("KV_APP_KEYS", "10000"))
    repeat = int(os.environ.get("KV_APP_REPEAT", "50"))
    po = pslite.Postoffice.from_env()
    po.start()
    server = None
    if po.is_server:
        server = pslite.KVServer(po)
        python_handle = os.environ.get("KV_APP_HANDLE", "rust") == "python"
        server.set_request_handle(SumStore() if python_handle else pslite.DefaultHandle())
    elif po.is_worker:
        run_worker(po, max(num, 1), repeat)
    po.finalize()
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
