#!/usr/bin/env python3
"""One MXNet 1.9.1 node of a `dist_sync` KVStore job; the role comes from DMLC_ROLE.

scheduler / server:
    In MXNet 1.9.1 these roles never get past `import mxnet`: importing the package imports
    mxnet.kvstore.kvstore_server, which (when DMLC_ROLE != worker) creates the 'dist' store,
    runs the server/scheduler loop in C++ (ps-lite), and calls sys.exit() when the job ends.
    This script only reports that and exits with the same status.

worker:
    Creates a 'dist_sync' store and checks exact float sums over the cluster:
      key 3  float32 (2,3)            small, one server
      key 5  float32 (4,5,6)          small, one server
      key 7  float32 (BIG,)           >= MXNET_KVSTORE_BIGARRAY_BOUND elements: split over servers
      key 11 float16 (8,)             data head 5 (dtype float16) instead of 0
      key 9  float32 (10,)            exercised with pushpull (push+pull in one request)
    Steps: init (rank 0 pushes the initial values, then a worker barrier), pull == init,
    ROUNDS rounds of push + pull == sum over workers of the pushed values (the server, with no
    updater, replaces the stored value by the merged sum), pushpull, explicit worker barrier,
    then the store is destroyed (worker barrier, rank 0 sends 'stop server', finalize barrier).
    Every value is a small integer, so float32/float16 sums are exact and compared with ==.

Env (besides the DMLC_* ones): MX_NODE_ROUNDS (default 2), MX_NODE_BIG (elements of key 7,
default 1200000), MX_NODE_SKIP_F16=1 to leave out key 11, MX_NODE_SKIP_PUSHPULL=1 to leave
out key 9.
Output: lines starting with 'PASS ' / 'FAIL ' / 'INFO '; exit 0 only if every check passed.
"""
import gc
import os
import sys
import time

ROLE = os.environ.get("DMLC_ROLE", "worker")
T0 = time.time()


def log(msg):
    """msg = 'PASS ...' / 'FAIL ...' / 'INFO ...'; printed as 'PASS [role pid] ...'."""
    word, _, rest = msg.partition(" ")
    print("%s [%s %d] %s" % (word, ROLE, os.getpid(), rest), flush=True)


def run_server_or_scheduler():
    log("INFO starting %s (loop runs inside `import mxnet`)" % ROLE)
    code = 0
    try:
        import mxnet  # noqa: F401  -- runs the whole server/scheduler life, then sys.exit()
        log("FAIL import mxnet returned for role %s: MXNet did not enter its loop" % ROLE)
        return 1
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if code == 0:
        log("PASS %s exited cleanly after %.1fs" % (ROLE, time.time() - T0))
    else:
        log("FAIL %s exited with %r" % (ROLE, code))
    return code


def run_worker():
    import numpy as np
    import mxnet as mx

    rounds = int(os.environ.get("MX_NODE_ROUNDS", "2"))
    big = int(os.environ.get("MX_NODE_BIG", "1200000"))
    skip_f16 = os.environ.get("MX_NODE_SKIP_F16", "0") == "1"
    skip_pp = os.environ.get("MX_NODE_SKIP_PUSHPULL", "0") == "1"

    failures = []

    def check(name, got, want):
        got = np.asarray(got)
        if got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want):
            log("PASS %s (shape %s %s)" % (name, want.shape, want.dtype))
        else:
            bad = "shape/dtype %s %s vs %s %s" % (got.shape, got.dtype, want.shape, want.dtype)
            if got.shape == want.shape:
                idx = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
                bad = "%d of %d differ, first at %d: got %r want %r" % (
                    idx.size, want.size, idx[0], got.reshape(-1)[idx[0]], want.reshape(-1)[idx[0]])
            log("FAIL %s: %s" % (name, bad))
            failures.append(name)

    kv = mx.kv.create("dist_sync")
    rank, nw = kv.rank, kv.num_workers
    log("INFO worker rank %d of %d, kv.type=%s, ready after %.1fs" % (rank, nw, kv.type, time.time() - T0))
    want_nw = int(os.environ["DMLC_NUM_WORKER"])
    if nw != want_nw:
        log("FAIL num_workers %d != DMLC_NUM_WORKER %d" % (nw, want_nw))
        failures.append("num_workers")

    # key -> (shape, dtype, base pattern of small integers)
    def base(shape, dtype, mod):
        n = int(np.prod(shape))
        return (np.arange(n, dtype=np.int64) % mod).astype(dtype).reshape(shape)

    specs = {
        3: base((2, 3), np.float32, 97),
        5: base((4, 5, 6), np.float32, 97),
        7: base((big,), np.float32, 1000),
    }
    if not skip_f16:
        specs[11] = base((8,), np.float16, 16)
    pp_key = None if skip_pp else 9
    if pp_key is not None:
        specs[pp_key] = base((10,), np.float32, 10)

    def init_val(k):
        return specs[k] + np.asarray(100, dtype=specs[k].dtype)

    def push_val(k, r, t):  # what worker rank r pushes in round t
        return specs[k] * np.asarray(r + 1, dtype=specs[k].dtype) + np.asarray(t, dtype=specs[k].dtype)

    def sum_val(k, t):  # sum over all workers of push_val: exact for these small integers
        s = np.zeros(specs[k].shape, dtype=np.float64)
        for r in range(nw):
            s += push_val(k, r, t).astype(np.float64)
        limit = 2048 if specs[k].dtype == np.float16 else 2 ** 24  # exact-integer range
        assert np.all(s < limit), "key %d: values must stay exact in %s" % (k, specs[k].dtype)
        return s.astype(specs[k].dtype)

    keys = sorted(specs)
    # 1. init: rank 0 pushes the initial values (data head = dtype code), then worker barrier
    kv.init(keys, [mx.nd.array(init_val(k), dtype=specs[k].dtype) for k in keys])
    log("INFO init done for keys %s" % keys)

    # 2. pull the initial values
    outs = {k: mx.nd.zeros(specs[k].shape, dtype=specs[k].dtype) for k in keys}
    for k in keys:
        kv.pull(k, out=outs[k])
    for k in keys:
        check("pull-after-init key %d" % k, outs[k].asnumpy(), init_val(k))

    # 3. push / pull rounds (sync mode: push is answered once every worker pushed)
    rk = [k for k in keys if k != pp_key]
    for t in range(1, rounds + 1):
        kv.push(rk, [mx.nd.array(push_val(k, rank, t), dtype=specs[k].dtype) for k in rk])
        for k in rk:
            kv.pull(k, out=outs[k])
        for k in rk:
            check("round %d push+pull key %d" % (t, k), outs[k].asnumpy(), sum_val(k, t))

    # 4. pushpull (one request with push=true,pull=true; answered after the merge)
    if pp_key is not None:
        for t in range(1, rounds + 1):
            out = mx.nd.zeros(specs[pp_key].shape, dtype=specs[pp_key].dtype)
            kv.pushpull(pp_key, mx.nd.array(push_val(pp_key, rank, t), dtype=specs[pp_key].dtype), out=out)
            check("round %d pushpull key %d" % (t, pp_key), out.asnumpy(), sum_val(pp_key, t))

    # 5. explicit worker barrier (BARRIER group 4 at the scheduler)
    kv._barrier()
    log("PASS worker barrier")

    # 6. tear down now (not at interpreter exit): barrier(4), rank 0 -> 'stop server' (head 2),
    #    Finalize: barrier(7), TERMINATE to self
    mx.nd.waitall()
    del kv
    gc.collect()
    log("INFO store closed after %.1fs" % (time.time() - T0))

    if failures:
        log("FAIL worker rank %d: %d check(s) failed: %s" % (rank, len(failures), ", ".join(failures)))
        return 1
    log("PASS worker rank %d all checks" % rank)
    return 0


def main():
    for v in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
        if v not in os.environ:
            print("FAIL [%s] missing env %s" % (ROLE, v), flush=True)
            return 2
    if ROLE in ("scheduler", "server"):
        return run_server_or_scheduler()
    if ROLE == "worker":
        try:
            return run_worker()
        except Exception as e:  # report, never hang on a Python error
            import traceback
            traceback.print_exc()
            log("FAIL worker exception: %r" % (e,))
            return 1
    print("FAIL unknown DMLC_ROLE %r" % ROLE, flush=True)
    return 2


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: skip interpreter teardown of MXNet's engine threads after the store is closed
    os._exit(rc)
