//! The harness's file system: one map of paths to bytes, shared by every
//! node, on which the checkpoints' file operations are carried out as the
//! driver carries them out on a real one. [`DiskFaults`] makes writes fail
//! (a full disk) or wait (a slow one) and logs every operation in order.

use std::path::Path;

use super::Network;
use crate::checkpoint::disk::{checkpoint_dir, id_of, Found, Io, IoResult, MANIFEST};

/// The id of the checkpoint directory of `dir` that `path` is in.
fn checkpoint_of(path: &Path, dir: &Path) -> Option<u64> {
    let first = path.strip_prefix(dir).ok()?.components().next()?;
    id_of(first.as_os_str().to_str()?)
}

/// Writes that fail or wait, by a part of their path, and what was done.
#[derive(Debug, Default)]
pub struct DiskFaults {
    /// A write whose path contains `.0` fails with `.1` (nothing written).
    pub fail: Vec<(String, String)>,
    /// A write whose path contains one of these waits (as a write thread
    /// stuck on a slow disk) until [`Network::end_held_writes`].
    pub hold: Vec<String>,
    /// The waiting writes: (node, token, operation).
    held: Vec<(usize, u64, Io)>,
    /// Every operation in order: `write PATH`, `failed PATH`, `held PATH`,
    /// `remove DIR`, `complete MANIFEST`, `read`, `prune`.
    pub log: Vec<String>,
}

impl DiskFaults {
    /// How many writes wait.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The index in [`DiskFaults::log`] of the first entry starting with
    /// `what` and mentioning `path`.
    pub fn position(&self, what: &str, path: &str) -> Option<usize> {
        self.log
            .iter()
            .position(|l| l.starts_with(what) && l.contains(path))
    }
}

fn matches(path: &Path, parts: &[String]) -> bool {
    let path = path.to_string_lossy();
    parts.iter().any(|p| path.contains(p.as_str()))
}

impl Network {
    /// Node `i`'s file operation `token`: carried out now and answered, or
    /// held (see [`DiskFaults::hold`]).
    pub(super) fn checkpoint_io(&mut self, i: usize, token: u64, io: Io) {
        if let Io::Write { path, .. } = &io {
            if matches(path, &self.disk_faults.hold) {
                let line = format!("held {}", path.display());
                self.disk_faults.log.push(line);
                self.disk_faults.held.push((i, token, io));
                return;
            }
        }
        let result = self.perform(&io);
        let now = self.now;
        self.nodes[i].core.checkpoint_io_done(token, result, now);
    }

    /// The held writes end now (each as it would have: written, or failed
    /// by [`DiskFaults::fail`]) and their nodes hear of it; a dead node's
    /// write lands but nobody hears.
    pub fn end_held_writes(&mut self) {
        for (i, token, io) in std::mem::take(&mut self.disk_faults.held) {
            let result = self.perform(&io);
            if self.nodes[i].alive {
                let now = self.now;
                self.nodes[i].core.checkpoint_io_done(token, result, now);
                self.flush(i);
            }
        }
    }

    /// Carries out a checkpoint's file operation on [`Network::disk`].
    pub(super) fn perform(&mut self, io: &Io) -> IoResult {
        let failing = match io {
            Io::Write { path, .. } => {
                let shown = path.to_string_lossy();
                self.disk_faults
                    .fail
                    .iter()
                    .find(|(p, _)| shown.contains(p.as_str()))
                    .map(|(_, why)| format!("cannot write {}: {why}", path.display()))
            }
            _ => None,
        };
        let log = &mut self.disk_faults.log;
        match io {
            Io::Write { path, .. } if failing.is_some() => {
                log.push(format!("failed {}", path.display()));
                IoResult::Failed(failing.unwrap_or_default())
            }
            Io::Write { path, bytes } => {
                log.push(format!("write {}", path.display()));
                self.disk.insert(path.clone(), bytes.clone());
                IoResult::Done
            }
            Io::Read { paths } => {
                log.push("read".into());
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
                log.push(format!("prune {} below {below}", dir.display()));
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
                log.push(format!("complete {}", manifest.display()));
                self.disk.insert(manifest.clone(), bytes.clone());
                self.disk.insert(
                    latest.clone(),
                    bytes::Bytes::from(text.clone().into_bytes()),
                );
                IoResult::Done
            }
            Io::Remove { dir } => {
                log.push(format!("remove {}", dir.display()));
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
