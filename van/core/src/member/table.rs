//! Joining and the node table: the ADD_NODE this node registers with, the
//! scheduler's table (checked to come from the scheduler it registered
//! with), updates after a recovery (a node moved or was replaced), the
//! tables of new elastic rounds, and the scheduler's LEAVE.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};

use super::{msg_round, older, Joining, Member, WAIT_LOG_INTERVAL};
use crate::effects::{Effect, Event};
use crate::error::Failure;

impl Member {
    /// Starts joining as `customer_id`: the ADD_NODE to send (none on the
    /// scheduler, nor once joined). The start deadline runs from the first
    /// call.
    pub fn register(&mut self, customer_id: i32, now: Instant) -> Vec<Effect> {
        if self.joined {
            return Vec::new();
        }
        let mut actions = Vec::new();
        if self.joining.is_none() {
            self.joining = Some(Joining {
                since: now,
                deadline: now + self.cfg.van.start_timeout,
                next_log: now + WAIT_LOG_INTERVAL,
            });
            actions.push(Effect::Event(Event::Waiting {
                waited: Duration::ZERO,
                limit: self.cfg.van.start_timeout,
            }));
        }
        if self.me.role != Role::Scheduler {
            let mut me = self.me.clone();
            me.customer_id = customer_id;
            me.id = K_EMPTY;
            let mut msg = Message::control(Command::AddNode, SCHEDULER);
            msg.meta.control.node.push(me);
            actions.push(Effect::Send(msg));
        }
        actions
    }

    /// The scheduler (this node) formed the cluster: `table` holds every
    /// server and worker and the scheduler.
    pub fn formed(&mut self, table: Vec<Node>) -> Vec<Effect> {
        self.table = table;
        if self.joined {
            return Vec::new();
        }
        self.joined = true;
        self.joining = None;
        vec![Effect::Changed, Effect::Event(Event::Joined)]
    }

    /// The scheduler's ADD_NODE: the whole table when joining, or the
    /// entries of recovered nodes afterwards.
    pub fn on_node_table(&mut self, msg: &Message, now: Instant) -> Vec<Effect> {
        if msg.meta.sender != SCHEDULER {
            self.ignore_table(format!(
                "from node {}: only the scheduler sends node tables",
                msg.meta.sender
            ));
            return Vec::new();
        }
        if self.me.role == Role::Scheduler {
            return Vec::new();
        }
        let nodes = &msg.meta.control.node;
        if !self.joined {
            if let (Some(number), Some(_)) = (msg.meta.control.round, msg.meta.control.round_base) {
                // A change that overtook this node's table: asked for later.
                self.early_change = self.early_change.max(Some(number));
                return Vec::new();
            }
            return self.join(msg, nodes, now);
        }
        let c = &msg.meta.control;
        if let (Some(number), Some(base)) = (c.round, c.round_base) {
            return self.next_round_change(msg, number, base);
        }
        if let Some((number, workers)) = msg_round(msg) {
            return self.next_round(nodes, number, workers, msg.meta.timestamp);
        }
        self.update(nodes, msg.meta.timestamp)
    }

    /// An elastic round this node is not part of: a worker has left the
    /// job (its waits fail with `LeftRound`); any other node ignores the
    /// table, saying `why`.
    fn round_without_me(&mut self, number: u64, why: &str) -> Vec<Effect> {
        if self.me.role == Role::Worker {
            return self
                .fail(Failure::LeftRound {
                    id: self.me.id,
                    round: number,
                })
                .into_iter()
                .collect();
        }
        self.ignore_table(why.to_string());
        Vec::new()
    }

    pub(super) fn ignore_table(&mut self, why: String) {
        self.ignored_tables += 1;
        if self.ignored_tables == 1 {
            warn!("ignoring a node table {why} (logged once)");
        } else {
            debug!("ignoring a node table {why}");
        }
    }

    /// The id of this node in a node table, if the table has a usable entry.
    pub fn my_entry<'a>(&self, nodes: &'a [Node]) -> Option<&'a Node> {
        nodes
            .iter()
            .find(|n| n.same_process(&self.me))
            .filter(|n| ids::role_of_id(n.id) == Some(self.me.role) && n.role == self.me.role)
    }

    pub(super) fn join(&mut self, msg: &Message, nodes: &[Node], now: Instant) -> Vec<Effect> {
        let Some(mine) = self.my_entry(nodes).cloned() else {
            self.ignore_table(format!(
                "without a usable entry for this {} at {} (check DMLC_NODE_HOST); still \
                 waiting for the scheduler's",
                self.me.role,
                self.me.address()
            ));
            return Vec::new();
        };
        let Some(scheduler) = nodes.iter().find(|n| n.id == SCHEDULER) else {
            self.ignore_table("without the scheduler's entry".to_string());
            return Vec::new();
        };
        // A pslite scheduler's table carries every process's key, ours
        // included (we sent it only to the scheduler), and comes on a
        // connection that presents the scheduler's key: a stranger knows
        // neither. A C++ scheduler's table carries no keys (its entries
        // drop pslite fields) and comes from a plain `ps1`.
        let keyed = scheduler.pslite && scheduler.key != 0;
        let authentic = if keyed {
            mine.key == self.me.key && msg.meta.sender_key == Some(scheduler.key)
        } else {
            mine.key == 0 && msg.meta.sender_key.is_none()
        };
        if !authentic {
            self.ignore_table(
                "whose keys do not match this node's and its sender's (not from the scheduler \
                 this node registered with)"
                    .to_string(),
            );
            return Vec::new();
        }
        self.me.id = mine.id;
        self.me.is_recovery = mine.is_recovery;
        self.table = self.kept(nodes);
        if msg.meta.timestamp != K_EMPTY {
            self.set_at = self
                .table
                .iter()
                .map(|n| (n.id, msg.meta.timestamp))
                .collect();
        }
        let round = msg_round(msg);
        self.joined = true;
        self.joining = None;
        self.last_scheduler_contact = now;
        self.next_heartbeat = self.cfg.van.heartbeat_interval.map(|_| now);
        // Reconnect to the scheduler under the new identity, and connect to
        // this node itself. Other peers are connected on first send (the
        // core's `prepare`): C++ ps-lite connects to every node of the other
        // role here, which at 100 + 100 nodes is 20 000 TCP handshakes on
        // the start path, most of them for peers a node never talks to.
        let mut actions = Vec::new();
        let mut connected = HashSet::new();
        for node in nodes {
            let wanted = node.id == SCHEDULER || node.id == mine.id;
            if wanted && connected.insert(node.id) {
                actions.push(Effect::Connect(node.clone()));
            }
        }
        info!(
            "{} joined as node {}{}",
            self.me.role,
            mine.id,
            if mine.is_recovery { " (recovered)" } else { "" }
        );
        if let Some((number, workers)) = round {
            info!("in elastic round {number} with workers {workers:?}");
            actions.extend(self.set_round(number, workers));
            if self.early_change.take().is_some_and(|early| early > number) {
                actions.push(self.ask_table(number));
            }
        }
        actions.push(Effect::Changed);
        actions.push(Effect::Event(Event::Joined));
        actions
    }

    /// Elastic mode: the table of a new round replaces the old one.
    pub(super) fn next_round(
        &mut self,
        nodes: &[Node],
        number: u64,
        workers: Vec<NodeId>,
        ts: i32,
    ) -> Vec<Effect> {
        if self.round.as_ref().is_some_and(|(n, _)| *n >= number) {
            // The same round again (another customer's table), or an old one.
            return self.update(nodes, ts);
        }
        if !nodes.iter().any(|n| n.id == self.me.id) || !nodes.iter().any(|n| n.id == SCHEDULER) {
            return self.round_without_me(number, "of a round without this node or the scheduler");
        }
        let mut actions: Vec<Effect> = nodes
            .iter()
            .filter(|n| n.id != self.me.id && n.id != SCHEDULER)
            .filter(|n| {
                self.table
                    .iter()
                    .any(|t| t.id == n.id && !t.same_process(n))
            })
            .map(|n| Effect::Connect(n.clone()))
            .collect();
        self.table = self.kept(nodes);
        if ts != K_EMPTY {
            self.set_at = self.table.iter().map(|n| (n.id, ts)).collect();
        }
        let table = &self.table;
        self.dead.retain(|id, _| table.iter().any(|n| n.id == *id));
        self.given_up.retain(|id| table.iter().any(|n| n.id == *id));
        info!("elastic round {number} began with workers {workers:?}");
        actions.extend(self.set_round(number, workers));
        actions
    }

    /// Elastic mode: round `number` as a change of round `base` (see
    /// `round_base` in `proto/meta.proto`): the workers gone leave the table
    /// and the round, the joiners' entries come in and they rank after the
    /// others. A node that does not hold round `base` asks the scheduler
    /// for the whole table instead.
    pub(super) fn next_round_change(
        &mut self,
        msg: &Message,
        number: u64,
        base: u64,
    ) -> Vec<Effect> {
        let c = &msg.meta.control;
        let ts = msg.meta.timestamp;
        let held = self.round.as_ref().map(|(n, _)| *n);
        if held.is_some_and(|n| n >= number) {
            // A round this node has (or an older one): only the entries.
            return self.update(&c.node, ts);
        }
        let Some(held_members) = self
            .round
            .as_ref()
            .filter(|(n, _)| *n == base)
            .map(|(_, m)| m.clone())
        else {
            debug!(
                "elastic round {number} came as a change of round {base}, and this node holds {held:?}: asking the scheduler for the whole table"
            );
            return vec![self.ask_table(held.unwrap_or(0))];
        };
        if c.round_left.contains(&self.me.id) {
            return self.round_without_me(number, "of a round without this node");
        }
        let left: HashSet<NodeId> = c.round_left.iter().copied().collect();
        let workers: Vec<NodeId> = held_members
            .iter()
            .filter(|id| !left.contains(id))
            .chain(&c.round_members)
            .copied()
            .collect();
        self.table.retain(|n| !left.contains(&n.id));
        for id in &left {
            self.set_at.remove(id);
            self.dead.remove(id);
            self.given_up.remove(id);
        }
        let mut actions = self.update(&c.node, ts);
        info!("elastic round {number} began with workers {workers:?}");
        actions.extend(self.set_round(number, workers));
        actions
    }

    /// Whether this node keeps `node`'s entry in its table: a worker keeps
    /// the servers, the scheduler and its own process, as a C++ worker
    /// uses no more (it talks to servers and the scheduler only; barriers,
    /// rounds and recoveries are the scheduler's). Other workers' entries
    /// would cost a job of N workers N^2 entries.
    pub(super) fn keeps(&self, node: &Node) -> bool {
        self.me.role != Role::Worker || node.role != Role::Worker || node.same_process(&self.me)
    }

    /// The entries of `nodes` this node keeps (see [`Member::keeps`]).
    fn kept(&self, nodes: &[Node]) -> Vec<Node> {
        nodes.iter().filter(|n| self.keeps(n)).cloned().collect()
    }

    /// Elastic mode: asks the scheduler for the whole table (this node
    /// holds round `held`, and a change of another came).
    fn ask_table(&self, held: u64) -> Effect {
        let mut me = self.me.clone();
        me.customer_id = 0;
        let mut ask = Message::control(Command::AddNode, SCHEDULER);
        ask.meta.control.node = vec![me];
        ask.meta.control.round_base = Some(held);
        Effect::Send(ask)
    }

    /// Entries of nodes that restarted and took over an id, from the
    /// scheduler's message with timestamp `ts`.
    pub(super) fn update(&mut self, nodes: &[Node], ts: i32) -> Vec<Effect> {
        let mut actions = Vec::new();
        let recovery = nodes.len() == 1;
        for node in nodes {
            if node.id == self.me.id || node.id == SCHEDULER || !self.keeps(node) {
                continue;
            }
            if ts != K_EMPTY {
                if let Some(&at) = self.set_at.get(&node.id) {
                    if older(ts, at) {
                        debug!(
                            "ignoring a node table entry {node}: the scheduler sent a newer one \
                             (timestamp {at}) before this one ({ts})"
                        );
                        continue;
                    }
                }
                self.set_at.insert(node.id, ts);
            }
            if ids::role_of_id(node.id) != Some(node.role) {
                debug!(
                    "ignoring a node table entry {node}: its id is not a {} id",
                    node.role
                );
                continue;
            }
            let moved = self
                .table
                .iter()
                .filter(|n| n.id == node.id)
                .any(|n| !n.same_process(node));
            let known = self.table.iter().any(|n| n.id == node.id);
            for entry in self.table.iter_mut().filter(|n| n.id == node.id) {
                entry.hostname = node.hostname.clone();
                entry.port = node.port;
                entry.is_recovery = node.is_recovery;
                // The new process's: its identity's key, and where its
                // shared-memory segments are.
                entry.pslite = node.pslite;
                entry.key = node.key;
                entry.features = node.features;
                entry.host = node.host.clone();
                entry.pid = node.pid;
            }
            if !known {
                self.table.push(node.clone());
            }
            if moved {
                info!("node {} moved to {}: reconnecting", node.id, node.address());
                actions.push(Effect::Connect(node.clone()));
            }
            if recovery && node.is_recovery {
                self.dead.remove(&node.id);
                self.given_up.remove(&node.id);
                actions.push(Effect::Event(Event::PeerReplaced(node.id)));
            }
        }
        actions
    }

    /// Elastic mode: round `number` with `workers` is current (the
    /// scheduler's own view). Reports it if it is news.
    pub fn set_round(&mut self, number: u64, workers: Vec<NodeId>) -> Vec<Effect> {
        if self.round.as_ref().is_some_and(|(n, _)| *n == number) {
            return Vec::new();
        }
        self.joined_round.get_or_insert(number);
        self.round = Some((number, workers.clone()));
        vec![Effect::Event(Event::RoundBegan {
            round: number,
            workers,
        })]
    }

    /// The scheduler's LEAVE: the elastic job failed (too few workers for
    /// too long); `round` carries the seconds waited, `round_members` the
    /// workers it had and the minimum.
    /// Without `round`, the scheduler fences this node: its id was given to
    /// the process in `node` while this one was stopped or cut off, and it
    /// must not come back.
    pub fn on_leave(&mut self, msg: &Message) -> Vec<Effect> {
        if msg.meta.sender != SCHEDULER {
            return Vec::new();
        }
        let c = &msg.meta.control;
        // Once joined, the identity's key proved the sender; before, only
        // the scheduler knows this node's key.
        let proven = self.joined
            || c.node
                .iter()
                .any(|n| n.same_process(&self.me) && n.key == self.me.key);
        if !proven {
            debug!("dropping LEAVE: it does not carry this node's key (not from its scheduler)");
            return Vec::new();
        }
        if let Some(reason) = &c.stop {
            // The job stops: the scheduler says why, before it exits.
            let failure = Failure::JobStopped {
                reason: reason.clone(),
            };
            error!("{failure}");
            return self.fail(failure).into_iter().collect();
        }
        if c.round.is_none() {
            if c.node
                .iter()
                .any(|n| n.same_process(&self.me) && n.key == self.me.key)
            {
                // It names this process as the replacement: meant for the
                // process it replaced, at the same address.
                debug!("dropping LEAVE: it fences the process this one replaced");
                return Vec::new();
            }
            let by = c
                .node
                .iter()
                .find(|n| n.id == self.me.id && !n.same_process(&self.me));
            let failure = Failure::Replaced {
                id: self.me.id,
                by: by.map_or_else(|| "another process".to_string(), Node::address),
            };
            return self.fail(failure).into_iter().collect();
        }
        let count = |i: usize| c.round_members.get(i).map_or(0, |&n| n.max(0) as usize);
        let failure = Failure::RendezvousFailed {
            have: count(0),
            min: count(1),
            waited_secs: c.round.unwrap_or(0),
        };
        self.fail(failure).into_iter().collect()
    }
}
