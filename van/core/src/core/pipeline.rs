//! The way out: the outgoing-message pipeline, one of the two stages where
//! features meet.
//!
//! A message the apps send ([`Core::send`]) or a component emits passes,
//! in order:
//! 1. the **attachments** (control messages): each component adds its
//!    part ([`Component::attach`](crate::component::Component::attach):
//!    the range map and the checkpoint to restore on a node table, a
//!    worker's requests in flight on its barrier request), and the core
//!    its own (a node's counters on its heartbeat);
//! 2. the **stages** of [`Part::PIPELINE`], from the one after the
//!    component that made it ([`Origin::first_stage`]): replication
//!    (route a worker's request to its range's primary, pair a server's
//!    answer with its request), checkpoints (hold a barrier's releases
//!    while a checkpoint is taken); a stage may change, hold or consume it;
//! 3. the **wire**: a control message without a timestamp gets one, the
//!    connection opens on first use ([`Output::Connect`], the [`Route`]
//!    this node's configuration picks), the sender is stamped, and the
//!    last stage, the resender, keeps it for resending.
//!
//! Then it is the driver's: returned to the app's thread ([`Core::send`])
//! or an [`Output::Send`].

use std::time::Instant;

use log::debug;
use pslite_proto::ids::SCHEDULER;
use pslite_proto::{Command, Message, Node, NodeId, K_EMPTY};

use super::parts::{Origin, Part};
use super::Core;
use crate::address::Transport;
use crate::effects::{Output, Route};
use crate::error::{Failure, VanError};

impl Core {
    /// Prepares a message an app sends: checks that the node can send it,
    /// passes it through the pipeline, opens the connection on first use,
    /// stamps the sender and records it for resending. Returns the
    /// messages to put on the wire, in order: none when there is nothing to
    /// send now (replicated key ranges: an answer held until the backups
    /// have the push), several when a large message goes in parts to a
    /// pslite peer (the cut, after the stages: see `crate::partition`).
    pub fn send(&mut self, msg: Message, now: Instant) -> Result<Vec<Message>, VanError> {
        if let Some(f) = self.failure.as_ref() {
            return Err(f.clone().into());
        }
        let Some(msg) = self.stages(msg, 0, now).map_err(VanError::Failed)? else {
            return Ok(Vec::new());
        };
        let peer = self.parts.table.node(msg.meta.recver);
        let by_shm = peer.is_some_and(|n| self.shm_peer_node(n).is_some());
        let parts = self.parts.partition.cut(msg, peer, by_shm);
        parts.into_iter().map(|m| self.wire(m, now)).collect()
    }

    /// A message [`Core::send`] prepared could not be put on the wire.
    pub fn send_failed(&mut self, msg: &Message) {
        if let Some(r) = &mut self.parts.resender {
            r.forget(msg);
        }
    }

    /// A control message of the core's own (see [`Core::send_from`]).
    pub(super) fn emit(&mut self, msg: Message, now: Instant) {
        self.send_from(msg, Origin::Core, now);
    }

    /// Sends what `origin` emitted: attachments, the stages after its own,
    /// the wire, then to the driver.
    pub(super) fn send_from(&mut self, mut msg: Message, origin: Origin, now: Instant) {
        if msg.is_control() {
            self.attach(&mut msg, now);
        }
        let recver = msg.meta.recver;
        let msg = match self.stages(msg, origin.first_stage(), now) {
            Ok(Some(msg)) => msg,
            Ok(None) => return,
            Err(failure) => return debug!("cannot send to node {recver}: {failure}"),
        };
        match self.wire(msg, now) {
            Ok(msg) => self.out.push(Output::Send(msg)),
            Err(e) => debug!("cannot send to node {recver}: {e}"),
        }
    }

    /// The parts of a control message that belong to other components,
    /// and the core's own: a node's heartbeat carries its counters
    /// (pslite-only; C++ schedulers skip the field).
    fn attach(&self, msg: &mut Message, now: Instant) {
        if msg.meta.control.cmd == Command::Heartbeat && self.parts.scheduler.is_none() {
            msg.meta.counters = Some(Box::new(self.counters.snapshot(now)));
        }
        let view = self.view();
        for part in Part::ATTACHMENTS {
            if let Some(c) = self.part(part) {
                c.attach(msg, &view);
            }
        }
    }

    /// The pipeline's stages from `first`.
    fn stages(
        &mut self,
        mut msg: Message,
        first: usize,
        now: Instant,
    ) -> Result<Option<Message>, Failure> {
        for &stage in &Part::PIPELINE[first.min(Part::PIPELINE.len())..] {
            let mut result = Ok(None);
            self.on_part(stage, now, |c, cx| result = c.outgoing(msg, now, cx));
            match result? {
                Some(m) => msg = m,
                None => return Ok(None),
            }
        }
        Ok(Some(msg))
    }

    /// The wire: a timestamp for a control message without one (not an
    /// ACK), the connection on first use, the sender, and the resender's
    /// copy (remembered before it leaves: the ACK may beat us back).
    fn wire(&mut self, mut msg: Message, now: Instant) -> Result<Message, VanError> {
        if msg.meta.timestamp == K_EMPTY && msg.is_control() && msg.meta.control.cmd != Command::Ack
        {
            msg.meta.timestamp = self.next_timestamp();
        }
        let recver = msg.meta.recver;
        if !self.connected.contains(&recver) {
            if !self.is_joined() {
                return Err(VanError::NotReady);
            }
            let node = self
                .parts
                .table
                .node(recver)
                .cloned()
                .ok_or(VanError::UnknownPeer(recver))?;
            let identity = self.me().id;
            self.connect(node, identity);
        }
        msg.meta.sender = self.me().id;
        if let Some(r) = &mut self.parts.resender {
            r.on_send(&msg, now);
        }
        Ok(msg)
    }

    /// Opens (or replaces) the connection to `node` as `identity`.
    pub(super) fn connect(&mut self, node: Node, identity: NodeId) {
        self.connected.insert(node.id);
        let route = self.route(&node);
        let key = if identity == K_EMPTY {
            None
        } else {
            self.expected_key_of(&node).map(|_| self.me().key)
        };
        self.out.push(Output::Connect {
            node,
            identity,
            route,
            key,
        });
    }

    /// How to reach `node`: over its abstract Unix socket when it is a
    /// pslite node of this host and both listen on one (`PS_IPC`), else at
    /// the address it advertises (C++ nodes and other hosts: always); large
    /// frames through shared memory when it is a same-host shared-memory
    /// peer.
    fn route(&self, node: &Node) -> Route {
        let endpoint = self
            .cfg
            .transport
            .connect_endpoint(&node.hostname, node.port);
        if node.id < 0 {
            // A registration's check: the address it names, as named.
            return Route {
                endpoint,
                local: None,
                shm_pid: None,
                watch: true,
            };
        }
        let local = match (&self.cfg.shm_identity, self.cfg.transport) {
            (Some((host, _)), Transport::Tcp) if self.cfg.ipc && self.same_host(node) => {
                Some(crate::address::local_endpoint(host, node.pid, node.port))
            }
            _ => None,
        };
        Route {
            endpoint,
            local,
            shm_pid: self.shm_peer_node(node),
            watch: self.parts.scheduler.is_some() || node.id == SCHEDULER,
        }
    }

    /// Whether `node` is a pslite node of this host (same host identity)
    /// that uses shared memory.
    fn same_host(&self, node: &Node) -> bool {
        self.cfg.shm_identity.as_ref().is_some_and(|(host, _)| {
            node.pslite && node.pid != 0 && !node.host.is_empty() && node.host == *host
        })
    }

    pub(super) fn shm_peer_node(&self, node: &Node) -> Option<u32> {
        self.same_host(node).then_some(node.pid)
    }

    /// Whether node `id` (in the node table) is a pslite node of this host
    /// that this node shares memory with: data to it goes by memory, not
    /// over a network link.
    pub fn shares_memory_with(&self, id: NodeId) -> bool {
        self.node(id).is_some_and(|node| self.same_host(node))
    }
}
