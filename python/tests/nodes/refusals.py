#!/usr/bin/env python3
"""Requests a server cannot take raise at once, as one node of `pslite
launch -s 2 -w 1` (PS_APP_WAIT=300): the servers are float32 sum stores
(app 0, DefaultHandle) and a Python handle (app 5) that refuses cmd 7. The
worker sends float64 values (DtypeMismatch, naming both dtypes), 1 value per
key for keys that hold 2 (LengthMismatch, naming the key and both lengths),
a pull for app 3, which no server has (UnknownApp), and cmd 7 to app 5
(RequestRefused with the handle's reason); each raises within its bound and
nothing refused is applied. Prints `PASS refusals <role>`.
"""

import time

import numpy as np

import pslite
from checks import expect, raises, run_node

KEYS = np.array([1, 2**64 - 2], dtype=np.uint64)  # one key on each server


def serve(po):
    store = pslite.KVServer(po)
    store.set_request_handle(pslite.DefaultHandle())
    picky = pslite.KVServer(po, app_id=5)

    def handle(meta, pairs, server):
        if meta.cmd == 7:
            server.refuse(meta, "command 7 is not known here")
        else:
            server.response(meta)

    picky.set_request_handle(handle)
    return [store, picky]


def timed(exc, bound, fn, *args, **kw):
    t = time.monotonic()
    e = raises(exc, fn, *args, **kw)
    took = time.monotonic() - t
    expect(took < bound, f"{exc.__name__} came after {took:.2f} s (bound {bound} s)")
    print(f"{exc.__name__} in {took * 1000:.0f} ms: {e}", flush=True)
    return e


def work(po):
    kv = pslite.KVWorker(po)
    kv.push(KEYS, np.array([1, 2, 3, 4], dtype=np.float32)).wait()

    f64 = pslite.KVWorker(po, customer_id=1, dtype="float64")
    e = timed(pslite.DtypeMismatch, 1.0, lambda: f64.push(KEYS, np.ones(4)).wait())
    expect("float32" in str(e) and "float64" in str(e), str(e))
    expect(isinstance(e, TypeError) and isinstance(e, pslite.RequestRefused), repr(e))
    expect(e.node in po.node_ids(pslite.SERVER_GROUP), f"node {e.node}")

    e = timed(pslite.LengthMismatch, 1.0,
              lambda: kv.push(KEYS, np.array([9, 9], dtype=np.float32)).wait())
    expect("holds 2 values for key" in str(e) and "sent 1" in str(e), str(e))
    expect(isinstance(e, ValueError), repr(e))

    other = pslite.KVWorker(po, app_id=3, customer_id=2)
    e = timed(pslite.UnknownApp, 3.0, lambda: other.pull(KEYS).take())
    expect("there is no app 3" in str(e) and "PS_APP_WAIT" in str(e), str(e))
    expect(isinstance(e, LookupError), repr(e))

    picky = pslite.KVWorker(po, app_id=5, customer_id=3)
    e = timed(pslite.RequestRefused, 1.0,
              lambda: picky.push(KEYS, np.ones(2, dtype=np.float32), cmd=7).wait())
    expect("app 5: command 7 is not known here" in str(e), str(e))
    picky.push(KEYS, np.ones(2, dtype=np.float32)).wait()

    vals = kv.pull(KEYS).take().vals
    expect(vals.tolist() == [1, 2, 3, 4], f"the store changed: {vals}")


po = run_node(serve, work)
print(f"PASS refusals {po.role}", flush=True)
