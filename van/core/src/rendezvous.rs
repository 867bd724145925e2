//! Elastic worker rounds (torch elastic's dynamic rendezvous, on the
//! scheduler), as a state machine with no sockets and no clock. The
//! [`crate::Scheduler`] drives it in elastic mode (`DMLC_NUM_WORKER=MIN:MAX`).
//!
//! Workers join; a round *forms* until it may begin, then *runs*:
//! - the first round begins at once when `max` workers have joined, or when
//!   at least `min` have and the last call (`PS_RDZV_LAST_CALL`) since the
//!   `min`-th joined has passed; workers joining during the last call are in;
//!   a later round begins as soon as it has `min` workers (the job is
//!   stalled meanwhile: survivors wait at a barrier), with everyone waiting;
//! - while a round runs, joiners wait for the next one; the caller ends the
//!   round for them at a safe point ([`Rendezvous::admit_waiting`], say at
//!   a barrier of the round's members);
//! - a member that dies or leaves ends the running round; the next one forms
//!   with the survivors (in their old order), and ranks them 0..n-1 by
//!   position; the waiting workers stay waiting for a safe point, unless the
//!   survivors are fewer than `min`: then they are taken in too;
//! - a round that stays below `min` for longer than the timeout
//!   (`PS_RDZV_TIMEOUT`, counted from when it started forming) fails for
//!   good, saying how many workers it had.

use std::time::{Duration, Instant};

use pslite_proto::NodeId;

/// The bounds and periods of elastic rounds (`DMLC_NUM_WORKER=MIN:MAX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RendezvousConfig {
    /// Fewest workers a round may run with.
    pub min: usize,
    /// Most workers a round may run with.
    pub max: usize,
    /// How long a round with at least `min` (but fewer than `max`) workers
    /// waits for more before it begins (`PS_RDZV_LAST_CALL`).
    pub last_call: Duration,
    /// How long a round may stay below `min` before the job fails
    /// (`PS_RDZV_TIMEOUT`).
    pub timeout: Duration,
}

/// Why a running round ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// This member died or left.
    Left(NodeId),
    /// Workers waited to join (admitted at a safe point).
    Joiners(Vec<NodeId>),
}

/// Something the scheduler must act on (tell the workers, fail the job).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RendezvousEvent {
    /// Round `number` began with `members`; a member's rank is its index.
    RoundBegan {
        /// The round number: 0 for the first round, then 1, 2, ...
        number: u64,
        /// The round's workers in rank order.
        members: Vec<NodeId>,
    },
    /// Round `number` stopped running; the next one is forming.
    RoundEnded {
        /// The round that ended.
        number: u64,
        /// Why.
        reason: EndReason,
    },
    /// The forming round stayed below `min` until the timeout: the job
    /// cannot go on.
    Failed {
        /// Workers the round had.
        have: usize,
        /// Workers it needed.
        min: usize,
        /// How long it waited.
        waited: Duration,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Collecting workers since `since`; with enough for a round, it
    /// begins at `last_call_at`.
    Forming {
        since: Instant,
        last_call_at: Option<Instant>,
    },
    /// Round `number` runs.
    Running { number: u64 },
    /// Failed for good.
    Failed,
}

/// The rounds of one job's elastic workers. See the module docs.
pub struct Rendezvous {
    cfg: RendezvousConfig,
    phase: Phase,
    next_round: u64,
    /// Forming: the round's workers so far; running: its members by rank.
    members: Vec<NodeId>,
    /// Workers that joined while a round ran, in order, for the next round.
    waiting: Vec<NodeId>,
}

impl Rendezvous {
    /// The first round, forming from `now`. `min` is at least 1 and `max`
    /// at least `min` (the configuration parser checks it; here they are
    /// clamped so).
    pub fn new(cfg: RendezvousConfig, now: Instant) -> Rendezvous {
        let min = cfg.min.max(1);
        Rendezvous {
            cfg: RendezvousConfig {
                min,
                max: cfg.max.max(min),
                ..cfg
            },
            phase: Phase::Forming {
                since: now,
                last_call_at: None,
            },
            next_round: 0,
            members: Vec::new(),
            waiting: Vec::new(),
        }
    }

    /// The running round's number and members in rank order, if one runs.
    pub fn round(&self) -> Option<(u64, &[NodeId])> {
        match self.phase {
            Phase::Running { number } => Some((number, &self.members)),
            _ => None,
        }
    }

    /// The rank of `id` in the running round.
    pub fn rank(&self, id: NodeId) -> Option<usize> {
        self.round()?.1.iter().position(|&m| m == id)
    }

    /// Workers waiting for the next round.
    pub fn waiting(&self) -> &[NodeId] {
        &self.waiting
    }

    /// Whether the job failed (too few workers for too long).
    pub fn has_failed(&self) -> bool {
        self.phase == Phase::Failed
    }

    /// When [`Rendezvous::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let Phase::Forming {
            since,
            last_call_at,
        } = self.phase
        else {
            return None;
        };
        if self.members.len() >= self.cfg.min {
            last_call_at
        } else {
            Some(since + self.cfg.timeout)
        }
    }

    /// Worker `id` joins: into the forming round, or onto the wait list
    /// while a round runs. Joining twice changes nothing.
    pub fn join(&mut self, id: NodeId, now: Instant) -> Vec<RendezvousEvent> {
        if self.members.contains(&id) || self.waiting.contains(&id) {
            return Vec::new();
        }
        match self.phase {
            Phase::Failed => Vec::new(),
            Phase::Running { .. } => {
                self.waiting.push(id);
                Vec::new()
            }
            Phase::Forming { .. } => {
                self.members.push(id);
                self.evaluate(now)
            }
        }
    }

    /// Worker `id` died or left: off the wait list, out of the forming
    /// round, or the end of the running round.
    pub fn leave(&mut self, id: NodeId, now: Instant) -> Vec<RendezvousEvent> {
        self.waiting.retain(|&w| w != id);
        let Some(pos) = self.members.iter().position(|&m| m == id) else {
            return Vec::new();
        };
        self.members.remove(pos);
        match self.phase {
            Phase::Running { number } => self.end_round(number, EndReason::Left(id), now),
            Phase::Forming { .. } => self.evaluate(now),
            Phase::Failed => Vec::new(),
        }
    }

    /// At a safe point of the running round: if workers wait, ends the
    /// round so that the next one takes them in.
    pub fn admit_waiting(&mut self, now: Instant) -> Vec<RendezvousEvent> {
        match self.phase {
            // A full round has no place for them: they wait on, and the
            // round goes on unchanged (no new round of the same members).
            Phase::Running { number }
                if !self.waiting.is_empty() && self.members.len() < self.cfg.max =>
            {
                let joiners = self.waiting.clone();
                self.end_round(number, EndReason::Joiners(joiners), now)
            }
            _ => Vec::new(),
        }
    }

    /// Clock-driven work at `now`: a last call that ended, a timeout.
    pub fn tick(&mut self, now: Instant) -> Vec<RendezvousEvent> {
        match self.phase {
            Phase::Forming { .. } => self.evaluate(now),
            _ => Vec::new(),
        }
    }

    fn end_round(&mut self, number: u64, reason: EndReason, now: Instant) -> Vec<RendezvousEvent> {
        let joiners = matches!(reason, EndReason::Joiners(_));
        if joiners || self.members.len() < self.cfg.min {
            self.members.append(&mut self.waiting);
        }
        self.phase = Phase::Forming {
            since: now,
            last_call_at: None,
        };
        let mut events = vec![RendezvousEvent::RoundEnded { number, reason }];
        events.extend(self.evaluate(now));
        events
    }

    /// Begins the forming round if it may, or fails it if it waited too long.
    fn evaluate(&mut self, now: Instant) -> Vec<RendezvousEvent> {
        let Phase::Forming {
            since,
            last_call_at,
        } = self.phase
        else {
            return Vec::new();
        };
        let have = self.members.len();
        if have >= self.cfg.max {
            return self.begin();
        }
        if have >= self.cfg.min && self.next_round > 0 {
            return self.begin();
        }
        if have >= self.cfg.min {
            let at = last_call_at.unwrap_or(now + self.cfg.last_call);
            self.phase = Phase::Forming {
                since,
                last_call_at: Some(at),
            };
            return if now >= at { self.begin() } else { Vec::new() };
        }
        self.phase = Phase::Forming {
            since,
            last_call_at: None,
        };
        let waited = now.saturating_duration_since(since);
        if waited >= self.cfg.timeout {
            self.phase = Phase::Failed;
            return vec![RendezvousEvent::Failed {
                have,
                min: self.cfg.min,
                waited,
            }];
        }
        Vec::new()
    }

    fn begin(&mut self) -> Vec<RendezvousEvent> {
        // More than max joined: the last ones wait for the next round.
        let extra = self.members.split_off(self.members.len().min(self.cfg.max));
        self.waiting.splice(0..0, extra);
        let number = self.next_round;
        self.next_round += 1;
        self.phase = Phase::Running { number };
        vec![RendezvousEvent::RoundBegan {
            number,
            members: self.members.clone(),
        }]
    }
}

#[cfg(test)]
mod tests;
