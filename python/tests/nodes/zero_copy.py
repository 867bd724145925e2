#!/usr/bin/env python3
"""Zero-copy checks, as one node of `pslite launch -s 1 -w 1`.

The server's Python handle checks that a pushed array arrives as a
read-only view of the received buffer: with shared memory on (the default
between pslite nodes of one host) that buffer lies in a `pslite-shm-`
segment the worker created (found in /proc/self/maps). The worker checks
that pulled values are a view of the buffer the server sent: a
`pslite-shm-` segment of the server's, and that a pushed array is let go
once sent. Prints
`PASS zero-copy <role>`.
"""

import gc
import os
import sys

import numpy as np

import pslite

N = 1 << 20  # 4 MiB of float32: far above the 64 KiB shared-memory threshold


def mapping_of(address):
    """The path of the mapping of this process that holds `address`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else ""
    return None


def foreign_segment(address):
    """Whether `address` lies in another process's pslite shared-memory segment."""
    path = mapping_of(address) or ""
    name = path.rsplit("/", 1)[-1]
    return name.startswith("memfd:pslite-shm-") and f"-{os.getpid()}-" not in name


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAIL {what}")


def main():
    shm = os.environ.get("PS_SHM", "1") != "0"
    po = pslite.Postoffice.from_env()
    po.start()
    server = None
    if po.is_server:
        server = pslite.KVServer(po)
        seen = []

        def handle(meta, pairs, srv):
            vals = pairs.vals
            if meta.push and vals.size == N:
                check(not vals.flags.writeable, "received values are read-only")
                check(vals.ctypes.data == vals.base.address, "a view of the received SArray")
                if shm:
                    check(foreign_segment(vals.ctypes.data),
                          f"pushed values in the worker's segment: {mapping_of(vals.ctypes.data)}")
                seen.append(vals.ctypes.data)
            if meta.pull:
                # Each key's value is the key (a large pull comes in chunks
                # over a network: one request per chunk of keys).
                out = pairs.keys.astype(np.float32)
                srv.response(meta, pslite.KVPairs(pairs.keys, out))
            else:
                srv.response(meta)

        server.set_request_handle(handle)
    elif po.is_worker:
        kv = pslite.KVWorker(po)
        keys = np.arange(N, dtype=np.uint64)
        vals = np.ones(N, dtype=np.float32)
        before = sys.getrefcount(vals)
        kv.wait(kv.push(keys, vals))
        kv.wait(kv.push(keys[:1], vals[:1]))  # takes the GIL: deferred releases run
        gc.collect()
        check(sys.getrefcount(vals) == before, "the pushed array is let go once sent")
        got = kv.take_pull(kv.pull(keys)).vals
        check(got.dtype == np.float32 and got.size == N, "pulled shape")
        check(np.array_equal(got, keys.astype(np.float32)), "pulled values")
        check(not got.flags.writeable, "pulled values are read-only")
        check(isinstance(got.base, pslite.ArrayView) and got.base.address == got.ctypes.data,
              "pulled values are a view of the received SArray")
        if shm:
            check(foreign_segment(got.ctypes.data),
                  f"pulled values in the server's segment: {mapping_of(got.ctypes.data)}")
        # Pushed again, a pulled (pslite-owned) array is the same SArray: no copy.
        again = pslite.frozen(keys)
        check(not again.flags.writeable and again.base.address != keys.ctypes.data, "frozen copy")
        kv.wait(kv.push(again, got))
        check(pslite.misaligned_copies() == 0, "no misaligned frame was copied")
        kv.close()
    po.finalize()
    if server is not None:
        server.close()
    print(f"PASS zero-copy {po.role}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
