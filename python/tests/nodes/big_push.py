#!/usr/bin/env python3
"""A worker pushing one large array, reporting its peak memory before and
after (run with PS_SHM=0: frames then go to ZeroMQ as they are, so a copy
on the caller's side would show as a second array's worth of memory).
Other roles serve with DefaultHandle. Prints `RSS before=KB after=KB size=KB`."""

import resource
import sys

import numpy as np

import pslite

N = 64 << 20  # 256 MiB of float32


def peak_kb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main():
    po = pslite.Postoffice.from_env()
    po.start()
    server = None
    if po.is_server:
        server = pslite.KVServer(po)
        server.set_request_handle(pslite.DefaultHandle())
    elif po.is_worker:
        kv = pslite.KVWorker(po)
        keys = np.array([7], dtype=np.uint64)
        vals = np.ones(N, dtype=np.float32)  # one key, N values
        before = peak_kb()
        kv.wait(kv.push(keys, vals))
        after = peak_kb()
        print(f"RSS before={before} after={after} size={vals.nbytes // 1024}", flush=True)
        kv.close()
    po.finalize()
    if server is not None:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
