//! What can go wrong in the transport and the control plane.

use pslite_proto::NodeId;

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
        source: zmq::Error,
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
        source: zmq::Error,
    },
    /// A message names a receiver that is not in the node table.
    #[error("cannot send to node {0}: it is not in the node table")]
    UnknownPeer(NodeId),
    /// Data sent before this node joined the cluster.
    #[error("this node has not joined the cluster yet: call start() before sending")]
    NotReady,
    /// The cluster did not form before the start deadline.
    #[error("{0}")]
    StartTimeout(String),
    /// A barrier was not released before its deadline.
    #[error("barrier over group {group} was not released within {secs} s")]
    BarrierTimeout {
        /// The barrier's group.
        group: i32,
        /// How long we waited.
        secs: u64,
    },
    /// A barrier names a group this node is not part of, or no group at all.
    #[error(
        "barrier group {0} is invalid here: use a sum of 1 (scheduler), 2 (servers), 4 (workers) \
         that includes this node's role"
    )]
    InvalidGroup(i32),
    /// The Van was stopped while waiting.
    #[error("the van has stopped")]
    Stopped,
    /// The node cannot go on (scheduler lost, not in the node table...).
    #[error("{0}")]
    Failed(String),
}
