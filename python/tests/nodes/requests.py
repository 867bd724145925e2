#!/usr/bin/env python3
"""Request objects, as one node of `pslite launch -s 2 -w 1`.

Servers: a sum store in a Python handle (one float32 per key) that holds
requests with cmd HOLD until a request with cmd RELEASE arrives, and raises
on cmd RAISE; a SimpleApp echoing bodies. The worker checks `pslite.Request`:
wait, take, done, num_responses, ts; that it still stands for the int
timestamp ps-lite code expects (`kv.wait(kv.push(..))`, `ts = kv.push(..);
kv.wait(ts)`, `int(req)`); that a request whose timestamp was taken out is
kept after its object goes, with its failure or values; timeouts; callbacks.
Prints `PASS requests <role>`.
"""

import gc
import operator
import sys
import threading

import numpy as np

import pslite
from checks import expect, raises, run_node

HOLD = 1
RELEASE = 2
RAISE = 3
ECHO_APP = 9


def serve(po):
    server = pslite.KVServer(po)
    store = {}
    held = []

    def answer(meta, pairs, srv):
        keys = pairs.keys.tolist()
        if meta.push:
            for k, v in zip(keys, pairs.vals.tolist()):
                store[k] = store.get(k, 0.0) + v
        if meta.pull:
            vals = np.array([store.get(k, 0.0) for k in keys], dtype=np.float32)
            srv.response(meta, pslite.KVPairs(pairs.keys, vals))
        else:
            srv.response(meta)

    def handle(meta, pairs, srv):
        if meta.cmd == RAISE:
            raise ValueError("refused on purpose")
        if meta.cmd == HOLD:
            held.append((meta, pairs))
            return
        if meta.cmd == RELEASE:
            for m, p in held:
                answer(m, p, srv)
            held.clear()
        answer(meta, pairs, srv)

    server.set_request_handle(handle)
    echo = pslite.SimpleApp(po, app_id=ECHO_APP, customer_id=ECHO_APP)
    echo.set_request_handle(lambda req, app: app.response(req, req.body))
    return [server, echo]


def work(po):
    kv = pslite.KVWorker(po)
    half = np.uint64(np.iinfo(np.uint64).max // 2)
    keys = np.array([1, 2, half + np.uint64(1)], dtype=np.uint64)  # both servers
    ones = np.ones(3, dtype=np.float32)

    # The object: wait, done, num_responses, ts; waited twice.
    req = kv.push(keys, ones)
    expect(isinstance(req, pslite.Request), f"push returns a Request: {req!r}")
    expect(repr(req).startswith("<pslite.Request push ts="), repr(req))
    req.wait(timeout=30)
    req.wait()
    expect(req.done and req.num_responses == 2, f"done, {req.num_responses} responses")
    pulled = kv.pull(keys)
    got = pulled.take(timeout=30)
    expect(np.array_equal(got.vals, ones) and np.array_equal(got.keys, keys), f"take: {got}")
    expect(not got.vals.flags.writeable and isinstance(got.vals.base, pslite.ArrayView),
           "taken values are a view of the received buffer")
    e = raises(pslite.InvalidInput, pulled.take)
    expect("no pulled values" in str(e), f"taken twice: {e}")
    expect(np.array_equal(kv.push_pull(keys, ones).take().vals, 2 * ones), "push_pull take")

    # ps-lite's timestamps: the object where an int goes, and the int itself.
    kv.wait(kv.push(keys, ones))
    ts = kv.push(keys, ones)
    kv.wait(ts)
    expect(np.array_equal(kv.take_pull(kv.pull(keys)).vals, 4 * ones), "take_pull(object)")
    ts = kv.pull(keys)
    expect(isinstance(ts.ts, int) and int(ts) == ts.ts == operator.index(ts), "int parity")
    expect("%d" % ts == str(ts.ts) and list(range(ts.ts + 1))[ts] == ts.ts, "an int's uses")
    expect(np.array_equal(kv.take_pull(int(ts)).vals, 4 * ones), "take_pull(int)")
    # The object goes once its int is out: the request (and its values) stays.
    ts = int(kv.pull(keys))
    gc.collect()
    expect(np.array_equal(kv.take_pull(ts, timeout=30).vals, 4 * ones), "kept for take_pull(int)")
    ts = int(kv.push(keys, ones))
    kv.wait(ts, timeout=30)
    raises(pslite.InvalidInput, kv.wait, 1 << 30)  # never handed out
    e = raises(TypeError, kv.wait, "3")
    expect("pslite.Request or an int" in str(e), f"wrong ts type: {e}")

    # Failures: through the object, every time; by int after the object went.
    req = kv.push(keys, ones, cmd=RAISE)
    for _ in range(2):
        e = raises(pslite.HandlerPanicked, req.wait)
        expect("refused on purpose" in str(e) and e.timestamp == req.ts, f"failure: {e!r}")
    ts = int(kv.push(keys, ones, cmd=RAISE))
    gc.collect()
    raises(pslite.HandlerPanicked, kv.wait, ts)
    ts = int(kv.pull(keys, cmd=RAISE))
    raises(pslite.HandlerPanicked, kv.take_pull, ts)

    # Not done yet: done, a timeout that leaves the request going, then done.
    held = kv.push(keys, ones, cmd=HOLD)
    expect(not held.done and held.num_responses == 0, "held: not done")
    raises(pslite.Timeout, held.wait, timeout=0.2)
    e = raises(pslite.Timeout, kv.wait, held, timeout=0.1)
    expect(isinstance(e, TimeoutError), "Timeout is a TimeoutError")
    held_pull = kv.pull(keys, cmd=HOLD)
    raises(pslite.Timeout, held_pull.take, timeout=0.1)
    kv.push(keys, ones, cmd=RELEASE).wait(timeout=30)
    held.wait(timeout=30)
    expect(held.done and held.num_responses == 2, "released")
    expect(held_pull.take(timeout=30).vals.size == 3, "held pull taken after its timeout")

    # Callbacks still run, on the app's thread; the values went to them.
    results = []
    done = threading.Event()

    def callback(result):
        results.append((result, threading.current_thread().name))
        done.set()

    req = kv.pull(keys, callback=callback)
    req.wait(timeout=30)
    expect(done.wait(30) and isinstance(results[0][0], pslite.KVPairs), f"callback: {results}")
    expect(results[0][1] != threading.main_thread().name, "callback on the app's thread")
    raises(pslite.InvalidInput, req.take)
    kv.push(keys, ones, callback=lambda r: None)  # dropped at once: given up, fine

    # SimpleApp requests are Request objects too.
    app = pslite.SimpleApp(po, app_id=ECHO_APP)
    req = app.request(5, b"x")
    app.wait(req, timeout=30)
    expect(req.done and req.num_responses == 2, "SimpleApp request")
    app.wait(int(app.request(5, b"y")), timeout=30)
    e = raises(pslite.InvalidInput, req.take)
    expect("SimpleApp request" in str(e), f"take of a SimpleApp request: {e}")
    kv.wait(kv.request(5, b"z", pslite.SERVER_GROUP), timeout=30)  # a command on the KV app
    app.close()
    kv.close()


def main():
    po = run_node(serve, work)
    print(f"PASS requests {po.role}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
