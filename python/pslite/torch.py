"""pslite for PyTorch: data-parallel training through parameter servers, as
BytePS users know it, and embedding rows that live on the servers.

    import pslite.torch as pt

    pt.init()                      # on servers and the scheduler: serves, then exits
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    pt.broadcast_parameters(model.state_dict(), root_rank=0)
    pt.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in batches:           # this worker's shard
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # each gradient is pushed as soon as it is ready
        opt.step()                        # waits for the sums, then steps

Run every role from one script: ``pslite launch -s 2 -w 2 -- python train.py``; with
``pslite launch --torch`` the scheduler and servers run natively and only the workers run it.

`DistributedOptimizer` averages (or sums) every parameter's gradient over
the workers through the servers before each step, like
`byteps.torch.DistributedOptimizer`: a backward hook pushes each gradient
as soon as autograd has accumulated it, so communication overlaps the rest
of the backward pass; a gradient larger than the partition size (4 096 000
bytes, `PSLITE_PARTITION_BYTES`) is cut into parts spread over every
server; each request carries its layer's priority (earlier layers higher:
the next forward pass needs them first) and `step()` collects them in that
order. The servers sum each part over a round of every worker
(`pslite.AllReduceHandle`, in Rust; divided by the number of workers in
the same pass) and answer every worker, and the answer is copied into the
gradient's own memory as it arrives, on pslite's thread, while the
backward pass goes on (CPU tensors go without a copy on the sending side). CUDA tensors
go through pinned host buffers (not tested here: this machine has no GPU).
`backward()` returns once every gradient is the average (as with DDP), so
what reads them before `step()` sees the averages: mixed precision's
`GradScaler` (``scaler.scale(loss).backward(); scaler.step(opt);
scaler.update()``), `clip_grad_norm_`. Horovod's form works too:
``opt.synchronize()`` then ``with opt.skip_synchronize(): scaler.step(opt)``.
float16 and bfloat16 gradients are summed as float32 and rounded once on
the way back; `gradient_predivide_factor` divides before the sum and
multiplies after (Horovod's).

Uneven inputs: a worker whose data ends calls `join()` and takes part as
zeros until every worker has joined; a worker that ends without it makes
the ones still pushing fail at once with `pslite.WorkerFinished`, naming
the parameter that waits and the finished rank (docs/TORCH.md).

`broadcast_parameters` and `broadcast_optimizer_state` copy a root rank's
model and optimizer state to every worker, exactly (bytes).

Beside these (python/pslite/_torch_collectives.py, docs/TORCH.md): Horovod's
collectives on any tensor (`allreduce`, `allgather`, `broadcast`,
`barrier`, their async forms with `synchronize`/`poll`), `local_rank()`,
`local_size()`, `cross_rank()`, `cross_size()`, `is_initialized()`,
torchrun's variables in `os.environ` after `init()`, a
`DistributedDataParallel` wrapper, and plain `python train.py` as one
worker of size 1.

Embedding tables on the servers (python/pslite/_torch_embedding.py,
docs/TORCH.md): `EmbeddingBag` and `Embedding` modules whose rows live on the
servers, sharded by key, created on first touch and trained there by a
row-wise optimizer (`SGD`, `RowWiseAdaGrad`, `RowWiseAdam`); `checkpoint()`
saves them on the servers, `load_tables` and `from_export` serve an export
in one process (python/pslite/_torch_serving.py).
`embedding(kv, keys, dim)` is the lower-level autograd function over a
KVWorker of your own (an optimizer in your servers' handle applies the
pushed gradients): see `python/examples/train_ctr.py --torch`.
"""

import atexit
import contextlib
import gc
import io
import os
import sys

import numpy as np
import torch

import pslite

from . import _torch_join as _join
from ._torch_join import join  # noqa: F401  (pslite.torch.join)

#: Apps on every server: float32 and float64 gradients, raw bytes (broadcasts);
#: one layout with the servers' (`pslite.serve_all_reduce`, `pslite torch-server`).
_APPS = {t: (pslite._pslite.ALL_REDUCE_APPS[name], name)
         for t, name in ((torch.float32, "float32"), (torch.float64, "float64"))}
#: Gradients summed as another type: half precision goes as float32 (a sum
#: of float16 values in float16 overflows at 65504 and rounds at every
#: addition; in float32 the mean rounds once, on the way back).
_WIRE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
_RAW_APP = pslite._pslite.ALL_REDUCE_APPS["raw"]
#: The command that asks the servers for the mean instead of the sum.
_AVERAGE = 1
#: BytePS's default partition size.
DEFAULT_PARTITION_BYTES = 4_096_000


class _State:
    def __init__(self, po):
        self.po = po
        self.rank = po.my_rank()
        self.size = po.num_workers
        self.ranges = po.server_key_ranges()
        self.workers = {}
        for dtype, (app, name) in _APPS.items():
            self.workers[dtype] = pslite.KVWorker(po, app_id=app, dtype=name)
        self.raw = pslite.KVWorker(po, app_id=_RAW_APP, dtype="raw")
        # Per app and server: parts handed out so far, and their values.
        servers = len(self.ranges)
        self.parts = {app: [0] * servers for app, _ in _APPS.values()}
        self.values = {app: [0] * servers for app, _ in _APPS.values()}
        self.failed = False
        self.closed = False
        self.colocated = None  # this process's server node (colocated mode)

    def new_key(self, app, values=1):
        """The key of `app`'s next part, of `values` values: on the server
        that holds the fewest of `app`'s values so far (the lowest rank of
        those), so that parts of unequal sizes spread evenly in bytes (by
        count, ResNet-18's busiest of 4 servers carried 1.5x the mean; parts
        of one size still go round the servers in turn)."""
        load = self.values[app]
        j = min(range(len(load)), key=lambda i: (load[i], i))
        load[j] += values
        n = self.parts[app][j]
        self.parts[app][j] = n + 1
        begin, _ = self.ranges[j]
        return begin + n


_state = None


def _colocated():
    """Whether this worker's process also hosts a server node
    (PSLITE_COLOCATE=1, which `pslite launch --colocate` sets)."""
    raw = os.environ.get("PSLITE_COLOCATE", "").strip().lower()
    if raw not in ("", "0", "1", "false", "true", "no", "yes", "off", "on"):
        raise pslite.ConfigError(f"PSLITE_COLOCATE must be 0 or 1, got {raw!r}")
    return raw in ("1", "true", "yes", "on")


def _partition_bytes():
    raw = os.environ.get("PSLITE_PARTITION_BYTES", "").strip()
    if not raw:
        return DEFAULT_PARTITION_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 64:
        raise pslite.ConfigError(
            f"PSLITE_PARTITION_BYTES must be a whole number of bytes, at least 64, got {raw!r}")
    return value


def init(po=None):
    """Joins the job (`pslite launch` sets its DMLC_* variables; or pass a
    Postoffice). On a server it serves the workers' sums (float32 and
    float64 gradients, and broadcasts), on the scheduler it runs the job,
    and both exit the process with code 0 once every node has finalized:
    the code after `init()` runs on workers only. Workers finalize at
    `shutdown()` (called at exit). On a worker it sets torchrun's RANK,
    WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE in os.environ from the job.
    Without DMLC_ROLE (plain `python train.py`) the process is one worker
    of size 1: no servers, every collective the identity."""
    global _state
    if _state is not None:
        return
    if po is None and not os.environ.get("DMLC_ROLE"):
        # Plain `python train.py`: one worker of size 1, as Horovod runs it.
        _state = _coll.single_state()
        _coll.exchange_topology(_state)
        return
    po = po or pslite.Postoffice.from_env()
    colocated = None
    if po.is_worker and _colocated():
        # This process also serves a slice of the keys (`pslite launch
        # --colocate`): its server node starts beside the worker's.
        colocated = pslite._pslite.ColocatedServer.start(dict(os.environ))
    po.start()
    if colocated is not None and colocated.is_finished():
        colocated.join()  # it failed: raise its error
    if po.is_server:
        pslite._pslite.serve_all_reduce(po)
        sys.exit(0)
    if not po.is_worker:
        if os.environ.get("PSLITE_LAUNCH_UNIX_NS"):
            print("pslite.torch: the scheduler and servers ran this script and imported torch; "
                  "`pslite launch --torch` starts them natively, in well under a second",
                  file=sys.stderr, flush=True)
        po.finalize()
        sys.exit(0)
    _state = _State(po)
    _state.colocated = colocated
    _coll.exchange_topology(_state)  # RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
    hook = sys.excepthook

    def failed(*args):
        # An uncaught exception: exit without the final barrier, which the
        # other nodes may never reach (the launcher stops them).
        if _state is not None:
            _state.failed = True
        hook(*args)

    sys.excepthook = failed
    atexit.register(shutdown)


def _st():
    if _state is None:
        raise pslite.NotStarted("call pslite.torch.init() first")
    return _state


def shutdown():
    """Leaves the job (the last barrier with every node); called at exit."""
    s = _state
    if s is None or s.closed:
        return
    s.closed = True
    if s.failed or s.po is None:
        return
    _emb.shutdown(s)  # the embedding gradients still in flight
    _join.announce_finished(s)  # a worker still pushing fails now, naming this rank
    for kv in [*s.workers.values(), s.raw]:
        kv.close()
    s.po.finalize()
    if s.colocated is not None:
        s.colocated.join()  # every node has finalized: it ends now
    # The interpreter's last collection then skips what is alive at exit
    # (torch's objects, mostly): a second less of exit here. Python never
    # promised __del__ for objects alive at exit, so nothing changes.
    gc.freeze()


def rank():
    """This worker's rank, 0 to size() - 1."""
    return _st().rank


def size():
    """The number of workers."""
    return _st().size


def is_initialized():
    """Whether `init()` has run on this worker (and `shutdown()` has not)."""
    return _state is not None and not _state.closed


def _flat_bytes(t):
    """A contiguous CPU tensor's memory as a writable uint8 NumPy array."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _host(t):
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=torch.cuda.is_available())
    host.copy_(t)
    return host


def _broadcast_tensors(tensors, root_rank):
    """Replaces every tensor's contents by root_rank's, exactly: non-root
    workers send zeros, and the servers' byte-wise sum is the root's bytes."""
    s = _st()
    if not 0 <= root_rank < s.size:
        raise pslite.InvalidInput(f"root_rank must be from 0 to {s.size - 1}, got {root_rank}")
    if s.po is None:
        return  # a single process
    part = _partition_bytes()
    servers = len(s.ranges)
    pending = []
    n = 0
    with torch.no_grad():
        for t in tensors:
            host = _host(t.detach()).contiguous()
            data = _flat_bytes(host)
            if s.rank != root_rank:
                data[:] = 0
            for at in range(0, data.size, part):
                begin, _ = s.ranges[n % servers]
                keys = np.array([begin + n // servers], dtype=np.uint64)
                n += 1
                chunk = data[at:at + part]
                pending.append(s.raw.push_pull(keys, chunk, out=chunk))
            pending.append((t, host))
        for item in pending:
            if isinstance(item, tuple):
                t, host = item
                if host.data_ptr() != t.data_ptr():
                    t.copy_(host)
            else:
                item.wait()


def broadcast_parameters(params, root_rank=0):
    """Copies root_rank's parameters and buffers to every worker: `params`
    is a `state_dict()` or `named_parameters()` (same names on every
    worker); tensors go in name order."""
    items = params.items() if isinstance(params, dict) else params
    named = sorted(((name, t) for name, t in items if torch.is_tensor(t)), key=lambda x: x[0])
    _coll.check_same_tensors(_st(), named, "broadcast_parameters")
    _broadcast_tensors([t for _, t in named], root_rank)


def broadcast_object(obj, root_rank=0):
    """root_rank's `obj` (anything `torch.save` takes) on every worker."""
    s = _st()
    if s.rank == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        payload = np.frombuffer(buf.getvalue(), dtype=np.uint8).copy()
    else:
        payload = np.zeros(0, dtype=np.uint8)
    length = torch.tensor([payload.size], dtype=torch.int64)
    _broadcast_tensors([length], root_rank)
    data = torch.zeros(int(length.item()), dtype=torch.uint8)
    if s.rank == root_rank:
        data.copy_(torch.from_numpy(payload))
    _broadcast_tensors([data], root_rank)
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Copies root_rank's optimizer state (its state tensors, step counts
    and hyper-parameters: `state_dict()`) to every worker."""
    state = broadcast_object(optimizer.state_dict() if rank() == root_rank else None, root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


class _Part:
    __slots__ = ("keys", "begin", "end")

    def __init__(self, key, begin, end):
        self.keys = pslite.frozen(np.array([key], dtype=np.uint64))
        self.begin, self.end = begin, end


class _Param:
    """A parameter's place in the plan: its parts, and its gradient in
    flight."""

    __slots__ = ("index", "name", "param", "group", "parts", "kv", "passes", "requests", "host",
                 "absent", "wire")

    def __init__(self, index, name, param, group, parts, kv, wire):
        self.index, self.name, self.param, self.parts, self.kv = index, name, param, parts, kv
        self.group = group  # its param group's index
        self.wire = wire  # the dtype its gradient is summed in
        self.passes = 0
        self.requests = None
        self.host = None
        self.absent = False

    def staged(self, grad):
        """Whether `grad` goes through the host buffer (a CUDA tensor, or a
        half-precision one summed as float32)."""
        return grad.device.type != "cpu" or grad.dtype != self.wire


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 average, momentum_correction, gradient_predivide_factor=1.0):
        super(self.__class__, self).__init__(params)
        self._compression = _compression_of(compression)
        self._pslite_mc = _momentum_correction_of(momentum_correction, self._compression, self)
        self._pslite_mc_compressions = {}
        if backward_passes_per_step < 1:
            raise pslite.InvalidInput("backward_passes_per_step must be at least 1")
        s = _st()
        self._passes = backward_passes_per_step
        self._average = average
        self._pslite_predivide = _predivide_of(gradient_predivide_factor, average, self._pslite_mc)
        # Whether every gradient is this step's sum (synchronize() ran and no
        # backward hook since), whether step() skips synchronize(), and
        # whether a backward pass has its end-of-pass synchronize() queued.
        self._pslite_synced = False
        self._pslite_skip = False
        self._pslite_queued = False
        _join.track(self)
        in_groups = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is None:
            named = [(f"param.{i}", p) for i, p in enumerate(in_groups)]
        else:
            named = list(named_parameters)
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                raise pslite.InvalidInput("named_parameters has a name twice")
            known = {id(p) for _, p in named}
            missing = [i for i, p in enumerate(in_groups) if id(p) not in known]
            if missing:
                raise pslite.InvalidInput(
                    f"{len(missing)} parameters of the optimizer are not in named_parameters")
        ours = {id(p) for p in in_groups}
        group_of = {id(p): i for i, group in enumerate(self.param_groups) for p in group["params"]}
        part_bytes = _partition_bytes()
        self._plan = []
        self._by_param = {}
        self._pslite_sparse = {}  # entry index: sparse_dim of its gradient this round
        if s.po is None:
            self._pslite_mc = False  # a single process: nothing to send or compress
            return
        # Model order: earlier layers first (highest priority).
        for name, p in named:
            if id(p) not in ours or id(p) in self._by_param or not p.requires_grad:
                continue
            wire = _WIRE.get(p.dtype, p.dtype)
            if wire not in _APPS:
                raise pslite.InvalidInput(
                    f"parameter {name} is {p.dtype}: DistributedOptimizer sums float32 and "
                    f"float64 gradients (float16 and bfloat16 ones as float32)")
            app, _ = _APPS[wire]
            per_part = max(1, part_bytes // wire.itemsize)
            parts = [_Part(s.new_key(app, min(per_part, p.numel() - at)), at,
                           min(at + per_part, p.numel()))
                     for at in range(0, p.numel(), per_part)]
            entry = _Param(len(self._plan), name, p, group_of[id(p)], parts, s.workers[wire],
                           wire)
            self._plan.append(entry)
            self._by_param[id(p)] = entry
            p.register_post_accumulate_grad_hook(self._hook_of(entry))
        # Before any push: every rank holds the same parameters (else an
        # error naming the parameter, both shapes and both dtypes).
        _coll.check_same_tensors(s, [(e.name, e.param) for e in self._plan],
                                 "DistributedOptimizer")

    def _hook_of(self, entry):
        def hook(p):
            self._pslite_synced = False
            entry.passes += 1
            if entry.passes == self._passes:
                self._push(entry)
                if not self._pslite_queued:
                    # The gradients are complete when backward() returns
                    # (as with DDP): whatever reads them before step()
                    # (GradScaler.unscale_, clip_grad_norm_) sees the sums.
                    self._pslite_queued = True
                    torch.autograd.Variable._execution_engine.queue_callback(
                        self._pslite_backward_done)
        return hook

    def _pslite_backward_done(self):
        self._pslite_queued = False
        self.synchronize()

    def _push(self, entry):
        p = entry.param
        if entry.requests is not None:
            raise RuntimeError(
                f"the gradient of {entry.name} was computed again before step(): call step() "
                f"(or synchronize()) after each backward_passes_per_step backward passes")
        entry.absent = p.grad is None
        if entry.absent:
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            # nn.Embedding(sparse=True): summed dense, made sparse again after.
            p.grad, self._pslite_sparse[entry.index] = _coll.densify(p.grad)
        elif not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        grad = p.grad
        compression = self._compression or "none"
        group = self.param_groups[entry.group]
        momentum = group.get("momentum", 0) if self._pslite_mc else 0
        if momentum:
            # Momentum correction: the worker's compressor keeps the
            # velocity; weight decay joins the gradient before momentum
            # (as DGC, and as SGD itself adds it), and step() then runs
            # without either.
            wd = group.get("weight_decay", 0)
            if wd and not entry.absent:
                with torch.no_grad():
                    grad.add_(p.detach(), alpha=wd)
            compression = self._momentum_compression(momentum, bool(group.get("nesterov")))
        f = self._pslite_predivide
        if entry.staged(grad):
            if entry.host is None:
                entry.host = torch.empty(grad.numel(), dtype=entry.wire,
                                         pin_memory=torch.cuda.is_available())
            entry.host.copy_(grad.reshape(-1))
            if f != 1:
                entry.host.div_(f)
            flat = entry.host.numpy()
        else:
            if f != 1:
                with torch.no_grad():
                    grad.div_(f)
            flat = grad.detach().reshape(-1).numpy()
        priority = -entry.index
        # cmd 1: the servers answer with the mean (summed and divided in one
        # pass); with a predivide factor they sum, and synchronize() scales.
        cmd = _AVERAGE if self._average and f == 1 else 0
        entry.requests = [
            entry.kv.push_pull(part.keys, flat[part.begin:part.end],
                               out=flat[part.begin:part.end], cmd=cmd, priority=priority,
                               compression=compression)
            for part in entry.parts]

    def synchronize(self):
        """Waits for every gradient's sum (pushing the gradients whose hook
        has not run: parameters without a gradient send zeros, so that every
        worker's round completes; one that no worker had a gradient for
        keeps none), earlier layers first. The end of each backward pass
        that pushed runs it, so it does nothing again until the next
        backward pass (or `step()`, `zero_grad()`)."""
        if self._pslite_synced:
            return
        self._pslite_queued = False
        for entry in self._plan:
            if entry.requests is None:
                self._push(entry)
        post = self._pslite_predivide / size() if self._pslite_predivide != 1 else None
        for entry in self._plan:
            for req in entry.requests:
                try:
                    req.wait()  # its values are in the gradient already
                except pslite.RequestRefused as e:
                    for other in self._plan:
                        other.requests, other.passes = None, 0
                    mapped = _join.finished_error(e, f"the gradient of parameter {entry.name}")
                    if mapped is None:
                        raise
                    raise mapped from e
            grad = entry.param.grad
            staged = entry.staged(grad)
            if post is not None:
                with torch.no_grad():
                    (entry.host if staged else grad).mul_(post)
            if staged:
                grad.copy_(entry.host.view_as(grad))
            if entry.absent and not grad.any():
                # No worker had a gradient: none, as alone (the optimizer
                # skips it rather than stepping on zeros).
                entry.param.grad = None
            elif entry.index in self._pslite_sparse:
                entry.param.grad = grad.to_sparse(self._pslite_sparse.pop(entry.index))
            entry.requests = None
            entry.passes = 0
        self._pslite_synced = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """`step()` inside it does not synchronize: after `synchronize()`,
        as with Horovod (``opt.synchronize(); scaler.unscale_(opt); ...;
        with opt.skip_synchronize(): scaler.step(opt)``). A step whose
        gradients are still being summed is refused."""
        self._pslite_skip = True
        try:
            yield
        finally:
            self._pslite_skip = False

    def _momentum_compression(self, momentum, nesterov):
        key = (float(momentum), nesterov)
        c = self._pslite_mc_compressions.get(key)
        if c is None:
            c = self._compression.with_momentum(float(momentum), nesterov)
            self._pslite_mc_compressions[key] = c
        return c

    @property
    def momentum_correction(self):
        """Whether the workers apply the momentum (momentum correction)."""
        return self._pslite_mc

    def step(self, closure=None):
        if not self._pslite_skip:
            self.synchronize()
        elif not self._pslite_synced and any(
                e.requests is not None or e.passes for e in self._plan):
            raise pslite.InvalidInput(
                "step() inside skip_synchronize() while gradients are not summed yet: call "
                "opt.synchronize() before it")
        self._pslite_synced = False  # the next synchronize() sums again
        if not self._pslite_mc:
            return super(self.__class__, self).step(closure)
        # The averages already carry the momentum and weight decay of the
        # groups that have momentum: step them without (for this call only,
        # so param_groups and state_dict() keep the user's values).
        saved = []
        for group in self.param_groups:
            if group.get("momentum", 0):
                saved.append((group, group["momentum"], group["weight_decay"],
                              group["nesterov"]))
                group["momentum"], group["weight_decay"], group["nesterov"] = 0, 0, False
        try:
            return super(self.__class__, self).step(closure)
        finally:
            for group, momentum, wd, nesterov in saved:
                group["momentum"], group["weight_decay"], group["nesterov"] = (
                    momentum, wd, nesterov)

    # Checkpoints: what each parameter's compressor holds goes in the
    # optimizer's state, in SGD's own place where it has one: momentum
    # correction's velocity as "momentum_buffer" (SGD's buffer is the
    # velocity of the averaged gradient; this worker's velocity is its
    # share, times the worker count when the servers sum instead of
    # averaging), error feedback's residual as "pslite_residual".

    def _velocity_scale(self):
        return 1.0 if self._average else float(size())

    def _mc_applies(self, entry):
        return self._pslite_mc and bool(self.param_groups[entry.group].get("momentum", 0))

    def _held(self, entry):
        """(velocity, residual) of `entry`'s compressors as flat float32
        arrays (zeros where a part has none), each None if no part has one."""
        n = entry.param.numel()
        out = [None, None]
        for part in entry.parts:
            for i, held in enumerate(entry.kv.compression_state(int(part.keys[0]))):
                if held is not None and held.size == part.end - part.begin:
                    if out[i] is None:
                        out[i] = np.zeros(n, dtype=np.float32)
                    out[i][part.begin:part.end] = held
        return out

    def _hold(self, entry, velocity, residual):
        """Gives `entry`'s compressors `velocity` and `residual` (flat
        float32 arrays, or None for none)."""
        for part in entry.parts:
            cut = [None if a is None else a[part.begin:part.end] for a in (velocity, residual)]
            entry.kv.set_compression_state(int(part.keys[0]), *cut)

    def state_dict(self):
        sd = super(self.__class__, self).state_dict()
        if self._compression is None:
            return sd
        saved = [i for group in sd["param_groups"] for i in group["params"]]
        ours = [p for group in self.param_groups for p in group["params"]]
        by_param = {id(p): i for p, i in zip(ours, saved)}
        state = dict(sd["state"])
        for entry in self._plan:
            velocity, residual = self._held(entry)
            if not self._mc_applies(entry):
                velocity = None
            if velocity is None and residual is None:
                continue
            p = entry.param
            held = dict(state.get(by_param[id(p)], {}))  # torch shares the state's dicts
            like = dict(device=p.device, dtype=p.dtype)
            if velocity is not None:
                held["momentum_buffer"] = (
                    torch.from_numpy(velocity * self._velocity_scale()).to(**like).view_as(p))
            if residual is not None:
                held["pslite_residual"] = torch.from_numpy(residual).to(**like).view_as(p)
            state[by_param[id(p)]] = held
        sd["state"] = state
        return sd

    def load_state_dict(self, state_dict):
        saved = [i for group in state_dict["param_groups"] for i in group["params"]]
        ours = [p for group in self.param_groups for p in group["params"]]
        param_of = dict(zip(saved, ours))
        state, held = {}, {}
        for i, values in state_dict["state"].items():
            values = dict(values)
            entry = self._by_param.get(id(param_of.get(i)))
            if entry is not None:
                residual = values.pop("pslite_residual", None)
                velocity = values.pop("momentum_buffer", None) if self._mc_applies(entry) else None
                held[id(entry.param)] = (entry, velocity, residual)
            state[i] = values
        super(self.__class__, self).load_state_dict(dict(state_dict, state=state))

        def flat(t, scale=1.0):
            if t is None:
                return None
            return (t.detach().to("cpu", torch.float32).reshape(-1) / scale).numpy()

        if self._compression is None:
            return
        # Every parameter's compressors hold what the checkpoint says (none
        # where it says nothing).
        for entry in self._plan:
            _, velocity, residual = held.get(id(entry.param), (entry, None, None))
            self._hold(entry, flat(velocity, self._velocity_scale()), flat(residual))

    def zero_grad(self, set_to_none=True):
        if any(e.requests is not None for e in self._plan):
            raise RuntimeError("zero_grad() while gradients are in flight: call step() first")
        self._pslite_synced = False
        return super(self.__class__, self).zero_grad(set_to_none)


class Compression:
    """Horovod's names for DistributedOptimizer's `compression=`
    (``hvd.Compression.fp16``): `none`, `fp16` and `bf16` (each value cast
    to a 16-bit float on the wire both ways: float16/bfloat16 gradients go
    exactly, the servers sum in float32 and their answer is rounded once),
    and pslite's `onebit`. Any other spec string or `pslite.Compression`
    is taken too."""

    none = None
    fp16 = "fp16"
    bf16 = "bf16"
    onebit = "onebit"


def _compression_of(compression):
    """DistributedOptimizer's `compression=`: None (or "none") for none; a
    spec string compresses the pushes and the servers' sums
    (``pslite.Compression(spec, compress_answers=True)``, as BytePS
    compresses both ways); a `pslite.Compression` as it is."""
    if compression is None or isinstance(compression, pslite.Compression):
        return compression
    if isinstance(compression, str):
        if compression.strip().lower() in ("", "none"):
            return None
        return pslite.Compression(compression, compress_answers=True)
    raise pslite.InvalidInput(
        f"compression must be a pslite.Compression, a string such as 'topk:0.01' or None, "
        f"not {type(compression).__name__}")


def _predivide_of(factor, average, momentum_correction):
    """DistributedOptimizer's `gradient_predivide_factor` (Horovod's)."""
    try:
        f = float(factor)
    except (TypeError, ValueError):
        f = 0.0
    if not f > 0 or f == float("inf"):
        raise pslite.InvalidInput(
            f"gradient_predivide_factor must be a number above 0, got {factor!r}")
    if f != 1 and not average:
        raise pslite.InvalidInput(
            "gradient_predivide_factor applies to averaged gradients (average=True): with "
            "average=False the servers' sum is the answer")
    if f != 1 and momentum_correction:
        raise pslite.InvalidInput(
            "gradient_predivide_factor does not go with momentum correction: pass "
            "momentum_correction=False")
    return f


def _momentum_correction_of(setting, compression, optimizer):
    """Whether DistributedOptimizer applies momentum correction: `setting`
    True, False, or None (on where it applies)."""
    if setting is False:
        return False
    if setting not in (None, True):
        raise pslite.InvalidInput(
            f"momentum_correction must be True, False or None, not {setting!r}")
    groups = optimizer.param_groups
    if compression is None:
        why = "gradients are not compressed"
    elif not isinstance(optimizer, torch.optim.SGD):
        why = f"the optimizer is {type(optimizer).__mro__[1].__name__}, not torch.optim.SGD"
    elif not any(g.get("momentum", 0) for g in groups):
        why = "no param group has momentum"
    elif any(g.get("dampening", 0) for g in groups):
        why = "a param group has dampening (momentum correction has none)"
    elif any(g.get("maximize", False) for g in groups):
        why = "a param group maximizes"
    elif setting is None and compression.kind in ("fp16", "bf16"):
        # A cast holds nothing back: the optimizer's own momentum is exact.
        return False
    elif setting is None and compression.kind == "2bit":
        # Measured (docs/BENCHMARKS.md, 2026-11-29): train_digits with
        # 2bit:0.01 at momentum 0.9 reached 0.54 with it and 0.67 without
        # (both below the example's threshold): not on unless asked.
        return False
    else:
        return True
    if setting:
        raise pslite.InvalidInput(f"momentum_correction=True does not apply: {why}")
    return False


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, average=True, momentum_correction=None,
                         gradient_predivide_factor=1.0):
    """`optimizer` made data-parallel: before each `step()`, every
    parameter's gradient is averaged (summed with ``average=False``) over
    the workers through the servers. Gradients are pushed from backward
    hooks as soon as each is ready, cut into parts of at most
    PSLITE_PARTITION_BYTES spread over the servers, earlier layers first.
    `named_parameters` (e.g. ``model.named_parameters()``) names them;
    every worker must build the same model and optimizer in the same order.
    With ``backward_passes_per_step=N`` gradients accumulate over N backward
    passes before they are sent. With `compression` (``"onebit"``,
    ``"topk:0.01"``, ``"randomk:0.01"``, ``"2bit:0.5"``, ``"fp16"``,
    ``"bf16"`` (casts, as Horovod's ``Compression.fp16``: half the bytes,
    no error feedback; also ``pslite.torch.Compression.fp16``), or a
    `pslite.Compression`), gradients go compressed, with error feedback on
    each worker, and a spec string also has the servers compress the
    averaged gradients they answer (every worker gets the same values, so
    the models stay identical).

    Momentum correction (Deep Gradient Compression; BytePS's momentum
    compressor): with a compressor and `torch.optim.SGD` with momentum,
    each worker's compressor applies the momentum (per param group:
    ``momentum``, ``nesterov``; ``weight_decay`` is added to the gradient
    first) and its error feedback accumulates the velocity, so a value held
    back for many steps arrives with its momentum instead of being carried
    on by the optimizer's (DGC's momentum factor masking, clearing the
    velocity where ``topk``/``randomk`` sent a value, is off unless the
    `pslite.Compression` has ``momentum_masking=True``). `step()` then runs
    SGD without momentum and weight decay on the averages, for the step
    only: ``param_groups`` keep the values you gave (a momentum
    scheduler's changes apply from the next push). ``state_dict()`` holds
    what each worker's compressor does, and ``load_state_dict()`` gives it
    back: the velocity as SGD's own ``momentum_buffer`` (so checkpoints
    move between this and a plain SGD), the residual of error feedback as
    ``pslite_residual``. The velocities are each worker's own; a
    checkpoint written by one worker and loaded by all gives each worker
    that one's. The servers' residuals of compressed answers (kept per
    worker on the servers) are not in it. ``momentum_correction=None`` (default) turns it on
    where it applies (a compressor other than ``2bit``, which measured
    worse with it, and the casts ``fp16`` and ``bf16``, which hold nothing back; SGD, some group with momentum, no dampening, not
    maximize), False turns it off (the optimizer's own
    momentum, as before), True insists (an error where it does not apply).
    `opt.momentum_correction` says which.

    When `backward()` returns, every gradient pushed in it is already the
    average (the end of the pass waits for the sums), so `GradScaler`
    (``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``)
    and gradient clipping read the averages. `opt.synchronize()` waits for
    them explicitly and does nothing again until the next backward pass;
    ``with opt.skip_synchronize(): opt.step()`` steps without it
    (Horovod's form). float16 and bfloat16 parameters are accepted: their
    gradients are summed as float32 and rounded once on the way back.
    ``gradient_predivide_factor=f`` (Horovod's) divides each gradient by
    `f` before the sum and the sum by ``size() / f`` after (average=True
    only). The result is an instance of the optimizer's own class (LR
    schedulers take it)."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    dist = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               average, momentum_correction, gradient_predivide_factor)
    dist.load_state_dict(optimizer.state_dict())
    return dist


# ------------------------------------------------------------- embeddings

class _PullPush(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, kv, keys, dim):
        rows = torch.empty((keys.size, dim), dtype=torch.float32)
        kv.pull(keys, out=rows).wait()
        ctx.kv, ctx.keys = kv, keys
        return rows

    @staticmethod
    def backward(ctx, grad):
        g = grad.detach().to(torch.float32).contiguous().reshape(-1)
        ctx.kv.push(ctx.keys, g.numpy()).wait()
        return None, None, None, None


def embedding(kv, keys, dim):
    """The rows of `keys` (integers >= 0, sorted, unique; each key a row of
    `dim` float32 values on the servers) as a `(len(keys), dim)` tensor
    that requires grad; its backward pushes the rows' gradient for the same
    keys, and the servers' request handle applies it (an optimizer there,
    as `train_ctr.py`'s AdaGrad). The backward waits for its push, so the
    next pull sees it applied."""
    keys = pslite.frozen(np.asarray(keys), dtype=np.uint64) if not (
        isinstance(keys, np.ndarray) and keys.dtype == np.uint64) else keys
    anchor = torch.zeros((), requires_grad=True)
    return _PullPush.apply(anchor, kv, keys, int(dim))


# Collectives, topology, the DDP-style wrapper (python/pslite/_torch_collectives.py).
from . import _torch_collectives as _coll  # noqa: E402
from ._torch_collectives import (  # noqa: E402,F401
    Average,
    DistributedDataParallel,
    Handle,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    cross_rank,
    cross_size,
    local_rank,
    local_size,
    poll,
    synchronize,
)

# Embedding tables on the servers (python/pslite/_torch_embedding.py).
from . import _torch_embedding as _emb  # noqa: E402
from ._torch_embedding import (  # noqa: E402,F401
    SGD,
    Embedding,
    EmbeddingBag,
    RowWiseAdaGrad,
    RowWiseAdam,
)
from ._torch_embedding import clock as embedding_clock  # noqa: E402,F401
from ._torch_embedding import stats as embedding_stats  # noqa: E402,F401
from ._torch_serving import ExportedTable, checkpoint, load_tables  # noqa: E402,F401
