//! Checkpoints as a component of the core: which state machine a node runs
//! (the scheduler's [`CheckpointMaster`], a server's [`CheckpointServer`]),
//! this node's own requests and their answers, and where checkpoints meet
//! the other components. Off unless the scheduler has
//! `PS_CHECKPOINT_DIR`; nodes learn it from the node table.
//!
//! Where it meets the others:
//! - the node-table attachments: the scheduler's tables carry the
//!   checkpoint to restore; a server joining with one restores it before
//!   its apps get anything (they are held meanwhile, see `crate::hold`); a
//!   worker's BARRIER request carries its requests in flight, which the
//!   scheduler reads for the cut;
//! - the outgoing pipeline: the releases of the barrier a checkpoint is
//!   taken at are held until every server wrote its file
//!   ([`Event::Releasing`] says which releases follow);
//! - facts: which servers hold which ranges (the scheduler's table, the
//!   dead, the range map) make the plan.

use std::collections::BTreeSet;
use std::time::Instant;

use bytes::Bytes;
use log::{debug, error};
use pslite_proto::checkpoint::{CheckpointMsg, CheckpointOp};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Role, K_EMPTY};

use super::disk::IoResult;
use super::master::{CheckpointMaster, MasterOut, Plan, Requester};
use super::plan;
use super::releasing::Releasing;
use super::requests::Requests;
use super::server::{CheckpointServer, ServerOut};
use super::{Catalog, DEFAULT_TIMEOUT};
use crate::component::{Component, Cx, Facts};
use crate::config::VanConfig;
use crate::effects::{Event, Output};
use crate::error::{Failure, VanError};
use crate::hold::Reason;
use crate::log_once::LogOnce;
use crate::reply::Replies;

/// How long a scheduler stopping the job (a server could not restore)
/// waits for its members to leave before it fails.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// This node's checkpoint state.
pub struct Checkpoints {
    /// On a scheduler with `PS_CHECKPOINT_DIR`.
    master: Option<CheckpointMaster>,
    /// On a server of a checkpointing cluster.
    server: Option<CheckpointServer>,
    /// The cluster checkpoints (its node table said so).
    on: bool,
    /// This node's requests and their answers.
    requests: Requests,
    /// The apps of a server (copied and restored); app 0 unless set.
    apps: BTreeSet<i32>,
    /// The job stops (why, and when this node fails at the latest): on the
    /// scheduler, a server could not restore; on that server, its restore
    /// failed and it waits for the scheduler's notice.
    stopping: Option<(String, Instant)>,
    /// On the scheduler: a barrier's releases coming through the pipeline.
    releasing: Option<Releasing>,
    /// Drops already warned about, by sender and cause.
    dropped: LogOnce<(NodeId, &'static str)>,
}

impl Checkpoints {
    /// The state for `cfg` (on the scheduler, before its directory was
    /// scanned; checkpoints off without a directory).
    pub fn for_config(cfg: &VanConfig) -> Checkpoints {
        let master = match (&cfg.checkpoint, cfg.role) {
            (Some(c), Role::Scheduler) => {
                Some(CheckpointMaster::new(c.clone(), Catalog::default()))
            }
            _ => None,
        };
        Checkpoints {
            on: master.is_some(),
            master,
            server: None,
            requests: Requests::new(),
            apps: BTreeSet::from([0]),
            stopping: None,
            releasing: None,
            dropped: LogOnce::new(log::Level::Warn),
        }
    }

    /// On the scheduler: what the scan of `PS_CHECKPOINT_DIR` found.
    pub fn set_catalog(&mut self, cfg: &VanConfig, catalog: Catalog) {
        if let (Some(c), Role::Scheduler) = (&cfg.checkpoint, cfg.role) {
            self.master = Some(CheckpointMaster::new(c.clone(), catalog));
        }
    }

    /// Whether this node's cluster takes checkpoints (known once joined).
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Asks the scheduler for a checkpoint (see `Call::Checkpoint`).
    pub fn request(&mut self, label: &str, cx: &mut Cx<'_>) -> Result<u64, VanError> {
        if let Some(f) = cx.facts.failure() {
            return Err(f.clone().into());
        }
        if !cx.facts.is_joined() {
            return Err(VanError::NotReady);
        }
        if !self.on {
            return Err(VanError::Failed(Failure::Checkpoint {
                detail: "this cluster takes no checkpoints: its scheduler has no \
                         PS_CHECKPOINT_DIR"
                    .into(),
            }));
        }
        let (ticket, msg) = self.requests.open(label);
        cx.send(msg);
        Ok(ticket)
    }

    /// The answers to request `ticket` so far (ACCEPTED, RESULT).
    pub fn answer(&self, ticket: u64) -> (Option<CheckpointMsg>, Option<CheckpointMsg>) {
        self.requests.answer(ticket)
    }

    /// Forgets request `ticket` (its waiter returned).
    pub fn end(&mut self, ticket: u64) {
        self.requests.end(ticket);
    }

    /// On a server: the apps whose state is checkpointed.
    pub fn set_apps(&mut self, apps: BTreeSet<i32>) {
        if let Some(s) = &mut self.server {
            s.set_apps(apps.clone());
        }
        self.apps = apps;
    }

    /// A file operation the driver carried out for token `token`.
    pub fn io_done(&mut self, token: u64, result: IoResult, now: Instant, cx: &mut Cx<'_>) {
        self.wall_clock(cx.facts, now);
        let (mut master, mut server) = (Vec::new(), Vec::new());
        if let Some(m) = &mut self.master {
            m.io_done(token, result, now, &mut master);
        } else if let Some(s) = &mut self.server {
            s.io_done(token, result, now, &mut server);
        }
        self.carry(master, server, now, cx);
    }

    /// App `app`'s answer to snapshot request `token`: its state, or why
    /// it cannot copy it.
    pub fn snapshot(
        &mut self,
        token: u64,
        app: i32,
        data: Result<Bytes, String>,
        now: Instant,
        cx: &mut Cx<'_>,
    ) {
        self.wall_clock(cx.facts, now);
        let mut out = Vec::new();
        if let Some(s) = &mut self.server {
            match data {
                Ok(data) => s.snapshot_taken(token, app, data, &mut out),
                Err(why) => s.snapshot_failed(token, app, &why, &mut out),
            }
        }
        self.carry(Vec::new(), out, now, cx);
    }

    /// App `app`'s answer to restore request `token`: restored, or why it
    /// refused.
    pub fn restored(
        &mut self,
        token: u64,
        app: i32,
        result: Result<(), String>,
        now: Instant,
        cx: &mut Cx<'_>,
    ) {
        let mut out = Vec::new();
        if let Some(s) = &mut self.server {
            match result {
                Ok(()) => s.restored(token, app, now, &mut out),
                Err(why) => s.restore_failed(token, app, &why, &mut out),
            }
        }
        self.carry(Vec::new(), out, now, cx);
    }

    /// The restore is abandoned (too much arrived meanwhile: the node
    /// fails).
    pub fn abandon_restore(&mut self) {
        self.server = None;
    }

    /// The wall clock, for what the state machines write from now on.
    fn wall_clock(&mut self, facts: &dyn Facts, now: Instant) {
        let unix_ms = facts.unix_ms(now);
        if let Some(m) = &mut self.master {
            m.set_wall_clock(unix_ms);
        }
        if let Some(s) = &mut self.server {
            s.set_wall_clock(unix_ms);
        }
    }

    fn drop_logged(&mut self, sender: NodeId, why: &'static str) {
        self.dropped.log((sender, why), || {
            format!("dropping CHECKPOINT from node {sender}: {why}")
        });
    }

    /// On the scheduler: tells every pslite member that the job stops
    /// because checkpoint `id` cannot be restored (`why`): a RESULT with no
    /// ticket. Sent before the scheduler fails, so a node that joined too
    /// recently to watch the scheduler's connection does not wait on.
    fn stop_job(&mut self, id: u64, why: &str, now: Instant, cx: &mut Cx<'_>) {
        let members: BTreeSet<NodeId> = cx
            .facts
            .registered()
            .iter()
            .filter(|n| n.pslite && n.id != SCHEDULER)
            .map(|n| n.id)
            .collect();
        if self.stopping.is_some() {
            return;
        }
        error!("{why}: the job stops");
        for to in members {
            let mut stop = CheckpointMsg::new(CheckpointOp::Result, id);
            stop.error = why.to_string();
            let mut msg = Message::control(Command::Checkpoint, to);
            msg.meta.checkpoint = Some(Box::new(stop));
            cx.send(msg);
        }
        self.stopping = Some((why.to_string(), now + STOP_GRACE));
    }

    /// This server's checkpoint state (made on first use).
    fn server(&mut self, facts: &dyn Facts) -> &mut CheckpointServer {
        let apps = &self.apps;
        self.server
            .get_or_insert_with(|| new_server(facts, facts.me().id, apps))
    }

    /// On a node, before membership takes in a node table from the
    /// scheduler: the cluster checkpoints if the table says so, and a
    /// server joining with it restores the checkpoint it names (its apps
    /// get nothing else until then).
    fn table(&mut self, msg: &Message, now: Instant, cx: &mut Cx<'_>) {
        let Some(info) = msg.meta.checkpoint.as_deref() else {
            return;
        };
        if info.op != CheckpointOp::Info || msg.meta.sender != SCHEDULER {
            return;
        }
        self.on = true;
        let first = !cx.facts.is_joined();
        if cx.facts.config().role != Role::Server || !first || info.id == 0 {
            return;
        }
        let Some(mine) = cx.facts.my_entry(&msg.meta.control.node) else {
            return;
        };
        let me = mine.id;
        let ranges: Vec<u32> = match msg.meta.replica.as_ref().and_then(|r| r.map.as_ref()) {
            Some(map) => plan::held_by(map, me),
            None => vec![ids::id_to_rank(me) as u32],
        };
        let mut s = new_server(cx.facts, me, &self.apps);
        let mut out = Vec::new();
        s.on_info(info, ranges, true, now, &mut out);
        if s.holds() {
            cx.holds.start_restore();
        }
        self.server = Some(s);
        self.carry(Vec::new(), out, now, cx);
    }

    /// On the scheduler, once every release of a barrier came through the
    /// pipeline: held if a pending checkpoint is taken at it, else sent.
    fn released(&mut self, releasing: Releasing, now: Instant, cx: &mut Cx<'_>) {
        let Releasing {
            group, releases, ..
        } = releasing;
        let Some(m) = &mut self.master else {
            return;
        };
        let plan = if m.is_pending() {
            plan::current(cx.facts, now)
        } else {
            Plan::default()
        };
        let pslite: BTreeSet<NodeId> = cx
            .facts
            .registered()
            .iter()
            .filter(|n| n.pslite)
            .map(|n| n.id)
            .collect();
        let mut out = Vec::new();
        let pslite = |id| pslite.contains(&id);
        let held = m.releases(group, &releases, || plan, pslite, now, &mut out);
        for msg in releases {
            if !held {
                cx.send(msg);
            } else if let Err(refused) = cx.holds.hold(Reason::Checkpoint, msg) {
                cx.send(refused.item);
            }
        }
        self.carry(out, Vec::new(), now, cx);
    }

    /// Sends a requester its answer.
    fn answer_requester(to: Requester, mut ck: CheckpointMsg, cx: &mut Cx<'_>) {
        match to {
            Requester::Member { id, ticket } => {
                ck.ticket = ticket;
                let mut msg = Message::control(Command::Checkpoint, id);
                msg.meta.checkpoint = Some(Box::new(ck));
                cx.send(msg);
            }
            Requester::Admin { route, ts } => {
                let mut msg = Message::control(Command::Checkpoint, K_EMPTY);
                msg.meta.timestamp = ts;
                msg.meta.sender = SCHEDULER;
                msg.meta.checkpoint = Some(Box::new(ck));
                // Small (no file list is long): outside the answers' budget.
                cx.out(Replies::unbudgeted(route, msg));
            }
            Requester::Interval => {}
        }
    }

    /// Carries out what the checkpoint state machines decided, in order.
    fn carry(
        &mut self,
        master: Vec<MasterOut>,
        server: Vec<ServerOut>,
        now: Instant,
        cx: &mut Cx<'_>,
    ) {
        for out in master {
            match out {
                MasterOut::Send(msg) => cx.send(*msg),
                MasterOut::Release => {
                    for msg in cx.holds.release(|r| r == Reason::Checkpoint) {
                        cx.send(msg);
                    }
                }
                MasterOut::Answer(to, ck) => Self::answer_requester(to, ck, cx),
                MasterOut::Io { token, io } => cx.out(Output::Checkpoint { token, io }),
            }
        }
        for out in server {
            match out {
                ServerOut::Send(msg) => cx.send(*msg),
                ServerOut::Apps(out) => cx.for_apps(*out),
                ServerOut::Io { token, io } => cx.out(Output::Checkpoint { token, io }),
                ServerOut::Failed(detail) => {
                    // Reported to the scheduler, which stops the job:
                    // this server fails on its notice (so the report is
                    // not lost with it), or after STOP_GRACE; it serves
                    // nothing meanwhile.
                    error!("{detail}");
                    cx.holds.drop_restore_held();
                    self.stopping = Some((detail, now + STOP_GRACE));
                }
                ServerOut::Restored => {
                    let held = cx.holds.restored();
                    debug!("delivering {} messages held while restoring", held.len());
                    for out in held {
                        cx.for_apps(out);
                    }
                }
            }
        }
    }
}

/// A server's checkpoint state for node `me` (this node), copying `apps`.
fn new_server(facts: &dyn Facts, me: NodeId, apps: &BTreeSet<i32>) -> CheckpointServer {
    let cfg = facts.config().checkpoint.as_ref();
    let own = cfg.map(|c| c.dir.clone());
    let timeout = cfg.map_or(DEFAULT_TIMEOUT, |c| c.timeout);
    let mut s = CheckpointServer::new(me, ids::id_to_rank(me), own, timeout);
    s.set_apps(apps.clone());
    s
}

impl Component for Checkpoints {
    /// A CHECKPOINT control message: a request (on the scheduler), a
    /// server's report, the scheduler's order to write, an answer to this
    /// node's request, or the scheduler's notice that the job stops.
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        self.wall_clock(cx.facts, now);
        let sender = msg.meta.sender;
        let Some(ck) = msg.meta.checkpoint.as_deref() else {
            self.drop_logged(sender, "it has no checkpoint part");
            return;
        };
        let is_scheduler = cx.facts.config().role == Role::Scheduler;
        let (mut master, mut server) = (Vec::new(), Vec::new());
        match ck.op {
            CheckpointOp::Request if msg.meta.request && is_scheduler => {
                let from = if sender == K_EMPTY {
                    // An admin client: answered on its connection.
                    match msg.meta.route.clone() {
                        Some(route) => Requester::Admin {
                            route,
                            ts: msg.meta.timestamp,
                        },
                        None => {
                            self.drop_logged(sender, "it came from an unknown peer");
                            return;
                        }
                    }
                } else if sender == SCHEDULER || cx.facts.node(sender).is_some() {
                    Requester::Member {
                        id: sender,
                        ticket: ck.ticket,
                    }
                } else {
                    self.drop_logged(sender, "its sender is not a member");
                    return;
                };
                let label = ck.label.clone();
                match &mut self.master {
                    Some(m) => {
                        let refused = plan::current(cx.facts, now).refused;
                        m.request(from, &label, refused, &mut master);
                    }
                    None => {
                        let mut no = CheckpointMsg::new(CheckpointOp::Accepted, 0);
                        no.error = "this cluster takes no checkpoints: its scheduler has no \
                                    PS_CHECKPOINT_DIR"
                            .to_string();
                        return Self::answer_requester(from, no, cx);
                    }
                }
            }
            CheckpointOp::Done if is_scheduler => {
                if ids::role_of_id(sender) != Some(Role::Server) {
                    self.drop_logged(sender, "only servers report checkpoints");
                    return;
                }
                let restore_failed = self
                    .master
                    .as_ref()
                    .is_some_and(|m| m.is_restore_failure(ck));
                if restore_failed {
                    let detail = format!("server {sender}: {}", ck.error);
                    self.stop_job(ck.id, &detail, now, cx);
                    return;
                }
                if let Some(m) = &mut self.master {
                    m.done(sender, ck, now, &mut master);
                }
            }
            CheckpointOp::Take if sender == SCHEDULER && cx.facts.config().role == Role::Server => {
                let s = self.server(cx.facts);
                s.set_wall_clock(cx.facts.unix_ms(now));
                s.on_take(ck, &mut server);
            }
            // The scheduler stops the job: a server could not restore.
            CheckpointOp::Result
                if sender == SCHEDULER
                    && !msg.meta.request
                    && ck.ticket == 0
                    && !ck.error.is_empty() =>
            {
                cx.fail(Failure::Checkpoint {
                    detail: ck.error.clone(),
                });
            }
            CheckpointOp::Accepted | CheckpointOp::Result
                if sender == SCHEDULER && !msg.meta.request =>
            {
                if self.requests.answered(ck) {
                    cx.changed();
                }
            }
            _ => self.drop_logged(sender, "not for this node"),
        }
        self.carry(master, server, now, cx);
    }

    /// Intervals, deadlines, servers that died during a checkpoint, and a
    /// job that stops.
    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        self.wall_clock(cx.facts, now);
        let is_scheduler = cx.facts.config().role == Role::Scheduler;
        if let Some((why, at)) = &self.stopping {
            let due = if is_scheduler {
                let dead: BTreeSet<NodeId> = cx.facts.dead_nodes(now).into_iter().collect();
                let left = cx
                    .facts
                    .registered()
                    .iter()
                    .filter(|n| n.id != SCHEDULER && !dead.contains(&n.id))
                    .count();
                left == 0 || *at <= now
            } else {
                *at <= now
            };
            if due {
                let detail = why.clone();
                self.stopping = None;
                cx.fail(Failure::Checkpoint { detail });
            }
        }
        let (mut master, mut server) = (Vec::new(), Vec::new());
        if let Some(m) = &mut self.master {
            let dead = cx.facts.dead_nodes(now);
            m.servers_dead(&dead, now, &mut master);
            m.tick(now, &mut master);
        }
        if let Some(s) = &mut self.server {
            s.tick(now, &mut server);
        }
        self.carry(master, server, now, cx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [
            self.master
                .as_ref()
                .and_then(CheckpointMaster::poll_timeout),
            self.server
                .as_ref()
                .and_then(CheckpointServer::poll_timeout),
            self.stopping.as_ref().map(|s| s.1),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The cluster formed (the tables that restore went out); a barrier's
    /// releases follow.
    fn on_event(&mut self, event: &Event, now: Instant, _cx: &mut Cx<'_>) {
        match event {
            Event::Formed(_) => {
                if let Some(m) = &mut self.master {
                    m.formed(now);
                }
            }
            Event::Releasing { group, to } if self.master.is_some() && !to.is_empty() => {
                self.releasing = Some(Releasing::new(*group, to));
            }
            _ => {}
        }
    }

    /// On the scheduler: a barrier's releases are gathered (see
    /// [`Checkpoints::released`]).
    fn outgoing(
        &mut self,
        msg: Message,
        now: Instant,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Message>, Failure> {
        let Some(r) = &mut self.releasing else {
            return Ok(Some(msg));
        };
        let Some(msg) = r.gather(msg) else {
            if r.is_complete() {
                if let Some(releasing) = self.releasing.take() {
                    self.released(releasing, now, cx);
                }
            }
            return Ok(None);
        };
        Ok(Some(msg))
    }

    /// The scheduler's node tables carry the checkpoint to restore; a
    /// worker's BARRIER request says how many of its requests are
    /// unanswered.
    fn attach(&self, msg: &mut Message, facts: &dyn Facts) {
        let role = facts.config().role;
        match msg.meta.control.cmd {
            Command::AddNode if role == Role::Scheduler => {
                if let Some(m) = &self.master {
                    let ranges =
                        crate::replica::key_ranges(facts.config().num_servers.max(1) as usize);
                    msg.meta.checkpoint = Some(Box::new(m.info(&ranges)));
                }
            }
            Command::Barrier if msg.meta.request && self.on && role == Role::Worker => {
                let mut arrival = CheckpointMsg::new(CheckpointOp::Arrival, 0);
                arrival.in_flight = facts.counters().requests_in_flight().max(0) as u64;
                msg.meta.checkpoint = Some(Box::new(arrival));
            }
            _ => {}
        }
    }

    /// On the scheduler, a worker's BARRIER request: its requests in
    /// flight, for the cut. On a server, the scheduler's node table: the
    /// checkpoint to restore.
    fn attached(&mut self, msg: &Message, now: Instant, cx: &mut Cx<'_>) {
        match msg.meta.control.cmd {
            Command::Barrier if msg.meta.request => {
                let Some(m) = &mut self.master else {
                    return;
                };
                if ids::role_of_id(msg.meta.sender) != Some(Role::Worker) {
                    return;
                }
                if let Some(ck) = msg
                    .meta
                    .checkpoint
                    .as_deref()
                    .filter(|c| c.op == CheckpointOp::Arrival)
                {
                    m.arrival(msg.meta.sender, ck.in_flight);
                }
            }
            Command::AddNode if cx.facts.config().role != Role::Scheduler => {
                self.table(msg, now, cx)
            }
            _ => {}
        }
    }
}
