//! pslite-only observability messages: a node's counters and the scheduler's
//! status table. They travel in PBMeta fields 100 and up, which C++ ps-lite
//! skips, so a node may attach its counters to the HEARTBEAT it sends any
//! scheduler; the status table only ever goes to a pslite admin client.

use std::time::Duration;

use crate::codec::DecodeError;
use crate::ids::NodeId;
use crate::pb::{PbCounters, PbNodeStatus, PbPeerCounters};
use crate::Node;

/// What one node has sent to and received from one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerCounters {
    /// The peer's node id.
    pub peer: NodeId,
    /// Messages sent to the peer (resends included).
    pub messages_sent: u64,
    /// Bytes sent to the peer: meta frames and data frames.
    pub bytes_sent: u64,
    /// Messages received from the peer (dropped ones included).
    pub messages_received: u64,
    /// Bytes received from the peer: meta frames and data frames.
    pub bytes_received: u64,
}

/// A snapshot of one node's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeCounters {
    /// Traffic per peer, in peer id order; peers never talked to are left out.
    pub peers: Vec<PeerCounters>,
    /// Messages sent again because they were not acknowledged in time.
    pub resends: u64,
    /// Received messages dropped because they could not be decoded.
    pub dropped_malformed: u64,
    /// Received messages dropped because the sender is not a cluster member.
    pub dropped_unknown_peer: u64,
    /// Received messages dropped on purpose (`PS_DROP_MSG`).
    pub dropped_injected: u64,
    /// Received messages dropped as duplicates of ones already delivered.
    pub dropped_duplicate: u64,
    /// Received parts dropped because their message would begin beyond the
    /// sender's bound on incomplete messages (`PS_HOLD_LIMIT / 4`).
    pub dropped_hold_limit: u64,
    /// Requests this node sent whose responses have not all arrived.
    pub requests_in_flight: i64,
    /// Requests handled by this node's apps.
    pub handler_calls: u64,
    /// Time spent in those handlers, in nanoseconds.
    pub handler_nanos: u64,
    /// How long the node has been running.
    pub uptime: Duration,
}

impl NodeCounters {
    /// Bytes sent to every peer together.
    pub fn bytes_sent(&self) -> u64 {
        self.peers.iter().map(|p| p.bytes_sent).sum()
    }

    /// Bytes received from every peer together.
    pub fn bytes_received(&self) -> u64 {
        self.peers.iter().map(|p| p.bytes_received).sum()
    }

    /// Messages sent to every peer together.
    pub fn messages_sent(&self) -> u64 {
        self.peers.iter().map(|p| p.messages_sent).sum()
    }

    /// Messages received from every peer together.
    pub fn messages_received(&self) -> u64 {
        self.peers.iter().map(|p| p.messages_received).sum()
    }

    /// Received messages dropped for any reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_malformed
            + self.dropped_unknown_peer
            + self.dropped_injected
            + self.dropped_duplicate
            + self.dropped_hold_limit
    }

    /// The protobuf form.
    pub fn to_pb(&self) -> PbCounters {
        PbCounters {
            peer: self
                .peers
                .iter()
                .map(|p| PbPeerCounters {
                    peer: Some(p.peer),
                    messages_sent: Some(p.messages_sent),
                    bytes_sent: Some(p.bytes_sent),
                    messages_received: Some(p.messages_received),
                    bytes_received: Some(p.bytes_received),
                })
                .collect(),
            resends: Some(self.resends),
            dropped_malformed: Some(self.dropped_malformed),
            dropped_unknown_peer: Some(self.dropped_unknown_peer),
            dropped_injected: Some(self.dropped_injected),
            dropped_duplicate: Some(self.dropped_duplicate),
            dropped_hold_limit: Some(self.dropped_hold_limit),
            requests_in_flight: Some(self.requests_in_flight),
            handler_calls: Some(self.handler_calls),
            handler_nanos: Some(self.handler_nanos),
            uptime_ms: Some(self.uptime.as_millis() as u64),
        }
    }

    /// Reads the protobuf form; absent fields are 0.
    pub fn from_pb(pb: PbCounters) -> NodeCounters {
        NodeCounters {
            peers: pb
                .peer
                .into_iter()
                .map(|p| PeerCounters {
                    peer: p.peer.unwrap_or(0),
                    messages_sent: p.messages_sent.unwrap_or(0),
                    bytes_sent: p.bytes_sent.unwrap_or(0),
                    messages_received: p.messages_received.unwrap_or(0),
                    bytes_received: p.bytes_received.unwrap_or(0),
                })
                .collect(),
            resends: pb.resends.unwrap_or(0),
            dropped_malformed: pb.dropped_malformed.unwrap_or(0),
            dropped_unknown_peer: pb.dropped_unknown_peer.unwrap_or(0),
            dropped_injected: pb.dropped_injected.unwrap_or(0),
            dropped_duplicate: pb.dropped_duplicate.unwrap_or(0),
            dropped_hold_limit: pb.dropped_hold_limit.unwrap_or(0),
            requests_in_flight: pb.requests_in_flight.unwrap_or(0),
            handler_calls: pb.handler_calls.unwrap_or(0),
            handler_nanos: pb.handler_nanos.unwrap_or(0),
            uptime: Duration::from_millis(pb.uptime_ms.unwrap_or(0)),
        }
    }
}

/// One row of the scheduler's status table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// The node as in the node table (id, role, address, recovered).
    pub node: Node,
    /// How long ago the scheduler last heard from it.
    pub last_seen: Option<Duration>,
    /// Whether its heartbeats stopped for longer than the timeout.
    pub dead: bool,
    /// Its latest counters (sent with its heartbeats), if any.
    pub counters: Option<NodeCounters>,
    /// How old those counters are.
    pub counters_age: Option<Duration>,
    /// Elastic mode: a registered worker waiting to be admitted to a round.
    pub waiting: bool,
    /// Elastic mode: the worker's rank in the current round.
    pub round_rank: Option<u32>,
}

impl NodeStatus {
    /// The protobuf form.
    pub fn to_pb(&self) -> PbNodeStatus {
        PbNodeStatus {
            node: crate::codec::node_to_pb(&self.node),
            last_seen_ms: self.last_seen.map(|d| d.as_millis() as u64),
            dead: Some(self.dead),
            counters: self.counters.as_ref().map(NodeCounters::to_pb),
            counters_age_ms: self.counters_age.map(|d| d.as_millis() as u64),
            waiting: self.waiting.then_some(true),
            round_rank: self.round_rank,
        }
    }

    /// Reads the protobuf form.
    pub fn from_pb(pb: PbNodeStatus) -> Result<NodeStatus, DecodeError> {
        Ok(NodeStatus {
            node: crate::codec::node_from_pb(pb.node)?,
            last_seen: pb.last_seen_ms.map(Duration::from_millis),
            dead: pb.dead.unwrap_or(false),
            counters: pb.counters.map(NodeCounters::from_pb),
            counters_age: pb.counters_age_ms.map(Duration::from_millis),
            waiting: pb.waiting.unwrap_or(false),
            round_rank: pb.round_rank,
        })
    }
}
