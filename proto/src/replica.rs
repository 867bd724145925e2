//! pslite-only messages of replicated key ranges (`PS_REPLICAS >= 2`): the
//! range map the scheduler hands out and the replication part of requests,
//! responses and the messages between replicas (`PBMeta.replica`, field
//! 110). They appear only in clusters that replicate, which C++ nodes cannot
//! join; the protocol is in `van/src/replica.rs` and docs/PROTOCOL.md.

use crate::ids::{NodeId, K_EMPTY};
use crate::pb::{PbApplied, PbRange, PbRangeMap, PbReplica};

/// What a replication message is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReplicaOp {
    /// Scheduler to every node: the range map (also on the node table).
    #[default]
    Map = 1,
    /// Worker to a range's primary: a KV request for that range.
    Request = 2,
    /// Primary to worker: the answer to a [`ReplicaOp::Request`].
    Response = 3,
    /// Between replicas: one entry of a range's log (a KV request).
    Entry = 4,
    /// Replica to primary: every entry up to `seq` is applied.
    Applied = 5,
    /// A new primary to the other replicas: what have you applied?
    Sync = 6,
    /// The answer to [`ReplicaOp::Sync`] (after the entries it lacked).
    SyncReply = 7,
    /// Primary to a joining server: a copy of the range's state.
    Snapshot = 8,
    /// Primary to scheduler: a joining server has caught up.
    Ready = 9,
    /// Server to scheduler: this server asks to leave the job (its ranges
    /// move to the others first; `DMLC_NUM_SERVER=MIN:MAX`).
    Leave = 10,
    /// Scheduler to a server that asked to leave: it holds no range any
    /// more and may exit.
    Left = 11,
    /// Scheduler to a server that asked to leave: refused (the job would
    /// have fewer than MIN servers); `node` is MIN.
    LeaveRefused = 12,
}

impl ReplicaOp {
    /// The op with wire number `value`.
    pub fn from_i32(value: i32) -> Option<ReplicaOp> {
        Some(match value {
            1 => ReplicaOp::Map,
            2 => ReplicaOp::Request,
            3 => ReplicaOp::Response,
            4 => ReplicaOp::Entry,
            5 => ReplicaOp::Applied,
            6 => ReplicaOp::Sync,
            7 => ReplicaOp::SyncReply,
            8 => ReplicaOp::Snapshot,
            9 => ReplicaOp::Ready,
            10 => ReplicaOp::Leave,
            11 => ReplicaOp::Left,
            12 => ReplicaOp::LeaveRefused,
            _ => return None,
        })
    }
}

/// One key range of the map and the servers holding it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeEntry {
    /// First key.
    pub begin: u64,
    /// One past the last key (`u64::MAX`: every key from `begin` on).
    pub end: u64,
    /// The replicas serving the range, primary first.
    pub replicas: Vec<NodeId>,
    /// Servers receiving a copy of the range, not serving it yet.
    pub joining: Vec<NodeId>,
    /// The map version that added each joiner (a copy started before went
    /// to an earlier process with its id).
    pub joined_at: Vec<u64>,
}

impl RangeEntry {
    /// The primary, if any replica is left.
    pub fn primary(&self) -> Option<NodeId> {
        self.replicas.first().copied()
    }

    /// The map version that added joiner `id` (0 if unknown).
    pub fn joined_at(&self, id: NodeId) -> u64 {
        self.joining
            .iter()
            .position(|&j| j == id)
            .and_then(|i| self.joined_at.get(i).copied())
            .unwrap_or(0)
    }

    /// Removes the joiners for which `drop` holds.
    pub fn drop_joiners(&mut self, drop: impl Fn(NodeId) -> bool) {
        let mut i = 0;
        while i < self.joining.len() {
            if drop(self.joining[i]) {
                self.joining.remove(i);
                if i < self.joined_at.len() {
                    self.joined_at.remove(i);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Whether `key` falls in the range.
    pub fn contains(&self, key: u64) -> bool {
        key >= self.begin && (key < self.end || self.end == u64::MAX)
    }
}

/// Which servers hold which key ranges; each change has a higher version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeMap {
    /// Increases with every change.
    pub version: u64,
    /// Replicas each range should have (`PS_REPLICAS`).
    pub replicas: u32,
    /// The ranges in key order; a worker addresses range `r` as the node id
    /// of server rank `r`.
    pub ranges: Vec<RangeEntry>,
}

/// What request `request_id` of `worker` was applied as, in a range's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The worker.
    pub worker: NodeId,
    /// Its request id.
    pub request_id: u64,
    /// The log entry.
    pub seq: u64,
}

/// The replication part of a message (`PBMeta.replica`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaMsg {
    /// What it is.
    pub op: ReplicaOp,
    /// The range (its index in the map).
    pub range: u32,
    /// The map version the sender acted on.
    pub version: u64,
    /// The log entry's place.
    pub seq: u64,
    /// The worker's request id.
    pub request_id: u64,
    /// The worker that sent the request ([`K_EMPTY`]: none).
    pub origin: NodeId,
    /// The worker's requests below this id are all answered.
    pub done_below: u64,
    /// Entries up to this seq are on every replica.
    pub stable: u64,
    /// [`ReplicaOp::Map`]: the map.
    pub map: Option<RangeMap>,
    /// [`ReplicaOp::Snapshot`]: the range's applied table.
    pub applied: Vec<Applied>,
    /// [`ReplicaOp::Snapshot`]: the app of each data frame.
    pub apps: Vec<i32>,
    /// [`ReplicaOp::Ready`]: the server that caught up.
    pub node: NodeId,
    /// [`ReplicaOp::Entry`] with one backup: the backup answers the worker
    /// itself, with the timestamp of its request and the map version it
    /// was sent under.
    pub answer: Option<(i32, u64)>,
}

impl ReplicaMsg {
    /// A message of kind `op` about range `range`, nothing else set.
    pub fn new(op: ReplicaOp, range: u32) -> ReplicaMsg {
        ReplicaMsg {
            op,
            range,
            origin: K_EMPTY,
            node: K_EMPTY,
            ..ReplicaMsg::default()
        }
    }

    /// The protobuf view.
    pub fn to_pb(&self) -> PbReplica {
        let nz = |v: u64| (v != 0).then_some(v);
        PbReplica {
            op: Some(self.op as i32),
            range: Some(self.range),
            version: nz(self.version),
            seq: nz(self.seq),
            request_id: nz(self.request_id),
            origin: (self.origin != K_EMPTY).then_some(self.origin),
            done_below: nz(self.done_below),
            stable: nz(self.stable),
            map: self.map.as_ref().map(RangeMap::to_pb),
            applied: self
                .applied
                .iter()
                .map(|a| PbApplied {
                    worker: Some(a.worker),
                    request_id: Some(a.request_id),
                    seq: Some(a.seq),
                })
                .collect(),
            apps: self.apps.clone(),
            node: (self.node != K_EMPTY).then_some(self.node),
            answer_ts: self.answer.map(|(ts, _)| ts),
            answer_version: self.answer.map(|(_, v)| v),
        }
    }

    /// Reads the protobuf view; `None` for an unknown op.
    pub fn from_pb(pb: PbReplica) -> Option<ReplicaMsg> {
        Some(ReplicaMsg {
            op: ReplicaOp::from_i32(pb.op.unwrap_or(0))?,
            range: pb.range.unwrap_or(0),
            version: pb.version.unwrap_or(0),
            seq: pb.seq.unwrap_or(0),
            request_id: pb.request_id.unwrap_or(0),
            origin: pb.origin.unwrap_or(K_EMPTY),
            done_below: pb.done_below.unwrap_or(0),
            stable: pb.stable.unwrap_or(0),
            map: pb.map.map(RangeMap::from_pb),
            applied: pb
                .applied
                .into_iter()
                .map(|a| Applied {
                    worker: a.worker.unwrap_or(K_EMPTY),
                    request_id: a.request_id.unwrap_or(0),
                    seq: a.seq.unwrap_or(0),
                })
                .collect(),
            apps: pb.apps,
            node: pb.node.unwrap_or(K_EMPTY),
            answer: pb.answer_ts.map(|ts| (ts, pb.answer_version.unwrap_or(0))),
        })
    }
}

impl RangeMap {
    /// The protobuf view.
    pub fn to_pb(&self) -> PbRangeMap {
        PbRangeMap {
            version: Some(self.version),
            replicas: Some(self.replicas),
            range: self
                .ranges
                .iter()
                .map(|r| PbRange {
                    begin: Some(r.begin),
                    end: Some(r.end),
                    replica: r.replicas.clone(),
                    joining: r.joining.clone(),
                    joined_at: r.joined_at.clone(),
                })
                .collect(),
        }
    }

    /// Reads the protobuf view.
    pub fn from_pb(pb: PbRangeMap) -> RangeMap {
        RangeMap {
            version: pb.version.unwrap_or(0),
            replicas: pb.replicas.unwrap_or(1),
            ranges: pb
                .range
                .into_iter()
                .map(|r| RangeEntry {
                    begin: r.begin.unwrap_or(0),
                    end: r.end.unwrap_or(0),
                    replicas: r.replica,
                    joining: r.joining,
                    joined_at: r.joined_at,
                })
                .collect(),
        }
    }

    /// Range `r`, if the map has it.
    pub fn range(&self, r: u32) -> Option<&RangeEntry> {
        self.ranges.get(r as usize)
    }

    /// The primary of range `r`, if it has one.
    pub fn primary(&self, r: u32) -> Option<NodeId> {
        self.range(r).and_then(RangeEntry::primary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, Message, Meta};

    #[test]
    fn replication_parts_round_trip_and_stay_off_plain_messages() {
        let mut msg = Message::control(Command::Replica, 8);
        let mut rep = ReplicaMsg::new(ReplicaOp::Snapshot, 2);
        rep.version = 7;
        rep.seq = 41;
        rep.applied = vec![Applied {
            worker: 9,
            request_id: 5 << 32 | 3,
            seq: 40,
        }];
        rep.apps = vec![0];
        rep.map = Some(RangeMap {
            version: 7,
            replicas: 2,
            ranges: vec![RangeEntry {
                begin: 0,
                end: u64::MAX,
                replicas: vec![8, 10],
                joining: vec![12],
                joined_at: vec![6],
            }],
        });
        msg.meta.replica = Some(Box::new(rep));
        let back = Meta::decode(&msg.meta.encode()).unwrap();
        assert_eq!(back.replica, msg.meta.replica);
        assert_eq!(back.control.cmd, Command::Replica);
        // Without it, a meta is exactly what it was (ps-lite's bytes).
        let plain = Meta::default();
        assert_eq!(Meta::decode(&plain.encode()).unwrap().replica, None);
        let mut bad = msg.meta.to_pb();
        if let Some(r) = bad.replica.as_mut() {
            r.op = Some(99);
        }
        assert!(Meta::from_pb(bad).is_err(), "an unknown op is refused");
    }

    #[test]
    fn an_entry_the_backup_answers_carries_the_workers_timestamp_and_version() {
        let mut msg = Message::control(Command::Replica, 10);
        let mut rep = ReplicaMsg::new(ReplicaOp::Entry, 1);
        rep.seq = 3;
        rep.answer = Some((77, 5));
        msg.meta.replica = Some(Box::new(rep));
        let back = Meta::decode(&msg.meta.encode()).unwrap();
        assert_eq!(back.replica.and_then(|r| r.answer), Some((77, 5)));
        let mut plain = ReplicaMsg::new(ReplicaOp::Entry, 1);
        plain.seq = 3;
        assert_eq!(plain.to_pb().answer_ts, None);
    }
}
