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
