//! Replicated key ranges as a component of the core: which state machine
//! this node runs (the scheduler's range map, a server's replicas, a
//! worker's routing) and how it meets the others. Off unless the scheduler
//! runs with `PS_REPLICAS >= 2` or servers that join and leave; nodes turn
//! it on when the scheduler's node table carries a range map.
//!
//! Where it meets the other components:
//! - the outgoing pipeline: a worker's KV request goes to its range's
//!   primary; a server's answer is paired with its request (and held
//!   until the backups have the push);
//! - the node-table attachments: the scheduler's tables carry the map; a
//!   node applies the map of a table once membership took the table;
//! - events: the cluster forming forms the map; restarted processes taking
//!   over servers' ids move their ranges out, then in again; servers dead
//!   (by the scheduler's facts) fail over, and barriers stop waiting for
//!   them ([`Event::FailedOver`]); a server that left is told and counted
//!   out ([`Event::ServerLeft`]).
//!
//! It also holds the scheduler's side of servers leaving (`crate::leave`
//! is the server's): the range map decides when a server may go.

use std::collections::BTreeSet;
use std::time::Instant;

use bytes::Bytes;
use log::{info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::replica::{RangeMap, ReplicaMsg, ReplicaOp};
use pslite_proto::{Command, Message, Role, K_EMPTY};
use rand::Rng;

use super::client::RangeClient;
use super::master::{LeaveRefused, RangeMaster};
use super::server::ReplicaServer;
use crate::component::{Component, Cx, Facts};
use crate::config::VanConfig;
use crate::effects::{Effect, Effects, Event, Output};
use crate::error::Failure;
use crate::hold::{Holds, Reason};
use crate::log_once::LogOnce;

/// Whether the scheduler of `cfg` keeps a range map: with
/// `PS_REPLICAS >= 2`, or when servers join and leave (the map moves their
/// ranges even with one copy).
pub fn scheduler_replicates(cfg: &VanConfig) -> bool {
    cfg.replicas >= 2 || cfg.min_servers.is_some()
}

/// Which replication state machine this node runs.
enum Mode {
    /// Not a replicated cluster (or no map yet).
    Off,
    /// The scheduler: the range map.
    Master(RangeMaster),
    /// A server: the ranges it holds.
    Server(Box<ReplicaServer>),
    /// A worker: routing by the map.
    Client(RangeClient),
}

/// A node's replication.
pub struct Replication {
    mode: Mode,
    /// On the scheduler: servers whose death the range map has taken in.
    dead: BTreeSet<NodeId>,
    /// On a server: the apps whose state is copied to joining servers.
    apps: BTreeSet<i32>,
    /// On a server: the timestamp of its first replication control
    /// message (its [`ReplicaServer`] counts from it).
    first_ts: i32,
    /// A map that came with a node table, applied once membership took
    /// the table.
    pending: Option<RangeMap>,
    /// Drops already warned about, by sender.
    dropped: LogOnce<(NodeId, &'static str)>,
}

impl Replication {
    /// The replication of the node `cfg` describes; a server's control
    /// messages count from `first_ts` (random: a process that replaces a
    /// server must not repeat its predecessor's signatures, which
    /// `PS_RESEND` drops as duplicates).
    pub fn new(cfg: &VanConfig, first_ts: i32) -> Replication {
        let mode = if cfg.role == Role::Scheduler && scheduler_replicates(cfg) {
            Mode::Master(RangeMaster::new(
                cfg.num_servers.max(1) as usize,
                cfg.replicas as usize,
            ))
        } else {
            Mode::Off
        };
        Replication {
            mode,
            dead: BTreeSet::new(),
            apps: BTreeSet::from([0]),
            first_ts,
            pending: None,
            dropped: LogOnce::new(log::Level::Warn),
        }
    }

    /// The range map this node knows, when key ranges are replicated.
    pub fn range_map(&self) -> Option<&RangeMap> {
        match &self.mode {
            Mode::Off => None,
            Mode::Master(m) => (m.map().version > 0).then(|| m.map()),
            Mode::Server(s) => Some(s.map()),
            Mode::Client(c) => Some(c.map()),
        }
    }

    /// Whether key ranges are replicated (known on a node once it joined).
    pub fn is_on(&self) -> bool {
        !matches!(self.mode, Mode::Off)
    }

    /// On a server: its ranges' replication state, described for logs.
    pub fn describe(&self, holds: &Holds) -> String {
        match &self.mode {
            Mode::Server(s) => format!("{}\n{}", s.trace.join("\n"), s.describe(holds)),
            _ => String::new(),
        }
    }

    /// On a server: whether it is the serving primary of range `r`.
    pub fn serves(&self, r: u32) -> bool {
        matches!(&self.mode, Mode::Server(s) if s.serves(r))
    }

    /// On a server: the apps whose state is copied to joining servers.
    pub fn set_apps(&mut self, apps: BTreeSet<i32>) {
        if let Mode::Server(s) = &mut self.mode {
            s.set_apps(apps.clone());
        }
        self.apps = apps;
    }

    /// Whether the transport's failure of `msg` (to a dead server, or never
    /// acknowledged) is for the range map to settle instead: a worker's
    /// request in flight is sent again to the range's next primary.
    pub fn owns(&self, msg: &Message) -> bool {
        matches!(&self.mode, Mode::Client(c) if c.owns(msg))
    }

    /// Whether node `id`'s death is for the range map to settle (a server,
    /// on a worker of a replicated cluster): nothing fails for it.
    pub fn covers(&self, id: NodeId) -> bool {
        matches!(self.mode, Mode::Client(_)) && ids::role_of_id(id) == Some(Role::Server)
    }

    /// App `app` answered snapshot request `token` with `data`.
    pub fn snapshot_taken(&mut self, token: u64, app: i32, data: Bytes, cx: &mut Cx<'_>) {
        if let Mode::Server(s) = &mut self.mode {
            s.snapshot_taken(token, app, data, cx.fx);
        }
    }

    /// App `app` finished restore request `token`.
    pub fn restored(&mut self, token: u64, app: i32, cx: &mut Cx<'_>) {
        if let Mode::Server(s) = &mut self.mode {
            s.restored(token, app, cx.fx);
        }
    }

    /// A range map from the scheduler (on its node table or alone).
    fn on_range_map(&mut self, map: RangeMap, cx: &mut Cx<'_>) {
        let me = cx.facts.me().id;
        if !cx.facts.is_joined() || me == K_EMPTY {
            return;
        }
        cx.event(Event::Replicated);
        // What the server does follows the map's output.
        let mut served = Effects::default();
        match &mut self.mode {
            Mode::Off => match cx.facts.config().role {
                Role::Server => {
                    info!(
                        "key ranges are replicated ({} copies): this server holds its ranges \
                         by the scheduler's map",
                        map.replicas
                    );
                    let mut s = ReplicaServer::new(me, self.first_ts);
                    s.set_apps(self.apps.clone());
                    s.on_map(map, cx.holds, &mut served);
                    self.mode = Mode::Server(Box::new(s));
                }
                Role::Worker => {
                    let incarnation = cx.rng.random::<u32>();
                    self.mode = Mode::Client(RangeClient::new(map, incarnation));
                }
                Role::Scheduler => {}
            },
            Mode::Server(s) => s.on_map(map, cx.holds, &mut served),
            Mode::Client(c) => {
                let rerouted = c.on_map(map);
                for msg in rerouted.resend {
                    cx.send(msg);
                }
                for msg in rerouted.lost {
                    let range = ids::id_to_rank(msg.meta.recver) as u32;
                    cx.out(Output::Undeliverable(msg, Failure::RangeLost { range }));
                }
            }
            Mode::Master(_) => {}
        }
        if let Some(map) = self.range_map().cloned() {
            cx.out(Output::RangeMap(map));
        }
        cx.fx.extend(served);
        if matches!(self.mode, Mode::Server(_)) {
            // What peers sent before this server had a map.
            for msg in cx.holds.release(|r| r == Reason::NoMap) {
                cx.fx.push(Effect::Route(msg));
            }
        }
        cx.changed();
    }

    /// A REPLICA control message from a member (see `core/route.rs`).
    fn control(&mut self, msg: Message, cx: &mut Cx<'_>) {
        let sender = msg.meta.sender;
        let Some(rep) = msg.meta.replica.as_deref() else {
            return;
        };
        match (&mut self.mode, rep.op) {
            (Mode::Master(m), ReplicaOp::Ready) => {
                if m.ready(sender, rep.range, rep.node, rep.version) {
                    self.broadcast_map(cx);
                }
            }
            (Mode::Master(_), ReplicaOp::Leave)
                if ids::role_of_id(sender) == Some(Role::Server) =>
            {
                self.server_asks_to_leave(sender, cx);
            }
            (_, ReplicaOp::Map) if sender == SCHEDULER => {
                if let Some(map) = rep.map.clone() {
                    self.on_range_map(map, cx);
                }
            }
            (Mode::Server(s), _) if ids::role_of_id(sender) == Some(Role::Server) => {
                s.handle(msg, cx.holds, cx.fx);
            }
            _ => {
                self.dropped.log((sender, "not for this node"), || {
                    format!("dropping REPLICA from node {sender}: not for this node")
                });
            }
        }
    }

    /// On the scheduler: sends the map to every live server and worker
    /// (then leaving servers that no range holds any more have left).
    fn broadcast_map(&mut self, cx: &mut Cx<'_>) {
        let Mode::Master(m) = &self.mode else {
            return;
        };
        if cx.facts.config().role != Role::Scheduler {
            return;
        }
        let mut rep = ReplicaMsg::new(ReplicaOp::Map, 0);
        rep.version = m.map().version;
        rep.map = Some(m.map().clone());
        let mut to: Vec<NodeId> = cx
            .facts
            .registered()
            .iter()
            .filter(|n| n.pslite && !self.dead.contains(&n.id))
            .map(|n| n.id)
            .collect();
        to.sort_unstable();
        to.dedup();
        for id in to {
            let mut msg = Message::control(Command::Replica, id);
            msg.meta.replica = Some(Box::new(rep.clone()));
            cx.send(msg);
        }
        if let Some(map) = self.range_map().cloned() {
            cx.out(Output::RangeMap(map));
        }
        self.settle_leaving(cx);
    }

    /// On the scheduler: server `id` asks to leave.
    fn server_asks_to_leave(&mut self, id: NodeId, cx: &mut Cx<'_>) {
        if cx.facts.has_left(id) {
            // Asked again (a resend): it has left already.
            answer_leave(id, ReplicaOp::Left, 0, cx);
            return;
        }
        let Some(min) = cx.facts.config().min_servers else {
            warn!(
                "scheduler: refusing server {id}'s leave: servers leave a running job only with \
                 DMLC_NUM_SERVER=MIN:MAX"
            );
            answer_leave(id, ReplicaOp::LeaveRefused, 0, cx);
            return;
        };
        let Mode::Master(m) = &mut self.mode else {
            return;
        };
        match m.server_leaving(id, min.max(1) as usize) {
            Ok(true) => {
                info!(
                    "scheduler: server {id} leaves: its ranges move to the others (map {})",
                    m.map().version
                );
                self.broadcast_map(cx);
                self.settle_leaving(cx);
            }
            Ok(false) => self.settle_leaving(cx),
            Err(LeaveRefused::TooFew { min, staying }) => {
                warn!(
                    "scheduler: refusing server {id}'s leave: {staying} server(s) would stay, \
                     fewer than DMLC_NUM_SERVER's MIN ({min})"
                );
                answer_leave(id, ReplicaOp::LeaveRefused, min as NodeId, cx);
            }
            Err(LeaveRefused::NotLive) => {
                warn!("scheduler: refusing server {id}'s leave: it holds no place in the map");
                answer_leave(id, ReplicaOp::LeaveRefused, 0, cx);
            }
        }
    }

    /// On the scheduler, after the map changed: leaving servers that no
    /// range holds any more have left; each is told it may exit.
    fn settle_leaving(&mut self, cx: &mut Cx<'_>) {
        let Mode::Master(m) = &mut self.mode else {
            return;
        };
        for id in m.take_left() {
            answer_leave(id, ReplicaOp::Left, 0, cx);
            cx.event(Event::ServerLeft(id));
            self.dead.insert(id);
        }
    }

    /// On the scheduler, before the node tables naming restarted processes
    /// go out: a new process holds nothing of what the id held, so the map
    /// without it goes out first (primaries drop what they were sending its
    /// predecessor), then, once the updates naming the new processes went
    /// out (see [`Replication::replaced`]), the map with it joining. With
    /// several at once, every predecessor leaves before any joins: a map
    /// naming one as a joiner must not reach the primaries before its new
    /// address does.
    fn replacing(&mut self, ids: &[NodeId], cx: &mut Cx<'_>) {
        let servers: Vec<NodeId> = ids
            .iter()
            .copied()
            .filter(|&id| ids::role_of_id(id) == Some(Role::Server))
            .collect();
        let Mode::Master(m) = &mut self.mode else {
            return;
        };
        let mut dead = false;
        for &id in &servers {
            dead |= m.server_dead(id);
        }
        if dead {
            self.broadcast_map(cx);
        }
        for id in servers {
            let Mode::Master(m) = &mut self.mode else {
                return;
            };
            m.server_live(id);
            self.dead.remove(&id);
            info!("scheduler: node {id} replaces a server: copies of its ranges start");
        }
    }

    /// On the scheduler: servers whose death the map took in but which the
    /// scheduler no longer holds dead (a pause longer than the heartbeat
    /// timeout, lost heartbeats; nothing took their id) rejoin as fresh
    /// replicas: they hold nothing the map trusts (what they held may be
    /// behind, or ahead by a push never acknowledged), so each range whose
    /// target includes one copies to it as to a replacement, and barriers
    /// wait for it again. Never left alive and unused.
    fn take_back(&mut self, now: Instant, cx: &mut Cx<'_>) {
        let Mode::Master(m) = &mut self.mode else {
            return;
        };
        if self.dead.is_empty() {
            return;
        }
        let dead: BTreeSet<NodeId> = cx.facts.dead_nodes(now).into_iter().collect();
        let back: Vec<NodeId> = self
            .dead
            .iter()
            .copied()
            .filter(|id| !dead.contains(id) && !cx.facts.has_left(*id))
            .filter(|&id| cx.facts.registered().iter().any(|n| n.id == id))
            .collect();
        if back.is_empty() {
            return;
        }
        let mut changed = false;
        for &id in &back {
            self.dead.remove(&id);
            if m.server_live(id) {
                changed = true;
            }
            warn!(
                "scheduler: server {id}, declared dead, is back: it rejoins as a fresh replica \
                 (its ranges copy to it; map {})",
                m.map().version
            );
        }
        if changed {
            self.broadcast_map(cx);
        }
        for id in back {
            cx.event(Event::FailedOver {
                server: id,
                failed_over: false,
            });
        }
    }

    /// On the scheduler, after a recovery: barriers wait for the servers
    /// again, and the map with them joining goes out.
    fn replaced(&mut self, ids: &[NodeId], cx: &mut Cx<'_>) {
        if !matches!(self.mode, Mode::Master(_)) {
            return;
        }
        let mut changed = false;
        for &id in ids {
            if ids::role_of_id(id) == Some(Role::Server) {
                changed = true;
                cx.event(Event::FailedOver {
                    server: id,
                    failed_over: false,
                });
            }
        }
        if changed {
            self.broadcast_map(cx);
        }
    }

    /// On the scheduler, when the cluster forms: the map, before the tables
    /// that carry it.
    fn forming(&mut self, servers: &[NodeId], cx: &mut Cx<'_>) {
        let Mode::Master(m) = &mut self.mode else {
            return;
        };
        if m.map().version != 0 {
            return;
        }
        m.formed(servers);
        info!(
            "scheduler: key ranges replicated {} times: {:?}",
            cx.facts.config().replicas,
            m.map()
                .ranges
                .iter()
                .map(|r| r.replicas.clone())
                .collect::<Vec<_>>()
        );
    }
}

/// Tells server `id` how its leave went (`node`: the MIN that refused it).
fn answer_leave(id: NodeId, op: ReplicaOp, node: NodeId, cx: &mut Cx<'_>) {
    let mut rep = ReplicaMsg::new(op, 0);
    rep.node = node;
    let mut msg = Message::control(Command::Replica, id);
    msg.meta.replica = Some(Box::new(rep));
    cx.send(msg);
}

impl Component for Replication {
    /// A worker's request (on a server), a server's answer (on a worker),
    /// or a REPLICA control message.
    fn handle(&mut self, msg: Message, _now: Instant, cx: &mut Cx<'_>) {
        if msg.is_control() {
            return self.control(msg, cx);
        }
        match &mut self.mode {
            Mode::Server(s) => s.handle(msg, cx.holds, cx.fx),
            Mode::Client(c) => {
                let range = msg.meta.replica.as_ref().map_or(0, |r| r.range);
                if let Some(msg) = c.on_response(msg) {
                    // Answered: copies still resent to earlier primaries
                    // (dead ones, or a process that replaced one) stop.
                    cx.event(Event::Answered {
                        app: msg.meta.app_id,
                        customer: msg.meta.customer_id,
                        timestamp: msg.meta.timestamp,
                        range,
                    });
                    cx.for_apps(Output::Deliver(msg));
                }
            }
            Mode::Off | Mode::Master(_) => {}
        }
    }

    /// On the scheduler: servers newly declared dead leave the map (their
    /// ranges fail over) and barriers stop waiting for them.
    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        self.take_back(now, cx);
        let Mode::Master(m) = &mut self.mode else {
            return;
        };
        let dead: BTreeSet<NodeId> = cx
            .facts
            .dead_nodes(now)
            .into_iter()
            .filter(|&id| ids::role_of_id(id) == Some(Role::Server))
            .collect();
        let newly: Vec<NodeId> = dead.difference(&self.dead).copied().collect();
        if newly.is_empty() {
            return;
        }
        let lost = |m: &RangeMaster| -> BTreeSet<u32> {
            (0..m.map().ranges.len() as u32)
                .filter(|&r| m.map().ranges[r as usize].replicas.is_empty())
                .collect()
        };
        let lost_before = lost(m);
        let mut changed = false;
        for &id in &newly {
            self.dead.insert(id);
            if m.server_dead(id) {
                warn!(
                    "scheduler: server {id} is dead: its ranges fail over (map {})",
                    m.map().version
                );
                changed = true;
            }
        }
        let newly_lost = lost(m).difference(&lost_before).next().copied();
        if changed {
            self.broadcast_map(cx);
        }
        for id in newly {
            cx.event(Event::FailedOver {
                server: id,
                failed_over: true,
            });
        }
        if let Some(range) = newly_lost {
            // Nothing can recover it: every node ends now, told why.
            cx.event(Event::StopJob(Failure::RangeLost { range }.to_string()));
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn on_event(&mut self, event: &Event, now: Instant, cx: &mut Cx<'_>) {
        match event {
            Event::Forming(servers) => self.forming(servers, cx),
            Event::Replacing(ids) => self.replacing(ids, cx),
            Event::Replaced(ids) => self.replaced(ids, cx),
            Event::Back(_) => self.take_back(now, cx),
            Event::TableTaken => {
                if let Some(map) = self.pending.take() {
                    self.on_range_map(map, cx);
                }
            }
            _ => {}
        }
    }

    /// An app's message on its way out: a worker's KV request is routed to
    /// its range's primary; a server's answer is paired with its request
    /// (and maybe held until the backups have it).
    fn outgoing(
        &mut self,
        msg: Message,
        _now: Instant,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Message>, Failure> {
        let out = match &mut self.mode {
            Mode::Client(c) if c.routes(&msg) && msg.meta.replica.is_none() => {
                let range = ids::id_to_rank(msg.meta.recver) as u32;
                match c.route(msg) {
                    Some(m) => Some(m),
                    None => return Err(Failure::RangeLost { range }),
                }
            }
            Mode::Server(s) if msg.meta.replica.is_none() => s.on_answer(msg, cx.fx),
            _ => Some(msg),
        };
        Ok(out)
    }

    /// On the scheduler: the map on a node table it sends. Not on the
    /// one-entry updates about a recovered server: when several recover at
    /// once, the map names them all, and a primary must not start a copy
    /// to one whose new address it has not got yet (the map follows the
    /// updates, see [`Replication::replaced`]).
    fn attach(&self, msg: &mut Message, _facts: &dyn Facts) {
        if msg.meta.control.cmd != Command::AddNode || msg.meta.control.node_count() < 2 {
            return;
        }
        if let Mode::Master(m) = &self.mode {
            if m.map().version > 0 {
                let mut rep = ReplicaMsg::new(ReplicaOp::Map, 0);
                rep.version = m.map().version;
                rep.map = Some(m.map().clone());
                msg.meta.replica = Some(Box::new(rep));
            }
        }
    }

    /// On a node: the map a node table from the scheduler carries, applied
    /// once membership took the table ([`Event::TableTaken`]).
    fn attached(&mut self, msg: &Message, _now: Instant, _cx: &mut Cx<'_>) {
        if msg.meta.control.cmd == Command::AddNode && msg.meta.sender == SCHEDULER {
            self.pending = msg.meta.replica.as_ref().and_then(|r| r.map.clone());
        }
    }
}
