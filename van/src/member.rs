//! The node side of the control plane (a server or a worker, and the
//! scheduler's own view of itself) as a state machine, with no sockets and
//! no clock: [`crate::Core`] feeds it control messages and the time, and
//! carries out the [`MemberAction`]s it returns.
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

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};

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

/// What the node side needs to know.
#[derive(Clone, Debug)]
pub struct MemberConfig {
    /// This node: role, host and port (id [`K_EMPTY`], or [`SCHEDULER`] on
    /// the scheduler).
    pub me: Node,
    /// The scheduler (id 1, its host and port).
    pub scheduler: Node,
    /// `DMLC_NUM_SERVER`.
    pub num_servers: i32,
    /// `DMLC_NUM_WORKER`.
    pub num_workers: i32,
    /// How long joining may take (`PS_START_TIMEOUT`).
    pub start_timeout: Duration,
    /// How often to send heartbeats (`PS_HEARTBEAT_INTERVAL`).
    pub heartbeat_interval: Option<Duration>,
    /// Silence from the scheduler after which it counts as lost
    /// (`PS_HEARTBEAT_TIMEOUT`).
    pub heartbeat_timeout: Option<Duration>,
    /// Watch the scheduler from the start (`PS_HEARTBEAT_TIMEOUT` was set);
    /// otherwise only once it has answered a heartbeat.
    pub watch_all: bool,
    /// How long a node declared dead may stay unreplaced before barriers and
    /// requests that wait for it fail (`PS_RECOVERY_TIMEOUT`).
    pub recovery_timeout: Duration,
}

/// Something the node side asks for, in order.
// Most actions are sends, and they live only until the core carries them
// out: boxing the message would cost an allocation per send for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberAction {
    /// Open (or replace) the connection to this node, under this node's
    /// current identity.
    Connect(Node),
    /// Send this control message to `meta.recver` (the core stamps the
    /// sender and the timestamp).
    Send(Message),
    /// This node has joined: its id and the node table are known.
    Joined,
    /// Node `id` restarted and took its old id: what it never answered must
    /// go to the new process.
    PeerReplaced(NodeId),
    /// Node `id` died and was not replaced in time: what waits on it fails.
    PeerDead(NodeId),
    /// The node cannot go on.
    Failed(Failure),
    /// Elastic mode: a round began (or this node joined one).
    RoundBegan {
        /// The round number.
        round: u64,
        /// Its workers in rank order.
        workers: Vec<NodeId>,
    },
    /// A barrier waiter's deadline passed: its outcome is set.
    BarrierEnded,
    /// Still waiting to join (a log line for the operator).
    Waiting {
        /// How long this node has waited.
        waited: Duration,
        /// The start timeout.
        limit: Duration,
    },
}

/// How a barrier this node waits on ended.
pub type BarrierOutcome = Result<(), Failure>;

struct BarrierWaiter {
    token: u64,
    group: i32,
    outcome: Option<BarrierOutcome>,
    /// When the waiter gives up, and after how long (its timeout).
    deadline: Option<(Instant, Duration)>,
}

struct Joining {
    since: Instant,
    deadline: Instant,
    next_log: Instant,
}

/// The node side's state.
pub struct Member {
    cfg: MemberConfig,
    me: Node,
    table: Vec<Node>,
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
            scheduler_closed: None,
            dead: HashMap::new(),
            given_up: HashSet::new(),
            ignored_tables: 0,
            set_at: HashMap::new(),
            round: None,
            joined_round: None,
            deaf_since: None,
            servers_replicated: false,
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

    /// This node as the cluster knows it.
    pub fn me(&self) -> &Node {
        &self.me
    }

    /// Tests: this node advertises `features` (as an older pslite node,
    /// `0`, would).
    #[cfg(test)]
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

    /// Elastic mode: round `number` with `workers` is current (the
    /// scheduler's own view). Reports it if it is news.
    pub fn set_round(&mut self, number: u64, workers: Vec<NodeId>) -> Vec<MemberAction> {
        if self.round.as_ref().is_some_and(|(n, _)| *n == number) {
            return Vec::new();
        }
        self.joined_round.get_or_insert(number);
        self.round = Some((number, workers.clone()));
        vec![MemberAction::RoundBegan {
            round: number,
            workers,
        }]
    }

    /// The scheduler's LEAVE: the elastic job failed (too few workers for
    /// too long); `round` carries the seconds waited, `round_members` the
    /// workers it had and the minimum.
    /// Without `round`, the scheduler fences this node: its id was given to
    /// the process in `node` while this one was stopped or cut off, and it
    /// must not come back.
    pub fn on_leave(&mut self, msg: &Message) -> Vec<MemberAction> {
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

    /// Whether `id` is in the node table.
    pub fn is_member(&self, id: NodeId) -> bool {
        self.table.iter().any(|n| n.id == id)
    }

    /// The table entry of `id`.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.table.iter().find(|n| n.id == id)
    }

    /// When the scheduler was last heard from.
    pub fn last_scheduler_contact(&self) -> Instant {
        self.last_scheduler_contact
    }

    /// Starts joining as `customer_id`: the ADD_NODE to send (none on the
    /// scheduler, nor once joined). The start deadline runs from the first
    /// call.
    pub fn register(&mut self, customer_id: i32, now: Instant) -> Vec<MemberAction> {
        if self.joined {
            return Vec::new();
        }
        let mut actions = Vec::new();
        if self.joining.is_none() {
            self.joining = Some(Joining {
                since: now,
                deadline: now + self.cfg.start_timeout,
                next_log: now + WAIT_LOG_INTERVAL,
            });
            actions.push(MemberAction::Waiting {
                waited: Duration::ZERO,
                limit: self.cfg.start_timeout,
            });
        }
        if self.me.role != Role::Scheduler {
            let mut me = self.me.clone();
            me.customer_id = customer_id;
            me.id = K_EMPTY;
            let mut msg = Message::control(Command::AddNode, SCHEDULER);
            msg.meta.control.node.push(me);
            actions.push(MemberAction::Send(msg));
        }
        actions
    }

    /// Something arrived from node `sender`.
    pub fn heard_from(&mut self, sender: NodeId, now: Instant) {
        if sender == SCHEDULER {
            self.last_scheduler_contact = now;
        }
    }

    /// The scheduler (this node) formed the cluster: `table` holds every
    /// server and worker and the scheduler.
    pub fn formed(&mut self, table: Vec<Node>) -> Vec<MemberAction> {
        self.table = table;
        if self.joined {
            return Vec::new();
        }
        self.joined = true;
        self.joining = None;
        vec![MemberAction::Joined]
    }

    /// The scheduler's ADD_NODE: the whole table when joining, or the
    /// entries of recovered nodes afterwards.
    pub fn on_node_table(&mut self, msg: &Message, now: Instant) -> Vec<MemberAction> {
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
            return self.join(msg, nodes, now);
        }
        if let Some((number, workers)) = msg_round(msg) {
            return self.next_round(nodes, number, workers, msg.meta.timestamp);
        }
        self.update(nodes, msg.meta.timestamp)
    }

    fn ignore_table(&mut self, why: String) {
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

    fn join(&mut self, msg: &Message, nodes: &[Node], now: Instant) -> Vec<MemberAction> {
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
        self.table = nodes.to_vec();
        if msg.meta.timestamp != K_EMPTY {
            self.set_at = nodes.iter().map(|n| (n.id, msg.meta.timestamp)).collect();
        }
        let round = msg_round(msg);
        self.joined = true;
        self.joining = None;
        self.last_scheduler_contact = now;
        self.next_heartbeat = self.cfg.heartbeat_interval.map(|_| now);
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
                actions.push(MemberAction::Connect(node.clone()));
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
        }
        actions.push(MemberAction::Joined);
        actions
    }

    /// Elastic mode: the table of a new round replaces the old one.
    fn next_round(
        &mut self,
        nodes: &[Node],
        number: u64,
        workers: Vec<NodeId>,
        ts: i32,
    ) -> Vec<MemberAction> {
        if self.round.as_ref().is_some_and(|(n, _)| *n >= number) {
            // The same round again (another customer's table), or an old one.
            return self.update(nodes, ts);
        }
        if !nodes.iter().any(|n| n.id == self.me.id) || !nodes.iter().any(|n| n.id == SCHEDULER) {
            if self.me.role == Role::Worker {
                return self
                    .fail(Failure::LeftRound {
                        id: self.me.id,
                        round: number,
                    })
                    .into_iter()
                    .collect();
            }
            self.ignore_table("of a round without this node or the scheduler".to_string());
            return Vec::new();
        }
        let mut actions: Vec<MemberAction> = nodes
            .iter()
            .filter(|n| n.id != self.me.id && n.id != SCHEDULER)
            .filter(|n| {
                self.table
                    .iter()
                    .any(|t| t.id == n.id && !t.same_process(n))
            })
            .map(|n| MemberAction::Connect(n.clone()))
            .collect();
        self.table = nodes.to_vec();
        if ts != K_EMPTY {
            self.set_at = nodes.iter().map(|n| (n.id, ts)).collect();
        }
        let table = &self.table;
        self.dead.retain(|id, _| table.iter().any(|n| n.id == *id));
        self.given_up.retain(|id| table.iter().any(|n| n.id == *id));
        info!("elastic round {number} began with workers {workers:?}");
        actions.extend(self.set_round(number, workers));
        actions
    }

    /// Entries of nodes that restarted and took over an id, from the
    /// scheduler's message with timestamp `ts`.
    fn update(&mut self, nodes: &[Node], ts: i32) -> Vec<MemberAction> {
        let mut actions = Vec::new();
        let recovery = nodes.len() == 1;
        for node in nodes {
            if node.id == self.me.id || node.id == SCHEDULER {
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
                actions.push(MemberAction::Connect(node.clone()));
            }
            if recovery && node.is_recovery {
                self.dead.remove(&node.id);
                self.given_up.remove(&node.id);
                actions.push(MemberAction::PeerReplaced(node.id));
            }
        }
        actions
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

    /// The scheduler's HEARTBEAT (the answer to ours): it is alive, and (a
    /// pslite scheduler) these nodes are dead now.
    pub fn on_scheduler_heartbeat(&mut self, dead: &[NodeId], now: Instant) {
        self.scheduler_answers = true;
        self.on_dead_nodes(dead, now);
    }

    /// The scheduler says these nodes are dead now (pslite schedulers only).
    fn on_dead_nodes(&mut self, dead: &[NodeId], now: Instant) {
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
                        self.cfg.recovery_timeout.as_secs()
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

    /// Starts waiting on a barrier over `group`, giving up after `timeout`
    /// ([`Failure::BarrierTimeout`] at the tick past it): the token to ask
    /// about it and the BARRIER request to send.
    pub fn barrier(
        &mut self,
        customer_id: i32,
        group: i32,
        timeout: Option<Duration>,
        now: Instant,
    ) -> (u64, MemberAction) {
        let token = self.next_token;
        self.next_token += 1;
        let mut outcome = None;
        if let Some(f) = &self.failure {
            outcome = Some(Err(f.clone()));
        }
        self.barriers.push(BarrierWaiter {
            token,
            group,
            outcome,
            deadline: timeout.map(|t| (now + t, t)),
        });
        let mut msg = Message::control(Command::Barrier, SCHEDULER);
        msg.meta.request = true;
        msg.meta.app_id = 0;
        msg.meta.customer_id = customer_id;
        msg.meta.control.barrier_group = group;
        (token, MemberAction::Send(msg))
    }

    /// How barrier `token` ended, if it has.
    pub fn barrier_outcome(&self, token: u64) -> Option<BarrierOutcome> {
        self.barriers
            .iter()
            .find(|w| w.token == token)
            .and_then(|w| w.outcome.clone())
    }

    /// Forgets barrier `token` (its waiter has returned).
    pub fn end_barrier(&mut self, token: u64) {
        self.barriers.retain(|w| w.token != token);
    }

    /// Ends every barrier wait well (this server left the job: nothing
    /// waits for it, and it waits for nothing).
    pub fn release_barriers(&mut self) {
        for w in &mut self.barriers {
            w.outcome.get_or_insert(Ok(()));
        }
    }

    /// Barrier waiters still waiting.
    pub fn waiting_barriers(&self) -> usize {
        self.barriers.iter().filter(|w| w.outcome.is_none()).count()
    }

    /// The scheduler's BARRIER reply: releases the waiters of its group, or
    /// fails them when it names a dead node (a pslite scheduler).
    pub fn on_barrier_release(&mut self, msg: &Message) {
        if msg.meta.sender != SCHEDULER || msg.meta.request {
            warn!(
                "dropping BARRIER from node {}: only the scheduler releases barriers",
                msg.meta.sender
            );
            return;
        }
        let group = msg.meta.control.barrier_group;
        let outcome = match msg.meta.control.failed_peer {
            Some(id) => Err(Failure::PeerDead {
                id,
                secs: self.cfg.recovery_timeout.as_secs(),
            }),
            None => Ok(()),
        };
        let matching = self
            .barriers
            .iter()
            .any(|w| w.group == group && w.outcome.is_none());
        if matching {
            for w in self.barriers.iter_mut().filter(|w| w.group == group) {
                w.outcome.get_or_insert(outcome.clone());
            }
        } else if !ids::is_role_group(group) {
            // A C++ scheduler leaves the group of its replies uninitialised:
            // the release is for whatever barrier we are waiting on.
            for w in self.barriers.iter_mut() {
                w.outcome.get_or_insert(outcome.clone());
            }
        } else {
            debug!("barrier release for group {group}, which nobody here waits on");
        }
    }

    /// Fails the node: every wait ends with `failure`. Returns the action to
    /// report it, the first time only.
    pub fn fail(&mut self, failure: Failure) -> Option<MemberAction> {
        if self.failure.is_some() {
            return None;
        }
        for w in self.barriers.iter_mut() {
            w.outcome.get_or_insert(Err(failure.clone()));
        }
        self.failure = Some(failure.clone());
        Some(MemberAction::Failed(failure))
    }

    /// Clock-driven work: the start deadline and its log lines, barrier
    /// deadlines, heartbeats, a silent scheduler, dead nodes that stay
    /// unreplaced.
    pub fn tick(&mut self, now: Instant) -> Vec<MemberAction> {
        let mut actions = Vec::new();
        if let Some(due) = self.poll_timeout() {
            let late = now.saturating_duration_since(due);
            if late > PAUSE_SLACK && self.joined && self.failure.is_none() {
                self.resumed(late, now);
            }
        }
        for w in &mut self.barriers {
            match w.deadline {
                Some((at, timeout)) if w.outcome.is_none() && now >= at => {
                    w.outcome = Some(Err(Failure::BarrierTimeout {
                        group: w.group,
                        secs: timeout.as_secs(),
                    }));
                    actions.push(MemberAction::BarrierEnded);
                }
                _ => {}
            }
        }
        if let Some(j) = &mut self.joining {
            if now >= j.deadline {
                let waited = now - j.since;
                self.joining = None;
                self.timed_out = Some(waited);
                return actions;
            }
            if now >= j.next_log {
                j.next_log = now + WAIT_LOG_INTERVAL;
                actions.push(MemberAction::Waiting {
                    waited: now - j.since,
                    limit: self.cfg.start_timeout,
                });
            }
        }
        if !self.joined || self.failure.is_some() {
            return actions;
        }
        if self.me.role != Role::Scheduler {
            if let (Some(interval), Some(next)) = (self.cfg.heartbeat_interval, self.next_heartbeat)
            {
                if now >= next {
                    self.next_heartbeat = Some(now + interval);
                    let mut msg = Message::control(Command::Heartbeat, SCHEDULER);
                    msg.meta.control.node.push(self.me.clone());
                    actions.push(MemberAction::Send(msg));
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
                if silent > timeout {
                    actions.extend(self.fail(Failure::SchedulerLost {
                        address: self.cfg.scheduler.address(),
                        silent_secs: silent.as_secs(),
                        timeout_secs: timeout.as_secs(),
                    }));
                    return actions;
                }
            }
        }
        let listening = self.deaf_since.is_none();
        for (&id, &since) in &self.dead {
            if listening && now >= since + self.cfg.recovery_timeout && self.given_up.insert(id) {
                warn!(
                    "node {id} was declared dead {} s ago and nothing replaced it: what waits \
                     on it fails",
                    now.saturating_duration_since(since).as_secs()
                );
                actions.push(MemberAction::PeerDead(id));
            }
        }
        actions
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

    /// When [`Member::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        for w in &self.barriers {
            if let (None, Some((at, _))) = (&w.outcome, w.deadline) {
                consider(at);
            }
        }
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
                consider(self.last_scheduler_contact + timeout + Duration::from_millis(1));
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
                    consider(since + self.cfg.recovery_timeout);
                }
            }
        }
        next
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

    /// Nodes the scheduler declared dead that nothing replaced in time.
    pub fn given_up(&self) -> &HashSet<NodeId> {
        &self.given_up
    }
}

/// The elastic round a scheduler's ADD_NODE carries (pslite-only fields
/// 102 and 103), if any.
fn msg_round(msg: &Message) -> Option<(u64, Vec<NodeId>)> {
    let c = &msg.meta.control;
    c.round.map(|n| (n, c.round_members.clone()))
}

/// Whether timestamp `a` comes before `b` (timestamps count up and wrap at
/// `i32::MAX`).
fn older(a: i32, b: i32) -> bool {
    let ahead = b.wrapping_sub(a) & i32::MAX;
    ahead != 0 && ahead < 1 << 30
}
