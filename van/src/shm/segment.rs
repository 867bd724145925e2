//! One segment of a sender's pool: a memfd mapped with its header and
//! slots, what its data area holds (a frame kept to send again, and how
//! the pool knows that frame is unchanged), and the counts of the
//! receivers it was sent to.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use pslite_proto::shm::ShmFrame;

use super::host::is_gone;
use super::mapping::{Mapping, HEADER, SLOTS};
use super::slot::{count, idle, pack, unpack, Lease};
use super::track::foreign_gone;
use super::{ShmError, HELD_IDLE, NAME_PREFIX, UNCLAIMED_LIMIT};

/// What a segment's data area holds, as its sender sees it.
pub(super) enum Content {
    /// Nothing kept: reusable once no slot counts anything.
    Empty,
    /// Being copied in by one sender.
    Filling,
    /// A copy of the frame at `ptr`, `len` bytes, sent again without a copy
    /// while `life` says that frame lives.
    Frame { ptr: usize, len: usize, life: Life },
}

/// How the pool knows a cached frame's bytes are still the same.
pub(super) enum Life {
    /// The app's buffer registered itself ([`super::Tracked`]): the flag
    /// turns false before its memory is freed.
    Tracked(Arc<AtomicBool>),
    /// A clone the pool holds keeps the buffer alive (and so unchanged:
    /// `Bytes` are immutable); let go once it is the only one left
    /// ([`Bytes::is_unique`]) or after [`HELD_IDLE`] unused.
    Held(Bytes),
}

/// One segment of a sender's pool.
pub(super) struct Segment {
    pub(super) map: Arc<Mapping>,
    pub(super) fd: OwnedFd,
    pub(super) token: u64,
    /// The content's generation (1, 2 ...; bumped at every refill).
    pub(super) generation: u32,
    pub(super) content: Content,
    /// Slots given to receiving processes: (pid, slot index).
    pub(super) slots: Vec<(u32, usize)>,
    /// When a descriptor last left, and when the content was last sent.
    pub(super) sent_at: Instant,
}

impl Segment {
    pub(super) fn create(capacity: usize, seq: u64, now: Instant) -> Result<Segment, ShmError> {
        let os_err = |what| {
            move |_| ShmError::Create {
                what,
                source: std::io::Error::last_os_error(),
            }
        };
        let name = format!("{NAME_PREFIX}{}-{seq}", std::process::id());
        let name = CString::new(name).map_err(|_| ShmError::Create {
            what: "naming the memfd",
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        // SAFETY: a valid C string; the result is checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os_err("memfd_create")(()));
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = HEADER + capacity;
        // SAFETY: ftruncate on our fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os_err("ftruncate")(()));
        }
        let map = Mapping::new(&fd, len).map_err(|source| ShmError::Create {
            what: "mmap",
            source,
        })?;
        let token = rand::random::<u64>() | 1;
        map.write_header(token);
        Ok(Segment {
            map: Arc::new(map),
            fd,
            token,
            generation: 0,
            content: Content::Empty,
            slots: Vec::new(),
            sent_at: now,
        })
    }

    /// Whether no receiver holds or is about to claim the content.
    pub(super) fn is_idle(&self) -> bool {
        self.slots
            .iter()
            .all(|&(_, i)| idle(self.map.slot_word(i).load(Ordering::Acquire)))
    }

    /// Whether process `pid` holds or is about to claim the content.
    pub(super) fn is_held_by(&self, pid: u32) -> bool {
        self.slots
            .iter()
            .any(|&(p, i)| p == pid && !idle(self.map.slot_word(i).load(Ordering::Acquire)))
    }

    /// Whether the data area may be written with a new frame.
    pub(super) fn is_free(&self) -> bool {
        matches!(self.content, Content::Empty) && self.is_idle()
    }

    /// Whether the content is a copy of `frame` (`life`: its registration).
    pub(super) fn holds(&self, key: (usize, usize), life: Option<&Arc<AtomicBool>>) -> bool {
        match &self.content {
            Content::Frame { ptr, len, life: l } if (*ptr, *len) == key => match l {
                Life::Held(_) => true,
                Life::Tracked(flag) => {
                    life.is_some_and(|f| Arc::ptr_eq(f, flag)) && flag.load(Ordering::Acquire)
                }
            },
            _ => false,
        }
    }

    /// Whether the cached frame is gone (or let go): the content may be
    /// overwritten once idle.
    pub(super) fn is_stale(&self, now: Instant) -> bool {
        match &self.content {
            Content::Frame {
                life: Life::Tracked(flag),
                ..
            } => !flag.load(Ordering::Acquire),
            Content::Frame {
                life: Life::Held(b),
                ..
            } => {
                b.is_unique()
                    || now.duration_since(self.sent_at) >= HELD_IDLE
                    || foreign_gone(b.as_ptr() as usize)
            }
            _ => false,
        }
    }

    /// Counts one more descriptor of the current content to process `pid`
    /// (a slot is given to it on first use); `None` when no slot is left
    /// or the slot counts too many.
    pub(super) fn address(&mut self, pid: u32, now: Instant) -> Option<Lease> {
        let slot = match self.slots.iter().find(|&&(p, _)| p == pid) {
            Some(&(_, i)) => i,
            None => {
                let i = (0..SLOTS).find(|&i| self.slots.iter().all(|&(_, u)| u != i))?;
                self.map.slot_word(i).store(0, Ordering::Release);
                self.map
                    .slot_pid(i)
                    .store(u64::from(pid), Ordering::Release);
                self.slots.push((pid, i));
                i
            }
        };
        let gen = self.generation;
        if !count(&self.map, slot, gen) {
            return None;
        }
        self.sent_at = now;
        Some(Lease {
            map: Arc::clone(&self.map),
            slot,
            generation: gen,
        })
    }

    pub(super) fn descriptor(&self, index: u32, length: usize) -> ShmFrame {
        ShmFrame {
            index,
            fd: self.fd.as_raw_fd(),
            token: self.token,
            generation: u64::from(self.generation),
            offset: 0,
            length: length as u64,
        }
    }

    /// Takes back counts of receivers that are gone, and descriptors sent
    /// long ago and never claimed (their messages were lost).
    pub(super) fn reclaim(&mut self, now: Instant) {
        let map = Arc::clone(&self.map);
        let old = now.duration_since(self.sent_at) >= UNCLAIMED_LIMIT;
        self.slots.retain(|&(pid, i)| {
            let word = map.slot_word(i);
            let current = word.load(Ordering::Acquire);
            if is_gone(pid) {
                if !idle(current) {
                    log::debug!("shared memory: taking back a segment held by process {pid} (gone)");
                }
                word.store(0, Ordering::Release);
                map.slot_pid(i).store(0, Ordering::Release);
                return false;
            }
            let (gen, pending, held) = unpack(current);
            if old && pending > 0 {
                // A claim racing with this fails the CAS: retried next time.
                let taken = word.compare_exchange(
                    current,
                    pack(gen, 0, held),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
                if taken.is_ok() {
                    log::debug!(
                        "shared memory: taking back {pending} descriptors to process {pid} never claimed"
                    );
                }
            }
            true
        });
    }
}
