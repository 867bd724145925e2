//! Liveness: heartbeats to the scheduler, its loss (silence, or a
//! connection that stays closed), the nodes it declares dead and those
//! nothing replaced in time, and time this node could not hear (deaf, or
//! stopped) held against nobody.
//!
//! A scheduler silent for longer than the heartbeat timeout is not given up
//! at once: the node says so, calls it four times per heartbeat interval,
//! and stops only if it stays silent for the recovery timeout more. If it
//! answers meanwhile, the node carries on: the scheduler, which may have
//! declared it dead, takes it back (its next heartbeat registers it again)
//! unless another process took its id (then the node stops, see
//! `Failure::Replaced`). A closed connection that stays closed (the
//! scheduler's process is gone) still ends the node at once.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use log::{info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Role};

use super::{Member, LINK_GRACE, PAUSE_SLACK, WAIT_LOG_INTERVAL};

/// The shortest gap between heartbeats to a scheduler that does not
/// answer.
const MIN_HEARTBEAT_GAP: Duration = Duration::from_millis(10);
use crate::effects::{Effect, Event};
use crate::error::Failure;

impl Member {
    /// Something arrived from node `sender`.
    pub fn heard_from(&mut self, sender: NodeId, now: Instant) {
        if sender == SCHEDULER {
            if self.scheduler_silent {
                self.scheduler_silent = false;
                info!(
                    "the scheduler answers again after {:.1} s of silence: carrying on",
                    now.saturating_duration_since(self.last_scheduler_contact)
                        .as_secs_f64()
                );
            }
            self.last_scheduler_contact = now;
        }
    }

    /// When the scheduler was last heard from.
    pub fn last_scheduler_contact(&self) -> Instant {
        self.last_scheduler_contact
    }

    /// This node's connection to the scheduler came up (`up`) or closed.
    pub fn scheduler_link(&mut self, up: bool, now: Instant) {
        if up {
            self.scheduler_closed = None;
        } else {
            self.scheduler_closed.get_or_insert(now);
        }
    }

    /// When the scheduler counts as gone if its closed connection stays
    /// closed (watched as its heartbeats are).
    pub(super) fn scheduler_gone_at(&self) -> Option<Instant> {
        let since = self.scheduler_closed?;
        self.scheduler_timeout()?;
        Some(since + LINK_GRACE)
    }

    /// The scheduler's HEARTBEAT (the answer to ours): it is alive, and (a
    /// pslite scheduler) these nodes are dead now.
    pub fn on_scheduler_heartbeat(&mut self, dead: &[NodeId], now: Instant) {
        self.scheduler_answers = true;
        self.on_dead_nodes(dead, now);
    }

    /// The members the scheduler declared dead, in id order.
    pub(super) fn declared_dead(&self) -> Vec<NodeId> {
        let mut dead: Vec<NodeId> = self.dead.keys().copied().collect();
        dead.sort_unstable();
        dead
    }

    /// The scheduler says these nodes are dead now (pslite schedulers only).
    pub(super) fn on_dead_nodes(&mut self, dead: &[NodeId], now: Instant) {
        let dead: HashSet<NodeId> = dead.iter().copied().collect();
        self.dead.retain(|id, _| dead.contains(id));
        self.given_up.retain(|id| dead.contains(id));
        for id in dead {
            if id != self.me.id && self.is_member(id) && !self.dead.contains_key(&id) {
                if self.servers_replicated && ids::role_of_id(id) == Some(Role::Server) {
                    warn!(
                        "the scheduler declared server {id} dead: its key ranges fail over to \
                         their other replicas"
                    );
                } else {
                    warn!(
                        "the scheduler declared node {id} dead: waiting up to {} s for a \
                         replacement (PS_RECOVERY_TIMEOUT)",
                        self.cfg.van.recovery_timeout.as_secs()
                    );
                }
                self.dead.insert(id, now);
            }
        }
    }

    /// Key ranges are replicated (the scheduler's table carried a range
    /// map): a dead server's ranges fail over.
    pub fn set_servers_replicated(&mut self) {
        self.servers_replicated = true;
    }

    /// This node stops reading what arrives (`deaf`), or reads again: the
    /// time it spent deaf does not count as anyone's silence (the scheduler
    /// is not taken for lost, nodes declared dead get that long more to be
    /// replaced).
    pub fn set_deaf(&mut self, deaf: bool, now: Instant) {
        match (deaf, self.deaf_since) {
            (true, None) => self.deaf_since = Some(now),
            (false, Some(since)) => {
                self.deaf_since = None;
                let d = now.saturating_duration_since(since);
                self.last_scheduler_contact += d;
                for since in self.dead.values_mut() {
                    *since += d;
                }
            }
            _ => {}
        }
    }

    /// Clock-driven work: the start deadline and its log lines,
    /// heartbeats, a silent scheduler, dead nodes that stay
    /// unreplaced.
    pub fn tick(&mut self, now: Instant) -> Vec<Effect> {
        let mut actions = Vec::new();
        if let Some(due) = self.poll_timeout() {
            let late = now.saturating_duration_since(due);
            if late > PAUSE_SLACK && self.joined && self.failure.is_none() {
                self.resumed(late, now);
            }
        }
        if let Some(j) = &mut self.joining {
            if now >= j.deadline {
                let waited = now - j.since;
                self.joining = None;
                self.timed_out = Some(waited);
                if !self.joined {
                    actions.push(Effect::Changed);
                }
                return actions;
            }
            if now >= j.next_log {
                j.next_log = now + WAIT_LOG_INTERVAL;
                actions.push(Effect::Event(Event::Waiting {
                    waited: now - j.since,
                    limit: self.cfg.van.start_timeout,
                }));
            }
        }
        if !self.joined || self.failure.is_some() {
            return actions;
        }
        if self.me.role != Role::Scheduler {
            if let (Some(interval), Some(next)) =
                (self.cfg.van.heartbeat_interval, self.next_heartbeat)
            {
                if now >= next {
                    // Unanswered (the last answer is older than an
                    // interval): call again sooner.
                    let silent = now.saturating_duration_since(self.last_scheduler_contact);
                    let gap = if silent > interval {
                        (interval / 4).max(MIN_HEARTBEAT_GAP)
                    } else {
                        interval
                    };
                    self.next_heartbeat = Some(now + gap);
                    let mut msg = Message::control(Command::Heartbeat, SCHEDULER);
                    msg.meta.control.node.push(self.me.clone());
                    actions.push(Effect::Send(msg));
                }
            }
            if self.scheduler_gone_at().is_some_and(|at| now >= at) {
                actions.extend(self.fail(Failure::SchedulerClosed {
                    address: self.cfg.scheduler.address(),
                }));
                return actions;
            }
            if let Some(timeout) = self
                .scheduler_timeout()
                .filter(|_| self.deaf_since.is_none())
            {
                let silent = now.saturating_duration_since(self.last_scheduler_contact);
                let recovery = self.cfg.van.recovery_timeout;
                if silent > timeout + recovery {
                    actions.extend(self.fail(Failure::SchedulerLost {
                        address: self.cfg.scheduler.address(),
                        silent_secs: silent.as_secs(),
                        timeout_secs: timeout.as_secs(),
                        recovery_secs: recovery.as_secs(),
                    }));
                    return actions;
                }
                if silent > timeout && !self.scheduler_silent {
                    self.scheduler_silent = true;
                    warn!(
                        "nothing heard from the scheduler at {} for {:.1} s (PS_HEARTBEAT_TIMEOUT                          is {} s): still calling it; this node stops if it stays silent for {} s                          more (PS_RECOVERY_TIMEOUT)",
                        self.cfg.scheduler.address(),
                        silent.as_secs_f64(),
                        timeout.as_secs(),
                        recovery.as_secs()
                    );
                    if self.next_heartbeat.is_some() {
                        self.next_heartbeat = Some(now);
                    }
                }
            }
        }
        let listening = self.deaf_since.is_none();
        for (&id, &since) in &self.dead {
            if listening && now >= since + self.cfg.van.recovery_timeout && self.given_up.insert(id)
            {
                warn!(
                    "node {id} was declared dead {} s ago and nothing replaced it: what waits \
                     on it fails",
                    now.saturating_duration_since(since).as_secs()
                );
                actions.push(Effect::Changed);
                actions.push(Effect::Event(Event::PeerDead(id)));
            }
        }
        actions
    }

    /// This process was stopped for about `paused` (its clock jumped): the
    /// scheduler's silence and the recovery windows of dead peers do not
    /// count that time, and a heartbeat goes out at once so the scheduler
    /// learns this node is back (it may have been declared dead meanwhile;
    /// unless something replaced it, the scheduler takes it back).
    pub(super) fn resumed(&mut self, paused: Duration, now: Instant) {
        warn!(
            "this process was stopped for about {} s (its clock jumped: SIGSTOP, a VM pause, \
             a debugger or swapping); not holding that time against its peers",
            paused.as_secs()
        );
        self.last_scheduler_contact = (self.last_scheduler_contact + paused).min(now);
        for since in self.dead.values_mut() {
            *since = (*since + paused).min(now);
        }
        if self.next_heartbeat.is_some() {
            self.next_heartbeat = Some(now);
        }
    }

    /// When [`Member::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if let Some(j) = &self.joining {
            consider(j.deadline.min(j.next_log));
        }
        if self.joined && self.failure.is_none() && self.me.role != Role::Scheduler {
            if let Some(t) = self.next_heartbeat {
                consider(t);
            }
            if let Some(timeout) = self
                .scheduler_timeout()
                .filter(|_| self.deaf_since.is_none())
            {
                let slack = Duration::from_millis(1);
                if !self.scheduler_silent {
                    consider(self.last_scheduler_contact + timeout + slack);
                }
                let recovery = self.cfg.van.recovery_timeout;
                consider(self.last_scheduler_contact + timeout + recovery + slack);
            }
            if let Some(at) = self.scheduler_gone_at() {
                consider(at + Duration::from_millis(1));
            }
        }
        // As in tick: a failed node gives up on nobody (it gave up), nor
        // does a deaf one.
        if self.joined && self.failure.is_none() && self.deaf_since.is_none() {
            for (id, &since) in &self.dead {
                if !self.given_up.contains(id) {
                    consider(since + self.cfg.van.recovery_timeout);
                }
            }
        }
        next
    }

    /// After how much silence the scheduler counts as lost, if it is
    /// watched: always when the timeout was set; by default only while this
    /// node sends heartbeats and the scheduler has answered one.
    pub(super) fn scheduler_timeout(&self) -> Option<Duration> {
        let answers = self.scheduler_answers && self.cfg.van.heartbeat_interval.is_some();
        self.cfg
            .van
            .heartbeat_timeout
            .filter(|_| self.cfg.van.watch_all || answers)
    }

    /// Nodes the scheduler declared dead that nothing replaced in time.
    pub fn given_up(&self) -> &HashSet<NodeId> {
        &self.given_up
    }
}
