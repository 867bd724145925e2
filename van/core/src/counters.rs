//! A node's counters: messages and bytes per peer, resends, drops by reason,
//! requests in flight and handler time.
//!
//! They stay on: every update is one relaxed atomic add, and per-peer
//! counters live in fixed tables indexed by node id, so the hot path takes no
//! lock and allocates nothing. The Van counts what crosses its sockets; apps
//! count requests in flight and time spent in their handlers. A
//! [`NodeCounters`] snapshot reads them all (not atomically as a whole: each
//! number is exact, their sum may be mid-update).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pslite_proto::stats::{NodeCounters, PeerCounters};
use pslite_proto::NodeId;

/// Node ids below this get their own per-peer counters (servers 8+2r and
/// workers 9+2r: about 500 servers and 500 workers); traffic with larger or
/// unknown ids (first contact, before a node has its id) is counted under
/// [`OTHER_PEER`].
pub const MAX_PEER_ID: usize = 1024;

/// The peer id traffic with unknown or out-of-table peers is counted under.
pub const OTHER_PEER: NodeId = 0;

/// Why a received message was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// It could not be decoded (no meta frame, bad protobuf, bad frame count).
    Malformed,
    /// Its sender is not a member of the cluster.
    UnknownPeer,
    /// Dropped on purpose for testing (`PS_DROP_MSG`).
    Injected,
    /// A duplicate of a message already delivered (resender).
    Duplicate,
    /// A part of a message that would begin beyond its sender's bound on
    /// incomplete messages (`PS_HOLD_LIMIT / 4`) or beyond the budget of
    /// everything the node holds for peers (`PS_HOLD_LIMIT`; see
    /// `crate::partition`), dropped before it was acknowledged.
    HoldLimit,
}

/// One direction of traffic, per peer.
struct Traffic {
    messages: Box<[AtomicU64]>,
    bytes: Box<[AtomicU64]>,
}

impl Traffic {
    fn new() -> Traffic {
        let table = || (0..MAX_PEER_ID).map(|_| AtomicU64::new(0)).collect();
        Traffic {
            messages: table(),
            bytes: table(),
        }
    }

    fn add(&self, peer: NodeId, bytes: usize) {
        let slot = slot(peer);
        self.messages[slot].fetch_add(1, Ordering::Relaxed);
        self.bytes[slot].fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn get(&self, slot: usize) -> (u64, u64) {
        (
            self.messages[slot].load(Ordering::Relaxed),
            self.bytes[slot].load(Ordering::Relaxed),
        )
    }
}

fn slot(peer: NodeId) -> usize {
    usize::try_from(peer)
        .ok()
        .filter(|&s| s < MAX_PEER_ID)
        .unwrap_or(OTHER_PEER as usize)
}

/// The counters of one node; share it as `Arc<Counters>`.
pub struct Counters {
    started: Instant,
    sent: Traffic,
    received: Traffic,
    resends: AtomicU64,
    dropped: [AtomicU64; 5],
    requests_in_flight: AtomicI64,
    handler_calls: AtomicU64,
    handler_nanos: AtomicU64,
    stale_held: AtomicU64,
    stale_max_gap: AtomicU64,
}

impl Counters {
    /// All counters at zero, the node started at `started` (its uptime
    /// counts from there).
    pub fn new(started: Instant) -> Counters {
        Counters {
            started,
            sent: Traffic::new(),
            received: Traffic::new(),
            resends: AtomicU64::new(0),
            dropped: Default::default(),
            requests_in_flight: AtomicI64::new(0),
            handler_calls: AtomicU64::new(0),
            handler_nanos: AtomicU64::new(0),
            stale_held: AtomicU64::new(0),
            stale_max_gap: AtomicU64::new(0),
        }
    }

    /// A message of `bytes` bytes (meta and data frames) went to `peer`.
    pub fn sent(&self, peer: NodeId, bytes: usize) {
        self.sent.add(peer, bytes);
    }

    /// A message of `bytes` bytes arrived from `peer`.
    pub fn received(&self, peer: NodeId, bytes: usize) {
        self.received.add(peer, bytes);
    }

    /// An unacknowledged message was sent again.
    pub fn resent(&self) {
        self.resends.fetch_add(1, Ordering::Relaxed);
    }

    /// A received message was dropped.
    pub fn dropped(&self, reason: DropReason) {
        self.dropped[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A request went out; [`Counters::request_done`] when it is answered
    /// (or has failed).
    pub fn request_started(&self) {
        self.requests_in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A request counted by [`Counters::request_started`] is over.
    pub fn request_done(&self) {
        self.requests_in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Requests counted by [`Counters::request_started`] not over yet.
    pub fn requests_in_flight(&self) -> i64 {
        self.requests_in_flight.load(Ordering::Relaxed)
    }

    /// An app's handler ran for `elapsed` on one request.
    pub fn handled(&self, elapsed: Duration) {
        self.handler_calls.fetch_add(1, Ordering::Relaxed);
        self.handler_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Bounded staleness: a server held a worker's pull.
    pub fn stale_held(&self) {
        self.stale_held.fetch_add(1, Ordering::Relaxed);
    }

    /// Bounded staleness: a server let a pull go with its worker `gap`
    /// clocks ahead of the slowest.
    pub fn stale_gap(&self, gap: u64) {
        self.stale_max_gap.fetch_max(gap, Ordering::Relaxed);
    }

    /// Bounded staleness on a server: pulls held so far, and the largest
    /// clock gap a pull went to the apps with (at most the pull's bound).
    pub fn staleness(&self) -> (u64, u64) {
        (
            self.stale_held.load(Ordering::Relaxed),
            self.stale_max_gap.load(Ordering::Relaxed),
        )
    }

    /// Reads every counter at `now`.
    pub fn snapshot(&self, now: Instant) -> NodeCounters {
        let peers = (0..MAX_PEER_ID)
            .filter_map(|slot| {
                let (messages_sent, bytes_sent) = self.sent.get(slot);
                let (messages_received, bytes_received) = self.received.get(slot);
                (messages_sent + messages_received > 0).then_some(PeerCounters {
                    peer: slot as NodeId,
                    messages_sent,
                    bytes_sent,
                    messages_received,
                    bytes_received,
                })
            })
            .collect();
        let dropped = |r: DropReason| self.dropped[r as usize].load(Ordering::Relaxed);
        NodeCounters {
            peers,
            resends: self.resends.load(Ordering::Relaxed),
            dropped_malformed: dropped(DropReason::Malformed),
            dropped_unknown_peer: dropped(DropReason::UnknownPeer),
            dropped_injected: dropped(DropReason::Injected),
            dropped_duplicate: dropped(DropReason::Duplicate),
            dropped_hold_limit: dropped(DropReason::HoldLimit),
            requests_in_flight: self.requests_in_flight.load(Ordering::Relaxed),
            handler_calls: self.handler_calls.load(Ordering::Relaxed),
            handler_nanos: self.handler_nanos.load(Ordering::Relaxed),
            uptime: now.saturating_duration_since(self.started),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_peer_and_folds_unknown_ids() {
        let t0 = Instant::now();
        let c = Counters::new(t0);
        c.sent(8, 100);
        c.sent(8, 50);
        c.received(9, 7);
        c.received(pslite_proto::K_EMPTY, 3);
        c.sent(-5, 1);
        let s = c.snapshot(t0);
        assert_eq!(
            s.peers,
            vec![
                PeerCounters {
                    peer: OTHER_PEER,
                    messages_sent: 1,
                    bytes_sent: 1,
                    messages_received: 1,
                    bytes_received: 3,
                },
                PeerCounters {
                    peer: 8,
                    messages_sent: 2,
                    bytes_sent: 150,
                    ..PeerCounters::default()
                },
                PeerCounters {
                    peer: 9,
                    messages_received: 1,
                    bytes_received: 7,
                    ..PeerCounters::default()
                },
            ]
        );
        assert_eq!(s.bytes_sent(), 151);
        assert_eq!(s.bytes_received(), 10);
    }

    #[test]
    fn drops_requests_and_handlers() {
        let t0 = Instant::now();
        let c = Counters::new(t0);
        c.dropped(DropReason::Malformed);
        c.dropped(DropReason::Injected);
        c.dropped(DropReason::Injected);
        c.dropped(DropReason::HoldLimit);
        c.resent();
        c.request_started();
        c.request_started();
        c.request_done();
        c.handled(Duration::from_micros(3));
        let s = c.snapshot(t0);
        assert_eq!(
            (
                s.dropped_malformed,
                s.dropped_injected,
                s.dropped_unknown_peer
            ),
            (1, 2, 0)
        );
        assert_eq!(s.dropped_hold_limit, 1);
        assert_eq!(s.dropped(), 4);
        assert_eq!(s.resends, 1);
        assert_eq!(s.requests_in_flight, 1);
        assert_eq!((s.handler_calls, s.handler_nanos), (1, 3000));
    }
}
