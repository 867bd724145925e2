//! One segment mapped into this process, and its header.
//!
//! The header is the segment's first [`HEADER`] bytes: magic, token and
//! data capacity (written by the sender before the first descriptor
//! leaves), then [`SLOTS`] slots of two words each (a receiving process's
//! pid and its counting word, see `slot.rs`). Another process maps the same
//! bytes and may write them at any time (a peer with a bug, or a forged
//! one), so no Rust reference to a header structure is ever made: every
//! header word is read and written as an [`AtomicU64`] at its offset.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::track::Registration;

/// The header's bytes before the data area (one page: the data is aligned
/// for every element type).
pub(super) const HEADER: usize = 4096;
/// Layout 2: one slot per receiving process (layout 1 had one state word).
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"pslshm02");

const MAGIC_AT: usize = 0;
const TOKEN_AT: usize = 8;
const CAPACITY_AT: usize = 16;
/// Where the slots begin (a reserved word before them).
const SLOTS_AT: usize = 32;
/// Bytes per slot: its pid word and its counting word.
const SLOT_BYTES: usize = 16;
/// Receiving processes one segment can address at once.
pub(super) const SLOTS: usize = (HEADER - SLOTS_AT) / SLOT_BYTES;

/// A shared mapping of one whole segment (header and data area).
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// On a receiver: the mapping's entry in the registry of peer segments
    /// (see `track.rs`), removed before the memory is unmapped.
    foreign: Option<Registration>,
}

// SAFETY: the mapping is plain shared memory; every header access is
// atomic, and data areas are written only by the sender while no slot
// counts a descriptor or a view of the content, and read only by claimers.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes (at least [`HEADER`]) of `fd` shared, read-write.
    pub(super) fn new(fd: &OwnedFd, len: usize) -> std::io::Result<Mapping> {
        if len <= HEADER {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: a fresh mapping of a file we hold open; the result is
        // checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Mapping {
            ptr,
            len,
            foreign: None,
        })
    }

    /// The header word at byte `at`.
    fn word(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at % 8 == 0 && at + 8 <= HEADER);
        // SAFETY: the mapping is page-aligned and longer than HEADER, so
        // `at` is an aligned u64 inside it, valid while `self` lives; every
        // access to a header word, in any process, is atomic.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(at).cast::<u64>()) }
    }

    /// The header's magic number.
    pub(super) fn magic(&self) -> u64 {
        self.word(MAGIC_AT).load(Ordering::Acquire)
    }

    /// The header's token.
    pub(super) fn token(&self) -> u64 {
        self.word(TOKEN_AT).load(Ordering::Acquire)
    }

    /// The data capacity the header states.
    pub(super) fn stated_capacity(&self) -> u64 {
        self.word(CAPACITY_AT).load(Ordering::Acquire)
    }

    /// Writes a fresh segment's header (its slots are zero: a new memfd
    /// reads as zeros); the magic last, so a header with the magic is whole.
    pub(super) fn write_header(&self, token: u64) {
        self.word(TOKEN_AT).store(token, Ordering::Relaxed);
        self.word(CAPACITY_AT)
            .store(self.capacity() as u64, Ordering::Relaxed);
        self.word(MAGIC_AT).store(MAGIC, Ordering::Release);
    }

    /// Slot `i`'s pid word: the receiving process it is given to (0: free).
    pub(super) fn slot_pid(&self, i: usize) -> &AtomicU64 {
        assert!(i < SLOTS);
        self.word(SLOTS_AT + i * SLOT_BYTES)
    }

    /// Slot `i`'s counting word (see `slot.rs`).
    pub(super) fn slot_word(&self, i: usize) -> &AtomicU64 {
        assert!(i < SLOTS);
        self.word(SLOTS_AT + i * SLOT_BYTES + 8)
    }

    /// The slot given to process `pid`, if any.
    pub(super) fn slot_of(&self, pid: u32) -> Option<usize> {
        (0..SLOTS).find(|&i| self.slot_pid(i).load(Ordering::Acquire) == u64::from(pid))
    }

    /// The data area's size.
    pub(super) fn capacity(&self) -> usize {
        self.len - HEADER
    }

    /// The data area.
    pub(super) fn data(&self) -> *mut u8 {
        // SAFETY: HEADER < len.
        unsafe { self.ptr.as_ptr().add(HEADER) }
    }

    /// The mapped addresses.
    pub(super) fn range(&self) -> (usize, usize) {
        let start = self.ptr.as_ptr() as usize;
        (start, start + self.len)
    }

    /// Keeps `registration` while mapped (a receiver's peer segment).
    pub(super) fn set_foreign(&mut self, registration: Registration) {
        self.foreign = Some(registration);
    }

    /// The registration of a peer's segment, if this is one.
    pub(super) fn foreign(&self) -> Option<&Registration> {
        self.foreign.as_ref()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Out of the registry before the addresses can be reused.
        self.foreign.take();
        // SAFETY: unmaps exactly what `new` mapped; no reference outlives
        // the mapping (views and leases hold an Arc to it).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast::<libc::c_void>(), self.len);
        }
    }
}
