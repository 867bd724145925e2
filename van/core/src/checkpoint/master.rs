//! The scheduler's side of checkpoints: requests, the barrier a checkpoint
//! is taken at, the servers' reports, the manifest, old checkpoints.
//!
//! Rules (see `crate::checkpoint` for the protocol):
//! - A request (a member, an admin client, or the interval) makes a
//!   checkpoint *pending*, with the next id; requests while one is pending
//!   join it. Each requester is answered ACCEPTED at once, and RESULT when
//!   it is complete or failed.
//! - A pending checkpoint is taken at the first barrier release over a
//!   group with workers whose released workers all arrived with no request
//!   in flight (a C++ worker cannot say; it counts as none). The release is
//!   held; every server of the plan gets TAKE with its ranges.
//! - It is complete once every server reported DONE and the manifest is
//!   written: the requesters get RESULT, the barrier is released, and the
//!   checkpoints older than the newest `keep` complete ones are deleted.
//! - A server's error, its death, or `timeout` fail it: RESULT with the
//!   reason, the barrier released. Only one checkpoint runs at a time.
//! - A failed checkpoint leaves nothing, and its directory is deleted only
//!   once nothing writes into it any more: once every server told to write
//!   ended (reported DONE or an error, died, or did not report within
//!   another `timeout`) and the manifest's write, if one was under way,
//!   ended. A server that reports on it after that gets it deleted again.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use bytes::Bytes;
use log::{info, warn};
use pslite_proto::checkpoint::{CheckpointFile, CheckpointMsg, CheckpointOp};
use pslite_proto::ids::{self, NodeId};
use pslite_proto::{Command, Message, Role};

use super::disk::{self, Io, IoResult};
use super::format::{self, Manifest, Shape};
use super::{Catalog, CheckpointConfig};

/// Who asked for a checkpoint, and the timestamp its answers carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requester {
    /// A cluster member (the scheduler itself included).
    Member {
        /// Its id.
        id: NodeId,
        /// Its number for the request.
        ticket: u64,
    },
    /// An admin client (`pslite checkpoint`), answered on its connection.
    Admin {
        /// Its connection (the routing id of the scheduler's ROUTER).
        route: Bytes,
        /// Its request's timestamp.
        ts: i32,
    },
    /// `PS_CHECKPOINT_INTERVAL`: nobody to answer.
    Interval,
}

/// What the scheduler's side asks the core to do.
#[derive(Debug)]
pub enum MasterOut {
    /// Send this message (a TAKE).
    Send(Box<Message>),
    /// The running checkpoint ended (complete or failed): the releases of
    /// the barrier it was taken at, held for it (`crate::hold`'s
    /// [`Reason::Checkpoint`](crate::hold::Reason::Checkpoint)), go out.
    Release,
    /// Answer a requester.
    Answer(Requester, CheckpointMsg),
    /// Carry out a file operation; answer with
    /// [`CheckpointMaster::io_done`] and `token`.
    Io {
        /// Pairs the result with the request.
        token: u64,
        /// What to do.
        io: Io,
    },
}

/// Which server writes which ranges, and the cluster's shape: what the
/// core knows of the cluster when a checkpoint is taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// (server, its rank, the ranges it writes), servers with ranges only.
    pub servers: Vec<(NodeId, i32, Vec<u32>)>,
    /// The key ranges and how they were replicated.
    pub shape: Shape,
    /// Why no checkpoint can be taken now (a C++ server, a lost range).
    pub refused: Option<String>,
}

struct Pending {
    id: u64,
    label: String,
    requesters: Vec<Requester>,
    /// A barrier did not qualify (logged once).
    logged: bool,
}

struct Running {
    id: u64,
    label: String,
    requesters: Vec<Requester>,
    started: Instant,
    deadline: Instant,
    waiting: BTreeSet<NodeId>,
    files: Vec<CheckpointFile>,
    shape: Shape,
    /// The manifest is being written.
    writing: bool,
}

/// A failed checkpoint whose directory is deleted once every writer ended.
struct Failed {
    id: u64,
    /// Servers told to write it that have not reported (nor died) since.
    writers: BTreeSet<NodeId>,
    /// The manifest's write is under way.
    manifest: bool,
    /// After this, the writers left count as ended.
    deadline: Instant,
}

/// The failed checkpoints remembered once deleted (a late report deletes
/// what its server wrote after all).
const MAX_REMOVED: usize = 64;

/// The scheduler's checkpoint state.
pub struct CheckpointMaster {
    cfg: CheckpointConfig,
    /// The job its checkpoints belong to.
    job: String,
    next_id: u64,
    complete: Vec<u64>,
    restore: Option<Manifest>,
    /// The restore plan went out with the table that formed the cluster.
    formed: bool,
    pending: Option<Pending>,
    running: Option<Running>,
    /// Failed checkpoints still written into: deleted once every writer
    /// ended.
    failed: Vec<Failed>,
    /// Failed checkpoints already deleted, oldest first.
    removed: BTreeSet<u64>,
    next_interval: Option<Instant>,
    /// Each worker's requests in flight at its latest barrier arrival.
    arrivals: HashMap<NodeId, u64>,
    /// Wall-clock time in ms since the Unix epoch, as the core last said
    /// (for the manifest's metadata).
    unix_ms: u64,
}

impl CheckpointMaster {
    /// Checkpoints by `cfg`, after what the scan of its directory found.
    pub fn new(cfg: CheckpointConfig, catalog: Catalog) -> CheckpointMaster {
        CheckpointMaster {
            cfg,
            job: catalog.job,
            next_id: catalog.next_id.max(1),
            complete: catalog.complete,
            restore: catalog.restore,
            formed: false,
            pending: None,
            running: None,
            failed: Vec::new(),
            removed: BTreeSet::new(),
            next_interval: None,
            arrivals: HashMap::new(),
            unix_ms: 0,
        }
    }

    /// The job its checkpoints belong to.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Wall-clock time is `unix_ms` (ms since the Unix epoch): what the
    /// manifests written from now on say they were made at.
    pub fn set_wall_clock(&mut self, unix_ms: u64) {
        self.unix_ms = unix_ms;
    }

    /// The id of the checkpoint the job restored, if any.
    pub fn restored_id(&self) -> Option<u64> {
        self.restore.as_ref().map(|m| m.id)
    }

    /// The checkpoint part of the node tables the scheduler sends: the
    /// directory, and on the tables that form the cluster, the checkpoint
    /// to restore (a server that replaces one later restores nothing: its
    /// state comes from replicas, or is empty as in ps-lite).
    pub fn info(&self, ranges: &[(u64, u64)]) -> CheckpointMsg {
        let mut msg = CheckpointMsg::new(CheckpointOp::Info, 0);
        msg.dir = self.cfg.dir.display().to_string();
        msg.bounds = ranges.to_vec();
        msg.job = self.job.clone();
        if let (Some(m), false) = (&self.restore, self.formed) {
            msg.id = m.id;
            msg.label = m.label.clone();
            msg.files = m.files.clone();
        }
        msg
    }

    /// The cluster formed (its tables went out): later tables carry no
    /// restore plan, and the interval starts.
    pub fn formed(&mut self, now: Instant) {
        self.formed = true;
        self.next_interval = self.cfg.interval.map(|i| now + i);
    }

    /// A checkpoint requested by `from` (`refused`: why none can be taken
    /// in this cluster).
    pub fn request(
        &mut self,
        from: Requester,
        label: &str,
        refused: Option<String>,
        out: &mut Vec<MasterOut>,
    ) {
        let mut answer = CheckpointMsg::new(CheckpointOp::Accepted, 0);
        if let Some(why) = refused {
            answer.error = why;
            out.push(MasterOut::Answer(from, answer));
            return;
        }
        let id = self.pend(label);
        if let Some(p) = &mut self.pending {
            p.requesters.push(from.clone());
        }
        answer.id = id;
        answer.label = label.to_string();
        out.push(MasterOut::Answer(from, answer));
    }

    /// The pending checkpoint's id, made pending if none is.
    fn pend(&mut self, label: &str) -> u64 {
        if let Some(p) = &self.pending {
            return p.id;
        }
        let id = self.next_id;
        self.next_id += 1;
        info!("scheduler: checkpoint {id} requested; it is taken at the workers' next barrier");
        self.pending = Some(Pending {
            id,
            label: label.to_string(),
            requesters: Vec::new(),
            logged: false,
        });
        id
    }

    /// Worker `id` arrived at a barrier with `in_flight` requests
    /// unanswered.
    pub fn arrival(&mut self, id: NodeId, in_flight: u64) {
        self.arrivals.insert(id, in_flight);
    }

    /// Whether a checkpoint waits for a barrier.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some() && self.running.is_none()
    }

    /// The releases of the barrier over `group` (one message per member
    /// released): true if the caller holds them until [`MasterOut::Release`],
    /// and a checkpoint started (one is pending and the barrier qualifies);
    /// false if they go out now.
    /// `pslite(id)` tells pslite workers (which report their requests in
    /// flight) from C++ ones.
    pub fn releases(
        &mut self,
        group: i32,
        releases: &[Message],
        plan: impl FnOnce() -> Plan,
        pslite: impl Fn(NodeId) -> bool,
        now: Instant,
        out: &mut Vec<MasterOut>,
    ) -> bool {
        if group & ids::WORKER_GROUP == 0 {
            return false;
        }
        let workers: Vec<NodeId> = releases
            .iter()
            .map(|m| m.meta.recver)
            .filter(|&id| ids::role_of_id(id) == Some(Role::Worker))
            .collect();
        let busy: Vec<(NodeId, u64)> = workers
            .iter()
            .filter(|&&w| pslite(w))
            .map(|&w| (w, self.arrivals.get(&w).copied().unwrap_or(u64::MAX)))
            .filter(|&(_, n)| n > 0)
            .collect();
        for w in &workers {
            self.arrivals.remove(w);
        }
        if self.running.is_some() || workers.is_empty() {
            return false;
        }
        let Some(pending) = &mut self.pending else {
            return false;
        };
        if !busy.is_empty() {
            if !pending.logged {
                pending.logged = true;
                info!(
                    "scheduler: checkpoint {} waits for a barrier where no worker has requests \
                     in flight (at this one: {})",
                    pending.id,
                    busy.iter()
                        .map(|(w, n)| if *n == u64::MAX {
                            format!("worker {w} did not say")
                        } else {
                            format!("worker {w} has {n}")
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            return false;
        }
        let Some(pending) = self.pending.take() else {
            return false;
        };
        let plan = plan();
        if let Some(why) = plan.refused.clone().or_else(|| {
            plan.servers
                .is_empty()
                .then(|| "no server holds a key range".to_string())
        }) {
            warn!(
                "scheduler: checkpoint {} cannot be taken: {why}",
                pending.id
            );
            self.answer_all(
                &pending.requesters,
                pending.id,
                &pending.label,
                Err(&why),
                0,
                out,
            );
            return false;
        }
        let keep_from = self.keep_from(pending.id);
        info!(
            "scheduler: taking checkpoint {} at this barrier (servers {:?})",
            pending.id,
            plan.servers.iter().map(|s| s.0).collect::<Vec<_>>()
        );
        for (server, _, ranges) in &plan.servers {
            let mut take = CheckpointMsg::new(CheckpointOp::Take, pending.id);
            take.label = pending.label.clone();
            take.dir = self.cfg.dir.display().to_string();
            take.job = self.job.clone();
            take.keep_from = keep_from;
            take.bounds = plan.shape.ranges.clone();
            take.map_version = plan.shape.map_version;
            take.replicas = plan.shape.replicas;
            take.files = vec![CheckpointFile {
                node: *server,
                ranges: ranges.clone(),
                ..CheckpointFile::default()
            }];
            let mut msg = Message::control(Command::Checkpoint, *server);
            msg.meta.request = true;
            msg.meta.checkpoint = Some(Box::new(take));
            out.push(MasterOut::Send(Box::new(msg)));
        }
        self.running = Some(Running {
            id: pending.id,
            label: pending.label,
            requesters: pending.requesters,
            started: now,
            deadline: now + self.cfg.timeout,
            waiting: plan.servers.iter().map(|s| s.0).collect(),
            files: Vec::new(),
            shape: plan.shape,
            writing: false,
        });
        true
    }

    /// The oldest id kept once checkpoint `id` completes: the newest
    /// `keep` complete ones stay (0: nothing is deleted).
    fn keep_from(&self, id: u64) -> u64 {
        let mut complete = self.complete.clone();
        if complete.last() != Some(&id) {
            complete.push(id);
        }
        let keep = self.cfg.keep.max(1);
        complete.len().checked_sub(keep).map_or(0, |i| complete[i])
    }

    /// Whether server report `msg` says the server could not restore the
    /// checkpoint this job restores (the job cannot go on).
    pub fn is_restore_failure(&self, msg: &CheckpointMsg) -> bool {
        !msg.error.is_empty()
            && self.restored_id() == Some(msg.id)
            && self.running.as_ref().is_none_or(|r| r.id != msg.id)
    }

    /// Server `from`'s report on checkpoint `msg.id`.
    pub fn done(
        &mut self,
        from: NodeId,
        msg: &CheckpointMsg,
        now: Instant,
        out: &mut Vec<MasterOut>,
    ) {
        if self.running.as_ref().is_none_or(|r| r.id != msg.id) {
            self.ended(msg.id, Some(from), now, out);
            return;
        }
        let Some(run) = &mut self.running else {
            return;
        };
        if !run.waiting.remove(&from) {
            return;
        }
        if !msg.error.is_empty() {
            let why = format!("server {from}: {}", msg.error);
            self.fail(&why, now, out);
            return;
        }
        run.files.extend(msg.files.iter().cloned().map(|mut f| {
            f.node = from;
            f
        }));
        if !run.waiting.is_empty() {
            return;
        }
        let missing: Vec<u32> = (0..run.shape.ranges.len() as u32)
            .filter(|r| !run.files.iter().any(|f| f.ranges.contains(r)))
            .collect();
        if !missing.is_empty() {
            let why = format!("no server wrote key ranges {missing:?}");
            self.fail(&why, now, out);
            return;
        }
        run.files.sort_by_key(|f| f.node);
        let manifest = Manifest {
            job: self.job.clone(),
            id: run.id,
            created_ms: self.unix_ms,
            label: run.label.clone(),
            shape: run.shape.clone(),
            files: run.files.clone(),
        };
        run.writing = true;
        let path = disk::checkpoint_dir(&self.cfg.dir, run.id).join(disk::MANIFEST);
        out.push(MasterOut::Io {
            token: run.id,
            io: Io::Complete {
                manifest: path,
                bytes: Bytes::from(format::encode_manifest(&manifest)),
                latest: self.cfg.dir.join(disk::LATEST),
                text: disk::latest_text(&self.job, run.id),
            },
        });
    }

    /// The manifest write `token` ended.
    pub fn io_done(
        &mut self,
        token: u64,
        result: IoResult,
        now: Instant,
        out: &mut Vec<MasterOut>,
    ) {
        let ours = self
            .running
            .as_ref()
            .is_some_and(|r| r.id == token && r.writing);
        if !ours {
            // The manifest of a checkpoint that failed meanwhile (timeout).
            self.ended(token, None, now, out);
            return;
        }
        if let IoResult::Failed(why) = result {
            if let Some(run) = &mut self.running {
                run.writing = false;
            }
            self.fail(&why, now, out);
            return;
        }
        let Some(run) = self.running.take() else {
            return;
        };
        let elapsed = now.saturating_duration_since(run.started);
        let bytes: u64 = run.files.iter().map(|f| f.size).sum();
        info!(
            "scheduler: checkpoint {} complete: {} files, {bytes} bytes, in {} ms ({})",
            run.id,
            run.files.len(),
            elapsed.as_millis(),
            self.cfg.dir.display()
        );
        self.complete.push(run.id);
        let mut result = CheckpointMsg::new(CheckpointOp::Result, run.id);
        result.label = run.label.clone();
        result.files = run.files.clone();
        result.dir = disk::checkpoint_dir(&self.cfg.dir, run.id)
            .display()
            .to_string();
        result.elapsed_ms = elapsed.as_millis() as u64;
        for r in &run.requesters {
            out.push(MasterOut::Answer(r.clone(), result.clone()));
        }
        out.push(MasterOut::Release);
        let below = self.keep_from(run.id);
        if below > 0 {
            out.push(MasterOut::Io {
                token: 0,
                io: Io::Prune {
                    dir: self.cfg.dir.clone(),
                    below,
                    job: self.job.clone(),
                },
            });
        }
    }

    /// The running checkpoint failed: requesters told, barrier released.
    fn fail(&mut self, why: &str, now: Instant, out: &mut Vec<MasterOut>) {
        let Some(run) = self.running.take() else {
            return;
        };
        warn!(
            "scheduler: checkpoint {} failed after {} ms: {why}; the barrier goes on without it",
            run.id,
            now.saturating_duration_since(run.started).as_millis()
        );
        self.answer_all(&run.requesters, run.id, &run.label, Err(why), 0, out);
        out.push(MasterOut::Release);
        // A failed checkpoint leaves nothing: its directory is deleted once
        // nothing writes into it any more.
        self.failed.push(Failed {
            id: run.id,
            writers: run.waiting,
            manifest: run.writing,
            deadline: now + self.cfg.timeout,
        });
        self.cleanup(now, out);
    }

    /// A writer of failed checkpoint `id` ended: server `from` reported
    /// (`None`: the manifest's write ended).
    fn ended(&mut self, id: u64, from: Option<NodeId>, now: Instant, out: &mut Vec<MasterOut>) {
        if let Some(f) = self.failed.iter_mut().find(|f| f.id == id) {
            match from {
                Some(server) => {
                    f.writers.remove(&server);
                }
                None => f.manifest = false,
            }
            self.cleanup(now, out);
        } else if let Some(server) = from.filter(|_| self.removed.contains(&id)) {
            let dir = disk::checkpoint_dir(&self.cfg.dir, id);
            warn!(
                "scheduler: server {server} reported on failed checkpoint {id} after {} was \
                 deleted: deleting what it wrote",
                dir.display()
            );
            out.push(MasterOut::Io {
                token: 0,
                io: Io::Remove { dir },
            });
        }
    }

    /// Deletes the directories of the failed checkpoints nothing writes
    /// into any more (every writer ended, or the deadline passed).
    fn cleanup(&mut self, now: Instant, out: &mut Vec<MasterOut>) {
        let (done, left): (Vec<Failed>, Vec<Failed>) = std::mem::take(&mut self.failed)
            .into_iter()
            .partition(|f| (f.writers.is_empty() && !f.manifest) || f.deadline <= now);
        self.failed = left;
        for f in done {
            let dir = disk::checkpoint_dir(&self.cfg.dir, f.id);
            if !f.writers.is_empty() || f.manifest {
                warn!(
                    "scheduler: failed checkpoint {}: {} did not end within \
                     PS_CHECKPOINT_TIMEOUT; deleting {} anyway (what they write later is deleted \
                     when they report)",
                    f.id,
                    if f.writers.is_empty() {
                        "the manifest's write".to_string()
                    } else {
                        format!("servers {:?}", f.writers)
                    },
                    dir.display()
                );
            }
            out.push(MasterOut::Io {
                token: 0,
                io: Io::Remove { dir },
            });
            self.removed.insert(f.id);
            while self.removed.len() > MAX_REMOVED {
                self.removed.pop_first();
            }
        }
    }

    fn answer_all(
        &mut self,
        requesters: &[Requester],
        id: u64,
        label: &str,
        result: Result<(), &str>,
        elapsed_ms: u64,
        out: &mut Vec<MasterOut>,
    ) {
        let mut msg = CheckpointMsg::new(CheckpointOp::Result, id);
        msg.label = label.to_string();
        msg.elapsed_ms = elapsed_ms;
        if let Err(why) = result {
            msg.error = why.to_string();
        }
        for r in requesters {
            out.push(MasterOut::Answer(r.clone(), msg.clone()));
        }
    }

    /// Servers declared dead: the running checkpoint fails if it waits
    /// for one.
    /// A dead server is no writer of a failed checkpoint any more.
    pub fn servers_dead(&mut self, dead: &[NodeId], now: Instant, out: &mut Vec<MasterOut>) {
        let gone = self
            .failed
            .iter()
            .any(|f| dead.iter().any(|d| f.writers.contains(d)));
        if gone {
            for f in &mut self.failed {
                f.writers.retain(|w| !dead.contains(w));
            }
            self.cleanup(now, out);
        }
        let Some(run) = &mut self.running else {
            return;
        };
        if let Some(&d) = dead.iter().find(|d| run.waiting.contains(d)) {
            run.waiting.remove(&d);
            let why = format!("server {d} died before writing its file");
            self.fail(&why, now, out);
        }
    }

    /// Time-driven work: the interval, the running checkpoint's deadline.
    pub fn tick(&mut self, now: Instant, out: &mut Vec<MasterOut>) {
        if self.next_interval.is_some_and(|at| at <= now) {
            self.next_interval = self.cfg.interval.map(|i| now + i);
            if self.pending.is_none() {
                self.pend("PS_CHECKPOINT_INTERVAL");
                if let Some(p) = &mut self.pending {
                    p.requesters.push(Requester::Interval);
                }
            }
        }
        let late = self
            .running
            .as_ref()
            .filter(|r| r.deadline <= now)
            .map(|r| r.waiting.iter().copied().collect::<Vec<_>>());
        if let Some(waiting) = late {
            let why = if waiting.is_empty() {
                "the manifest was not written within PS_CHECKPOINT_TIMEOUT".to_string()
            } else {
                format!(
                    "servers {waiting:?} did not write their files within PS_CHECKPOINT_TIMEOUT"
                )
            };
            self.fail(&why, now, out);
        }
        if self.failed.iter().any(|f| f.deadline <= now) {
            self.cleanup(now, out);
        }
    }

    /// When [`CheckpointMaster::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.next_interval,
            self.running.as_ref().map(|r| r.deadline),
            self.failed.iter().map(|f| f.deadline).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The directory checkpoints go to.
    pub fn dir(&self) -> &PathBuf {
        &self.cfg.dir
    }
}
