//! Barriers: arrivals counted per group, each group released once all of
//! its members arrived (servers whose ranges failed over excepted), failed
//! when a member stays dead past the recovery timeout; in elastic mode
//! counted against the current round's members.

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use log::{debug, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Role};

use super::Scheduler;
use crate::effects::{Effect, Effects, Event};

#[derive(Default)]
pub(super) struct BarrierRound {
    /// (process id, customer id) of every arrival.
    pub(super) arrived: HashSet<(NodeId, i32)>,
    /// Elastic mode: workers admitted into the round at this barrier (or
    /// while it was pending): they count as arrived, but are not released.
    pub(super) excused: HashSet<NodeId>,
    pub(super) app_id: i32,
    pub(super) customer_id: i32,
}

impl BarrierRound {
    /// Whether a worker has arrived.
    pub(super) fn has_worker(&self) -> bool {
        self.arrived
            .iter()
            .any(|&(id, _)| ids::role_of_id(id) == Some(Role::Worker))
    }

    /// The release of this barrier over `group`, one message to each of `to`.
    pub(super) fn release(&self, group: i32, to: BTreeSet<NodeId>, fx: &mut Effects) {
        let releasing = Event::Releasing {
            group,
            to: to.iter().copied().collect(),
        };
        fx.event(releasing);
        for id in to {
            let mut reply = Message::control(Command::Barrier, id);
            reply.meta.control.barrier_group = group;
            reply.meta.app_id = self.app_id;
            reply.meta.customer_id = self.customer_id;
            fx.send(reply);
        }
    }
}

impl Scheduler {
    pub(super) fn barrier(&mut self, msg: &Message, now: Instant, fx: &mut Effects) {
        let sender = msg.meta.sender;
        let group = msg.meta.control.barrier_group;
        if !msg.meta.request {
            self.dropped(
                sender,
                "a BARRIER reply from node _",
                format!("scheduler: dropping a BARRIER reply from node {sender}"),
            );
            return;
        }
        if !ids::is_role_group(group) {
            self.dropped(
                sender,
                "BARRIER from node _: group _ is not 1..=7",
                format!(
                    "scheduler: dropping BARRIER from node {sender}: group {group} is not 1..=7"
                ),
            );
            return;
        }
        if !self.ready {
            self.dropped(
                sender,
                "BARRIER from node _: the cluster has not formed",
                format!(
                    "scheduler: dropping BARRIER from node {sender}: the cluster has not formed"
                ),
            );
            return;
        }
        if !self.is_member(sender) || !ids::group_contains(group, sender) {
            self.dropped(
                sender,
                "BARRIER from node _: not a member of group _",
                format!(
                    "scheduler: dropping BARRIER from node {sender}: not a member of group {group}"
                ),
            );
            return;
        }
        if let Some(dead) = self.given_up_in(group, now) {
            if sender == SCHEDULER || self.is_pslite(sender) {
                let round = BarrierRound {
                    app_id: msg.meta.app_id,
                    customer_id: msg.meta.customer_id,
                    ..BarrierRound::default()
                };
                return fx.push(self.barrier_failure(sender, group, dead, &round));
            }
        }
        if let Some(e) = &mut self.elastic {
            let round = self.barriers.entry(group).or_default();
            if ids::role_of_id(sender) == Some(Role::Worker) && !round.has_worker() {
                round.excused.extend(std::mem::take(&mut e.excused_next));
            }
            round.arrived.insert((sender, msg.meta.customer_id));
            round.app_id = msg.meta.app_id;
            round.customer_id = msg.meta.customer_id;
            return self.settle_barriers(now, fx);
        }
        let round = self.barriers.entry(group).or_default();
        round.arrived.insert((sender, msg.meta.customer_id));
        round.app_id = msg.meta.app_id;
        round.customer_id = msg.meta.customer_id;
        self.try_release(group, fx)
    }

    /// Releases the barrier over `group` if every member arrived (servers
    /// that failed over excepted).
    pub(super) fn try_release(&mut self, group: i32, fx: &mut Effects) {
        let failed_over = self
            .failed_over
            .iter()
            .filter(|&&id| ids::group_contains(group, id));
        let expected = self.group_size(group) - failed_over.count() as i32;
        let Some(round) = self.barriers.get(&group) else {
            return;
        };
        let arrived = round
            .arrived
            .iter()
            .filter(|(id, _)| !self.failed_over.contains(id))
            .count() as i32;
        debug!("scheduler: barrier {group}: {arrived}/{expected} arrived");
        if arrived < expected {
            return;
        }
        let round = self.barriers.remove(&group).unwrap_or_default();
        // A failed-over server that arrived waits too (stopped, say, and
        // declared dead meanwhile): it is released with the others, or it
        // would wait in that barrier for good once it runs again.
        let arrived: BTreeSet<NodeId> = round.arrived.iter().map(|&(id, _)| id).collect();
        let mut members: BTreeSet<NodeId> = self
            .process_nodes()
            .into_iter()
            .filter(|n| ids::group_contains(group, n.id))
            .filter(|n| !self.failed_over.contains(&n.id) || arrived.contains(&n.id))
            .map(|n| n.id)
            .collect();
        if group & ids::SCHEDULER_GROUP != 0 {
            members.insert(SCHEDULER);
        }
        round.release(group, members, fx)
    }

    /// Replicated key ranges: server `id` failed over (`failed_over`: its ranges
    /// moved to the others, so barriers stop waiting for it) or a
    /// replacement took its id (it counts again). Returns the barriers
    /// this completes.
    pub fn set_failed_over(&mut self, id: NodeId, failed_over: bool, fx: &mut Effects) {
        let changed = if failed_over {
            self.failed_over.insert(id)
        } else {
            self.failed_over.remove(&id)
        };
        if !changed || self.elastic.is_some() {
            return;
        }
        let mut groups: Vec<i32> = self.barriers.keys().copied().collect();
        groups.sort_unstable();
        for g in groups {
            self.try_release(g, fx);
        }
    }

    /// A member of `group` dead for longer than the recovery timeout.
    pub(super) fn given_up_in(&self, group: i32, now: Instant) -> Option<NodeId> {
        self.dead_since
            .iter()
            .filter(|&(&id, &since)| {
                ids::group_contains(group, id)
                    && now >= since + self.cfg.van.recovery_timeout
                    && !self.failed_over.contains(&id)
            })
            .map(|(&id, _)| id)
            .min()
    }

    /// Ends the barrier round over `group`: its pslite waiters learn that
    /// node `dead` will not come (C++ nodes cannot be told; they wait).
    pub(super) fn fail_barrier(&mut self, group: i32, dead: NodeId, fx: &mut Effects) {
        let Some(round) = self.barriers.remove(&group) else {
            return;
        };
        warn!(
            "scheduler: barrier over group {group} fails: node {dead} is dead and was not \
             replaced within {} s",
            self.cfg.van.recovery_timeout.as_secs()
        );
        let waiting: BTreeSet<NodeId> = round.arrived.iter().map(|&(id, _)| id).collect();
        for id in waiting {
            if id == SCHEDULER || self.is_pslite(id) {
                fx.push(self.barrier_failure(id, group, dead, &round));
            }
        }
    }

    pub(super) fn barrier_failure(
        &self,
        recver: NodeId,
        group: i32,
        dead: NodeId,
        round: &BarrierRound,
    ) -> Effect {
        let mut reply = Message::control(Command::Barrier, recver);
        reply.meta.control.barrier_group = group;
        reply.meta.control.failed_peer = Some(dead);
        reply.meta.app_id = round.app_id;
        reply.meta.customer_id = round.customer_id;
        Effect::Send(reply)
    }

    /// The number of registrations a barrier over `group` waits for.
    pub(super) fn group_size(&self, group: i32) -> i32 {
        let mut size = 0;
        if group & ids::SCHEDULER_GROUP != 0 {
            size += 1;
        }
        if group & ids::SERVER_GROUP != 0 {
            size += match self.cfg.van.min_servers {
                // The servers in the table (those that left or failed over
                // are not waited for: see `try_release`).
                Some(_) => self
                    .process_nodes()
                    .iter()
                    .filter(|n| n.role == Role::Server)
                    .count() as i32,
                None => self.cfg.van.num_servers,
            };
        }
        if group & ids::WORKER_GROUP != 0 {
            size += self.cfg.van.num_workers;
        }
        size
    }

    /// Elastic mode: releases every barrier whose arrivals are complete;
    /// waiting workers are admitted at a barrier over the workers first.
    pub(super) fn settle_barriers(&mut self, now: Instant, fx: &mut Effects) {
        if !self.ready {
            return;
        }
        loop {
            let mut groups: Vec<i32> = self.barriers.keys().copied().collect();
            groups.sort_unstable();
            let Some(group) = groups.into_iter().find(|&g| self.barrier_complete(g)) else {
                break;
            };
            if group & ids::WORKER_GROUP != 0 {
                if let Some(e) = &mut self.elastic {
                    let events = e.rdzv.admit_waiting(now);
                    self.on_rounds(events, now, fx);
                }
            }
            self.release_arrivals(group, fx);
        }
    }

    /// Elastic mode: whether the barrier over `group` has every arrival of
    /// the current round's members (and of the servers and the scheduler).
    pub(super) fn barrier_complete(&self, group: i32) -> bool {
        let Some(round) = self.barriers.get(&group) else {
            return false;
        };
        let mut expected = 0;
        if group & ids::SCHEDULER_GROUP != 0 {
            expected += 1;
        }
        if group & ids::SERVER_GROUP != 0 {
            expected += self.cfg.van.num_servers as usize;
        }
        if group & ids::WORKER_GROUP != 0 {
            match self.round() {
                Some((_, members)) => expected += members.len(),
                None => return false,
            }
        }
        // Checked on every arrival: too few to be complete costs nothing
        // (a barrier over N nodes costs O(N), not O(N^2)).
        if round.arrived.len() + round.excused.len() < expected {
            return false;
        }
        let ids: HashSet<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        let present = |id: NodeId| id == SCHEDULER || ids.contains(&id);
        let arrived_ids: HashSet<NodeId> = round.arrived.iter().map(|&(a, _)| a).collect();
        let arrived = round.arrived.iter().filter(|(id, _)| present(*id)).count()
            + round
                .excused
                .iter()
                .filter(|&&id| present(id) && !arrived_ids.contains(&id))
                .count();
        arrived >= expected
    }

    /// Elastic mode: releases the barrier over `group` to those that
    /// arrived at it and are still members.
    pub(super) fn release_arrivals(&mut self, group: i32, fx: &mut Effects) {
        let Some(round) = self.barriers.remove(&group) else {
            return;
        };
        let ids: HashSet<NodeId> = self.nodes.iter().map(|n| n.id).collect();
        let waiting: BTreeSet<NodeId> = round
            .arrived
            .iter()
            .map(|&(id, _)| id)
            .filter(|&id| id == SCHEDULER || ids.contains(&id))
            .collect();
        debug!("scheduler: barrier {group} released to {waiting:?}");
        round.release(group, waiting, fx)
    }
}
