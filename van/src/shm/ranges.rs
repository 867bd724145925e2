//! Process-wide registries of address ranges, each with a flag: the
//! buffers apps registered as alive ([`super::track`]) and the peers'
//! segments this process maps (flagged once their sender is gone). The
//! pool asks them about a frame by its address alone, as a `Bytes` says
//! nothing of its owner.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use pslite_proto::lock;

/// Disjoint ranges by start address: (end, flag).
pub(super) struct Ranges(Mutex<BTreeMap<usize, (usize, Arc<AtomicBool>)>>);

impl Ranges {
    pub(super) const fn new() -> Ranges {
        Ranges(Mutex::new(BTreeMap::new()))
    }

    /// Registers `start..end` with `flag` (replacing a range that started
    /// there: its owner is about to forget it).
    pub(super) fn insert(&self, start: usize, end: usize, flag: &Arc<AtomicBool>) {
        lock(&self.0).insert(start, (end, Arc::clone(flag)));
    }

    /// Forgets the range at `start` if it is still the one with `flag`.
    pub(super) fn remove(&self, start: usize, flag: &Arc<AtomicBool>) {
        let mut map = lock(&self.0);
        if map.get(&start).is_some_and(|(_, f)| Arc::ptr_eq(f, flag)) {
            map.remove(&start);
        }
    }

    /// The flag of the range holding all of `ptr..ptr + len`.
    pub(super) fn find(&self, ptr: usize, len: usize) -> Option<Arc<AtomicBool>> {
        let map = lock(&self.0);
        let (_, (end, flag)) = map.range(..=ptr).next_back()?;
        (ptr.saturating_add(len) <= *end).then(|| Arc::clone(flag))
    }
}
