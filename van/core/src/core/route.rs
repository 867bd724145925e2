//! The way in: one table from what arrives to the component that takes
//! it. Every message first passes the checks of the transport's level
//! (its identity against the node table, `PS_DROP_MSG`, the resender's
//! duplicates and acknowledgements), then [`Core::dispatch`] routes it by
//! command, its parts for other components read on the way
//! ([`Component::attached`](crate::component::Component::attached)).
//! Links coming up or down are routed here too.

use std::time::Instant;

use log::{debug, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::replica::ReplicaOp;
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};
use rand::Rng;

use super::parts::Part;
use super::Core;
use crate::counters::DropReason;
use crate::effects::LinkEvent;
use crate::error::Failure;
use crate::hold::Reason;
use crate::resender::Received;

/// A message refused because its identity names a node of the table
/// without that node's key: a stranger using a member's identity, or an
/// earlier process of a node that was replaced. Its `Display` is the log
/// line (the driver adds the connection's address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityRefused {
    /// The id the identity names.
    pub id: NodeId,
    /// The key it carried, if any.
    pub presented: Option<u64>,
    /// The message, described.
    pub what: String,
}

impl std::fmt::Display for IdentityRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.id;
        let identity = crate::address::keyed_identity(id, self.presented);
        write!(
            f,
            "ignoring messages with identity {identity}: it names node {id} without the key of \
             node {id}'s process in the node table (a stranger using its identity, or an earlier \
             process of node {id}); first one: {}",
            self.what
        )
    }
}

impl Core {
    /// Handles one message that arrived, with `meta.sender` (and
    /// `meta.sender_key`) set from the sender's identity ([`K_EMPTY`] if it
    /// had none). Returns, the first time a sender is refused for it, why
    /// its identity was refused (the driver logs it with the connection's
    /// address).
    pub fn handle(&mut self, msg: Message, now: Instant) -> Option<IdentityRefused> {
        let refused = self.receive(msg, now);
        if self.drain.is_some() {
            self.check_drain(now);
        }
        refused
    }

    fn receive(&mut self, mut msg: Message, now: Instant) -> Option<IdentityRefused> {
        if self.stopped {
            return None;
        }
        let sender = msg.meta.sender;
        msg.meta.recver = self.me().id;
        if self.identity_matches(sender, msg.meta.sender_key) == Some(false) {
            return self.refuse_identity(&msg, now);
        }
        if sender != K_EMPTY {
            self.parts.liveness.heard_from(sender, now);
            if self.heard.insert(sender) {
                debug!("connected to node {sender} (first message heard from it)");
            }
            self.note_early(&msg);
        }
        if self.cfg.drop_percent > 0
            && self.is_joined()
            && msg.meta.control.cmd != Command::Terminate
            && self.rng.random_range(0..100) < self.cfg.drop_percent
        {
            self.counters.dropped(DropReason::Injected);
            debug!("dropping {} (PS_DROP_MSG)", crate::describe(&msg));
            return None;
        }
        if msg.meta.partition.is_some() && msg.meta.control.is_empty() && self.is_peer(sender) {
            // A member's part whose message would begin beyond its bound on
            // incomplete messages, or beyond the budget of everything held
            // for peers: dropped before it is acknowledged, so that under
            // PS_RESEND it comes again once there is room. (Anyone else's
            // part is held or dropped by `Core::data_part`.)
            let [holds, _, registrations] = self.held_by_kind();
            self.parts
                .partition
                .set_held_elsewhere((holds + registrations) as u64);
            if let Some(refused) = self.parts.partition.refuses(&msg) {
                self.counters.dropped(DropReason::HoldLimit);
                self.dropped.log((sender, "PS_HOLD_LIMIT"), || {
                    format!("dropping a part from node {sender}: {}", refused.why)
                });
                return None;
            }
        }
        let is_scheduler = self.parts.scheduler.is_some();
        let Some(r) = &mut self.parts.resender else {
            self.dispatch(msg, now);
            return None;
        };
        if is_scheduler && sender != K_EMPTY {
            // Anything from a node proves it has its table (a C++ node cannot
            // acknowledge the table: it has no id when it arrives). Only a
            // table that names the node: an update of another's entry (a
            // replacement's new address and key) is not proven by a message
            // the node may have sent before it arrived, and lost, it leaves
            // the node refusing the replacement's identity for good.
            r.settle(|m| {
                m.meta.recver == sender
                    && m.meta.control.cmd == Command::AddNode
                    && m.meta.control.nodes().any(|n| n.id == sender)
            });
        }
        if msg.meta.control.cmd == Command::Ack {
            // The resender takes acknowledgements like a component its
            // command.
            self.to(Part::Resender, msg, now);
            return None;
        }
        if msg.meta.control.cmd == Command::AddNode && sender == SCHEDULER && !self.is_joined() {
            // The table was sent to the id it assigns us: acknowledge as
            // that id, so that its first copy counts.
            if let Some(mine) = self.parts.table.my_entry(&msg.meta.control.node) {
                msg.meta.recver = mine.id;
            }
        }
        let Some(r) = &mut self.parts.resender else {
            return None;
        };
        let (received, ack) = r.on_receive(&msg, now);
        if received == Received::Duplicate {
            self.counters.dropped(DropReason::Duplicate);
            debug!("dropping a duplicate {}", crate::describe(&msg));
        } else {
            self.dispatch(msg, now);
        }
        // After processing: a node that just joined acknowledges the table
        // under its new identity.
        if let Some(ack) = ack {
            self.emit(ack, now);
        }
        None
    }

    /// The table: routes a message (checked as it arrived, or released
    /// from a hold) to the component that takes its command.
    pub(super) fn dispatch(&mut self, msg: Message, now: Instant) {
        let is_scheduler = self.parts.scheduler.is_some();
        let sender = msg.meta.sender;
        match msg.meta.control.cmd {
            // A part of a message cut into parts (acknowledged on its own
            // above): the whole message comes back here once complete.
            Command::Empty if msg.meta.partition.is_some() => self.data_part(msg, now),
            Command::Empty => self.data(msg, now),
            // Never obeyed from the wire: a node stops itself in-process.
            Command::Terminate => self.drop_logged(sender, "TERMINATE", "nodes stop themselves"),
            Command::AddNode if is_scheduler && sender == K_EMPTY => {
                let [holds, parts, _] = self.held_by_kind();
                self.parts.registrations.set_held_elsewhere(holds + parts);
                self.to(Part::Registrations, msg, now)
            }
            Command::AddNode if is_scheduler && self.refuses_cxx_node(&msg) => {}
            Command::AddNode | Command::Heartbeat | Command::Status if is_scheduler => {
                self.to(Part::Scheduler, msg, now)
            }
            Command::Replica => self.replica(msg, now),
            Command::Checkpoint => self.to(Part::Checkpoints, msg, now),
            Command::Barrier if is_scheduler && msg.meta.request => {
                self.to(Part::Scheduler, msg, now)
            }
            Command::Leave if is_scheduler => self.to(Part::Scheduler, msg, now),
            Command::Leave if sender == SCHEDULER => self.to(Part::Table, msg, now),
            Command::Leave => self.drop_logged(
                sender,
                "LEAVE",
                "only workers send it, and only to the scheduler",
            ),
            Command::AddNode => self.to(Part::Table, msg, now),
            Command::Barrier if sender != SCHEDULER || msg.meta.request => {
                self.drop_logged(sender, "BARRIER", "only the scheduler releases barriers")
            }
            Command::Barrier => {
                let answer = (msg.meta.control.barrier_group, msg.meta.request);
                self.to(Part::Barriers, msg, now);
                self.settle_with_scheduler(Command::Barrier, answer, now);
                if self.finalize_pending && !self.finalizing {
                    self.leaving(now);
                }
            }
            Command::Heartbeat => {
                let answer = (msg.meta.control.barrier_group, msg.meta.request);
                if sender == SCHEDULER {
                    self.settle_with_scheduler(Command::Heartbeat, answer, now);
                }
                self.to(Part::Liveness, msg, now);
            }
            Command::Store => self.to(Part::Store, msg, now),
            Command::Ack => debug!("dropping ACK from node {sender}: resend is off"),
            Command::Status => self.drop_logged(sender, "STATUS", "only the scheduler answers it"),
        }
    }

    /// Hands `msg` to component `part`, after every component read its
    /// part of a control message.
    pub(super) fn to(&mut self, part: Part, msg: Message, now: Instant) {
        if msg.is_control() {
            for reader in Part::ATTACHMENTS {
                self.on_part(reader, now, |c, cx| c.attached(&msg, now, cx));
            }
        }
        self.on_part(part, now, |c, cx| c.handle(msg, now, cx));
    }

    /// A REPLICA control message: a copy that comes before this server has
    /// a node table or a range map waits; a member's goes to replication
    /// (the scheduler's answer to a leave, to the leave).
    fn replica(&mut self, msg: Message, now: Instant) {
        let sender = msg.meta.sender;
        let Some(op) = msg.meta.replica.as_deref().map(|r| r.op) else {
            self.drop_logged(sender, "REPLICA", "it has no replication part");
            return;
        };
        let joined = self.is_joined();
        if (!joined || !self.replicated())
            && self.cfg.role == Role::Server
            && ids::role_of_id(sender) == Some(Role::Server)
            && op != ReplicaOp::Map
        {
            // A copy may come before this server's node table and map (a
            // replacement registering while its primary already copies to
            // it): held until the map, within PS_HOLD_LIMIT.
            let reason = if joined {
                Reason::NoMap
            } else {
                Reason::Joining
            };
            self.hold(reason, msg);
            return;
        }
        if self.identity_matches(sender, msg.meta.sender_key) == Some(false) {
            // Held before the table named its sender's key: a copy from an
            // earlier process of that id, or a forged one.
            self.drop_logged(
                sender,
                "REPLICA",
                "its identity lacks the key of its node's process",
            );
            return;
        }
        if !self.parts.table.is_member(sender) {
            self.drop_logged(sender, "REPLICA", "its sender is not in the node table");
            return;
        }
        match op {
            ReplicaOp::Left | ReplicaOp::LeaveRefused if sender == SCHEDULER => {
                self.to(Part::Leave, msg, now)
            }
            _ => self.to(Part::Replication, msg, now),
        }
    }

    /// On the scheduler of a replicated cluster (or one whose servers join
    /// and leave): refuses a C++ node's registration (it would not
    /// understand the range map). True if refused.
    fn refuses_cxx_node(&mut self, msg: &Message) -> bool {
        if !crate::replica::replication::scheduler_replicates(&self.cfg) {
            return false;
        }
        let Some(node) = msg.meta.control.node.iter().find(|n| !n.pslite) else {
            return false;
        };
        if !self.dropped.first((msg.meta.sender, "replicas")) {
            return true;
        }
        if self.cfg.min_servers.is_some() {
            log::error!(
                "scheduler: refusing {} at {}: DMLC_NUM_SERVER=MIN:MAX (servers that join and \
                 leave, by the range map) is pslite-only, C++ ps-lite nodes cannot join such a \
                 cluster; give DMLC_NUM_SERVER a plain number to mix in C++ nodes",
                node.role,
                node.address(),
            );
        } else {
            log::error!(
                "scheduler: refusing {} at {}: PS_REPLICAS={} (replicated key ranges) is \
                 pslite-only, C++ ps-lite nodes cannot join such a cluster; run it with \
                 PS_REPLICAS=1 to mix in C++ nodes",
                node.role,
                node.address(),
                self.cfg.replicas
            );
        }
        true
    }

    /// The scheduler's answer settles this node's requests of the same kind:
    /// a released barrier proves its requests arrived, a heartbeat answer
    /// makes older heartbeats moot (a C++ scheduler may never acknowledge
    /// them, and they must not be resent or waited for at exit).
    fn settle_with_scheduler(&mut self, cmd: Command, (group, request): (i32, bool), now: Instant) {
        if request {
            return;
        }
        // A C++ scheduler's barrier replies carry no real group: they
        // settle every barrier request.
        let any_group = cmd != Command::Barrier || !ids::is_role_group(group);
        let settled = |m: &Message| {
            m.meta.recver == SCHEDULER
                && m.meta.control.cmd == cmd
                && (any_group || m.meta.control.barrier_group == group)
        };
        match &mut self.parts.resender {
            // A heartbeat's answer comes at once: it measures the round
            // trip to the scheduler (a barrier's waits for the others).
            Some(r) if cmd == Command::Heartbeat => r.settle_answered(now, settled),
            Some(r) => r.settle(settled),
            None => {}
        }
    }

    /// Records identities heard from before they could have been assigned:
    /// a hint of an identity conflict if the cluster does not form.
    fn note_early(&mut self, msg: &Message) {
        let sender = msg.meta.sender;
        let early = match &self.parts.scheduler {
            Some(s) => !s.is_ready() && sender != SCHEDULER,
            None => !self.is_joined() && sender != SCHEDULER,
        };
        if early && self.early_ids.len() < 16 {
            self.early_ids.insert(sender);
        }
    }

    /// Drops a message whose identity names a node of the table without
    /// that node's key (see [`Core::handle`]). On the scheduler, a message
    /// from an earlier process of a node that was replaced gets that
    /// process fenced: it is told (LEAVE naming its replacement) and stops.
    fn refuse_identity(&mut self, msg: &Message, now: Instant) -> Option<IdentityRefused> {
        let sender = msg.meta.sender;
        let fence = self
            .parts
            .scheduler
            .as_ref()
            .and_then(|s| s.replaced(sender, msg.meta.sender_key))
            .map(|(old, new)| (old.clone(), new.clone()));
        if let Some((mut old, new)) = fence {
            // A replacement at the old process's address: that process is
            // gone (its port is the new one's), and a LEAVE to the address
            // would reach the replacement.
            if !old.same_process(&new) && self.fenced.insert((sender, old.key)) {
                warn!(
                    "scheduler: {old} sent a message after {} took its place: telling it to stop",
                    new.address()
                );
                // Its own connection (never node `sender`'s): under an id
                // no node has.
                old.id = -sender;
                let link = old.id;
                self.connect(old, SCHEDULER);
                let mut leave = Message::control(Command::Leave, link);
                leave.meta.control.node = vec![new];
                self.emit(leave, now);
            }
        }
        self.counters.dropped(DropReason::UnknownPeer);
        let first = self.refused_identities.len() < 1024 && self.refused_identities.insert(sender);
        let refusal = IdentityRefused {
            id: sender,
            presented: msg.meta.sender_key,
            what: crate::describe(msg),
        };
        if first {
            Some(refusal)
        } else {
            debug!("{refusal}");
            None
        }
    }

    /// This node's own entry: in the node table once joined, else as it
    /// registers.
    fn my_entry(&self) -> &Node {
        let me = self.parts.table.me();
        self.parts.table.node(me.id).unwrap_or(me)
    }

    /// The key `peer` presents in its identity to this node (and this node
    /// to it): its entry's, when both entries carry one (pslite nodes under
    /// a pslite scheduler); `None`: the plain `ps<id>` of C++ ps-lite.
    pub(super) fn expected_key_of(&self, peer: &Node) -> Option<u64> {
        let keyed = |n: &Node| n.pslite && n.key != 0;
        (keyed(self.my_entry()) && keyed(peer)).then_some(peer.key)
    }

    /// The table entry of `sender` if a message whose identity carried
    /// `key` may come from it (see [`Core::handle`]).
    pub fn sender_node(&self, sender: NodeId, key: Option<u64>) -> Option<&Node> {
        if self.identity_matches(sender, key) != Some(true) {
            return None;
        }
        self.parts.table.node(sender)
    }

    /// Whether a message from `sender` whose identity carried `key` may be
    /// from that node: the key its table entry names, or none for a node
    /// without a key. `None`: the sender is not in the table (yet).
    pub(super) fn identity_matches(&self, sender: NodeId, key: Option<u64>) -> Option<bool> {
        if sender == K_EMPTY {
            return Some(key.is_none());
        }
        let entry = if sender == self.parts.table.me().id {
            self.my_entry()
        } else {
            self.parts.table.node(sender)?
        };
        Some(self.expected_key_of(entry) == key)
    }

    /// Whether this node's ROUTER may let a new connection take over an
    /// identity in use (`ZMQ_ROUTER_HANDOVER`): yes while every member
    /// presents a key (only the same process can present it again, say
    /// after its old connection died silently); no once the table has a
    /// node without one (a C++ node, whose plain `ps<id>` anyone can
    /// present): then, as in C++ ps-lite, the first connection keeps it.
    pub fn router_handover(&self) -> bool {
        self.parts
            .table
            .nodes()
            .iter()
            .all(|n| n.pslite && n.key != 0)
    }

    /// Node `id`'s process, if its frames may come through shared memory:
    /// a same-host pslite peer in the node table (never from the message).
    /// `key` is the key the message's identity carried: a stranger using a
    /// member's id is no shared-memory peer.
    pub fn shm_peer(&self, id: NodeId, key: Option<u64>) -> Option<u32> {
        self.sender_node(id, key)
            .and_then(|node| self.shm_peer_node(node))
    }

    /// Whether `link` is the connection of a registration check under way.
    pub fn is_checking(&self, link: NodeId) -> bool {
        self.parts.registrations.is_check(link)
    }

    /// What happened to this node's connection to `peer` (see
    /// [`LinkEvent`]): a connection that closes and stays closed, with
    /// nothing heard from the peer meanwhile, means its process is gone,
    /// noticed within `LINK_GRACE` (1 s) instead of a heartbeat
    /// timeout (the scheduler declares it dead; a node loses its
    /// scheduler). A refused handshake with the scheduler fails a node
    /// that has `PS_AUTH_TOKEN` at once.
    pub fn link_event(&mut self, peer: NodeId, event: LinkEvent, now: Instant) {
        if self.parts.registrations.is_check(peer) {
            self.with_registrations(now, |r, cx| r.link_event(peer, &event, now, cx));
            return;
        }
        let to_scheduler = peer == SCHEDULER && self.parts.scheduler.is_none();
        match event {
            LinkEvent::Refused(why) => {
                if to_scheduler && self.cfg.auth_token.is_some() {
                    self.fail(Failure::AuthRefused { detail: why }, now);
                } else {
                    debug!("the handshake with node {peer} failed: {why}");
                }
            }
            // The scheduler connects to a process once it has registered,
            // so it listens: a connection that cannot be made is as closed
            // (a process killed before the scheduler's connection came up
            // sends no DISCONNECTED). A node ignores it: it may reach the
            // scheduler before the scheduler listens.
            LinkEvent::Unreachable | LinkEvent::Down if self.finalizing => {
                debug!("connection to node {peer} closed while finalizing");
                if self.parts.scheduler.is_some() {
                    self.left_at_exit.insert(peer);
                    self.check_drain(now);
                }
            }
            LinkEvent::Unreachable => {
                if let Some(s) = &mut self.parts.scheduler {
                    debug!("cannot connect to node {peer} (ZeroMQ tries again)");
                    s.link_down(peer, now);
                }
            }
            LinkEvent::Up | LinkEvent::Down => {
                let up = event == LinkEvent::Up;
                debug!(
                    "connection to node {peer} {}",
                    if up { "up" } else { "closed" }
                );
                if let Some(s) = &mut self.parts.scheduler {
                    if up {
                        s.link_up(peer);
                    } else {
                        s.link_down(peer, now);
                    }
                }
                if to_scheduler {
                    self.parts.liveness.scheduler_link(up, now);
                }
            }
        }
    }
}
