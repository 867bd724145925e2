//! The checkpoint directory's layout and the file operations the protocol
//! asks for. It performs none: the driver carries each [`Io`] out
//! (`pslite_van::checkpoint::disk`: atomic writes, reads, scans, deletes,
//! the directory's lock) and the harness keeps a map of paths to bytes
//! instead.
//!
//! Layout of `PS_CHECKPOINT_DIR`:
//!
//! ```text
//! DIR/LOCK                              held (flock) by the job's scheduler
//! DIR/LATEST                            "job JOB checkpoint 3": the one to resume
//! DIR/checkpoint-000003/ckpt-000003.server-0.ranges-0.job-3f9a1c2e.ckpt
//! DIR/checkpoint-000003/ckpt-000003.server-1.ranges-1.job-3f9a1c2e.ckpt
//! DIR/checkpoint-000003/MANIFEST        written last: checkpoint 3 is complete
//! ```

use std::path::{Path, PathBuf};

use bytes::Bytes;

/// The name of a checkpoint's manifest.
pub const MANIFEST: &str = "MANIFEST";

/// The directory of checkpoint `id` in `dir`.
pub fn checkpoint_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("checkpoint-{id:06}"))
}

/// The file that names the checkpoint to resume.
pub const LATEST: &str = "LATEST";

/// The file the scheduler holds locked while its job runs.
pub const LOCK: &str = "LOCK";

/// The file name of server rank `rank`'s ranges `ranges` in checkpoint `id`
/// of job `job`: it names all four.
pub fn server_file_name(id: u64, rank: i32, ranges: &[u32], job: &str) -> String {
    let ranges: Vec<String> = ranges.iter().map(u32::to_string).collect();
    format!(
        "ckpt-{id:06}.server-{rank}.ranges-{}.{}.ckpt",
        ranges.join(","),
        job_tag(job)
    )
}

/// How file names name a job: `job-` and its first 8 hex digits.
pub fn job_tag(job: &str) -> String {
    format!("job-{}", job.get(..8).unwrap_or(job))
}

/// What `LATEST` holds.
pub fn latest_text(job: &str, id: u64) -> String {
    format!("job {job} checkpoint {id}\n")
}

/// The checkpoint id of a directory name (`checkpoint-000003` is 3).
pub fn id_of(name: &str) -> Option<u64> {
    name.strip_prefix("checkpoint-")?.parse().ok()
}

pub use crate::effects::{Io, IoResult};

/// One checkpoint directory found in `PS_CHECKPOINT_DIR`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its id.
    pub id: u64,
    /// Where its manifest is.
    pub manifest_path: PathBuf,
    /// Its manifest's bytes: `None` if it has none (never completed),
    /// `Some(Err)` if it cannot be read.
    pub manifest: Option<Result<Bytes, String>>,
}
