//! The one error of pslite: the Postoffice, the store and the apps (the
//! `pslite` crate re-exports it as `pslite::Error`) all return [`Error`].
//!
//! Its variants are flat, one per thing to fix: configuration and start-up,
//! the transport (the Van's errors, flattened by `From<VanError>`), the
//! store, the apps' arguments, and remote failures with their typed
//! [`Failure`] inside. Python raises one exception class per variant.

use pslite_proto::store::OverLimit;
use pslite_proto::NodeId;
use pslite_van::{identity_hint, Failure, StartTimeout, VanError};

use crate::store::StoreLimit;
use crate::ConfigError;

/// An error of pslite. Every variant says what failed and, where there is
/// one, what to change.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The environment does not describe a usable node.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// This node cannot listen where it is configured to (port in use,
    /// address not of this machine).
    #[error(
        "cannot listen on {endpoint} ({reason}): {var} {value} is taken or the host is not an \
         address of this machine; choose a free port, or set PS_BIND_HOST (e.g. 0.0.0.0) to \
         bind another address"
    )]
    Listen {
        /// The endpoint tried.
        endpoint: String,
        /// ZeroMQ's reason.
        reason: String,
        /// The variable that chose the port.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The host to bind does not resolve.
    #[error(
        "cannot bind: host {host:?} does not resolve; set PS_BIND_HOST to an IP of this machine"
    )]
    BindHost {
        /// The host.
        host: String,
    },
    /// The transport could not be set up or used (ZeroMQ, a thread, a
    /// socket); the message names what failed and what to do.
    #[error("{0}")]
    Transport(String),
    /// Used before `start`.
    #[error("the postoffice has not started: call start() first")]
    NotStarted,
    /// Data sent before this node joined the cluster.
    #[error("this node has not joined the cluster yet: call start() before sending")]
    NotJoined,
    /// The cluster did not form before the start deadline (`PS_START_TIMEOUT`).
    #[error("{0}")]
    StartTimeout(Box<StartTimeout>),
    /// A barrier was not released before its deadline.
    #[error(
        "barrier over group {group} was not released within {secs} s{}",
        identity_hint(.identity_conflicts)
    )]
    BarrierTimeout {
        /// The barrier's group.
        group: i32,
        /// How long we waited.
        secs: u64,
        /// Identities heard from before they were assigned (a possible
        /// identity conflict).
        identity_conflicts: Vec<NodeId>,
    },
    /// A barrier names a group this node is not part of, or no group at all.
    #[error(
        "barrier group {0} is invalid here: use a sum of 1 (scheduler), 2 (servers), 4 (workers) \
         that includes this node's role"
    )]
    InvalidGroup(i32),
    /// A message names a receiver that is not in the node table.
    #[error("cannot send to node {0}: it is not in the node table")]
    UnknownPeer(NodeId),
    /// The customer is registered already.
    #[error("app {app_id} customer {customer_id} is already registered in this process")]
    DuplicateCustomer {
        /// Its app id.
        app_id: i32,
        /// Its customer id.
        customer_id: i32,
    },
    /// The scheduler is C++ ps-lite (or an older pslite), which hosts no
    /// key-value store.
    #[error(
        "store: the key-value store needs a pslite scheduler; this cluster's scheduler is C++ \
         ps-lite (or an older pslite), which has none"
    )]
    StoreUnsupported,
    /// A store request got no answer in time: the scheduler is overloaded,
    /// unreachable or gone.
    #[error(
        "store: the scheduler did not answer a store request within {secs:.1} s: is it still \
         running?"
    )]
    StoreNoAnswer {
        /// How long we waited.
        secs: f64,
    },
    /// The store's keys did not exist before the deadline.
    #[error("store: {} not set within {secs:.1} s", quoted(keys))]
    StoreTimeout {
        /// The keys still missing.
        keys: Vec<String>,
        /// How long the call waited.
        secs: f64,
    },
    /// A store request went over a bound of the store: a value, key, the
    /// store's bytes or keys, this node's waiting requests or watches. The
    /// message names the bound and the scheduler's variable that raises it
    /// (`PS_STORE_MAX_VALUE`, ...).
    #[error("store: {}", OverLimit { which: *which, size: *size as u64, limit: *limit as u64 })]
    TooLarge {
        /// The bound.
        which: StoreLimit,
        /// What the request asked for: bytes, or a count.
        size: usize,
        /// The bound's value.
        limit: usize,
    },
    /// The scheduler refused a store request.
    #[error("store: the scheduler refused the request: {0}")]
    StoreRefused(String),
    /// Keys must be ascending.
    #[error("keys must be sorted in ascending order: key at index {index} is smaller than the one before")]
    UnsortedKeys {
        /// The first out-of-order position.
        index: usize,
    },
    /// Keys must be unique.
    #[error("key {key} appears twice: keys must be unique")]
    DuplicateKey {
        /// The repeated key.
        key: u64,
    },
    /// `lens` needs one entry per key.
    #[error("{lens} lens for {keys} keys: give exactly one length per key")]
    LensMismatch {
        /// Number of keys.
        keys: usize,
        /// Number of lens.
        lens: usize,
    },
    /// The values do not match the keys (or lens).
    #[error("{vals} values do not fit the keys: expected {expected}")]
    ValsMismatch {
        /// Number of values given.
        vals: usize,
        /// What was expected.
        expected: String,
    },
    /// Some other unusable argument.
    #[error("{0}")]
    InvalidInput(String),
    /// A peer sent something that cannot be read; the message was dropped.
    #[error("malformed message from node {sender}: {what}")]
    Malformed {
        /// The sender.
        sender: NodeId,
        /// What is wrong.
        what: String,
    },
    /// A request's wait passed its deadline.
    #[error("request {ts} did not complete within {secs:.1} s")]
    Timeout {
        /// The request's timestamp.
        ts: i32,
        /// The deadline.
        secs: f64,
    },
    /// No such request.
    #[error("this customer sent no request with timestamp {0}")]
    UnknownTimestamp(i32),
    /// The node or a barrier failed remotely, or the node stopped.
    #[error("{0}")]
    Failed(Failure),
    /// A request could not complete.
    #[error("request {ts} failed: {cause}")]
    RequestFailed {
        /// The request's timestamp.
        ts: i32,
        /// Why, as a typed cause (peer dead, not acknowledged, handler
        /// panicked, node failed...).
        cause: Failure,
    },
    /// A failure of the user's program itself, for programs that return
    /// `pslite::Error` (e.g. "checks failed").
    #[error("{0}")]
    App(String),
    /// pslite broke one of its own rules: a bug, never the user's input.
    #[error("internal error: {0}; this is a bug in pslite, please report it")]
    Internal(String),
}

impl From<VanError> for Error {
    /// The Van's error, flattened: its variant becomes this one's.
    fn from(e: VanError) -> Error {
        match e {
            VanError::Bind { .. }
            | VanError::Resolve { .. }
            | VanError::Zmq { .. }
            | VanError::Setup { .. } => Error::Transport(e.to_string()),
            VanError::UnknownPeer(id) => Error::UnknownPeer(id),
            VanError::NotReady => Error::NotJoined,
            VanError::StartTimeout(t) => Error::StartTimeout(t),
            VanError::BarrierTimeout {
                group,
                secs,
                identity_conflicts,
            } => Error::BarrierTimeout {
                group,
                secs,
                identity_conflicts,
            },
            VanError::InvalidGroup(group) => Error::InvalidGroup(group),
            VanError::StoreUnsupported => Error::StoreUnsupported,
            VanError::StoreNoAnswer { secs } => Error::StoreNoAnswer { secs },
            VanError::Failed(f) => Error::Failed(f),
            VanError::Internal(what) => Error::Internal(what),
        }
    }
}

impl Error {
    /// Whether this is a configuration error (exit code 2).
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Config(_))
    }

    /// The typed cause of a failed request, barrier or node, if this is one.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::Failed(f) | Error::RequestFailed { cause: f, .. } => Some(f),
            _ => None,
        }
    }
}

/// `key "a"`, or `keys "a", "b"`.
fn quoted(keys: &[String]) -> String {
    let list: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
    match list.len() {
        1 => format!("key {}", list[0]),
        _ => format!("keys {}", list.join(", ")),
    }
}
