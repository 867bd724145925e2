"""Uneven inputs for `pslite.torch`: `join()` for a worker whose data has
ended, what a worker tells the servers when it ends, and the error that
names the parameter and the rank when a worker waits for one that ended.

The servers' side is `pslite.AllReduceHandle` (apps/src/all_reduce/members.rs):
a push-pull with command JOIN to one key of each server's range, on each
app, says "this worker has joined": until every worker has joined, every
round completes without the joined ones (their parts count as zeros: a mean
still divides by the number of workers, as DDP's
divide_by_initial_world_size and Horovod do), and each join is answered
once the last worker has joined, with the values it pushed (its rank). A
push with command FINISHED says "this worker has ended": every round that
waits for it, then and later, is refused with its rank, so the others fail
in about one round trip instead of waiting forever.
"""

import re
import sys
import time
import weakref

import numpy as np

import pslite

#: AllReduceHandle's commands (apps/src/all_reduce/members.rs).
_JOIN = 100
_FINISHED = 101
#: How the servers say which worker ended.
_FINISHED_RE = re.compile(r"worker rank (\d+) has finished")
_KEY_RE = re.compile(r"will not push key (\d+)")
#: Seconds a worker waits for the servers to take its "finished" at exit.
_FINISHED_WAIT = 10.0

#: Every DistributedOptimizer made (join() checks none has gradients in flight).
_optimizers = weakref.WeakSet()


def _pt():
    from . import torch as pt  # the package module (imports this one at its end)
    return pt


def _targets(s):
    """One (KVWorker, key array) per app of every server: the first and the
    last key of each server's range (a join counts for the rounds of that
    range: with PS_REPLICAS a server also backs up other ranges, whose
    joins it sees too; commands never touch a round)."""
    kvs = [*s.workers.values(), s.raw]
    return [(kv, np.array([begin, end - 1], dtype=np.uint64))
            for kv in kvs for begin, end in s.ranges]


def _rank_values(kv, rank):
    if kv.dtype == "raw":
        return np.array([rank % 256] * 2, dtype=np.uint8)
    return np.array([rank] * 2, dtype=kv.dtype)


def track(optimizer):
    """Remembers a DistributedOptimizer (for join()'s check)."""
    _optimizers.add(optimizer)


def join():
    """This worker's data has ended: waits until every worker has called
    `join()`, taking part meanwhile in every round the others still run as
    zeros (their averages still divide by `size()`, as DDP's and Horovod's
    do), and returns the rank of the last worker to join. Its own model
    does not step meanwhile: broadcast the last one's parameters after
    (``pt.broadcast_parameters(model.state_dict(), root_rank=pt.join())``).
    Call it between steps (after `step()`), once per epoch or at the end.
    A worker that ends without `join()` while others still push makes them
    fail with `pslite.WorkerFinished`."""
    pt = _pt()
    s = pt._st()
    if getattr(s, "po", None) is None:
        return s.rank  # a single process: nobody else to wait for
    for opt in list(_optimizers):
        busy = [e.name for e in opt._plan if e.requests is not None]
        if busy:
            raise pslite.InvalidInput(
                f"join() while gradients are in flight ({', '.join(busy[:3])}): call step() "
                f"(or synchronize()) before join()")
    requests = []
    for kv, keys in _targets(s):
        requests.append((kv, kv.push_pull(keys, _rank_values(kv, s.rank), cmd=_JOIN)))
    last = s.rank
    for kv, req in requests:
        try:
            pairs = req.take()
        except pslite.RequestRefused as e:
            mapped = finished_error(e, f"join() of worker rank {s.rank}")
            if mapped is None:
                raise
            raise mapped from e
        if kv.dtype == "float64":
            last = int(np.asarray(pairs.vals)[0])
    return last


def announce_finished(s):
    """Tells every server's apps that this worker has ended (at shutdown),
    so that a worker still pushing fails at once, naming this rank."""
    if getattr(s, "po", None) is None:
        return
    requests = []
    try:
        for kv, keys in _targets(s):
            requests.append(kv.push(keys, _rank_values(kv, s.rank), cmd=_FINISHED))
        deadline = time.monotonic() + _FINISHED_WAIT
        for req in requests:
            req.wait(timeout=max(0.0, deadline - time.monotonic()))
    except pslite.Error as e:
        print(f"pslite.torch: could not tell the servers that worker rank {s.rank} has "
              f"finished: {e}", file=sys.stderr, flush=True)


def finished_error(err, what):
    """`err` (a `pslite.RequestRefused`) as a `pslite.WorkerFinished` that
    names `what` (e.g. "the gradient of parameter fc.weight") when a
    finished worker caused it; None otherwise."""
    m = _FINISHED_RE.search(str(err))
    if m is None:
        return None
    rank = int(m.group(1))
    key = _KEY_RE.search(str(err))
    where = f"server node {err.node}" if err.node is not None else "a server"
    if key is not None:
        where += f", key {key.group(1)}"
    new = pslite.WorkerFinished(
        f"{what} waits for worker rank {rank}, which has finished (its script ended) and will "
        f"not push again: every worker must run the same number of steps, or a worker whose "
        f"data ends first calls pslite.torch.join() (refused by {where})")
    new.rank = rank
    new.node = err.node
    return new
