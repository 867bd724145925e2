"""pslite's exceptions: every failure raised by pslite is a `pslite.Error`.

Each variant of the Rust `pslite::Error` has its own class (one to one), a
subclass of the broader class it belongs to (`BarrierTimeout` of `Timeout`,
`DuplicateKey` of `InvalidInput`, `StoreTimeout` of both `StoreError` and
`Timeout`, ...). The class says what happened, the message (the Rust
error's, unchanged) says what to do. A remote failure (a request, a barrier or the node itself) is
raised as the class named after its kind, a subclass of `Failure`:
`PeerDead`, `SchedulerLost`, `HandlerPanicked`, ... Exceptions that name a
node carry it in `node`, request failures their timestamp in `timestamp`
(both None otherwise).
"""


class Error(Exception):
    """Any error of pslite."""

    node = None
    timestamp = None


class ConfigError(Error, ValueError):
    """The DMLC_* / PS_* environment does not describe a usable node (the
    message names the variable to fix)."""


class CannotListen(Error):
    """This node cannot listen on its port (taken, or the host is not of this
    machine): choose a free port, or set PS_BIND_HOST."""


class UnresolvedHost(Error):
    """The host to bind does not resolve: set PS_BIND_HOST to an IP of this
    machine."""


class TransportError(Error):
    """ZeroMQ, a thread or a socket of the transport failed (the message
    names what)."""


class InternalError(Error):
    """pslite broke one of its own rules: a bug, never the program's input
    (please report it with the message)."""


class UnknownPeer(Error):
    """A message names a node that is not in the node table."""


class Malformed(Error):
    """A peer sent something that cannot be read; the message was dropped."""


class AppError(Error):
    """A failure of the program itself (`pslite::Error::App`)."""


class InvalidInput(Error, ValueError):
    """An argument pslite cannot use; the subclasses name which."""


class UnsortedKeys(InvalidInput):
    """Keys must be sorted in ascending order."""


class DuplicateKey(InvalidInput):
    """A key appears twice: keys must be unique."""


class LensMismatch(InvalidInput):
    """`lens` needs exactly one length per key."""


class ValsMismatch(InvalidInput):
    """The values do not fit the keys (or lens)."""


class UnknownTimestamp(InvalidInput):
    """This app sent no request with that timestamp."""


class InvalidGroup(InvalidInput):
    """A barrier group this node is not part of (or no group at all)."""


class DuplicateCustomer(InvalidInput):
    """An app with this app and customer id exists already in this process."""


class Timeout(Error, TimeoutError):
    """A wait passed its deadline: raised as such for a request; the
    subclasses are the other waits."""


class StartTimeout(Timeout):
    """The cluster did not form within PS_START_TIMEOUT (the message names
    who is missing and what to check)."""


class BarrierTimeout(Timeout):
    """A barrier was not released before its deadline."""


class NotStarted(Error, RuntimeError):
    """Used before Postoffice.start()."""


class NotJoined(NotStarted):
    """Used before the node joined the cluster (start() has not finished)."""


class Failure(Error):
    """A remote failure: a request, a barrier or the node failed."""


class SchedulerLost(Failure):
    """Nothing was heard from the scheduler for longer than the heartbeat
    timeout, or its connection closed and it accepts no new one."""


class NotAcknowledged(Failure):
    """A message was never acknowledged, even after every resend (PS_RESEND)."""


class PeerDead(Failure):
    """A node died and no replacement took its id in time (PS_RECOVERY_TIMEOUT)."""


class PeerRestarted(Failure):
    """A node restarted before answering; without PS_RESEND its unanswered
    requests are lost."""


class Stopped(Failure):
    """This node was stopped (finalized)."""


class HandlerPanicked(Failure):
    """A request handle or callback failed (a Rust panic or a Python
    exception); the request failed, the node goes on."""


class ReceiveThreadDied(Failure):
    """The thread that receives messages ended."""


class SendFailed(Failure):
    """A message could not be put on the wire."""


class BadResponse(Failure):
    """A response could not be used (e.g. keys that do not match the request)."""


class AuthRefused(Failure):
    """The scheduler refused this node's PS_AUTH_TOKEN (or the token setup
    does not match)."""


class RendezvousFailed(Failure):
    """Elastic mode: the workers stayed fewer than the minimum for longer
    than PS_RDZV_TIMEOUT."""


class LeftRound(Failure):
    """Elastic mode: the scheduler started a round without this worker."""


class Replaced(Failure):
    """This node was taken for dead while it was stopped or cut off, and
    another process took its place: it must not come back."""


class AppDropped(Failure):
    """The app that sent the request was closed before it completed."""


class RangeLost(Failure):
    """Replicated key ranges (PS_REPLICAS): every replica of the request's
    key range died."""


class JobStopped(Failure):
    """The scheduler stopped the job and told every node why (a checkpoint
    it refused at start, a key range with no replica left)."""


class CheckpointFailed(Failure):
    """Checkpoints (PS_CHECKPOINT_DIR): a checkpoint was refused or failed,
    or a server could not restore one (the message names the file)."""


class RequestRefused(Failure):
    """A node could not take the request and said why (nothing of it was
    applied there): the message names the app and what to change."""


class DtypeMismatch(RequestRefused, TypeError):
    """The request's values are of another dtype than the server's app
    (the message names both): use a KVWorker of the server's dtype."""


class LengthMismatch(RequestRefused, ValueError):
    """The request sent a key another number of values than the server
    holds for it (the message names the key and both numbers)."""


class UnknownApp(RequestRefused, LookupError):
    """The node has no such app (or customer): nothing created it within
    PS_APP_WAIT."""


class WorkerFinished(RequestRefused):
    """A worker ended (its script finished) while this one still had rounds
    that need it: `pslite.torch` names the parameter that waits and the
    finished worker's rank (`rank`). Workers with fewer batches call
    `pslite.torch.join()` instead of ending."""

    rank = None


class StoreError(Error):
    """A store call failed."""


class StoreTimeout(StoreError, Timeout):
    """The store's keys were not set before the call's deadline."""


class StoreNoAnswer(StoreError, Timeout):
    """The scheduler did not answer a store request in time: is it running?"""


class TooLarge(StoreError):
    """A store request went over a bound of the store; the message names the
    scheduler's variable that raises it (PS_STORE_MAX_VALUE, ...)."""


class Refused(StoreError):
    """The scheduler refused a store request."""


class StoreUnsupported(StoreError):
    """The scheduler is C++ ps-lite, which hosts no key-value store."""


__all__ = [
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
