//! A new range map: each range this server holds takes its role in it
//! (primary, backup or joiner), and what changed with the role: a new
//! primary syncs first, a demoted one drops what it held, a joiner whose
//! primary moved starts over.

use std::collections::{BTreeMap, BTreeSet};

use log::info;
use pslite_proto::ids::NodeId;
use pslite_proto::replica::{RangeMap, ReplicaMsg, ReplicaOp};

use super::*;

impl ReplicaServer {
    /// A new map from the scheduler (what waited for it is handled now).
    pub fn on_map(&mut self, map: RangeMap, holds: &mut Holds, fx: &mut Effects) {
        if map.version <= self.map.version {
            return;
        }
        if cfg!(test) {
            self.trace.push(format!("map {map:?}"));
        }
        self.map = map;
        let version = self.map.version;
        let me = self.me;
        for r in 0..self.map.ranges.len() as u32 {
            let Some(entry) = self.map.range(r).cloned() else {
                continue;
            };
            let primary = entry.primary();
            let role = if primary == Some(me) {
                Some(Role::Primary)
            } else if entry.replicas.contains(&me) {
                Some(Role::Backup)
            } else if entry.joining.contains(&me) {
                Some(Role::Joining)
            } else {
                None
            };
            let Some(role) = role else {
                if self.ranges.remove(&r).is_some() {
                    holds.discard(Reason::Sync(r));
                    info!("range {r} moved away from this server (map {version})");
                }
                continue;
            };
            let state = self
                .ranges
                .entry(r)
                .or_insert_with(|| RangeState::new(Role::Joining, 0, None));
            let was = std::mem::replace(&mut state.role, Role::Joining);
            let primary_changed = state.primary != primary;
            // Added to the range's joiners again since the last map this
            // server saw (it was declared dead meanwhile, and is back).
            let rejoined = state.version != 0 && entry.joined_at(me) > state.version;
            state.version = version;
            state.primary = primary;
            match (was, role) {
                (Role::Primary, Role::Primary) => {
                    state.role = Role::Primary;
                    state.gating = entry
                        .replicas
                        .iter()
                        .copied()
                        .filter(|&s| s != me)
                        .collect();
                    // A copy to a joiner the map added again since (a new
                    // process with its id) starts over.
                    state.catch_up.retain(|j, c| {
                        entry.replicas.contains(j)
                            || (entry.joining.contains(j) && c.since >= entry.joined_at(*j))
                    });
                    // A joiner that became a replica gates as one now.
                    let joined: Vec<NodeId> = state
                        .catch_up
                        .keys()
                        .copied()
                        .filter(|j| entry.replicas.contains(j))
                        .collect();
                    for j in joined {
                        state.catch_up.remove(&j);
                    }
                    if let Some(sync) = &mut state.sync {
                        // A replica that left (died) sends nothing more:
                        // what only it had is not waited for (it was on no
                        // other replica, so never answered).
                        sync.waiting.retain(|s| entry.replicas.contains(s));
                        sync.replies.retain(|s, _| entry.replicas.contains(s));
                        sync.max = sync
                            .replies
                            .values()
                            .copied()
                            .fold(state.delivered, u64::max);
                    }
                    let catch_up = &state.catch_up;
                    state
                        .acked
                        .retain(|s, _| entry.replicas.contains(s) || catch_up.contains_key(s));
                }
                (_, Role::Primary) => {
                    // Promoted (or the primary moved here): sync first.
                    // Entries buffered past a gap came from the old primary
                    // and stay: the sync may fill the gap (the replicas
                    // that had them may have lost their copy of one).
                    state.role = Role::Primary;
                    state.pending.clear();
                    state.tail.clear();
                    state.catch_up.clear();
                    state.acked.clear();
                    state.gating = entry
                        .replicas
                        .iter()
                        .copied()
                        .filter(|&s| s != me)
                        .collect();
                    let others: BTreeSet<NodeId> = state.gating.clone();
                    info!(
                        "range {r}: this server is its primary now (map {version}); syncing with \
                         {others:?}"
                    );
                    state.sync = Some(Sync {
                        waiting: others.clone(),
                        max: state.delivered,
                        replies: BTreeMap::new(),
                    });
                    let from = state.delivered;
                    for s in others {
                        let mut rep = ReplicaMsg::new(ReplicaOp::Sync, r);
                        rep.version = version;
                        rep.seq = from;
                        self.send_control(rep, s, Vec::new(), fx);
                    }
                }
                (Role::Primary, Role::Backup) => {
                    // Demoted: the workers send what waits here again to the
                    // new primary, which applies it at most once.
                    state.role = Role::Backup;
                    state.pending.clear();
                    state.tail.clear();
                    holds.discard(Reason::Sync(r));
                    state.catch_up.clear();
                    state.acked.clear();
                    state.gating.clear();
                    state.sync = None;
                }
                (Role::Backup, Role::Backup) | (Role::Joining, Role::Backup) => {
                    state.role = Role::Backup;
                    if primary_changed {
                        // Entries past a gap came from the old primary; the new
                        // one's sync sends what is missing.
                        state.buffered.clear();
                    }
                }
                (Role::Joining, Role::Joining) => {
                    if primary_changed || rejoined {
                        // Start over with the new primary's snapshot: what
                        // the old one's copy brought counts for nothing (its
                        // seqs may run ahead of the new primary's snapshot;
                        // a server back from a false death was sent a new
                        // copy, which a restored state would refuse).
                        *state = RangeState::new(Role::Joining, version, primary);
                        holds.discard(Reason::Sync(r));
                    }
                }
                (_, Role::Joining) => {
                    *state = RangeState::new(Role::Joining, version, primary);
                    holds.discard(Reason::Sync(r));
                }
            }
            self.sync_progress(r, holds, fx);
            self.start_catch_ups(r, fx);
            self.release(r, fx);
        }
        // Our deliveries of ranges we no longer hold answer nobody.
        let ranges = &self.ranges;
        self.local.retain(|_, l| match l {
            Local::Request { range, .. } | Local::Entry { range, .. } => ranges.contains_key(range),
        });
        for msg in holds.release(|r| matches!(r, Reason::Map(_))) {
            self.handle(msg, holds, fx);
        }
    }
}
