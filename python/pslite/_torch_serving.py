"""Checkpoints of a pslite.torch job's embedding tables, and serving them in
one process (re-exported from pslite.torch; docs/TORCH.md, "Checkpoints" and
"Serving the tables").

    pt.checkpoint("epoch 3")    # on every worker, at the same point of training

    $ pslite checkpoint export $PS_CHECKPOINT_DIR --out served/

    tables = pt.load_tables("served/")                    # {name: ExportedTable}
    user = pt.EmbeddingBag.from_export("served/", "user", mode="sum")
    pooled = user(ids, offsets)                           # no pslite job needed

`checkpoint()` saves what the servers hold (every table's rows with the
optimizer's state) in the job's PS_CHECKPOINT_DIR; a job started again with
that directory restores it before serving. The export writes per table the
ids (int64, ascending) and rows (float32) as NumPy files, and tables.json
with the table's settings. Dense weights are not on the servers: save and
load them with torch.save / torch.load (`model.state_dict()`).

A lookup of an id the export does not hold answers, by default, the row the
servers would have made for it on first touch (the table's initializer,
from its seed and the id: what the trained module's forward gives for it,
and what a TorchRec table's never-trained row is); ``unknown="zeros"``
answers zeros instead (a default embedding, as systems with feature
admission serve unadmitted ids, and the default for a table with
`admit_after`, as its servers answer), ``unknown="error"`` refuses. A table
with `expire_after` exports its live rows only (an expired row reads as one
that does not exist).
"""

import json
import os

import numpy as np
import torch

import pslite

from . import _torch_embedding as _emb

_UNKNOWN = ("init", "zeros", "error")


def _pt():
    from . import torch as pt
    return pt


def checkpoint(label="pslite.torch.checkpoint", timeout=600.0):
    """Saves the servers' state (every embedding table's rows and optimizer
    state) in the job's PS_CHECKPOINT_DIR, as a collective: every worker
    calls it at the same point of training. It first waits for this
    worker's pushed gradients and prefetches; the checkpoint is taken at a
    barrier of the workers, so every gradient pushed before the call is in
    it and none after. Returns, on every worker, a dict with the
    checkpoint's "id", "dir", "files", "bytes" and "elapsed_ms"; raises
    pslite.CheckpointFailed on every worker if the scheduler refused it (no
    PS_CHECKPOINT_DIR) or it failed. `pslite checkpoint` from a shell joins
    the next one taken here. Dense weights are not on the servers: save
    them with torch.save."""
    pt = _pt()
    s = pt._st()
    if s.po is None:
        raise pslite.InvalidInput(
            "pslite.torch.checkpoint() saves what the servers hold: run the script under "
            "`pslite launch` with PS_CHECKPOINT_DIR (this process runs alone)")
    _emb.settle(s)
    said = None
    try:
        said = ("ok", s.po.checkpoint(str(label), s.rank == 0, float(timeout)))
    except pslite.CheckpointFailed as e:
        said = ("failed", str(e))
    except pslite.Timeout as e:
        if s.rank != 0:
            raise
        said = ("failed", f"{e} (no checkpoint at this barrier: a worker had requests in "
                          "flight; synchronize asynchronous collectives before it)")
    said = pt.broadcast_object(said if s.rank == 0 else None, root_rank=0)
    if said[0] != "ok":
        raise pslite.CheckpointFailed(said[1])
    return said[1]


class ExportedTable:
    """One table of an export (`pslite checkpoint export`): `ids` (int64,
    ascending), `rows` (float32, one per id), and its settings (`name`,
    `table`, `embedding_dim`, `init`, `seed`, `optimizer`). `lookup(ids)`
    answers rows without a job."""

    def __init__(self, entry, ids, rows):
        self.name = entry["name"]
        self.table = int(entry["table"])
        self.embedding_dim = int(entry["dim"])
        self.init = tuple(entry["init"]) if len(entry["init"]) > 1 else entry["init"][0]
        self.seed = int(entry["seed"])
        self.optimizer = _optimizer(entry["optimizer"])
        self.ids = ids
        self.rows = rows
        self.expire_after = int(entry.get("expire_after", 0))
        self.admit_after = int(entry.get("admit_after", 0))
        self._words = _emb.config_words(self.table, self.embedding_dim, self.optimizer,
                                        self.init, self.seed, self.name, self.expire_after,
                                        self.admit_after)

    def __len__(self):
        return self.ids.size

    def __repr__(self):
        return (f"ExportedTable({self.name!r}, rows={self.ids.size}, dim={self.embedding_dim}, "
                f"init={self.init!r}, seed={self.seed})")

    def lookup(self, ids, unknown=None):
        """The rows of `ids` (any shape, int64): an array of ids.shape +
        (embedding_dim,) float32. Ids not in the export: see the module's
        doc (`unknown` "init", "zeros" or "error"; None: what the servers
        answer, "zeros" for a table with admission, else "init")."""
        if unknown is None:
            unknown = "zeros" if self.admit_after > 1 else "init"
        if unknown not in _UNKNOWN:
            raise pslite.InvalidInput(f"unknown must be one of {_UNKNOWN}, got {unknown!r}")
        flat = np.asarray(ids)
        if flat.dtype not in (np.int64, np.int32):
            raise pslite.InvalidInput(f"ids must be int64 (or int32), got {flat.dtype}")
        shape = flat.shape
        flat = flat.reshape(-1).astype(np.int64)
        at = np.searchsorted(self.ids, flat)
        held = at < self.ids.size
        held[held] = self.ids[at[held]] == flat[held]
        out = np.zeros((flat.size, self.embedding_dim), dtype=np.float32)
        out[held] = self.rows[at[held]]
        missing = ~held
        if missing.any():
            if unknown == "error":
                raise pslite.InvalidInput(
                    f"table {self.name!r}: ids not in the export: "
                    f"{flat[missing][:8].tolist()} ({int(missing.sum())} in all)")
            if unknown == "init":
                keys = _emb.key_of(self.table, flat[missing])
                made = pslite._pslite.embedding_initial_rows(self._words.tolist(),
                                                             keys.tolist())
                out[missing] = np.asarray(made, dtype=np.float32).reshape(-1, self.embedding_dim)
        return out.reshape(*shape, self.embedding_dim)


def _optimizer(o):
    if o["kind"] == "SGD":
        return _emb.SGD(o["lr"])
    if o["kind"] == "RowWiseAdaGrad":
        return _emb.RowWiseAdaGrad(o["lr"], o["eps"], o["initial_accumulator"])
    return _emb.RowWiseAdam(o["lr"], tuple(o["betas"]), o["eps"])


def load_tables(path):
    """The tables an export (`pslite checkpoint export ... --out PATH`)
    holds: a dict of name to `ExportedTable`. Raises pslite.InvalidInput
    naming the file if the export is missing, incomplete or damaged."""
    listing = os.path.join(os.fspath(path), "tables.json")
    try:
        with open(listing, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise pslite.InvalidInput(
            f"{listing} does not exist: PATH must be the --out directory of "
            "`pslite checkpoint export`") from None
    except (OSError, ValueError) as e:
        raise pslite.InvalidInput(f"cannot read {listing}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != "pslite-tables" \
            or doc.get("version") != 1:
        raise pslite.InvalidInput(f"{listing} is not a pslite-tables export of version 1")
    tables = {}
    try:
        for entry in doc["tables"]:
            ids = _load(path, entry["ids"], np.int64, (entry["rows"],))
            rows = _load(path, entry["values"], np.float32, (entry["rows"], entry["dim"]))
            if ids.size > 1 and not (ids[1:] > ids[:-1]).all():
                raise pslite.InvalidInput(f"{entry['ids']} of {path}: ids not ascending")
            tables[entry["name"]] = ExportedTable(entry, ids, rows)
    except (KeyError, TypeError, IndexError) as e:
        raise pslite.InvalidInput(f"{listing} lacks or mangles a table's field: {e!r}") from None
    return tables


def _load(path, name, dtype, shape):
    full = os.path.join(os.fspath(path), os.path.basename(name))
    try:
        a = np.load(full, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise pslite.InvalidInput(f"cannot load {full}: {e}") from None
    if a.dtype != dtype or a.shape != tuple(shape):
        raise pslite.InvalidInput(f"{full} holds {a.dtype} {a.shape}, tables.json says "
                                  f"{np.dtype(dtype)} {tuple(shape)} (damaged or mixed up)")
    return a


def _table_of(path, name):
    tables = load_tables(path)
    if name is None and len(tables) == 1:
        return next(iter(tables.values()))
    if name not in tables:
        raise pslite.InvalidInput(f"{path} holds tables {sorted(tables)}, not {name!r}")
    return tables[name]


class _Lookups:
    """A batch answered from an ExportedTable: where each id's row is."""

    __slots__ = ("index", "rows")

    def __init__(self, table, ids, unknown):
        flat = ids.reshape(-1).to("cpu", torch.int64)
        unique, self.index = torch.unique(flat, sorted=True, return_inverse=True)
        self.rows = torch.from_numpy(table.lookup(unique.numpy(), unknown))


class _Served:
    """What the served EmbeddingBag and Embedding change: lookups answered
    from the export, never a request to servers, nothing pushed."""

    def _serve(self, table, unknown):
        if unknown is not None and unknown not in _UNKNOWN:
            raise pslite.InvalidInput(f"unknown must be one of {_UNKNOWN}, got {unknown!r}")
        self.exported = table
        self.unknown = unknown

    def _ready(self):
        return None

    def _batch(self, ids):
        _emb._check_ids(ids)
        return _Lookups(self.exported, ids, self.unknown)

    def _weight(self, batch):
        return batch.rows

    def prefetch(self, ids):
        _emb._check_ids(ids)


class ServedEmbeddingBag(_Served, _emb.EmbeddingBag):
    """`EmbeddingBag.from_export`: an EmbeddingBag answered from an export
    in this process (same forward; no gradient, no job)."""

    def __init__(self, table, mode="sum", unknown=None, include_last_offset=False):
        _emb.EmbeddingBag.__init__(self, table.embedding_dim, mode=mode,
                                   optimizer=table.optimizer, init=table.init, name=table.name,
                                   seed=table.seed, include_last_offset=include_last_offset)
        self._serve(table, unknown)


class ServedEmbedding(_Served, _emb.Embedding):
    """`Embedding.from_export`: an Embedding answered from an export in
    this process (same forward; no gradient, no job)."""

    def __init__(self, table, unknown=None):
        _emb.Embedding.__init__(self, table.embedding_dim, optimizer=table.optimizer,
                                init=table.init, name=table.name, seed=table.seed)
        self._serve(table, unknown)


def embedding_bag_from_export(path, name=None, *, mode="sum", unknown=None,
                              include_last_offset=False):
    return ServedEmbeddingBag(_table_of(path, name), mode, unknown, include_last_offset)


def embedding_from_export(path, name=None, *, unknown=None):
    return ServedEmbedding(_table_of(path, name), unknown)
