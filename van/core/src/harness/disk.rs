//! The harness's file system: one map of paths to bytes, shared by every
//! node, on which the checkpoints' file operations are carried out as the
//! driver carries them out on a real one.

use std::path::Path;

use super::Network;
use crate::checkpoint::disk::{checkpoint_dir, id_of, Found, Io, IoResult, MANIFEST};

/// The id of the checkpoint directory of `dir` that `path` is in.
fn checkpoint_of(path: &Path, dir: &Path) -> Option<u64> {
    let first = path.strip_prefix(dir).ok()?.components().next()?;
    id_of(first.as_os_str().to_str()?)
}

impl Network {
    /// Carries out a checkpoint's file operation on [`Network::disk`].
    pub(super) fn perform(&mut self, io: &Io) -> IoResult {
        match io {
            Io::Write { path, bytes } => {
                self.disk.insert(path.clone(), bytes.clone());
                IoResult::Done
            }
            Io::Read { paths } => {
                let mut out = Vec::new();
                for candidates in paths {
                    match candidates
                        .iter()
                        .find_map(|p| self.disk.get(p).map(|b| (p.clone(), b.clone())))
                    {
                        Some(found) => out.push(found),
                        None => {
                            return IoResult::Failed(format!(
                                "checkpoint file {candidates:?} is missing"
                            ))
                        }
                    }
                }
                IoResult::Read(out)
            }
            // Every job's (the harness runs one job per disk).
            Io::Prune { dir, below, .. } => {
                self.disk
                    .retain(|path, _| checkpoint_of(path, dir).is_none_or(|id| id >= *below));
                IoResult::Done
            }
            Io::Complete {
                manifest,
                bytes,
                latest,
                text,
            } => {
                self.disk.insert(manifest.clone(), bytes.clone());
                self.disk.insert(
                    latest.clone(),
                    bytes::Bytes::from(text.clone().into_bytes()),
                );
                IoResult::Done
            }
            Io::Remove { dir } => {
                self.disk.retain(|path, _| !path.starts_with(dir));
                IoResult::Done
            }
        }
    }

    /// The checkpoints on [`Network::disk`] under `dir`, as
    /// the driver's `checkpoint::disk::scan` finds them on a real one.
    pub fn scan_checkpoints(&self, dir: &Path) -> Vec<Found> {
        let mut ids: Vec<u64> = self
            .disk
            .keys()
            .filter_map(|p| checkpoint_of(p, dir))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| {
                let manifest_path = checkpoint_dir(dir, id).join(MANIFEST);
                Found {
                    id,
                    manifest: self.disk.get(&manifest_path).cloned().map(Ok),
                    manifest_path,
                }
            })
            .collect()
    }
}
