//! The scheduler's control plane as a state machine, with no sockets and no
//! clock: the Van feeds it each control message and the current time, and
//! carries out the [`Action`]s it returns.
//!
//! It collects ADD_NODE registrations until `num_servers + num_workers` have
//! arrived, orders them by (hostname, port, customer id), assigns ids (server
//! rank r is 8+2r, worker rank r is 9+2r), maps the extra customers of one
//! process onto that process's first id, and sends every process the whole
//! table. Afterwards it counts barrier arrivals per group and releases each
//! group when all of its members arrived, answers heartbeats, and lets a
//! restarted node take over the id of a dead one (recovery).
//!
//! In elastic mode (`DMLC_NUM_WORKER=MIN:MAX`, pslite-only) it drives a
//! [`Rendezvous`] instead of waiting for a fixed number of workers: ids are
//! handed out on registration (servers 8+2r and workers 9+2r, each in
//! registration order; a worker id is never reused), the cluster forms once
//! every server registered and the first round began, and the node table
//! holds the servers and the current round's workers, with the round number
//! and its members in rank order (PBControl fields 102 and 103). Workers
//! that register while a round runs wait (their ADD_NODE is answered when
//! they are admitted); they are admitted when a barrier that includes the
//! workers completes, before it is released. A round member that dies
//! (heartbeats) or LEAVEs ends the round; the next one re-ranks the
//! survivors. Barriers over workers count the current round's members; a
//! barrier pending across a round change is re-evaluated against the new
//! round, whose newcomers count as arrived (they were admitted at it). Below
//! MIN for longer than `PS_RDZV_TIMEOUT`, every node is sent a LEAVE
//! carrying the failure and the scheduler fails.
//!
//! For observability it keeps the counters each node attaches to its
//! heartbeats (a pslite-only field) and answers an admin client's STATUS
//! request (pslite-only) with the node table, liveness and those counters.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::stats::{NodeCounters, NodeStatus};
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};

use crate::error::Failure;
use crate::member::{LINK_GRACE, PAUSE_SLACK};
use crate::rendezvous::{Rendezvous, RendezvousConfig, RendezvousEvent};

/// What the scheduler needs to know about the cluster it forms.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// `DMLC_NUM_SERVER` (MAX, when servers join and leave).
    pub num_servers: i32,
    /// Servers that join and leave (`DMLC_NUM_SERVER=MIN:MAX`): MIN. The
    /// cluster forms once every worker and at least MIN servers registered;
    /// a server registering later, with fewer than MAX in the table, gets
    /// the next rank (is added like a replacement); one that left counts as
    /// dead for good (its ranges moved first), and a later server may take
    /// its id. `None`: ps-lite's fixed number of servers.
    pub min_servers: Option<i32>,
    /// `DMLC_NUM_WORKER`.
    pub num_workers: i32,
    /// The scheduler's own node (role SCHEDULER, id 1, its host and port).
    pub me: Node,
    /// A node whose last message is older than this is dead
    /// (`PS_HEARTBEAT_TIMEOUT`); `None` means never.
    pub heartbeat_timeout: Option<Duration>,
    /// The timeout applies to every node (`PS_HEARTBEAT_TIMEOUT` was set);
    /// otherwise only to nodes that send heartbeats (pslite nodes do by
    /// default; C++ nodes only when told to), so a silent C++ node is never
    /// declared dead by a default.
    pub watch_all: bool,
    /// How long a dead node may stay unreplaced before the barriers that
    /// wait for it fail (`PS_RECOVERY_TIMEOUT`).
    pub recovery_timeout: Duration,
    /// Elastic mode (`DMLC_NUM_WORKER=MIN:MAX`): the rounds' bounds and
    /// periods; `None` is ps-lite's fixed number of workers.
    pub elastic: Option<RendezvousConfig>,
}

/// Something the Van must do for the scheduler, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Open (or replace) the DEALER to this node before sending to it.
    Connect(Node),
    /// Send this message to `meta.recver`. The Van stamps the timestamp.
    Send(Message),
    /// Every node has registered and received its id.
    Ready,
    /// Elastic mode: the job failed (too few workers for too long); every
    /// node has been told.
    Failed(Failure),
    /// Elastic mode: round `round` began with `workers` in rank order.
    RoundBegan {
        /// The round number.
        round: u64,
        /// Its workers in rank order.
        workers: Vec<NodeId>,
    },
    /// Answer an admin client that is not a cluster member on the
    /// connection its request came on (`route`, the routing id ZeroMQ gave
    /// it): never to an address the client names. The Van adds its own
    /// counters to the scheduler's row of a status table.
    Reply {
        /// The client's connection.
        route: bytes::Bytes,
        /// The answer.
        msg: Message,
    },
}

/// How many registrations are still missing, per role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// Servers that have not registered.
    pub servers: i32,
    /// Workers that have not registered.
    pub workers: i32,
}

#[derive(Default)]
struct BarrierRound {
    /// (process id, customer id) of every arrival.
    arrived: HashSet<(NodeId, i32)>,
    /// Elastic mode: workers admitted into the round at this barrier (or
    /// while it was pending): they count as arrived, but are not released.
    excused: HashSet<NodeId>,
    app_id: i32,
    customer_id: i32,
}

impl BarrierRound {
    /// Whether a worker has arrived.
    fn has_worker(&self) -> bool {
        self.arrived
            .iter()
            .any(|&(id, _)| ids::role_of_id(id) == Some(Role::Worker))
    }

    /// The release of this barrier over `group`, one message to each of `to`.
    fn release(&self, group: i32, to: BTreeSet<NodeId>) -> Vec<Action> {
        to.into_iter()
            .map(|id| {
                let mut reply = Message::control(Command::Barrier, id);
                reply.meta.control.barrier_group = group;
                reply.meta.app_id = self.app_id;
                reply.meta.customer_id = self.customer_id;
                Action::Send(reply)
            })
            .collect()
    }
}

/// The scheduler's membership, barrier and liveness state.
pub struct Scheduler {
    cfg: SchedulerConfig,
    /// Registrations before the cluster formed; the table (without the
    /// scheduler) after. Entries of one process share its id.
    nodes: Vec<Node>,
    ready: bool,
    barriers: HashMap<i32, BarrierRound>,
    last_seen: HashMap<NodeId, Instant>,
    /// Customers of a recovered process that have registered since its
    /// last recovery; a repeat means the process restarted again.
    recovered_customers: HashMap<NodeId, HashSet<i32>>,
    /// Restarted nodes that arrived before a node of their role was dead:
    /// they take the first one that dies (see [`Scheduler::tick`]).
    waiting: Vec<Node>,
    /// The latest counters each process sent with a heartbeat, and when.
    counters: HashMap<NodeId, (NodeCounters, Instant)>,
    /// Dead processes, since when (as last told to the pslite nodes).
    dead_since: HashMap<NodeId, Instant>,
    /// Processes that have sent a heartbeat.
    heartbeating: HashSet<NodeId>,
    /// (sender, kind) of dropped control messages already warned about.
    warned: HashSet<(NodeId, &'static str)>,
    /// Entries of processes whose id a restarted process took (the latest
    /// 64): a message from one of them gets it fenced.
    replaced: Vec<Node>,
    /// Processes whose connection closed (this scheduler's DEALER to them),
    /// since when; gone once it comes back.
    disconnected: HashMap<NodeId, Instant>,
    /// Elastic mode: the worker rounds, and the registrations they need.
    elastic: Option<Elastic>,
    /// Replicated key ranges: dead servers whose ranges moved to others;
    /// barriers do not wait for them (see [`Scheduler::set_failed_over`]).
    failed_over: BTreeSet<NodeId>,
    /// Servers that left the job by themselves (see
    /// [`Scheduler::server_left`]): dead for good, with no failure.
    left: BTreeSet<NodeId>,
    /// Since when the scheduler reads nothing (an app's queue is full): no
    /// node's silence counts meanwhile, and when it next tells the nodes it
    /// lives (it cannot answer their heartbeats).
    deaf_since: Option<Instant>,
    next_keepalive: Option<Instant>,
}

/// The scheduler's elastic-mode state.
struct Elastic {
    rdzv: Rendezvous,
    /// Ranks of the next server and worker ids to hand out.
    next_server: i32,
    next_worker: i32,
    /// Entries of workers that have an id but are not in the current round
    /// (waiting for the next one).
    outside: Vec<Node>,
    /// Processes this scheduler has opened a connection to.
    linked: HashSet<NodeId>,
    /// The current round's members as last sent.
    members: Vec<NodeId>,
    /// The job failed: (workers it had, MIN, seconds waited).
    failed: Option<(usize, usize, u64)>,
    /// Workers admitted while no barrier over the workers was pending:
    /// they count as arrived at the next one (their start() returned
    /// instead).
    excused_next: HashSet<NodeId>,
}

impl Scheduler {
    /// A scheduler waiting for its first registration since `now` (an
    /// elastic job's first round starts forming then).
    pub fn new(cfg: SchedulerConfig, now: Instant) -> Scheduler {
        Scheduler {
            nodes: Vec::new(),
            ready: false,
            barriers: HashMap::new(),
            last_seen: HashMap::new(),
            recovered_customers: HashMap::new(),
            waiting: Vec::new(),
            counters: HashMap::new(),
            dead_since: HashMap::new(),
            heartbeating: HashSet::new(),
            failed_over: BTreeSet::new(),
            left: BTreeSet::new(),
            disconnected: HashMap::new(),
            replaced: Vec::new(),
            warned: HashSet::new(),
            elastic: cfg.elastic.map(|rc| Elastic {
                rdzv: Rendezvous::new(rc, now),
                next_server: 0,
                next_worker: 0,
                outside: Vec::new(),
                linked: HashSet::new(),
                members: Vec::new(),
                failed: None,
                excused_next: HashSet::new(),
            }),
            cfg,
            deaf_since: None,
            next_keepalive: None,
        }
    }

    /// Clock-driven work at `now`: lets waiting restarted nodes take over
    /// nodes that have died, tells the pslite nodes which nodes are dead,
    /// and fails the barriers that wait for a node dead for longer than the
    /// recovery timeout.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        if let Some(due) = self.poll_timeout() {
            let late = now.saturating_duration_since(due);
            if late > PAUSE_SLACK {
                self.resumed(late, now);
            }
        }
        if self.deaf_since.is_some() {
            return self.keepalive(now);
        }
        let mut actions = self.elastic_tick(now);
        if !self.ready {
            return actions;
        }
        for node in std::mem::take(&mut self.waiting) {
            match self.dead_of_role(node.role, now) {
                Some(pid) => actions.extend(self.recover(pid, &node, now)),
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
                        self.cfg.heartbeat_timeout.unwrap_or_default().as_secs()
                    );
                }
                self.dead_since.insert(id, now);
            }
            self.dead_since.retain(|id, _| dead.contains(id));
            actions.extend(self.tell_dead_nodes(now));
        }
        let groups: Vec<i32> = self.barriers.keys().copied().collect();
        for group in groups {
            if let Some(id) = self.given_up_in(group, now) {
                actions.extend(self.fail_barrier(group, id));
            }
        }
        actions
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
                    .filter(|_| self.cfg.heartbeat_timeout.is_some());
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
    fn keepalive(&mut self, now: Instant) -> Vec<Action> {
        let (Some(at), Some(timeout)) = (self.next_keepalive, self.cfg.heartbeat_timeout) else {
            return Vec::new();
        };
        if now < at {
            return Vec::new();
        }
        self.next_keepalive = Some(now + (timeout / 3).max(Duration::from_millis(10)));
        self.tell_dead_nodes(now)
    }

    /// This process was stopped for about `paused` (its clock jumped): the
    /// silence of the nodes and the windows of dead ones do not count that
    /// time (they could not reach a stopped scheduler either).
    fn resumed(&mut self, paused: Duration, now: Instant) {
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

    /// Logs why a control message from `sender` was dropped: a warning the
    /// first time per sender and kind (the first 1024), at debug level
    /// after that, so a hostile or confused peer cannot flood the log.
    fn dropped(&mut self, sender: NodeId, kind: &'static str, line: String) {
        if self.warned.len() < 1024 && self.warned.insert((sender, kind)) {
            warn!("{line} (further ones are logged at debug level)");
        } else {
            debug!("{line}");
        }
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

    /// When [`Scheduler::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.deaf_since.is_some() {
            return self.next_keepalive;
        }
        let rounds = self.elastic.as_ref().and_then(|e| e.rdzv.poll_timeout());
        match (rounds, self.liveness_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn liveness_timeout(&self) -> Option<Instant> {
        let timeout = self.cfg.heartbeat_timeout?;
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
        let alive = self
            .processes()
            .into_iter()
            .filter(|id| !self.dead_since.contains_key(id))
            .filter(|id| self.cfg.watch_all || self.heartbeating.contains(id))
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
            .map(|(_, &since)| since + self.cfg.recovery_timeout)
            .min();
        [alive, recovery, closed].into_iter().flatten().min()
    }

    /// The dead list, as a HEARTBEAT to every live pslite node.
    fn tell_dead_nodes(&self, now: Instant) -> Vec<Action> {
        let dead = self.dead_list();
        self.process_nodes()
            .into_iter()
            .filter(|n| n.pslite && !self.is_dead(n.id, now))
            .map(|n| {
                let mut msg = Message::control(Command::Heartbeat, n.id);
                msg.meta.control.node = vec![self.cfg.me.clone()];
                msg.meta.control.dead_nodes = dead.clone();
                Action::Send(msg)
            })
            .collect()
    }

    /// The dead processes, in id order.
    fn dead_list(&self) -> Vec<NodeId> {
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

    /// A member of `group` dead for longer than the recovery timeout.
    fn given_up_in(&self, group: i32, now: Instant) -> Option<NodeId> {
        self.dead_since
            .iter()
            .filter(|&(&id, &since)| {
                ids::group_contains(group, id)
                    && now >= since + self.cfg.recovery_timeout
                    && !self.failed_over.contains(&id)
            })
            .map(|(&id, _)| id)
            .min()
    }

    /// Ends the barrier round over `group`: its pslite waiters learn that
    /// node `dead` will not come (C++ nodes cannot be told; they wait).
    fn fail_barrier(&mut self, group: i32, dead: NodeId) -> Vec<Action> {
        let Some(round) = self.barriers.remove(&group) else {
            return Vec::new();
        };
        warn!(
            "scheduler: barrier over group {group} fails: node {dead} is dead and was not \
             replaced within {} s",
            self.cfg.recovery_timeout.as_secs()
        );
        let waiting: BTreeSet<NodeId> = round.arrived.iter().map(|&(id, _)| id).collect();
        waiting
            .into_iter()
            .filter(|&id| id == SCHEDULER || self.is_pslite(id))
            .map(|id| self.barrier_failure(id, group, dead, &round))
            .collect()
    }

    fn barrier_failure(
        &self,
        recver: NodeId,
        group: i32,
        dead: NodeId,
        round: &BarrierRound,
    ) -> Action {
        let mut reply = Message::control(Command::Barrier, recver);
        reply.meta.control.barrier_group = group;
        reply.meta.control.failed_peer = Some(dead);
        reply.meta.app_id = round.app_id;
        reply.meta.customer_id = round.customer_id;
        Action::Send(reply)
    }

    /// Whether process `id` registered as a pslite node.
    fn is_pslite(&self, id: NodeId) -> bool {
        self.nodes.iter().any(|n| n.id == id && n.pslite)
    }

    /// The lowest dead process id of `role`.
    fn dead_of_role(&self, role: Role, now: Instant) -> Option<NodeId> {
        self.processes()
            .into_iter()
            .filter(|&id| ids::role_of_id(id) == Some(role) && self.is_dead(id, now))
            .min()
    }

    /// Whether every node has registered and been given its id.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// The node table (servers and workers with their ids), once ready.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// How many servers and workers have not registered yet.
    pub fn missing(&self) -> Missing {
        let count = |role| self.nodes.iter().filter(|n| n.role == role).count() as i32;
        Missing {
            servers: (self.cfg.min_servers.unwrap_or(self.cfg.num_servers) - count(Role::Server))
                .max(0),
            workers: (self.cfg.num_workers - count(Role::Worker)).max(0),
        }
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

    /// Handles one control message addressed to the scheduler.
    pub fn handle(&mut self, msg: &Message, now: Instant) -> Vec<Action> {
        let sender = msg.meta.sender;
        let mut back = Vec::new();
        if sender != K_EMPTY && self.is_member(sender) {
            self.last_seen.insert(sender, now);
            if self.dead_since.contains_key(&sender) && !self.is_dead(sender, now) {
                // Stopped or cut off, not dead: nothing took its place, so
                // it is taken back, and everyone is told at once.
                warn!("scheduler: node {sender}, held dead, is back");
                self.dead_since.remove(&sender);
                back = self.tell_dead_nodes(now);
            }
        }
        let mut actions = self.handle_command(msg, now);
        actions.extend(back);
        actions
    }

    fn handle_command(&mut self, msg: &Message, now: Instant) -> Vec<Action> {
        let sender = msg.meta.sender;
        match msg.meta.control.cmd {
            Command::AddNode => self.add_node(msg, now),
            Command::Barrier => self.barrier(msg, now),
            Command::Heartbeat => self.heartbeat(msg, now),
            Command::Status => self.status(msg, now),
            Command::Leave if self.elastic.is_some() => self.leave(sender, now),
            cmd => {
                self.dropped(
                    sender,
                    "_ from node _: not a scheduler command",
                    format!(
                        "scheduler: dropping {cmd:?} from node {sender}: not a scheduler command"
                    ),
                );
                Vec::new()
            }
        }
    }

    fn add_node(&mut self, msg: &Message, now: Instant) -> Vec<Action> {
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
            return Vec::new();
        };
        if node.role == Role::Scheduler {
            self.dropped(
                sender,
                "ADD_NODE from _: a second scheduler cannot join",
                format!("scheduler: dropping ADD_NODE from {node}: a second scheduler cannot join"),
            );
            return Vec::new();
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
            return Vec::new();
        }
        if self.elastic.is_some() && (node.role == Role::Worker || !self.ready) {
            return self.elastic_add_node(node, sender, now);
        }
        if self.ready {
            return self.late_add_node(node, sender, now);
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
                    "scheduler: dropping ADD_NODE from node {sender}: no node has an id before                      the cluster forms (a stranger using a member's identity)"
                ),
            );
            return Vec::new();
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
            return Vec::new();
        }
        let duplicate = self
            .nodes
            .iter()
            .any(|n| n.same_process(node) && n.customer_id == node.customer_id);
        if duplicate {
            debug!("scheduler: ignoring a repeated ADD_NODE from {node}");
            return Vec::new();
        }
        let (have, want) = match node.role {
            Role::Server => (self.count(Role::Server), self.cfg.num_servers),
            _ => (self.count(Role::Worker), self.cfg.num_workers),
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
            return Vec::new();
        }
        let mut node = node.clone();
        node.id = K_EMPTY;
        node.is_recovery = false;
        debug!(
            "scheduler: {node} registered (customer {})",
            node.customer_id
        );
        self.nodes.push(node);
        let complete = match self.cfg.min_servers {
            // Every worker and at least MIN servers (more if present).
            Some(min) => {
                self.count(Role::Worker) == self.cfg.num_workers && self.count(Role::Server) >= min
            }
            None => self.nodes.len() as i32 == self.cfg.num_servers + self.cfg.num_workers,
        };
        if complete {
            self.form_cluster(now)
        } else {
            Vec::new()
        }
    }

    fn count(&self, role: Role) -> i32 {
        self.nodes.iter().filter(|n| n.role == role).count() as i32
    }

    /// Assigns ids in (hostname, port, customer) order and sends the table.
    fn form_cluster(&mut self, now: Instant) -> Vec<Action> {
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
        let mut actions = Vec::new();
        let table = self.table_message();
        let processes: Vec<Node> = self.process_nodes().into_iter().cloned().collect();
        for node in processes {
            info!("scheduler: assigned id {} to {}", node.id, node.address());
            self.last_seen.insert(node.id, now);
            let mut msg = table.clone();
            msg.meta.recver = node.id;
            actions.push(Action::Connect(node));
            actions.push(Action::Send(msg));
        }
        self.ready = true;
        actions.push(Action::Ready);
        actions
    }

    /// An ADD_NODE after the cluster formed: a restarted node recovering.
    fn late_add_node(&mut self, node: &Node, sender: NodeId, now: Instant) -> Vec<Action> {
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
                return Vec::new();
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
                return Vec::new();
            }
            let seen = self.recovered_customers.entry(pid).or_default();
            let restarted = seen.is_empty() || seen.contains(&node.customer_id);
            if sender == K_EMPTY && restarted {
                // First contact from a known address: the process restarted.
                return self.recover(pid, node, now);
            }
            // Another customer of a process that already has its id.
            seen.insert(node.customer_id);
            let mut table = self.table_message();
            table.meta.recver = pid;
            return vec![Action::Send(table)];
        }
        if sender != K_EMPTY {
            self.dropped(
                sender,
                "ADD_NODE from node _: it is not in the table",
                format!("scheduler: dropping ADD_NODE from node {sender}: it is not in the table"),
            );
            return Vec::new();
        }
        match self.dead_of_role(node.role, now) {
            Some(pid) => self.recover(pid, node, now),
            None if node.role == Role::Server && self.server_room() => self.join_server(node, now),
            None if self.cfg.heartbeat_timeout.is_some() => {
                info!(
                    "scheduler: {} waits to replace the next {} that stops sending heartbeats",
                    node.address(),
                    node.role
                );
                self.waiting.retain(|n| !n.same_process(node));
                self.waiting.push(node.clone());
                Vec::new()
            }
            None => {
                warn!(
                    "scheduler: the cluster is full and, without heartbeats \
                     (PS_HEARTBEAT_TIMEOUT), no {} can be found dead: ignoring ADD_NODE from {}",
                    node.role,
                    node.address()
                );
                Vec::new()
            }
        }
    }

    /// Servers that join and leave: whether the table has fewer than MAX
    /// servers (a new one gets the next rank).
    fn server_room(&self) -> bool {
        self.cfg.min_servers.is_some()
            && (self
                .process_nodes()
                .iter()
                .filter(|n| n.role == Role::Server)
                .count() as i32)
                < self.cfg.num_servers
    }

    /// A server joins the running job with the next rank: an empty entry
    /// for its id goes into the table, and it takes it as a replacement
    /// would (so the range map copies its ranges to it, and it skips the
    /// start barrier everyone else is past).
    fn join_server(&mut self, node: &Node, now: Instant) -> Vec<Action> {
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
        self.recover(id, node, now)
    }

    /// Server `id` left the job by itself, its ranges handed over (see
    /// `crate::replica::master`): it counts as dead for good, with nothing
    /// failing for it, and barriers stop waiting for it. A later server may
    /// take its id; the others are not told it died (see
    /// `Scheduler::dead_list`). Returns the barriers this completes.
    pub fn server_left(&mut self, id: NodeId, now: Instant) -> Vec<Action> {
        if !self.left.insert(id) {
            return Vec::new();
        }
        info!("scheduler: server {id} left the job (its ranges moved to the others)");
        self.dead_since.insert(id, now);
        self.set_failed_over(id, true)
    }

    /// Whether server `id` left the job (and nothing took its id since).
    pub fn has_left(&self, id: NodeId) -> bool {
        self.left.contains(&id)
    }

    /// Gives process `pid`'s id to `node` and tells everyone.
    fn recover(&mut self, pid: NodeId, node: &Node, now: Instant) -> Vec<Action> {
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
            return Vec::new();
        };
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
        let mut actions = vec![Action::Connect(recovered.clone())];
        let mut table = self.table_message();
        table.meta.recver = pid;
        actions.push(Action::Send(table));
        for other in self.processes() {
            if other == pid || self.is_dead(other, now) {
                continue;
            }
            let mut update = Message::control(Command::AddNode, other);
            update.meta.control.node = vec![recovered.clone()];
            actions.push(Action::Send(update));
        }
        actions
    }

    fn barrier(&mut self, msg: &Message, now: Instant) -> Vec<Action> {
        let sender = msg.meta.sender;
        let group = msg.meta.control.barrier_group;
        if !msg.meta.request {
            self.dropped(
                sender,
                "a BARRIER reply from node _",
                format!("scheduler: dropping a BARRIER reply from node {sender}"),
            );
            return Vec::new();
        }
        if !ids::is_role_group(group) {
            self.dropped(
                sender,
                "BARRIER from node _: group _ is not 1..=7",
                format!(
                    "scheduler: dropping BARRIER from node {sender}: group {group} is not 1..=7"
                ),
            );
            return Vec::new();
        }
        if !self.ready {
            self.dropped(
                sender,
                "BARRIER from node _: the cluster has not formed",
                format!(
                    "scheduler: dropping BARRIER from node {sender}: the cluster has not formed"
                ),
            );
            return Vec::new();
        }
        if !self.is_member(sender) || !ids::group_contains(group, sender) {
            self.dropped(
                sender,
                "BARRIER from node _: not a member of group _",
                format!(
                    "scheduler: dropping BARRIER from node {sender}: not a member of group {group}"
                ),
            );
            return Vec::new();
        }
        if let Some(dead) = self.given_up_in(group, now) {
            if sender == SCHEDULER || self.is_pslite(sender) {
                let round = BarrierRound {
                    app_id: msg.meta.app_id,
                    customer_id: msg.meta.customer_id,
                    ..BarrierRound::default()
                };
                return vec![self.barrier_failure(sender, group, dead, &round)];
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
            return self.settle_barriers(now);
        }
        let round = self.barriers.entry(group).or_default();
        round.arrived.insert((sender, msg.meta.customer_id));
        round.app_id = msg.meta.app_id;
        round.customer_id = msg.meta.customer_id;
        self.try_release(group)
    }

    /// Releases the barrier over `group` if every member arrived (servers
    /// that failed over excepted).
    fn try_release(&mut self, group: i32) -> Vec<Action> {
        let failed_over = self
            .failed_over
            .iter()
            .filter(|&&id| ids::group_contains(group, id));
        let expected = self.group_size(group) - failed_over.count() as i32;
        let Some(round) = self.barriers.get(&group) else {
            return Vec::new();
        };
        let arrived = round
            .arrived
            .iter()
            .filter(|(id, _)| !self.failed_over.contains(id))
            .count() as i32;
        debug!("scheduler: barrier {group}: {arrived}/{expected} arrived");
        if arrived < expected {
            return Vec::new();
        }
        let round = self.barriers.remove(&group).unwrap_or_default();
        let mut members: BTreeSet<NodeId> = self
            .process_nodes()
            .into_iter()
            .filter(|n| ids::group_contains(group, n.id) && !self.failed_over.contains(&n.id))
            .map(|n| n.id)
            .collect();
        if group & ids::SCHEDULER_GROUP != 0 {
            members.insert(SCHEDULER);
        }
        round.release(group, members)
    }

    /// Replicated key ranges: server `id` failed over (`failed_over`: its ranges
    /// moved to the others, so barriers stop waiting for it) or a
    /// replacement took its id (it counts again). Returns the barriers
    /// this completes.
    pub fn set_failed_over(&mut self, id: NodeId, failed_over: bool) -> Vec<Action> {
        let changed = if failed_over {
            self.failed_over.insert(id)
        } else {
            self.failed_over.remove(&id)
        };
        if !changed || self.elastic.is_some() {
            return Vec::new();
        }
        let mut groups: Vec<i32> = self.barriers.keys().copied().collect();
        groups.sort_unstable();
        groups
            .into_iter()
            .flat_map(|g| self.try_release(g))
            .collect()
    }

    fn heartbeat(&mut self, msg: &Message, now: Instant) -> Vec<Action> {
        let sender = msg.meta.sender;
        if !self.is_member(sender) {
            debug!("scheduler: dropping HEARTBEAT from unknown node {sender}");
            return Vec::new();
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
        vec![Action::Send(ack)]
    }

    /// An admin client's STATUS request: answer with
    /// [`Scheduler::status_table`] on the connection it came on.
    fn status(&mut self, msg: &Message, now: Instant) -> Vec<Action> {
        if !msg.meta.request {
            debug!("scheduler: dropping a STATUS answer: the scheduler only answers them");
            return Vec::new();
        }
        let Some(route) = msg.meta.route.clone() else {
            debug!(
                "scheduler: dropping STATUS from node {}: admin clients connect without an \
                 identity",
                msg.meta.sender
            );
            return Vec::new();
        };
        debug!("scheduler: status request from an admin client");
        let mut answer = Message::control(Command::Status, K_EMPTY);
        answer.meta.status = self.status_table(now);
        answer.meta.timestamp = msg.meta.timestamp;
        vec![Action::Reply { route, msg: answer }]
    }

    /// The scheduler first, then every process (by id; before the cluster
    /// forms, the registrations so far, without ids), each with how long ago
    /// it was last heard from, whether it is dead, and its latest counters.
    /// In elastic mode each worker of the round carries its rank, and the
    /// workers waiting for a round follow, marked `waiting`.
    /// Keys are left out: an admin client is not a member.
    pub fn status_table(&self, now: Instant) -> Vec<NodeStatus> {
        let mut rows = self.status_rows(now);
        for row in &mut rows {
            row.node.key = 0;
        }
        rows
    }

    fn status_rows(&self, now: Instant) -> Vec<NodeStatus> {
        let mut rows = vec![NodeStatus {
            node: self.cfg.me.clone(),
            last_seen: Some(Duration::ZERO),
            dead: false,
            counters: None,
            counters_age: None,
            waiting: false,
            round_rank: None,
        }];
        let round = self.round().map_or(&[][..], |(_, members)| members);
        let nodes: Vec<&Node> = if self.ready {
            self.process_nodes()
        } else {
            self.nodes.iter().collect()
        };
        for node in nodes {
            let known = self.ready.then_some(node.id);
            let counters = known.and_then(|id| self.counters.get(&id));
            rows.push(NodeStatus {
                node: node.clone(),
                last_seen: known
                    .and_then(|id| self.last_seen.get(&id))
                    .map(|&seen| now.saturating_duration_since(seen)),
                dead: known.is_some_and(|id| self.is_dead(id, now)),
                counters: counters.map(|(c, _)| c.clone()),
                counters_age: counters.map(|&(_, at)| now.saturating_duration_since(at)),
                waiting: false,
                round_rank: known
                    .and_then(|id| round.iter().position(|&m| m == id))
                    .map(|rank| rank as u32),
            });
        }
        if let Some(e) = &self.elastic {
            let waiting = e.rdzv.waiting();
            let mut outside: Vec<&Node> = e
                .outside
                .iter()
                .filter(|n| waiting.contains(&n.id))
                .collect();
            outside.sort_by_key(|n| n.id);
            outside.dedup_by_key(|n| n.id);
            rows.extend(outside.into_iter().map(|node| NodeStatus {
                node: node.clone(),
                last_seen: None,
                dead: false,
                counters: None,
                counters_age: None,
                waiting: true,
                round_rank: None,
            }));
        }
        rows
    }

    /// The number of registrations a barrier over `group` waits for.
    fn group_size(&self, group: i32) -> i32 {
        let mut size = 0;
        if group & ids::SCHEDULER_GROUP != 0 {
            size += 1;
        }
        if group & ids::SERVER_GROUP != 0 {
            size += match self.cfg.min_servers {
                // The servers in the table (those that left or failed over
                // are not waited for: see `try_release`).
                Some(_) => self
                    .process_nodes()
                    .iter()
                    .filter(|n| n.role == Role::Server)
                    .count() as i32,
                None => self.cfg.num_servers,
            };
        }
        if group & ids::WORKER_GROUP != 0 {
            size += self.cfg.num_workers;
        }
        size
    }

    fn is_member(&self, id: NodeId) -> bool {
        id == SCHEDULER || (self.ready && self.nodes.iter().any(|n| n.id == id))
    }

    fn is_dead(&self, id: NodeId, now: Instant) -> bool {
        if self.left.contains(&id) {
            return true;
        }
        let Some(timeout) = self.cfg.heartbeat_timeout else {
            return false;
        };
        if self.gone(id, now) {
            return true;
        }
        if !self.cfg.watch_all && !self.heartbeating.contains(&id) {
            return false;
        }
        // The time spent deaf counts as nobody's silence.
        let until = self.deaf_since.map_or(now, |since| since.min(now));
        self.last_seen
            .get(&id)
            .is_none_or(|&seen| until.saturating_duration_since(seen) > timeout)
    }

    /// Whether process `id`'s connection closed at least [`LINK_GRACE`]
    /// ago and did not come back (ZeroMQ reconnects to a live process in
    /// about 100 ms): its process is gone, the kernel closed its sockets;
    /// and were it alive, nothing could reach it. Watched like heartbeats,
    /// and for every pslite node; a paused process keeps its connections,
    /// and only heartbeats notice it.
    fn gone(&self, id: NodeId, now: Instant) -> bool {
        self.link_deadline(id).is_some_and(|at| now >= at)
    }

    /// When process `id` counts as gone if its closed connection stays
    /// closed ([`Scheduler::gone`]); `None` if its connection is up or it
    /// is not watched.
    fn link_deadline(&self, id: NodeId) -> Option<Instant> {
        let &since = self.disconnected.get(&id)?;
        let waiting = self
            .elastic
            .as_ref()
            .is_some_and(|e| e.outside.iter().any(|n| n.id == id));
        let known = waiting || self.nodes.iter().any(|n| n.id == id);
        let watched = self.cfg.heartbeat_timeout.is_some()
            && known
            && (self.cfg.watch_all
                || self.heartbeating.contains(&id)
                || self.is_pslite(id)
                || waiting);
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

    /// The first entry of each process, in id order.
    fn process_nodes(&self) -> Vec<&Node> {
        let mut seen = HashSet::new();
        let mut nodes: Vec<&Node> = self.nodes.iter().filter(|n| seen.insert(n.id)).collect();
        nodes.sort_by_key(|n| n.id);
        nodes
    }

    fn processes(&self) -> Vec<NodeId> {
        self.process_nodes().into_iter().map(|n| n.id).collect()
    }

    /// ADD_NODE carrying the whole table: every entry, then the scheduler;
    /// in elastic mode, with the round and its members in rank order.
    fn table_message(&self) -> Message {
        let mut msg = Message::control(Command::AddNode, K_EMPTY);
        msg.meta.control.node = self.nodes.clone();
        msg.meta.control.node.push(self.cfg.me.clone());
        if let Some((number, members)) = self.round() {
            msg.meta.control.round = Some(number);
            msg.meta.control.round_members = members.to_vec();
        }
        msg
    }

    /// Elastic mode: the running round's number and members in rank order.
    pub fn round(&self) -> Option<(u64, &[NodeId])> {
        self.elastic.as_ref().and_then(|e| e.rdzv.round())
    }

    /// Elastic mode: workers waiting for the next round.
    pub fn waiting_workers(&self) -> &[NodeId] {
        self.elastic.as_ref().map_or(&[], |e| e.rdzv.waiting())
    }

    /// Elastic mode: deaths of round members, the last call, the timeout.
    fn elastic_tick(&mut self, now: Instant) -> Vec<Action> {
        let Some(e) = &self.elastic else {
            return Vec::new();
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
        let mut actions = Vec::new();
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
                    self.cfg.heartbeat_timeout.unwrap_or_default().as_secs()
                );
            }
            actions.extend(self.leave(id, now));
        }
        let Some(e) = &mut self.elastic else {
            return actions;
        };
        let events = e.rdzv.tick(now);
        actions.extend(self.on_rounds(events, now));
        actions.extend(self.settle_barriers(now));
        actions
    }

    /// Elastic mode: worker `id` died or left.
    fn leave(&mut self, id: NodeId, now: Instant) -> Vec<Action> {
        let Some(e) = &mut self.elastic else {
            return Vec::new();
        };
        let known = e.members.contains(&id) || e.outside.iter().any(|n| n.id == id);
        if !known || ids::role_of_id(id) != Some(Role::Worker) {
            debug!("scheduler: ignoring LEAVE from node {id}: not an elastic worker");
            return Vec::new();
        }
        info!("scheduler: worker {id} leaves the job");
        e.outside.retain(|n| n.id != id);
        e.members.retain(|&m| m != id);
        let events = e.rdzv.leave(id, now);
        let mut actions = self.on_rounds(events, now);
        // Not in the table any more (if the round went on without it).
        self.nodes.retain(|n| n.id != id);
        self.forget(id);
        actions.extend(self.settle_barriers(now));
        actions
    }

    fn forget(&mut self, id: NodeId) {
        self.disconnected.remove(&id);
        self.last_seen.remove(&id);
        self.heartbeating.remove(&id);
        self.counters.remove(&id);
        self.dead_since.remove(&id);
    }

    /// Elastic mode: a registration. Ids in registration order; workers
    /// join the rounds.
    fn elastic_add_node(&mut self, node: &Node, sender: NodeId, now: Instant) -> Vec<Action> {
        let servers = self.count(Role::Server);
        let Some(e) = &mut self.elastic else {
            return Vec::new();
        };
        if !node.pslite {
            self.dropped(sender, "ADD_NODE from _: elastic mode (DMLC_NUM_WORKER=MIN:MAX)", format!("scheduler: dropping ADD_NODE from {node}: elastic mode (DMLC_NUM_WORKER=MIN:MAX) \
                 is pslite-only, C++ ps-lite nodes cannot join it"));
            return Vec::new();
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
                return Vec::new();
            }
            let repeat = self
                .nodes
                .iter()
                .chain(&e.outside)
                .any(|n| n.same_process(node) && n.customer_id == node.customer_id);
            if repeat {
                debug!("scheduler: ignoring a repeated ADD_NODE from {node}");
                return Vec::new();
            }
            // Another customer of a registered process: it shares the id.
            let mut entry = node.clone();
            entry.id = known.id;
            entry.is_recovery = false;
            if e.outside.iter().any(|n| n.id == known.id) {
                e.outside.push(entry);
                return Vec::new();
            }
            self.nodes.push(entry);
            if !self.ready {
                return Vec::new();
            }
            let mut table = self.table_message();
            table.meta.recver = known.id;
            return vec![Action::Send(table)];
        }
        if let Some((have, min, secs)) = e.failed {
            let mut entry = node.clone();
            entry.id = ids::worker_rank_to_id(e.next_worker);
            e.next_worker += 1;
            warn!(
                "scheduler: {} registers after the elastic job failed: telling it",
                node.address()
            );
            return self.tell_failure(&[entry], have, min, secs, now);
        }
        let mut entry = node.clone();
        entry.is_recovery = false;
        if node.role == Role::Server {
            if servers >= self.cfg.num_servers {
                self.dropped(
                    sender,
                    "ADD_NODE from _: all _ servers have registered",
                    format!(
                        "scheduler: dropping ADD_NODE from {node}: all {} servers have registered \
                     (is DMLC_NUM_SERVER right?)",
                        self.cfg.num_servers
                    ),
                );
                return Vec::new();
            }
            entry.id = ids::server_rank_to_id(e.next_server);
            e.next_server += 1;
            info!(
                "scheduler: server {} registered as node {}",
                node.address(),
                entry.id
            );
            self.nodes.push(entry);
            return self.maybe_form(now);
        }
        entry.id = ids::worker_rank_to_id(e.next_worker);
        e.next_worker += 1;
        let id = entry.id;
        // Connected at once: a worker whose process dies while it waits
        // for a round is noticed by its closed connection (it sends no
        // heartbeat before it joins).
        let link = e.linked.insert(id).then(|| Action::Connect(entry.clone()));
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
        let mut actions: Vec<Action> = link.into_iter().collect();
        actions.extend(self.on_rounds(events, now));
        actions.extend(self.settle_barriers(now));
        actions
    }

    /// Elastic mode: carries out what the rounds decided.
    fn on_rounds(&mut self, events: Vec<RendezvousEvent>, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        for event in events {
            match event {
                RendezvousEvent::RoundBegan { number, members } => {
                    info!("scheduler: elastic round {number} began with workers {members:?}");
                    actions.extend(self.round_began(&members, now));
                    actions.push(Action::RoundBegan {
                        round: number,
                        workers: members,
                    });
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
                    actions.extend(self.tell_failure(&everyone, have, min, waited.as_secs(), now));
                    actions.push(Action::Failed(failure));
                }
            }
        }
        actions
    }

    /// LEAVE to every process in `nodes`: the job failed.
    fn tell_failure(
        &mut self,
        nodes: &[Node],
        have: usize,
        min: usize,
        secs: u64,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut told = HashSet::new();
        for node in nodes {
            if !told.insert(node.id) || (self.ready && self.is_dead(node.id, now)) {
                continue;
            }
            actions.extend(self.link(node));
            let mut msg = Message::control(Command::Leave, node.id);
            // Its own entry, with its key: a node that has not joined yet
            // (no table, so no scheduler's key to check) knows it comes
            // from the scheduler it registered with.
            msg.meta.control.node = vec![node.clone()];
            msg.meta.control.round = Some(secs);
            msg.meta.control.round_members = vec![have as NodeId, min as NodeId];
            actions.push(Action::Send(msg));
        }
        actions
    }

    /// A connection to `node`, if none was opened yet.
    fn link(&mut self, node: &Node) -> Option<Action> {
        let e = self.elastic.as_mut()?;
        e.linked
            .insert(node.id)
            .then(|| Action::Connect(node.clone()))
    }

    /// Elastic mode: a round began with `members`: the table becomes the
    /// servers and the members, and everyone in it is told.
    fn round_began(&mut self, members: &[NodeId], now: Instant) -> Vec<Action> {
        let Some(e) = &mut self.elastic else {
            return Vec::new();
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
        let before: HashSet<NodeId> = e.members.iter().copied().collect();
        let newcomers: Vec<NodeId> = members
            .iter()
            .copied()
            .filter(|id| !before.contains(id))
            .collect();
        let gone: Vec<NodeId> = e
            .members
            .iter()
            .copied()
            .filter(|id| !members.contains(id))
            .collect();
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
            return self.maybe_form(now);
        }
        for &id in &newcomers {
            self.last_seen.insert(id, now);
        }
        self.send_table(now)
    }

    /// The table to every live process in it.
    fn send_table(&mut self, now: Instant) -> Vec<Action> {
        let table = self.table_message();
        let processes: Vec<Node> = self.process_nodes().into_iter().cloned().collect();
        let mut actions = Vec::new();
        for node in processes {
            if self.is_dead(node.id, now) {
                continue;
            }
            actions.extend(self.link(&node));
            let mut msg = table.clone();
            msg.meta.recver = node.id;
            actions.push(Action::Send(msg));
        }
        actions
    }

    /// Elastic mode: the cluster forms once every server registered and
    /// the first round began.
    fn maybe_form(&mut self, now: Instant) -> Vec<Action> {
        if self.ready || self.round().is_none() || self.count(Role::Server) < self.cfg.num_servers {
            return Vec::new();
        }
        self.ready = true;
        for id in self.processes() {
            self.last_seen.insert(id, now);
        }
        for node in self.process_nodes() {
            info!("scheduler: assigned id {} to {}", node.id, node.address());
        }
        let mut actions = self.send_table(now);
        actions.push(Action::Ready);
        actions
    }

    /// Elastic mode: releases every barrier whose arrivals are complete;
    /// waiting workers are admitted at a barrier over the workers first.
    fn settle_barriers(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if !self.ready {
            return actions;
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
                    actions.extend(self.on_rounds(events, now));
                }
            }
            actions.extend(self.release_arrivals(group));
        }
        actions
    }

    /// Elastic mode: whether the barrier over `group` has every arrival of
    /// the current round's members (and of the servers and the scheduler).
    fn barrier_complete(&self, group: i32) -> bool {
        let Some(round) = self.barriers.get(&group) else {
            return false;
        };
        let mut expected = 0;
        if group & ids::SCHEDULER_GROUP != 0 {
            expected += 1;
        }
        if group & ids::SERVER_GROUP != 0 {
            expected += self.cfg.num_servers as usize;
        }
        if group & ids::WORKER_GROUP != 0 {
            match self.round() {
                Some((_, members)) => expected += members.len(),
                None => return false,
            }
        }
        let present = |id: NodeId| id == SCHEDULER || self.nodes.iter().any(|n| n.id == id);
        let arrived = round.arrived.iter().filter(|(id, _)| present(*id)).count()
            + round
                .excused
                .iter()
                .filter(|&&id| present(id) && !round.arrived.iter().any(|&(a, _)| a == id))
                .count();
        arrived >= expected
    }

    /// Elastic mode: releases the barrier over `group` to those that
    /// arrived at it and are still members.
    fn release_arrivals(&mut self, group: i32) -> Vec<Action> {
        let Some(round) = self.barriers.remove(&group) else {
            return Vec::new();
        };
        let waiting: BTreeSet<NodeId> = round
            .arrived
            .iter()
            .map(|&(id, _)| id)
            .filter(|&id| id == SCHEDULER || self.nodes.iter().any(|n| n.id == id))
            .collect();
        debug!("scheduler: barrier {group} released to {waiting:?}");
        round.release(group, waiting)
    }
}

#[cfg(test)]
mod tests;
