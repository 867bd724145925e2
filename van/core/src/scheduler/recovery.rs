//! Liveness and recovery: heartbeats answered with the dead list, nodes
//! declared dead by silence or by a connection that stays closed, a node
//! held dead taken back, waiting restarted processes replacing the dead,
//! and time this scheduler could not hear (deaf, or stopped) held against
//! nobody.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use pslite_proto::ids::{self, NodeId};
use pslite_proto::{Command, Message, Node, Role};

use super::Scheduler;
use crate::effects::Effects;
use crate::member::{LINK_GRACE, PAUSE_SLACK};

impl Scheduler {
    /// Clock-driven work at `now`: lets waiting restarted nodes take over
    /// nodes that have died, tells the pslite nodes which nodes are dead,
    /// and fails the barriers that wait for a node dead for longer than the
    /// recovery timeout.
    pub fn on_tick(&mut self, now: Instant, fx: &mut Effects) {
        let mut actions = Effects::default();
        self.run_clock(now, &mut actions);
        self.announce(actions, fx);
    }

    fn run_clock(&mut self, now: Instant, fx: &mut Effects) {
        if self.stopping.is_some() {
            return self.stopping_tick(now, fx);
        }
        if let Some(due) = self.poll_timeout() {
            let late = now.saturating_duration_since(due);
            if late > PAUSE_SLACK {
                self.resumed(late, now);
            }
        }
        if self.deaf_since.is_some() {
            return self.keepalive(now, fx);
        }
        self.elastic_tick(now, fx);
        if !self.ready {
            return;
        }
        self.watch_outage(now);
        for node in std::mem::take(&mut self.waiting) {
            match self.dead_of_role(node.role, now) {
                Some(pid) => self.recover(pid, &node, now, fx),
                None => self.waiting.push(node),
            }
        }
        let dead: BTreeSet<NodeId> = self.dead_nodes(now).into_iter().collect();
        let known: BTreeSet<NodeId> = self.dead_since.keys().copied().collect();
        if dead != known {
            for &id in dead.difference(&known) {
                if self.left.contains(&id) {
                    info!("scheduler: server {id} left the job");
                } else if self.gone(id, now) {
                    warn!(
                        "scheduler: node {id} is dead (its connection closed and its process \
                         accepts no new one)"
                    );
                } else {
                    warn!(
                        "scheduler: node {id} is dead (no message for more than {} s)",
                        self.cfg.van.heartbeat_timeout.unwrap_or_default().as_secs()
                    );
                }
                self.dead_since.insert(id, now);
            }
            self.dead_since.retain(|id, _| dead.contains(id));
            self.tell_dead_nodes(now, fx);
        }
        let groups: Vec<i32> = self.barriers.keys().copied().collect();
        for group in groups {
            if let Some(id) = self.given_up_in(group, now) {
                self.fail_barrier(group, id, fx);
            }
        }
    }

    /// The scheduler stops reading what arrives (`deaf`), or reads again:
    /// nothing is decided meanwhile, and the time it spent deaf counts as
    /// no node's silence.
    pub fn set_deaf(&mut self, deaf: bool, now: Instant) {
        match (deaf, self.deaf_since) {
            (true, None) => {
                self.deaf_since = Some(now);
                self.next_keepalive = self
                    .ready
                    .then_some(now)
                    .filter(|_| self.cfg.van.heartbeat_timeout.is_some());
            }
            (false, Some(since)) => {
                self.deaf_since = None;
                self.next_keepalive = None;
                let d = now.saturating_duration_since(since);
                for seen in self.last_seen.values_mut() {
                    *seen += d;
                }
                for since in self.dead_since.values_mut() {
                    *since += d;
                }
            }
            _ => {}
        }
    }

    /// While deaf: the nodes cannot hear it answer their heartbeats, so it
    /// tells the pslite ones it lives (the dead list, as every heartbeat
    /// answer), three times per heartbeat timeout.
    pub(super) fn keepalive(&mut self, now: Instant, fx: &mut Effects) {
        let (Some(at), Some(timeout)) = (self.next_keepalive, self.cfg.van.heartbeat_timeout)
        else {
            return;
        };
        if now < at {
            return;
        }
        self.next_keepalive = Some(now + (timeout / 3).max(Duration::from_millis(10)));
        self.tell_dead_nodes(now, fx)
    }

    /// This process was stopped for about `paused` (its clock jumped): the
    /// silence of the nodes and the windows of dead ones do not count that
    /// time (they could not reach a stopped scheduler either).
    pub(super) fn resumed(&mut self, paused: Duration, now: Instant) {
        warn!(
            "scheduler: this process was stopped for about {} s (its clock jumped: SIGSTOP, a \
             VM pause, a debugger or swapping); not holding that time against the nodes",
            paused.as_secs()
        );
        let later = |t: &mut Instant| *t = (*t + paused).min(now);
        self.last_seen.values_mut().for_each(later);
        self.dead_since.values_mut().for_each(later);
        self.disconnected.values_mut().for_each(later);
    }

    /// The entry node `id` had before a restarted process took its place,
    /// if that process presented `key`: an earlier process of `id`, and
    /// the entry of the one that replaced it.
    pub fn replaced(&self, id: NodeId, key: Option<u64>) -> Option<(&Node, &Node)> {
        let key = key?;
        let old = self.replaced.iter().find(|n| n.id == id && n.key == key)?;
        let new = self.nodes.iter().find(|n| n.id == id)?;
        Some((old, new))
    }

    pub(super) fn liveness_timeout(&self) -> Option<Instant> {
        let timeout = self.cfg.van.heartbeat_timeout?;
        // Closed connections of processes not dead yet (before the cluster
        // forms, only elastic workers waiting for a round have one).
        let closed = self
            .disconnected
            .keys()
            .filter(|id| !self.dead_since.contains_key(id))
            .filter_map(|&id| self.link_deadline(id))
            .map(|at| at + Duration::from_millis(1))
            .min();
        if !self.ready {
            return closed;
        }
        let slack = Duration::from_millis(1);
        let outage = self.outage_timeout();
        // In this scheduler's own outage, silence is allowed longer.
        let timeout = match self.outage {
            Some(_) => timeout + self.cfg.van.recovery_timeout,
            None => timeout,
        };
        let alive = self
            .processes()
            .into_iter()
            .filter(|id| !self.dead_since.contains_key(id))
            .filter(|id| self.cfg.van.watch_all || self.heartbeating.contains(id))
            .filter_map(|id| self.last_seen.get(&id))
            .map(|&seen| seen + timeout + slack)
            .min();
        // Only the dead a pending barrier waits for (tick fails those
        // barriers; a dead node outside every pending group is no timer).
        let recovery = self
            .dead_since
            .iter()
            .filter(|&(&id, _)| !self.failed_over.contains(&id))
            .filter(|&(&id, _)| self.barriers.keys().any(|&g| ids::group_contains(g, id)))
            .map(|(_, &since)| since + self.cfg.van.recovery_timeout)
            .min();
        [alive, recovery, closed, outage]
            .into_iter()
            .flatten()
            .min()
    }

    /// The dead list, as a HEARTBEAT to every live pslite node.
    pub(super) fn tell_dead_nodes(&self, now: Instant, fx: &mut Effects) {
        let dead = self.dead_list();
        for n in self.process_nodes() {
            if n.pslite && !self.is_dead(n.id, now) {
                let mut msg = Message::control(Command::Heartbeat, n.id);
                msg.meta.control.node = vec![self.cfg.me.clone()];
                msg.meta.control.dead_nodes = dead.clone();
                fx.send(msg);
            }
        }
    }

    /// The dead processes, in id order.
    pub(super) fn dead_list(&self) -> Vec<NodeId> {
        // A server that left is no death to the others: nothing waits for
        // it, and its ranges moved before it went.
        let mut dead: Vec<NodeId> = self
            .dead_since
            .keys()
            .copied()
            .filter(|id| !self.left.contains(id))
            .collect();
        dead.sort_unstable();
        dead
    }

    /// The lowest dead process id of `role`.
    pub(super) fn dead_of_role(&self, role: Role, now: Instant) -> Option<NodeId> {
        self.processes()
            .into_iter()
            .filter(|&id| ids::role_of_id(id) == Some(role) && self.is_dead(id, now))
            .min()
    }

    /// Ids of the processes (not the scheduler) whose last message is older
    /// than the heartbeat timeout. Empty when no timeout is configured.
    pub fn dead_nodes(&self, now: Instant) -> Vec<NodeId> {
        self.processes()
            .into_iter()
            .filter(|&id| self.is_dead(id, now))
            .collect()
    }

    /// Ids of the processes whose last message is older than `timeout`.
    pub fn silent_nodes(&self, now: Instant, timeout: Duration) -> Vec<NodeId> {
        self.processes()
            .into_iter()
            .filter(|id| {
                self.last_seen
                    .get(id)
                    .is_none_or(|&seen| now.saturating_duration_since(seen) > timeout)
            })
            .collect()
    }

    pub(super) fn heartbeat(&mut self, msg: &Message, now: Instant, fx: &mut Effects) {
        let sender = msg.meta.sender;
        if !self.is_member(sender) {
            debug!("scheduler: dropping HEARTBEAT from unknown node {sender}");
            return;
        }
        self.heartbeating.insert(sender);
        if let Some(counters) = &msg.meta.counters {
            self.counters.insert(sender, ((**counters).clone(), now));
        }
        let mut ack = Message::control(Command::Heartbeat, sender);
        ack.meta.control.node = vec![self.cfg.me.clone()];
        if self.is_pslite(sender) {
            ack.meta.control.dead_nodes = self.dead_list();
        }
        fx.send(ack);
    }

    pub(super) fn is_dead(&self, id: NodeId, now: Instant) -> bool {
        if self.left.contains(&id) {
            return true;
        }
        let Some(timeout) = self.cfg.van.heartbeat_timeout else {
            return false;
        };
        if self.gone(id, now) {
            return true;
        }
        if !self.cfg.van.watch_all && !self.heartbeating.contains(&id) {
            return false;
        }
        // The time spent deaf counts as nobody's silence.
        let until = self.deaf_since.map_or(now, |since| since.min(now));
        let Some(&seen) = self.last_seen.get(&id) else {
            return true;
        };
        let silent = until.saturating_duration_since(seen);
        if silent <= timeout {
            return false;
        }
        // In this scheduler's own outage, the live get longer.
        self.dead_since.contains_key(&id) || silent > self.silence_allowed(timeout, now)
    }

    /// Whether process `id`'s connection closed at least [`LINK_GRACE`]
    /// ago and did not come back (ZeroMQ reconnects to a live process in
    /// about 100 ms): its process is gone, the kernel closed its sockets;
    /// and were it alive, nothing could reach it. Watched for every
    /// registered process, C++ nodes without heartbeats included, unless
    /// `PS_HEARTBEAT_TIMEOUT=0`; a paused process keeps its connections,
    /// and only heartbeats notice it.
    pub(super) fn gone(&self, id: NodeId, now: Instant) -> bool {
        self.link_deadline(id).is_some_and(|at| now >= at)
    }

    /// When process `id` counts as gone if its closed connection stays
    /// closed ([`Scheduler::gone`]); `None` if its connection is up or it
    /// is not watched.
    pub(super) fn link_deadline(&self, id: NodeId) -> Option<Instant> {
        let &since = self.disconnected.get(&id)?;
        let waiting = self
            .elastic
            .as_ref()
            .is_some_and(|e| e.outside.iter().any(|n| n.id == id));
        let known = waiting || self.nodes.iter().any(|n| n.id == id);
        // Every registered process, C++ nodes that send no heartbeats too:
        // a closed connection that stays closed is a process that is gone.
        let watched = self.cfg.van.heartbeat_timeout.is_some() && known;
        watched.then_some(since + LINK_GRACE)
    }

    /// The connection to process `id` (this scheduler's DEALER) closed.
    pub fn link_down(&mut self, id: NodeId, now: Instant) {
        self.disconnected.entry(id).or_insert(now);
    }

    /// Forgets every closed connection (the nodes are leaving: see
    /// [`crate::Core::finalizing`]).
    pub fn forget_closed_links(&mut self) {
        self.disconnected.clear();
    }

    /// The connection to process `id` is up (again).
    pub fn link_up(&mut self, id: NodeId) {
        self.disconnected.remove(&id);
    }
}
