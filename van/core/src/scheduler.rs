//! The scheduler's control plane as a state machine, with no sockets and no
//! clock: the core feeds it each control message and the current time, and
//! carries out the [`crate::effects::Effect`]s it emits (a [`Component`] of the core).
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
//!
//! One state, its concepts in files: `table.rs` (ids and the node table,
//! recovery's id takeover), `barriers.rs`, `recovery.rs` (liveness, dead
//! nodes, the clock), `elastic.rs` (rounds), `status.rs` and `stop.rs` (a
//! job that stops: every node told why).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use log::{debug, warn};
use pslite_proto::ids::NodeId;
use pslite_proto::stats::NodeCounters;
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};

use crate::component::{Component, Cx};
use crate::config::VanConfig;
use crate::effects::{Effects, Event};
use crate::rendezvous::Rendezvous;

/// What the scheduler needs to know: its own node and the cluster's
/// settings (size, `MIN:MAX` of servers or workers, heartbeats,
/// `PS_RECOVERY_TIMEOUT`: the fields of [`VanConfig`] it reads).
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// The scheduler's own node (role SCHEDULER, id 1, its host and port).
    pub me: Node,
    /// The cluster's settings.
    pub van: VanConfig,
}

/// How many registrations are still missing, per role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// Servers that have not registered.
    pub servers: i32,
    /// Workers that have not registered.
    pub workers: i32,
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
    /// they take the first one that dies (see [`Scheduler::on_tick`]).
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
    /// This scheduler's own outage: it heard from (almost) no node at once
    /// (see `scheduler/outage.rs`).
    outage: Option<Instant>,
    /// The table changed since it was last announced (after the cluster
    /// formed).
    table_changed: bool,
    /// Ids restarted processes took over in the current call (announced
    /// around its effects).
    replacing: Vec<NodeId>,
    /// The job stops: who was told (see `stop.rs`).
    stopping: Option<stop::Stopping>,
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
    /// The round each process was last sent the table of, by
    /// [`Scheduler::send_table`]: a process that holds the previous round
    /// gets the next one as a change (O(change) bytes, not the table).
    sent_round: HashMap<NodeId, u64>,
    /// The round of the last table sent to everyone, and its members.
    table_round: Option<u64>,
    sent_members: Vec<NodeId>,
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
            elastic: cfg.van.elastic.map(|rc| Elastic {
                rdzv: Rendezvous::new(rc, now),
                next_server: 0,
                next_worker: 0,
                outside: Vec::new(),
                linked: HashSet::new(),
                members: Vec::new(),
                failed: None,
                excused_next: HashSet::new(),
                sent_round: HashMap::new(),
                table_round: None,
                sent_members: Vec::new(),
            }),
            cfg,
            deaf_since: None,
            next_keepalive: None,
            outage: None,
            table_changed: false,
            replacing: Vec::new(),
            stopping: None,
        }
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

    /// When [`Scheduler::on_tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.stopping.is_some() {
            return self.stopping_timeout();
        }
        if self.deaf_since.is_some() {
            return self.next_keepalive;
        }
        let rounds = self.elastic.as_ref().and_then(|e| e.rdzv.poll_timeout());
        match (rounds, self.liveness_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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
            servers: (self.cfg.van.min_servers.unwrap_or(self.cfg.van.num_servers)
                - count(Role::Server))
            .max(0),
            workers: (self.cfg.van.num_workers - count(Role::Worker)).max(0),
        }
    }

    /// Handles one control message addressed to the scheduler.
    pub fn on_message(&mut self, msg: &Message, now: Instant, fx: &mut Effects) {
        let sender = msg.meta.sender;
        let mut back = Effects::default();
        if sender != K_EMPTY && self.is_member(sender) {
            self.last_seen.insert(sender, now);
            if self.outage.is_some() {
                self.watch_outage(now);
            }
            if self.dead_since.contains_key(&sender) && !self.is_dead(sender, now) {
                // Stopped or cut off, not dead: nothing took its place, so
                // it is taken back, and everyone is told at once.
                warn!("scheduler: node {sender}, held dead, is back");
                self.dead_since.remove(&sender);
                self.tell_dead_nodes(now, &mut back);
                if self.is_pslite(sender) {
                    // What changed while it was held dead (a replacement's
                    // new address and key, say) was not sent to it.
                    back.send(self.table_to(sender));
                }
                back.event(Event::Back(sender));
            }
        }
        let mut actions = Effects::default();
        self.handle_command(msg, now, &mut actions);
        actions.extend(back);
        self.announce(actions, fx);
    }

    /// Emits a call's `actions` with what others must learn of them:
    /// restarted processes taking over ids (before anything else: the range
    /// map drops them first), the table if it changed, and the takeovers
    /// done (last).
    pub(super) fn announce(&mut self, actions: Effects, fx: &mut Effects) {
        let replacing = std::mem::take(&mut self.replacing);
        let changed = std::mem::take(&mut self.table_changed) && self.ready;
        if !replacing.is_empty() {
            fx.event(Event::Replacing(replacing.clone()));
        }
        fx.extend(actions);
        if changed {
            fx.event(Event::TableChanged(self.table()));
        }
        if !replacing.is_empty() {
            fx.event(Event::Replaced(replacing));
        }
    }

    /// The node table as the nodes get it: every entry, this scheduler last.
    pub fn table(&self) -> Vec<Node> {
        let mut table = self.nodes.clone();
        table.push(self.cfg.me.clone());
        table
    }

    /// The servers' ids, ascending.
    pub(super) fn server_ids(&self) -> Vec<NodeId> {
        let mut servers: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|n| n.role == Role::Server)
            .map(|n| n.id)
            .collect();
        servers.sort_unstable();
        servers.dedup();
        servers
    }

    fn handle_command(&mut self, msg: &Message, now: Instant, fx: &mut Effects) {
        let sender = msg.meta.sender;
        match msg.meta.control.cmd {
            Command::AddNode => self.add_node(msg, now, fx),
            Command::Barrier => self.barrier(msg, now, fx),
            Command::Heartbeat => self.heartbeat(msg, now, fx),
            Command::Status => self.status(msg, now, fx),
            Command::Leave if self.elastic.is_some() => self.leave(sender, now, fx),
            cmd => {
                self.dropped(
                    sender,
                    "_ from node _: not a scheduler command",
                    format!(
                        "scheduler: dropping {cmd:?} from node {sender}: not a scheduler command"
                    ),
                );
            }
        }
    }
}

impl Component for Scheduler {
    /// A registration (checked), a barrier request, a heartbeat, a status
    /// request, an elastic worker's LEAVE.
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        self.on_message(&msg, now, cx.fx);
    }

    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        self.on_tick(now, cx.fx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Scheduler::poll_timeout(self)
    }

    /// A registration whose address answered; replicated ranges failing
    /// over, and servers leaving.
    fn on_event(&mut self, event: &Event, now: Instant, cx: &mut Cx<'_>) {
        match event {
            Event::Registered(msg) => self.on_message(msg, now, cx.fx),
            Event::FailedOver {
                server,
                failed_over,
            } => self.set_failed_over(*server, *failed_over, cx.fx),
            Event::ServerLeft(id) => self.server_left(*id, now, cx.fx),
            Event::StopJob(why) => self.stop_job(why, now, cx.fx),
            _ => {}
        }
    }
}

mod barriers;
mod elastic;
mod outage;
mod recovery;
mod status;
mod stop;
mod table;

pub use stop::STOP_GRACE;

use barriers::BarrierRound;

#[cfg(test)]
mod tests;
