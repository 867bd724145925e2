//! The worker's side of replication: routing by the range map.
//!
//! Rules:
//! - The apps address range `r` as server rank `r` (ps-lite's routing, so
//!   `KVWorker` is unchanged). A KV request to that id goes to the range's
//!   primary in the current map, stamped with the range, the map version,
//!   a request id and `done_below`.
//! - Request ids are unique per worker process: a random 32-bit
//!   incarnation, then a counter. The request is kept until answered.
//! - A response is taken once, from any server the request was sent to or
//!   (a push the range's only backup answers) from a replica of the range in
//!   the current map naming the request's id; the apps see it as coming from
//!   the range's id.
//! - When a map arrives, every request still in flight whose range has
//!   another primary is sent again, same id, to the new one (which applies
//!   it at most once). A range with no replica left fails its requests.
//! - `done_below` is the lowest id still in flight: the servers forget the
//!   ids below it.

use std::collections::BTreeMap;

use log::{debug, info};
use pslite_proto::ids::{self, NodeId};
use pslite_proto::replica::{RangeMap, ReplicaMsg, ReplicaOp};
use pslite_proto::{Message, Role};

/// A request still waiting for its answer.
struct InFlight {
    msg: Message,
    /// Servers it was sent to, the current one last.
    targets: Vec<NodeId>,
}

/// (app, customer, timestamp, range).
type Key = (i32, i32, i32, u32);

/// What became of a map for the requests in flight.
#[derive(Default)]
pub struct Rerouted {
    /// Requests to send again (to their range's new primary).
    pub resend: Vec<Message>,
    /// Requests whose range has no replica left (as the apps sent them).
    pub lost: Vec<Message>,
}

/// A worker's routing state.
pub struct RangeClient {
    map: RangeMap,
    next_id: u64,
    in_flight: BTreeMap<Key, InFlight>,
}

impl RangeClient {
    /// A client with the first map; `incarnation` makes its request ids
    /// differ from an earlier process's with the same node id.
    pub fn new(map: RangeMap, incarnation: u32) -> RangeClient {
        RangeClient {
            map,
            next_id: (u64::from(incarnation.max(1)) << 32) | 1,
            in_flight: BTreeMap::new(),
        }
    }

    /// The current map.
    pub fn map(&self) -> &RangeMap {
        &self.map
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether `msg` (from this node's apps) is a KV request to a range.
    pub fn routes(&self, msg: &Message) -> bool {
        let m = &msg.meta;
        m.control.is_empty()
            && m.request
            && !m.simple_app
            && ids::role_of_id(m.recver) == Some(Role::Server)
            && (ids::id_to_rank(m.recver) as usize) < self.map.ranges.len()
    }

    fn done_below(&self) -> u64 {
        self.in_flight
            .values()
            .filter_map(|f| f.msg.meta.replica.as_ref().map(|r| r.request_id))
            .min()
            .unwrap_or(self.next_id)
    }

    /// Routes a request to its range's primary; `None` if the range has no
    /// replica left (the request fails).
    pub fn route(&mut self, mut msg: Message) -> Option<Message> {
        let range = ids::id_to_rank(msg.meta.recver) as u32;
        let primary = self.map.primary(range)?;
        let mut rep = ReplicaMsg::new(ReplicaOp::Request, range);
        rep.version = self.map.version;
        rep.request_id = self.next_id;
        self.next_id += 1;
        let key = (
            msg.meta.app_id,
            msg.meta.customer_id,
            msg.meta.timestamp,
            range,
        );
        msg.meta.replica = Some(Box::new(rep));
        msg.meta.recver = primary;
        let done_below = self.done_below().min(self.next_id - 1);
        if let Some(r) = msg.meta.replica.as_mut() {
            r.done_below = done_below;
        }
        self.in_flight.insert(
            key,
            InFlight {
                msg: msg.clone(),
                targets: vec![primary],
            },
        );
        Some(msg)
    }

    /// A response from a server: the message the apps get (from the
    /// range's id), or `None` if it answers nothing in flight.
    pub fn on_response(&mut self, mut msg: Message) -> Option<Message> {
        let rep = msg.meta.replica.take()?;
        let key = (
            msg.meta.app_id,
            msg.meta.customer_id,
            msg.meta.timestamp,
            rep.range,
        );
        let sender = msg.meta.sender;
        // From a server it was sent to, or (a push the range's backup
        // answers once it has it) from a replica of the range, for this
        // very request.
        let replica = |f: &InFlight| {
            f.msg
                .meta
                .replica
                .as_ref()
                .is_some_and(|r| r.request_id == rep.request_id)
                && self
                    .map
                    .range(rep.range)
                    .is_some_and(|e| e.replicas.contains(&sender))
        };
        match self.in_flight.get(&key) {
            Some(f) if f.targets.contains(&sender) || replica(f) => {
                self.in_flight.remove(&key);
                msg.meta.sender = ids::server_rank_to_id(rep.range as i32);
                Some(msg)
            }
            _ => {
                debug!(
                    "dropping a response from node {sender} for range {} request {}: not in \
                     flight to it",
                    rep.range, msg.meta.timestamp
                );
                None
            }
        }
    }

    /// Whether `msg` (given up on by the transport) is still in flight:
    /// the map, not the transport, decides its fate.
    pub fn owns(&self, msg: &Message) -> bool {
        let Some(rep) = &msg.meta.replica else {
            return false;
        };
        let key = (
            msg.meta.app_id,
            msg.meta.customer_id,
            msg.meta.timestamp,
            rep.range,
        );
        self.in_flight.contains_key(&key)
    }

    /// A newer map: requests in flight to a range whose replicas changed
    /// (or all of them, after maps this node missed) go to its primary again (a new one, or the same one after maps this
    /// node missed: it may have been demoted meanwhile, dropping the answer
    /// it owed, and promoted again); those of a range with no replica left
    /// fail. A server applies a request sent again at most once.
    pub fn on_map(&mut self, map: RangeMap) -> Rerouted {
        let mut out = Rerouted::default();
        if map.version <= self.map.version {
            return out;
        }
        let old = std::mem::replace(&mut self.map, map);
        // Maps this node missed may have replaced a replica by a new
        // process with its id (which dropped what it got as a joiner) and
        // made it primary again: the same replicas say nothing then.
        let skipped = self.map.version > old.version + 1;
        let done_below = self.done_below();
        let mut lost = Vec::new();
        for (key, f) in self.in_flight.iter_mut() {
            let range = key.3;
            let changed =
                old.range(range).map(|e| &e.replicas) != self.map.range(range).map(|e| &e.replicas);
            match self.map.primary(range) {
                None => lost.push(*key),
                Some(p) if changed || skipped || f.targets.last() != Some(&p) => {
                    if f.targets.last() != Some(&p) {
                        f.targets.push(p);
                    }
                    let mut msg = f.msg.clone();
                    msg.meta.recver = p;
                    if let Some(r) = msg.meta.replica.as_mut() {
                        r.version = self.map.version;
                        r.done_below = done_below;
                    }
                    out.resend.push(msg);
                }
                Some(_) => {}
            }
        }
        if !out.resend.is_empty() {
            info!(
                "range map {}: sending {} requests in flight again to their ranges' primaries",
                self.map.version,
                out.resend.len()
            );
        }
        for key in lost {
            if let Some(f) = self.in_flight.remove(&key) {
                let mut msg = f.msg;
                msg.meta.recver = ids::server_rank_to_id(key.3 as i32);
                out.lost.push(msg);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use pslite_proto::replica::RangeEntry;

    use super::*;

    fn map(version: u64, replicas: &[NodeId]) -> RangeMap {
        RangeMap {
            version,
            replicas: 2,
            ranges: vec![RangeEntry {
                begin: 0,
                end: u64::MAX,
                replicas: replicas.to_vec(),
                joining: Vec::new(),
                joined_at: Vec::new(),
            }],
        }
    }

    fn request(ts: i32) -> Message {
        let mut msg = Message::default();
        msg.meta.request = true;
        msg.meta.pull = true;
        msg.meta.timestamp = ts;
        msg.meta.recver = ids::server_rank_to_id(0);
        msg
    }

    /// Found by the packet-fault property test: a worker with map 2 sent a
    /// pull to server 8; 8 was replaced meanwhile (the new process, a
    /// joiner, dropped it), and the worker's next map was 7, with the same
    /// replicas as map 2: the pull waited for good.
    #[test]
    fn after_missed_maps_requests_in_flight_are_sent_again() {
        let mut c = RangeClient::new(map(2, &[8, 10]), 1);
        assert!(c.route(request(3)).is_some());
        let out = c.on_map(map(3, &[8, 10]));
        assert!(out.resend.is_empty(), "the next map, the same replicas");
        let out = c.on_map(map(7, &[8, 10]));
        assert_eq!(out.resend.len(), 1);
        assert_eq!(out.resend[0].meta.recver, 8);
        assert_eq!(
            out.resend[0].meta.replica.as_ref().map(|r| r.version),
            Some(7)
        );
    }
}
