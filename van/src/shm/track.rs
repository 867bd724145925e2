//! What the pool knows about a frame from its address alone (a `Bytes`
//! says nothing of its owner): whether it lies in a live buffer that
//! registered itself ([`TrackedVec`]), or in a peer's segment this process
//! maps and whether that peer is gone.
//!
//! Both registries hold [`Registration`]s: made when the range appears,
//! removed when the value that owns it is dropped, so no caller has to
//! remember to unregister.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytemuck::Pod;

use super::ranges::Ranges;
use super::MIN_FRAME;

/// Buffers that said they live ([`TrackedVec`]).
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

/// A vector of plain values that the shared-memory pool may send again
/// without a copy while it lives: made at least [`MIN_FRAME`] bytes long,
/// it registers its buffer, and it unregisters it when dropped, before the
/// memory is freed. A pool then needs no clone of it to know its bytes are
/// unchanged, so it never keeps an app's dropped array alive. Its values
/// cannot change: it gives out shared references only.
///
/// `SArray` makes one for every array it takes over:
///
/// ```
/// use bytes::Bytes;
/// use pslite_van::shm::TrackedVec;
///
/// let values = Bytes::from_owner(TrackedVec::new(vec![1.5f32; 100_000]));
/// assert_eq!(values.len(), 400_000);
/// ```
pub struct TrackedVec<T> {
    registration: Option<Registration>,
    values: Vec<T>,
}

impl<T: Pod> TrackedVec<T> {
    /// Takes `values` over, registering them if they are large enough to
    /// travel through shared memory.
    pub fn new(values: Vec<T>) -> TrackedVec<T> {
        let bytes: &[u8] = bytemuck::cast_slice(&values);
        let registration = (bytes.len() >= MIN_FRAME).then(|| {
            let start = bytes.as_ptr() as usize;
            Registration::new(&TRACKED, start, start + bytes.len())
        });
        TrackedVec {
            registration,
            values,
        }
    }

    /// The values.
    pub fn values(&self) -> &[T] {
        &self.values
    }

    /// Whether the buffer is registered (it is large enough).
    pub fn is_tracked(&self) -> bool {
        self.registration.is_some()
    }
}

impl<T: Pod> AsRef<[u8]> for TrackedVec<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.values)
    }
}

impl<T> Drop for TrackedVec<T> {
    fn drop(&mut self) {
        // Unregistered before `values` (dropped after this) frees the memory.
        self.registration.take();
    }
}

/// Registers `start..end` as a live buffer (tests: a buffer at a fixed
/// address, rewritten between registrations).
#[cfg(test)]
pub(super) fn register_tracked(start: usize, end: usize) -> Registration {
    Registration::new(&TRACKED, start, end)
}
