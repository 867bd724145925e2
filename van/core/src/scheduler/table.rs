//! Ids and the node table: registrations before the cluster forms, ids
//! assigned in (hostname, port, customer) order, the table sent to every
//! process, and afterwards a restarted process taking over a dead one's id
//! (recovery) or a late server joining with the next rank.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use log::{debug, info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Node, Role, SharedNodes, K_EMPTY};

use super::Scheduler;
use crate::effects::{Effect, Effects, Event};

impl Scheduler {
    pub(super) fn add_node(&mut self, msg: &Message, now: Instant, fx: &mut Effects) {
        let sender = msg.meta.sender;
        let [node] = msg.meta.control.node.as_slice() else {
            self.dropped(
                sender,
                "ADD_NODE from _ with _ nodes (expected 1)",
                format!(
                    "scheduler: dropping ADD_NODE from {sender} with {} nodes (expected 1)",
                    msg.meta.control.node.len()
                ),
            );
            return;
        };
        if node.role == Role::Scheduler {
            self.dropped(
                sender,
                "ADD_NODE from _: a second scheduler cannot join",
                format!("scheduler: dropping ADD_NODE from {node}: a second scheduler cannot join"),
            );
            return;
        }
        if node.hostname.is_empty() || !(1..=65535).contains(&node.port) {
            self.dropped(
                sender,
                "ADD_NODE with an unusable address _",
                format!(
                    "scheduler: dropping ADD_NODE with an unusable address {:?}",
                    node.address()
                ),
            );
            return;
        }
        if self.stopping.is_some() {
            return self.tell_registered(node, now, fx);
        }
        if msg.meta.control.round_base.is_some() && sender != K_EMPTY {
            return self.table_asked(sender, fx);
        }
        if self.elastic.is_some() && (node.role == Role::Worker || !self.ready) {
            return self.elastic_add_node(node, sender, now, fx);
        }
        if self.ready {
            return self.late_add_node(node, sender, now, fx);
        }
        if sender != K_EMPTY {
            // No process has an id before the cluster forms: a registration
            // comes from a connection without one (and is checked first,
            // see crate::registration). One that presents an id is a
            // stranger using a member's identity.
            self.dropped(
                sender,
                "ADD_NODE from node _ before the cluster formed",
                format!(
                    "scheduler: dropping ADD_NODE from node {sender}: no node has an id before \
                     the cluster forms (a stranger using a member's identity)"
                ),
            );
            return;
        }
        if self
            .nodes
            .iter()
            .any(|n| n.same_process(node) && n.role != node.role)
        {
            self.dropped(
                sender,
                "ADD_NODE from _: _ registered with another role",
                format!(
                    "scheduler: dropping ADD_NODE from {node}: {} registered with another role",
                    node.address()
                ),
            );
            return;
        }
        let duplicate = self
            .nodes
            .iter()
            .any(|n| n.same_process(node) && n.customer_id == node.customer_id);
        if duplicate {
            debug!("scheduler: ignoring a repeated ADD_NODE from {node}");
            return;
        }
        let (have, want) = match node.role {
            Role::Server => (self.count(Role::Server), self.cfg.van.num_servers),
            _ => (self.count(Role::Worker), self.cfg.van.num_workers),
        };
        if have >= want {
            self.dropped(
                sender,
                "ADD_NODE from _: all _ _s have registered",
                format!(
                    "scheduler: dropping ADD_NODE from {node}: all {want} {}s have registered \
                 (is DMLC_NUM_{} right?)",
                    node.role,
                    node.role.as_str().to_uppercase()
                ),
            );
            return;
        }
        let mut node = node.clone();
        node.id = K_EMPTY;
        node.is_recovery = false;
        debug!(
            "scheduler: {node} registered (customer {})",
            node.customer_id
        );
        self.nodes.push(node);
        let complete = match self.cfg.van.min_servers {
            // Every worker and at least MIN servers (more if present).
            Some(min) => {
                self.count(Role::Worker) == self.cfg.van.num_workers
                    && self.count(Role::Server) >= min
            }
            None => self.nodes.len() as i32 == self.cfg.van.num_servers + self.cfg.van.num_workers,
        };
        if complete {
            self.form_cluster(now, fx);
        }
    }

    pub(super) fn count(&self, role: Role) -> i32 {
        self.nodes.iter().filter(|n| n.role == role).count() as i32
    }

    /// Assigns ids in (hostname, port, customer) order and sends the table.
    pub(super) fn form_cluster(&mut self, now: Instant, fx: &mut Effects) {
        self.nodes.sort_by(|a, b| {
            (&a.hostname, a.port, a.customer_id).cmp(&(&b.hostname, b.port, b.customer_id))
        });
        let (mut servers, mut workers) = (0, 0);
        let mut process_ids: HashMap<(String, i32), NodeId> = HashMap::new();
        for node in &mut self.nodes {
            let id = if node.role == Role::Server {
                servers += 1;
                ids::server_rank_to_id(servers - 1)
            } else {
                workers += 1;
                ids::worker_rank_to_id(workers - 1)
            };
            let key = (node.hostname.clone(), node.port);
            node.id = *process_ids.entry(key).or_insert(id);
            if node.id != id {
                debug!("scheduler: id {id} shares process {}", node.id);
            }
        }
        // The range map forms before the tables that carry it.
        fx.event(Event::Forming(self.server_ids()));
        let tables = Tables::new(self.table_message());
        let processes: Vec<Node> = self.process_nodes().into_iter().cloned().collect();
        for node in processes {
            info!("scheduler: assigned id {} to {}", node.id, node.address());
            self.last_seen.insert(node.id, now);
            let msg = tables.to(&node);
            fx.push(Effect::Connect(node));
            fx.push(Effect::Send(msg));
        }
        self.ready = true;
        self.table_changed = false;
        fx.push(Effect::Event(Event::Formed(self.table())));
    }

    /// An ADD_NODE after the cluster formed: a restarted node recovering.
    pub(super) fn late_add_node(
        &mut self,
        node: &Node,
        sender: NodeId,
        now: Instant,
        fx: &mut Effects,
    ) {
        // The same process (same address) registering again.
        if let Some(existing) = self.nodes.iter().find(|n| n.same_process(node)) {
            if existing.role != node.role {
                self.dropped(
                    sender,
                    "ADD_NODE from _: _ is a _ in the table",
                    format!(
                        "scheduler: dropping ADD_NODE from {node}: {} is a {} in the table",
                        node.address(),
                        existing.role
                    ),
                );
                return;
            }
            let pid = existing.id;
            if sender != K_EMPTY && sender != pid {
                self.dropped(
                    sender,
                    "ADD_NODE for _ sent by node _",
                    format!(
                        "scheduler: dropping ADD_NODE for {} sent by node {sender}",
                        node.address()
                    ),
                );
                return;
            }
            let seen = self.recovered_customers.entry(pid).or_default();
            let restarted = seen.is_empty() || seen.contains(&node.customer_id);
            if sender == K_EMPTY && restarted {
                // First contact from a known address: the process restarted.
                return self.recover(pid, node, now, fx);
            }
            // Another customer of a process that already has its id.
            seen.insert(node.customer_id);
            return fx.send(self.table_to(pid));
        }
        if sender != K_EMPTY {
            self.dropped(
                sender,
                "ADD_NODE from node _: it is not in the table",
                format!("scheduler: dropping ADD_NODE from node {sender}: it is not in the table"),
            );
            return;
        }
        match self.dead_of_role(node.role, now) {
            Some(pid) => self.recover(pid, node, now, fx),
            None if node.role == Role::Server && self.server_room() => {
                self.join_server(node, now, fx)
            }
            None if self.cfg.van.heartbeat_timeout.is_some() => {
                info!(
                    "scheduler: {} waits to replace the next {} that stops sending heartbeats",
                    node.address(),
                    node.role
                );
                self.waiting.retain(|n| !n.same_process(node));
                self.waiting.push(node.clone());
            }
            None => {
                warn!(
                    "scheduler: the cluster is full and, without heartbeats \
                     (PS_HEARTBEAT_TIMEOUT), no {} can be found dead: ignoring ADD_NODE from {}",
                    node.role,
                    node.address()
                );
            }
        }
    }

    /// Servers that join and leave: whether the table has fewer than MAX
    /// servers (a new one gets the next rank).
    pub(super) fn server_room(&self) -> bool {
        self.cfg.van.min_servers.is_some()
            && (self
                .process_nodes()
                .iter()
                .filter(|n| n.role == Role::Server)
                .count() as i32)
                < self.cfg.van.num_servers
    }

    /// A server joins the running job with the next rank: an empty entry
    /// for its id goes into the table, and it takes it as a replacement
    /// would (so the range map copies its ranges to it, and it skips the
    /// start barrier everyone else is past).
    pub(super) fn join_server(&mut self, node: &Node, now: Instant, fx: &mut Effects) {
        let rank = self
            .process_nodes()
            .iter()
            .filter(|n| n.role == Role::Server)
            .count() as i32;
        let id = ids::server_rank_to_id(rank);
        info!(
            "scheduler: {} joins the running job as server {id} (rank {rank})",
            node.address()
        );
        let mut entry = node.clone();
        entry.id = id;
        entry.key = 0;
        self.nodes.push(entry);
        self.table_changed = true;
        self.recover(id, node, now, fx)
    }

    /// Server `id` left the job by itself, its ranges handed over (see
    /// `crate::replica::master`): it counts as dead for good, with nothing
    /// failing for it, and barriers stop waiting for it. A later server may
    /// take its id; the others are not told it died (see
    /// `Scheduler::dead_list`). Returns the barriers this completes.
    pub fn server_left(&mut self, id: NodeId, now: Instant, fx: &mut Effects) {
        if !self.left.insert(id) {
            return;
        }
        info!("scheduler: server {id} left the job (its ranges moved to the others)");
        self.dead_since.insert(id, now);
        self.set_failed_over(id, true, fx)
    }

    /// Whether server `id` left the job (and nothing took its id since).
    pub fn has_left(&self, id: NodeId) -> bool {
        self.left.contains(&id)
    }

    /// Gives process `pid`'s id to `node` and tells everyone.
    pub(super) fn recover(&mut self, pid: NodeId, node: &Node, now: Instant, fx: &mut Effects) {
        let mut recovered = None;
        if let Some(old) = self.nodes.iter().find(|n| n.id == pid && n.key != 0) {
            if self.replaced.len() >= 64 {
                self.replaced.remove(0);
            }
            self.replaced.push(old.clone());
        }
        for entry in self.nodes.iter_mut().filter(|n| n.id == pid) {
            entry.hostname = node.hostname.clone();
            entry.port = node.port;
            entry.host = node.host.clone();
            entry.pid = node.pid;
            entry.pslite = node.pslite;
            entry.key = node.key;
            entry.features = node.features;
            entry.is_recovery = true;
            recovered.get_or_insert_with(|| entry.clone());
        }
        let Some(recovered) = recovered else {
            return;
        };
        self.table_changed = true;
        self.replacing.push(pid);
        info!("scheduler: {} replaces node {pid}", recovered.address());
        self.left.remove(&pid);
        self.recovered_customers
            .insert(pid, HashSet::from([node.customer_id]));
        // The counters were the dead process's.
        self.counters.remove(&pid);
        self.last_seen.insert(pid, now);
        self.dead_since.remove(&pid);
        // A new process, on a new connection.
        self.disconnected.remove(&pid);
        // Barrier arrivals of the earlier incarnation still count: the new
        // one skips the start barrier, and arriving again at a later one
        // counts once (arrivals are a set).
        fx.push(Effect::Connect(recovered.clone()));
        fx.event(Event::PeerReplaced(pid));
        fx.push(Effect::Send(self.table_to(pid)));
        for other in self.processes() {
            if other == pid || self.is_dead(other, now) {
                continue;
            }
            let mut update = Message::control(Command::AddNode, other);
            update.meta.control.node = vec![recovered.clone()];
            fx.push(Effect::Send(update));
        }
    }

    /// ADD_NODE carrying the whole table: every entry, then the scheduler;
    /// in elastic mode, with the round and its members in rank order.
    pub(super) fn table_message(&self) -> Message {
        let mut msg = Message::control(Command::AddNode, K_EMPTY);
        msg.meta.control.node = self.nodes.clone();
        msg.meta.control.node.push(self.cfg.me.clone());
        if let Some((number, members)) = self.round() {
            msg.meta.control.round = Some(number);
            msg.meta.control.round_members = members.to_vec();
        }
        msg
    }

    /// [`Scheduler::table_message`] for process `id`, as [`Tables::to`]
    /// trims it.
    pub(super) fn table_to(&self, id: NodeId) -> Message {
        let mut table = self.table_message();
        if self.nodes.iter().any(|n| n.id == id && trimmed_for(n)) {
            table
                .meta
                .control
                .node
                .retain(|n| n.role != Role::Worker || n.id == id);
        }
        table.meta.recver = id;
        table
    }

    /// The first entry of each process, in id order.
    pub(super) fn process_nodes(&self) -> Vec<&Node> {
        let mut seen = HashSet::new();
        let mut nodes: Vec<&Node> = self.nodes.iter().filter(|n| seen.insert(n.id)).collect();
        nodes.sort_by_key(|n| n.id);
        nodes
    }

    pub(super) fn processes(&self) -> Vec<NodeId> {
        self.process_nodes().into_iter().map(|n| n.id).collect()
    }

    pub(super) fn is_member(&self, id: NodeId) -> bool {
        id == SCHEDULER || (self.ready && self.nodes.iter().any(|n| n.id == id))
    }

    /// Whether process `id` registered as a pslite node.
    pub(super) fn is_pslite(&self, id: NodeId) -> bool {
        self.nodes.iter().any(|n| n.id == id && n.pslite)
    }
}

/// Whether `node` (a process's entry) gets a trimmed table: a pslite worker
/// keeps the servers, the scheduler and its own entries only (as a C++
/// worker uses no more; see `NodeTable::keeps`). A C++ node reads the whole
/// table, and servers answer every worker.
fn trimmed_for(node: &Node) -> bool {
    node.pslite && node.role == Role::Worker
}

/// One table for many processes: the whole table, for C++ nodes; for
/// pslite processes the same entries held once and encoded once
/// ([`SharedNodes`]: every message carries the one copy, each frame the
/// same bytes), a pslite worker's part (the servers, see [`trimmed_for`])
/// with its own entries and the scheduler's. Building it is O(N); the
/// messages then cost O(own entries) each, where a copy of the table each
/// would cost O(N^2) in all.
pub(super) struct Tables {
    full: Message,
    /// Every entry but the scheduler's (the last), shared.
    everyone: SharedNodes,
    /// The servers' entries, shared.
    servers: SharedNodes,
    scheduler: Option<Node>,
    own: HashMap<NodeId, Vec<Node>>,
}

impl Tables {
    /// `full`: a [`Scheduler::table_message`].
    pub(super) fn new(full: Message) -> Tables {
        let mut scheduler = None;
        let mut own: HashMap<NodeId, Vec<Node>> = HashMap::new();
        let mut servers = Vec::new();
        let mut everyone = Vec::new();
        for n in &full.meta.control.node {
            match n.role {
                Role::Worker => own.entry(n.id).or_default().push(n.clone()),
                Role::Scheduler => scheduler = Some(n.clone()),
                Role::Server => servers.push(n.clone()),
            }
            if n.role != Role::Scheduler {
                everyone.push(n.clone());
            }
        }
        Tables {
            full,
            everyone: SharedNodes::new(everyone),
            servers: SharedNodes::new(servers),
            scheduler,
            own,
        }
    }

    /// The whole table.
    pub(super) fn full(&self) -> &Message {
        &self.full
    }

    /// The table for process `node`, addressed to it.
    pub(super) fn to(&self, node: &Node) -> Message {
        let mut msg = if node.pslite {
            let mut msg = Message::control(Command::AddNode, K_EMPTY);
            let c = &mut msg.meta.control;
            c.round = self.full.meta.control.round;
            c.round_members = self.full.meta.control.round_members.clone();
            if trimmed_for(node) {
                c.node = self.own.get(&node.id).cloned().unwrap_or_default();
                c.shared = Some(self.servers.clone());
            } else {
                c.shared = Some(self.everyone.clone());
            }
            c.node.extend(self.scheduler.iter().cloned());
            msg
        } else {
            self.full.clone()
        };
        msg.meta.recver = node.id;
        msg
    }
}
