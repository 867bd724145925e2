//! The node side of the control plane (a server or a worker, and the
//! scheduler's own view of itself) as a state machine, with no sockets and
//! no clock: the core feeds it control messages and the time, and carries
//! out the [`Effect`]s it returns (membership, a [`Component`] of the
//! core).
//!
//! It covers joining (ADD_NODE out, the scheduler's node table in, the start
//! deadline and the "still waiting" log lines), node-table updates after a
//! recovery (reconnect to a node that moved, resend to a node replaced),
//! barrier waits and their release, heartbeats to the scheduler and the
//! detection of a lost scheduler.
//!
//! No single message ends a node: a node table that lacks this node, that
//! gives it an id of another role, or that comes from anyone but the
//! scheduler is logged and ignored; only the start deadline ends a node
//! that is still joining.
//!
//! One state, its concepts in files: `table.rs` (joining, the node table
//! and its updates, rounds), `barriers.rs` and `liveness.rs` (heartbeats,
//! the scheduler's loss, dead peers, the clock).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Node, Role};

use crate::component::{Component, Cx};
use crate::config::VanConfig;
use crate::effects::{Effect, Event, Output};
use crate::error::Failure;

/// How long a closed connection to a peer must stay closed, with nothing
/// heard from the peer meanwhile, before the peer counts as gone: its
/// process died and the kernel closed its sockets (ZeroMQ reconnects to a
/// live peer within about 100 ms).
pub const LINK_GRACE: Duration = Duration::from_secs(1);

/// A clock-driven step that comes this much later than it was due means the
/// process was stopped meanwhile (SIGSTOP, a VM pause, a debugger, heavy
/// swapping): the time it lost is not held against its peers.
pub const PAUSE_SLACK: Duration = Duration::from_secs(2);

/// How often a node still waiting to join says so.
pub const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What the node side needs to know: who it is, where the scheduler is,
/// and the node's settings (cluster size, `PS_START_TIMEOUT`, heartbeats,
/// `PS_RECOVERY_TIMEOUT`: the fields of [`VanConfig`] it reads).
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// This node: role, host and port (id [`K_EMPTY`](pslite_proto::K_EMPTY), or [`SCHEDULER`] on
    /// the scheduler).
    pub me: Node,
    /// The scheduler (id 1, its host and port).
    pub scheduler: Node,
    /// The node's settings.
    pub van: VanConfig,
}

/// How a barrier this node waits on ended.
pub type BarrierOutcome = Result<(), Failure>;

pub(super) struct BarrierWaiter {
    token: u64,
    group: i32,
    outcome: Option<BarrierOutcome>,
}

pub(super) struct Joining {
    since: Instant,
    deadline: Instant,
    next_log: Instant,
}

/// The node side's state.
pub struct Member {
    cfg: MemberConfig,
    me: Node,
    table: Vec<Node>,
    /// Elastic mode: the newest round that came as a change before this
    /// node had joined (it overtook the table): once joined at an older
    /// round, the node asks for the whole table.
    early_change: Option<u64>,
    joined: bool,
    failure: Option<Failure>,
    joining: Option<Joining>,
    timed_out: Option<Duration>,
    barriers: Vec<BarrierWaiter>,
    next_token: u64,
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
    /// Ignored node tables (logged once).
    ignored_tables: u32,
    /// The timestamp of the scheduler's message that last set each entry
    /// of the table: an update older than that (resent after a newer one
    /// that arrived first) is stale.
    set_at: HashMap<NodeId, i32>,
    /// Elastic mode: the current round and its workers in rank order, and
    /// the round this node joined in.
    round: Option<(u64, Vec<NodeId>)>,
    joined_round: Option<u64>,
    /// Since when this node reads nothing (an app's queue is full): silence
    /// proves nothing meanwhile.
    deaf_since: Option<Instant>,
    /// Key ranges are replicated: a dead server's ranges fail over, nothing
    /// waits for its replacement.
    servers_replicated: bool,
}

impl Member {
    /// The node side of a node that has not joined yet.
    pub fn new(cfg: MemberConfig, now: Instant) -> Member {
        Member {
            me: cfg.me.clone(),
            cfg,
            table: Vec::new(),
            joined: false,
            failure: None,
            joining: None,
            timed_out: None,
            barriers: Vec::new(),
            next_token: 0,
            last_scheduler_contact: now,
            next_heartbeat: None,
            scheduler_answers: false,
            scheduler_silent: false,
            scheduler_closed: None,
            dead: HashMap::new(),
            given_up: HashSet::new(),
            ignored_tables: 0,
            early_change: None,
            set_at: HashMap::new(),
            round: None,
            joined_round: None,
            deaf_since: None,
            servers_replicated: false,
        }
    }

    /// This node as the cluster knows it.
    pub fn me(&self) -> &Node {
        &self.me
    }

    /// Tests: this node advertises `features` (as an older pslite node,
    /// `0`, would).
    #[cfg(any(test, feature = "harness"))]
    pub(crate) fn set_features(&mut self, features: u32) {
        self.me.features = features;
    }

    /// The node table (servers, workers and the scheduler) once joined.
    pub fn table(&self) -> &[Node] {
        &self.table
    }

    /// Whether this node has joined.
    pub fn is_joined(&self) -> bool {
        self.joined
    }

    /// Why the node failed, if it did.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// How long this node waited before giving up joining, if it did.
    pub fn timed_out(&self) -> Option<Duration> {
        self.timed_out
    }

    /// Elastic mode: the current round and its workers in rank order.
    pub fn round(&self) -> Option<(u64, &[NodeId])> {
        self.round.as_ref().map(|(n, m)| (*n, m.as_slice()))
    }

    /// Elastic mode: the round this node joined in.
    pub fn joined_round(&self) -> Option<u64> {
        self.joined_round
    }

    /// Whether `id` is in the node table.
    pub fn is_member(&self, id: NodeId) -> bool {
        self.table.iter().any(|n| n.id == id)
    }

    /// The table entry of `id`.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.table.iter().find(|n| n.id == id)
    }

    /// Fails the node: every wait ends with `failure`. Returns the effects
    /// that report it, the first time only.
    pub fn fail(&mut self, failure: Failure) -> Vec<Effect> {
        if self.failure.is_some() {
            return Vec::new();
        }
        for w in self.barriers.iter_mut() {
            w.outcome.get_or_insert(Err(failure.clone()));
        }
        self.failure = Some(failure.clone());
        vec![Effect::Changed, Effect::Out(Output::Failed(failure))]
    }
}

mod barriers;
mod liveness;
mod table;

impl Component for Member {
    /// The scheduler's node table (or an update of it), its LEAVE, its
    /// barrier release, its heartbeat answer.
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        let effects = match msg.meta.control.cmd {
            Command::AddNode => {
                let mut effects = self.on_node_table(&msg, now);
                if msg.meta.sender == SCHEDULER {
                    effects.push(Effect::Event(Event::TableTaken));
                }
                effects
            }
            Command::Leave => self.on_leave(&msg),
            Command::Barrier => {
                self.on_barrier_release(&msg);
                vec![Effect::Changed]
            }
            Command::Heartbeat if msg.meta.sender == SCHEDULER && self.joined => {
                // Only a pslite scheduler sends a dead list; from a C++ one
                // (whose identity carries no key) it is forged.
                let pslite = self.me.role == Role::Scheduler
                    || self.node(SCHEDULER).is_some_and(|n| n.pslite);
                let dead: &[NodeId] = if pslite {
                    &msg.meta.control.dead_nodes
                } else {
                    &[]
                };
                let before = self.declared_dead();
                self.on_scheduler_heartbeat(dead, now);
                let after = self.declared_dead();
                if after != before {
                    vec![Effect::Event(Event::DeadNodes(after))]
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        };
        cx.fx.extend(effects);
    }

    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        let effects = Member::tick(self, now);
        cx.fx.extend(effects);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Member::poll_timeout(self)
    }

    /// The scheduler's own table (this node is the scheduler), its rounds;
    /// replicated ranges; this server leaving.
    fn on_event(&mut self, event: &Event, _now: Instant, cx: &mut Cx<'_>) {
        let effects = match event {
            Event::Formed(table) => self.formed(table.clone()),
            Event::TableChanged(table) if self.joined => self.formed(table.clone()),
            Event::Round { round, workers } => self.set_round(*round, workers.clone()),
            Event::Replicated => {
                self.set_servers_replicated();
                Vec::new()
            }
            Event::Left => {
                self.release_barriers();
                Vec::new()
            }
            _ => Vec::new(),
        };
        cx.fx.extend(effects);
    }
}

/// The elastic round a scheduler's ADD_NODE carries (pslite-only fields
/// 102 and 103), if any.
pub(super) fn msg_round(msg: &Message) -> Option<(u64, Vec<NodeId>)> {
    let c = &msg.meta.control;
    c.round.map(|n| (n, c.round_members.clone()))
}

/// Whether timestamp `a` comes before `b` (timestamps count up and wrap at
/// `i32::MAX`).
pub(super) fn older(a: i32, b: i32) -> bool {
    let ahead = b.wrapping_sub(a) & i32::MAX;
    ahead != 0 && ahead < 1 << 30
}
