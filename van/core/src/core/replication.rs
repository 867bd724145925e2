//! The core's side of replicated key ranges (see `crate::replica`): which
//! state machine a node runs (the scheduler's range map, a server's
//! replicas, a worker's routing), and the glue between it and the rest of
//! the core. Off unless the scheduler runs with `PS_REPLICAS >= 2`; nodes
//! turn it on when the scheduler's node table carries a range map.

use std::collections::BTreeSet;
use std::time::Instant;

use bytes::Bytes;
use log::{debug, error, info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::replica::{RangeMap, ReplicaMsg, ReplicaOp};
use pslite_proto::{Command, Message, Role, K_EMPTY};
use rand::Rng;

use super::{Core, Output};
use crate::error::{Failure, VanError};
use crate::replica::client::RangeClient;
use crate::replica::master::RangeMaster;
use crate::replica::server::{ReplicaServer, ServerOut};
use crate::scheduler::Action;

/// Which replication state machine this node runs.
pub(crate) enum Replication {
    /// Not a replicated cluster (or no map yet).
    Off,
    /// The scheduler: the range map.
    Master(RangeMaster),
    /// A server: the ranges it holds.
    Server(Box<ReplicaServer>),
    /// A worker: routing by the map.
    Client(RangeClient),
}

impl Replication {
    /// The scheduler's state for `cfg`: on with `PS_REPLICAS >= 2`, or
    /// when servers join and leave (`elastic_servers`: the range map moves
    /// their ranges even with one copy).
    pub(crate) fn for_scheduler(
        num_servers: i32,
        replicas: u32,
        elastic_servers: bool,
    ) -> Replication {
        if replicas >= 2 || elastic_servers {
            Replication::Master(RangeMaster::new(
                num_servers.max(1) as usize,
                replicas as usize,
            ))
        } else {
            Replication::Off
        }
    }
}

impl Core {
    /// The range map this node knows, when key ranges are replicated.
    pub fn range_map(&self) -> Option<&RangeMap> {
        match &self.replication {
            Replication::Off => None,
            Replication::Master(m) => (m.map().version > 0).then(|| m.map()),
            Replication::Server(s) => Some(s.map()),
            Replication::Client(c) => Some(c.map()),
        }
    }

    /// On a server: its ranges' replication state, described for logs.
    pub fn describe_replicas(&self) -> String {
        match &self.replication {
            Replication::Server(s) => format!("{}\n{}", s.trace.join("\n"), s.describe()),
            _ => String::new(),
        }
    }

    /// On a server: whether it is the serving primary of range `r`.
    pub fn serves_range(&self, r: u32) -> bool {
        matches!(&self.replication, Replication::Server(s) if s.serves(r))
    }

    /// Whether key ranges are replicated in this cluster (known on a node
    /// once it joined).
    pub fn replicated(&self) -> bool {
        !matches!(self.replication, Replication::Off)
    }

    /// On a server: the apps whose state is copied to joining servers (each
    /// answers [`Output::Snapshot`] and [`Output::Restore`]); app 0 unless
    /// set.
    pub fn set_replicated_apps(&mut self, apps: BTreeSet<i32>) {
        self.set_checkpoint_apps(apps.clone());
        self.replicated_apps = apps.clone();
        if let Replication::Server(s) = &mut self.replication {
            s.set_apps(apps);
        }
    }

    /// App `app` answered snapshot request `token` with `data`.
    pub fn snapshot_taken(&mut self, token: u64, app: i32, data: Bytes, now: Instant) {
        if self.checkpoint_snapshot(token, app, Ok(data.clone()), now) {
            return;
        }
        if let Replication::Server(s) = &mut self.replication {
            s.snapshot_taken(token, app, data);
        }
        self.flush_replica(now);
    }

    /// App `app` finished restore request `token`.
    pub fn restored(&mut self, token: u64, app: i32, now: Instant) {
        if self.checkpoint_restored(token, app, Ok(()), now) {
            return;
        }
        if let Replication::Server(s) = &mut self.replication {
            s.restored(token, app);
        }
        self.flush_replica(now);
    }

    /// An app's message on its way out: a worker's KV request is routed to
    /// its range's primary; a server's answer is paired with its request
    /// (and maybe held until the backups have it). `Ok(None)`: nothing to
    /// send now.
    pub(super) fn replica_outgoing(
        &mut self,
        msg: Message,
        now: Instant,
    ) -> Result<Option<Message>, VanError> {
        let out = match &mut self.replication {
            Replication::Client(c) if c.routes(&msg) => {
                let range = ids::id_to_rank(msg.meta.recver) as u32;
                match c.route(msg) {
                    Some(m) => Some(m),
                    None => return Err(VanError::Failed(Failure::RangeLost { range })),
                }
            }
            Replication::Server(s) => s.on_answer(msg),
            _ => Some(msg),
        };
        self.flush_replica(now);
        Ok(out)
    }

    /// A data message carrying a replication part, from a member.
    pub(super) fn replica_data(&mut self, msg: Message, now: Instant) {
        let op = msg.meta.replica.as_ref().map(|r| r.op);
        match (&mut self.replication, op) {
            (Replication::Server(s), Some(ReplicaOp::Request))
                if msg.meta.request && ids::role_of_id(msg.meta.sender) == Some(Role::Worker) =>
            {
                s.handle(msg);
            }
            (Replication::Client(c), Some(ReplicaOp::Response))
                if !msg.meta.request && ids::role_of_id(msg.meta.sender) == Some(Role::Server) =>
            {
                let range = msg.meta.replica.as_ref().map_or(0, |r| r.range);
                if let Some(msg) = c.on_response(msg) {
                    // Answered: copies still resent to earlier primaries
                    // (dead ones, or a process that replaced one) stop.
                    if let Some(r) = &mut self.resender {
                        let (app, customer, ts) =
                            (msg.meta.app_id, msg.meta.customer_id, msg.meta.timestamp);
                        r.settle(|m| {
                            m.meta.request
                                && m.meta.app_id == app
                                && m.meta.customer_id == customer
                                && m.meta.timestamp == ts
                                && m.meta.replica.as_ref().is_some_and(|x| x.range == range)
                        });
                    }
                    self.deliver(msg);
                }
            }
            _ => {
                self.reject(
                    &msg,
                    "its replication part does not fit its sender or this node",
                );
                return;
            }
        }
        self.flush_replica(now);
    }

    /// A REPLICA control message.
    pub(super) fn replica_control(&mut self, msg: Message, now: Instant) {
        let sender = msg.meta.sender;
        let Some(rep) = msg.meta.replica.as_deref() else {
            self.drop_logged(sender, "REPLICA", "it has no replication part");
            return;
        };
        let early = !self.member.is_joined() || matches!(self.replication, Replication::Off);
        if early
            && self.cfg.role == Role::Server
            && ids::role_of_id(sender) == Some(Role::Server)
            && rep.op != ReplicaOp::Map
        {
            // A copy may come before this server's node table and map (a
            // replacement registering while its primary already copies to
            // it): held until the map, within PS_HOLD_LIMIT.
            self.hold(msg);
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
        if !self.member.is_member(sender) {
            self.drop_logged(sender, "REPLICA", "its sender is not in the node table");
            return;
        }
        match (&mut self.replication, rep.op) {
            (Replication::Master(m), ReplicaOp::Ready) => {
                if m.ready(sender, rep.range, rep.node, rep.version) {
                    self.broadcast_map(now);
                }
            }
            (Replication::Master(_), ReplicaOp::Leave)
                if ids::role_of_id(sender) == Some(Role::Server) =>
            {
                self.server_asks_to_leave(sender, now);
            }
            (_, ReplicaOp::Left | ReplicaOp::LeaveRefused) if sender == SCHEDULER => {
                self.leave_answered(rep.op, rep.node, now);
            }
            (_, ReplicaOp::Map) if sender == SCHEDULER => {
                if let Some(map) = rep.map.clone() {
                    self.on_range_map(map, now);
                }
            }
            (Replication::Server(s), _) if ids::role_of_id(sender) == Some(Role::Server) => {
                s.handle(msg);
                self.flush_replica(now);
            }
            _ => self.drop_logged(sender, "REPLICA", "not for this node"),
        }
    }

    /// A range map from the scheduler (on its node table or alone).
    pub(super) fn on_range_map(&mut self, map: RangeMap, now: Instant) {
        let me = self.member.me().id;
        if !self.member.is_joined() || me == K_EMPTY {
            return;
        }
        self.member.set_servers_replicated();
        match &mut self.replication {
            Replication::Off => match self.cfg.role {
                Role::Server => {
                    info!(
                        "key ranges are replicated ({} copies): this server holds its ranges \
                         by the scheduler's map",
                        map.replicas
                    );
                    let mut s = ReplicaServer::new(me);
                    s.set_apps(self.replicated_apps.clone());
                    s.on_map(map);
                    self.replication = Replication::Server(Box::new(s));
                }
                Role::Worker => {
                    let incarnation = self.rng.random::<u32>();
                    self.replication = Replication::Client(RangeClient::new(map, incarnation));
                }
                Role::Scheduler => {}
            },
            Replication::Server(s) => s.on_map(map),
            Replication::Client(c) => {
                let rerouted = c.on_map(map);
                for msg in rerouted.resend {
                    match self.prepare(msg, now) {
                        Ok(msg) => self.out.push(Output::Send(msg)),
                        Err(e) => debug!("cannot send a request again: {e}"),
                    }
                }
                for msg in rerouted.lost {
                    let range = ids::id_to_rank(msg.meta.recver) as u32;
                    self.out
                        .push(Output::Undeliverable(msg, Failure::RangeLost { range }));
                }
            }
            Replication::Master(_) => {}
        }
        if let Some(map) = self.range_map().cloned() {
            self.out.push(Output::RangeMap(map));
        }
        if matches!(self.replication, Replication::Server(_)) {
            // What peers sent before this server had a map.
            let early = self
                .held
                .take_if(|m| m.meta.control.cmd == Command::Replica);
            for msg in early {
                self.replica_control(msg, now);
            }
        }
        self.changed = true;
        self.flush_replica(now);
    }

    /// Carries out what the server side asked for.
    pub(super) fn flush_replica(&mut self, now: Instant) {
        let Replication::Server(s) = &mut self.replication else {
            return;
        };
        for out in s.take_output() {
            match out {
                ServerOut::Send(mut msg) => {
                    if msg.is_control() {
                        // From a counter that starts at random: a process
                        // that replaces a server must not repeat its
                        // predecessor's signatures (PS_RESEND drops those
                        // as duplicates).
                        msg.meta.timestamp = self.replica_ts;
                        self.replica_ts = self.replica_ts.wrapping_add(1) & i32::MAX;
                    }
                    self.emit(msg, now)
                }
                ServerOut::Deliver(msg) => self.deliver(msg),
                ServerOut::Apps(out) => self.for_apps(out),
            }
        }
    }

    /// Whether the transport's failure of `msg` (to a dead server, or never
    /// acknowledged) is for the range map to settle instead: a worker's
    /// request in flight is sent again to the range's next primary.
    pub(super) fn replica_owns(&self, msg: &Message) -> bool {
        matches!(&self.replication, Replication::Client(c) if c.owns(msg))
    }

    /// Whether node `id`'s death is for the range map to settle (a server,
    /// on a worker of a replicated cluster): nothing fails for it.
    pub(super) fn replica_covers(&self, id: NodeId) -> bool {
        matches!(self.replication, Replication::Client(_))
            && ids::role_of_id(id) == Some(Role::Server)
    }

    /// On the scheduler: refuses a C++ node's registration in a replicated
    /// cluster (it would not understand the range map). True if refused.
    pub(super) fn replica_refuses(&mut self, msg: &Message) -> bool {
        if !matches!(self.replication, Replication::Master(_))
            || msg.meta.control.cmd != Command::AddNode
        {
            return false;
        }
        let Some(node) = msg.meta.control.node.iter().find(|n| !n.pslite) else {
            return false;
        };
        if !self.dropped.first((msg.meta.sender, "replicas")) {
            return true;
        }
        if self.cfg.min_servers.is_some() {
            error!(
                "scheduler: refusing {} at {}: DMLC_NUM_SERVER=MIN:MAX (servers that join and \
                 leave, by the range map) is pslite-only, C++ ps-lite nodes cannot join such a \
                 cluster; give DMLC_NUM_SERVER a plain number to mix in C++ nodes",
                node.role,
                node.address(),
            );
        } else {
            error!(
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

    /// On the scheduler, before carrying out `actions`: forms the map when
    /// the cluster forms, and takes recovered servers in, so that the node
    /// tables sent carry the current map.
    pub(super) fn replica_before(&mut self, actions: &[Action], now: Instant) {
        let Replication::Master(m) = &mut self.replication else {
            return;
        };
        if actions.iter().any(|a| matches!(a, Action::Ready)) && m.map().version == 0 {
            let mut servers: Vec<NodeId> = self
                .scheduler
                .as_ref()
                .map(|s| {
                    s.nodes()
                        .iter()
                        .filter(|n| n.role == Role::Server)
                        .map(|n| n.id)
                        .collect()
                })
                .unwrap_or_default();
            servers.sort_unstable();
            servers.dedup();
            m.formed(&servers);
            info!(
                "scheduler: key ranges replicated {} times: {:?}",
                self.cfg.replicas,
                {
                    m.map()
                        .ranges
                        .iter()
                        .map(|r| r.replicas.clone())
                        .collect::<Vec<_>>()
                }
            );
        }
        let recovered: Vec<NodeId> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Connect(n) if n.is_recovery && n.role == Role::Server => Some(n.id),
                _ => None,
            })
            .collect();
        // A new process holds nothing of what the id held: the map without
        // it goes out first, so that primaries drop what they were sending
        // its predecessor, then (after the updates naming the new
        // processes, see `replica_after`) the map with it joining. With
        // several at once, every predecessor leaves before any joins: a map
        // naming one as a joiner must not reach the primaries before its
        // new address does.
        let mut dead = false;
        for &id in &recovered {
            if let Replication::Master(m) = &mut self.replication {
                dead |= m.server_dead(id);
            }
        }
        if dead {
            self.broadcast_map(now);
        }
        for id in recovered {
            let Replication::Master(m) = &mut self.replication else {
                return;
            };
            m.server_live(id);
            self.replica_dead.remove(&id);
            info!("scheduler: node {id} replaces a server: copies of its ranges start");
        }
    }

    /// On the scheduler: the map to attach to a node table it sends.
    /// Not to the one-entry updates about a recovered server: when several
    /// recover at once, the map names them all, and a primary must not
    /// start a copy to one whose new address it has not got yet (the map
    /// follows the updates, see `replica_after`).
    pub(super) fn replica_attach(&self, msg: &mut Message) {
        if msg.meta.control.cmd != Command::AddNode || msg.meta.control.node.len() < 2 {
            return;
        }
        if let Replication::Master(m) = &self.replication {
            if m.map().version > 0 {
                let mut rep = ReplicaMsg::new(ReplicaOp::Map, 0);
                rep.version = m.map().version;
                rep.map = Some(m.map().clone());
                msg.meta.replica = Some(Box::new(rep));
            }
        }
    }

    /// On the scheduler, after a recovery: barriers wait for the server again.
    pub(super) fn replica_after(&mut self, actions: &[Action], now: Instant) {
        if !matches!(self.replication, Replication::Master(_)) {
            return;
        }
        let mut changed = false;
        for action in actions {
            if let Action::Connect(node) = action {
                if node.is_recovery && node.role == Role::Server {
                    changed = true;
                    if let Some(s) = &mut self.scheduler {
                        let more = s.set_failed_over(node.id, false);
                        self.apply_scheduler(more, now);
                    }
                }
            }
        }
        if changed {
            self.broadcast_map(now);
        }
    }

    /// On the scheduler, at each tick: servers newly declared dead leave
    /// the map (their ranges fail over) and barriers stop waiting for them.
    pub(super) fn replica_tick(&mut self, now: Instant) {
        let (Replication::Master(m), Some(s)) = (&mut self.replication, &mut self.scheduler) else {
            return;
        };
        let dead: BTreeSet<NodeId> = s
            .dead_nodes(now)
            .into_iter()
            .filter(|&id| ids::role_of_id(id) == Some(Role::Server))
            .collect();
        let newly: Vec<NodeId> = dead.difference(&self.replica_dead).copied().collect();
        if newly.is_empty() {
            return;
        }
        let mut changed = false;
        let mut actions = Vec::new();
        for id in newly {
            self.replica_dead.insert(id);
            if m.server_dead(id) {
                warn!(
                    "scheduler: server {id} is dead: its ranges fail over (map {})",
                    m.map().version
                );
                changed = true;
            }
            actions.extend(s.set_failed_over(id, true));
        }
        if changed {
            self.broadcast_map(now);
        }
        self.apply_scheduler(actions, now);
    }

    /// On the scheduler: sends the map to every live server and worker
    /// (then leaving servers that no range holds any more have left).
    pub(super) fn broadcast_map(&mut self, now: Instant) {
        let (Replication::Master(m), Some(s)) = (&self.replication, &self.scheduler) else {
            return;
        };
        let mut rep = ReplicaMsg::new(ReplicaOp::Map, 0);
        rep.version = m.map().version;
        rep.map = Some(m.map().clone());
        let mut to: Vec<NodeId> = s
            .nodes()
            .iter()
            .filter(|n| n.pslite && !self.replica_dead.contains(&n.id))
            .map(|n| n.id)
            .collect();
        to.sort_unstable();
        to.dedup();
        for id in to {
            let mut msg = Message::control(Command::Replica, id);
            msg.meta.replica = Some(Box::new(rep.clone()));
            self.emit(msg, now);
        }
        if let Some(map) = self.range_map().cloned() {
            self.out.push(Output::RangeMap(map));
        }
        self.settle_leaving(now);
    }
}
