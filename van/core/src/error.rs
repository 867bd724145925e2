//! What can go wrong in the transport and the control plane.
//!
//! [`Failure`] is why something remote failed (a node, a request, a
//! barrier): each cause is a variant, so callers match on it instead of
//! reading strings. [`VanError`] is what a call of the Van returns.

use std::fmt;
use std::time::Duration;

use pslite_proto::NodeId;

/// Why a node, a request or a barrier failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// Nothing was heard from the scheduler for longer than the heartbeat
    /// timeout and the recovery timeout together.
    #[error(
        "lost the scheduler at {address}: nothing heard from it for {silent_secs} s \
         (PS_HEARTBEAT_TIMEOUT is {timeout_secs} s, then PS_RECOVERY_TIMEOUT {recovery_secs} s \
         of calling it again)"
    )]
    SchedulerLost {
        /// Where the scheduler was.
        address: String,
        /// How long it was silent.
        silent_secs: u64,
        /// The heartbeat timeout.
        timeout_secs: u64,
        /// The recovery timeout it was given more.
        recovery_secs: u64,
    },
    /// The connection to the scheduler closed and it accepts no new one:
    /// its process is gone.
    #[error(
        "lost the scheduler at {address}: its connection closed and it accepts no new one \
         (the scheduler's process is gone)"
    )]
    SchedulerClosed {
        /// Where the scheduler was.
        address: String,
    },
    /// The scheduler took this node for dead while it was stopped or cut
    /// off, and gave its id to another process: this one must stop.
    #[error(
        "this node ({id}) was taken for dead while it was stopped or cut off, and {by} took \
         its place: it must not come back (raise PS_HEARTBEAT_TIMEOUT if it was only slow)"
    )]
    Replaced {
        /// This node's id.
        id: NodeId,
        /// The process that replaced it.
        by: String,
    },
    /// A message was never acknowledged, even after every resend
    /// (`PS_RESEND=1`).
    #[error("node {peer} did not acknowledge {what} after {tries} resends (PS_RESEND)")]
    NotAcknowledged {
        /// The receiver.
        peer: NodeId,
        /// Resends tried.
        tries: u32,
        /// The message, described for logs.
        what: String,
    },
    /// A node died and no replacement took its id in time.
    #[error("node {id} is dead and no replacement arrived within {secs} s (PS_RECOVERY_TIMEOUT)")]
    PeerDead {
        /// The dead node.
        id: NodeId,
        /// The recovery deadline.
        secs: u64,
    },
    /// A node restarted and took its old id, but without `PS_RESEND` the
    /// requests it had not answered cannot be sent again: they fail.
    #[error(
        "node {id} restarted before answering; without PS_RESEND=1 its unanswered requests are lost"
    )]
    PeerRestarted {
        /// The restarted node.
        id: NodeId,
    },
    /// This node was stopped (finalized or dropped).
    #[error("the node has stopped")]
    Stopped,
    /// A request handler or callback panicked; the request failed, the node
    /// goes on.
    #[error("a request handler on node {node} panicked: {message}")]
    HandlerPanicked {
        /// The node whose handler panicked.
        node: NodeId,
        /// The panic's message.
        message: String,
    },
    /// The thread that receives messages ended.
    #[error("the receive thread ended: {reason}")]
    ReceiveThreadDied {
        /// Why.
        reason: String,
    },
    /// A message could not be put on the wire.
    #[error("cannot send to node {peer}: {reason}")]
    SendFailed {
        /// The receiver.
        peer: NodeId,
        /// What ZeroMQ or the Van said.
        reason: String,
    },
    /// A connection this node needs could not be opened: the process ran
    /// out of file descriptors or ZeroMQ sockets (or the machine of
    /// memory). The node stops; the message names the limit to raise.
    #[error("cannot open a connection to {peer}: {detail}")]
    Resources {
        /// The peer, as named in logs (`node 9 at 127.0.0.1:4100`).
        peer: String,
        /// What ran out and which limit to raise.
        detail: String,
    },
    /// A response could not be used (e.g. keys that do not match the request).
    #[error("a bad response from node {sender}: {what}")]
    BadResponse {
        /// Who sent it.
        sender: NodeId,
        /// What is wrong.
        what: String,
    },
    /// The scheduler refused this node's `PS_AUTH_TOKEN`, or the node has
    /// one and the scheduler does not authenticate.
    #[error("{detail}")]
    AuthRefused {
        /// What was refused and what to set.
        detail: String,
    },
    /// Elastic mode: the workers stayed fewer than MIN for longer than
    /// `PS_RDZV_TIMEOUT`; the job cannot go on.
    #[error(
        "elastic rendezvous failed: {have} worker(s) for {waited_secs} s, fewer than the \
         minimum {min} (DMLC_NUM_WORKER=MIN:MAX); start more workers or raise PS_RDZV_TIMEOUT"
    )]
    RendezvousFailed {
        /// Workers the round had.
        have: usize,
        /// Workers it needed.
        min: usize,
        /// How long it waited, in seconds.
        waited_secs: u64,
    },
    /// Elastic mode: the scheduler started a round without this worker (it
    /// was taken for dead, or it left).
    #[error(
        "worker {id} is not in elastic round {round}: the scheduler took it for dead or it left \
         (raise PS_HEARTBEAT_TIMEOUT if it was only slow)"
    )]
    LeftRound {
        /// This worker.
        id: NodeId,
        /// The round that began without it.
        round: u64,
    },
    /// The app that sent the request was dropped before it completed.
    #[error("the app was dropped")]
    AppDropped,
    /// Replicated key ranges: every replica of the range died (more than
    /// `PS_REPLICAS - 1` at once, or before a copy was made); its keys are
    /// gone.
    #[error(
        "key range {range} has no replica left: its servers died before a copy was made \
         (raise PS_REPLICAS, or restore from a checkpoint)"
    )]
    RangeLost {
        /// The range (its server rank).
        range: u32,
    },
    /// The scheduler stopped the job and told every node why (a checkpoint
    /// it refused at start, a key range with no replica left): nothing can
    /// go on, so nothing waits.
    #[error("the scheduler stopped the job: {reason}")]
    JobStopped {
        /// Why, as the scheduler said it.
        reason: String,
    },
    /// Checkpoints (`PS_CHECKPOINT_DIR`): a checkpoint request was refused
    /// or failed, or a server could not restore one (the message names the
    /// file and what is wrong with it).
    #[error("{detail}")]
    Checkpoint {
        /// What failed and why.
        detail: String,
    },
    /// A node could not take the request and answered with why (values of
    /// another type than its app's, value lengths its app cannot take, no
    /// such app); nothing of the request was applied there.
    #[error("node {node} refused the request: {refusal}")]
    Refused {
        /// The node that refused it.
        node: NodeId,
        /// Why.
        refusal: pslite_proto::refusal::Refusal,
    },
}

/// The cluster did not form before the start deadline (`PS_START_TIMEOUT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartTimeout {
    /// How long this node waited.
    pub waited: Duration,
    /// Servers that never registered (known on the scheduler only).
    pub missing_servers: Option<i32>,
    /// Workers that never registered (known on the scheduler only).
    pub missing_workers: Option<i32>,
    /// `DMLC_NUM_SERVER`.
    pub num_servers: i32,
    /// `DMLC_NUM_WORKER`.
    pub num_workers: i32,
    /// The scheduler's address.
    pub scheduler: String,
    /// The address this node advertises (the scheduler must reach it).
    pub advertised: String,
    /// Identities that connected twice while forming (ZeroMQ refuses a
    /// second connection with an identity in use): a possible conflict.
    pub identity_conflicts: Vec<NodeId>,
    /// On the scheduler: registrations refused because nothing at the
    /// address they name completed a handshake (the latest few).
    pub refused_registrations: Box<[String]>,
}

impl fmt::Display for StartTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.waited.as_secs();
        match (self.missing_servers, self.missing_workers) {
            (Some(servers), Some(workers)) => write!(
                f,
                "the cluster did not form within {secs} s (PS_START_TIMEOUT): {servers} of {} \
                 servers and {workers} of {} workers never registered with the scheduler",
                self.num_servers, self.num_workers
            )?,
            _ => write!(
                f,
                "no node table from the scheduler at {} within {secs} s (PS_START_TIMEOUT): \
                 either it is unreachable (check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT), or \
                 it cannot reach this node at the address it advertises, {} (check \
                 DMLC_NODE_HOST, DMLC_INTERFACE and firewalls), or some of the {} servers \
                 and {} workers never started",
                self.scheduler, self.advertised, self.num_servers, self.num_workers
            )?,
        }
        f.write_str(&identity_hint(&self.identity_conflicts))?;
        if !self.refused_registrations.is_empty() {
            write!(
                f,
                "; refused registrations: {} (forged, or nodes the scheduler cannot reach at \
                 the address they advertise)",
                self.refused_registrations.join("; ")
            )?;
        }
        Ok(())
    }
}

/// The hint added to a timeout when identities were heard from before they
/// were assigned (empty if none were).
pub fn identity_hint(ids: &[NodeId]) -> String {
    if ids.is_empty() {
        return String::new();
    }
    let ids: Vec<String> = ids.iter().map(|id| format!("ps{id}")).collect();
    format!(
        "; messages came from identities {} before they were assigned: another process may \
         hold the same identity, and ZeroMQ refuses a second connection with it (a possible \
         identity conflict)",
        ids.join(", ")
    )
}

/// The transport's own error behind a [`VanError`] (ZeroMQ's, with the
/// Van): shared, so errors stay cheap to clone.
pub type Cause = std::sync::Arc<dyn std::error::Error + Send + Sync>;

/// An error of the Van. Every variant says what failed and, where there is
/// one, what to change.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VanError {
    /// The ROUTER socket could not bind (port in use, address not local...).
    #[error("cannot bind {endpoint}: {source}")]
    Bind {
        /// The endpoint we tried.
        endpoint: String,
        /// ZeroMQ's reason.
        source: Cause,
    },
    /// A host name does not resolve to an address.
    #[error("host {host:?} does not resolve to an IP address")]
    Resolve {
        /// The name that did not resolve.
        host: String,
    },
    /// A ZeroMQ call failed.
    #[error("ZeroMQ failed while {context}: {source}")]
    Zmq {
        /// What we were doing.
        context: String,
        /// ZeroMQ's reason.
        source: Cause,
    },
    /// Setting the node up failed outside ZeroMQ (a thread, a free port).
    #[error("cannot {what}: {detail}")]
    Setup {
        /// What we tried.
        what: &'static str,
        /// Why it failed, and what to do.
        detail: String,
    },
    /// A message names a receiver that is not in the node table.
    #[error("cannot send to node {0}: it is not in the node table")]
    UnknownPeer(NodeId),
    /// Data sent before this node joined the cluster.
    #[error("this node has not joined the cluster yet: call start() before sending")]
    NotReady,
    /// The cluster did not form before the start deadline.
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
        /// identity conflict; see [`StartTimeout::identity_conflicts`]).
        identity_conflicts: Vec<NodeId>,
    },
    /// A barrier names a group this node is not part of, or no group at all.
    #[error(
        "barrier group {0} is invalid here: use a sum of 1 (scheduler), 2 (servers), 4 (workers) \
         that includes this node's role"
    )]
    InvalidGroup(i32),
    /// The scheduler is not a pslite scheduler (C++ ps-lite), which hosts
    /// no key-value store.
    #[error(
        "the key-value store needs a pslite scheduler; this cluster's scheduler is C++ ps-lite \
         (or an older pslite), which has none"
    )]
    StoreUnsupported,
    /// A store request got no answer in time: the scheduler is overloaded,
    /// unreachable or gone.
    #[error(
        "the scheduler did not answer a store request within {secs:.1} s: is it still running?"
    )]
    StoreNoAnswer {
        /// How long we waited.
        secs: f64,
    },
    /// The node, a barrier or a request failed remotely, or the node stopped.
    #[error("{0}")]
    Failed(Failure),
    /// pslite broke one of its own rules (a call answered with another
    /// call's outcome): a bug, never the user's input.
    #[error("internal error: {0}; this is a bug in pslite, please report it")]
    Internal(String),
}

impl From<Failure> for VanError {
    /// A failure as the Van reports it: [`VanError::Failed`] (the
    /// deadlines of calls are the waits', reported as their own variants).
    fn from(failure: Failure) -> VanError {
        VanError::Failed(failure)
    }
}

impl VanError {
    /// The typed cause, when this is a failure of the node or a barrier.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            VanError::Failed(f) => Some(f),
            _ => None,
        }
    }
}
