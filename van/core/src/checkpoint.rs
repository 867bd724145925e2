//! Checkpoints (`PS_CHECKPOINT_DIR`, pslite servers only): every server
//! writes its key ranges to a file, consistently across servers, on demand
//! (`pslite checkpoint`, the driver's `Van::checkpoint`) and every
//! `PS_CHECKPOINT_INTERVAL` seconds; a job started with the same directory
//! restores the last complete one before its servers serve. Socket-free
//! state machines with time passed in, a component of the core together
//! ([`checkpoints::Checkpoints`]):
//! - [`master::CheckpointMaster`] (scheduler): when a checkpoint is taken,
//!   which servers write which ranges, when it is complete, what to delete.
//! - [`server::CheckpointServer`] (server): copies its ranges from its apps
//!   into one file; restores the ranges it holds before serving.
//! - [`format`](mod@format): the file format; [`disk`]: the only code that touches
//!   files, carried out by the driver for the [`disk::Io`] the core asks for.
//!
//! Rules:
//! - **The cut.** A checkpoint is taken at a barrier over the workers
//!   (a group that includes them), once every worker has arrived and each
//!   said, on its BARRIER request, that it had no request in flight. The
//!   scheduler holds the barrier's release, orders every server to write its
//!   ranges, and releases the barrier when all have written (or the
//!   checkpoint failed). So every push answered before the barrier is in
//!   the checkpoint on every server that holds its keys, and none sent after
//!   the release is: no push is in one server's file and not in another's.
//!   A requested checkpoint waits for such a barrier; one whose workers had
//!   requests in flight does not qualify.
//! - **What each server writes.** Without replication, server rank `r`
//!   writes range `r`; with `PS_REPLICAS=k`, every replica of a range writes
//!   it (joiners do not). The snapshot request goes into the apps' queue
//!   behind every request delivered before it.
//! - **Complete.** The scheduler writes the manifest (every server's file,
//!   its size and CRC-32) once every server reported its file written
//!   (fsynced); a checkpoint without a manifest never completed and is never
//!   restored. Checkpoint ids grow across jobs sharing the directory; after
//!   each completion only the newest `PS_CHECKPOINT_KEEP` complete ones (and
//!   anything newer) are kept.
//! - **Failure.** A server that dies or reports an error, or a checkpoint
//!   not complete within `PS_CHECKPOINT_TIMEOUT`, fails that checkpoint: the
//!   barrier is released, the requesters are told why, and its directory
//!   stays incomplete (deleted with the older ones later).
//! - **Restore.** At start, the scheduler takes the newest checkpoint with
//!   a manifest; a manifest it cannot read, or one of another cluster shape
//!   (number of servers, key ranges), stops it with an error naming the
//!   file. It sends the plan (id, files) with the node table that forms the
//!   cluster; each server reads the files of the ranges it holds, checks
//!   them whole (size and CRC-32 against the manifest, format, id, shape)
//!   before handing anything to its apps, and holds every request until its
//!   apps restored. A bad file fails the server, naming the file and what is
//!   wrong; nothing of it was loaded.

pub mod checkpoints;
pub mod disk;
pub mod format;
pub mod master;
pub mod server;

use std::path::PathBuf;
use std::time::Duration;

use self::disk::Found;
use self::format::Manifest;

/// Tokens of the apps' snapshot and restore requests made for checkpoints
/// have this bit set (replication's never do).
pub const TOKEN_BIT: u64 = 1 << 63;

/// Whether an apps' request token is a checkpoint's.
pub fn is_checkpoint_token(token: u64) -> bool {
    token & TOKEN_BIT != 0
}

/// The default `PS_CHECKPOINT_TIMEOUT`: how long a checkpoint may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// The default `PS_CHECKPOINT_KEEP`: complete checkpoints kept.
pub const DEFAULT_KEEP: usize = 3;

/// How a scheduler (or a server writing its own files) checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// `PS_CHECKPOINT_DIR`.
    pub dir: PathBuf,
    /// `PS_CHECKPOINT_INTERVAL`: a checkpoint at the first qualifying
    /// barrier after each interval (`None`: on demand only).
    pub interval: Option<Duration>,
    /// `PS_CHECKPOINT_TIMEOUT`: a checkpoint not complete this long after
    /// its barrier fails; a restore not done this long after the node
    /// table fails the server.
    pub timeout: Duration,
    /// `PS_CHECKPOINT_KEEP`: complete checkpoints kept.
    pub keep: usize,
}

impl CheckpointConfig {
    /// Checkpoints in `dir`, on demand only, with the default timeout and
    /// number kept.
    pub fn new(dir: impl Into<PathBuf>) -> CheckpointConfig {
        CheckpointConfig {
            dir: dir.into(),
            interval: None,
            timeout: DEFAULT_TIMEOUT,
            keep: DEFAULT_KEEP,
        }
    }
}

/// What a starting scheduler finds in its `PS_CHECKPOINT_DIR`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    /// The checkpoint to restore: the newest complete one.
    pub restore: Option<Manifest>,
    /// The ids of the complete checkpoints, ascending.
    pub complete: Vec<u64>,
    /// The next checkpoint's id (above every directory found).
    pub next_id: u64,
}

/// Decides what a job with key ranges `ranges` restores from what a scan
/// found: the newest checkpoint with a manifest. Checkpoints without one
/// never completed and are skipped; a newest manifest that cannot be read,
/// is corrupt, or belongs to another cluster shape is an error naming the
/// file (an older checkpoint is not taken silently instead: delete the
/// newer directory to go back to it).
pub fn catalog(found: &[Found], ranges: &[(u64, u64)]) -> Result<Catalog, String> {
    let next_id = found.iter().map(|f| f.id).max().map_or(1, |id| id + 1);
    let complete: Vec<u64> = found
        .iter()
        .filter(|f| f.manifest.is_some())
        .map(|f| f.id)
        .collect();
    let Some(newest) = found.iter().rev().find(|f| f.manifest.is_some()) else {
        return Ok(Catalog {
            restore: None,
            complete,
            next_id,
        });
    };
    let path = newest.manifest_path.display();
    let refuse = |why: String| {
        format!(
            "cannot restore checkpoint {}: {path} {why}; delete {} to restore the checkpoint \
             before it, or start with another PS_CHECKPOINT_DIR",
            newest.id,
            newest
                .manifest_path
                .parent()
                .map_or(String::new(), |p| p.display().to_string())
        )
    };
    let bytes = match &newest.manifest {
        Some(Ok(bytes)) => bytes,
        Some(Err(e)) => return Err(refuse(format!("cannot be read ({e})"))),
        None => return Err(refuse("is missing".into())),
    };
    let manifest = format::decode_manifest(bytes).map_err(|e| refuse(e.to_string()))?;
    if manifest.id != newest.id {
        return Err(refuse(format!(
            "is checkpoint {}'s manifest, not {}'s",
            manifest.id, newest.id
        )));
    }
    if let Some(why) = manifest.shape.mismatch(ranges) {
        return Err(refuse(format!("does not fit this job: {why}")));
    }
    Ok(Catalog {
        restore: Some(manifest),
        complete,
        next_id,
    })
}
