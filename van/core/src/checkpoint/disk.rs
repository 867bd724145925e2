//! The checkpoint directory's layout and the file operations the protocol
//! asks for. It performs none: the driver carries each [`Io`] out
//! (`pslite_van::checkpoint::disk`: atomic writes, reads, scans, deletes)
//! and the harness keeps a map of paths to bytes instead.
//!
//! Layout of `PS_CHECKPOINT_DIR`:
//!
//! ```text
//! DIR/checkpoint-000003/server-0.ckpt   server rank 0's ranges
//! DIR/checkpoint-000003/server-1.ckpt
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

/// The file name of server rank `rank`'s ranges.
pub fn server_file_name(rank: i32) -> String {
    format!("server-{rank}.ckpt")
}

/// The checkpoint id of a directory name (`checkpoint-000003` is 3).
pub fn id_of(name: &str) -> Option<u64> {
    name.strip_prefix("checkpoint-")?.parse().ok()
}

/// A file operation the checkpoint protocol asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Io {
    /// Write `bytes` to `path` atomically.
    Write {
        /// Where.
        path: PathBuf,
        /// What.
        bytes: Bytes,
    },
    /// Read each of `paths` whole (the first that exists of each list).
    Read {
        /// Candidates per file wanted, in order of preference.
        paths: Vec<Vec<PathBuf>>,
    },
    /// Delete the checkpoints of `dir` below id `below`.
    Prune {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The oldest id to keep.
        below: u64,
    },
}

/// What came of an [`Io`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoResult {
    /// Written (or pruned).
    Done,
    /// Read: for each list of candidates, the path read and its bytes.
    Read(Vec<(PathBuf, Bytes)>),
    /// It failed; says which file and why.
    Failed(String),
}

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
