//! The data path: a data message (no control command) goes to the apps if
//! its sender may send it, waits if it came early (this node has no table
//! yet, or an elastic newcomer's table is on its way), goes to replication
//! if it carries a replication part, else is dropped with a log line once
//! per sender and cause. A part of a message cut into parts passes the
//! same checks before it is reassembled ([`Core::data_part`]).

use std::time::Instant;

use log::debug;
use pslite_proto::ids::{self, NodeId};
use pslite_proto::replica::ReplicaOp;
use pslite_proto::{Message, Role, K_EMPTY};

use super::parts::Part;
use super::Core;
use crate::counters::DropReason;
use crate::effects::Output;
use crate::hold::Reason;

/// Why a data message with inconsistent frames is dropped.
const MALFORMED: &str = "its data frames and data types differ in number";

impl Core {
    /// A data message: delivered if its sender may send it, held back until
    /// this node joins (within the byte budget), else dropped.
    pub(super) fn data(&mut self, msg: Message, now: Instant) {
        let sender = msg.meta.sender;
        if sender == K_EMPTY {
            self.reject(&msg, "its sender has no ps<id> identity");
            return;
        }
        if !msg.meta.data_type.is_empty() && msg.meta.data_type.len() != msg.data.len() {
            self.reject(&msg, MALFORMED);
            return;
        }
        if !self.is_joined() {
            self.hold(Reason::Joining, msg);
            return;
        }
        if self.identity_matches(sender, msg.meta.sender_key) == Some(false) {
            // Held before the table named its sender's key.
            self.reject(&msg, "its identity lacks the key of its node's process");
            return;
        }
        if !self.parts.table.is_member(sender) {
            if self.is_newcomer(sender) {
                self.hold_newcomer(msg);
            } else {
                self.reject(&msg, "its sender is not in the node table");
            }
            return;
        }
        if let Some(op) = msg.meta.replica.as_ref().map(|r| r.op) {
            // A worker's request to a server holding ranges, or a server's
            // answer to a worker routing by the map.
            let from = ids::role_of_id(sender);
            let fits = self.replicated()
                && match (self.cfg.role, op) {
                    (Role::Server, ReplicaOp::Request) => {
                        msg.meta.request && from == Some(Role::Worker)
                    }
                    (Role::Worker, ReplicaOp::Response) => {
                        !msg.meta.request && from == Some(Role::Server)
                    }
                    _ => false,
                };
            if fits {
                self.to(Part::Replication, msg, now);
            } else {
                self.reject(
                    &msg,
                    "its replication part does not fit its sender or this node",
                );
            }
            return;
        }
        if let Some(why) = self.forbidden(&msg) {
            self.reject(&msg, why);
            return;
        }
        if msg.meta.staleness.is_some() && self.cfg.role == Role::Server {
            // A worker's clock, tick or bounded pull: its app's gate.
            self.to(Part::Staleness, msg, now);
            return;
        }
        self.for_apps(Output::Deliver(msg), now);
    }

    /// A part of a message cut into parts: reassembled only if it comes
    /// from a member of the node table through the identity (with the key)
    /// the table names for it, so that no stranger makes this node hold
    /// anything for a message; held like data if it came before this node
    /// joined or from an elastic newcomer (within `PS_HOLD_LIMIT`), else
    /// dropped before anything is allocated for it.
    pub(super) fn data_part(&mut self, msg: Message, now: Instant) {
        let sender = msg.meta.sender;
        if sender == K_EMPTY {
            self.reject(&msg, "its sender has no ps<id> identity");
            return;
        }
        if !self.is_joined() {
            self.hold(Reason::Joining, msg);
            return;
        }
        if self.is_peer(sender) && self.identity_matches(sender, msg.meta.sender_key) == Some(true)
        {
            self.to(Part::Partition, msg, now);
            return;
        }
        if self.identity_matches(sender, msg.meta.sender_key) == Some(false) {
            self.reject(&msg, "its identity lacks the key of its node's process");
            return;
        }
        if self.is_newcomer(sender) {
            self.hold_newcomer(msg);
            return;
        }
        self.reject(&msg, "its sender is not in the node table");
    }

    /// What the node holds for its peers, in bytes, by kind: messages held
    /// ([`crate::hold::Holds`]), incomplete messages in parts and (on the
    /// scheduler) registrations: one budget, `PS_HOLD_LIMIT`, for them all.
    pub(super) fn held_by_kind(&self) -> [usize; 3] {
        [
            self.holds.bytes(),
            self.parts.partition.held() as usize,
            self.parts.registrations.bytes(),
        ]
    }

    /// Whether `sender` is a member of this node's table other than this
    /// node (whose messages' identities are checked as they arrive).
    pub(super) fn is_peer(&self, sender: NodeId) -> bool {
        self.is_joined() && sender != self.me().id && self.parts.table.is_member(sender)
    }

    /// Elastic mode, on a server: whether a worker id the table does not
    /// name yet may be a worker whose table is on its way.
    fn is_newcomer(&self, sender: NodeId) -> bool {
        self.cfg.elastic.is_some()
            && self.cfg.role == Role::Server
            && ids::role_of_id(sender) == Some(Role::Worker)
    }

    /// Holds what came from an elastic newcomer until the next table names
    /// it (within the budget of everything held for peers).
    fn hold_newcomer(&mut self, msg: Message) {
        let sender = msg.meta.sender;
        let [_, parts, registrations] = self.held_by_kind();
        self.holds.set_held_elsewhere(parts + registrations);
        match self.holds.hold(Reason::Newcomer, msg) {
            Ok(()) => debug!("holding data from node {sender} until the next table names it"),
            Err(refused) => self.reject(
                &refused.item,
                "its sender is not in the node table (and too much data from newcomers \
                 waits: PS_HOLD_LIMIT)",
            ),
        }
    }

    /// Why a member may not send `msg` to this node, given both roles.
    fn forbidden(&self, msg: &Message) -> Option<&'static str> {
        if msg.meta.simple_app {
            return None; // the app decides who may talk to it
        }
        let from = ids::role_of_id(msg.meta.sender);
        match (self.cfg.role, msg.meta.request, from) {
            (Role::Server, true, Some(Role::Worker)) => None,
            (Role::Server, true, _) => Some("servers take KV requests from workers only"),
            (Role::Worker, false, Some(Role::Server)) => None,
            (Role::Worker, false, _) => Some("workers take KV responses from servers only"),
            (Role::Server, false, _) => Some("servers send no KV requests, so take no responses"),
            _ => None,
        }
    }

    /// Holds a message that came early (before joining, or before a range
    /// map), if its sender's id can be a member of this cluster.
    pub(super) fn hold(&mut self, reason: Reason, msg: Message) {
        let sender = msg.meta.sender;
        // Elastic mode hands out worker ids without bound.
        let member_id = if self.cfg.elastic.is_some() {
            ids::role_of_id(sender).is_some()
        } else {
            ids::group_members(ids::ALL_GROUP, self.cfg.num_servers, self.cfg.num_workers)
                .contains(&sender)
        };
        if !member_id {
            self.reject(&msg, "its sender's id cannot be a member of this cluster");
            return;
        }
        let [_, parts, registrations] = self.held_by_kind();
        self.holds.set_held_elsewhere(parts + registrations);
        if let Err(refused) = self.holds.hold(reason, msg) {
            self.reject(
                &refused.item,
                "too much data arrived before this node joined (PS_HOLD_LIMIT)",
            );
        }
    }

    /// Drops a data message its sender may not send (counted, logged).
    pub(super) fn reject(&mut self, msg: &Message, why: &'static str) {
        self.rejected += 1;
        self.counters.dropped(if why == MALFORMED {
            DropReason::Malformed
        } else {
            DropReason::UnknownPeer
        });
        self.drop_logged(msg.meta.sender, "a data message", why);
    }

    /// Logs a dropped message: a warning the first time `sender` sends one
    /// for `why`, at debug level after that, so a hostile or confused peer
    /// cannot flood the log.
    pub(super) fn drop_logged(&mut self, sender: NodeId, what: &str, why: &'static str) {
        self.dropped.log((sender, why), || {
            format!("dropping {what} from node {sender}: {why}")
        });
    }
}
