//! What the pool knows about a frame from its address alone (a `Bytes`
//! says nothing of its owner): whether it lies in a live buffer that
//! registered itself ([`Tracked`]), or in a peer's segment this process
//! maps and whether that peer is gone.
//!
//! Both registries hold [`Registration`]s: made when the range appears,
//! removed when the value that owns it is dropped, so no caller has to
//! remember to unregister.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::ranges::Ranges;
use super::MIN_FRAME;

/// Buffers that said they live ([`Tracked`]).
static TRACKED: Ranges = Ranges::new();

/// Peers' segments this process maps (flag false once their sender is
/// gone).
static FOREIGN: Ranges = Ranges::new();

/// One range in a registry, with a flag that says it is valid; dropping it
/// clears the flag and removes the range.
pub(super) struct Registration {
    ranges: &'static Ranges,
    start: usize,
    valid: Arc<AtomicBool>,
}

impl Registration {
    fn new(ranges: &'static Ranges, start: usize, end: usize) -> Registration {
        let valid = Arc::new(AtomicBool::new(true));
        ranges.insert(start, end, &valid);
        Registration {
            ranges,
            start,
            valid,
        }
    }

    /// Marks the range invalid while it stays registered (a peer segment
    /// whose sender is gone).
    pub(super) fn invalidate(&self) {
        self.valid.store(false, Ordering::Release);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.valid.store(false, Ordering::Release);
        self.ranges.remove(self.start, &self.valid);
    }
}

/// Registers a peer's segment mapped at `start..end`.
pub(super) fn register_foreign(start: usize, end: usize) -> Registration {
    Registration::new(&FOREIGN, start, end)
}

/// The validity flag of the live registered buffer holding `len` bytes at
/// `ptr`: false once the buffer is about to be freed.
pub(super) fn tracked(ptr: usize, len: usize) -> Option<Arc<AtomicBool>> {
    TRACKED
        .find(ptr, len)
        .filter(|flag| flag.load(Ordering::Acquire))
}

/// Whether `ptr` lies in a peer's segment whose sender is gone: a frame
/// received from it and sent on (a server answering with the keys it was
/// sent) must not keep the dead peer's memory mapped.
pub(super) fn foreign_gone(ptr: usize) -> bool {
    FOREIGN
        .find(ptr, 1)
        .is_some_and(|valid| !valid.load(Ordering::Acquire))
}

/// An owner of immutable bytes (a vector, or memory another runtime owns)
/// that the shared-memory pool may send again without a copy while it
/// lives: made with at least [`MIN_FRAME`] bytes, it registers them, and it
/// unregisters them when dropped, before the owner frees them. A pool then
/// needs no clone of it to know its bytes are unchanged, so it never keeps
/// an app's dropped array alive.
///
/// The owner promises what [`bytes::Bytes::from_owner`] needs: its bytes do
/// not move when it moves (a `Vec`'s heap buffer does not), and they do not
/// change while it lives. `SArray` makes one for every array it takes over:
///
/// ```
/// use bytes::Bytes;
/// use pslite_van::shm::Tracked;
///
/// let values = Bytes::from_owner(Tracked::new(vec![7u8; 100_000]));
/// assert_eq!(values.len(), 100_000);
/// ```
pub struct Tracked<O: AsRef<[u8]>> {
    registration: Option<Registration>,
    owner: O,
}

impl<O: AsRef<[u8]>> Tracked<O> {
    /// Takes `owner` over, registering its bytes if they are large enough
    /// to travel through shared memory.
    pub fn new(owner: O) -> Tracked<O> {
        let bytes = owner.as_ref();
        let registration = (bytes.len() >= MIN_FRAME).then(|| {
            let start = bytes.as_ptr() as usize;
            Registration::new(&TRACKED, start, start + bytes.len())
        });
        Tracked {
            registration,
            owner,
        }
    }

    /// The owner.
    pub fn owner(&self) -> &O {
        &self.owner
    }

    /// Whether the bytes are registered (they are large enough).
    pub fn is_tracked(&self) -> bool {
        self.registration.is_some()
    }
}

impl<O: AsRef<[u8]>> AsRef<[u8]> for Tracked<O> {
    fn as_ref(&self) -> &[u8] {
        self.owner.as_ref()
    }
}

impl<O: AsRef<[u8]>> Drop for Tracked<O> {
    fn drop(&mut self) {
        // Unregistered before `owner` (dropped after this) frees the bytes.
        self.registration.take();
    }
}

/// Registers `start..end` as a live buffer (tests: a buffer at a fixed
/// address, rewritten between registrations).
#[cfg(test)]
pub(super) fn register_tracked(start: usize, end: usize) -> Registration {
    Registration::new(&TRACKED, start, end)
}
