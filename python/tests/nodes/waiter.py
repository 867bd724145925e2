#!/usr/bin/env python3
"""A node that waits on purpose, for the tests of failures and Ctrl-C.

Server: answers requests, except those with cmd 1 (never answered).
Worker (WAITER_MODE):
  request   push with cmd 1, print "waiting", kv.wait() for the Request;
  take      pull with cmd 1, print "waiting", take() from the Request;
  pull_int  pull with cmd 1 keeping only its int timestamp (the Request
            object is gone), print "waiting", kv.take_pull(ts);
  start     print "waiting", start (the test gives it no scheduler).
The worker prints "interrupted" on KeyboardInterrupt, or
"raised <Class>: <message>" on a pslite.Error, and exits 0 either way.
"""

import gc
import os
import sys
import time

import numpy as np

import pslite


def worker(po, mode):
    try:
        if mode == "start":
            print("waiting", flush=True)
            po.start()
            return
        po.start()
        kv = pslite.KVWorker(po)
        keys = np.array([1], dtype=np.uint64)
        if mode == "request":
            req = kv.push(keys, np.ones(1, dtype=np.float32), cmd=1)
            print("waiting", flush=True)
            kv.wait(req)
        elif mode == "take":
            req = kv.pull(keys, cmd=1)
            print("waiting", flush=True)
            req.take()
        elif mode == "pull_int":
            ts = int(kv.pull(keys, cmd=1))
            gc.collect()
            print("waiting", flush=True)
            kv.take_pull(ts)
        else:
            raise SystemExit(f"unknown WAITER_MODE {mode}")
        print("completed?!", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    except pslite.Error as e:
        print(f"raised {type(e).__name__}: {e}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # the cluster is gone or never was: no finalize


def main():
    po = pslite.Postoffice.from_env()
    if po.is_worker:
        worker(po, os.environ.get("WAITER_MODE", "request"))
    po.start()
    server = None
    if po.is_server:
        server = pslite.KVServer(po)

        def handle(meta, pairs, srv):
            if meta.cmd != 1:
                srv.response(meta)

        server.set_request_handle(handle)
        print(f"serving pid {os.getpid()}", flush=True)
    while True:  # until killed
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
