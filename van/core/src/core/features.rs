//! What a caller tells or asks the features without waiting: the
//! key-value store's watchers, checkpoints (the scheduler's catalog, the
//! driver's file operations), replicated key ranges (and the apps' answers
//! to their copy requests). Each goes to its component; the core only
//! decides which one (an app's answer by its token). What a caller waits
//! for is a [`super::Call`].

use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use log::warn;
use pslite_proto::replica::RangeMap;

use super::Core;
use crate::checkpoint::disk::IoResult;
use crate::checkpoint::{is_checkpoint_token, Catalog};

/// How long a scheduler that refuses the job at start waits for the nodes
/// to register so it can tell them why (see [`Core::refuse_job`]).
pub const REFUSAL_WAIT: Duration = Duration::from_secs(30);

impl Core {
    /// On the scheduler: how many store requests wait for keys (0 elsewhere).
    pub fn store_waiting(&self) -> usize {
        self.parts.store.waiting()
    }

    /// On the scheduler: how many store watches there are (0 elsewhere).
    pub fn store_watches(&self) -> usize {
        self.parts.store.watch_count()
    }

    /// A new watcher of `key` in this process: every later change of it
    /// comes as [`crate::Output::StoreEvent`] for the returned watcher (call
    /// before the WATCH request, so no change slips between them).
    pub fn store_watch(&mut self, key: &str) -> u64 {
        self.parts.store.watch(key)
    }

    /// Watcher `watcher` is gone (its receiver was dropped): if nobody in
    /// this process watches its key any more, tells the scheduler.
    pub fn store_watcher_gone(&mut self, watcher: u64, now: Instant) {
        self.with_store(now, |s, cx| s.watcher_gone(watcher, cx));
    }

    /// Bytes of answers to admin clients that ZeroMQ has not written (or
    /// dropped) yet: the driver takes each [`crate::Output::Reply`]'s
    /// `reserved` off once it has.
    pub fn reply_gauge(&self) -> Arc<AtomicUsize> {
        self.replies.gauge()
    }

    /// On the scheduler: what the scan of `PS_CHECKPOINT_DIR` found
    /// (see [`crate::checkpoint::catalog`]); call before the cluster forms.
    pub fn set_checkpoint_catalog(&mut self, catalog: Catalog) {
        self.parts.checkpoints.set_catalog(&self.cfg, catalog);
    }

    /// On a scheduler that cannot start the job (`why`: its checkpoint
    /// directory cannot be resumed, say): it forms no cluster, tells each
    /// node that registers why, and fails with `why` once every node was
    /// told and left, or [`REFUSAL_WAIT`] from `now` (less than
    /// `PS_START_TIMEOUT`) if some never register.
    pub fn refuse_job(&mut self, why: String, now: Instant) {
        let wait = REFUSAL_WAIT.min(
            self.cfg
                .start_timeout
                .saturating_sub(Duration::from_secs(1))
                .max(Duration::from_secs(1)),
        );
        if let Some(s) = &mut self.parts.scheduler {
            s.refuse_job(why, now, wait);
        }
    }

    /// Whether this node's cluster takes checkpoints (known once joined).
    pub fn checkpointing(&self) -> bool {
        self.parts.checkpoints.is_on()
    }

    /// A file operation the driver carried out for token `token`.
    pub fn checkpoint_io_done(&mut self, token: u64, result: IoResult, now: Instant) {
        self.with_checkpoints(now, |c, cx| c.io_done(token, result, now, cx));
    }

    /// The range map this node knows, when key ranges are replicated.
    pub fn range_map(&self) -> Option<&RangeMap> {
        self.parts.replication.range_map()
    }

    /// On a server: its ranges' replication state, described for logs.
    pub fn describe_replicas(&self) -> String {
        self.parts.replication.describe(&self.holds)
    }

    /// On a server: whether it is the serving primary of range `r`.
    pub fn serves_range(&self, r: u32) -> bool {
        self.parts.replication.serves(r)
    }

    /// Whether key ranges are replicated in this cluster (known on a node
    /// once it joined).
    pub fn replicated(&self) -> bool {
        self.parts.replication.is_on()
    }

    /// On a server: the apps whose state is copied to joining servers and
    /// checkpointed (each answers [`crate::Output::Snapshot`] and
    /// [`crate::Output::Restore`]); app 0 unless set.
    pub fn set_replicated_apps(&mut self, apps: BTreeSet<i32>) {
        self.parts.checkpoints.set_apps(apps.clone());
        self.parts.replication.set_apps(apps);
    }

    /// App `app` answered snapshot request `token` with `data`.
    pub fn snapshot_taken(&mut self, token: u64, app: i32, data: Bytes, now: Instant) {
        if is_checkpoint_token(token) {
            self.with_checkpoints(now, |c, cx| c.snapshot(token, app, Ok(data), now, cx));
        } else {
            self.with_replication(now, |r, cx| r.snapshot_taken(token, app, data, cx));
        }
    }

    /// App `app` finished restore request `token`.
    pub fn restored(&mut self, token: u64, app: i32, now: Instant) {
        if is_checkpoint_token(token) {
            self.with_checkpoints(now, |c, cx| c.restored(token, app, Ok(()), now, cx));
        } else {
            self.with_replication(now, |r, cx| r.restored(token, app, cx));
        }
    }

    /// App `app` could not answer snapshot request `token` (its handle
    /// cannot copy its state).
    pub fn snapshot_failed(&mut self, token: u64, app: i32, why: &str, now: Instant) {
        if is_checkpoint_token(token) {
            let failed = Err(why.to_string());
            self.with_checkpoints(now, |c, cx| c.snapshot(token, app, failed, now, cx));
        } else {
            warn!("app {app} cannot copy its state to a joining server: {why}");
        }
    }

    /// App `app` refused restore request `token` (nothing of it changed).
    pub fn restore_failed(&mut self, token: u64, app: i32, why: &str, now: Instant) {
        if is_checkpoint_token(token) {
            let failed = Err(why.to_string());
            self.with_checkpoints(now, |c, cx| c.restored(token, app, failed, now, cx));
        } else {
            warn!("app {app} refused a copy of its state: {why}");
        }
    }
}
