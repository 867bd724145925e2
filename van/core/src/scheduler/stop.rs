//! A job the scheduler stops: every node is told why before the scheduler
//! exits, so that none waits for a timeout with nothing said.
//!
//! - **Refused at start** ([`Scheduler::refuse_job`]: its checkpoint
//!   directory cannot be resumed, say). The cluster never forms: each
//!   process that registers is told at once (a LEAVE carrying its own entry
//!   and key, so a node that has not joined knows it comes from the
//!   scheduler it registered with, and the reason, PBControl field 104).
//!   The scheduler fails with the reason once the processes of the whole
//!   job were told and have left (their connections closed), at most
//!   [`STOP_GRACE`] after the last was told, or at the refusal's deadline
//!   if some never register.
//! - **Stopped later** (a key range with no replica left): every live
//!   pslite process is told at once, and the scheduler fails once they have
//!   left, at most [`STOP_GRACE`] later.
//!
//! A node told fails with [`Failure::JobStopped`]. C++ nodes cannot be told
//! (LEAVE is pslite's); they find the scheduler gone.

use std::time::{Duration, Instant};

use log::{error, warn};
use pslite_proto::ids::NodeId;
use pslite_proto::{Command, Message, Node};

use super::Scheduler;
use crate::effects::{Effect, Effects};
use crate::error::Failure;

/// How long a scheduler that told every node the job stops waits for them
/// to leave before it fails anyway.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// The ids given to processes told at start (the cluster never formed, so
/// they have none): far above any id a node can have.
const TOLD_IDS: NodeId = 1_000_000_000;

/// The scheduler's state once it stops the job.
pub(super) struct Stopping {
    why: String,
    /// The processes told, with the ids their connections have.
    told: Vec<Node>,
    /// Refused at start: registrations are answered until then.
    until: Option<Instant>,
    /// When the scheduler fails at the latest, once every process was told.
    fail_at: Option<Instant>,
    /// The scheduler failed (with `why`).
    failed: bool,
}

impl Scheduler {
    /// This scheduler cannot start the job (`why`): it forms no cluster,
    /// tells each process that registers why, and fails with `why` once the
    /// whole job was told and left, or at `now + wait` (some never
    /// registered).
    pub fn refuse_job(&mut self, why: String, now: Instant, wait: Duration) {
        error!(
            "scheduler: {why}; the job stops: each node that registers within {} s is told why",
            wait.as_secs()
        );
        self.stopping = Some(Stopping {
            why,
            told: Vec::new(),
            until: Some(now + wait),
            fail_at: None,
            failed: false,
        });
    }

    /// Whether the job stops (refused at start, or stopped since).
    pub fn is_stopping(&self) -> bool {
        self.stopping.is_some()
    }

    /// Stops the job (`why`): every live pslite process is told at once.
    pub(super) fn stop_job(&mut self, why: &str, now: Instant, fx: &mut Effects) {
        if self.stopping.is_some() {
            return;
        }
        error!("scheduler: {why}; the job stops: telling every node");
        let told: Vec<Node> = self
            .process_nodes()
            .into_iter()
            .filter(|n| n.pslite && !self.is_dead(n.id, now))
            .cloned()
            .collect();
        for n in &told {
            fx.send(leave(n, why));
        }
        self.stopping = Some(Stopping {
            why: why.to_string(),
            told,
            until: None,
            fail_at: Some(now + STOP_GRACE),
            failed: false,
        });
    }

    /// A registration while the job stops: the process is told why (once).
    pub(super) fn tell_registered(&mut self, node: &Node, now: Instant, fx: &mut Effects) {
        let everyone = (self.cfg.van.num_servers + self.cfg.van.num_workers).max(1) as usize;
        let Some(s) = &mut self.stopping else {
            return;
        };
        if s.failed || s.told.iter().any(|n| n.same_process(node)) {
            return;
        }
        let mut entry = node.clone();
        entry.id = TOLD_IDS + s.told.len() as NodeId;
        if node.pslite {
            warn!(
                "scheduler: telling {} ({}) that the job stops",
                node.address(),
                node.role
            );
            fx.push(Effect::Connect(entry.clone()));
            fx.send(leave(&entry, &s.why));
        } else {
            // LEAVE is pslite's: a C++ node finds the scheduler gone.
            warn!(
                "scheduler: {} ({}) is a C++ ps-lite node: it cannot be told that the job stops",
                node.address(),
                node.role
            );
        }
        s.told.push(entry);
        if s.told.len() >= everyone && s.fail_at.is_none() {
            s.fail_at = Some(now + STOP_GRACE);
        }
    }

    /// Whether every process told has left (its connection closed, or it
    /// is dead).
    fn told_have_left(&self, now: Instant) -> bool {
        self.stopping.as_ref().is_some_and(|s| {
            s.told.iter().all(|n| {
                self.disconnected.contains_key(&n.id) || (self.ready && self.is_dead(n.id, now))
            })
        })
    }

    /// Clock-driven work of a job that stops: the scheduler fails once
    /// every process told has left, or at the deadline.
    pub(super) fn stopping_tick(&mut self, now: Instant, fx: &mut Effects) {
        let left = self.told_have_left(now);
        let Some(s) = &mut self.stopping else {
            return;
        };
        if s.failed {
            return;
        }
        let all_told = s.fail_at.is_some();
        let due = (all_told && (left || s.fail_at.is_some_and(|t| now >= t)))
            || s.until.is_some_and(|t| now >= t);
        if !due {
            return;
        }
        s.failed = true;
        fx.push(Effect::Fail(Failure::JobStopped {
            reason: s.why.clone(),
        }));
    }

    /// When [`Scheduler::stopping_tick`] has work next: at once if every
    /// process told has left.
    pub(super) fn stopping_timeout(&self) -> Option<Instant> {
        let s = self.stopping.as_ref().filter(|s| !s.failed)?;
        if let Some(at) = s.fail_at {
            if self.disconnected.len() >= s.told.len() && self.told_left_now() {
                return Some(at - STOP_GRACE);
            }
        }
        [s.fail_at, s.until].into_iter().flatten().min()
    }

    /// [`Scheduler::told_have_left`] by closed connections alone (no clock).
    fn told_left_now(&self) -> bool {
        self.stopping
            .as_ref()
            .is_some_and(|s| s.told.iter().all(|n| self.disconnected.contains_key(&n.id)))
    }
}

/// The LEAVE that tells `node` the job stops and why: its own entry (with
/// its key) proves the scheduler it registered with sent it.
fn leave(node: &Node, why: &str) -> Message {
    let mut msg = Message::control(Command::Leave, node.id);
    msg.meta.control.node = vec![node.clone()];
    msg.meta.control.stop = Some(why.to_string());
    msg
}
