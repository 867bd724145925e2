//! What a caller asks the core directly about the node: who it is, what
//! it knows of the cluster, whether it joined. Each question goes to the
//! component it concerns; the features' own (replication, checkpoints'
//! files, the store's watchers) are in `features.rs`, and the blocking
//! calls (joining, barriers, the store's requests, ...) are the one
//! [`Core::call`] of `waits.rs`.

use std::sync::Arc;
use std::time::Instant;

use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Node, Role};

use super::Core;
use crate::counters::Counters;
use crate::effects::WaitingFor;
use crate::error::{Failure, StartTimeout, VanError};

impl Core {
    /// What this node counts.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// This node as the cluster knows it (its id once joined).
    pub fn me(&self) -> &Node {
        self.parts.table.me()
    }

    /// The entry of node `id` in the node table, if it has one.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.parts.table.node(id)
    }

    /// The node table: servers, workers and the scheduler, once joined.
    pub fn nodes(&self) -> Vec<Node> {
        self.parts.table.nodes().to_vec()
    }

    /// What this node holds for its peers within `PS_HOLD_LIMIT`, in
    /// bytes: the messages it holds, its incomplete messages in parts (see
    /// [`crate::partition::Reassembly::held`]) and registrations; and how
    /// many incomplete messages.
    pub fn held_for_peers(&self) -> (u64, usize) {
        (
            self.held_by_kind().iter().sum::<usize>() as u64,
            self.parts.partition.incomplete(),
        )
    }

    /// Whether this node has joined the cluster.
    pub fn is_joined(&self) -> bool {
        self.parts.table.is_joined()
    }

    /// Elastic mode: the current round and its workers in rank order, once
    /// known.
    pub fn round(&self) -> Option<(u64, Vec<NodeId>)> {
        self.parts.table.round().map(|(n, m)| (n, m.to_vec()))
    }

    /// Elastic mode: the round this node joined in (a worker admitted after
    /// the first round skips the start barrier: the others are past it).
    pub fn joined_round(&self) -> Option<u64> {
        self.parts.table.joined_round()
    }

    /// Elastic mode, on a worker: leaves the job (its round ends).
    pub fn leave(&mut self, now: Instant) {
        if self.cfg.elastic.is_none() || self.cfg.role != Role::Worker || !self.is_joined() {
            return;
        }
        let msg = Message::control(Command::Leave, SCHEDULER);
        self.emit(msg, now);
    }

    /// Why the node failed, if it did.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// Identities heard from before they could have been assigned: a hint
    /// of an identity conflict when the cluster does not form.
    pub fn identity_conflicts(&self) -> Vec<NodeId> {
        self.early_ids.iter().copied().collect()
    }

    /// Data messages dropped because their sender may not send them.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// What this node waits for while it joins.
    pub(super) fn waiting_for(&self) -> WaitingFor {
        match &self.parts.scheduler {
            Some(s) => {
                let missing = s.missing();
                WaitingFor::Registrations {
                    servers: (
                        missing.servers,
                        self.cfg.min_servers.unwrap_or(self.cfg.num_servers),
                    ),
                    workers: self
                        .cfg
                        .elastic
                        .is_none()
                        .then_some((missing.workers, self.cfg.num_workers)),
                }
            }
            None => WaitingFor::NodeTable {
                scheduler: format!("{}:{}", self.cfg.scheduler_host, self.cfg.scheduler_port),
                servers: self.cfg.num_servers,
                workers: match &self.cfg.elastic {
                    Some(e) => format!("{}:{}", e.min, e.max),
                    None => self.cfg.num_workers.to_string(),
                },
            },
        }
    }

    /// `None` while joining; then joined, or why not.
    pub(crate) fn join_status(&self) -> Option<Result<(), VanError>> {
        let table = &self.parts.table;
        if table.is_joined() {
            return Some(Ok(()));
        }
        if let Some(f) = &self.failure {
            return Some(Err(f.clone().into()));
        }
        let waited = table.timed_out()?;
        let missing = self.parts.scheduler.as_ref().map(|s| s.missing());
        Some(Err(VanError::StartTimeout(Box::new(StartTimeout {
            waited,
            missing_servers: missing.map(|m| m.servers),
            missing_workers: missing.map(|m| m.workers),
            num_servers: self.cfg.num_servers,
            num_workers: self.cfg.num_workers,
            scheduler: format!("{}:{}", self.cfg.scheduler_host, self.cfg.scheduler_port),
            advertised: table.me().address(),
            identity_conflicts: self.identity_conflicts(),
            refused_registrations: self.parts.registrations.refused().into(),
        }))))
    }
}
