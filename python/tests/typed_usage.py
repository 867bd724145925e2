"""A program typed against pslite's stubs (checked by mypy --strict in
test_stubs.py; never run)."""

import numpy as np
import numpy.typing as npt

import pslite


def worker(po: pslite.Postoffice) -> float:
    kv = pslite.KVWorker(po, app_id=0, customer_id=0, dtype="float32")
    keys: npt.NDArray[np.uint64] = np.array([1, 2], dtype=np.uint64)
    kv.push(keys, np.ones(2), lens=None, cmd=0, priority=1, callback=None, cast=True).wait()
    out = np.zeros(2, dtype=np.float32)
    kv.pull(keys, cmd=0, priority=0, callback=None, out=out).wait(timeout=5.0)
    pairs: pslite.KVPairs = kv.push_pull(keys, out, out=out, cast=False).take()
    try:
        kv.pull(keys).wait()
    except pslite.DtypeMismatch as e:
        print(e.node, e.timestamp)
    except pslite.WorkerFinished as e:
        print(e.rank)
    except pslite.RequestRefused:
        pass
    return float(pairs.vals.sum())


def server(po: pslite.Postoffice) -> pslite.KVServer:
    s = pslite.KVServer(po, app_id=0, dtype=np.float32)

    def handle(meta: pslite.KVMeta, pairs: pslite.KVPairs, srv: pslite.KVServer) -> None:
        if meta.cmd == 7:
            srv.refuse(meta, "unknown command")
        else:
            srv.response(meta, pslite.KVPairs(pairs.keys, pairs.vals))

    s.set_request_handle(handle)
    s.set_request_handle(pslite.AllReduceHandle(po.num_workers), inline=True)
    return s
