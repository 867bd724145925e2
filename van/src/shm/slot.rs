//! The slot protocol: how a sender and its receiving processes share one
//! segment's content without locks.
//!
//! A slot's word packs the generation of the content it counts (high 32
//! bits), descriptors sent and not yet claimed (16 bits) and views claimed
//! and not yet released (low 16 bits). It changes only by compare-and-swap:
//! - the sender counts a descriptor before it leaves ([`count`]), and gives
//!   it back if the message never left ([`Lease::abandon`]);
//! - the receiver turns a descriptor into a view ([`claim`]: the generation
//!   must match and a descriptor must be outstanding), and releases the
//!   view when its last reference goes ([`release`]);
//! - the sender takes back descriptors never claimed, and the counts of a
//!   receiver that is gone (`Segment::reclaim` in `pool.rs`).
//!
//! The content may be overwritten only while every slot is [`idle`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::mapping::Mapping;

/// Descriptors in flight plus views held, per slot (16 bits each).
const MAX_REFS: u64 = 0xffff;

/// A slot's word for generation `gen` with `pending` descriptors in flight
/// and `held` views.
pub(super) fn pack(gen: u32, pending: u64, held: u64) -> u64 {
    u64::from(gen) << 32 | pending << 16 | held
}

/// (generation, pending, held) of a slot's word.
pub(super) fn unpack(word: u64) -> (u32, u64, u64) {
    ((word >> 32) as u32, word >> 16 & 0xffff, word & 0xffff)
}

/// Whether a slot's word counts nothing in flight or held.
pub(super) fn idle(word: u64) -> bool {
    word & 0xffff_ffff == 0
}

/// Changes a slot's word by `f` (compare-and-swap, retried while others
/// change it); false when `f` refuses the current value.
pub(super) fn update(word: &AtomicU64, f: impl FnMut(u64) -> Option<u64>) -> bool {
    word.fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
        .is_ok()
}

/// Counts one more descriptor of generation `gen` in `slot` (the sender,
/// before it leaves); false when the slot counts too many.
pub(super) fn count(map: &Mapping, slot: usize, gen: u32) -> bool {
    update(map.slot_word(slot), |cur| {
        let (g, pending, held) = unpack(cur);
        if g == gen {
            (pending + held < MAX_REFS).then(|| pack(gen, pending + 1, held))
        } else {
            // Counts of an older content are not ours to touch.
            idle(cur).then(|| pack(gen, 1, 0))
        }
    })
}

/// Claims one descriptor of generation `gen` counted in `slot` (the
/// receiver): the content stays until the claim is released.
pub(super) fn claim(map: &Mapping, slot: usize, gen: u32) -> bool {
    update(map.slot_word(slot), |cur| {
        let (g, pending, held) = unpack(cur);
        (g == gen && pending > 0 && held < MAX_REFS).then(|| pack(g, pending - 1, held + 1))
    })
}

/// Releases one view of generation `gen` in `slot`. Nothing to release if
/// the sender took the count back (it thought this process gone).
pub(super) fn release(map: &Mapping, slot: usize, gen: u32) {
    update(map.slot_word(slot), |cur| {
        let (g, pending, held) = unpack(cur);
        (g == gen && held > 0).then(|| pack(g, pending, held - 1))
    });
}

/// A descriptor sent for one frame: give it back with [`Lease::abandon`] if
/// its message does not leave.
pub struct Lease {
    pub(super) map: Arc<Mapping>,
    pub(super) slot: usize,
    pub(super) generation: u32,
}

impl Lease {
    /// Gives the descriptor's count back (its message never left).
    pub fn abandon(self) {
        update(self.map.slot_word(self.slot), |cur| {
            let (g, pending, held) = unpack(cur);
            (g == self.generation && pending > 0).then(|| pack(g, pending - 1, held))
        });
    }
}
