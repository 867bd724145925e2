#!/usr/bin/env python3
"""A node exercising pslite's Python API; run as `pslite launch -s 2 -w 2`.

Servers: app 0 float32 DefaultHandle; app 1 float64 Python handle keeping
variable-length values (lens), answering cmd 7 later from a timer thread
and raising on cmd 99; app 2 int64 DefaultHandle; SimpleApp 9 echoing
reversed bodies. Workers check exact results, callbacks, the store and its
watch, and the exceptions. Each worker prints `PASS features rank R`.
"""

import sys
import threading

import numpy as np

import pslite
from checks import expect, raises, run_node

CMD_LATER = 7
CMD_RAISE = 99


class VarLenStore:
    """Sums pushes per key, any number of values per key (lens)."""

    def __init__(self):
        self.store = {}
        self.seen = []

    def __call__(self, meta, pairs, server):
        self.seen.append((meta.cmd, meta.priority))
        if meta.cmd == CMD_RAISE:
            raise ValueError(f"boom {meta.cmd}")
        keys, vals, lens = pairs.keys, pairs.vals, pairs.lens
        assert not vals.flags.writeable and not keys.flags.writeable
        if meta.push:
            per = lens if lens.size else np.full(keys.size, vals.size // max(keys.size, 1))
            at = 0
            for k, n in zip(keys.tolist(), per.tolist()):
                cur = self.store.get(k)
                part = vals[at:at + n]
                self.store[k] = part.copy() if cur is None else cur + part
                at += n
        if meta.pull:
            got = [self.store.get(k, np.zeros(1)) for k in keys.tolist()]
            res = pslite.KVPairs(keys, np.concatenate(got),
                                 np.array([g.size for g in got], dtype=np.int32))
        else:
            res = None
        if meta.cmd == CMD_LATER:
            threading.Timer(0.2, server.response, args=(meta, res)).start()
        else:
            server.response(meta, res)


def serve(po):
    apps = []
    s0 = pslite.KVServer(po, app_id=0)
    s0.set_request_handle(pslite.DefaultHandle())
    s1 = pslite.KVServer(po, app_id=1, dtype=np.float64)
    s1.set_request_handle(VarLenStore())
    s2 = pslite.KVServer(po, app_id=2, dtype="int64")
    s2.set_request_handle(pslite.DefaultHandle(), inline=True)
    app = pslite.SimpleApp(po, app_id=9, customer_id=9)  # requests go to customer app_id
    app.set_request_handle(lambda req, a: a.response(req, req.body[::-1]))
    apps += [s0, s1, s2, app]
    return apps


def work(po):
    rank, nw = po.my_rank(), po.num_workers
    expect(po.membership().workers == po.node_ids(pslite.WORKER_GROUP), "membership")
    expect(len(po.server_key_ranges()) == 2, "key ranges")
    half = np.uint64(np.iinfo(np.uint64).max // 2)

    # float32, app 0: push with a callback on the app's thread, then pull.
    kv = pslite.KVWorker(po, app_id=0)
    keys = np.array([1, 2, half + np.uint64(5)], dtype=np.uint64)
    vals = np.array([1, 2, 3], dtype=np.float32) * (rank + 1)
    done = threading.Event()
    calls = []

    def callback(result):
        calls.append((result, threading.current_thread().name))
        done.set()

    kv.wait(kv.push(keys, vals, callback=callback))
    expect(done.wait(10) and isinstance(calls[0][0], pslite.KVPairs), "push callback")
    expect(calls[0][1] != threading.main_thread().name, "callback on the app's thread")
    po.barrier(pslite.WORKER_GROUP)
    got = kv.take_pull(kv.pull(keys))
    total = sum(range(1, nw + 1))
    expect(np.array_equal(got.vals, np.array([1, 2, 3], dtype=np.float32) * total), "f32 sums")
    expect(np.array_equal(got.keys, keys) and got.lens.size == 0, "pulled keys and lens")
    pulled = []
    ts = kv.pull(keys, callback=pulled.append)
    kv.wait(ts)
    expect(isinstance(pulled[0], pslite.KVPairs) and pulled[0].vals.size == 3, "pull callback")
    e = raises(pslite.InvalidInput, kv.take_pull, ts)
    expect("no pulled values" in str(e), f"take_pull of a callback's pull: {e}")
    po.barrier(pslite.WORKER_GROUP)

    # float64 with lens, cmd and priority, app 1.
    kv1 = pslite.KVWorker(po, app_id=1, dtype=np.float64)
    k1 = np.array([10 + rank, half + np.uint64(10 + rank)], dtype=np.uint64)
    v1 = np.array([0.5, 1.0, 2.0, 3.0])
    kv1.wait(kv1.push(k1, v1, lens=np.array([1, 3], dtype=np.int32), cmd=5, priority=3))
    out = kv1.take_pull(kv1.pull(k1))
    expect(np.array_equal(out.vals, v1) and out.lens.tolist() == [1, 3], f"lens: {out}")
    # push_pull sees its own push; cmd 7 is answered later from another thread.
    out = kv1.take_pull(kv1.push_pull(k1, v1, lens=[1, 3], cmd=CMD_LATER), timeout=30)
    expect(np.array_equal(out.vals, 2 * v1), f"push_pull answered later: {out.vals}")
    e = raises(pslite.HandlerPanicked, kv1.wait, kv1.push(k1[:1], v1[:1], cmd=CMD_RAISE))
    expect("ValueError: boom 99" in str(e) and e.node in (8, 10), f"handler exception: {e!r}")
    expect(isinstance(e, pslite.Failure) and isinstance(e, pslite.Error), "hierarchy")

    # int64 DefaultHandle (inline on the servers).
    kv2 = pslite.KVWorker(po, app_id=2, dtype="int64")
    k2 = np.array([3, half + np.uint64(3)], dtype=np.uint64)
    kv2.wait(kv2.push(k2, np.array([2**40, -7], dtype=np.int64)))
    po.barrier(pslite.WORKER_GROUP)
    got = kv2.take_pull(kv2.pull(k2)).vals
    expect(got.dtype == np.int64 and got.tolist() == [nw * 2**40, -7 * nw], f"int64: {got}")

    # Bad input raises InvalidInput (a ValueError) and sends nothing.
    # Each variant of pslite::Error has its class, under InvalidInput here.
    e = raises(ValueError, kv.push, np.array([5, 1], dtype=np.uint64), np.ones(2, np.float32))
    expect(type(e) is pslite.UnsortedKeys and "ascending" in str(e), f"unsorted: {e!r}")
    e = raises(pslite.InvalidInput, kv.push, keys, np.ones(4, dtype=np.float32))
    expect(type(e) is pslite.ValsMismatch and "do not fit the keys" in str(e), f"vals: {e!r}")
    e = raises(pslite.InvalidInput, kv.wait, 12345)
    expect(type(e) is pslite.UnknownTimestamp, f"unknown timestamp: {e!r}")
    e = raises(pslite.InvalidInput, po.barrier, pslite.SERVER_GROUP)
    expect(type(e) is pslite.InvalidGroup and "is invalid here" in str(e), f"group: {e!r}")

    # SimpleApp: every server answers with the body reversed.
    app = pslite.SimpleApp(po, app_id=9)
    bodies = []
    app.set_response_handle(lambda resp, a: bodies.append((resp.sender, resp.body)))
    app.wait(app.request(3, b"abc", pslite.SERVER_GROUP))
    expect(sorted(bodies) == [(8, b"cba"), (10, b"cba")], f"simple app: {bodies}")

    # The store, with torch.distributed.Store's names.
    store = po.store(timeout=30)
    watch = store.watch("epoch") if rank == 1 else None
    po.barrier(pslite.WORKER_GROUP)
    if rank == 0:
        store.set("lr", "0.5")
        for epoch in (b"1", b"2"):
            store.set("epoch", epoch)
        expect(store.delete_key("epoch"), "delete_key")
    expect(store.get("lr") == b"0.5", "get waits for the set")
    expect(store.add("arrived", 1) >= 1, "add")
    po.barrier(pslite.WORKER_GROUP)
    expect(store.get("arrived") == str(nw).encode(), "add sums")
    expect(store.check(["lr", "arrived"]) and not store.check(["nope"]), "check")
    expect(store.num_keys() >= 2, "num_keys")
    if rank == 0:
        expect(store.compare_set("cas", "", "a") == b"a", "compare_set of a new key")
        expect(store.compare_set("cas", "x", "b") == b"a", "compare_set mismatch")
        expect(store.compare_set("cas", "a", "b") == b"b", "compare_set swap")
    e = raises(pslite.Timeout, store.wait, ["never-set"], timeout=0.2)
    expect(type(e) is pslite.StoreTimeout and isinstance(e, pslite.StoreError)
           and isinstance(e, TimeoutError) and "never-set" in str(e), f"store timeout: {e!r}")
    if watch is not None:
        events = []
        for event in watch:
            events.append((event.value, event.version))
            if len(events) == 3:
                break
        expect([v for v, _ in events] == [b"1", b"2", None], f"watch: {events}")
        versions = [n for _, n in events]
        expect(versions == list(range(versions[0], versions[0] + 3)), f"versions {versions}")
        expect(watch.next_event(timeout=0.05) is None, "no more events")
    po.barrier(pslite.WORKER_GROUP)
    for app_ in (kv, kv1, kv2, app):
        app_.close()
    print(f"PASS features rank {rank}", flush=True)


def main():
    run_node(serve, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
