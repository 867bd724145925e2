//! Checkpoints on the file system: writing a file atomically, reading one
//! back, listing a directory, and deleting old checkpoints. The only code
//! of the checkpoint protocol that does I/O; the driver ([`crate::Van`])
//! calls it for the core's [`Io`] requests (the layout and the requests are
//! `pslite_van_core::checkpoint::disk`'s), and the harness replaces it with
//! a map of paths to bytes.
//!
//! A file is written as `NAME.tmp` in its directory, flushed to disk
//! (fsync), renamed to `NAME`, and the directory is flushed too, so after a
//! crash a name holds either nothing or a whole file.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
pub use pslite_van_core::checkpoint::disk::*;

/// Carries out `io` on the file system.
pub fn perform(io: &Io) -> IoResult {
    match io {
        Io::Write { path, bytes } => match write_atomic(path, bytes) {
            Ok(()) => IoResult::Done,
            Err(e) => IoResult::Failed(format!("cannot write {}: {e}", path.display())),
        },
        Io::Read { paths } => {
            let mut out = Vec::new();
            for candidates in paths {
                match read_first(candidates) {
                    Ok(read) => out.push(read),
                    Err(e) => return IoResult::Failed(e),
                }
            }
            IoResult::Read(out)
        }
        Io::Prune { dir, below } => {
            prune(dir, *below);
            IoResult::Done
        }
    }
}

/// The first of `candidates` that exists, read whole.
fn read_first(candidates: &[PathBuf]) -> Result<(PathBuf, Bytes), String> {
    for path in candidates {
        match fs::read(path) {
            Ok(bytes) => return Ok((path.clone(), Bytes::from(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        }
    }
    let names: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "checkpoint file {} is missing (is PS_CHECKPOINT_DIR the same directory on every \
         node, or a copy of it?)",
        names.join(" or ")
    ))
}

/// Writes `bytes` to `path` so that `path` never holds part of them: a
/// temporary file, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The checkpoints in `dir`, by id (none if `dir` does not exist).
pub fn scan(dir: &Path) -> Result<Vec<Found>, String> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(format!(
                "cannot read PS_CHECKPOINT_DIR {}: {e}",
                dir.display()
            ))
        }
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().and_then(id_of) else {
            continue;
        };
        let manifest_path = entry.path().join(MANIFEST);
        let manifest = match fs::read(&manifest_path) {
            Ok(bytes) => Some(Ok(Bytes::from(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some(Err(format!("cannot read {}: {e}", manifest_path.display()))),
        };
        found.push(Found {
            id,
            manifest_path,
            manifest,
        });
    }
    found.sort_by_key(|f| f.id);
    Ok(found)
}

/// Deletes the checkpoint directories of `dir` below id `below` (logged,
/// never fatal: a checkpoint left behind only takes space).
pub fn prune(dir: &Path, below: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().and_then(id_of) else {
            continue;
        };
        if id < below {
            if let Err(e) = fs::remove_dir_all(entry.path()) {
                log::warn!(
                    "cannot delete the old checkpoint {}: {e}",
                    entry.path().display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "pslite-ckpt-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn atomic_writes_scans_and_prunes() {
        let dir = temp_dir("disk");
        let file = checkpoint_dir(&dir, 3).join(server_file_name(0));
        write_atomic(&file, b"hello").unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"hello");
        assert!(
            !file.with_extension("ckpt.tmp").exists(),
            "no temporary left"
        );
        write_atomic(&checkpoint_dir(&dir, 3).join(MANIFEST), b"m").unwrap();
        write_atomic(&checkpoint_dir(&dir, 4).join(server_file_name(0)), b"x").unwrap();
        fs::create_dir_all(dir.join("not-a-checkpoint")).unwrap();
        let found = scan(&dir).unwrap();
        assert_eq!(found.iter().map(|f| f.id).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(found[0].manifest, Some(Ok(Bytes::from_static(b"m"))));
        assert_eq!(found[1].manifest, None, "checkpoint 4 never completed");

        let read = perform(&Io::Read {
            paths: vec![vec![checkpoint_dir(&dir, 9).join("nope"), file.clone()]],
        });
        assert_eq!(
            read,
            IoResult::Read(vec![(file.clone(), Bytes::from_static(b"hello"))])
        );
        let IoResult::Failed(why) = perform(&Io::Read {
            paths: vec![vec![checkpoint_dir(&dir, 9).join("nope")]],
        }) else {
            panic!("a missing file was read");
        };
        assert!(why.contains("missing") && why.contains("nope"), "{why}");

        prune(&dir, 4);
        assert_eq!(
            scan(&dir).unwrap().iter().map(|f| f.id).collect::<Vec<_>>(),
            [4]
        );
        assert_eq!(scan(&dir.join("absent")).unwrap(), Vec::new());
        fs::remove_dir_all(&dir).unwrap();
    }
}
