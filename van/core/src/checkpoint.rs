//! Checkpoints (`PS_CHECKPOINT_DIR`, pslite servers only): every server
//! writes its key ranges to a file, consistently across servers, on demand
//! (`pslite checkpoint`, `Call::Checkpoint`) and every
//! `PS_CHECKPOINT_INTERVAL` seconds; a job started with the same directory
//! restores the last complete one before its servers serve. Socket-free
//! state machines with time passed in, a component of the core together
//! ([`checkpoints::Checkpoints`]):
//! - [`master::CheckpointMaster`] (scheduler): when a checkpoint is taken,
//!   which servers write which ranges, when it is complete, what to delete.
//! - [`server::CheckpointServer`] (server): copies its ranges from its apps
//!   into one file; restores the ranges it holds before serving.
//! - `plan.rs` the scheduler's plan of a checkpoint from what it knows of
//!   the cluster; `releasing.rs` a barrier's releases gathered on their way
//!   out; `requests.rs` a node's own requests and their answers.
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
//!   its size and content CRC-32), then `LATEST`, once every server reported its file written
//!   (fsynced); a checkpoint without a manifest never completed and is never
//!   restored. Checkpoint ids grow across jobs sharing the directory; after
//!   each completion only the newest `PS_CHECKPOINT_KEEP` complete ones (and
//!   anything newer) are kept.
//! - **Failure.** A server that dies or reports an error, or a checkpoint
//!   not complete within `PS_CHECKPOINT_TIMEOUT`, fails that checkpoint: the
//!   barrier is released and the requesters are told why at once; its
//!   directory is deleted once every server told to write it ended (reported
//!   its file written or not, died, or did not report within another
//!   `PS_CHECKPOINT_TIMEOUT`), so no file is written into it after.
//! - **One job per directory.** The scheduler holds `DIR/LOCK` locked for
//!   the job's life: a second job on the directory is refused at start. A
//!   job has an identity (32 hex digits), chosen at its first start and kept
//!   by the jobs that resume it; every file names its job, checkpoint,
//!   writer and key ranges (name and header), and the manifest records the
//!   checksum of each file's content.
//! - **Failure leaves nothing.** A failed checkpoint's directory is deleted,
//!   and at start, any checkpoint that never completed: newer than the one
//!   resumed (the job stopped while writing it) or without a manifest.
//! - **Restore.** At start, the scheduler resumes the checkpoint `DIR/LATEST`
//!   names (written after each manifest), and says which at the default log
//!   level; a missing or corrupt manifest, one of another job or cluster
//!   shape, or complete checkpoints without `LATEST`, stop it with an error
//!   naming the file (never an older checkpoint or a fresh start instead, unless
//!   `PS_CHECKPOINT_FRESH=1` asks for a new job). It sends the plan (id, files) with the node table that forms the
//!   cluster; each server reads the files of the ranges it holds, checks
//!   them whole (size and content checksum against the manifest, format,
//!   job, id, writer, ranges, shape)
//!   before handing anything to its apps, and holds every request until its
//!   apps restored. A bad file fails the server, naming the file and what is
//!   wrong; nothing of it was loaded.

pub mod checkpoints;
pub mod disk;
pub mod format;
pub mod master;
mod plan;
mod releasing;
mod requests;
pub mod server;

use self::disk::Found;
use self::format::Manifest;

pub use crate::config::{CheckpointConfig, DEFAULT_KEEP, DEFAULT_TIMEOUT};
pub use crate::effects::{is_checkpoint_token, TOKEN_BIT};

/// What a starting scheduler finds in its `PS_CHECKPOINT_DIR`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    /// The job: the resumed checkpoint's, or a new one.
    pub job: String,
    /// The checkpoint to restore: the one `LATEST` names.
    pub restore: Option<Manifest>,
    /// The ids of the complete checkpoints, ascending.
    pub complete: Vec<u64>,
    /// The next checkpoint's id (above every directory found).
    pub next_id: u64,
    /// Checkpoints that never completed: newer than the one resumed (the
    /// job stopped while writing them), or without a manifest (failed);
    /// deleted at start.
    pub leftovers: Vec<u64>,
    /// What the scheduler says at start (at the default log level): which
    /// checkpoint the job resumes, or that it starts fresh.
    pub said: String,
}

/// Decides what a job with key ranges `ranges` restores from what a scan
/// of `dir` found and what `dir/LATEST` names (`latest`), `new_job` being
/// the identity a fresh job takes:
/// - `fresh` (`PS_CHECKPOINT_FRESH=1`): nothing; a new job, whose
///   checkpoints are numbered after those found (which stay);
/// - `LATEST` names a checkpoint: exactly that one, which must be complete
///   (its manifest there, readable, of that job and number, of this cluster's
///   shape); anything wrong is an error naming the file (an older
///   checkpoint is never taken silently instead);
/// - no `LATEST` and no checkpoint: a new job;
/// - no `LATEST` and only checkpoints that never completed (no manifest):
///   a new job, saying which it ignores (they are deleted at start);
/// - no `LATEST` but a checkpoint with a manifest: an error (no complete
///   checkpoint is known to resume; `PS_CHECKPOINT_FRESH=1` starts a new
///   job).
pub fn catalog(
    dir: &std::path::Path,
    found: &[Found],
    latest: Option<(String, u64)>,
    ranges: &[(u64, u64)],
    fresh: bool,
    new_job: String,
) -> Result<Catalog, String> {
    let next_id = found.iter().map(|f| f.id).max().map_or(1, |id| id + 1);
    let complete: Vec<u64> = found
        .iter()
        .filter(|f| f.manifest.is_some())
        .map(|f| f.id)
        .collect();
    let fresh_catalog = |said: String| Catalog {
        job: new_job.clone(),
        restore: None,
        complete: Vec::new(),
        next_id,
        leftovers: Vec::new(),
        said,
    };
    let shown = dir.display();
    if fresh {
        return Ok(fresh_catalog(format!(
            "PS_CHECKPOINT_FRESH=1: job {new_job} starts without a checkpoint in {shown} (its \
             checkpoints are numbered from {next_id}; the {} found there stay)",
            found.len()
        )));
    }
    let fresh_hint = "set PS_CHECKPOINT_FRESH=1 to start a new job in this directory, or give \
                      another PS_CHECKPOINT_DIR";
    let Some((job, id)) = latest else {
        if found.is_empty() {
            return Ok(fresh_catalog(format!(
                "PS_CHECKPOINT_DIR {shown} holds no checkpoint: job {new_job} starts fresh"
            )));
        }
        let ids: Vec<String> = found.iter().map(|f| f.id.to_string()).collect();
        if found.iter().all(|f| f.manifest.is_none()) {
            // Only checkpoints that never completed (failed, or the job
            // stopped while writing them): nothing to resume, nothing lost.
            let mut c = fresh_catalog(format!(
                "PS_CHECKPOINT_DIR {shown} holds only checkpoints that never completed ({}: \
                 no {} and no {}): ignoring and deleting them; job {new_job} starts fresh",
                ids.join(", "),
                disk::MANIFEST,
                disk::LATEST
            ));
            c.leftovers = found.iter().map(|f| f.id).collect();
            return Ok(c);
        }
        return Err(format!(
            "no complete checkpoint to resume in {shown}: it holds checkpoints {} but no {} \
             naming the one to resume (deleted, or written by an older pslite); {fresh_hint}",
            ids.join(", "),
            disk::LATEST
        ));
    };
    let cdir = disk::checkpoint_dir(dir, id);
    let refuse = |why: String| {
        format!(
            "cannot resume checkpoint {id} of job {job} ({}/{} names it): {why}; {fresh_hint}",
            shown,
            disk::LATEST
        )
    };
    let Some(entry) = found.iter().find(|f| f.id == id) else {
        return Err(refuse(format!("{} is missing", cdir.display())));
    };
    let path = entry.manifest_path.display();
    let bytes = match &entry.manifest {
        Some(Ok(bytes)) => bytes,
        Some(Err(e)) => return Err(refuse(format!("{path} cannot be read ({e})"))),
        None => return Err(refuse(format!("{path} is missing"))),
    };
    let manifest = format::decode_manifest(bytes).map_err(|e| refuse(format!("{path}: {e}")))?;
    if manifest.id != id || manifest.job != job {
        return Err(refuse(format!(
            "{path} is checkpoint {} of job {}",
            manifest.id, manifest.job
        )));
    }
    if let Some(why) = manifest.shape.mismatch(ranges) {
        return Err(refuse(format!("{path} does not fit this job: {why}")));
    }
    // Newer ones never completed (the job stopped while writing them);
    // older ones without a manifest failed and never will.
    let leftovers: Vec<u64> = found
        .iter()
        .filter(|f| f.id > id || (f.id < id && f.manifest.is_none()))
        .map(|f| f.id)
        .collect();
    let said = format!(
        "resuming job {job} from checkpoint {id}{} in {} ({} files)",
        if manifest.label.is_empty() {
            String::new()
        } else {
            format!(" ({})", manifest.label)
        },
        cdir.display(),
        manifest.files.len()
    );
    Ok(Catalog {
        job,
        restore: Some(manifest),
        complete: complete.into_iter().filter(|&c| c <= id).collect(),
        next_id,
        leftovers,
        said,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use bytes::Bytes;
    use pslite_proto::checkpoint::CheckpointFile;

    use super::format::{encode_manifest, Manifest, Shape};
    use super::*;

    const JOB: &str = "0123456789abcdef0123456789abcdef";

    fn found(id: u64, manifest: Option<Manifest>) -> Found {
        Found {
            id,
            manifest_path: disk::checkpoint_dir(Path::new("/ck"), id).join(disk::MANIFEST),
            manifest: manifest.map(|m| Ok(Bytes::from(encode_manifest(&m)))),
        }
    }

    fn manifest(id: u64, job: &str) -> Manifest {
        Manifest {
            job: job.into(),
            id,
            created_ms: 1,
            label: format!("epoch {id}"),
            shape: Shape {
                ranges: crate::replica::key_ranges(1),
                replicas: 1,
                map_version: 0,
            },
            files: vec![CheckpointFile {
                name: "f".into(),
                node: 8,
                size: 1,
                crc: 2,
                ranges: vec![0],
            }],
        }
    }

    fn run(found: &[Found], latest: Option<(&str, u64)>, fresh: bool) -> Result<Catalog, String> {
        let ranges = crate::replica::key_ranges(1);
        let latest = latest.map(|(j, id)| (j.to_string(), id));
        catalog(
            Path::new("/ck"),
            found,
            latest,
            &ranges,
            fresh,
            "new".into(),
        )
    }

    #[test]
    fn latest_names_the_checkpoint_resumed_and_nothing_else_is_taken_silently() {
        let three = [
            found(1, Some(manifest(1, JOB))),
            found(2, Some(manifest(2, JOB))),
            found(3, None),
        ];
        // LATEST names 2: resumed, with the job's identity; 3 never completed.
        let c = run(&three, Some((JOB, 2)), false).unwrap();
        assert_eq!(c.restore.map(|m| m.id), Some(2));
        assert_eq!((c.job.as_str(), c.leftovers, c.next_id), (JOB, vec![3], 4));
        assert!(
            c.said.contains("resuming job") && c.said.contains("checkpoint 2"),
            "{}",
            c.said
        );
        // The manifest LATEST names was deleted: an error naming it, not
        // checkpoint 1 and not a fresh start.
        let why = run(&three, Some((JOB, 3)), false).unwrap_err();
        assert!(
            why.contains("checkpoint-000003/MANIFEST is missing"),
            "{why}"
        );
        assert!(why.contains("PS_CHECKPOINT_FRESH=1"), "{why}");
        // Another job's manifest under that number.
        let other = [found(2, Some(manifest(2, "ffff")))];
        let why = run(&other, Some((JOB, 2)), false).unwrap_err();
        assert!(why.contains("of job ffff"), "{why}");
        // Checkpoints but no LATEST: no complete checkpoint is known.
        let why = run(&three, None, false).unwrap_err();
        assert!(why.contains("no complete checkpoint"), "{why}");
        // ... unless a fresh start is asked for: a new job, numbered after.
        let c = run(&three, None, true).unwrap();
        assert_eq!((c.job.as_str(), c.restore, c.next_id), ("new", None, 4));
        // An empty directory is a first start.
        let c = run(&[], None, false).unwrap();
        assert_eq!((c.job.as_str(), c.restore, c.next_id), ("new", None, 1));
        assert!(c.said.contains("starts fresh"), "{}", c.said);
    }

    #[test]
    fn only_checkpoints_that_never_completed_start_a_new_job_saying_so() {
        // Two failed checkpoints, no LATEST: nothing to resume, nothing lost.
        let failed = [found(1, None), found(2, None)];
        let c = run(&failed, None, false).unwrap();
        assert_eq!((c.job.as_str(), c.restore, c.next_id), ("new", None, 3));
        assert_eq!(c.leftovers, vec![1, 2], "deleted at start");
        assert!(
            c.said.contains("/ck")
                && c.said.contains("never completed (1, 2")
                && c.said.contains("starts fresh"),
            "{}",
            c.said
        );
        // One complete checkpoint among them, no LATEST: still refused.
        let mixed = [found(1, None), found(2, Some(manifest(2, JOB)))];
        let why = run(&mixed, None, false).unwrap_err();
        assert!(why.contains("no complete checkpoint"), "{why}");
        // Resuming 2: the failed 1 below it and the unfinished 3 go.
        let around = [
            found(1, None),
            found(2, Some(manifest(2, JOB))),
            found(3, None),
        ];
        let c = run(&around, Some((JOB, 2)), false).unwrap();
        assert_eq!(
            (c.restore.map(|m| m.id), c.leftovers),
            (Some(2), vec![1, 3])
        );
    }
}
