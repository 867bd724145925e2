//! The core's side of checkpoints (see `crate::checkpoint`): which state
//! machine a node runs (the scheduler's [`CheckpointMaster`], a server's
//! [`CheckpointServer`]), this node's own requests and their answers, the
//! BARRIER arrivals and releases the cut is made of, and the apps' outputs
//! held while a server restores. Off unless the scheduler has
//! `PS_CHECKPOINT_DIR`; nodes learn it from the node table.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use bytes::Bytes;
use log::{debug, error, warn};
use pslite_proto::checkpoint::{CheckpointMsg, CheckpointOp};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Role, K_EMPTY};

use super::replication::Replication;
use super::{Core, Output};
use crate::checkpoint::disk::IoResult;
use crate::checkpoint::format::Shape;
use crate::checkpoint::master::{CheckpointMaster, MasterOut, Plan, Requester};
use crate::checkpoint::server::{CheckpointServer, ServerOut};
use crate::checkpoint::{self, Catalog};
use crate::error::{Failure, VanError};
use crate::scheduler::Action;

/// This node's checkpoint state.
#[derive(Default)]
pub(crate) struct Checkpoints {
    /// On a scheduler with `PS_CHECKPOINT_DIR`.
    master: Option<CheckpointMaster>,
    /// On a server of a checkpointing cluster.
    server: Option<CheckpointServer>,
    /// The cluster checkpoints (its node table said so).
    on: bool,
    /// This node's requests: ticket -> (ACCEPTED, RESULT) once here.
    answers: HashMap<u64, (Option<CheckpointMsg>, Option<CheckpointMsg>)>,
    next_ticket: u64,
    /// The apps' outputs held while restoring, and their bytes.
    held: Vec<Output>,
    held_bytes: usize,
    /// The apps of a server (copied and restored); app 0 unless set.
    apps: BTreeSet<i32>,
    /// The job stops (why, and when this node fails at the latest): on the
    /// scheduler, a server could not restore; on that server, its restore
    /// failed and it waits for the scheduler's notice.
    stopping: Option<(String, Instant)>,
}

/// How long a scheduler stopping the job (a server could not restore)
/// waits for its members to leave before it fails.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The answers kept for a node's own requests at most.
const MAX_ANSWERS: usize = 64;

impl Checkpoints {
    /// The scheduler's state for `cfg` (checkpoints off without a
    /// directory), before its directory was scanned.
    pub(crate) fn for_config(cfg: &crate::config::VanConfig) -> Checkpoints {
        let master = match (&cfg.checkpoint, cfg.role) {
            (Some(c), Role::Scheduler) => {
                Some(CheckpointMaster::new(c.clone(), Catalog::default()))
            }
            _ => None,
        };
        Checkpoints {
            on: master.is_some(),
            master,
            apps: BTreeSet::from([0]),
            next_ticket: 1,
            ..Checkpoints::default()
        }
    }
}

/// Whether `msg` is a barrier release (not a failure reply).
fn is_release(msg: &Message) -> bool {
    msg.meta.control.cmd == Command::Barrier
        && !msg.meta.request
        && msg.meta.control.failed_peer.is_none()
}

impl Core {
    /// On the scheduler: what the scan of `PS_CHECKPOINT_DIR` found
    /// (see [`checkpoint::catalog`]); call before the cluster forms.
    pub fn set_checkpoint_catalog(&mut self, catalog: Catalog) {
        if let (Some(cfg), Role::Scheduler) = (&self.cfg.checkpoint, self.cfg.role) {
            self.checkpoints.master = Some(CheckpointMaster::new(cfg.clone(), catalog));
        }
    }

    /// Whether this node's cluster takes checkpoints (known once joined).
    pub fn checkpointing(&self) -> bool {
        self.checkpoints.on
    }

    /// Asks the scheduler for a checkpoint at the workers' next barrier
    /// (labelled `label`); ask [`Core::checkpoint_answer`] with the ticket.
    pub fn checkpoint_request(&mut self, label: &str, now: Instant) -> Result<u64, VanError> {
        if let Some(f) = self.member.failure() {
            return Err(f.clone().into());
        }
        if !self.member.is_joined() {
            return Err(VanError::NotReady);
        }
        if !self.checkpoints.on {
            return Err(VanError::Failed(Failure::Checkpoint {
                detail: "this cluster takes no checkpoints: its scheduler has no \
                         PS_CHECKPOINT_DIR"
                    .into(),
            }));
        }
        let ticket = self.checkpoints.next_ticket;
        self.checkpoints.next_ticket += 1;
        if self.checkpoints.answers.len() >= MAX_ANSWERS {
            if let Some(&oldest) = self.checkpoints.answers.keys().min() {
                self.checkpoints.answers.remove(&oldest);
            }
        }
        self.checkpoints.answers.insert(ticket, (None, None));
        let mut req = CheckpointMsg::new(CheckpointOp::Request, 0);
        req.label = label.to_string();
        req.ticket = ticket;
        let mut msg = Message::control(Command::Checkpoint, SCHEDULER);
        msg.meta.request = true;
        msg.meta.checkpoint = Some(Box::new(req));
        self.emit(msg, now);
        Ok(ticket)
    }

    /// The answers to request `ticket` so far (ACCEPTED, RESULT); the node's
    /// failure if it failed.
    pub fn checkpoint_answer(
        &self,
        ticket: u64,
    ) -> Result<(Option<CheckpointMsg>, Option<CheckpointMsg>), Failure> {
        if let Some(f) = self.member.failure() {
            return Err(f.clone());
        }
        Ok(self
            .checkpoints
            .answers
            .get(&ticket)
            .cloned()
            .unwrap_or_default())
    }

    /// Forgets request `ticket` (its waiter returned).
    pub fn end_checkpoint(&mut self, ticket: u64) {
        self.checkpoints.answers.remove(&ticket);
    }

    /// On a server: the apps whose state is checkpointed.
    pub(super) fn set_checkpoint_apps(&mut self, apps: BTreeSet<i32>) {
        if let Some(s) = &mut self.checkpoints.server {
            s.set_apps(apps.clone());
        }
        self.checkpoints.apps = apps;
    }

    /// A file operation the driver carried out for token `token`.
    pub fn checkpoint_io_done(&mut self, token: u64, result: IoResult, now: Instant) {
        if let Some(m) = &mut self.checkpoints.master {
            m.io_done(token, result, now);
        } else if let Some(s) = &mut self.checkpoints.server {
            s.io_done(token, result, now);
        }
        self.flush_checkpoint(now);
    }

    /// App `app` could not answer snapshot request `token` (its handle
    /// cannot copy its state).
    pub fn snapshot_failed(&mut self, token: u64, app: i32, why: &str, now: Instant) {
        if !self.checkpoint_snapshot(token, app, Err(why.to_string()), now) {
            warn!("app {app} cannot copy its state to a joining server: {why}");
        }
    }

    /// App `app` refused restore request `token` (nothing of it changed).
    pub fn restore_failed(&mut self, token: u64, app: i32, why: &str, now: Instant) {
        if !self.checkpoint_restored(token, app, Err(why.to_string()), now) {
            warn!("app {app} refused a copy of its state: {why}");
        }
    }

    /// A checkpoint's snapshot answer from app `app`; true if `token` was a
    /// checkpoint's.
    pub(super) fn checkpoint_snapshot(
        &mut self,
        token: u64,
        app: i32,
        data: Result<Bytes, String>,
        now: Instant,
    ) -> bool {
        if !checkpoint::is_checkpoint_token(token) {
            return false;
        }
        if let Some(s) = &mut self.checkpoints.server {
            match data {
                Ok(data) => s.snapshot_taken(token, app, data),
                Err(why) => s.snapshot_failed(token, app, &why),
            }
        }
        self.flush_checkpoint(now);
        true
    }

    /// A checkpoint's restore answer from app `app`; true if `token` was a
    /// checkpoint's.
    pub(super) fn checkpoint_restored(
        &mut self,
        token: u64,
        app: i32,
        result: Result<(), String>,
        now: Instant,
    ) -> bool {
        if !checkpoint::is_checkpoint_token(token) {
            return false;
        }
        if let Some(s) = &mut self.checkpoints.server {
            match result {
                Ok(()) => s.restored(token, app, now),
                Err(why) => s.restore_failed(token, app, &why),
            }
        }
        self.flush_checkpoint(now);
        true
    }

    /// A CHECKPOINT control message.
    pub(super) fn checkpoint_control(&mut self, msg: Message, now: Instant) {
        let sender = msg.meta.sender;
        let Some(ck) = msg.meta.checkpoint.as_deref() else {
            self.drop_logged(sender, "CHECKPOINT", "it has no checkpoint part");
            return;
        };
        match ck.op {
            CheckpointOp::Request if msg.meta.request && self.scheduler.is_some() => {
                let from = if sender == K_EMPTY {
                    // An admin client: answered on its connection.
                    match msg.meta.route.clone() {
                        Some(route) => Requester::Admin {
                            route,
                            ts: msg.meta.timestamp,
                        },
                        None => {
                            self.drop_logged(sender, "CHECKPOINT", "it came from an unknown peer");
                            return;
                        }
                    }
                } else if sender == SCHEDULER || self.member.is_member(sender) {
                    Requester::Member {
                        id: sender,
                        ticket: ck.ticket,
                    }
                } else {
                    self.drop_logged(sender, "CHECKPOINT", "its sender is not a member");
                    return;
                };
                let refused = match &self.checkpoints.master {
                    None => Some(
                        "this cluster takes no checkpoints: its scheduler has no \
                         PS_CHECKPOINT_DIR"
                            .to_string(),
                    ),
                    Some(_) => self.checkpoint_refusal(now),
                };
                let label = ck.label.clone();
                match &mut self.checkpoints.master {
                    Some(m) => m.request(from, &label, refused),
                    None => {
                        let mut no = CheckpointMsg::new(CheckpointOp::Accepted, 0);
                        no.error = refused.unwrap_or_default();
                        self.answer_checkpoint(from, no, now);
                        return;
                    }
                }
            }
            CheckpointOp::Done if self.scheduler.is_some() => {
                if ids::role_of_id(sender) != Some(Role::Server) {
                    self.drop_logged(sender, "CHECKPOINT", "only servers report checkpoints");
                    return;
                }
                let done = ck.clone();
                let restore_failed = self
                    .checkpoints
                    .master
                    .as_ref()
                    .is_some_and(|m| m.is_restore_failure(&done));
                if restore_failed {
                    let detail = format!("server {sender}: {}", done.error);
                    self.stop_job(done.id, &detail, now);
                    return;
                }
                if let Some(m) = &mut self.checkpoints.master {
                    m.done(sender, &done, now);
                }
            }
            CheckpointOp::Take if sender == SCHEDULER && self.cfg.role == Role::Server => {
                let take = ck.clone();
                self.checkpoint_server().on_take(&take);
            }
            // The scheduler stops the job: a server could not restore.
            CheckpointOp::Result
                if sender == SCHEDULER
                    && !msg.meta.request
                    && ck.ticket == 0
                    && !ck.error.is_empty() =>
            {
                let detail = ck.error.clone();
                self.fail(Failure::Checkpoint { detail }, now);
            }
            CheckpointOp::Accepted | CheckpointOp::Result
                if sender == SCHEDULER && !msg.meta.request =>
            {
                if let Some(slot) = self.checkpoints.answers.get_mut(&ck.ticket) {
                    if ck.op == CheckpointOp::Accepted {
                        slot.0 = Some(ck.clone());
                    } else {
                        slot.1 = Some(ck.clone());
                    }
                    self.changed = true;
                }
            }
            _ => self.drop_logged(sender, "CHECKPOINT", "not for this node"),
        }
        self.flush_checkpoint(now);
    }

    /// On the scheduler: tells every pslite member that the job stops
    /// because checkpoint `id` cannot be restored (`why`): a RESULT with no
    /// ticket. Sent before the scheduler fails, so a node that joined too
    /// recently to watch the scheduler's connection does not wait on.
    fn stop_job(&mut self, id: u64, why: &str, now: Instant) {
        let members: Vec<NodeId> = self
            .scheduler
            .as_ref()
            .map(|s| {
                s.nodes()
                    .iter()
                    .filter(|n| n.pslite && n.id != SCHEDULER)
                    .map(|n| n.id)
                    .collect()
            })
            .unwrap_or_default();
        if self.checkpoints.stopping.is_some() {
            return;
        }
        error!("{why}: the job stops");
        for id_to in members.into_iter().collect::<BTreeSet<_>>() {
            let mut stop = CheckpointMsg::new(CheckpointOp::Result, id);
            stop.error = why.to_string();
            let mut msg = Message::control(Command::Checkpoint, id_to);
            msg.meta.checkpoint = Some(Box::new(stop));
            self.emit(msg, now);
        }
        self.checkpoints.stopping = Some((why.to_string(), now + STOP_GRACE));
    }

    /// This server's checkpoint state (made on first use).
    fn checkpoint_server(&mut self) -> &mut CheckpointServer {
        let me = self.member.me().id;
        let own = self.cfg.checkpoint.as_ref().map(|c| c.dir.clone());
        let timeout = self
            .cfg
            .checkpoint
            .as_ref()
            .map_or(checkpoint::DEFAULT_TIMEOUT, |c| c.timeout);
        let apps = self.checkpoints.apps.clone();
        self.checkpoints.server.get_or_insert_with(|| {
            let mut s = CheckpointServer::new(me, ids::id_to_rank(me), own, timeout);
            s.set_apps(apps);
            s
        })
    }

    /// On a non-scheduler node, before it takes in a node table from the
    /// scheduler: the cluster checkpoints if the table says so, and a
    /// server joining with it restores the checkpoint it names.
    pub(super) fn checkpoint_table(&mut self, msg: &Message, now: Instant) {
        let Some(info) = msg.meta.checkpoint.as_deref() else {
            return;
        };
        if info.op != CheckpointOp::Info || msg.meta.sender != SCHEDULER {
            return;
        }
        self.checkpoints.on = true;
        let first = !self.member.is_joined();
        if self.cfg.role != Role::Server || !first || info.id == 0 {
            return;
        }
        let Some(mine) = self.member.my_entry(&msg.meta.control.node) else {
            return;
        };
        let me = mine.id;
        let ranges: Vec<u32> = match msg.meta.replica.as_ref().and_then(|r| r.map.as_ref()) {
            Some(map) => (0..map.ranges.len() as u32)
                .filter(|&r| map.ranges[r as usize].replicas.contains(&me))
                .collect(),
            None => vec![ids::id_to_rank(me) as u32],
        };
        let info = info.clone();
        let own = self.cfg.checkpoint.as_ref().map(|c| c.dir.clone());
        let timeout = self
            .cfg
            .checkpoint
            .as_ref()
            .map_or(checkpoint::DEFAULT_TIMEOUT, |c| c.timeout);
        let mut s = CheckpointServer::new(me, ids::id_to_rank(me), own, timeout);
        s.set_apps(self.checkpoints.apps.clone());
        s.on_info(&info, ranges, true, now);
        self.checkpoints.server = Some(s);
        self.flush_checkpoint(now);
    }

    /// On the scheduler: why no checkpoint can be taken in this cluster now
    /// (a C++ server, a dead one, a lost range), if so.
    fn checkpoint_refusal(&self, now: Instant) -> Option<String> {
        self.checkpoint_plan(now).refused
    }

    /// On the scheduler: which server writes which ranges now.
    fn checkpoint_plan(&self, now: Instant) -> Plan {
        let Some(s) = &self.scheduler else {
            return Plan::default();
        };
        let mut servers: Vec<_> = s
            .nodes()
            .iter()
            .filter(|n| n.role == Role::Server)
            .cloned()
            .collect();
        servers.sort_by_key(|n| n.id);
        servers.dedup_by_key(|n| n.id);
        if let Some(cxx) = servers.iter().find(|n| !n.pslite) {
            return Plan {
                refused: Some(format!(
                    "server {} is C++ ps-lite, which cannot write checkpoints (only pslite \
                     servers can)",
                    cxx.id
                )),
                ..Plan::default()
            };
        }
        let dead: BTreeSet<NodeId> = s.dead_nodes(now).into_iter().collect();
        if let Replication::Master(m) = &self.replication {
            let map = m.map();
            let mut plan = Plan {
                shape: Shape {
                    ranges: map.ranges.iter().map(|r| (r.begin, r.end)).collect(),
                    replicas: map.replicas,
                    map_version: map.version,
                },
                ..Plan::default()
            };
            for (r, range) in map.ranges.iter().enumerate() {
                if range.replicas.is_empty() {
                    plan.refused = Some(format!(
                        "key range {r} has no replica left: its state is gone"
                    ));
                    return plan;
                }
            }
            for n in &servers {
                let held: Vec<u32> = (0..map.ranges.len() as u32)
                    .filter(|&r| map.ranges[r as usize].replicas.contains(&n.id))
                    .collect();
                if !held.is_empty() && !dead.contains(&n.id) {
                    plan.servers.push((n.id, ids::id_to_rank(n.id), held));
                }
            }
            return plan;
        }
        let ranges = crate::replica::key_ranges(self.cfg.num_servers.max(1) as usize);
        let mut plan = Plan {
            shape: Shape {
                ranges,
                replicas: 1,
                map_version: 0,
            },
            ..Plan::default()
        };
        for n in &servers {
            if dead.contains(&n.id) {
                plan.refused = Some(format!(
                    "server {} is dead and not replaced: its key range cannot be written",
                    n.id
                ));
                return plan;
            }
            let rank = ids::id_to_rank(n.id);
            plan.servers.push((n.id, rank, vec![rank as u32]));
        }
        plan
    }

    /// On the scheduler, when a BARRIER request arrives: a worker's
    /// requests in flight, for the cut.
    pub(super) fn checkpoint_arrival(&mut self, msg: &Message) {
        let Some(m) = &mut self.checkpoints.master else {
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

    /// On a worker of a checkpointing cluster: its BARRIER request says how
    /// many of its requests are unanswered.
    pub(super) fn checkpoint_barrier(&self, msg: &mut Message) {
        if !self.checkpoints.on || self.cfg.role != Role::Worker {
            return;
        }
        let mut arrival = CheckpointMsg::new(CheckpointOp::Arrival, 0);
        arrival.in_flight = self.counters.requests_in_flight().max(0) as u64;
        msg.meta.checkpoint = Some(Box::new(arrival));
    }

    /// On the scheduler, before carrying out `actions`: holds the releases
    /// of a barrier a pending checkpoint is taken at.
    pub(super) fn checkpoint_releases(
        &mut self,
        actions: Vec<Action>,
        now: Instant,
    ) -> Vec<Action> {
        let pending = self
            .checkpoints
            .master
            .as_ref()
            .is_some_and(|m| m.is_pending());
        let group_of = |a: &Action| match a {
            Action::Send(m) if is_release(m) => Some(m.meta.control.barrier_group),
            _ => None,
        };
        let mut groups: Vec<i32> = actions.iter().filter_map(group_of).collect();
        groups.sort_unstable();
        groups.dedup();
        if groups.is_empty() || self.checkpoints.master.is_none() {
            return actions;
        }
        let plan = if pending {
            self.checkpoint_plan(now)
        } else {
            Plan::default()
        };
        let pslite: BTreeSet<NodeId> = self
            .scheduler
            .as_ref()
            .map(|s| {
                s.nodes()
                    .iter()
                    .filter(|n| n.pslite)
                    .map(|n| n.id)
                    .collect()
            })
            .unwrap_or_default();
        let mut held = BTreeSet::new();
        for g in groups {
            let msgs: Vec<Message> = actions
                .iter()
                .filter(|a| group_of(a) == Some(g))
                .filter_map(|a| match a {
                    Action::Send(m) => Some(m.clone()),
                    _ => None,
                })
                .collect();
            let Some(m) = &mut self.checkpoints.master else {
                break;
            };
            if m.releases(g, msgs, || plan.clone(), |id| pslite.contains(&id), now) {
                held.insert(g);
            }
        }
        self.flush_checkpoint(now);
        if held.is_empty() {
            return actions;
        }
        actions
            .into_iter()
            .filter(|a| group_of(a).is_none_or(|g| !held.contains(&g)))
            .collect()
    }

    /// On the scheduler: the checkpoint part of a node table it sends.
    pub(super) fn checkpoint_attach(&self, msg: &mut Message) {
        if msg.meta.control.cmd != Command::AddNode {
            return;
        }
        if let Some(m) = &self.checkpoints.master {
            let ranges = crate::replica::key_ranges(self.cfg.num_servers.max(1) as usize);
            msg.meta.checkpoint = Some(Box::new(m.info(&ranges)));
        }
    }

    /// On the scheduler: the cluster formed (the tables that restore went
    /// out).
    pub(super) fn checkpoint_formed(&mut self, now: Instant) {
        if let Some(m) = &mut self.checkpoints.master {
            m.formed(now);
        }
    }

    /// Time-driven work: intervals, deadlines, servers that died during a
    /// checkpoint.
    pub(super) fn checkpoint_tick(&mut self, now: Instant) {
        if let (Some((why, at)), None) = (&self.checkpoints.stopping, &self.scheduler) {
            if *at <= now {
                let detail = why.clone();
                self.checkpoints.stopping = None;
                self.fail(Failure::Checkpoint { detail }, now);
            }
        }
        if let (Some((why, at)), Some(s)) = (&self.checkpoints.stopping, &self.scheduler) {
            let dead: BTreeSet<NodeId> = s.dead_nodes(now).into_iter().collect();
            let left = s
                .nodes()
                .iter()
                .filter(|n| n.id != SCHEDULER && !dead.contains(&n.id))
                .count();
            if left == 0 || *at <= now {
                let detail = why.clone();
                self.checkpoints.stopping = None;
                self.fail(Failure::Checkpoint { detail }, now);
            }
        }
        if let (Some(m), Some(s)) = (&mut self.checkpoints.master, &self.scheduler) {
            let dead = s.dead_nodes(now);
            m.servers_dead(&dead, now);
            m.tick(now);
        }
        if let Some(s) = &mut self.checkpoints.server {
            s.tick(now);
        }
        self.flush_checkpoint(now);
    }

    /// When [`Core::checkpoint_tick`] has work next.
    pub(super) fn checkpoint_poll(&self) -> Option<Instant> {
        [
            self.checkpoints
                .master
                .as_ref()
                .and_then(CheckpointMaster::poll_timeout),
            self.checkpoints
                .server
                .as_ref()
                .and_then(CheckpointServer::poll_timeout),
            self.checkpoints.stopping.as_ref().map(|s| s.1),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Sends a requester its answer.
    fn answer_checkpoint(&mut self, to: Requester, mut ck: CheckpointMsg, now: Instant) {
        match to {
            Requester::Member { id, ticket } => {
                ck.ticket = ticket;
                let mut msg = Message::control(Command::Checkpoint, id);
                msg.meta.checkpoint = Some(Box::new(ck));
                self.emit(msg, now);
            }
            Requester::Admin { route, ts } => {
                let mut msg = Message::control(Command::Checkpoint, K_EMPTY);
                msg.meta.timestamp = ts;
                msg.meta.sender = SCHEDULER;
                msg.meta.checkpoint = Some(Box::new(ck));
                // Small (no file list is long): outside the answers' budget.
                self.reply_unbudgeted(route, msg);
            }
            Requester::Interval => {}
        }
    }

    /// Carries out what the checkpoint state machines asked for.
    pub(super) fn flush_checkpoint(&mut self, now: Instant) {
        loop {
            let master = self
                .checkpoints
                .master
                .as_mut()
                .map(CheckpointMaster::take_output)
                .unwrap_or_default();
            let server = self
                .checkpoints
                .server
                .as_mut()
                .map(CheckpointServer::take_output)
                .unwrap_or_default();
            if master.is_empty() && server.is_empty() {
                return;
            }
            for out in master {
                match out {
                    MasterOut::Send(msg) => self.emit(msg, now),
                    MasterOut::Answer(to, ck) => self.answer_checkpoint(to, ck, now),
                    MasterOut::Io { token, io } => self.out.push(Output::Checkpoint { token, io }),
                }
            }
            for out in server {
                match out {
                    ServerOut::Send(msg) => self.emit(*msg, now),
                    ServerOut::Apps(out) => self.out.push(*out),
                    ServerOut::Io { token, io } => self.out.push(Output::Checkpoint { token, io }),
                    ServerOut::Failed(detail) => {
                        // Reported to the scheduler, which stops the job:
                        // this server fails on its notice (so the report is
                        // not lost with it), or after STOP_GRACE; it serves
                        // nothing meanwhile.
                        error!("{detail}");
                        self.checkpoints.held.clear();
                        self.checkpoints.held_bytes = 0;
                        self.checkpoints.stopping = Some((detail, now + STOP_GRACE));
                    }
                    ServerOut::Restored => {
                        let held = std::mem::take(&mut self.checkpoints.held);
                        self.checkpoints.held_bytes = 0;
                        debug!("delivering {} messages held while restoring", held.len());
                        self.out.extend(held);
                    }
                }
            }
        }
    }

    /// Holds, while this server restores, what is for its apps (requests,
    /// log entries, replication's copies), in order; the rest goes out.
    pub(super) fn checkpoint_filter(&mut self, outputs: Vec<Output>) -> Vec<Output> {
        if !self
            .checkpoints
            .server
            .as_ref()
            .is_some_and(CheckpointServer::holds)
        {
            return outputs;
        }
        let mut out = Vec::with_capacity(outputs.len());
        for o in outputs {
            let for_apps = match &o {
                Output::Deliver(m) => {
                    self.checkpoints.held_bytes += m.data_size() + m.meta.body.len();
                    true
                }
                Output::Snapshot { token, .. } | Output::Restore { token, .. } => {
                    !checkpoint::is_checkpoint_token(*token)
                }
                _ => false,
            };
            if for_apps {
                self.checkpoints.held.push(o);
            } else {
                out.push(o);
            }
        }
        if self.checkpoints.held_bytes > self.cfg.hold_limit {
            self.checkpoints.held.clear();
            self.checkpoints.held_bytes = 0;
            self.checkpoints.server = None;
            let failure = Failure::Checkpoint {
                detail: format!(
                    "more than PS_HOLD_LIMIT ({} bytes) of requests arrived while this server \
                     restored its checkpoint; raise PS_HOLD_LIMIT",
                    self.cfg.hold_limit
                ),
            };
            warn!("{failure}");
            if self.member.fail(failure.clone()).is_some() {
                self.changed = true;
                out.push(Output::Failed(failure));
            }
        }
        out
    }
}
