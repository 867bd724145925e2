//! The node table, a component: joining (the ADD_NODE this node registers
//! with, the start deadline and its log lines), the scheduler's table
//! (checked to come from the scheduler it registered with), updates after
//! a recovery (a node moved or was replaced), the tables of new elastic
//! rounds, and the scheduler's LEAVE.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};

use super::{msg_round, older, WAIT_LOG_INTERVAL};
use crate::component::{Component, Cx};
use crate::effects::{Effect, Event};
use crate::error::Failure;

struct Joining {
    since: Instant,
    deadline: Instant,
    next_log: Instant,
}

/// Who this node is and the node table it knows.
pub struct NodeTable {
    me: Node,
    table: Vec<Node>,
    /// Elastic mode: the newest round that came as a change before this
    /// node had joined (it overtook the table): once joined at an older
    /// round, the node asks for the whole table.
    early_change: Option<u64>,
    joined: bool,
    joining: Option<Joining>,
    timed_out: Option<Duration>,
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
}

impl NodeTable {
    /// The table of node `me` (id [`K_EMPTY`], or [`SCHEDULER`] on the
    /// scheduler), which has not joined yet.
    pub fn new(me: Node) -> NodeTable {
        NodeTable {
            me,
            table: Vec::new(),
            early_change: None,
            joined: false,
            joining: None,
            timed_out: None,
            ignored_tables: 0,
            set_at: HashMap::new(),
            round: None,
            joined_round: None,
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
    pub fn nodes(&self) -> &[Node] {
        &self.table
    }

    /// Whether this node has joined.
    pub fn is_joined(&self) -> bool {
        self.joined
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

    /// Starts joining as `customer_id`: sends the ADD_NODE (none on the
    /// scheduler, nor once joined). The start deadline runs from the first
    /// call.
    pub fn register(&mut self, customer_id: i32, now: Instant, cx: &mut Cx<'_>) {
        if self.joined {
            return;
        }
        if self.joining.is_none() {
            let limit = cx.facts.config().start_timeout;
            self.joining = Some(Joining {
                since: now,
                deadline: now + limit,
                next_log: now + WAIT_LOG_INTERVAL,
            });
            cx.event(Event::Waiting {
                waited: Duration::ZERO,
                limit,
            });
        }
        if self.me.role != Role::Scheduler {
            let mut me = self.me.clone();
            me.customer_id = customer_id;
            me.id = K_EMPTY;
            let mut msg = Message::control(Command::AddNode, SCHEDULER);
            msg.meta.control.node.push(me);
            cx.send(msg);
        }
    }

    /// The scheduler (this node) formed the cluster: `table` holds every
    /// server and worker and the scheduler.
    fn formed(&mut self, table: Vec<Node>, cx: &mut Cx<'_>) {
        self.table = table;
        if self.joined {
            return;
        }
        self.joined = true;
        self.joining = None;
        cx.changed();
        cx.event(Event::Joined);
    }

    /// The scheduler's ADD_NODE: the whole table when joining, or the
    /// entries of recovered nodes afterwards.
    fn on_node_table(&mut self, msg: &Message, cx: &mut Cx<'_>) {
        if msg.meta.sender != SCHEDULER {
            self.ignore_table(format!(
                "from node {}: only the scheduler sends node tables",
                msg.meta.sender
            ));
            return;
        }
        if self.me.role == Role::Scheduler {
            return;
        }
        let nodes = &msg.meta.control.node;
        if !self.joined {
            if let (Some(number), Some(_)) = (msg.meta.control.round, msg.meta.control.round_base) {
                // A change that overtook this node's table: asked for later.
                self.early_change = self.early_change.max(Some(number));
                return;
            }
            return self.join(msg, nodes, cx);
        }
        let c = &msg.meta.control;
        if let (Some(number), Some(base)) = (c.round, c.round_base) {
            return self.next_round_change(msg, number, base, cx);
        }
        if let Some((number, workers)) = msg_round(msg) {
            return self.next_round(nodes, number, workers, msg.meta.timestamp, cx);
        }
        self.update(nodes, msg.meta.timestamp, cx)
    }

    /// An elastic round this node is not part of: a worker has left the
    /// job (its waits fail with `LeftRound`); any other node ignores the
    /// table, saying `why`.
    fn round_without_me(&mut self, number: u64, why: &str, cx: &mut Cx<'_>) {
        if self.me.role == Role::Worker {
            cx.fail(Failure::LeftRound {
                id: self.me.id,
                round: number,
            });
        } else {
            self.ignore_table(why.to_string());
        }
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

    fn join(&mut self, msg: &Message, nodes: &[Node], cx: &mut Cx<'_>) {
        let Some(mine) = self.my_entry(nodes).cloned() else {
            self.ignore_table(format!(
                "without a usable entry for this {} at {} (check DMLC_NODE_HOST); still \
                 waiting for the scheduler's",
                self.me.role,
                self.me.address()
            ));
            return;
        };
        let Some(scheduler) = nodes.iter().find(|n| n.id == SCHEDULER) else {
            self.ignore_table("without the scheduler's entry".to_string());
            return;
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
            return;
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
        // Reconnect to the scheduler under the new identity, and connect to
        // this node itself. Other peers are connected on first send (the
        // core's `prepare`): C++ ps-lite connects to every node of the other
        // role here, which at 100 + 100 nodes is 20 000 TCP handshakes on
        // the start path, most of them for peers a node never talks to.
        let mut connected = HashSet::new();
        for node in nodes {
            let wanted = node.id == SCHEDULER || node.id == mine.id;
            if wanted && connected.insert(node.id) {
                cx.fx.push(Effect::Connect(node.clone()));
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
            self.set_round(number, workers, cx);
            if self.early_change.take().is_some_and(|early| early > number) {
                cx.send(self.ask_table(number));
            }
        }
        cx.changed();
        cx.event(Event::Joined);
    }

    /// Elastic mode: the table of a new round replaces the old one (the
    /// nodes declared dead that left it are forgotten with
    /// [`Event::RoundBegan`]).
    fn next_round(
        &mut self,
        nodes: &[Node],
        number: u64,
        workers: Vec<NodeId>,
        ts: i32,
        cx: &mut Cx<'_>,
    ) {
        if self.round.as_ref().is_some_and(|(n, _)| *n >= number) {
            // The same round again (another customer's table), or an old one.
            return self.update(nodes, ts, cx);
        }
        if !nodes.iter().any(|n| n.id == self.me.id) || !nodes.iter().any(|n| n.id == SCHEDULER) {
            let why = "of a round without this node or the scheduler";
            return self.round_without_me(number, why, cx);
        }
        for n in nodes
            .iter()
            .filter(|n| n.id != self.me.id && n.id != SCHEDULER)
            .filter(|n| {
                self.table
                    .iter()
                    .any(|t| t.id == n.id && !t.same_process(n))
            })
        {
            cx.fx.push(Effect::Connect(n.clone()));
        }
        self.table = self.kept(nodes);
        if ts != K_EMPTY {
            self.set_at = self.table.iter().map(|n| (n.id, ts)).collect();
        }
        info!("elastic round {number} began with workers {workers:?}");
        self.set_round(number, workers, cx);
    }

    /// Elastic mode: round `number` as a change of round `base` (see
    /// `round_base` in `proto/meta.proto`): the workers gone leave the table
    /// and the round, the joiners' entries come in and they rank after the
    /// others. A node that does not hold round `base` asks the scheduler
    /// for the whole table instead.
    fn next_round_change(&mut self, msg: &Message, number: u64, base: u64, cx: &mut Cx<'_>) {
        let c = &msg.meta.control;
        let ts = msg.meta.timestamp;
        let held = self.round.as_ref().map(|(n, _)| *n);
        if held.is_some_and(|n| n >= number) {
            // A round this node has (or an older one): only the entries.
            return self.update(&c.node, ts, cx);
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
            return cx.send(self.ask_table(held.unwrap_or(0)));
        };
        if c.round_left.contains(&self.me.id) {
            return self.round_without_me(number, "of a round without this node", cx);
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
        }
        self.update(&c.node, ts, cx);
        info!("elastic round {number} began with workers {workers:?}");
        self.set_round(number, workers, cx);
    }

    /// Whether this node keeps `node`'s entry in its table: a worker keeps
    /// the servers, the scheduler and its own process, as a C++ worker
    /// uses no more (it talks to servers and the scheduler only; barriers,
    /// rounds and recoveries are the scheduler's). Other workers' entries
    /// would cost a job of N workers N^2 entries.
    fn keeps(&self, node: &Node) -> bool {
        self.me.role != Role::Worker || node.role != Role::Worker || node.same_process(&self.me)
    }

    /// The entries of `nodes` this node keeps (see [`NodeTable::keeps`]).
    fn kept(&self, nodes: &[Node]) -> Vec<Node> {
        nodes.iter().filter(|n| self.keeps(n)).cloned().collect()
    }

    /// Elastic mode: asks the scheduler for the whole table (this node
    /// holds round `held`, and a change of another came).
    fn ask_table(&self, held: u64) -> Message {
        let mut me = self.me.clone();
        me.customer_id = 0;
        let mut ask = Message::control(Command::AddNode, SCHEDULER);
        ask.meta.control.node = vec![me];
        ask.meta.control.round_base = Some(held);
        ask
    }

    /// Entries of nodes that restarted and took over an id, from the
    /// scheduler's message with timestamp `ts`.
    fn update(&mut self, nodes: &[Node], ts: i32, cx: &mut Cx<'_>) {
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
                cx.fx.push(Effect::Connect(node.clone()));
            }
            if recovery && node.is_recovery {
                cx.event(Event::PeerReplaced(node.id));
            }
        }
    }

    /// Elastic mode: round `number` with `workers` is current (the
    /// scheduler's own view). Announces it if it is news.
    fn set_round(&mut self, number: u64, workers: Vec<NodeId>, cx: &mut Cx<'_>) {
        if self.round.as_ref().is_some_and(|(n, _)| *n == number) {
            return;
        }
        self.joined_round.get_or_insert(number);
        self.round = Some((number, workers.clone()));
        cx.event(Event::RoundBegan {
            round: number,
            workers,
        });
    }

    /// The scheduler's LEAVE (the core's table lets no other through): the
    /// elastic job failed (too few workers for too long); `round` carries
    /// the seconds waited, `round_members` the workers it had and the
    /// minimum. Without `round`, the scheduler fences this node: its id was
    /// given to the process in `node` while this one was stopped or cut
    /// off, and it must not come back.
    fn on_leave(&mut self, msg: &Message, cx: &mut Cx<'_>) {
        let c = &msg.meta.control;
        // Once joined, the identity's key proved the sender; before, only
        // the scheduler knows this node's key.
        let proven = self.joined
            || c.node
                .iter()
                .any(|n| n.same_process(&self.me) && n.key == self.me.key);
        if !proven {
            debug!("dropping LEAVE: it does not carry this node's key (not from its scheduler)");
            return;
        }
        if let Some(reason) = &c.stop {
            // The job stops: the scheduler says why, before it exits.
            let failure = Failure::JobStopped {
                reason: reason.clone(),
            };
            error!("{failure}");
            return cx.fail(failure);
        }
        if c.round.is_none() {
            if c.node
                .iter()
                .any(|n| n.same_process(&self.me) && n.key == self.me.key)
            {
                // It names this process as the replacement: meant for the
                // process it replaced, at the same address.
                debug!("dropping LEAVE: it fences the process this one replaced");
                return;
            }
            let by = c
                .node
                .iter()
                .find(|n| n.id == self.me.id && !n.same_process(&self.me));
            return cx.fail(Failure::Replaced {
                id: self.me.id,
                by: by.map_or_else(|| "another process".to_string(), Node::address),
            });
        }
        let count = |i: usize| c.round_members.get(i).map_or(0, |&n| n.max(0) as usize);
        cx.fail(Failure::RendezvousFailed {
            have: count(0),
            min: count(1),
            waited_secs: c.round.unwrap_or(0),
        });
    }
}

impl Component for NodeTable {
    /// The scheduler's node table (or an update of it), its LEAVE.
    fn handle(&mut self, msg: Message, _now: Instant, cx: &mut Cx<'_>) {
        match msg.meta.control.cmd {
            Command::AddNode => {
                self.on_node_table(&msg, cx);
                if msg.meta.sender == SCHEDULER {
                    cx.event(Event::TableTaken);
                }
            }
            Command::Leave => self.on_leave(&msg, cx),
            _ => {}
        }
    }

    /// The start deadline and its log lines.
    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        let Some(j) = &mut self.joining else {
            return;
        };
        let waited = now - j.since;
        if now >= j.deadline {
            self.joining = None;
            self.timed_out = Some(waited);
            if !self.joined {
                cx.changed();
            }
        } else if now >= j.next_log {
            j.next_log = now + WAIT_LOG_INTERVAL;
            cx.event(Event::Waiting {
                waited,
                limit: cx.facts.config().start_timeout,
            });
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.joining.as_ref().map(|j| j.deadline.min(j.next_log))
    }

    /// The scheduler's own table (this node is the scheduler), its rounds.
    fn on_event(&mut self, event: &Event, _now: Instant, cx: &mut Cx<'_>) {
        match event {
            Event::Formed(table) => self.formed(table.clone(), cx),
            Event::TableChanged(table) if self.joined => self.formed(table.clone(), cx),
            Event::Round { round, workers } => self.set_round(*round, workers.clone(), cx),
            _ => {}
        }
    }
}
