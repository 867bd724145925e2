"""Collectives on any tensor, the job's topology (torchrun's variables), a
single process of size 1 without `pslite launch`, and the checks that name
a parameter when ranks disagree: the parts of `pslite.torch` that go beside
`DistributedOptimizer` (re-exported from `pslite.torch`).

Every collective is a round of `pslite.AllReduceHandle` on the servers' apps
that `pslite.torch.init()` starts (float32, float64 and raw bytes), in a key
region of each server's range that `DistributedOptimizer` and the
broadcasts of parameters never reach: the upper half. A call's keys come
from its `name`, hashed (so ranks may call named collectives in different
orders), or, without a name, from the number of unnamed calls before it on
this rank (so every rank must make its unnamed calls in the same order, as
with Horovod). A call in flight holds its keys until it is synchronized.
"""

import contextlib
import hashlib
import json
import os
import sys

import numpy as np
import torch

import pslite

from . import _torch_join

#: Reduction operations, as Horovod names them.
Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
Product = "product"
_OPS = (Average, Sum, Min, Max, Product)
#: The command that asks the servers for the mean instead of the sum.
_AVERAGE = 1
#: Bytes of a rank's slot in the exchange of hosts at start.
_HOST_SLOT = 256


def _pt():
    from . import torch as pt  # the package module; imported at its end
    return pt


def _st():
    return _pt()._st()


class _SingleState:
    """The state of a worker that runs alone (no `pslite launch`): rank 0
    of 1, no servers; every collective is the identity."""

    po = None
    rank = 0
    size = 1
    ranges = []
    workers = {}
    raw = None
    failed = False

    def __init__(self):
        self.closed = False

    def new_key(self, app, values=1):
        return 0


def single_state():
    """The state `init()` makes when DMLC_ROLE is not set."""
    print("pslite.torch: DMLC_ROLE is not set, so this runs as one worker of size 1 "
          "(for more: pslite launch -s 1 -w 2 -- python " + os.path.basename(sys.argv[0] or
                                                                        "train.py") + ")",
          file=sys.stderr, flush=True)
    return _SingleState()


# ------------------------------------------------------------- keys

class _Calls:
    """Per job: how many unnamed collectives this rank has made, and which
    names are in flight."""

    def __init__(self, state):
        self.state = state
        self.order = 0
        self.in_flight = set()
        self.topology = (0, 1, 0, 1)


_calls = None


def _calls_of(s):
    global _calls
    if _calls is None or _calls.state is not s:
        _calls = _Calls(s)
    return _calls


def _call_name(s, name, what):
    """The name a call's keys derive from, and whether it is the user's."""
    c = _calls_of(s)
    if name is None:
        c.order += 1
        return f"\0{what}#{c.order}", False
    name = str(name)
    if name in c.in_flight:
        raise pslite.InvalidInput(
            f"a collective named {name!r} is already in flight on this rank: synchronize its "
            f"handle first, or give this one another name")
    return name, True


def _key(s, name, part):
    """Key of part `part` of the call named `name`: hashed into the upper
    half of a server's key range."""
    h = int.from_bytes(hashlib.blake2b(f"{name}\0{part}".encode(), digest_size=8).digest(),
                       "little")
    servers = len(s.ranges)
    begin, end = s.ranges[h % servers]
    half = (end - begin) // 2
    return begin + half + (h // servers) % half


def _partition_bytes():
    return _pt()._partition_bytes()


def _push_pull(s, kv, name, flat, cmd=0):
    """Push-pulls the flat NumPy array `flat` in parts, the sums landing in
    `flat`; returns the requests."""
    per_part = max(1, _partition_bytes() // flat.itemsize)
    return [kv.push_pull(np.array([_key(s, name, i)], dtype=np.uint64),
                         flat[at:at + per_part], out=flat[at:at + per_part], cmd=cmd)
            for i, at in enumerate(range(0, max(flat.size, 1), per_part))
            if at < flat.size]


# ------------------------------------------------------------- handles

class Handle:
    """A collective in flight: `synchronize(handle)` waits for its result,
    `poll(handle)` says whether it is ready without waiting."""

    __slots__ = ("_steps", "_requests", "_result", "_done", "_what", "_name", "_calls")

    def __init__(self, steps, what, name, calls):
        self._steps, self._what, self._name, self._calls = steps, what, name, calls
        self._requests, self._result, self._done = [], None, False
        if calls is not None and name is not None:
            calls.in_flight.add(name)
        self._advance()

    def _advance(self):
        try:
            self._requests = self._steps.send(None)
        except StopIteration as stop:
            self._finish(stop.value)
        except BaseException:
            self._finish(None)
            raise

    def _finish(self, result):
        self._result, self._done, self._requests = result, True, []
        if self._calls is not None and self._name is not None:
            self._calls.in_flight.discard(self._name)

    def _fail(self, err):
        self._finish(None)
        self._steps.close()
        msg = (f"{self._what}: {err} (every rank must pass a tensor of the same shape and "
               f"dtype to the same call)")
        try:
            wrapped = type(err)(msg)
        except Exception:
            wrapped = pslite.InvalidInput(msg)
        raise wrapped from err

    def poll(self):
        while not self._done and all(r.done for r in self._requests):
            self._collect()
        return self._done

    def _collect(self):
        try:
            for r in self._requests:
                r.wait()
        except pslite.Error as err:
            self._fail(err)
        self._advance()

    def synchronize(self):
        while not self._done:
            self._collect()
        return self._result


def _start(steps, what, name=None, named=False):
    calls = _calls_of(_st())
    return Handle(steps, what, name if named else None, calls)


def _done(result):
    """A handle whose result is ready (a single process)."""
    def steps():
        return result
        yield  # a generator
    return Handle(steps(), "", None, None)


def synchronize(handle):
    """Waits for `handle`'s collective and returns its result (the output
    tensor)."""
    if not isinstance(handle, Handle):
        raise pslite.InvalidInput(f"synchronize() takes a handle from an *_async call, not "
                                  f"{type(handle).__name__}")
    return handle.synchronize()


def poll(handle):
    """True once `handle`'s collective is complete (`synchronize` then
    returns at once)."""
    if not isinstance(handle, Handle):
        raise pslite.InvalidInput(f"poll() takes a handle from an *_async call, not "
                                  f"{type(handle).__name__}")
    return handle.poll()


# ------------------------------------------------------------- helpers

def _host_copy(t):
    """A contiguous CPU copy of `t` that the servers' answers may overwrite."""
    return t.detach().to("cpu", copy=True).contiguous()


def _bytes_of(t):
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)


def _check_tensor(tensor, what):
    if not torch.is_tensor(tensor):
        raise pslite.InvalidInput(f"{what} takes a torch.Tensor, not {type(tensor).__name__}")
    if tensor.is_sparse:
        raise pslite.InvalidInput(f"{what} takes a dense tensor: call .to_dense() first")


def _put_back(out, host):
    if out.device.type == "cpu" and out.data_ptr() == host.data_ptr():
        return out
    with torch.no_grad():
        out.copy_(host.view_as(out))
    return out


# ------------------------------------------------------------- allgather

_SHAPE_SLOT = 16  # int64s per rank: first dim, dtype, ndim, the other dims


def _dtype_code(dtype):
    return _DTYPE_CODES.index(dtype) if dtype in _DTYPE_CODES else len(_DTYPE_CODES)


_DTYPE_CODES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8,
                torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
                torch.complex64, torch.complex128]


def _shape_of(row):
    ndim = int(row[2])
    return (int(row[0]), *(int(d) for d in row[3:3 + max(0, ndim - 1)]))


def _allgather_steps(s, tensor, name, what):
    """Allgather in two exchanges of raw bytes: every rank's shape (its
    slot of a W x 16 table, zeros elsewhere), then every rank's bytes at
    its offset of the concatenation."""
    host = tensor.detach().to("cpu").contiguous()
    if host.dim() == 0:
        host = host.reshape(1)
    if host.dim() > _SHAPE_SLOT - 2:
        raise pslite.InvalidInput(f"{what}: at most {_SHAPE_SLOT - 2} dimensions, got "
                                  f"{host.dim()}")
    table = np.zeros((s.size, _SHAPE_SLOT), dtype=np.int64)
    table[s.rank, :3] = (host.shape[0], _dtype_code(host.dtype), host.dim())
    table[s.rank, 3:3 + host.dim() - 1] = host.shape[1:]
    flat = table.reshape(-1).view(np.uint8)
    yield _push_pull(s, s.raw, name + "\0shapes", flat)
    mine = table[s.rank]
    for r in range(s.size):
        if table[r, 1] != mine[1] or table[r, 2] != mine[2] or \
                (table[r, 3:] != mine[3:]).any():
            names = {i: str(d).replace("torch.", "") for i, d in enumerate(_DTYPE_CODES)}
            shape = ["?", *(str(d) for d in _shape_of(table[r])[1:])]
            own = ["?", *(str(d) for d in _shape_of(mine)[1:])]
            raise pslite.InvalidInput(
                f"{what}: rank {r} sends {names.get(int(table[r, 1]), 'another dtype')} of "
                f"shape ({', '.join(shape)}) and rank {s.rank} "
                f"{names.get(int(mine[1]), 'another dtype')} of shape ({', '.join(own)}): "
                f"every rank must send the same dtype and the same dimensions after the first")
    rows = table[:, 0]
    row_bytes = host.element_size() * int(np.prod(host.shape[1:], dtype=np.int64))
    offset = int(rows[:s.rank].sum()) * row_bytes
    total = int(rows.sum())
    out = torch.zeros((total, *host.shape[1:]), dtype=host.dtype)
    data = _bytes_of(out)
    mine_bytes = _bytes_of(host)
    data[offset:offset + mine_bytes.size] = mine_bytes
    if data.size:
        yield _push_pull(s, s.raw, name + "\0data", data)
    return out.to(tensor.device)


def allgather_async(tensor, name=None):
    """Starts an allgather (see `allgather`); returns a handle."""
    _check_tensor(tensor, "allgather")
    s = _st()
    if s.po is None:
        return _done(tensor.detach().clone().reshape(-1, *tensor.shape[1:]))
    call, named = _call_name(s, name, "allgather")
    what = f"allgather {call!r}" if named else "allgather"
    return _start(_allgather_steps(s, tensor, call, what), what, call, named)


def allgather(tensor, name=None):
    """Every rank's `tensor` concatenated along dimension 0, in rank order
    (ranks may send different first dimensions; the other dimensions and
    the dtype must agree). Any dtype: the bytes go as they are."""
    return synchronize(allgather_async(tensor, name))


def allgather_object(obj, name=None):
    """Every rank's `obj` (JSON-serialisable), in rank order."""
    payload = torch.from_numpy(np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8).copy())
    s = _st()
    if s.po is None:
        return [json.loads(json.dumps(obj))]
    call, named = _call_name(s, name, "allgather_object")
    sizes = synchronize(_start(_allgather_steps(s, torch.tensor([payload.numel()]), call + "\0n",
                                                "allgather_object"), "allgather_object"))
    data = synchronize(_start(_allgather_steps(s, payload, call, "allgather_object"),
                              "allgather_object"))
    out, at = [], 0
    raw = data.numpy().tobytes()
    for n in sizes.tolist():
        out.append(json.loads(raw[at:at + n].decode()))
        at += n
    return out


# ------------------------------------------------------------- allreduce

def _op_of(average, op):
    if op is not None and average is not None:
        raise pslite.InvalidInput("give average= or op=, not both")
    if op is None:
        op = Sum if average is False else Average
    if op not in _OPS:
        raise pslite.InvalidInput(
            f"op must be one of pslite.torch.Average, Sum, Min, Max, Product, got {op!r}")
    return op


def _wire(host, op, what):
    """The float view of `host` the servers sum, and how to turn it back."""
    dtype = host.dtype
    if dtype in (torch.float32, torch.float64):
        return host, None
    if dtype in (torch.complex64, torch.complex128):
        return torch.view_as_real(host), None
    if dtype in (torch.float16, torch.bfloat16):
        return host.to(torch.float32), dtype
    if dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool):
        if op == Average:
            raise pslite.InvalidInput(
                f"{what}: the average of a {str(dtype).replace('torch.', '')} tensor is not "
                f"one: pass op=pslite.torch.Sum (summed exactly up to 2**53), or a float tensor")
        return host.to(torch.float64), dtype
    raise pslite.InvalidInput(f"{what}: {dtype} tensors are not supported")


def _allreduce_steps(s, tensor, out, op, name, what, prescale, postscale):
    host = _host_copy(tensor)
    if op in (Min, Max, Product):
        stacked = yield from _allgather_steps(s, host.unsqueeze(0), name, what)
        stacked = stacked.to("cpu")
        result = {Min: lambda: stacked.amin(0), Max: lambda: stacked.amax(0),
                  Product: lambda: stacked.prod(0)}[op]().to(host.dtype)
    else:
        wire, back = _wire(host, op, what)
        if prescale != 1.0:
            wire.mul_(prescale)
        flat = wire.reshape(-1).numpy()
        kv = s.workers[wire.dtype]
        if flat.size:
            yield _push_pull(s, kv, name, flat, cmd=_AVERAGE if op == Average else 0)
        if postscale != 1.0:
            wire.mul_(postscale)
        if back is torch.bool:
            result = wire != 0
        elif back is not None:
            result = (wire.round() if not back.is_floating_point else wire).to(back)
        else:
            result = host
    if out is None:
        return result.reshape(tensor.shape).to(tensor.device)
    return _put_back(out, result)


def _allreduce_start(tensor, average, name, op, out, prescale_factor, postscale_factor,
                     what="allreduce"):
    _check_tensor(tensor, what)
    op = _op_of(average, op)
    s = _st()
    if s.po is None:
        result = tensor.detach().clone()
        if op in (Average, Sum) and (prescale_factor != 1.0 or postscale_factor != 1.0):
            result = result * (prescale_factor * postscale_factor)
        return _done(result if out is None else _put_back(out, result))
    call, named = _call_name(s, name, what)
    label = f"{what} {call!r}" if named else what
    return _start(_allreduce_steps(s, tensor, out, op, call, label, float(prescale_factor),
                                   float(postscale_factor)), label, call, named)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0):
    """Starts an allreduce (see `allreduce`); returns a handle."""
    return _allreduce_start(tensor, average, name, op, None, prescale_factor, postscale_factor)


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0):
    """A new tensor: `tensor` reduced over every rank, elementwise. `op` is
    Average (the default; ``average=False`` means Sum), Sum, Min, Max or
    Product. float32 and float64 are summed by the servers in their own
    type, float16/bfloat16 in float32, complex as pairs of floats, integers
    and bool in float64 (exact up to 2**53; no Average); Min, Max and
    Product gather every rank's tensor and reduce on each rank (exact, any
    dtype). `prescale_factor` multiplies before the sum and
    `postscale_factor` after (Average and Sum)."""
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                       postscale_factor))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    """Starts an in-place allreduce; returns a handle."""
    return _allreduce_start(tensor, average, name, op, tensor, prescale_factor,
                            postscale_factor, "allreduce_")


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """`allreduce` into `tensor` itself; returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


# ------------------------------------------------------------- broadcast

def _broadcast_steps(s, tensor, out, root_rank, name):
    host = _host_copy(tensor)
    data = _bytes_of(host)
    if s.rank != root_rank:
        data[:] = 0
    if data.size:
        yield _push_pull(s, s.raw, name, data)
    if out is None:
        return host.to(tensor.device)
    return _put_back(out, host)


def _broadcast_start(tensor, root_rank, name, out, what):
    _check_tensor(tensor, what)
    s = _st()
    if not 0 <= root_rank < s.size:
        raise pslite.InvalidInput(f"root_rank must be from 0 to {s.size - 1}, got {root_rank}")
    if s.po is None:
        return _done(tensor.detach().clone() if out is None else out)
    call, named = _call_name(s, name, what)
    label = f"{what} {call!r}" if named else what
    return _start(_broadcast_steps(s, tensor, out, root_rank, call), label, call, named)


def broadcast_async(tensor, root_rank, name=None):
    """Starts a broadcast (see `broadcast`); returns a handle."""
    return _broadcast_start(tensor, root_rank, name, None, "broadcast")


def broadcast(tensor, root_rank, name=None):
    """A new tensor holding root_rank's `tensor`, exactly (its bytes: any
    dtype); every rank passes a tensor of the same shape and dtype."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_async_(tensor, root_rank, name=None):
    """Starts an in-place broadcast; returns a handle."""
    return _broadcast_start(tensor, root_rank, name, tensor, "broadcast_")


def broadcast_(tensor, root_rank, name=None):
    """`broadcast` into `tensor` itself; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def barrier():
    """Returns once every worker has called it (a one-byte allreduce)."""
    s = _st()
    if s.po is None:
        return
    allreduce(torch.zeros(1, dtype=torch.uint8), op=Sum)


# ------------------------------------------------------------- topology

def exchange_topology(s):
    """At start: every worker's host (DMLC_NODE_HOST, else its hostname)
    to every worker, so local_rank() and the others know who shares this
    machine; sets torchrun's variables in os.environ."""
    c = _calls_of(s)
    if s.po is not None:
        host = (os.environ.get("DMLC_NODE_HOST") or os.uname().nodename).encode()
        if len(host) > _HOST_SLOT - 1:
            host = hashlib.blake2b(host, digest_size=32).hexdigest().encode()
        table = torch.zeros((1, _HOST_SLOT), dtype=torch.uint8)
        table[0, :len(host)] = torch.tensor(list(host), dtype=torch.uint8)
        hosts = [bytes(row).rstrip(b"\0") for row in allgather(table).tolist()]
        c.topology = topology_of(hosts, s.rank)
    local_rank, local_size, _, _ = c.topology
    os.environ.update(RANK=str(s.rank), WORLD_SIZE=str(s.size), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(local_size))


def topology_of(hosts, rank):
    """(local_rank, local_size, cross_rank, cross_size) of worker `rank`
    when worker r runs on hosts[r]: local, among the workers of its host in
    rank order; cross, among the workers of its local rank (Horovod's)."""
    local_rank_of, seen = [], {}
    for h in hosts:
        local_rank_of.append(seen.get(h, 0))
        seen[h] = seen.get(h, 0) + 1
    mine = local_rank_of[rank]
    cross = [r for r in range(len(hosts)) if local_rank_of[r] == mine]
    return mine, seen[hosts[rank]], cross.index(rank), len(cross)


def _topology():
    return _calls_of(_st()).topology


def local_rank():
    """This worker's rank among the workers on its machine (same
    DMLC_NODE_HOST, else hostname), in rank order."""
    return _topology()[0]


def local_size():
    """The number of workers on this worker's machine."""
    return _topology()[1]


def cross_rank():
    """This worker's rank among the workers with its local_rank() (on one
    machine per host: the machine's index)."""
    return _topology()[2]


def cross_size():
    """The number of workers with this worker's local_rank() (the number of
    machines, when every machine runs as many workers)."""
    return _topology()[3]


# ------------------------------------------------------------- checks

def _signature(named):
    return [[str(n), list(t.shape), str(t.dtype).replace("torch.", "")] for n, t in named]


def _describe(sig):
    return f"{sig[1]} of shape ({', '.join(str(d) for d in sig[2])}{',' if len(sig[2]) == 1 else ''})"


def check_same_tensors(s, named, what):
    """Every rank holds tensors of the same names, shapes and dtypes in
    `named` ((name, tensor) pairs), or every rank raises InvalidInput
    naming the first parameter that differs, with both shapes and dtypes.
    One exchange (two small requests)."""
    if s.po is None or s.size == 1:
        return
    mine = _signature(named)
    every = allgather_object(mine)
    first = every[0]
    for r, theirs in enumerate(every[1:], start=1):
        if theirs == first:
            continue
        ours = {n: sig for n, *sig in ([x[0], x[2], x[1]] for x in first)}
        other = {n: sig for n, *sig in ([x[0], x[2], x[1]] for x in theirs)}
        for n, sig in ours.items():
            if n not in other:
                raise pslite.InvalidInput(
                    f"{what}: parameter {n} ({_describe([n, *sig])}) is on rank 0 but not "
                    f"on rank {r}: every rank must build the same model")
            if other[n] != sig:
                raise pslite.InvalidInput(
                    f"{what}: parameter {n} is {_describe([n, *sig])} on rank 0 and "
                    f"{_describe([n, *other[n]])} on rank {r}: every rank must build the same "
                    f"model in the same dtype")
        for n, sig in other.items():
            if n not in ours:
                raise pslite.InvalidInput(
                    f"{what}: parameter {n} ({_describe([n, *sig])}) is on rank {r} but not "
                    f"on rank 0: every rank must build the same model")
        raise pslite.InvalidInput(
            f"{what}: rank 0 and rank {r} list their parameters in different orders: every "
            f"rank must build the same model and optimizer in the same order")


# ------------------------------------------------------------- sparse gradients

def densify(grad):
    """A sparse gradient (nn.Embedding(sparse=True)) as a dense one:
    coalesced (duplicate rows summed), then dense; with its sparse_dim, to
    make it sparse again after the sum (None for a dense gradient)."""
    if grad is None or not grad.is_sparse:
        return grad, None
    return grad.coalesce().to_dense(), grad.sparse_dim()


# ------------------------------------------------------------- DDP

class DistributedDataParallel(torch.nn.Module):
    """`module` made data-parallel as `torch.nn.parallel.DistributedDataParallel`
    makes it: rank 0's parameters and buffers are broadcast at construction
    (after a check that every rank holds the same names, shapes and
    dtypes), and each gradient is pushed from a backward hook as soon as
    autograd has accumulated it and averaged over the workers by the
    servers; the backward pass waits for every average before it returns
    (a callback queued on autograd's engine at the first hook), so
    `loss.backward()` leaves the averages in `p.grad` and a plain
    `optimizer.step()` follows. `no_sync()` accumulates gradients locally
    (the next backward outside it averages the sum). Parameters without a
    gradient on some rank send zeros; one that no rank had a gradient for
    keeps none. `broadcast_buffers=True` also broadcasts the buffers (e.g.
    BatchNorm's running statistics) from rank 0 before each forward."""

    def __init__(self, module, broadcast_buffers=True):
        super().__init__()
        self.module = module
        pt = _pt()
        s = _st()
        self._pslite_state = s
        self._pslite_sync = True
        self._pslite_broadcast_buffers = bool(broadcast_buffers)
        self._pslite_plan = []
        self._pslite_queued = False
        if s.po is None:
            return
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        pt.broadcast_parameters(module.state_dict(), root_rank=0)
        part_bytes = _partition_bytes()
        for n, p in named:
            wire = pt._WIRE.get(p.dtype, p.dtype)  # half precision: summed as float32
            if wire not in pt._APPS:
                raise pslite.InvalidInput(
                    f"parameter {n} is {p.dtype}: DistributedDataParallel averages float32 and "
                    f"float64 gradients (float16 and bfloat16 ones as float32)")
            app, _ = pt._APPS[wire]
            per_part = max(1, part_bytes // wire.itemsize)
            parts = [pt._Part(s.new_key(app, min(per_part, p.numel() - at)), at,
                              min(at + per_part, p.numel()))
                     for at in range(0, p.numel(), per_part)]
            entry = pt._Param(len(self._pslite_plan), n, p, 0, parts, s.workers[wire], wire)
            self._pslite_plan.append(entry)
            p.register_post_accumulate_grad_hook(self._pslite_hook(entry))

    def forward(self, *args, **kwargs):
        if self._pslite_broadcast_buffers and self._pslite_plan and self.training:
            # Every buffer at once (in name order), then wait for them all.
            buffers = sorted(self.module.named_buffers(), key=lambda x: x[0])
            for handle in [broadcast_async_(b.data, 0) for _, b in buffers]:
                synchronize(handle)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the first backward after it
        averages them."""
        before = self._pslite_sync
        self._pslite_sync = False
        try:
            yield
        finally:
            self._pslite_sync = before

    def _pslite_hook(self, entry):
        def hook(p):
            if not self._pslite_sync:
                return
            if not self._pslite_queued:
                self._pslite_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._pslite_finish)
            self._pslite_push(entry)
        return hook

    def _pslite_push(self, entry):
        p = entry.param
        if entry.requests is not None:
            return
        entry.absent = p.grad is None
        if entry.absent:
            p.grad = torch.zeros_like(p)
        else:
            dense, sparse_dim = densify(p.grad)
            entry.passes = sparse_dim or 0
            p.grad = dense if dense.is_contiguous() else dense.contiguous()
        grad = p.grad
        if entry.staged(grad):  # a CUDA or half-precision gradient: through a host buffer
            if entry.host is None:
                entry.host = torch.empty(grad.numel(), dtype=entry.wire,
                                         pin_memory=torch.cuda.is_available())
            entry.host.copy_(grad.reshape(-1))
            flat = entry.host.numpy()
        else:
            flat = grad.detach().reshape(-1).numpy()
        entry.requests = [entry.kv.push_pull(part.keys, flat[part.begin:part.end],
                                             out=flat[part.begin:part.end], cmd=_AVERAGE,
                                             priority=-entry.index)
                          for part in entry.parts]

    def _pslite_finish(self):
        self._pslite_queued = False
        for entry in self._pslite_plan:
            self._pslite_push(entry)
        for entry in self._pslite_plan:
            for req in entry.requests:
                try:
                    req.wait()
                except pslite.RequestRefused as e:
                    # As DistributedOptimizer: a finished worker is named.
                    for other in self._pslite_plan:
                        other.requests, other.passes = None, 0
                    mapped = _torch_join.finished_error(
                        e, f"the gradient of parameter {entry.name}")
                    if mapped is None:
                        raise
                    raise mapped from e
            p = entry.param
            if entry.staged(p.grad):
                p.grad.copy_(entry.host.view_as(p.grad))  # the mean rounded once
            if entry.absent and not p.grad.any():
                p.grad = None
            elif entry.passes:
                p.grad = p.grad.to_sparse(entry.passes)
            entry.requests, entry.passes = None, 0
