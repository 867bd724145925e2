"""pslite's exceptions: every failure raised by pslite is a `pslite.Error`.

The class says what happened, the message (the Rust error's, unchanged) says
what to do. A remote failure (a request, a barrier or the node itself) is
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


class InvalidInput(Error, ValueError):
    """An argument pslite cannot use: unsorted or repeated keys, values that
    do not fit the keys or lens, an unknown timestamp, an invalid group."""


class Timeout(Error, TimeoutError):
    """A wait passed its deadline: a request, a barrier, the cluster's start
    (PS_START_TIMEOUT), a store call."""


class NotStarted(Error, RuntimeError):
    """Used before Postoffice.start() (or before the node joined)."""


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


class TooLarge(StoreError):
    """A store request went over a bound of the store; the message names the
    scheduler's variable that raises it (PS_STORE_MAX_VALUE, ...)."""


class Refused(StoreError):
    """The scheduler refused a store request."""


class StoreUnsupported(StoreError):
    """The scheduler is C++ ps-lite, which hosts no key-value store."""


__all__ = [
    "Error",
    "ConfigError",
    "InvalidInput",
    "Timeout",
    "NotStarted",
    "Failure",
    "SchedulerLost",
    "NotAcknowledged",
    "PeerDead",
    "PeerRestarted",
    "Stopped",
    "HandlerPanicked",
    "ReceiveThreadDied",
    "SendFailed",
    "BadResponse",
    "AuthRefused",
    "RendezvousFailed",
    "LeftRound",
    "Replaced",
    "AppDropped",
    "RangeLost",
    "JobStopped",
    "CheckpointFailed",
    "RequestRefused",
    "DtypeMismatch",
    "LengthMismatch",
    "UnknownApp",
    "WorkerFinished",
    "StoreError",
    "TooLarge",
    "Refused",
    "StoreUnsupported",
]
