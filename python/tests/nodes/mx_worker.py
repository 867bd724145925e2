#!/usr/bin/env python3
"""A worker of MXNet 1.9.1's `dist_sync` KVStore written with pslite's Python
API: it talks to MXNet's servers as `mx.kv.create('dist_sync')` does and runs
the checks of `tests/interop/mx_node.py`'s worker (and of
`apps/examples/mxnet_worker.rs`), so it can replace any MXNet worker of a job.

On the wire (docs/PROTOCOL.md, "MXNet's KVStore"): values are raw bytes
(`KVWorker(dtype="raw")`, frames typed OTHER like MXNet's `KVWorker<char>`),
lens count bytes; `cmd` (the head) is the Cantor pair of (0, dtype): float32
0, float16 5; an MXNet key goes to server (key * 9973) % n as ps key
range.begin + key, or, from MXNET_KVSTORE_BIGARRAY_BOUND elements on, is
split over every server. Rank 0 puts the servers in sync mode (command 3)
and stops them at the end (command 2), from the KV customer.

Checks (values small integers, so float sums are exact): rank 0 initialises
every key with b + 100 (b = arange(n) % m), a worker barrier, pulls equal
b + 100; MX_NODE_ROUNDS rounds of pushes of b * (r + 1) + t and pulls equal
to the sum over all workers; push-pulls of key 9; a worker barrier; then
MXNet's KVStore teardown. Also checks that pslite's store refuses a C++
scheduler (`StoreUnsupported`). Prints `PASS [py-worker rank R] all checks`.
"""

import math
import os
import sys

import numpy as np

import pslite

CMD_STOP_SERVER = 2
CMD_SYNC_MODE = 3
TIMEOUT = 60.0


def head(dtype):
    d = {np.float32: 0, np.float64: 1, np.float16: 2}[dtype]
    return d * (d + 1) // 2 + d  # Cantor pair of (0, d)


def encode_key(key, elems, itemsize, ranges, bound):
    """MXNet's EncodeDefaultKey: (ps keys, byte lens)."""
    n = len(ranges)
    if elems < bound:
        server = (key * 9973) % n
        return [ranges[server][0] + key], [elems * itemsize]
    part = [math.floor(elems / n * i + 0.5) for i in range(n + 1)]
    return ([ranges[i][0] + key for i in range(n)],
            [(part[i + 1] - part[i]) * itemsize for i in range(n)])


def main():
    rounds = int(os.environ.get("MX_NODE_ROUNDS", "2"))
    big = int(os.environ.get("MX_NODE_BIG", "1200000"))
    bound = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"))
    po = pslite.Postoffice.from_env()
    po.start()
    kv = pslite.KVWorker(po, dtype="raw")
    rank, nw = po.my_rank(), po.num_workers
    who = f"py-worker rank {rank}"
    failures = []

    try:
        po.store(timeout=20).add("interop/workers", 1)
        failures.append("store on a C++ scheduler")
        print(f"FAIL [{who}] the store answered on a C++ scheduler", flush=True)
    except pslite.StoreUnsupported as e:
        print(f"PASS [{who}] store refused by a C++ scheduler: {e}", flush=True)

    if rank == 0:
        kv.wait(kv.request(CMD_SYNC_MODE, b"", pslite.SERVER_GROUP), timeout=TIMEOUT)

    specs = {3: (np.float32, 6, 97), 5: (np.float32, 120, 97), 7: (np.float32, big, 1000),
             11: (np.float16, 8, 16), 9: (np.float32, 10, 10)}
    ranges = po.server_key_ranges()
    pskv = {k: encode_key(k, n, np.dtype(t).itemsize, ranges, bound)
            for k, (t, n, _) in specs.items()}

    def base(k):
        t, n, m = specs[k]
        return (np.arange(n) % m).astype(t)

    def push(k, vals, pull=False):
        keys, lens = pskv[k]
        raw = np.ascontiguousarray(vals, dtype=specs[k][0]).view(np.uint8)
        call = kv.push_pull if pull else kv.push
        return call(np.array(keys, dtype=np.uint64), raw,
                    lens=np.array(lens, dtype=np.int32), cmd=head(specs[k][0]))

    def take(k, ts):
        keys, lens = pskv[k]
        got = kv.take_pull(ts, timeout=TIMEOUT)
        if got.keys.tolist() != keys or got.lens.tolist() != lens:
            raise SystemExit(f"key {k}: answered {got.keys.tolist()} {got.lens.tolist()}, "
                             f"requested {keys} {lens}")
        return got.vals.view(specs[k][0])

    def check(name, got, want):
        if got.shape == want.shape and np.array_equal(got, want):
            print(f"PASS [{who}] {name} ({want.size} values)", flush=True)
        else:
            print(f"FAIL [{who}] {name}: got {got[:5]}..., want {want[:5]}...", flush=True)
            failures.append(name)

    keys = sorted(specs)
    if rank == 0:
        for t in [push(k, base(k) + 100) for k in keys]:
            kv.wait(t, timeout=TIMEOUT)
    po.barrier(pslite.WORKER_GROUP)
    pulls = [(k, kv.pull(np.array(pskv[k][0], dtype=np.uint64), cmd=head(specs[k][0])))
             for k in keys]
    for k, ts in pulls:
        check(f"pull-after-init key {k}", take(k, ts), base(k) + 100)

    def total(k, t):
        return (base(k).astype(np.float64) * (nw * (nw + 1) // 2) + nw * t).astype(specs[k][0])

    rk = [k for k in keys if k != 9]
    for t in range(1, rounds + 1):
        for ts in [push(k, base(k) * (rank + 1) + t) for k in rk]:
            kv.wait(ts, timeout=TIMEOUT)
        pulls = [(k, kv.pull(np.array(pskv[k][0], dtype=np.uint64), cmd=head(specs[k][0])))
                 for k in rk]
        for k, ts in pulls:
            check(f"round {t} push+pull key {k}", take(k, ts), total(k, t))
    for t in range(1, rounds + 1):
        check(f"round {t} pushpull key 9", take(9, push(9, base(9) * (rank + 1) + t, pull=True)),
              total(9, t))

    po.barrier(pslite.WORKER_GROUP)
    print(f"PASS [{who}] worker barrier", flush=True)
    po.barrier(pslite.WORKER_GROUP)  # ~KVStoreDist
    if rank == 0:
        kv.wait(kv.request(CMD_STOP_SERVER, b"", pslite.SERVER_GROUP), timeout=TIMEOUT)
    kv.close()
    po.finalize()
    if failures:
        print(f"FAIL [{who}] {len(failures)} check(s) failed: {', '.join(failures)}", flush=True)
        return 1
    print(f"PASS [{who}] all checks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
