#!/usr/bin/env python3
"""Bounded staleness from Python (issue 33 item 3), as one node of
`pslite launch -s 2 -w 3` with PS_STALENESS set: servers are float32 sum
stores. Each worker checks `kv.staleness` (from PS_STALENESS, then set and
read back), then for 15 iterations pushes 1 to its own key, pulls every
worker's key and checks no worker is more than s iterations behind it,
and ends the iteration with `kv.clock()` (which returns the new clock,
also `kv.current_clock`). Worker rank 1 sleeps 30 ms per iteration (a
straggler). Prints `PASS staleness rank <r> gap <largest gap seen>`.
"""

import os
import time

import numpy as np

import pslite
from checks import expect, run_node

ITERS = 15


def serve(po):
    store = pslite.KVServer(po)
    store.set_request_handle(pslite.DefaultHandle())
    return [store]


def work(po):
    s = int(os.environ["PS_STALENESS"])
    kv = pslite.KVWorker(po)
    expect(kv.staleness == s, f"staleness {kv.staleness!r}, PS_STALENESS {s}")
    kv.staleness = None
    expect(kv.staleness is None, repr(kv.staleness))
    kv.staleness = s
    rank, workers = po.my_rank(), po.num_workers
    step = np.iinfo(np.uint64).max // workers
    all_keys = np.array([step * w + 3 for w in range(workers)], dtype=np.uint64)
    mine = all_keys[rank:rank + 1]
    gap = 0
    for clock in range(ITERS):
        kv.push(mine, np.ones(1, dtype=np.float32)).wait()
        vals = np.array(kv.pull(all_keys).take().vals)
        for w, v in enumerate(vals):
            behind = clock - int(v)
            gap = max(gap, behind)
            expect(w == rank or behind <= s,
                   f"rank {rank} at clock {clock} saw worker {w} {behind} iterations behind (s={s})")
        if rank == 1:
            time.sleep(0.03)
        expect(kv.clock() == clock + 1, "clock() returns the new clock")
        expect(kv.current_clock == clock + 1, repr(kv.current_clock))
    print(f"PASS staleness rank {rank} gap {gap}", flush=True)


run_node(serve, work)
