//! Checkpoints on the file system: writing a file atomically, reading one
//! back, listing a directory, and deleting old checkpoints. The only code
//! of the checkpoint protocol that does I/O; the driver ([`crate::Van`])
//! calls it for the core's [`Io`] requests (the layout and the requests are
//! `pslite_van_core::checkpoint::disk`'s), and the harness replaces it with
//! a map of paths to bytes.
//!
//! A file is written as `NAME.tmp` in its directory, flushed to disk
//! (fsync), renamed to `NAME`, and the directory is flushed too, so after a
//! crash a name holds either nothing or a whole file. `LATEST` is written
//! (the same way) right after a manifest: it names the newest complete
//! checkpoint, so a deleted manifest is noticed, not skipped.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
pub use pslite_van_core::checkpoint::disk::*;

/// Reads `dir/LATEST`: the job and checkpoint it names, `None` if there is
/// none, an error naming it if it cannot be read or makes no sense.
pub fn read_latest(dir: &Path) -> Result<Option<(String, u64)>, String> {
    let path = dir.join(LATEST);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["job", job, "checkpoint", id] => match id.parse() {
            Ok(id) => Ok(Some((job.to_string(), id))),
            Err(_) => Err(format!("{} is corrupt: {text:?}", path.display())),
        },
        _ => Err(format!("{} is corrupt: {text:?}", path.display())),
    }
}

/// `dir/LOCK`, locked for as long as this value lives (the kernel lets go
/// when the process ends, killed or not).
#[derive(Debug)]
pub struct DirLock {
    _file: fs::File,
}

/// Locks `dir` for one job's scheduler (creating it if needed): a second
/// job started on the same directory is refused, naming the process that
/// holds it.
pub fn lock(dir: &Path) -> Result<DirLock, String> {
    use std::os::fd::AsRawFd;
    fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create PS_CHECKPOINT_DIR {}: {e}", dir.display()))?;
    let path = dir.join(LOCK);
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock(2) on a descriptor this function owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !locked {
        let holder = fs::read_to_string(&path).unwrap_or_default();
        return Err(format!(
            "PS_CHECKPOINT_DIR {} is in use by another job ({} holds {}): give each job a \
             directory of its own",
            dir.display(),
            holder.trim().strip_prefix("pid ").map_or_else(
                || "its scheduler".to_string(),
                |pid| format!("the scheduler with pid {pid}")
            ),
            path.display()
        ));
    }
    let _ = file.set_len(0);
    let _ = writeln!(file, "pid {}", std::process::id());
    Ok(DirLock { _file: file })
}

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
        Io::Prune { dir, below, job } => {
            prune(dir, *below, job);
            IoResult::Done
        }
        Io::Complete {
            manifest,
            bytes,
            latest,
            text,
        } => {
            let written = write_atomic(manifest, bytes)
                .map_err(|e| format!("cannot write {}: {e}", manifest.display()))
                .and_then(|()| {
                    write_atomic(latest, text.as_bytes())
                        .map_err(|e| format!("cannot write {}: {e}", latest.display()))
                });
            match written {
                Ok(()) => IoResult::Done,
                Err(why) => IoResult::Failed(why),
            }
        }
        Io::Remove { dir } => {
            remove(dir);
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

/// Deletes checkpoint directory `dir` (a failed checkpoint's), if there.
pub fn remove(dir: &Path) {
    match fs::remove_dir_all(dir) {
        Ok(()) => log::info!("deleted the failed checkpoint's {}", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("cannot delete {}: {e}", dir.display()),
    }
}

/// Whether checkpoint directory `path` belongs to job `job`: its manifest
/// says so, or (without one: a server's own directory, or a checkpoint that
/// never completed) every file in it is named after the job.
fn of_job(path: &Path, job: &str) -> bool {
    if let Ok(bytes) = fs::read(path.join(MANIFEST)) {
        return super::format::decode_manifest(&bytes).is_ok_and(|m| m.job == job);
    }
    let tag = job_tag(job);
    fs::read_dir(path).is_ok_and(|entries| {
        entries
            .flatten()
            .all(|e| e.file_name().to_string_lossy().contains(&tag))
    })
}

/// Deletes the checkpoints of job `job` in `dir` whose id is below `below`;
/// another job's stay.
pub fn prune(dir: &Path, below: u64, job: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().and_then(id_of) else {
            continue;
        };
        if id < below && of_job(&entry.path(), job) {
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
        let file = checkpoint_dir(&dir, 3).join(server_file_name(3, 0, &[0], "feedbeef00"));
        write_atomic(&file, b"hello").unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"hello");
        assert!(
            !file.with_extension("ckpt.tmp").exists(),
            "no temporary left"
        );
        write_atomic(&checkpoint_dir(&dir, 3).join(MANIFEST), b"m").unwrap();
        write_atomic(
            &checkpoint_dir(&dir, 4).join(server_file_name(4, 0, &[0], "feedbeef00")),
            b"x",
        )
        .unwrap();
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

        // Another job's checkpoints stay; a manifest that does not decode is
        // no job's.
        prune(&dir, 5, "0123456789");
        assert_eq!(scan(&dir).unwrap().len(), 2);
        prune(&dir, 4, "feedbeef00");
        assert_eq!(
            scan(&dir).unwrap().len(),
            2,
            "checkpoint 3's manifest is no manifest"
        );
        fs::remove_file(checkpoint_dir(&dir, 3).join(MANIFEST)).unwrap();
        prune(&dir, 4, "feedbeef00");
        assert_eq!(
            scan(&dir).unwrap().iter().map(|f| f.id).collect::<Vec<_>>(),
            [4]
        );
        assert_eq!(scan(&dir.join("absent")).unwrap(), Vec::new());
        remove(&checkpoint_dir(&dir, 4));
        assert_eq!(scan(&dir).unwrap(), Vec::new());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_is_locked_by_one_job_and_latest_reads_back() {
        let dir = temp_dir("lock");
        let held = lock(&dir).unwrap();
        let why = lock(&dir).unwrap_err();
        assert!(
            why.contains("in use by another job")
                && why.contains(&format!("pid {}", std::process::id())),
            "{why}"
        );
        drop(held);
        let again = lock(&dir).unwrap();
        assert_eq!(read_latest(&dir), Ok(None));
        write_atomic(&dir.join(LATEST), latest_text("abc", 7).as_bytes()).unwrap();
        assert_eq!(read_latest(&dir), Ok(Some(("abc".into(), 7))));
        fs::write(dir.join(LATEST), "nonsense").unwrap();
        assert!(read_latest(&dir).unwrap_err().contains("corrupt"));
        drop(again);
        fs::remove_dir_all(&dir).unwrap();
    }
}
