//! A server's side of checkpoints: writing its ranges when the scheduler
//! says, restoring them before serving.
//!
//! Rules (see `crate::checkpoint` for the protocol):
//! - **TAKE.** Ask each app for a copy of each range named (in the apps'
//!   request order), build one file ([`super::format`]), write it
//!   atomically, report DONE with its size and CRC-32 (or the error), then
//!   delete this server's checkpoints below `keep_from`.
//! - **Restore.** With the node table that forms the cluster comes the
//!   checkpoint to restore: read the files of the ranges this server holds
//!   (its own file first), check each whole (size and CRC-32 against the
//!   manifest, the format, the id, the cluster's key ranges), and only if
//!   all pass hand the sections to the apps. Until every app restored, the
//!   core holds everything for the apps (requests, log entries); a bad
//!   file or an app that refuses fails the node, naming the file and the
//!   reason; an app that does not answer within the timeout too.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use log::{info, warn};
use pslite_proto::checkpoint::{CheckpointFile, CheckpointMsg, CheckpointOp};
use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::{Command, Message};

use super::disk::{self, Io, IoResult};
use super::format::{self, Section, ServerFile, Shape};
use super::TOKEN_BIT;
use crate::effects::Output;

/// What the server side asks the core to do.
#[derive(Debug)]
pub enum ServerOut {
    /// Send this message (a DONE to the scheduler).
    Send(Box<Message>),
    /// Ask the apps for a copy of a range ([`Output::Snapshot`], answered
    /// with [`CheckpointServer::snapshot_taken`]) or hand them a range's
    /// state ([`Output::Restore`], answered with
    /// [`CheckpointServer::restored`]): the requests replication's copies
    /// make too.
    Apps(Box<Output>),
    /// Carry out a file operation; answer with [`CheckpointServer::io_done`].
    Io {
        /// Pairs the result with the request.
        token: u64,
        /// What to do.
        io: Io,
    },
    /// The node cannot serve: restoring failed.
    Failed(String),
    /// Restoring ended: what was held for the apps goes to them now.
    Restored,
}

struct Take {
    id: u64,
    job: String,
    name: String,
    label: String,
    path: PathBuf,
    own_dir: PathBuf,
    keep_from: u64,
    shape: Shape,
    /// token -> range, for the snapshots still expected.
    tokens: BTreeMap<u64, u32>,
    parts: BTreeMap<(u32, i32), Bytes>,
    ranges: Vec<u32>,
    /// The file being written: its size and content CRC-32.
    written: Option<(u64, u32)>,
}

struct Restoring {
    id: u64,
    job: String,
    /// The manifest's files, by name.
    files: Vec<CheckpointFile>,
    bounds: Vec<(u64, u64)>,
    ranges: Vec<u32>,
    /// (token, app) still to restore.
    left: HashSet<(u64, i32)>,
    deadline: Instant,
    started: Instant,
    /// The read was asked for and not answered yet.
    reading: bool,
}

/// A server's checkpoint state.
pub struct CheckpointServer {
    me: NodeId,
    rank: i32,
    /// This server's own `PS_CHECKPOINT_DIR` (else the scheduler's).
    own_dir: Option<PathBuf>,
    timeout: Duration,
    apps: BTreeSet<i32>,
    next_token: u64,
    take: Option<Take>,
    /// Checkpoints abandoned for a newer one while their file was being
    /// written: reported once the write ended (the scheduler deletes a
    /// failed checkpoint's directory only once its writers ended).
    abandoned: BTreeSet<u64>,
    restoring: Option<Restoring>,
    /// The restore failed: requests stay held until the node fails.
    refused: bool,
    /// Wall-clock time in ms since the Unix epoch, as the core last said
    /// (for the files' metadata).
    unix_ms: u64,
}

/// The token of the read of a restore (the write of a take uses the
/// checkpoint id, with the bit clear).
const READ_TOKEN: u64 = u64::MAX;

impl CheckpointServer {
    /// Server `me` (rank `rank`), writing to `own_dir` if it has one, with
    /// restores bounded by `timeout`.
    pub fn new(me: NodeId, rank: i32, own_dir: Option<PathBuf>, timeout: Duration) -> Self {
        CheckpointServer {
            me,
            rank,
            own_dir,
            timeout,
            apps: BTreeSet::from([0]),
            next_token: TOKEN_BIT,
            take: None,
            abandoned: BTreeSet::new(),
            restoring: None,
            refused: false,
            unix_ms: 0,
        }
    }

    /// The apps whose state is checkpointed (app 0 unless set).
    pub fn set_apps(&mut self, apps: BTreeSet<i32>) {
        if !apps.is_empty() {
            self.apps = apps;
        }
    }

    /// Wall-clock time is `unix_ms` (ms since the Unix epoch): what the
    /// files written from now on say they were made at.
    pub fn set_wall_clock(&mut self, unix_ms: u64) {
        self.unix_ms = unix_ms;
    }

    /// Whether the apps' outputs are held (restoring).
    pub fn holds(&self) -> bool {
        self.restoring.is_some() || self.refused
    }

    fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token = TOKEN_BIT | (self.next_token + 1);
        t
    }

    fn dir(&self, scheduler_dir: &str) -> PathBuf {
        self.own_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(scheduler_dir))
    }

    fn report(
        &mut self,
        id: u64,
        file: Option<CheckpointFile>,
        error: String,
        out: &mut Vec<ServerOut>,
    ) {
        let mut done = CheckpointMsg::new(CheckpointOp::Done, id);
        done.files = file.into_iter().collect();
        done.error = error;
        let mut msg = Message::control(Command::Checkpoint, SCHEDULER);
        msg.meta.checkpoint = Some(Box::new(done));
        out.push(ServerOut::Send(Box::new(msg)));
    }

    /// The scheduler's order to write checkpoint `msg.id`.
    pub fn on_take(&mut self, msg: &CheckpointMsg, out: &mut Vec<ServerOut>) {
        if let Some(old) = self.take.take().filter(|old| old.id != msg.id) {
            warn!("checkpoint {} abandoned for checkpoint {}", old.id, msg.id);
            if old.written.is_some() {
                self.abandoned.insert(old.id);
            } else {
                let why = format!("abandoned for checkpoint {}", msg.id);
                self.report(old.id, None, why, out);
            }
        }
        let ranges = msg
            .files
            .first()
            .map(|f| f.ranges.clone())
            .unwrap_or_default();
        if msg.dir.is_empty() && self.own_dir.is_none() {
            self.report(
                msg.id,
                None,
                "this server has no PS_CHECKPOINT_DIR".into(),
                out,
            );
            return;
        }
        if let Some(&r) = ranges.iter().find(|&&r| r as usize >= msg.bounds.len()) {
            self.report(
                msg.id,
                None,
                format!("key range {r} is not in the order"),
                out,
            );
            return;
        }
        let own_dir = self.dir(&msg.dir);
        let name = disk::server_file_name(msg.id, self.rank, &ranges, &msg.job);
        let path = disk::checkpoint_dir(&own_dir, msg.id).join(&name);
        let mut take = Take {
            id: msg.id,
            job: msg.job.clone(),
            name,
            label: msg.label.clone(),
            path,
            own_dir,
            keep_from: msg.keep_from,
            shape: Shape {
                ranges: msg.bounds.clone(),
                replicas: msg.replicas,
                map_version: msg.map_version,
            },
            tokens: BTreeMap::new(),
            parts: BTreeMap::new(),
            ranges: ranges.clone(),
            written: None,
        };
        let apps: Vec<i32> = self.apps.iter().copied().collect();
        let mut asks = Vec::new();
        for r in ranges {
            let token = self.token();
            take.tokens.insert(token, r);
            let (begin, end) = msg.bounds[r as usize];
            asks.push(ServerOut::Apps(Box::new(Output::Snapshot {
                token,
                range: r,
                begin,
                end,
                apps: apps.clone(),
            })));
        }
        self.take = Some(take);
        out.extend(asks);
        self.maybe_write(out);
    }

    /// App `app`'s copy for snapshot `token`.
    pub fn snapshot_taken(&mut self, token: u64, app: i32, data: Bytes, out: &mut Vec<ServerOut>) {
        let Some(take) = &mut self.take else {
            return;
        };
        let Some(&r) = take.tokens.get(&token) else {
            return;
        };
        take.parts.insert((r, app), data);
        if self.apps.iter().all(|a| take.parts.contains_key(&(r, *a))) {
            take.tokens.remove(&token);
        }
        self.maybe_write(out);
    }

    /// App `app` cannot copy its state (no snapshot support).
    pub fn snapshot_failed(&mut self, token: u64, app: i32, why: &str, out: &mut Vec<ServerOut>) {
        let Some(take) = &self.take else {
            return;
        };
        if !take.tokens.contains_key(&token) {
            return;
        }
        let id = take.id;
        self.take = None;
        self.report(
            id,
            None,
            format!("app {app} cannot copy its state: {why}"),
            out,
        );
    }

    fn maybe_write(&mut self, out: &mut Vec<ServerOut>) {
        let Some(take) = &mut self.take else {
            return;
        };
        if !take.tokens.is_empty() || take.written.is_some() {
            return;
        }
        let sections = std::mem::take(&mut take.parts)
            .into_iter()
            .map(|((range, app), data)| Section { range, app, data })
            .collect();
        let file = ServerFile {
            job: take.job.clone(),
            ranges: take.ranges.clone(),
            id: take.id,
            created_ms: self.unix_ms,
            writer: self.me,
            label: take.label.clone(),
            shape: take.shape.clone(),
            sections,
        };
        let bytes = Bytes::from(format::encode_server(&file));
        take.written = Some((bytes.len() as u64, format::content_crc(&bytes).unwrap_or(0)));
        out.push(ServerOut::Io {
            token: take.id,
            io: Io::Write {
                path: take.path.clone(),
                bytes,
            },
        });
    }

    /// A file operation ended.
    pub fn io_done(
        &mut self,
        token: u64,
        result: IoResult,
        now: Instant,
        out: &mut Vec<ServerOut>,
    ) {
        if token == READ_TOKEN {
            self.read_done(result, now, out);
            return;
        }
        if self.abandoned.remove(&token) {
            let why = match result {
                IoResult::Failed(why) => why,
                _ => "abandoned for a newer checkpoint".to_string(),
            };
            self.report(token, None, why, out);
            return;
        }
        let Some(take) = self.take.take_if(|t| t.id == token && t.written.is_some()) else {
            return;
        };
        let Some((size, crc)) = take.written else {
            return;
        };
        if let IoResult::Failed(why) = result {
            self.report(take.id, None, why, out);
            return;
        }
        info!(
            "checkpoint {}: wrote key ranges {:?} ({size} bytes) to {}",
            take.id,
            take.ranges,
            take.path.display()
        );
        let file = CheckpointFile {
            name: take.name.clone(),
            node: self.me,
            size,
            crc,
            ranges: take.ranges.clone(),
        };
        self.report(take.id, Some(file), String::new(), out);
        if take.keep_from > 0 {
            out.push(ServerOut::Io {
                token: 0,
                io: Io::Prune {
                    dir: take.own_dir,
                    below: take.keep_from,
                    job: take.job,
                },
            });
        }
    }

    /// The node table's checkpoint part, on the table that made this node
    /// join (`first`), with the ranges this server holds: restores them if
    /// it names a checkpoint.
    pub fn on_info(
        &mut self,
        msg: &CheckpointMsg,
        ranges: Vec<u32>,
        first: bool,
        now: Instant,
        out: &mut Vec<ServerOut>,
    ) {
        if !first || msg.id == 0 || ranges.is_empty() {
            return;
        }
        let dir = disk::checkpoint_dir(&self.dir(&msg.dir), msg.id);
        let mut wanted: Vec<Vec<PathBuf>> = Vec::new();
        for &r in &ranges {
            let mut files: Vec<&CheckpointFile> =
                msg.files.iter().filter(|f| f.ranges.contains(&r)).collect();
            // Its own file first (also where the directory is not shared).
            files.sort_by_key(|f| f.node != self.me);
            let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(&f.name)).collect();
            if !wanted.contains(&paths) {
                wanted.push(paths);
            }
        }
        info!(
            "restoring key ranges {ranges:?} from checkpoint {}{} in {}",
            msg.id,
            if msg.label.is_empty() {
                String::new()
            } else {
                format!(" ({})", msg.label)
            },
            dir.display()
        );
        self.restoring = Some(Restoring {
            id: msg.id,
            job: msg.job.clone(),
            files: msg.files.clone(),
            bounds: msg.bounds.clone(),
            ranges,
            left: HashSet::new(),
            deadline: now + self.timeout,
            started: now,
            reading: true,
        });
        out.push(ServerOut::Io {
            token: READ_TOKEN,
            io: Io::Read { paths: wanted },
        });
    }

    fn fail_restore(&mut self, why: String, out: &mut Vec<ServerOut>) {
        let id = self.restoring.as_ref().map_or(0, |r| r.id);
        self.restoring = None;
        self.refused = true;
        let why = format!("cannot restore checkpoint {id}: {why}; nothing of it was served");
        // The scheduler stops the job with it: a job must not run on a
        // checkpoint only some servers restored.
        self.report(id, None, why.clone(), out);
        out.push(ServerOut::Failed(why));
    }

    /// Checks one file read for the restore: against the manifest, then
    /// whole; its sections by (range, app).
    fn check(
        restoring: &Restoring,
        path: &std::path::Path,
        bytes: &Bytes,
    ) -> Result<ServerFile, String> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let what = |why: String| format!("checkpoint file {} {why}", path.display());
        let Some(listed) = restoring.files.iter().find(|f| f.name == name) else {
            return Err(what("is not in the manifest".into()));
        };
        let size = bytes.len() as u64;
        if size != listed.size {
            return Err(what(format!(
                "has {size} bytes, the manifest says {} (truncated, or another checkpoint's)",
                listed.size
            )));
        }
        let crc = format::content_crc(bytes).unwrap_or(0);
        if crc != listed.crc {
            return Err(what(format!(
                "is not the file the manifest lists: its content's CRC-32 is {crc:#010x}, the \
                 manifest says {:#010x} (corrupt, or another job's or checkpoint's file)",
                listed.crc
            )));
        }
        let file = format::decode_server(bytes).map_err(|e| what(e.to_string()))?;
        if file.job != restoring.job {
            return Err(what(format!(
                "belongs to job {}, not to job {} (a file of another job)",
                file.job, restoring.job
            )));
        }
        if file.id != restoring.id {
            return Err(what(format!(
                "is of checkpoint {}, not {}",
                file.id, restoring.id
            )));
        }
        if file.writer != listed.node || file.ranges != listed.ranges {
            return Err(what(format!(
                "was written by node {} with key ranges {:?}; the manifest lists node {} with \
                 {:?} (another server's file)",
                file.writer, file.ranges, listed.node, listed.ranges
            )));
        }
        if let Some(why) = file.shape.mismatch(&restoring.bounds) {
            return Err(what(format!("does not fit this job: {why}")));
        }
        Ok(file)
    }

    fn read_done(&mut self, result: IoResult, now: Instant, out: &mut Vec<ServerOut>) {
        let Some(restoring) = &mut self.restoring else {
            return;
        };
        if !restoring.reading {
            return;
        }
        restoring.reading = false;
        let files = match result {
            IoResult::Read(files) => files,
            IoResult::Failed(why) => return self.fail_restore(why, out),
            IoResult::Done => return self.fail_restore("the read returned nothing".into(), out),
        };
        let mut sections: BTreeMap<(u32, i32), Bytes> = BTreeMap::new();
        for (path, bytes) in &files {
            match Self::check(restoring, path, bytes) {
                Ok(file) => {
                    for s in file.sections {
                        sections.entry((s.range, s.app)).or_insert(s.data);
                    }
                }
                Err(why) => return self.fail_restore(why, out),
            }
        }
        let apps: Vec<i32> = self.apps.iter().copied().collect();
        let mut asks = Vec::new();
        let ranges = restoring.ranges.clone();
        for r in ranges {
            let mut data = Vec::new();
            for &app in &apps {
                match sections.get(&(r, app)) {
                    Some(d) => data.push(d.clone()),
                    None => {
                        return self.fail_restore(
                            format!("its files hold no state of app {app} for key range {r}"),
                            out,
                        )
                    }
                }
            }
            let Some(&(begin, end)) = self
                .restoring
                .as_ref()
                .and_then(|s| s.bounds.get(r as usize))
            else {
                return self.fail_restore(format!("key range {r} is not in the plan"), out);
            };
            let token = self.token();
            if let Some(s) = &mut self.restoring {
                s.left.extend(apps.iter().map(|&a| (token, a)));
            }
            asks.push(ServerOut::Apps(Box::new(Output::Restore {
                token,
                range: r,
                begin,
                end,
                apps: apps.clone(),
                data,
            })));
        }
        out.extend(asks);
        self.maybe_restored(now, out);
    }

    /// App `app` restored its part of `token`.
    pub fn restored(&mut self, token: u64, app: i32, now: Instant, out: &mut Vec<ServerOut>) {
        if let Some(r) = &mut self.restoring {
            r.left.remove(&(token, app));
        }
        self.maybe_restored(now, out);
    }

    /// App `app` refused its part of `token`.
    pub fn restore_failed(&mut self, token: u64, app: i32, why: &str, out: &mut Vec<ServerOut>) {
        if self
            .restoring
            .as_ref()
            .is_some_and(|r| r.left.contains(&(token, app)))
        {
            self.fail_restore(format!("app {app} refused its state: {why}"), out);
        }
    }

    fn maybe_restored(&mut self, now: Instant, out: &mut Vec<ServerOut>) {
        let Some(r) = &self.restoring else {
            return;
        };
        if r.reading || !r.left.is_empty() {
            return;
        }
        info!(
            "restored key ranges {:?} from checkpoint {} in {} ms; serving",
            r.ranges,
            r.id,
            now.saturating_duration_since(r.started).as_millis()
        );
        self.restoring = None;
        out.push(ServerOut::Restored);
    }

    /// Time-driven work: a restore past its deadline fails.
    pub fn tick(&mut self, now: Instant, out: &mut Vec<ServerOut>) {
        let Some(r) = &self.restoring else {
            return;
        };
        if r.deadline > now {
            return;
        }
        let apps: BTreeSet<i32> = r.left.iter().map(|&(_, a)| a).collect();
        self.fail_restore(
            format!(
            "apps {apps:?} did not restore their state within PS_CHECKPOINT_TIMEOUT (does this \
             server create a KVServer for each with set_replicated_handle?)"
        ),
            out,
        );
    }

    /// When [`CheckpointServer::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.restoring.as_ref().map(|r| r.deadline)
    }
}
