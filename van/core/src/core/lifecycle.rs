//! A node's lifecycle, which belongs to no one component: reading or not
//! (a full app queue, a stalled driver: the time spent deaf is nobody's
//! silence), failing, leaving once the last barrier is released, and
//! stopping after the exit drain (what it sent given time to be
//! acknowledged).

use std::time::{Duration, Instant};

use log::{debug, warn};
use pslite_proto::ids::SCHEDULER;
use pslite_proto::store::StoreOp;
use pslite_proto::{Command, Message, NodeId};

use super::parts::Origin;
use super::Core;
use crate::effects::{Event, Output};
use crate::error::Failure;

/// The exit drain: a stopping node gives what it sent time to be
/// acknowledged (the scheduler's last barrier release, say), up to 15 resend
/// timeouts and at most [`MAX_DRAIN`].
pub(super) struct Drain {
    started: Instant,
    pub(super) deadline: Instant,
    pub(super) outcome: Option<DrainOutcome>,
}

/// The longest exit drain.
pub const MAX_DRAIN: Duration = Duration::from_secs(30);
/// Resend timeouts an exit drain lasts at most.
pub const DRAIN_RESEND_TIMEOUTS: u32 = 15;
/// How long a scheduler that released the last barrier waits, before it
/// closes its sockets, for the nodes to leave (their connections to close):
/// a node that has not read the release yet when the scheduler's
/// connection closes would take that for a lost scheduler (a hundred nodes
/// on a loaded machine: a node can wait a second for the CPU).
pub const LEAVE_LAST: Duration = Duration::from_secs(5);

/// How a stopping node's exit drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Nothing worth waiting for is unacknowledged.
    Flushed,
    /// The drain's deadline passed with these messages unacknowledged
    /// (described for logs).
    GaveUp {
        /// How long it waited.
        waited: Duration,
        /// What it waited for.
        left: Vec<String>,
    },
    /// The node failed meanwhile: nothing is worth waiting for.
    Failed,
}

/// The UNWATCH a finalizing node sends ([`Core::store_leave`]): not worth
/// waiting for at exit (the scheduler may be stopping too; a scheduler that
/// stays drops the watches when the node is declared dead).
fn is_leaving_unwatch(msg: &Message) -> bool {
    msg.meta.control.cmd == Command::Store
        && msg
            .meta
            .store
            .as_ref()
            .is_some_and(|s| s.op == StoreOp::Unwatch && s.keys.is_empty())
}

impl Core {
    /// The app is finalizing this node: its next barrier is the last. Once
    /// the scheduler releases it, everyone leaves: from then on a peer's
    /// closed connection is no death and the scheduler's is no loss (a node
    /// slow to stop must not fail because the scheduler was quicker), and
    /// what closed before is forgotten. Heartbeats still notice a peer that
    /// hangs. (Apps such as ps-lite's servers wait in that barrier for the
    /// whole job: until the release, deaths count as ever.)
    pub fn finalizing(&mut self) {
        self.finalize_pending = true;
    }

    /// The last barrier was released (or this server left the job): see
    /// [`Core::finalizing`].
    pub(super) fn leaving(&mut self, now: Instant) {
        self.finalizing = true;
        self.parts.liveness.scheduler_link(true, now);
        if let Some(s) = &mut self.parts.scheduler {
            s.forget_closed_links();
        }
    }

    /// The node is about to stop (finalized): from now on the clock only
    /// drives resends and the exit drain ([`Core::drain_outcome`]); peers
    /// that exit first are neither declared dead nor taken for a lost
    /// scheduler.
    pub fn finish(&mut self, now: Instant) {
        if self.drain.is_some() {
            return;
        }
        let mut limit = self.cfg.resend_timeout.map_or(Duration::ZERO, |t| {
            t.saturating_mul(DRAIN_RESEND_TIMEOUTS).min(MAX_DRAIN)
        });
        if self.parts.scheduler.is_some() && self.finalizing {
            limit = limit.max(LEAVE_LAST);
        }
        self.drain = Some(Drain {
            started: now,
            deadline: now + limit,
            outcome: None,
        });
        let left = self.unacknowledged_at_exit();
        if !left.is_empty() {
            debug!(
                "stopping once these are acknowledged (up to {:.1} s): {}",
                limit.as_secs_f64(),
                left.join("; ")
            );
        }
        self.check_drain(now);
    }

    /// How the exit drain ended; `None` while it goes on (or before
    /// [`Core::finish`]).
    pub fn drain_outcome(&self) -> Option<&DrainOutcome> {
        self.drain.as_ref().and_then(|d| d.outcome.as_ref())
    }

    /// Ends the exit drain if nothing is left to wait for, or at its
    /// deadline (saying what it waited for).
    pub(super) fn check_drain(&mut self, now: Instant) {
        let failed = self.failure.is_some();
        let flushed =
            !failed && !self.has_unacknowledged_at_exit() && self.nodes_still_here(now).is_empty();
        let left = if !failed && !flushed && self.drain.as_ref().is_some_and(|d| now >= d.deadline)
        {
            self.unacknowledged_at_exit()
        } else {
            Vec::new()
        };
        let Some(drain) = &mut self.drain else {
            return;
        };
        if drain.outcome.is_some() {
            return;
        }
        let outcome = if failed {
            DrainOutcome::Failed
        } else if flushed {
            DrainOutcome::Flushed
        } else if now >= drain.deadline && left.is_empty() {
            // Only nodes that have not left yet: they had their release.
            debug!("stopping while some nodes have not closed their connections yet");
            DrainOutcome::Flushed
        } else if now >= drain.deadline {
            let waited = now.saturating_duration_since(drain.started);
            warn!(
                "stopping after {:.1} s with {} messages unacknowledged (at most {} resend \
                 timeouts and {} s, PS_RESEND_TIMEOUT): {}",
                waited.as_secs_f64(),
                left.len(),
                DRAIN_RESEND_TIMEOUTS,
                MAX_DRAIN.as_secs(),
                left.join("; ")
            );
            DrainOutcome::GaveUp { waited, left }
        } else {
            return;
        };
        drain.outcome = Some(outcome);
        self.changed = true;
    }

    /// Messages still unacknowledged that are worth waiting for at exit,
    /// described for logs: heartbeats are not, nor messages to a peer that
    /// never acknowledged anything (a C++ node without `PS_RESEND`).
    pub fn unacknowledged_at_exit(&self) -> Vec<String> {
        self.waited_for_at_exit().map(crate::describe).collect()
    }

    /// On a scheduler that released the last barrier: the live processes
    /// whose connection has not closed yet (they have not left).
    fn nodes_still_here(&self, now: Instant) -> Vec<NodeId> {
        let Some(s) = self.parts.scheduler.as_ref().filter(|_| self.finalizing) else {
            return Vec::new();
        };
        let dead = s.dead_nodes(now);
        let here: std::collections::BTreeSet<NodeId> = s
            .nodes()
            .iter()
            .map(|n| n.id)
            .filter(|id| *id != SCHEDULER && !dead.contains(id) && !self.left_at_exit.contains(id))
            .collect();
        here.into_iter().collect()
    }

    /// Whether [`Core::unacknowledged_at_exit`] is not empty.
    fn has_unacknowledged_at_exit(&self) -> bool {
        self.waited_for_at_exit().next().is_some()
    }

    fn waited_for_at_exit(&self) -> impl Iterator<Item = &Message> {
        self.parts
            .resender
            .iter()
            .flat_map(|r| r.unacknowledged_to(|id| r.acknowledged_by(id)))
            .filter(|m| m.meta.control.cmd != Command::Heartbeat && !is_leaving_unwatch(m))
    }

    /// Stops the node: every wait ends with [`Failure::Stopped`].
    pub fn stop(&mut self, now: Instant) {
        self.stopped = true;
        self.failed(Failure::Stopped, now);
        self.changed = true;
    }

    /// Fails the node (the receive thread died, say).
    pub fn fail(&mut self, failure: Failure, now: Instant) {
        self.failed(failure, now);
        self.check_drain(now);
    }

    /// The node fails with `failure`, the first time only: the driver is
    /// told, and the components ([`Event::Failed`]: every wait ends).
    fn failed(&mut self, failure: Failure, now: Instant) {
        if self.failure.is_some() {
            return;
        }
        self.failure = Some(failure.clone());
        self.changed = true;
        self.out.push(Output::Failed(failure.clone()));
        self.route_event(Event::Failed(failure), Origin::Core, now);
    }

    /// More than `PS_HOLD_LIMIT` bytes arrived while this server restored a
    /// checkpoint: it cannot go on.
    pub(super) fn restore_overflow(&mut self, now: Instant) {
        self.parts.checkpoints.abandon_restore();
        let failure = Failure::Checkpoint {
            detail: format!(
                "more than PS_HOLD_LIMIT ({} bytes) of requests arrived while this server \
                 restored its checkpoint; raise PS_HOLD_LIMIT",
                self.cfg.hold_limit
            ),
        };
        warn!("{failure}");
        self.failed(failure, now);
    }

    /// The apps could not take these ([`Output::Deliver`], in order, with
    /// what is for them after the first refused one: [`Output::Snapshot`],
    /// [`Output::Restore`]): a customer's queue is full. They wait in the
    /// hold facility, and the driver reads nothing more (ZeroMQ's
    /// high-water marks then hold the senders back) until [`Core::room`];
    /// timers go on.
    pub fn park(&mut self, outputs: Vec<Output>, now: Instant) {
        self.holds.park(outputs);
        self.update_listening(now);
    }

    /// A customer's queue has room again: what the apps refused is handed
    /// over again, in order; what they refuse again comes back through
    /// [`Core::park`].
    pub fn room(&mut self, now: Instant) {
        let parked = self.holds.room();
        self.out.extend(parked);
        self.update_listening(now);
    }

    /// Outputs the apps refused, waiting for room (see [`Core::park`]).
    pub fn parked(&self) -> usize {
        self.holds.parked()
    }

    /// The driver cannot read for a reason of its own (`stalled`), or can
    /// again.
    pub fn set_stalled(&mut self, stalled: bool, now: Instant) {
        self.stalled = stalled;
        self.update_listening(now);
    }

    /// Whether the driver reads what arrives: not while the apps refused
    /// something or the driver is stalled. Meanwhile the node still sends
    /// (heartbeats go on), but nobody's silence counts: it cannot hear them.
    pub fn is_listening(&self) -> bool {
        self.holds.parked() == 0 && !self.stalled
    }

    /// Tells the state machines when the node stops or starts listening:
    /// the time spent deaf counts as nobody's silence, and resends and
    /// give-ups wait (their acknowledgements may be waiting unread).
    fn update_listening(&mut self, now: Instant) {
        let listening = self.is_listening();
        match (listening, self.deaf_since) {
            (false, None) => {
                if self.stalled {
                    debug!("not reading for now: short of file descriptors");
                } else {
                    debug!("not reading for now: an app's queue is full");
                }
                self.deaf_since = Some(now);
                self.parts.liveness.set_deaf(true, now);
                if let Some(s) = &mut self.parts.scheduler {
                    s.set_deaf(true, now);
                }
            }
            (true, Some(since)) => {
                let deaf = now.saturating_duration_since(since);
                debug!("reading again after {:.3} s", deaf.as_secs_f64());
                self.deaf_since = None;
                self.parts.liveness.set_deaf(false, now);
                if let Some(s) = &mut self.parts.scheduler {
                    s.set_deaf(false, now);
                }
                if let Some(r) = &mut self.parts.resender {
                    r.postpone(deaf);
                }
            }
            _ => {}
        }
    }

    /// On the scheduler, the processes it holds dead at `now` (none
    /// elsewhere).
    pub fn declared_dead(&self, now: Instant) -> Vec<NodeId> {
        self.parts
            .scheduler
            .as_ref()
            .map_or_else(Vec::new, |s| s.dead_nodes(now))
    }

    /// Ids of nodes silent for longer than `timeout` (ps-lite's
    /// `GetDeadNodes`): on the scheduler, servers and workers; elsewhere,
    /// the scheduler.
    pub fn dead_nodes(&self, now: Instant, timeout: Duration) -> Vec<NodeId> {
        if let Some(s) = &self.parts.scheduler {
            return s.silent_nodes(now, timeout);
        }
        let silent = now.saturating_duration_since(self.parts.liveness.last_scheduler_contact());
        if silent > timeout {
            vec![SCHEDULER]
        } else {
            Vec::new()
        }
    }
}
