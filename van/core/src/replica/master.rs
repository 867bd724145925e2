//! The scheduler's side of replication: the range map and how it changes.
//!
//! Rules:
//! - There are as many ranges as server ranks (ps-lite's key ranges), and
//!   range `r`'s preferred servers are ranks `r, r+1, ...` around the ring:
//!   its *target* is the first `k` of them that are live (fewer if fewer
//!   servers live).
//! - At formation every range's replicas are its target: primary rank `r`,
//!   backups the next `k-1` ranks.
//! - A dead server leaves every range at once, keeping the order of the
//!   others: the next replica is promoted. No copy is needed for that, so
//!   failover costs one map broadcast.
//! - A live target server that does not hold a range is added to its
//!   `joining` list: its primary sends it a copy and the log after it, and
//!   reports it READY once it has caught up. Then it becomes a replica; once
//!   every target server is a replica, the replicas become exactly the
//!   target, in target order (which may move the primary back to a
//!   replacement, or drop a survivor that held the range meanwhile).
//! - A range whose every replica died is lost: its joiners are dropped
//!   (there is nothing to copy) and its requests fail.
//! - Servers that join and leave (`DMLC_NUM_SERVER=MIN:MAX`): there are
//!   MAX ranges, so every rank a server can have (0..MAX) has a home range.
//!   A server that joins is live like a replacement: the ranges whose
//!   target now includes it copy to it. A server that asks to leave stays
//!   live but *leaving*: targets are planned without it, so its ranges copy
//!   to their new targets while it still serves them; once no range holds
//!   it (as a replica or joiner) it has *left* ([`RangeMaster::take_left`])
//!   and may exit. A leave that would leave fewer than MIN servers is
//!   refused.
//!
//! Every change increments the version; the core broadcasts the map.

use std::collections::BTreeSet;

use log::{error, info};
use pslite_proto::ids::{self, NodeId};
use pslite_proto::replica::{RangeEntry, RangeMap};

/// The scheduler's range map and the live servers it is planned over.
pub struct RangeMaster {
    k: usize,
    map: RangeMap,
    live: BTreeSet<NodeId>,
    /// Live servers handing their ranges over before they exit.
    leaving: BTreeSet<NodeId>,
}

/// Why a server may not leave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaveRefused {
    /// The job would have fewer than `min` servers.
    TooFew {
        /// `DMLC_NUM_SERVER`'s MIN.
        min: usize,
        /// Servers that would stay.
        staying: usize,
    },
    /// It is not a live server of the map.
    NotLive,
}

impl RangeMaster {
    /// `ranges` key ranges (ps-lite's for that many servers), `k` replicas
    /// each. The map is empty (version 0) until [`RangeMaster::formed`].
    pub fn new(ranges: usize, k: usize) -> RangeMaster {
        let ranges = crate::replica::key_ranges(ranges)
            .into_iter()
            .map(|(begin, end)| RangeEntry {
                begin,
                end,
                ..RangeEntry::default()
            })
            .collect();
        RangeMaster {
            k: k.max(1),
            map: RangeMap {
                version: 0,
                replicas: k.max(1) as u32,
                ranges,
            },
            live: BTreeSet::new(),
            leaving: BTreeSet::new(),
        }
    }

    /// The current map.
    pub fn map(&self) -> &RangeMap {
        &self.map
    }

    /// The cluster formed with `servers` live: every range gets its target.
    pub fn formed(&mut self, servers: &[NodeId]) -> &RangeMap {
        self.live = servers.iter().copied().collect();
        for r in 0..self.map.ranges.len() {
            let target = self.target(r);
            let range = &mut self.map.ranges[r];
            range.replicas = target;
            range.drop_joiners(|_| true);
        }
        self.map.version += 1;
        &self.map
    }

    /// Range `r`'s target: the first `k` live servers from rank `r` on,
    /// around the ring of ranks, leaving ones left out (unless only leaving
    /// ones are live: then they keep the range until another joins).
    fn target(&self, r: usize) -> Vec<NodeId> {
        let n = self.map.ranges.len();
        let ring = (0..n).map(|i| ids::server_rank_to_id(((r + i) % n) as i32));
        let staying: Vec<NodeId> = ring
            .clone()
            .filter(|id| self.live.contains(id) && !self.leaving.contains(id))
            .take(self.k)
            .collect();
        if !staying.is_empty() {
            return staying;
        }
        ring.filter(|id| self.live.contains(id))
            .take(self.k)
            .collect()
    }

    /// Server `id` died: it leaves every range (the next replica of each of
    /// its ranges is promoted) and copies start toward the new targets.
    /// Returns whether the map changed.
    pub fn server_dead(&mut self, id: NodeId) -> bool {
        if !self.live.remove(&id) || self.map.version == 0 {
            return false;
        }
        self.leaving.remove(&id);
        for (r, range) in self.map.ranges.iter_mut().enumerate() {
            let held = range.replicas.contains(&id);
            range.replicas.retain(|&s| s != id);
            range.drop_joiners(|s| s == id);
            if held && range.replicas.is_empty() {
                error!(
                    "range {r} lost its last replica (node {id}): its keys are gone, requests \
                     for them fail"
                );
            } else if held {
                info!(
                    "range {r}: node {id} is dead, node {} is its primary",
                    range.replicas[0]
                );
            }
        }
        self.plan();
        self.map.version += 1;
        true
    }

    /// Server `id` is live again (a replacement took its id) or joined:
    /// the ranges that want it start copying to it. Returns whether the map
    /// changed.
    pub fn server_live(&mut self, id: NodeId) -> bool {
        if self.map.version == 0 || !self.live.insert(id) {
            return false;
        }
        self.leaving.remove(&id);
        // A replacement holds nothing of what its id held.
        for range in &mut self.map.ranges {
            range.replicas.retain(|&s| s != id);
            range.drop_joiners(|s| s == id);
        }
        self.plan();
        self.map.version += 1;
        true
    }

    /// The primary `from` of range `r` says joiner `node`, whose copy it
    /// started at map version `since`, caught up: it becomes a replica, and
    /// once the range holds its whole target, the replicas become the
    /// target. Returns whether the map changed.
    pub fn ready(&mut self, from: NodeId, r: u32, node: NodeId, since: u64) -> bool {
        let Some(range) = self.map.ranges.get(r as usize) else {
            return false;
        };
        if range.primary() != Some(from) || !range.joining.contains(&node) {
            return false;
        }
        if since < range.joined_at(node) {
            info!("range {r}: ignoring a READY for node {node} about a copy to its predecessor");
            return false;
        }
        let target = self.target(r as usize);
        let range = &mut self.map.ranges[r as usize];
        range.drop_joiners(|s| s == node);
        range.replicas.push(node);
        if target.iter().all(|s| range.replicas.contains(s)) {
            range.replicas = target;
        }
        info!(
            "range {r}: node {node} caught up; replicas now {:?}",
            range.replicas
        );
        self.map.version += 1;
        true
    }

    /// Server `id` asks to leave, with at least `min` servers staying: its
    /// ranges are planned without it (copies start toward their new
    /// targets) while it still serves them. Returns whether the map changed
    /// (not when it is leaving already).
    pub fn server_leaving(&mut self, id: NodeId, min: usize) -> Result<bool, LeaveRefused> {
        if self.map.version == 0 || !self.live.contains(&id) {
            return Err(LeaveRefused::NotLive);
        }
        if self.leaving.contains(&id) {
            return Ok(false);
        }
        let staying = self.live.len() - self.leaving.len() - 1;
        if staying < min.max(1) {
            return Err(LeaveRefused::TooFew {
                min: min.max(1),
                staying,
            });
        }
        self.leaving.insert(id);
        info!("server {id} leaves: its ranges move to the others first");
        self.plan();
        self.map.version += 1;
        Ok(true)
    }

    /// Leaving servers that no range holds any more (as a replica or a
    /// joiner): they have left, and are no longer live. The map does not
    /// change (it names them nowhere).
    pub fn take_left(&mut self) -> Vec<NodeId> {
        let held: BTreeSet<NodeId> = self
            .map
            .ranges
            .iter()
            .flat_map(|r| r.replicas.iter().chain(&r.joining))
            .copied()
            .collect();
        let left: Vec<NodeId> = self
            .leaving
            .iter()
            .copied()
            .filter(|id| !held.contains(id))
            .collect();
        for id in &left {
            self.leaving.remove(id);
            self.live.remove(id);
        }
        left
    }

    /// Whether server `id` is handing its ranges over.
    pub fn is_leaving(&self, id: NodeId) -> bool {
        self.leaving.contains(&id)
    }

    /// Adds every live target server a range lacks to its joiners (ranges
    /// with a replica left only: a lost range has nothing to copy).
    fn plan(&mut self) {
        for r in 0..self.map.ranges.len() {
            let target = self.target(r);
            let range = &mut self.map.ranges[r];
            if range.replicas.is_empty() {
                range.drop_joiners(|_| true);
                continue;
            }
            range.drop_joiners(|s| !target.contains(&s));
            for s in target {
                if !range.replicas.contains(&s) && !range.joining.contains(&s) {
                    range.joining.push(s);
                    range.joined_at.push(self.map.version + 1);
                }
            }
            // Every target server is a replica already (a survivor took the
            // place of one that died and came back): settle on the target.
            let target = self.target(r);
            let range = &mut self.map.ranges[r];
            if range.joining.is_empty() && target.iter().all(|s| range.replicas.contains(s)) {
                range.replicas = target;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(m: &RangeMaster) -> Vec<Vec<NodeId>> {
        m.map().ranges.iter().map(|r| r.replicas.clone()).collect()
    }

    fn joining(m: &RangeMaster) -> Vec<Vec<NodeId>> {
        m.map().ranges.iter().map(|r| r.joining.clone()).collect()
    }

    #[test]
    fn ranges_start_on_their_rank_and_the_next_ones() {
        let mut m = RangeMaster::new(3, 2);
        m.formed(&[8, 10, 12]);
        assert_eq!(replicas(&m), vec![vec![8, 10], vec![10, 12], vec![12, 8]]);
        assert_eq!(m.map().version, 1);
        let mut m = RangeMaster::new(2, 3);
        m.formed(&[8, 10]);
        assert_eq!(replicas(&m), vec![vec![8, 10], vec![10, 8]]);
    }

    #[test]
    fn a_death_promotes_the_next_replica_then_copies_restore_k() {
        let mut m = RangeMaster::new(3, 2);
        m.formed(&[8, 10, 12]);
        assert!(m.server_dead(8));
        // Range 0's backup is promoted; ranges 0 and 2 copy to a survivor.
        assert_eq!(replicas(&m), vec![vec![10], vec![10, 12], vec![12]]);
        assert_eq!(joining(&m), vec![vec![12], vec![], vec![10]]);
        assert!(m.ready(10, 0, 12, 2));
        assert!(!m.ready(10, 2, 10, 2), "only the primary reports a joiner");
        assert!(m.ready(12, 2, 10, 2));
        assert_eq!(replicas(&m), vec![vec![10, 12], vec![10, 12], vec![12, 10]]);
        // The replacement takes its ranges back.
        assert!(m.server_live(8));
        assert_eq!(joining(&m), vec![vec![8], vec![], vec![8]]);
        assert!(!m.ready(10, 0, 8, 4), "a copy to an earlier process");
        assert!(m.ready(10, 0, 8, 5));
        assert!(m.ready(12, 2, 8, 5));
        assert_eq!(replicas(&m), vec![vec![8, 10], vec![10, 12], vec![12, 8]]);
        assert!(joining(&m).iter().all(Vec::is_empty));
    }

    #[test]
    fn a_leaving_server_keeps_its_ranges_until_their_new_targets_caught_up() {
        // MAX 3 ranges, 2 servers live, one copy each.
        let mut m = RangeMaster::new(3, 1);
        m.formed(&[8, 10]);
        assert_eq!(replicas(&m), vec![vec![8], vec![10], vec![8]]);
        assert_eq!(m.server_leaving(8, 1), Ok(true));
        // It still serves while its ranges copy to the server that stays.
        assert_eq!(replicas(&m), vec![vec![8], vec![10], vec![8]]);
        assert_eq!(joining(&m), vec![vec![10], vec![], vec![10]]);
        assert!(m.take_left().is_empty(), "it holds ranges still");
        assert_eq!(m.server_leaving(8, 1), Ok(false), "asked twice");
        assert!(m.ready(8, 0, 10, 2));
        assert!(m.take_left().is_empty());
        assert!(m.ready(8, 2, 10, 2));
        assert_eq!(replicas(&m), vec![vec![10], vec![10], vec![10]]);
        assert_eq!(m.take_left(), vec![8]);
        assert!(!m.is_leaving(8));
        // Gone from the live servers: a joiner with its id starts empty.
        assert!(m.server_live(8));
        assert_eq!(joining(&m), vec![vec![8], vec![], vec![8]]);
    }

    #[test]
    fn a_leave_below_min_is_refused() {
        let mut m = RangeMaster::new(3, 2);
        m.formed(&[8, 10]);
        assert_eq!(
            m.server_leaving(8, 2),
            Err(LeaveRefused::TooFew { min: 2, staying: 1 })
        );
        assert_eq!(m.server_leaving(12, 1), Err(LeaveRefused::NotLive));
        assert_eq!(m.server_leaving(8, 1), Ok(true));
        assert_eq!(
            m.server_leaving(10, 1),
            Err(LeaveRefused::TooFew { min: 1, staying: 0 }),
            "the other is leaving already"
        );
        // Both were replicas of every range: no copy is needed.
        assert_eq!(replicas(&m), vec![vec![10], vec![10], vec![10]]);
        assert_eq!(m.take_left(), vec![8]);
    }

    #[test]
    fn a_leaver_whose_successor_dies_keeps_its_ranges() {
        let mut m = RangeMaster::new(2, 1);
        m.formed(&[8, 10]);
        assert_eq!(m.server_leaving(8, 1), Ok(true));
        assert_eq!(joining(&m), vec![vec![10], vec![]]);
        m.server_dead(10);
        // Nobody else is live: the leaver keeps its range (range 1 died
        // with its only copy).
        assert_eq!(replicas(&m), vec![vec![8], vec![]]);
        assert!(m.take_left().is_empty());
        // A joiner (with the dead one's id) takes it over; then the leaver
        // may go.
        m.server_live(10);
        assert_eq!(joining(&m), vec![vec![10], vec![]]);
        assert!(m.ready(8, 0, 10, m.map().version));
        assert_eq!(replicas(&m), vec![vec![10], vec![]]);
        assert_eq!(m.take_left(), vec![8]);
    }

    #[test]
    fn with_every_server_a_replica_a_death_needs_no_copy() {
        let mut m = RangeMaster::new(2, 2);
        m.formed(&[8, 10]);
        m.server_dead(10);
        assert_eq!(replicas(&m), vec![vec![8], vec![8]]);
        assert!(joining(&m).iter().all(Vec::is_empty));
        m.server_dead(8);
        assert_eq!(replicas(&m), vec![Vec::<NodeId>::new(), vec![]]);
        assert!(!m.server_dead(8), "twice is no change");
    }
}
