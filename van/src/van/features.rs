//! What the Van offers of the features without a wait of their own:
//! replicated key ranges (the apps' answers to copy requests),
//! checkpoints, the key-value store's watchers. Each call goes to the core;
//! what a caller waits for is a [`Call`] given to [`Van::call`].

use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use pslite_proto::lock;
use pslite_proto::replica::RangeMap;
use pslite_proto::store::{StoreMsg, StoreOp};
use pslite_van_core::{Call, Done};

use super::Van;
use crate::links::Mode;
use crate::{Core, VanError};

impl Van {
    /// Replicated key ranges: the range map this node knows, if the cluster
    /// replicates.
    pub fn range_map(&self) -> Option<RangeMap> {
        lock(&self.shared.locked).core.range_map().cloned()
    }

    /// Replicated key ranges, on a server: the apps whose state is copied
    /// to joining servers (app 0 unless set).
    pub fn set_replicated_apps(&self, apps: std::collections::BTreeSet<i32>) {
        self.shared
            .with_core(Self::mode(), |core, _| core.set_replicated_apps(apps));
    }

    /// App `app`'s answer to [`Dispatch::snapshot`](crate::Dispatch::snapshot) request `token`.
    pub fn snapshot_taken(&self, token: u64, app: i32, data: Bytes) {
        self.shared.with_core(Self::mode(), |core, now| {
            core.snapshot_taken(token, app, data, now)
        });
    }

    /// App `app` finished [`Dispatch::restore`](crate::Dispatch::restore) request `token`.
    pub fn restored(&self, token: u64, app: i32) {
        self.shared
            .with_core(Self::mode(), |core, now| core.restored(token, app, now));
    }

    /// App `app` cannot answer [`Dispatch::snapshot`](crate::Dispatch::snapshot) request `token` (its
    /// state cannot be copied): a checkpoint fails saying `why`.
    pub fn snapshot_failed(&self, token: u64, app: i32, why: &str) {
        self.shared.with_core(Self::mode(), |core, now| {
            core.snapshot_failed(token, app, why, now)
        });
    }

    /// App `app` refused [`Dispatch::restore`](crate::Dispatch::restore) request `token` (nothing
    /// changed): a server restoring a checkpoint fails saying `why`.
    pub fn restore_failed(&self, token: u64, app: i32, why: &str) {
        self.shared.with_core(Self::mode(), |core, now| {
            core.restore_failed(token, app, why, now)
        });
    }

    /// Whether this node's cluster takes checkpoints (its scheduler has
    /// `PS_CHECKPOINT_DIR`; known once joined).
    pub fn checkpointing(&self) -> bool {
        lock(&self.shared.locked).core.checkpointing()
    }

    /// Sends every later change of `key` (store events, in order) to
    /// `events`, then registers the watch with the scheduler, waiting up to
    /// `limit` (see [`Call::Store`]); returns the scheduler's answer.
    pub fn store_watch(
        &self,
        key: &str,
        events: mpsc::Sender<StoreMsg>,
        limit: Duration,
    ) -> Result<StoreMsg, VanError> {
        let shared = &self.shared;
        let watcher = shared.with_core(Mode::Wait, |core, _| core.store_watch(key));
        lock(&shared.watchers).insert(watcher, events);
        let req = StoreMsg::request(StoreOp::Watch, vec![key.to_string()]);
        let answer = self
            .call(Call::Store(req), Some(limit))
            .and_then(Done::store);
        if answer.is_err() {
            lock(&shared.watchers).remove(&watcher);
            shared.with_core(Mode::Wait, |core, now| {
                core.store_watcher_gone(watcher, now)
            });
        }
        answer
    }

    /// On the scheduler: how many store requests (GET, WAIT) wait for keys
    /// to be set; 0 on other nodes.
    pub fn store_waiting(&self) -> usize {
        self.read(Core::store_waiting)
    }

    /// On the scheduler: how many store watches there are (members' and
    /// admin clients'); 0 on other nodes.
    pub fn store_watches(&self) -> usize {
        self.read(Core::store_watches)
    }
}
