//! What the Van offers of the features: replicated key ranges (the apps'
//! answers to copy requests), checkpoints, the key-value store, a server's
//! leave. Each call goes to the core; each wait is the Van's one wait.

use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use pslite_proto::checkpoint::CheckpointMsg;
use pslite_proto::lock;
use pslite_proto::replica::RangeMap;
use pslite_proto::store::{StoreMsg, StoreOp};
use pslite_van_core::{Done, Wait};

use super::Van;
use crate::links::Mode;
use crate::{Core, Failure, VanError};

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

    /// Asks the scheduler for a checkpoint, labelled `label`, taken at the
    /// workers' next barrier where none has a request in flight (see
    /// `crate::checkpoint`), and waits up to `timeout` for the scheduler
    /// to accept it. Returns the ticket to wait on with
    /// [`Van::checkpoint_result`] and the checkpoint's id.
    pub fn checkpoint(&self, label: &str, timeout: Duration) -> Result<(u64, u64), VanError> {
        let mut ticket = 0;
        let done = self.wait(|core, now| {
            ticket = core.checkpoint_request(label, now)?;
            Ok(core.wait(Wait::CheckpointAccepted(ticket), Some(timeout), now))
        });
        let accepted = match done {
            Ok(Done::Checkpoint(accepted)) => accepted,
            Ok(_) => return Err(VanError::NotReady),
            Err(e) => {
                lock(&self.shared.locked).core.end_checkpoint(ticket);
                return Err(e);
            }
        };
        if !accepted.error.is_empty() {
            lock(&self.shared.locked).core.end_checkpoint(ticket);
            return Err(Failure::Checkpoint {
                detail: format!("checkpoint refused: {}", accepted.error),
            }
            .into());
        }
        Ok((ticket, accepted.id))
    }

    /// Waits up to `timeout` for the checkpoint of `ticket` (from
    /// [`Van::checkpoint`]) to complete: every server's file (the answer's
    /// `files`, in `dir`), or why it failed.
    pub fn checkpoint_result(
        &self,
        ticket: u64,
        timeout: Duration,
    ) -> Result<CheckpointMsg, VanError> {
        let done = self
            .wait(|core, now| Ok(core.wait(Wait::CheckpointResult(ticket), Some(timeout), now)))?;
        let Done::Checkpoint(result) = done else {
            return Err(VanError::NotReady);
        };
        if !result.error.is_empty() {
            return Err(Failure::Checkpoint {
                detail: format!("checkpoint {} failed: {}", result.id, result.error),
            }
            .into());
        }
        Ok(result)
    }

    /// Sends store request `req` to the scheduler and waits up to `limit`
    /// for its answer ([`VanError::StoreNoAnswer`] after that). Fails at
    /// once if the node failed or the scheduler is lost.
    pub fn store_call(&self, req: StoreMsg, limit: Duration) -> Result<StoreMsg, VanError> {
        let done = self.wait(|core, now| {
            let id = core.store_request(req, limit, now)?;
            Ok(core.wait(Wait::Store(id), None, now))
        })?;
        match done {
            Done::Store(answer) => Ok(answer),
            _ => Err(VanError::NotReady),
        }
    }

    /// Sends every later change of `key` (store events, in order) to
    /// `events`, then registers the watch with the scheduler (see
    /// [`Van::store_call`]); returns the scheduler's answer.
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
        let answer = self.store_call(req, limit);
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

    /// On a server of a job whose servers join and leave
    /// (`DMLC_NUM_SERVER=MIN:MAX`): asks the scheduler to let it leave and
    /// waits up to `limit` until its ranges are on the other servers. `Ok`:
    /// it left, its waits (a barrier) ended, and it may stop. Fails if the
    /// scheduler refuses (fewer than MIN servers would stay), does not
    /// answer in time, or the node failed.
    pub fn leave_job(&self, limit: Duration) -> Result<(), VanError> {
        self.wait(|core, now| {
            core.leave_job(now)?;
            Ok(core.wait(Wait::Leave, Some(limit), now))
        })
        .map(drop)
    }
}
