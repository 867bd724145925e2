//! The shared-memory data path between pslite nodes of one host.
//!
//! Two pslite nodes share a host when their [`host_identity`] strings are
//! equal: the same boot, the same user and the same network, pid, mount,
//! user and IPC namespaces (nodes in separate network namespaces count as
//! separate hosts, as the multi-host tests want). Each node advertises it in
//! its node-table entry (`PBNode.host`, with `PBNode.pid`) unless
//! `PS_SHM=0`; C++ nodes send neither, so they never see shared memory.
//!
//! **Segments.** A sender keeps a [`Pool`] of segments, each an anonymous
//! `memfd` (named `pslite-shm-<pid>-<n>`, nothing in `/dev/shm`) holding a
//! 4 KiB header and one data area. A data frame of at least
//! [`MIN_FRAME`] bytes to a same-host peer is copied into a free segment
//! (one copy) and the ZeroMQ message carries an empty frame in its place
//! plus a descriptor (`PBMeta.shm`: fd number, token, generation, offset,
//! length). Segments are created on first need (per power-of-two size
//! class) and reused; their pages stay mapped, so a reused segment costs no
//! page faults. When the pool holds [`DEFAULT_POOL_BYTES`] and none is free,
//! the frame goes over ZeroMQ as before: sending never waits for memory.
//!
//! **Send once.** `Bytes` are immutable, so a frame sent again (the same
//! address and length, the buffer alive since) holds the same bytes: the
//! pool remembers which segment holds a copy of which frame and sends such
//! a frame again, to any same-host peer, as a descriptor only (ps-lite
//! programs push the same key arrays every step). It knows the buffer lives
//! through a registration ([`track`], made by every large `SArray`: dropped
//! before the buffer is freed), or else by holding a clone of the frame
//! (let go when it is the last one, after [`HELD_IDLE`] unused, or when the
//! pool needs room). A segment's content is overwritten only when its frame
//! is gone and no receiver holds or is about to claim it.
//!
//! **Slots.** Several receivers may hold one content at once: the header
//! has a slot per receiving process (its pid, written by the sender, and a
//! word counting, for the content's generation, descriptors sent but not
//! claimed and views held). The sender counts a descriptor before it
//! leaves; the receiver finds the slot with its own pid and claims by a
//! compare-and-swap (the generation must match and a descriptor must be
//! outstanding, so a replayed or stale descriptor fails); dropping the last
//! reference to the frame releases the claim by another compare-and-swap.
//!
//! **Receiving.** The receiver opens the segment once through
//! `/proc/<pid>/fd/<fd>` (the pid from the sender's node-table entry, never
//! from the descriptor), checks the link names a `pslite-shm-` memfd, maps
//! it, checks the header's magic, token and size, and keeps the mapping.
//! Each descriptor is then checked (bounds, slot, generation) and claimed;
//! the frame becomes a [`Bytes`] over the mapping (zero copies: the app's
//! `SArray` reads the segment in place). A descriptor that fails any check
//! is a [`ShmError`]: the van drops the message with a log line and counts
//! it; nothing is read out of bounds.
//!
//! **Crashes.** A memfd lives while a process holds its fd or a mapping of
//! it, so a killed sender's segments vanish once its receivers drop their
//! mappings (the receive loop forgets mappings of dead pids within a
//! second; a pool's held copy of a frame received from a dead sender and
//! sent on is let go at the pool's next send), and a killed receiver's slots are taken back by the sender
//! when it needs the memory (it checks each slot's pid). Descriptors sent
//! but never claimed (the message was lost) are taken back after
//! [`UNCLAIMED_LIMIT`] without a send.
//!
//! Trust: a same-host peer is a process of the same user, which could read
//! this process's memory anyway (ptrace); the checks protect against bugs
//! and forged descriptors, not against that user.

use std::collections::HashMap;
use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pslite_proto::shm::ShmFrame;
use pslite_proto::{lock, NodeId};

mod ranges;
use ranges::Ranges;

/// The name prefix of every segment's memfd.
pub const NAME_PREFIX: &str = "pslite-shm-";
/// Data frames at least this long travel through shared memory.
pub const MIN_FRAME: usize = 64 << 10;
/// The most segment memory one node's pool holds.
pub const DEFAULT_POOL_BYTES: usize = 1 << 30;
/// A segment sent but not claimed for this long is taken back.
pub const UNCLAIMED_LIMIT: Duration = Duration::from_secs(60);
/// A cached frame the pool keeps alive itself (one it cannot see die, see
/// [`Pool::send`]) is let go after this long without being sent again.
pub const HELD_IDLE: Duration = Duration::from_secs(10);

/// The header's bytes before the data area (one page: the data is aligned
/// for every element type).
const HEADER: usize = 4096;
/// The smallest data area (also the smallest size class).
const MIN_CAPACITY: usize = 64 << 10;
/// The largest data area: 2 GiB, the largest frame a node accepts.
const MAX_CAPACITY: usize = 1 << 31;
/// Layout 2: one slot per receiving process (layout 1 had one state word).
const MAGIC: u64 = u64::from_le_bytes(*b"pslshm02");
/// Receiving processes one segment can address at once.
const SLOTS: usize = (HEADER - 32) / std::mem::size_of::<Slot>();
/// Descriptors in flight plus views held, per slot (16 bits each).
const MAX_REFS: u64 = 0xffff;

/// A slot's word: the generation of the segment's content it counts (high
/// 32 bits), descriptors sent and not yet claimed (16 bits), views claimed
/// and not yet released (low 16 bits). Changed only by compare-and-swap.
fn pack(gen: u32, pending: u64, held: u64) -> u64 {
    u64::from(gen) << 32 | pending << 16 | held
}

fn unpack(word: u64) -> (u32, u64, u64) {
    ((word >> 32) as u32, word >> 16 & 0xffff, word & 0xffff)
}

/// Whether a slot's word counts nothing in flight or held.
fn idle(word: u64) -> bool {
    word & 0xffff_ffff == 0
}

/// Changes a slot's word by `f` (compare-and-swap, retried while others
/// change it); false when `f` refuses the current value.
fn update(word: &AtomicU64, f: impl FnMut(u64) -> Option<u64>) -> bool {
    word.fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
        .is_ok()
}

/// One receiving process's share of a segment: its pid (0 when the slot is
/// free; written by the sender) and its word.
#[repr(C)]
struct Slot {
    pid: AtomicU64,
    word: AtomicU64,
}

#[repr(C)]
struct Header {
    magic: u64,
    token: u64,
    capacity: u64,
    reserved: u64,
    slots: [Slot; SLOTS],
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER);

/// This process's host identity: equal for two processes iff each can map
/// the other's segments. It is a 64-bit FNV-1a digest (16 hex digits, so
/// that node tables stay small at hundreds of nodes) of the boot id, the
/// effective uid, the network, pid, mount, user and IPC namespaces, and the
/// segment layout (nodes of builds with another layout count as another
/// host and keep ZeroMQ).
/// `Err` says why shared memory is off.
pub fn host_identity() -> Result<String, String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map_err(|e| format!("cannot read /proc/sys/kernel/random/boot_id: {e}"))?;
    let mut id = boot.trim().to_string();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    id += &format!("/uid{uid}");
    for ns in ["net", "pid", "mnt", "user", "ipc"] {
        let link = std::fs::read_link(format!("/proc/self/ns/{ns}"))
            .map_err(|e| format!("cannot read /proc/self/ns/{ns}: {e}"))?;
        id += "/";
        id += &link.to_string_lossy();
    }
    id += &format!("/layout{MAGIC:x}");
    log::debug!("shared memory: host identity {id}");
    Ok(format!("{:016x}", fnv1a(id.as_bytes())))
}

/// 64-bit FNV-1a (stable across builds and platforms).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether this process may open `pid`'s file descriptors (the test a peer's
/// receiver will face on ours: same user, not hidden by `/proc` options).
pub fn can_reach(pid: u32) -> bool {
    pid != 0 && std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok()
}

/// Whether process `pid` is gone.
fn is_gone(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// A shared mapping of one whole segment (header and data area).
struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// On a receiver: set once the segment's sender is gone (registered in
    /// [`FOREIGN`] while mapped).
    gone: Option<Arc<AtomicBool>>,
}

// SAFETY: the mapping is plain shared memory; the header's slots are
// atomics, and data areas are written only by the sender while no slot
// counts a descriptor or a view of the content, and read only by claimers.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, read-write.
    fn new(fd: &OwnedFd, len: usize) -> std::io::Result<Mapping> {
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
        Ok(Mapping {
            ptr: ptr as *mut u8,
            len,
            gone: None,
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: every mapping is at least HEADER bytes, page-aligned.
        unsafe { &*(self.ptr as *const Header) }
    }

    fn slot(&self, i: usize) -> &Slot {
        &self.header().slots[i]
    }

    fn capacity(&self) -> usize {
        self.len - HEADER
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: HEADER < len.
        unsafe { self.ptr.add(HEADER) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(gone) = &self.gone {
            FOREIGN.remove(self.ptr as usize, gone);
        }
        // SAFETY: unmaps exactly what `new` mapped; no reference outlives
        // the mapping (views hold an Arc to it).
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

fn io_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// What a segment's data area holds, as its sender sees it.
enum Content {
    /// Nothing kept: reusable once no slot counts anything.
    Empty,
    /// Being copied in by one sender.
    Filling,
    /// A copy of the frame at `ptr`, `len` bytes, sent again without a copy
    /// while `life` says that frame lives.
    Frame { ptr: usize, len: usize, life: Life },
}

/// How the pool knows a cached frame's bytes are still the same.
enum Life {
    /// The app's buffer registered itself ([`Tracked`]): the flag turns
    /// false before its memory is freed.
    Tracked(Arc<AtomicBool>),
    /// A clone the pool holds keeps the buffer alive (and so unchanged:
    /// `Bytes` are immutable); let go once it is the only one left
    /// ([`Bytes::is_unique`]) or after [`HELD_IDLE`] unused.
    Held(Bytes),
}

/// One segment of a sender's pool.
struct Segment {
    map: Arc<Mapping>,
    fd: OwnedFd,
    token: u64,
    /// The content's generation (1, 2 ...; bumped at every refill).
    generation: u32,
    content: Content,
    /// Slots given to receiving processes: (pid, slot index).
    slots: Vec<(u32, usize)>,
    /// When a descriptor last left, and when the content was last sent.
    sent_at: Instant,
}

impl Segment {
    fn create(capacity: usize, seq: u64) -> Result<Segment, String> {
        let name = CString::new(format!("{NAME_PREFIX}{}-{seq}", std::process::id()))
            .map_err(|e| e.to_string())?;
        // SAFETY: a valid C string; the result is checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io_err("memfd_create"));
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = HEADER + capacity;
        // SAFETY: ftruncate on our fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io_err("ftruncate of a shared-memory segment"));
        }
        let map = Mapping::new(&fd, len).map_err(|e| format!("mmap: {e}"))?;
        let token = rand::random::<u64>() | 1;
        // SAFETY: the header is ours alone until the first descriptor leaves
        // (the slots are zero: a fresh memfd reads as zeros).
        unsafe {
            let h = map.ptr as *mut Header;
            (*h).magic = MAGIC;
            (*h).token = token;
            (*h).capacity = capacity as u64;
        }
        Ok(Segment {
            map: Arc::new(map),
            fd,
            token,
            generation: 0,
            content: Content::Empty,
            slots: Vec::new(),
            sent_at: Instant::now(),
        })
    }

    /// Whether no receiver holds or is about to claim the content.
    fn is_idle(&self) -> bool {
        self.slots
            .iter()
            .all(|&(_, i)| idle(self.map.slot(i).word.load(Ordering::Acquire)))
    }

    /// Whether the data area may be written with a new frame.
    fn is_free(&self) -> bool {
        matches!(self.content, Content::Empty) && self.is_idle()
    }

    /// Whether the content is a copy of `frame` (`life`: its registration).
    fn holds(&self, key: (usize, usize), life: Option<&Arc<AtomicBool>>) -> bool {
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
    fn is_stale(&self, now: Instant) -> bool {
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
    fn address(&mut self, pid: u32, now: Instant) -> Option<Lease> {
        let slot = match self.slots.iter().find(|&&(p, _)| p == pid) {
            Some(&(_, i)) => i,
            None => {
                let i = (0..SLOTS).find(|&i| self.slots.iter().all(|&(_, u)| u != i))?;
                let s = self.map.slot(i);
                s.word.store(0, Ordering::Release);
                s.pid.store(u64::from(pid), Ordering::Release);
                self.slots.push((pid, i));
                i
            }
        };
        let gen = self.generation;
        let counted = update(&self.map.slot(slot).word, |cur| {
            let (g, pending, held) = unpack(cur);
            if g == gen {
                (pending + held < MAX_REFS).then(|| pack(gen, pending + 1, held))
            } else {
                // Counts of an older content are not ours to touch.
                idle(cur).then(|| pack(gen, 1, 0))
            }
        });
        if !counted {
            return None;
        }
        self.sent_at = now;
        Some(Lease {
            map: Arc::clone(&self.map),
            slot,
            generation: gen,
        })
    }

    fn descriptor(&self, index: u32, length: usize) -> ShmFrame {
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
    fn reclaim(&mut self, now: Instant) {
        let map = Arc::clone(&self.map);
        let old = now.duration_since(self.sent_at) >= UNCLAIMED_LIMIT;
        self.slots.retain(|&(pid, i)| {
            let slot = map.slot(i);
            let word = slot.word.load(Ordering::Acquire);
            if is_gone(pid) {
                if !idle(word) {
                    log::debug!("shared memory: taking back a segment held by process {pid} (gone)");
                }
                slot.word.store(0, Ordering::Release);
                slot.pid.store(0, Ordering::Release);
                return false;
            }
            let (gen, pending, held) = unpack(word);
            if old && pending > 0 {
                // A claim racing with this fails the CAS: retried next time.
                if slot
                    .word
                    .compare_exchange(word, pack(gen, 0, held), Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    log::debug!(
                        "shared memory: taking back {pending} descriptors to process {pid} never claimed"
                    );
                }
            }
            true
        });
    }
}

/// The size class of a frame of `len` bytes.
fn class(len: usize) -> usize {
    len.max(MIN_CAPACITY).next_power_of_two()
}

#[derive(Default)]
struct PoolInner {
    segments: Vec<Segment>,
    /// Cached frames (address, length) by segment index.
    cached: HashMap<(usize, usize), usize>,
    bytes: usize,
    seq: u64,
}

impl PoolInner {
    /// Forgets cached frames that are gone.
    fn drop_stale(&mut self, now: Instant) {
        for seg in &mut self.segments {
            if seg.is_stale(now) {
                if let Content::Frame { ptr, len, .. } = seg.content {
                    self.cached.remove(&(ptr, len));
                }
                seg.content = Content::Empty;
            }
        }
    }

    /// Forgets the least recently sent cached frame of segments of
    /// `capacity` whose content no receiver holds; whether one was.
    fn evict_one(&mut self, capacity: usize) -> bool {
        let victim = self
            .segments
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.map.capacity() == capacity
                    && matches!(s.content, Content::Frame { .. })
                    && s.is_idle()
            })
            .min_by_key(|(_, s)| s.sent_at)
            .map(|(i, _)| i);
        let Some(i) = victim else {
            return false;
        };
        if let Content::Frame { ptr, len, .. } = self.segments[i].content {
            self.cached.remove(&(ptr, len));
        }
        self.segments[i].content = Content::Empty;
        true
    }

    fn free_segment(&self, capacity: usize) -> Option<usize> {
        self.segments
            .iter()
            .position(|s| s.map.capacity() == capacity && s.is_free())
    }
}

/// A sender's segments, and the frames they hold copies of.
pub struct Pool {
    inner: Mutex<PoolInner>,
    limit: usize,
    /// What the shared-memory path did (shared with the metrics endpoint).
    pub(crate) stats: Arc<ShmStats>,
}

/// What the shared-memory path did (process-wide per van).
#[derive(Default)]
pub struct ShmStats {
    /// Frames sent through shared memory.
    pub frames_sent: AtomicU64,
    /// Bytes sent through shared memory.
    pub bytes_sent: AtomicU64,
    /// Frames that went over ZeroMQ because no segment was free.
    pub fallbacks: AtomicU64,
    /// Frames received through shared memory.
    pub frames_received: AtomicU64,
    /// Descriptors rejected (their messages dropped).
    pub rejected: AtomicU64,
    /// Frames sent through shared memory without a copy: a segment already
    /// held the same frame.
    pub cache_hits: AtomicU64,
}

/// A descriptor sent for one frame: give it back with [`Lease::abandon`] if
/// its message does not leave.
pub struct Lease {
    map: Arc<Mapping>,
    slot: usize,
    generation: u32,
}

impl Lease {
    /// Gives the descriptor's count back (its message never left).
    pub fn abandon(self) {
        update(&self.map.slot(self.slot).word, |cur| {
            let (g, pending, held) = unpack(cur);
            (g == self.generation && pending > 0).then(|| pack(g, pending - 1, held))
        });
    }
}

/// One frame handed to shared memory by [`Pool::send`].
pub struct Sent {
    /// Its descriptor, for the message's meta.
    pub frame: ShmFrame,
    /// Its count in the segment, to give back if the message fails.
    pub lease: Lease,
    /// Whether the bytes were copied (`false`: a cached copy was reused).
    pub copied: bool,
}

impl Pool {
    /// An empty pool holding at most `limit` bytes of segments.
    pub fn new(limit: usize) -> Pool {
        Pool {
            inner: Mutex::new(PoolInner::default()),
            limit,
            stats: Arc::default(),
        }
    }

    /// Puts `frame` (data frame `index` of a message to process `to_pid`)
    /// in a segment and returns its descriptor, or `None` if the pool has
    /// no room (the frame goes over ZeroMQ: sending never waits).
    ///
    /// A frame sent before (the same address and length, while the pool
    /// knows those bytes are unchanged) is not copied again: the descriptor
    /// names the segment that holds it, whichever peer it went to. The pool
    /// knows the bytes are unchanged while the buffer lives: a buffer
    /// registered with [`track`] (every large `SArray`) says when it dies;
    /// of any other frame the pool keeps a clone (see [`HELD_IDLE`]).
    pub fn send(&self, frame: &Bytes, to_pid: u32, index: u32) -> Option<Sent> {
        let len = frame.len();
        if len == 0 || len > MAX_CAPACITY {
            return None;
        }
        let key = (frame.as_ptr() as usize, len);
        let life = tracked(key.0, len);
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        inner.drop_stale(now);
        if let Some(&i) = inner.cached.get(&key) {
            let seg = &mut inner.segments[i];
            if seg.holds(key, life.as_ref()) {
                if let Some(lease) = seg.address(to_pid, now) {
                    self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                    return Some(Sent {
                        frame: seg.descriptor(index, len),
                        lease,
                        copied: false,
                    });
                }
                // No slot left for this receiver: a plain copy below.
            } else {
                // The cached frame died; its address is someone else's now.
                seg.content = Content::Empty;
                inner.cached.remove(&key);
            }
        }
        let want = class(len);
        let mut pick = inner.free_segment(want);
        if pick.is_none() && inner.bytes + want > self.limit {
            for seg in &mut inner.segments {
                seg.reclaim(now);
            }
            pick = inner.free_segment(want);
            while pick.is_none() && inner.evict_one(want) {
                pick = inner.free_segment(want);
            }
        }
        let i = match pick {
            Some(i) => i,
            None => {
                if inner.bytes + want > self.limit {
                    self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                inner.seq += 1;
                let seq = inner.seq;
                match Segment::create(want, seq) {
                    Ok(seg) => {
                        log::trace!(
                            "shared memory: new segment of {want} bytes (fd {})",
                            seg.fd.as_raw_fd()
                        );
                        inner.bytes += want;
                        inner.segments.push(seg);
                        inner.segments.len() - 1
                    }
                    Err(e) => {
                        log::warn!("shared memory: cannot create a segment of {want} bytes ({e}); sending over ZeroMQ");
                        self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
            }
        };
        let seg = &mut inner.segments[i];
        seg.generation = seg.generation.checked_add(1).unwrap_or(1);
        seg.content = Content::Filling;
        let Some(lease) = seg.address(to_pid, now) else {
            seg.content = Content::Empty;
            self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let map = Arc::clone(&seg.map);
        let desc = seg.descriptor(index, len);
        drop(inner);
        // SAFETY: the segment is this sender's alone while `Filling` (no
        // other sender picks it, no receiver holds its old content, and the
        // descriptor has not left); `len` fits its data area.
        unsafe {
            std::ptr::copy_nonoverlapping(frame.as_ptr(), map.data(), len);
        }
        let mut inner = lock(&self.inner);
        let cache = !inner.cached.contains_key(&key);
        let seg = &mut inner.segments[i];
        seg.content = if cache {
            Content::Frame {
                ptr: key.0,
                len,
                life: match life {
                    Some(flag) => Life::Tracked(flag),
                    None => Life::Held(frame.clone()),
                },
            }
        } else {
            Content::Empty
        };
        if cache {
            inner.cached.insert(key, i);
        }
        Some(Sent {
            frame: desc,
            lease,
            copied: true,
        })
    }

    /// Bytes of segments the pool holds.
    pub fn bytes(&self) -> usize {
        lock(&self.inner).bytes
    }

    /// Frames the pool holds copies of.
    pub fn cached(&self) -> usize {
        lock(&self.inner).cached.len()
    }
}

/// Buffers that said they live (see [`track`]).
static TRACKED: Ranges = Ranges::new();

/// Peers' segments this process maps, flagged once their sender is gone.
static FOREIGN: Ranges = Ranges::new();

/// A registration of a live buffer, made by [`track`]: dropping it says the
/// buffer is about to be freed.
pub struct Tracked {
    start: usize,
    flag: Arc<AtomicBool>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::Release);
        TRACKED.remove(self.start, &self.flag);
    }
}

/// Registers the immutable buffer `bytes` (at least [`MIN_FRAME`] long, else
/// `None`) so that a pool may send copies of it again without copying: the
/// owner keeps the result and drops it *before* the buffer is freed or
/// changed. Frames inside a registered buffer need no clone in the pool's
/// cache, so the pool never keeps an app's dropped array alive.
pub fn track(bytes: &[u8]) -> Option<Tracked> {
    if bytes.len() < MIN_FRAME {
        return None;
    }
    let start = bytes.as_ptr() as usize;
    let flag = Arc::new(AtomicBool::new(true));
    TRACKED.insert(start, start + bytes.len(), &flag);
    Some(Tracked { start, flag })
}

/// The flag of the live registered buffer holding `len` bytes at `ptr`.
fn tracked(ptr: usize, len: usize) -> Option<Arc<AtomicBool>> {
    TRACKED
        .find(ptr, len)
        .filter(|flag| flag.load(Ordering::Acquire))
}

/// Whether `ptr` lies in a peer's segment whose sender is gone: a frame
/// received from it and sent on (a server answering with the keys it was
/// sent) must not keep the dead peer's memory mapped.
fn foreign_gone(ptr: usize) -> bool {
    FOREIGN
        .find(ptr, 1)
        .is_some_and(|gone| gone.load(Ordering::Acquire))
}

/// Why a received descriptor was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShmError {
    /// The sender is not a same-host pslite peer with shared memory on.
    NotShmPeer,
    /// The descriptor names a data frame the message does not have, or
    /// one that is not empty, or one twice.
    BadIndex(u32),
    /// The segment cannot be opened or is not a pslite segment.
    Segment(String),
    /// The token does not match the segment's.
    WrongToken,
    /// Offset and length do not fit the segment.
    OutOfBounds {
        /// The descriptor's offset.
        offset: u64,
        /// The descriptor's length.
        length: u64,
        /// The segment's data area.
        capacity: u64,
    },
    /// The segment has no slot for this process (the descriptor was sent
    /// to another process, or forged).
    NotAddressed,
    /// The segment is not in the state the descriptor says (stale, replayed
    /// or forged generation).
    WrongGeneration(u64),
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmError::NotShmPeer => {
                f.write_str("the sender is not a same-host pslite node with shared memory")
            }
            ShmError::BadIndex(i) => write!(
                f,
                "it names data frame {i}, which is absent, not empty or named twice"
            ),
            ShmError::Segment(e) => write!(f, "its segment cannot be used: {e}"),
            ShmError::WrongToken => f.write_str("its token does not match the segment"),
            ShmError::OutOfBounds {
                offset,
                length,
                capacity,
            } => write!(
                f,
                "bytes {offset}+{length} lie outside the segment's {capacity} bytes"
            ),
            ShmError::NotAddressed => f.write_str("its segment was not sent to this process"),
            ShmError::WrongGeneration(g) => {
                write!(
                    f,
                    "generation {g} is not the segment's current, unclaimed use"
                )
            }
        }
    }
}

/// A claimed frame in a peer's segment; dropping it releases the claim.
struct View {
    map: Arc<Mapping>,
    slot: usize,
    generation: u32,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: bounds were checked against the mapping at claim time, and
        // the sender leaves the content alone while a slot counts a view.
        unsafe { std::slice::from_raw_parts(self.map.data().add(self.offset), self.len) }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // Nothing to release if the sender took the count back (it
        // thought this process gone).
        update(&self.map.slot(self.slot).word, |cur| {
            let (g, pending, held) = unpack(cur);
            (g == self.generation && held > 0).then(|| pack(g, pending, held - 1))
        });
    }
}

/// Claims one descriptor of generation `gen` counted in `slot`: the content
/// stays until the claim is released.
fn claim(map: &Mapping, slot: usize, gen: u32) -> bool {
    update(&map.slot(slot).word, |cur| {
        let (g, pending, held) = unpack(cur);
        (g == gen && pending > 0 && held < MAX_REFS).then(|| pack(g, pending - 1, held + 1))
    })
}

/// A receiver's mappings of its peers' segments (owned by the receive thread).
pub struct Receiver {
    /// By (sender, fd, token): the sender's pid and the mapping.
    maps: HashMap<(NodeId, i32, u64), (u32, Arc<Mapping>)>,
    pruned: Option<Instant>,
    /// Senders whose rejected descriptors were already warned about.
    warned: std::collections::HashSet<NodeId>,
    /// This process: the slot of a segment this receiver claims in.
    me: u32,
}

impl Default for Receiver {
    fn default() -> Receiver {
        Receiver::new()
    }
}

/// Mappings a receiver keeps at most (older ones are dropped beyond it).
const MAX_MAPPINGS: usize = 4096;

impl Receiver {
    /// A receiver with no mappings.
    pub fn new() -> Receiver {
        Receiver {
            maps: HashMap::new(),
            pruned: None,
            warned: Default::default(),
            me: std::process::id(),
        }
    }

    /// Whether a rejected descriptor from `sender` is the first one (warn
    /// once per sender, so a peer cannot flood the log).
    pub fn first_rejection(&mut self, sender: NodeId) -> bool {
        self.warned.insert(sender)
    }

    /// How many peer segments are mapped.
    pub fn mapped(&self) -> usize {
        self.maps.len()
    }

    /// Replaces the frames `descs` name in `data` by views of `sender`'s
    /// segments (`pid`: its process, from the node table; `None` if it is
    /// not a same-host shared-memory peer). On any error nothing is
    /// claimed and `data` is unchanged.
    pub fn resolve(
        &mut self,
        sender: NodeId,
        pid: Option<u32>,
        descs: &[ShmFrame],
        data: &mut [Bytes],
    ) -> Result<usize, ShmError> {
        let pid = pid.ok_or(ShmError::NotShmPeer)?;
        let mut seen = vec![false; data.len()];
        for d in descs {
            let i = d.index as usize;
            if i >= data.len() || seen[i] || !data[i].is_empty() {
                return Err(ShmError::BadIndex(d.index));
            }
            seen[i] = true;
        }
        let mut views = Vec::with_capacity(descs.len());
        for d in descs {
            let map = self.mapping(sender, pid, d)?;
            let capacity = map.capacity() as u64;
            let fits = d.length > 0
                && d.offset
                    .checked_add(d.length)
                    .is_some_and(|end| end <= capacity);
            if !fits {
                return Err(ShmError::OutOfBounds {
                    offset: d.offset,
                    length: d.length,
                    capacity,
                });
            }
            let gen = match u32::try_from(d.generation) {
                Ok(g) if g > 0 => g,
                _ => return Err(ShmError::WrongGeneration(d.generation)),
            };
            let slot = (0..SLOTS)
                .find(|&i| map.slot(i).pid.load(Ordering::Acquire) == u64::from(self.me))
                .ok_or(ShmError::NotAddressed)?;
            if !claim(&map, slot, gen) {
                // Views claimed so far are dropped with `views`: released.
                return Err(ShmError::WrongGeneration(d.generation));
            }
            views.push((
                d.index as usize,
                View {
                    map,
                    slot,
                    generation: gen,
                    offset: d.offset as usize,
                    len: d.length as usize,
                },
            ));
        }
        let mut bytes = 0;
        for (i, view) in views {
            bytes += view.len;
            data[i] = Bytes::from_owner(view);
        }
        Ok(bytes)
    }

    /// The mapping of the segment `d` names, opened on first use.
    fn mapping(
        &mut self,
        sender: NodeId,
        pid: u32,
        d: &ShmFrame,
    ) -> Result<Arc<Mapping>, ShmError> {
        let key = (sender, d.fd, d.token);
        if let Some((p, map)) = self.maps.get(&key) {
            if *p == pid {
                return Ok(Arc::clone(map));
            }
        }
        // A restarted sender (new pid) or a new segment.
        self.maps
            .retain(|(s, _, _), (p, _)| *s != sender || *p == pid);
        if self.maps.len() >= MAX_MAPPINGS {
            self.maps.clear();
        }
        let map = Arc::new(open_segment(pid, d.fd)?);
        if map.header().token != d.token {
            return Err(ShmError::WrongToken);
        }
        self.maps.insert(key, (pid, Arc::clone(&map)));
        Ok(map)
    }

    /// Forgets the mappings of processes that are gone (at most once a
    /// second), so a killed sender's segments are freed.
    pub fn prune(&mut self, now: Instant) {
        if self
            .pruned
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        self.pruned = Some(now);
        let before = self.maps.len();
        self.maps.retain(|_, (pid, map)| {
            let live = !is_gone(*pid);
            if !live {
                // Copies of its frames a pool of this process keeps are let
                // go (see `Segment::is_stale`), so the mapping can go.
                if let Some(gone) = &map.gone {
                    gone.store(true, Ordering::Release);
                }
            }
            live
        });
        if self.maps.len() != before {
            log::debug!(
                "shared memory: unmapped {} segments of processes that are gone",
                before - self.maps.len()
            );
        }
    }
}

/// Opens and maps process `pid`'s segment `fd`, checking it is one.
fn open_segment(pid: u32, fd: i32) -> Result<Mapping, ShmError> {
    if fd < 0 {
        return Err(ShmError::Segment(format!("bad fd {fd}")));
    }
    let path = format!("/proc/{pid}/fd/{fd}");
    let target =
        std::fs::read_link(&path).map_err(|e| ShmError::Segment(format!("{path}: {e}")))?;
    let target = target.to_string_lossy();
    if !target.starts_with(&format!("/memfd:{NAME_PREFIX}")) {
        return Err(ShmError::Segment(format!(
            "{path} is {target:?}, not a pslite segment"
        )));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| ShmError::Segment(format!("{path}: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| ShmError::Segment(format!("{path}: {e}")))?;
    let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
    if !meta.file_type().is_file() || len <= HEADER || len > HEADER + MAX_CAPACITY {
        return Err(ShmError::Segment(format!("{path} has a bad size {len}")));
    }
    let fd = OwnedFd::from(file);
    let map = Mapping::new(&fd, len).map_err(|e| ShmError::Segment(format!("mmap {path}: {e}")))?;
    let h = map.header();
    if h.magic != MAGIC || h.capacity != (len - HEADER) as u64 {
        return Err(ShmError::Segment(format!("{path} has no pslite header")));
    }
    let mut map = map;
    let gone = Arc::new(AtomicBool::new(false));
    let start = map.ptr as usize;
    FOREIGN.insert(start, start + map.len, &gone);
    map.gone = Some(gone);
    Ok(map)
}

#[cfg(test)]
mod tests;
