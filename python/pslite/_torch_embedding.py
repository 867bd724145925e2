"""Embedding tables on the servers: `pslite.torch.EmbeddingBag` and
`pslite.torch.Embedding` (re-exported from pslite.torch; docs/TORCH.md,
"Embedding tables").

    import pslite.torch as pt

    pt.init()
    user = pt.EmbeddingBag(64, mode="sum", optimizer=pt.RowWiseAdaGrad(lr=0.05),
                           init=("uniform", -0.05, 0.05), name="user")
    pooled = user(ids, offsets)          # (bags, 64), requires grad
    loss.backward()                      # pushes the rows' gradients

A table's rows live on the servers of a `pslite launch` job (`pslite torch-server`, or
the script's server roles after `pt.init()`), sharded by key: id `i` of the table
named `n` is key `mix(i ^ mix(table_id(n) ^ GOLDEN))` (MurmurHash3's finalizer,
a bijection of 64 bits), so any int64 id (negative ones as their bits) is a row of
its own and rows spread evenly over the servers' key ranges. A row is created on
first touch with the table's initializer, from the table's seed and the key only
(every replica and rerun makes the same row). The servers apply each pushed
gradient with the table's row-wise optimizer (`SGD`, `RowWiseAdaGrad`,
`RowWiseAdam`); no torch optimizer sees these rows (they are not Parameters).

A forward pulls each distinct id of the batch once (torch.unique), pools on
the worker with torch's own `embedding_bag`/`embedding` over the pulled rows,
and its backward pushes one gradient per distinct id (duplicates summed by
autograd) without waiting: the next forward's pull goes after it on the same
connection, so it reads the rows updated; the push is waited for there (its
errors raised) and at `flush()` and shutdown. `prefetch(ids)` starts the pull
of a batch ahead (its rows are as the servers hold them when it is called: a
push sent later is not in them, one step of staleness).

Per table, `expire_after=N` drops rows no push touched for N steps (a step:
one push from each worker, counted per key range of the servers) and
`admit_after=K` gives an id a row at the K-th push that carries it (zeros
before, gradients dropped): docs/TORCH.md, "Row expiry and feature
admission". Per module, `cache_rows=R, cache_staleness=S` keeps pulled rows
on the worker for S forwards (each the servers' row as its pull found it):
"A cache of hot rows".

The servers learn a table's settings when the module is first used (or at
creation after `pt.init()`): the same settings from every worker are
accepted, other ones refused with `pslite.RequestRefused` naming the table.
"""

import itertools
import math
import weakref

import numpy as np
import torch
import torch.nn.functional as F

import pslite

_CMDS = pslite._pslite.EMBEDDING_CMDS
_EMBEDDING = _CMDS["embedding"]
_CONFIG = _CMDS["config"]
_TABLE_MASK = _CMDS["table_mask"]
_STATS_WORDS = _CMDS["stats_words"]
#: The tables are served on the float32 app, beside the all-reduce, on a
#: customer of their own on the workers.
_APP = pslite._pslite.ALL_REDUCE_APPS["float32"]
_CUSTOMER = 1
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_U33 = np.uint64(33)
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_MAX_NAME = 256
_MAX_EXPIRE_AFTER = 1 << 30
_MAX_ADMIT_AFTER = 1 << 16
#: Names of modules created without one, in creation order.
_unnamed = itertools.count()


def _mix_int(x):
    """MurmurHash3's 64-bit finalizer of a Python int (`embedding::mix`)."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M64
    return x ^ (x >> 33)


def _mix(x):
    """`_mix_int` over a uint64 array (wrapping)."""
    x = x ^ (x >> _U33)
    x = x * _C1
    x = x ^ (x >> _U33)
    x = x * _C2
    return x ^ (x >> _U33)


def table_id(name):
    """The id of the table named `name` (`embedding::table_id`)."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & _M64
    return max(_mix_int(h) & _TABLE_MASK, 1)


def key_of(table, ids):
    """The keys of `ids` (int64 or uint64 array) in table `table`."""
    salt = np.uint64(_mix_int(table ^ _GOLDEN))
    return _mix(np.ascontiguousarray(ids).view(np.uint64) ^ salt)


def _f32_bits(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def _finite(what, x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        v = float("nan")
    if not math.isfinite(v):
        raise pslite.InvalidInput(f"{what} must be a finite number, got {x!r}")
    return v


class SGD:
    """Server-side SGD: ``w -= lr * g``. No state."""

    def __init__(self, lr):
        self.lr = _finite("SGD's lr", lr)

    def _words(self):
        return [0, _f32_bits(self.lr), 0, 0, 0, 0]

    def __repr__(self):
        return f"SGD(lr={self.lr})"


class RowWiseAdaGrad:
    """Row-wise AdaGrad (FBGEMM's and TorchRec's ROWWISE_ADAGRAD): one
    accumulator per row, ``G += mean(g**2)``, ``w -= lr / (sqrt(G) + eps) * g``.
    One float32 of state a row."""

    def __init__(self, lr=0.01, eps=1e-8, initial_accumulator=0.0):
        self.lr = _finite("RowWiseAdaGrad's lr", lr)
        self.eps = _finite("RowWiseAdaGrad's eps", eps)
        self.initial_accumulator = _finite("RowWiseAdaGrad's initial_accumulator",
                                           initial_accumulator)
        if self.eps < 0 or self.initial_accumulator < 0:
            raise pslite.InvalidInput("RowWiseAdaGrad's eps and initial_accumulator must be >= 0")

    def _words(self):
        return [1, _f32_bits(self.lr), _f32_bits(self.eps), 0, 0,
                _f32_bits(self.initial_accumulator)]

    def __repr__(self):
        return (f"RowWiseAdaGrad(lr={self.lr}, eps={self.eps}, "
                f"initial_accumulator={self.initial_accumulator})")


class RowWiseAdam:
    """Row-wise Adam (FBGEMM's PARTIAL_ROWWISE_ADAM): a first moment per
    value, a second moment (of ``mean(g**2)``) and a step count per row:
    ``t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) mean(g**2);
    w -= lr / ((1 - b1**t) (sqrt(v / (1 - b2**t)) + eps)) * m``.
    ``dim + 2`` words of state a row."""

    def __init__(self, lr=0.001, betas=(0.9, 0.999), eps=1e-8):
        self.lr = _finite("RowWiseAdam's lr", lr)
        self.eps = _finite("RowWiseAdam's eps", eps)
        try:
            b1, b2 = betas
        except (TypeError, ValueError):
            raise pslite.InvalidInput(f"RowWiseAdam's betas must be a pair, got {betas!r}")
        self.betas = (_finite("RowWiseAdam's beta1", b1), _finite("RowWiseAdam's beta2", b2))
        if not all(0 <= b < 1 for b in self.betas):
            raise pslite.InvalidInput(f"RowWiseAdam's betas must be in [0, 1), got {betas!r}")

    def _words(self):
        b1, b2 = self.betas
        return [2, _f32_bits(self.lr), _f32_bits(self.eps), _f32_bits(b1), _f32_bits(b2), 0]

    def __repr__(self):
        return f"RowWiseAdam(lr={self.lr}, betas={self.betas}, eps={self.eps})"


def _init_words(init):
    """The initializer's words (kind, a, b): "zeros", ("uniform", a, b),
    ("normal", std)."""
    spec = (init,) if isinstance(init, str) else tuple(init) if isinstance(
        init, (tuple, list)) else None
    if spec and spec[0] == "zeros" and len(spec) == 1:
        return [0, 0, 0]
    if spec and spec[0] == "uniform" and len(spec) == 3:
        a = _finite("uniform's low", spec[1])
        b = _finite("uniform's high", spec[2])
        if a > b:
            raise pslite.InvalidInput(f"init {init!r}: low above high")
        return [1, _f32_bits(a), _f32_bits(b)]
    if spec and spec[0] == "normal" and len(spec) == 2:
        std = _finite("normal's std", spec[1])
        if std < 0:
            raise pslite.InvalidInput(f"init {init!r}: std must be >= 0")
        return [2, _f32_bits(std), 0]
    raise pslite.InvalidInput(
        f"init must be \"zeros\", (\"uniform\", low, high) or (\"normal\", std), got {init!r}")


def config_words(table, dim, optimizer, init, seed, name, expire_after=0, admit_after=0):
    """A table's configuration record, version 2 (`embedding/config.rs`)."""
    opt = optimizer._words()
    name_bytes = name.encode()
    padded = name_bytes + b"\0" * (-len(name_bytes) % 4)
    return np.array([2, table, dim, opt[0], *opt[1:], *_init_words(init), seed & 0xFFFFFFFF,
                     seed >> 32, expire_after, admit_after, len(name_bytes),
                     *np.frombuffer(padded, dtype="<u4").tolist()], dtype=np.uint32)


def _pt():
    from . import torch as pt
    return pt


def _kv(s):
    """This worker's KVWorker of the tables (one per job)."""
    kv = getattr(s, "embedding_kv", None)
    if kv is None:
        kv = pslite.KVWorker(s.po, app_id=_APP, customer_id=_CUSTOMER, dtype="float32")
        s.embedding_kv = kv
        s.embedding_modules = weakref.WeakSet()  # those used on this job
    return kv


def clock():
    """Ends this worker's training step for the embedding tables and
    returns the new step count. With `PS_STALENESS=s` (bounded staleness,
    SSP) a pull of rows at step `c` is answered once every live worker's
    pushes of steps up to `c - s - 1` are applied (`s = 0`: every worker
    sees every other's pushes of the steps before; unset: asynchronous,
    and this only counts). Call it once a step, after the backward (its
    pushes are sent then); the dense parameters' DistributedOptimizer
    stays synchronous."""
    return _kv(_state()).clock()


def _state():
    s = _pt()._st()  # NotStarted before pslite.torch.init()
    if s.po is None:
        raise pslite.InvalidInput(
            "pslite.torch's embedding tables live on servers: run the script under "
            "`pslite launch` (this process runs alone, with no server)")
    return s


def _range_keys(s):
    return np.array(sorted(b for b, _ in s.ranges), dtype=np.uint64)


def shutdown(s):
    """Waits for the pushes still in flight and closes the tables' worker
    (at `pslite.torch.shutdown()`)."""
    kv = getattr(s, "embedding_kv", None)
    if kv is None:
        return
    for module in list(s.embedding_modules):
        module._drain()
    kv.close()


def settle(s):
    """Waits until no request of the tables is in flight: every pushed
    gradient applied, every prefetch answered (kept for its forward)."""
    for module in list(getattr(s, "embedding_modules", ())):
        module._drain()
        for batch in module._prefetched:
            batch.wait()


def stats():
    """Each server's tables as it counts them: a list (one per key range,
    answered by its primary) of dicts with "tables", "rows", "store_bytes"
    (the slab and index allocated), "rss_bytes" (the server process's
    resident bytes), "row_bytes" (``rows * dim * 4``), and for tables with
    expiry or admission "rows_expired", "rows_admitted" (since the server
    started), "candidates" (ids counted, not admitted yet) and
    "gradients_dropped" (row gradients of ids not admitted yet)."""
    s = _state()
    kv = _kv(s)
    keys = _range_keys(s)
    out = np.zeros(len(keys) * _STATS_WORDS, dtype=np.float32)
    kv.pull(keys, cmd=_EMBEDDING | _CONFIG, out=out).wait()
    words = out.view(np.uint32).astype(np.uint64).reshape(len(keys), _STATS_WORDS)
    names = ("rows", "store_bytes", "rss_bytes", "row_bytes", "rows_expired", "rows_admitted",
             "candidates", "gradients_dropped")
    return [dict(tables=int(w[0]), **{n: int(w[1 + 2 * i]) | (int(w[2 + 2 * i]) << 32)
                                       for i, n in enumerate(names)}) for w in words]


class _Batch:
    """One forward's distinct ids: their keys in order, where each id's
    row is, and the pull of the rows (of those not in the module's cache)."""

    __slots__ = ("ids", "keys", "index", "rows", "request", "cache", "step", "missed",
                 "pulled")

    def __init__(self, module, ids, step):
        flat = ids.reshape(-1).to("cpu", torch.int64)
        unique, inverse = torch.unique(flat, sorted=True, return_inverse=True)
        keys = key_of(module.table, unique.numpy())
        order = np.argsort(keys, kind="stable")
        position = np.empty_like(order)
        position[order] = np.arange(order.size)
        self.ids = ids
        self.keys = pslite.frozen(keys[order])
        self.index = torch.from_numpy(position)[inverse]
        self.rows = torch.empty((order.size, module.embedding_dim), dtype=torch.float32)
        self.request = None
        self.cache, self.step, self.missed = module._cache, step, None
        want, out = self.keys, self.rows.numpy()
        if self.cache is not None and order.size:
            self.missed = self.cache.fill(self.keys, out, step)
            want = pslite.frozen(self.keys[self.missed])
            self.pulled = np.empty((want.size, module.embedding_dim), dtype=np.float32)
            out = self.pulled
        if want.size:
            module.pull_requests += 1
            module.rows_pulled += int(want.size)
            self.request = module._kv.pull(want, cmd=module._cmd, out=out)

    def wait(self):
        if self.request is not None:
            self.request.wait()
            self.request = None
            if self.missed is not None:
                self.rows.numpy()[self.missed] = self.pulled
                self.cache.store(self.keys[self.missed], self.pulled, self.step)
                self.missed = self.pulled = None
        return self.rows


class _Cache:
    """A worker's copies of rows it pulled (`cache_rows`, `cache_staleness`:
    docs/TORCH.md, "A cache of hot rows"): each the servers' row as the pull
    found it, used by the forwards up to `staleness` after the one that
    pulled it, then pulled again; the oldest pulls make room."""

    def __init__(self, rows, staleness, dim):
        self.staleness = staleness
        self.values = np.empty((rows, dim), dtype=np.float32)
        self.pulled_at = np.empty(rows, dtype=np.int64)
        self.slots = {}  # key -> slot, oldest pull first
        self.free = list(range(rows - 1, -1, -1))

    def fill(self, keys, out, step):
        """Copies the fresh enough rows of `keys` into `out`; the positions
        of the others (to pull)."""
        missed = []
        slots = self.slots
        for j, k in enumerate(keys.tolist()):
            slot = slots.get(k)
            if slot is not None and step - self.pulled_at[slot] <= self.staleness:
                out[j] = self.values[slot]
            else:
                missed.append(j)
        return np.array(missed, dtype=np.int64)

    def store(self, keys, rows, step):
        slots = self.slots
        for k, row in zip(keys.tolist(), rows):
            slot = slots.pop(k, None)
            if slot is None:
                if not self.free:
                    self.free.append(slots.pop(next(iter(slots))))
                slot = self.free.pop()
            slots[k] = slot
            self.values[slot] = row
            self.pulled_at[slot] = step


class _Rows(torch.autograd.Function):
    """The pulled rows as a tensor that requires grad; the backward pushes
    their gradient (one row per distinct id) without waiting."""

    @staticmethod
    def forward(ctx, anchor, module, batch):
        ctx.module, ctx.keys = module, batch.keys
        return batch.wait()

    @staticmethod
    def backward(ctx, grad):
        ctx.module._push(ctx.keys, grad)
        return None, None, None


def _check_ids(ids, what="ids"):
    if not torch.is_tensor(ids):
        raise pslite.InvalidInput(f"{what} must be a torch.Tensor of int64, not "
                                  f"{type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise pslite.InvalidInput(f"{what} must be int64 (or int32), got {ids.dtype}")


class _Table(torch.nn.Module):
    """What EmbeddingBag and Embedding share: the table's settings, its
    configuration on the servers, pulls, prefetches and pushes."""

    _KIND = "table"

    def __init__(self, embedding_dim, optimizer=None, init=("uniform", -0.05, 0.05),
                 name=None, seed=0, expire_after=0, admit_after=0, cache_rows=0,
                 cache_staleness=0):
        super().__init__()
        for what, v, most in (("expire_after", expire_after, _MAX_EXPIRE_AFTER),
                              ("admit_after", admit_after, _MAX_ADMIT_AFTER),
                              ("cache_rows", cache_rows, 1 << 31),
                              ("cache_staleness", cache_staleness, 1 << 31)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= most:
                raise pslite.InvalidInput(f"{what} must be an int from 0 to {most}, got {v!r}")
        if cache_staleness and not cache_rows:
            raise pslite.InvalidInput(
                f"cache_staleness={cache_staleness} needs cache_rows (how many rows the worker "
                "keeps) above 0")
        if not isinstance(embedding_dim, int) or not 1 <= embedding_dim <= 1 << 16:
            raise pslite.InvalidInput(
                f"embedding_dim must be an int from 1 to 65536, got {embedding_dim!r}")
        optimizer = RowWiseAdaGrad() if optimizer is None else optimizer
        if not isinstance(optimizer, (SGD, RowWiseAdaGrad, RowWiseAdam)):
            raise pslite.InvalidInput(
                "optimizer must be pslite.torch.SGD, RowWiseAdaGrad or RowWiseAdam, not "
                f"{type(optimizer).__name__}")
        if name is None:
            name = f"{self._KIND}.{next(_unnamed)}"
        if not isinstance(name, str) or not 0 < len(name.encode()) <= _MAX_NAME:
            raise pslite.InvalidInput(f"name must be a str of 1 to {_MAX_NAME} bytes, "
                                      f"got {name!r}")
        if not isinstance(seed, int) or not 0 <= seed <= _M64:
            raise pslite.InvalidInput(f"seed must be an int from 0 to 2**64 - 1, got {seed!r}")
        self.embedding_dim = embedding_dim
        self.optimizer = optimizer
        self.init = init
        self.name = name
        self.seed = seed
        self.expire_after = expire_after
        self.admit_after = admit_after if admit_after > 1 else 0
        self.cache_rows, self.cache_staleness = cache_rows, cache_staleness
        self._cache = (_Cache(cache_rows, cache_staleness, embedding_dim) if cache_staleness
                       else None)  # staleness 0: every forward pulls, as without a cache
        #: Forwards so far (the cache's clock), pull requests sent and rows
        #: asked for in them (rows found in the cache are not pulled).
        self.forwards = 0
        self.pull_requests = 0
        self.rows_pulled = 0
        self.table = table_id(name)
        self._cmd = _EMBEDDING | self.table
        self._words = config_words(self.table, embedding_dim, optimizer, init, seed, name,
                                   expire_after, self.admit_after)
        self._state = None
        self._prefetched = []
        self._pending = []
        if _pt().is_initialized() and _pt()._st().po is not None:
            self._ready()

    def extra_repr(self):
        extra = "".join(f", {k}={getattr(self, k)}" for k in (
            "expire_after", "admit_after", "cache_rows", "cache_staleness") if getattr(self, k))
        return (f"{self.embedding_dim}, name={self.name!r}, optimizer={self.optimizer!r}, "
                f"init={self.init!r}, seed={self.seed}{extra}")

    def _ready(self):
        """Sends the table's settings to the servers once; the worker."""
        s = _state()
        if self._state is not s:
            kv = _kv(s)
            keys = _range_keys(s)
            vals = np.tile(self._words.view(np.float32), len(keys))
            kv.push(keys, vals, cmd=_EMBEDDING | _CONFIG | self.table).wait()
            self._state = s
            s.embedding_modules.add(self)
        return s.embedding_kv

    @property
    def _kv(self):
        return self._ready()

    def _push(self, keys, grad):
        g = grad.detach().to("cpu", torch.float32).contiguous()
        req = self._kv.push(keys, g.reshape(-1).numpy(), cmd=self._cmd)
        # Sent without a copy: the gradient is kept until the push completes.
        self._pending.append((req, g))

    def _drain(self):
        pending, self._pending = self._pending, []
        for req, _ in pending:
            req.wait()

    def flush(self):
        """Waits until every gradient this module pushed is applied."""
        self._drain()

    def prefetch(self, ids):
        """Starts pulling the rows of `ids` (a later forward with equal ids
        uses them). The rows are as the servers hold them now."""
        _check_ids(ids)
        self._ready()
        self._prefetched.append(_Batch(self, ids, self.forwards + 1 + len(self._prefetched)))
        while len(self._prefetched) > 8:
            self._prefetched.pop(0).wait()

    def _batch(self, ids):
        _check_ids(ids)
        self._ready()
        self.forwards += 1
        for i, b in enumerate(self._prefetched):
            if b.ids.shape == ids.shape and torch.equal(b.ids.to(ids.device), ids):
                del self._prefetched[:i + 1]
                self._drain()
                return b
        batch = _Batch(self, ids, self.forwards)
        self._drain()  # sent before the pull: applied before it is read
        return batch

    def _weight(self, batch):
        anchor = torch.zeros((), requires_grad=torch.is_grad_enabled())
        return _Rows.apply(anchor, self, batch)


class EmbeddingBag(_Table):
    """`torch.nn.EmbeddingBag` whose table lives on the servers (see the
    module's doc): ``forward(input, offsets=None, per_sample_weights=None)``
    with a 1-D `input` and `offsets`, or a 2-D `input` of bags; returns
    (bags, embedding_dim) float32 requiring grad. ``mode`` "sum" or "mean";
    ``per_sample_weights`` with "sum"."""

    _KIND = "embedding_bag"

    def __init__(self, embedding_dim, *, mode="sum", optimizer=None,
                 init=("uniform", -0.05, 0.05), name=None, seed=0, include_last_offset=False,
                 expire_after=0, admit_after=0, cache_rows=0, cache_staleness=0):
        if mode not in ("sum", "mean"):
            raise pslite.InvalidInput(f"mode must be \"sum\" or \"mean\", got {mode!r}")
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)
        super().__init__(embedding_dim, optimizer, init, name, seed, expire_after, admit_after,
                         cache_rows, cache_staleness)

    @classmethod
    def from_export(cls, path, name=None, *, mode="sum", unknown=None,
                    include_last_offset=False):
        """An EmbeddingBag answered in this process from table `name` (may
        be left out if it is the only one) of an export (`pslite checkpoint
        export ... --out PATH`): no job, no gradient. Ids not in the export
        get the table's initial row (`unknown="init"`; the default unless the
        table has admission), zeros ("zeros"), or
        are refused ("error"); see pslite.torch.load_tables."""
        from ._torch_serving import embedding_bag_from_export
        return embedding_bag_from_export(path, name, mode=mode, unknown=unknown,
                                         include_last_offset=include_last_offset)

    def forward(self, input, offsets=None, per_sample_weights=None):
        _check_ids(input, "input")
        if input.dim() == 2:
            if offsets is not None:
                raise pslite.InvalidInput("offsets must be None with a 2-D input (bags of "
                                          "equal length)")
        elif input.dim() == 1:
            if offsets is None:
                raise pslite.InvalidInput("a 1-D input needs offsets (where each bag starts)")
            _check_ids(offsets, "offsets")
            if offsets.dim() != 1:
                raise pslite.InvalidInput(f"offsets must be 1-D, got shape {tuple(offsets.shape)}")
            o = offsets.to("cpu", torch.int64)
            if o.numel() and (int(o[0]) != 0 or bool((o[1:] < o[:-1]).any())
                              or int(o[-1]) > input.numel()):
                raise pslite.InvalidInput(
                    f"offsets must start at 0 and never decrease, up to len(input) = "
                    f"{input.numel()}, got {o.tolist()[:16]}")
        else:
            raise pslite.InvalidInput(f"input must be 1-D (with offsets) or 2-D, got shape "
                                      f"{tuple(input.shape)}")
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise pslite.InvalidInput("per_sample_weights go with mode=\"sum\" only")
            if per_sample_weights.shape != input.shape:
                raise pslite.InvalidInput(
                    f"per_sample_weights must have input's shape {tuple(input.shape)}, got "
                    f"{tuple(per_sample_weights.shape)}")
            per_sample_weights = per_sample_weights.to("cpu", torch.float32)
        batch = self._batch(input)
        weight = self._weight(batch)
        index = batch.index.view(input.shape)
        out = F.embedding_bag(index, weight, None if offsets is None else offsets.to(
            "cpu", torch.int64), mode=self.mode, per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset)
        return out.to(input.device)


class Embedding(_Table):
    """`torch.nn.Embedding` whose table lives on the servers (see the
    module's doc): ``forward(ids)`` of any shape gives ids.shape +
    (embedding_dim,), float32 requiring grad."""

    _KIND = "embedding"

    def __init__(self, embedding_dim, *, optimizer=None, init=("uniform", -0.05, 0.05),
                 name=None, seed=0, expire_after=0, admit_after=0, cache_rows=0,
                 cache_staleness=0):
        super().__init__(embedding_dim, optimizer, init, name, seed, expire_after, admit_after,
                         cache_rows, cache_staleness)

    @classmethod
    def from_export(cls, path, name=None, *, unknown=None):
        """An Embedding answered in this process from an export (see
        EmbeddingBag.from_export)."""
        from ._torch_serving import embedding_from_export
        return embedding_from_export(path, name, unknown=unknown)

    def forward(self, ids):
        batch = self._batch(ids)
        weight = self._weight(batch)
        return F.embedding(batch.index.view(ids.shape), weight).to(ids.device)
