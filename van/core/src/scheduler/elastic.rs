//! Elastic mode (`DMLC_NUM_WORKER=MIN:MAX`): ids handed out in
//! registration order, workers admitted into rounds by the
//! [`Rendezvous`](crate::rendezvous::Rendezvous), the table of each new
//! round sent to its members, deaths and LEAVEs ending rounds, and the
//! job's failure told to every process.

use std::collections::HashSet;
use std::time::Instant;

use log::{debug, error, info, warn};
use pslite_proto::ids::{self, NodeId};
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};

use super::table::Tables;
use super::Scheduler;
use crate::effects::{Effect, Effects, Event};
use crate::error::Failure;
use crate::rendezvous::RendezvousEvent;

impl Scheduler {
    /// Elastic mode: the running round's number and members in rank order.
    pub fn round(&self) -> Option<(u64, &[NodeId])> {
        self.elastic.as_ref().and_then(|e| e.rdzv.round())
    }

    /// Elastic mode: workers waiting for the next round.
    pub fn waiting_workers(&self) -> &[NodeId] {
        self.elastic.as_ref().map_or(&[], |e| e.rdzv.waiting())
    }

    /// Elastic mode: deaths of round members, the last call, the timeout.
    pub(super) fn elastic_tick(&mut self, now: Instant, fx: &mut Effects) {
        let Some(e) = &self.elastic else {
            return;
        };
        // Before the cluster forms nobody has been heard from as a member.
        let mut dead: Vec<NodeId> = e
            .members
            .iter()
            .copied()
            .filter(|&id| self.ready && self.is_dead(id, now))
            .collect();
        // Workers waiting for a round: their connection tells.
        let waiting: Vec<NodeId> = e.outside.iter().map(|n| n.id).collect();
        for id in waiting {
            if self.gone(id, now) && !dead.contains(&id) {
                dead.push(id);
            }
        }
        for id in dead {
            if self.gone(id, now) {
                warn!(
                    "scheduler: worker {id} is dead (its connection closed and its process \
                     accepts no new one): it leaves the elastic job"
                );
            } else {
                warn!(
                    "scheduler: worker {id} is dead (no message for more than {} s): it leaves \
                     the elastic round",
                    self.cfg.van.heartbeat_timeout.unwrap_or_default().as_secs()
                );
            }
            self.leave(id, now, fx);
        }
        let Some(e) = &mut self.elastic else {
            return;
        };
        let events = e.rdzv.tick(now);
        self.on_rounds(events, now, fx);
        self.settle_barriers(now, fx);
    }

    /// Elastic mode: worker `id` died or left.
    pub(super) fn leave(&mut self, id: NodeId, now: Instant, fx: &mut Effects) {
        let Some(e) = &mut self.elastic else {
            return;
        };
        let known = e.members.contains(&id) || e.outside.iter().any(|n| n.id == id);
        if !known || ids::role_of_id(id) != Some(Role::Worker) {
            debug!("scheduler: ignoring LEAVE from node {id}: not an elastic worker");
            return;
        }
        info!("scheduler: worker {id} leaves the job");
        e.outside.retain(|n| n.id != id);
        e.members.retain(|&m| m != id);
        let events = e.rdzv.leave(id, now);
        self.on_rounds(events, now, fx);
        // Not in the table any more (if the round went on without it).
        self.nodes.retain(|n| n.id != id);
        self.table_changed = true;
        self.forget(id);
        self.settle_barriers(now, fx);
    }

    pub(super) fn forget(&mut self, id: NodeId) {
        self.disconnected.remove(&id);
        self.last_seen.remove(&id);
        self.heartbeating.remove(&id);
        self.counters.remove(&id);
        self.dead_since.remove(&id);
    }

    /// Elastic mode: a registration. Ids in registration order; workers
    /// join the rounds.
    pub(super) fn elastic_add_node(
        &mut self,
        node: &Node,
        sender: NodeId,
        now: Instant,
        fx: &mut Effects,
    ) {
        let servers = self.count(Role::Server);
        let Some(e) = &mut self.elastic else {
            return;
        };
        if !node.pslite {
            self.dropped(sender, "ADD_NODE from _: elastic mode (DMLC_NUM_WORKER=MIN:MAX)", format!("scheduler: dropping ADD_NODE from {node}: elastic mode (DMLC_NUM_WORKER=MIN:MAX) \
                 is pslite-only, C++ ps-lite nodes cannot join it"));
            return;
        }
        let known = self
            .nodes
            .iter()
            .chain(&e.outside)
            .find(|n| n.same_process(node))
            .cloned();
        if let Some(known) = known {
            if known.role != node.role || (sender != K_EMPTY && sender != known.id) {
                self.dropped(
                    sender,
                    "ADD_NODE from _: _ is node _ (_)",
                    format!(
                        "scheduler: dropping ADD_NODE from {node}: {} is node {} ({})",
                        node.address(),
                        known.id,
                        known.role
                    ),
                );
                return;
            }
            let repeat = self
                .nodes
                .iter()
                .chain(&e.outside)
                .any(|n| n.same_process(node) && n.customer_id == node.customer_id);
            if repeat {
                debug!("scheduler: ignoring a repeated ADD_NODE from {node}");
                return;
            }
            // Another customer of a registered process: it shares the id.
            let mut entry = node.clone();
            entry.id = known.id;
            entry.is_recovery = false;
            if e.outside.iter().any(|n| n.id == known.id) {
                e.outside.push(entry);
                return;
            }
            self.nodes.push(entry);
            self.table_changed = true;
            if !self.ready {
                return;
            }
            return fx.send(self.table_to(known.id));
        }
        if let Some((have, min, secs)) = e.failed {
            let mut entry = node.clone();
            entry.id = ids::worker_rank_to_id(e.next_worker);
            e.next_worker += 1;
            warn!(
                "scheduler: {} registers after the elastic job failed: telling it",
                node.address()
            );
            return self.tell_failure(&[entry], have, min, secs, now, fx);
        }
        let mut entry = node.clone();
        entry.is_recovery = false;
        if node.role == Role::Server {
            if servers >= self.cfg.van.num_servers {
                self.dropped(
                    sender,
                    "ADD_NODE from _: all _ servers have registered",
                    format!(
                        "scheduler: dropping ADD_NODE from {node}: all {} servers have registered \
                     (is DMLC_NUM_SERVER right?)",
                        self.cfg.van.num_servers
                    ),
                );
                return;
            }
            entry.id = ids::server_rank_to_id(e.next_server);
            e.next_server += 1;
            info!(
                "scheduler: server {} registered as node {}",
                node.address(),
                entry.id
            );
            self.nodes.push(entry);
            self.table_changed = true;
            return self.maybe_form(now, fx);
        }
        entry.id = ids::worker_rank_to_id(e.next_worker);
        e.next_worker += 1;
        let id = entry.id;
        // Connected at once: a worker whose process dies while it waits
        // for a round is noticed by its closed connection (it sends no
        // heartbeat before it joins).
        let link = e.linked.insert(id).then(|| Effect::Connect(entry.clone()));
        e.outside.push(entry);
        let events = e.rdzv.join(id, now);
        if e.rdzv.round().is_some() && e.rdzv.waiting().contains(&id) {
            info!(
                "scheduler: worker {} registered as node {id}; it waits for the next round",
                node.address()
            );
        } else {
            info!(
                "scheduler: worker {} registered as node {id}",
                node.address()
            );
        }
        fx.extend(link);
        self.on_rounds(events, now, fx);
        self.settle_barriers(now, fx);
    }

    /// Elastic mode: carries out what the rounds decided.
    pub(super) fn on_rounds(
        &mut self,
        events: Vec<RendezvousEvent>,
        now: Instant,
        fx: &mut Effects,
    ) {
        for event in events {
            match event {
                RendezvousEvent::RoundBegan { number, members } => {
                    info!("scheduler: elastic round {number} began with workers {members:?}");
                    self.round_began(&members, now, fx);
                    fx.push(Effect::Event(Event::Round {
                        round: number,
                        workers: members,
                    }));
                }
                RendezvousEvent::RoundEnded { number, reason } => {
                    info!("scheduler: elastic round {number} ended ({reason:?})");
                }
                RendezvousEvent::Failed { have, min, waited } => {
                    let failure = Failure::RendezvousFailed {
                        have,
                        min,
                        waited_secs: waited.as_secs(),
                    };
                    error!("scheduler: {failure}");
                    let mut everyone = self.nodes.clone();
                    if let Some(e) = &mut self.elastic {
                        everyone.extend(e.outside.iter().cloned());
                        e.failed = Some((have, min, waited.as_secs()));
                    }
                    self.tell_failure(&everyone, have, min, waited.as_secs(), now, fx);
                    fx.push(Effect::Fail(failure));
                }
            }
        }
    }

    /// LEAVE to every process in `nodes`: the job failed.
    pub(super) fn tell_failure(
        &mut self,
        nodes: &[Node],
        have: usize,
        min: usize,
        secs: u64,
        now: Instant,
        fx: &mut Effects,
    ) {
        let mut told = HashSet::new();
        for node in nodes {
            if !told.insert(node.id) || (self.ready && self.is_dead(node.id, now)) {
                continue;
            }
            fx.extend(self.link(node));
            let mut msg = Message::control(Command::Leave, node.id);
            // Its own entry, with its key: a node that has not joined yet
            // (no table, so no scheduler's key to check) knows it comes
            // from the scheduler it registered with.
            msg.meta.control.node = vec![node.clone()];
            msg.meta.control.round = Some(secs);
            msg.meta.control.round_members = vec![have as NodeId, min as NodeId];
            fx.push(Effect::Send(msg));
        }
    }

    /// A connection to `node`, if none was opened yet.
    pub(super) fn link(&mut self, node: &Node) -> Option<Effect> {
        let e = self.elastic.as_mut()?;
        e.linked
            .insert(node.id)
            .then(|| Effect::Connect(node.clone()))
    }

    /// Elastic mode: a round began with `members`: the table becomes the
    /// servers and the members, and everyone in it is told.
    pub(super) fn round_began(&mut self, members: &[NodeId], now: Instant, fx: &mut Effects) {
        let Some(e) = &mut self.elastic else {
            return;
        };
        let waiting: HashSet<NodeId> = e.rdzv.waiting().iter().copied().collect();
        let mut all = std::mem::take(&mut self.nodes);
        all.append(&mut e.outside);
        for n in all {
            if n.role == Role::Server || members.contains(&n.id) {
                self.nodes.push(n);
            } else if waiting.contains(&n.id) {
                e.outside.push(n);
            }
        }
        self.nodes.sort_by_key(|n| (n.id, n.customer_id));
        self.table_changed = true;
        let (newcomers, gone) = membership_change(&e.members, members);
        e.members = members.to_vec();
        // Newcomers are admitted at the barriers the workers have reached
        // (some worker arrived), or, with none, count as arrived at the next
        // one a worker reaches. A barrier no worker reached yet (the
        // servers' finalize, say) is still ahead of them.
        let mut pending = false;
        for round in self.barriers.values_mut() {
            if round.has_worker() {
                round.excused.extend(newcomers.iter().copied());
                pending = true;
            }
        }
        if !pending && self.ready {
            e.excused_next.extend(newcomers.iter().copied());
        }
        for id in gone {
            self.forget(id);
        }
        if !self.ready {
            return self.maybe_form(now, fx);
        }
        for &id in &newcomers {
            self.last_seen.insert(id, now);
        }
        self.send_table(now, fx)
    }

    /// The table to every live process in it: to a process that holds the
    /// round last sent, as the change from it (the workers that joined and
    /// left since: O(change) bytes); to the others, whole.
    pub(super) fn send_table(&mut self, now: Instant, fx: &mut Effects) {
        let tables = Tables::new(self.table_message());
        let table = tables.full();
        let processes: Vec<Node> = self.process_nodes().into_iter().cloned().collect();
        let Some(e) = &self.elastic else {
            return;
        };
        let members = &e.members;
        let current: HashSet<NodeId> = members.iter().copied().collect();
        let (newcomers, gone) = membership_change(&e.sent_members, members);
        // A change rebuilds the round from the last one: survivors in their
        // order, then the newcomers. Were it not so, everyone gets the table.
        let rebuilds = e
            .sent_members
            .iter()
            .filter(|id| current.contains(id))
            .chain(&newcomers)
            .eq(members.iter());
        let newcomer_ids: HashSet<NodeId> = newcomers.iter().copied().collect();
        let mut change = Message::control(Command::AddNode, K_EMPTY);
        change.meta.control.node = self
            .nodes
            .iter()
            .filter(|n| newcomer_ids.contains(&n.id))
            .cloned()
            .collect();
        change.meta.control.round = table.meta.control.round;
        change.meta.control.round_members = newcomers;
        change.meta.control.round_left = gone.clone();
        let Some(e) = &mut self.elastic else {
            return;
        };
        let base = e.table_round.filter(|_| rebuilds);
        change.meta.control.round_base = base;
        e.sent_members = e.members.clone();
        let number = table.meta.control.round;
        let mut sends = Vec::new();
        for node in processes {
            let holds_base = base.is_some() && e.sent_round.get(&node.id) == base.as_ref();
            let msg = if holds_base && !newcomer_ids.contains(&node.id) {
                change.clone()
            } else {
                tables.to(&node)
            };
            if let Some(number) = number {
                e.sent_round.insert(node.id, number);
            }
            sends.push((node, msg));
        }
        e.table_round = number;
        e.sent_round.retain(|id, _| !gone.contains(id));
        for (node, mut msg) in sends {
            if self.is_dead(node.id, now) {
                continue;
            }
            fx.extend(self.link(&node));
            msg.meta.recver = node.id;
            fx.push(Effect::Send(msg));
        }
    }

    /// Elastic mode: a member that holds another round than a change it got
    /// applies to asks for the whole table (an ADD_NODE from its id with
    /// `round_base`): it gets it.
    pub(super) fn table_asked(&mut self, sender: NodeId, fx: &mut Effects) {
        if self.elastic.is_none() || !self.ready || !self.nodes.iter().any(|n| n.id == sender) {
            return;
        }
        debug!("scheduler: node {sender} asked for the whole table");
        let mut table = self.table_to(sender);
        let Some(e) = &mut self.elastic else {
            return;
        };
        if table.meta.control.round.is_none() {
            // Between rounds: the last one sent, as everyone holds it.
            table.meta.control.round = e.table_round;
            table.meta.control.round_members = e.sent_members.clone();
        }
        match table.meta.control.round {
            Some(number) => e.sent_round.insert(sender, number),
            None => e.sent_round.remove(&sender),
        };
        table.meta.recver = sender;
        fx.send(table);
    }

    /// Elastic mode: the cluster forms once every server registered and
    /// the first round began.
    pub(super) fn maybe_form(&mut self, now: Instant, fx: &mut Effects) {
        if self.ready
            || self.round().is_none()
            || self.count(Role::Server) < self.cfg.van.num_servers
        {
            return;
        }
        self.ready = true;
        for id in self.processes() {
            self.last_seen.insert(id, now);
        }
        for node in self.process_nodes() {
            info!("scheduler: assigned id {} to {}", node.id, node.address());
        }
        // The range map forms before the tables that carry it.
        fx.event(Event::Forming(self.server_ids()));
        self.send_table(now, fx);
        self.table_changed = false;
        fx.push(Effect::Event(Event::Formed(self.table())));
    }
}

/// Who is in `after` and not in `before` (newcomers), and who is in `before`
/// and not in `after` (gone), each in its list's order; linear in both.
fn membership_change(before: &[NodeId], after: &[NodeId]) -> (Vec<NodeId>, Vec<NodeId>) {
    let was: HashSet<NodeId> = before.iter().copied().collect();
    let is: HashSet<NodeId> = after.iter().copied().collect();
    let newcomers = after
        .iter()
        .copied()
        .filter(|id| !was.contains(id))
        .collect();
    let gone = before
        .iter()
        .copied()
        .filter(|id| !is.contains(id))
        .collect();
    (newcomers, gone)
}
