"""pslite for Python: a parameter-server runtime wire-compatible with C++ ps-lite.

The API of the Rust crate with Python names, over NumPy arrays::

    import numpy as np
    import pslite

    po = pslite.Postoffice.from_env()       # DMLC_* variables: pslite launch sets them
    po.start()
    if po.is_server:
        server = pslite.KVServer(po)
        server.set_request_handle(pslite.DefaultHandle())   # sums pushes, in Rust
    elif po.is_worker:
        kv = pslite.KVWorker(po)
        keys = np.array([1, 3, 5], dtype=np.uint64)
        kv.push(keys, np.array([1.0, 2.0, 3.0], dtype=np.float32)).wait()
        print(kv.pull(keys).take().vals)
    po.finalize()

Run it as a cluster with ``pslite launch -s 2 -w 2 -- python my_app.py``.

Requests are `pslite.Request` objects (`wait()`, `take()`, `done`), which
also stand for their timestamp where ps-lite code expects one
(`kv.wait(kv.push(...))`, `kv.take_pull(ts)`, `int(req)`).
Arrays of the right dtype are sent without a copy (do not change one until
its request completes) and pulled values are read-only arrays over the
received buffers. Every call that waits releases the GIL and answers
Ctrl-C. Errors are `pslite.Error` subclasses named after their kind
(`pslite.errors`).
"""

from . import errors
from ._pslite import (
    ALL_GROUP,
    DTYPES,
    SCHEDULER_GROUP,
    SERVER_GROUP,
    WORKER_GROUP,
    AllReduceHandle,
    ArrayView,
    Compression,
    DefaultHandle,
    KVMeta,
    KVPairs,
    KVServer,
    KVWorker,
    Membership,
    Postoffice,
    Request,
    SimpleApp,
    SimpleData,
    Store,
    StoreEvent,
    Watch,
    frozen,
    misaligned_copies,
)
from .errors import (  # noqa: F401
    Error, ConfigError, CannotListen, UnresolvedHost, TransportError, InternalError, UnknownPeer,
    Malformed,
    AppError, InvalidInput, UnsortedKeys, DuplicateKey, LensMismatch, ValsMismatch,
    UnknownTimestamp, InvalidGroup, DuplicateCustomer, Timeout, StartTimeout, BarrierTimeout,
    NotStarted, NotJoined, Failure, SchedulerLost, NotAcknowledged, PeerDead, PeerRestarted,
    Stopped, HandlerPanicked, ReceiveThreadDied, SendFailed, BadResponse, AuthRefused,
    RendezvousFailed, LeftRound, Replaced, AppDropped, RangeLost, JobStopped, CheckpointFailed,
    RequestRefused, DtypeMismatch, LengthMismatch, UnknownApp, WorkerFinished, StoreError,
    StoreTimeout, StoreNoAnswer, TooLarge, Refused, StoreUnsupported,
)

__all__ = [
    "ALL_GROUP", "DTYPES", "SCHEDULER_GROUP", "SERVER_GROUP", "WORKER_GROUP",
    "AllReduceHandle", "ArrayView", "Compression", "DefaultHandle", "KVMeta", "KVPairs", "KVServer",
    "KVWorker",
    "Membership", "Postoffice", "Request", "SimpleApp", "SimpleData", "Store", "StoreEvent",
    "Watch", "errors", "frozen", "misaligned_copies",
    "Error", "ConfigError", "CannotListen", "UnresolvedHost", "TransportError", "InternalError",
    "UnknownPeer",
    "Malformed", "AppError", "InvalidInput", "UnsortedKeys", "DuplicateKey", "LensMismatch",
    "ValsMismatch", "UnknownTimestamp", "InvalidGroup", "DuplicateCustomer", "Timeout",
    "StartTimeout", "BarrierTimeout", "NotStarted", "NotJoined", "Failure", "SchedulerLost",
    "NotAcknowledged", "PeerDead", "PeerRestarted", "Stopped", "HandlerPanicked",
    "ReceiveThreadDied", "SendFailed", "BadResponse", "AuthRefused", "RendezvousFailed",
    "LeftRound", "Replaced", "AppDropped", "RangeLost", "JobStopped", "CheckpointFailed",
    "RequestRefused", "DtypeMismatch", "LengthMismatch", "UnknownApp", "WorkerFinished",
    "StoreError", "StoreTimeout", "StoreNoAnswer", "TooLarge", "Refused", "StoreUnsupported",
]
