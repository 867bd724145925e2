//! Liveness, a component: heartbeats to the scheduler, its loss (silence,
//! or a connection that stays closed), the nodes it declares dead and
//! those nothing replaced in time, and time this node could not hear
//! (deaf, or stopped) held against nobody.
//!
//! A scheduler silent for longer than the heartbeat timeout is not given up
//! at once: the node says so, calls it four times per heartbeat interval,
//! and stops only if it stays silent for the recovery timeout more. If it
//! answers meanwhile, the node carries on: the scheduler, which may have
//! declared it dead, takes it back (its next heartbeat registers it again)
//! unless another process took its id (then the node stops, see
//! `Failure::Replaced`). A closed connection that stays closed (the
//! scheduler's process is gone) still ends the node at once.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use log::{info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Node, Role};

use super::{LINK_GRACE, PAUSE_SLACK};
use crate::component::{Component, Cx, Facts};
use crate::config::VanConfig;
use crate::effects::Event;
use crate::error::Failure;

/// The shortest gap between heartbeats to a scheduler that does not
/// answer.
const MIN_HEARTBEAT_GAP: Duration = Duration::from_millis(10);

/// What this node knows of who is alive.
pub struct Liveness {
    /// The node's settings (heartbeats, `PS_RECOVERY_TIMEOUT`).
    cfg: VanConfig,
    /// Where the scheduler is (for the errors that say it was lost).
    scheduler: Node,
    /// This node joined ([`Event::Joined`]) and has not failed
    /// ([`Event::Failed`]): only then does it watch anyone.
    joined: bool,
    failed: bool,
    last_scheduler_contact: Instant,
    next_heartbeat: Option<Instant>,
    /// The scheduler has answered a heartbeat (so its silence means loss).
    scheduler_answers: bool,
    /// The scheduler has been silent for longer than the heartbeat
    /// timeout (said once): this node keeps calling it until the recovery
    /// timeout.
    scheduler_silent: bool,
    /// The connection to the scheduler closed, since when (`None`: up).
    scheduler_closed: Option<Instant>,
    /// Nodes the scheduler declared dead, since when; and those already
    /// reported as dead for good.
    dead: HashMap<NodeId, Instant>,
    given_up: HashSet<NodeId>,
    /// Since when this node reads nothing (an app's queue is full): silence
    /// proves nothing meanwhile.
    deaf_since: Option<Instant>,
    /// Key ranges are replicated: a dead server's ranges fail over, nothing
    /// waits for its replacement.
    servers_replicated: bool,
}

impl Liveness {
    /// The liveness of a node configured by `cfg` whose scheduler is
    /// `scheduler`, started at `now`.
    pub fn new(cfg: &VanConfig, scheduler: Node, now: Instant) -> Liveness {
        Liveness {
            cfg: cfg.clone(),
            scheduler,
            joined: false,
            failed: false,
            last_scheduler_contact: now,
            next_heartbeat: None,
            scheduler_answers: false,
            scheduler_silent: false,
            scheduler_closed: None,
            dead: HashMap::new(),
            given_up: HashSet::new(),
            deaf_since: None,
            servers_replicated: false,
        }
    }

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
    fn scheduler_gone_at(&self) -> Option<Instant> {
        let since = self.scheduler_closed?;
        self.scheduler_timeout()?;
        Some(since + LINK_GRACE)
    }

    /// The members the scheduler declared dead, in id order.
    fn declared_dead(&self) -> Vec<NodeId> {
        let mut dead: Vec<NodeId> = self.dead.keys().copied().collect();
        dead.sort_unstable();
        dead
    }

    /// The scheduler says these nodes are dead now (pslite schedulers only).
    fn on_dead_nodes(&mut self, dead: &[NodeId], now: Instant, facts: &dyn Facts) {
        let dead: HashSet<NodeId> = dead.iter().copied().collect();
        self.dead.retain(|id, _| dead.contains(id));
        self.given_up.retain(|id| dead.contains(id));
        for id in dead {
            if id != facts.me().id && facts.node(id).is_some() && !self.dead.contains_key(&id) {
                if self.servers_replicated && ids::role_of_id(id) == Some(Role::Server) {
                    warn!(
                        "the scheduler declared server {id} dead: its key ranges fail over to \
                         their other replicas"
                    );
                } else {
                    warn!(
                        "the scheduler declared node {id} dead: waiting up to {} s for a \
                         replacement (PS_RECOVERY_TIMEOUT)",
                        self.cfg.recovery_timeout.as_secs()
                    );
                }
                self.dead.insert(id, now);
            }
        }
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

    /// Whether this node watches anyone: joined, and not failed.
    fn watching(&self) -> bool {
        self.joined && !self.failed
    }

    /// Heartbeats and the scheduler's silence or closed connection (not on
    /// the scheduler); `true` if the scheduler is lost (the node fails).
    fn watch_scheduler(&mut self, now: Instant, cx: &mut Cx<'_>) -> bool {
        if let (Some(interval), Some(next)) = (self.cfg.heartbeat_interval, self.next_heartbeat) {
            if now >= next {
                // Unanswered (the last answer is older than an interval):
                // call again sooner.
                let silent = now.saturating_duration_since(self.last_scheduler_contact);
                let gap = if silent > interval {
                    (interval / 4).max(MIN_HEARTBEAT_GAP)
                } else {
                    interval
                };
                self.next_heartbeat = Some(now + gap);
                let mut msg = Message::control(Command::Heartbeat, SCHEDULER);
                msg.meta.control.node.push(cx.facts.me().clone());
                cx.send(msg);
            }
        }
        let address = self.scheduler.address();
        if self.scheduler_gone_at().is_some_and(|at| now >= at) {
            cx.fail(Failure::SchedulerClosed { address });
            return true;
        }
        let Some(timeout) = self
            .scheduler_timeout()
            .filter(|_| self.deaf_since.is_none())
        else {
            return false;
        };
        let silent = now.saturating_duration_since(self.last_scheduler_contact);
        let recovery = self.cfg.recovery_timeout;
        if silent > timeout + recovery {
            cx.fail(Failure::SchedulerLost {
                address,
                silent_secs: silent.as_secs(),
                timeout_secs: timeout.as_secs(),
                recovery_secs: recovery.as_secs(),
            });
            return true;
        }
        if silent > timeout && !self.scheduler_silent {
            self.scheduler_silent = true;
            warn!(
                "nothing heard from the scheduler at {address} for {:.1} s (PS_HEARTBEAT_TIMEOUT                          is {} s): still calling it; this node stops if it stays silent for {} s                          more (PS_RECOVERY_TIMEOUT)",
                silent.as_secs_f64(),
                timeout.as_secs(),
                recovery.as_secs()
            );
            if self.next_heartbeat.is_some() {
                self.next_heartbeat = Some(now);
            }
        }
        false
    }

    /// This process was stopped for about `paused` (its clock jumped): the
    /// scheduler's silence and the recovery windows of dead peers do not
    /// count that time, and a heartbeat goes out at once so the scheduler
    /// learns this node is back (it may have been declared dead meanwhile;
    /// unless something replaced it, the scheduler takes it back).
    fn resumed(&mut self, paused: Duration, now: Instant) {
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

    /// After how much silence the scheduler counts as lost, if it is
    /// watched: always when the timeout was set; by default only while this
    /// node sends heartbeats and the scheduler has answered one.
    fn scheduler_timeout(&self) -> Option<Duration> {
        let answers = self.scheduler_answers && self.cfg.heartbeat_interval.is_some();
        self.cfg
            .heartbeat_timeout
            .filter(|_| self.cfg.watch_all || answers)
    }
}

impl Component for Liveness {
    /// The scheduler's HEARTBEAT (the answer to ours): it is alive, and (a
    /// pslite scheduler) these nodes are dead now.
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        let facts = cx.facts;
        if msg.meta.sender != SCHEDULER || !facts.is_joined() {
            return;
        }
        // Only a pslite scheduler sends a dead list; from a C++ one (whose
        // identity carries no key) it is forged.
        let pslite =
            self.cfg.role == Role::Scheduler || facts.node(SCHEDULER).is_some_and(|n| n.pslite);
        let dead: &[NodeId] = if pslite {
            &msg.meta.control.dead_nodes
        } else {
            &[]
        };
        let before = self.declared_dead();
        self.scheduler_answers = true;
        self.on_dead_nodes(dead, now, facts);
        let after = self.declared_dead();
        if after != before {
            cx.event(Event::DeadNodes(after));
        }
    }

    /// Heartbeats, a silent scheduler, dead nodes that stay unreplaced.
    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        if !self.watching() {
            return;
        }
        if let Some(due) = self.poll_timeout() {
            let late = now.saturating_duration_since(due);
            if late > PAUSE_SLACK {
                self.resumed(late, now);
            }
        }
        if self.cfg.role != Role::Scheduler && self.watch_scheduler(now, cx) {
            return;
        }
        let listening = self.deaf_since.is_none();
        for (&id, &since) in &self.dead {
            if listening && now >= since + self.cfg.recovery_timeout && self.given_up.insert(id) {
                warn!(
                    "node {id} was declared dead {} s ago and nothing replaced it: what waits \
                     on it fails",
                    now.saturating_duration_since(since).as_secs()
                );
                cx.changed();
                cx.event(Event::PeerDead(id));
            }
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if !self.watching() {
            return None;
        }
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        if self.cfg.role != Role::Scheduler {
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
                let recovery = self.cfg.recovery_timeout;
                consider(self.last_scheduler_contact + timeout + recovery + slack);
            }
            if let Some(at) = self.scheduler_gone_at() {
                consider(at + Duration::from_millis(1));
            }
        }
        // As in tick: a deaf node gives up on nobody.
        if self.deaf_since.is_none() {
            for (id, &since) in &self.dead {
                if !self.given_up.contains(id) {
                    consider(since + self.cfg.recovery_timeout);
                }
            }
        }
        next
    }

    /// Joined (heartbeats start), failed (they stop), replicated ranges;
    /// a dead node replaced, or gone from the table with a new round.
    fn on_event(&mut self, event: &Event, now: Instant, cx: &mut Cx<'_>) {
        match event {
            Event::Joined => {
                self.joined = true;
                self.last_scheduler_contact = now;
                self.next_heartbeat = self.cfg.heartbeat_interval.map(|_| now);
            }
            Event::Failed(_) => self.failed = true,
            Event::Replicated => self.servers_replicated = true,
            Event::PeerReplaced(id) => {
                self.dead.remove(id);
                self.given_up.remove(id);
            }
            Event::RoundBegan { .. } => {
                let facts = cx.facts;
                self.dead.retain(|id, _| facts.node(*id).is_some());
                self.given_up.retain(|id| facts.node(*id).is_some());
            }
            _ => {}
        }
    }
}
