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
//! **Receiving.** The receiver opens the segment once through
//! `/proc/<pid>/fd/<fd>` (the pid from the sender's node-table entry, never
//! from the descriptor), checks the link names a `pslite-shm-` memfd, maps
//! it, checks the header's magic, token and size, and keeps the mapping.
//! Each descriptor is then checked (bounds, generation) and *claimed* by a
//! compare-and-swap on the header's state word; the frame becomes a
//! [`Bytes`] over the mapping (zero copies: the app's `SArray` reads the
//! segment in place), and dropping the last reference frees the segment for
//! its sender by another compare-and-swap. A descriptor that fails any check
//! is a [`ShmError`]: the van drops the message with a log line and counts
//! it; nothing is read out of bounds.
//!
//! **Crashes.** A memfd lives while a process holds its fd or a mapping of
//! it, so a killed sender's segments vanish once its receivers drop their
//! mappings (the receive loop forgets mappings of dead pids within a
//! second), and a killed receiver's claims are taken back by the sender
//! when it needs the memory (it checks the receiver's pid). A segment sent
//! but never claimed (the message was lost) is taken back after
//! [`UNCLAIMED_LIMIT`].
//!
//! Trust: a same-host peer is a process of the same user, which could read
//! this process's memory anyway (ptrace); the checks protect against bugs
//! and forged descriptors, not against that user.

use std::collections::HashMap;
use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pslite_proto::shm::ShmFrame;
use pslite_proto::{lock, NodeId};

/// The name prefix of every segment's memfd.
pub const NAME_PREFIX: &str = "pslite-shm-";
/// Data frames at least this long travel through shared memory.
pub const MIN_FRAME: usize = 64 << 10;
/// The most segment memory one node's pool holds.
pub const DEFAULT_POOL_BYTES: usize = 1 << 30;
/// A segment sent but not claimed for this long is taken back.
pub const UNCLAIMED_LIMIT: Duration = Duration::from_secs(60);

/// The header's bytes before the data area (one page: the data is aligned
/// for every element type).
const HEADER: usize = 4096;
/// The smallest data area (also the smallest size class).
const MIN_CAPACITY: usize = 64 << 10;
/// The largest data area: 2 GiB, the largest frame a node accepts.
const MAX_CAPACITY: usize = 1 << 31;
const MAGIC: u64 = u64::from_le_bytes(*b"pslshm01");

/// The state word: 0 free; `gen << 1` sent as generation `gen`, not yet
/// claimed; `gen << 1 | 1` claimed by the receiver.
fn sent(gen: u64) -> u64 {
    gen << 1
}

fn held(gen: u64) -> u64 {
    gen << 1 | 1
}

#[repr(C)]
struct Header {
    magic: u64,
    token: u64,
    capacity: u64,
    state: AtomicU64,
}

/// This process's host identity: equal for two processes iff each can map
/// the other's segments. It is a 64-bit FNV-1a digest (16 hex digits, so
/// that node tables stay small at hundreds of nodes) of the boot id, the
/// effective uid and the network, pid, mount, user and IPC namespaces.
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
}

// SAFETY: the mapping is plain shared memory; the header's state is an
// atomic, and data areas are written only by the sender while it owns the
// segment (state free or not yet sent) and read only by its claimer.
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
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: every mapping is at least HEADER bytes, page-aligned.
        unsafe { &*(self.ptr as *const Header) }
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

/// One segment of a sender's pool.
struct Segment {
    map: Arc<Mapping>,
    fd: OwnedFd,
    token: u64,
    generation: u64,
    /// When it was last sent, and to which process.
    sent_at: Instant,
    to_pid: u32,
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
        // SAFETY: the header is ours alone until the first descriptor leaves.
        unsafe {
            let h = map.ptr as *mut Header;
            (*h).magic = MAGIC;
            (*h).token = token;
            (*h).capacity = capacity as u64;
        }
        map.header().state.store(0, Ordering::Release);
        Ok(Segment {
            map: Arc::new(map),
            fd,
            token,
            generation: 0,
            sent_at: Instant::now(),
            to_pid: 0,
        })
    }

    fn is_free(&self) -> bool {
        self.map.header().state.load(Ordering::Acquire) == 0
    }
}

/// The size class of a frame of `len` bytes.
fn class(len: usize) -> usize {
    len.max(MIN_CAPACITY).next_power_of_two()
}

#[derive(Default)]
struct PoolInner {
    segments: Vec<Segment>,
    bytes: usize,
    seq: u64,
}

/// A sender's segments.
pub struct Pool {
    inner: Mutex<PoolInner>,
    limit: usize,
    /// Frames sent through shared memory, and those that fell back to ZeroMQ.
    pub(crate) stats: ShmStats,
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
}

/// A segment taken for one frame: write it, send its descriptor.
pub struct Lease {
    map: Arc<Mapping>,
    fd: i32,
    token: u64,
    generation: u64,
}

impl Lease {
    /// Copies `frame` in and returns its descriptor as data frame `index`.
    pub fn fill(&self, frame: &[u8], index: u32) -> ShmFrame {
        let len = frame.len().min(self.map.capacity());
        // SAFETY: the segment is ours (state `sent`, the descriptor not yet
        // out), `len` fits its data area.
        unsafe {
            std::ptr::copy_nonoverlapping(frame.as_ptr(), self.map.data(), len);
        }
        ShmFrame {
            index,
            fd: self.fd,
            token: self.token,
            generation: self.generation,
            offset: 0,
            length: len as u64,
        }
    }

    /// Gives the segment back (its descriptor never left).
    pub fn abandon(self) {
        let _ = self.map.header().state.compare_exchange(
            sent(self.generation),
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

impl Pool {
    /// An empty pool holding at most `limit` bytes of segments.
    pub fn new(limit: usize) -> Pool {
        Pool {
            inner: Mutex::new(PoolInner::default()),
            limit,
            stats: ShmStats::default(),
        }
    }

    /// A free segment for a frame of `len` bytes to process `to_pid`, or
    /// `None` if the pool is full (the frame goes over ZeroMQ).
    pub fn lease(&self, len: usize, to_pid: u32) -> Option<Lease> {
        if len > MAX_CAPACITY {
            return None;
        }
        let want = class(len);
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        let mut pick = inner
            .segments
            .iter()
            .position(|s| s.map.capacity() == want && s.is_free());
        if pick.is_none() && inner.bytes + want > self.limit {
            reclaim(&mut inner.segments, now);
            pick = inner
                .segments
                .iter()
                .position(|s| s.map.capacity() == want && s.is_free());
        }
        let index = match pick {
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
        let seg = &mut inner.segments[index];
        seg.generation += 1;
        seg.sent_at = now;
        seg.to_pid = to_pid;
        // Taken under the pool's lock: no other sender picks it.
        seg.map
            .header()
            .state
            .store(sent(seg.generation), Ordering::Release);
        Some(Lease {
            map: Arc::clone(&seg.map),
            fd: seg.fd.as_raw_fd(),
            token: seg.token,
            generation: seg.generation,
        })
    }

    /// Bytes of segments the pool holds.
    pub fn bytes(&self) -> usize {
        lock(&self.inner).bytes
    }
}

/// Takes back segments whose receiver died, or sent long ago and never
/// claimed (the message was lost).
fn reclaim(segments: &mut [Segment], now: Instant) {
    for seg in segments.iter_mut() {
        let state = seg.map.header().state.load(Ordering::Acquire);
        if state == 0 {
            continue;
        }
        let unclaimed =
            state == sent(seg.generation) && now.duration_since(seg.sent_at) >= UNCLAIMED_LIMIT;
        if unclaimed || is_gone(seg.to_pid) {
            log::debug!(
                "shared memory: taking back a segment sent to process {} ({})",
                seg.to_pid,
                if unclaimed { "never claimed" } else { "gone" }
            );
            seg.map.header().state.store(0, Ordering::Release);
        }
    }
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
            ShmError::WrongGeneration(g) => {
                write!(
                    f,
                    "generation {g} is not the segment's current, unclaimed use"
                )
            }
        }
    }
}

/// A claimed frame in a peer's segment; dropping it frees the segment.
struct View {
    map: Arc<Mapping>,
    generation: u64,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: bounds were checked against the mapping at claim time, and
        // the sender leaves the segment alone until this view releases it.
        unsafe { std::slice::from_raw_parts(self.map.data().add(self.offset), self.len) }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        let _ = self.map.header().state.compare_exchange(
            held(self.generation),
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

/// A receiver's mappings of its peers' segments (owned by the receive thread).
#[derive(Default)]
pub struct Receiver {
    /// By (sender, fd, token): the sender's pid and the mapping.
    maps: HashMap<(NodeId, i32, u64), (u32, Arc<Mapping>)>,
    pruned: Option<Instant>,
    /// Senders whose rejected descriptors were already warned about.
    warned: std::collections::HashSet<NodeId>,
}

/// Mappings a receiver keeps at most (older ones are dropped beyond it).
const MAX_MAPPINGS: usize = 4096;

impl Receiver {
    /// A receiver with no mappings.
    pub fn new() -> Receiver {
        Receiver::default()
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
            if d.generation == 0 || d.generation > u64::MAX >> 2 {
                return Err(ShmError::WrongGeneration(d.generation));
            }
            let claimed = map.header().state.compare_exchange(
                sent(d.generation),
                held(d.generation),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            if claimed.is_err() {
                // Views claimed so far are dropped with `views`: released.
                return Err(ShmError::WrongGeneration(d.generation));
            }
            views.push((
                d.index as usize,
                View {
                    map,
                    generation: d.generation,
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
        self.maps.retain(|_, (pid, _)| !is_gone(*pid));
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
    Ok(map)
}

#[cfg(test)]
mod tests;
