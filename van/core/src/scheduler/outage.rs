//! The scheduler's own outage: when it hears from (almost) none of the
//! nodes that send heartbeats at once, for longer than a heartbeat period
//! and a quarter, the silence is its own (its link is down, its host is cut
//! off, its packets wait in TCP's retransmission backoff), not theirs. No
//! node is declared dead for its silence meanwhile; when the nodes are
//! heard again, every live node's clock restarts (a fresh heartbeat
//! timeout), so the ones whose messages come back last, after TCP's
//! backoff, are not failed for the scheduler's outage either. A single
//! node that falls silent while the others keep talking is failed on time,
//! as before.
//!
//! The outage is excused for as long as the nodes excuse a silent
//! scheduler: a node silent for longer than the heartbeat timeout plus
//! `PS_RECOVERY_TIMEOUT` is declared dead even then (and the nodes, hearing
//! no scheduler for as long, give up too: the job ends). A closed
//! connection still counts while the outage lasts (a killed process's
//! kernel closes it; a cut link does not).

use std::time::{Duration, Instant};

use log::warn;

use super::Scheduler;

impl Scheduler {
    /// How long (almost) every node must be silent at once for the silence
    /// to count as the scheduler's own: a heartbeat period and a quarter
    /// (every node sends one per period), so that nodes stopped or cut off
    /// one by one never look like it. `None` without heartbeats (silence is
    /// then no sign of anything) or without a heartbeat timeout.
    fn outage_gap(&self) -> Option<Duration> {
        self.cfg.van.heartbeat_timeout?;
        let interval = self.cfg.van.heartbeat_interval?;
        Some(interval + interval / 4)
    }

    /// The last time each node that sends heartbeats, alive and in the
    /// job, was heard; and how many of them must be silent at once for an
    /// outage: all of them, but one in eight (so that a node of the
    /// scheduler's own host, still heard over loopback, does not hide it).
    /// `None` with fewer than two such nodes (one node's silence is its
    /// own).
    fn outage_watch(&self) -> Option<(Vec<Instant>, usize)> {
        self.outage_gap()?;
        if !self.ready {
            return None;
        }
        let seen: Vec<Instant> = self
            .processes()
            .into_iter()
            .filter(|id| self.heartbeating.contains(id))
            .filter(|id| !self.dead_since.contains_key(id) && !self.left.contains(id))
            .filter_map(|id| self.last_seen.get(&id).copied())
            .collect();
        if seen.len() < 2 {
            return None;
        }
        let need = seen.len() - seen.len() / 8;
        Some((seen, need))
    }

    /// Whether (almost) every node has been silent for longer than the
    /// outage gap at `now`.
    fn nobody_heard(&self, now: Instant) -> bool {
        let (Some(gap), Some((seen, need))) = (self.outage_gap(), self.outage_watch()) else {
            return false;
        };
        let silent = seen
            .iter()
            .filter(|&&t| now.saturating_duration_since(t) > gap)
            .count();
        silent >= need
    }

    /// When the scheduler will have heard nobody for the outage gap, if
    /// nothing arrives before (a deadline for [`Scheduler::on_tick`]); `None`
    /// while an outage lasts (the nodes' longer silence deadlines stand).
    pub(super) fn outage_timeout(&self) -> Option<Instant> {
        if self.outage.is_some() {
            return None;
        }
        let gap = self.outage_gap()?;
        let (mut seen, need) = self.outage_watch()?;
        // `need` of them are silent once the need-th oldest is.
        let (_, &mut oldest, _) = seen.select_nth_unstable(need - 1);
        Some(oldest + gap + Duration::from_millis(1))
    }

    /// Notices the scheduler's outage beginning (nobody heard for the gap)
    /// or ending (the nodes heard again: every live node's clock restarts
    /// at `now`). Called on every tick and on every message from a node.
    pub(super) fn watch_outage(&mut self, now: Instant) {
        let quiet = self.nobody_heard(now);
        match (self.outage, quiet) {
            (None, true) => {
                warn!(
                    "scheduler: heard from (almost) no node for more than {} ms: taking it for \
                     this scheduler's own outage (its link or host cut off), not theirs; no \
                     node is declared dead for its silence until they are heard again, unless \
                     silent for {} s more than the heartbeat timeout (PS_RECOVERY_TIMEOUT)",
                    self.outage_gap().unwrap_or_default().as_millis(),
                    self.cfg.van.recovery_timeout.as_secs()
                );
                self.outage = Some(now);
            }
            (Some(since), false) => {
                self.outage = None;
                for (id, seen) in self.last_seen.iter_mut() {
                    if !self.dead_since.contains_key(id) {
                        *seen = (*seen).max(now);
                    }
                }
                warn!(
                    "scheduler: hears the nodes again after about {} ms of its own outage: every \
                     node's heartbeat timeout starts again now",
                    now.saturating_duration_since(since).as_millis()
                );
            }
            _ => {}
        }
    }

    /// How long a node may be silent at `now` before it is dead: the
    /// heartbeat timeout, or in this scheduler's own outage (or at the
    /// start of one its next tick notices) that plus the recovery timeout
    /// (as long as the nodes call a silent scheduler before they give it
    /// up).
    pub(super) fn silence_allowed(&self, timeout: Duration, now: Instant) -> Duration {
        if self.outage.is_some() || self.nobody_heard(now) {
            timeout + self.cfg.van.recovery_timeout
        } else {
            timeout
        }
    }
}
