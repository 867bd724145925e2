//! Checkpoints (`PS_CHECKPOINT_DIR`): the protocol is
//! [`pslite_van_core::checkpoint`]'s (re-exported here); [`disk`] carries
//! out the file operations it asks for.

pub use pslite_van_core::checkpoint::*;

pub mod disk;

/// A scheduler's start with `cfg`: locks the directory for this job, reads
/// what it holds, decides what to restore ([`catalog`]; a new job's
/// identity is drawn here), deletes checkpoints that never completed, and
/// says which checkpoint the job resumes at the
/// default log level. The lock is held as long as the returned value lives.
pub fn open_dir(
    cfg: &CheckpointConfig,
    ranges: &[(u64, u64)],
) -> Result<(Catalog, disk::DirLock), String> {
    let lock = disk::lock(&cfg.dir)?;
    let found = disk::scan(&cfg.dir)?;
    let latest = disk::read_latest(&cfg.dir)?;
    let new_job = format!("{:032x}", rand::random::<u128>());
    let catalog = catalog(&cfg.dir, &found, latest, ranges, cfg.fresh, new_job)?;
    for &id in &catalog.leftovers {
        let dir = disk::checkpoint_dir(&cfg.dir, id);
        log::warn!(
            "checkpoint {id} never completed (it failed, or the job stopped while writing it): \
             deleting {}",
            dir.display()
        );
        disk::remove(&dir);
    }
    log::warn!("scheduler: {}", catalog.said);
    Ok((catalog, lock))
}
