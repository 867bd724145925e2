//! A sender's segments ([`Pool`]): which segment a frame goes to, the copy
//! of a frame kept to send it again, the bounds on memory and descriptors,
//! and a whole message's frames staged into segments ([`Pool::stage`]).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use pslite_proto::lock;
use pslite_proto::shm::ShmFrame;

use super::host::open_files_limit;
use super::segment::{Content, Life, Segment};
use super::slot::Lease;
use super::track::tracked;
use super::MIN_FRAME;

/// The smallest data area (also the smallest size class).
const MIN_CAPACITY: usize = 64 << 10;
/// The largest data area: 2 GiB, the largest frame a node accepts.
pub(super) const MAX_CAPACITY: usize = 1 << 31;
/// Segments a pool keeps at most, whatever the descriptor limit.
const MAX_SEGMENTS: usize = 4096;
/// Segments a pool may always keep, however low the descriptor limit.
const MIN_SEGMENTS: usize = 4;

/// The size class of a frame of `len` bytes.
pub(super) fn class(len: usize) -> usize {
    len.max(MIN_CAPACITY).next_power_of_two()
}

/// The most segments a pool of this process keeps: a quarter of its file
/// descriptors (`ulimit -n`), so that receiving (which opens a peer's
/// segment for a moment) and ZeroMQ's sockets always have room.
fn segments_for_this_process() -> usize {
    open_files_limit()
        .map_or(MAX_SEGMENTS, |n| {
            usize::try_from(n / 4).unwrap_or(MAX_SEGMENTS)
        })
        .clamp(MIN_SEGMENTS, MAX_SEGMENTS)
}

struct PoolInner {
    segments: Vec<Segment>,
    /// Cached frames (address, length) by segment index.
    cached: HashMap<(usize, usize), usize>,
    bytes: usize,
    seq: u64,
    /// The most segments (file descriptors) to keep.
    max_segments: usize,
    /// Whether running short of descriptors was logged.
    warned_short: bool,
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
                (capacity == 0 || s.map.capacity() == capacity)
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

    /// Closes the least recently used free segment (its memory and its
    /// descriptor go); whether there was one.
    fn close_one_free(&mut self) -> bool {
        let victim = self
            .segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_free())
            .min_by_key(|(_, s)| s.sent_at)
            .map(|(i, _)| i);
        let Some(i) = victim else {
            return false;
        };
        let seg = self.segments.swap_remove(i);
        self.bytes -= seg.map.capacity();
        // The segment that moved into slot `i` keeps its cache entry.
        let moved = self.segments.len();
        for index in self.cached.values_mut() {
            if *index == moved {
                *index = i;
            }
        }
        true
    }

    /// Segments holding or about to be claimed by process `pid`.
    fn held_by(&self, pid: u32) -> usize {
        self.segments.iter().filter(|s| s.is_held_by(pid)).count()
    }

    /// Whether one more segment of `want` bytes would pass a bound.
    fn is_full(&self, want: usize, limit: usize) -> bool {
        self.bytes + want > limit || self.segments.len() >= self.max_segments
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

impl ShmStats {
    /// The exit line of a node that used shared memory (`None` if it did
    /// nothing), with `segment_bytes` of segments held.
    pub fn summary(&self, segment_bytes: usize) -> Option<String> {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        if n(&self.frames_sent) + n(&self.frames_received) + n(&self.fallbacks) + n(&self.rejected)
            == 0
        {
            return None;
        }
        Some(format!(
            "shared memory: sent {} frames ({} bytes), received {}, {} sent over ZeroMQ for \
             want of a free segment, {} descriptors rejected; {segment_bytes} bytes of \
             segments, {} frames sent again without a copy",
            n(&self.frames_sent),
            n(&self.bytes_sent),
            n(&self.frames_received),
            n(&self.fallbacks),
            n(&self.rejected),
            n(&self.cache_hits)
        ))
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

/// A message's data frames as put on the wire: the large ones moved into
/// shared memory (an empty frame in their place, and a descriptor).
pub struct Staged {
    /// The descriptors, for the message's meta (`PBMeta.shm`).
    pub frames: Vec<ShmFrame>,
    /// The data frames to send over ZeroMQ.
    pub data: Vec<Bytes>,
    /// Bytes moved into shared memory.
    pub bytes: usize,
    leases: Vec<Lease>,
}

impl Staged {
    /// The message did not leave: its descriptors give their segments back
    /// (one that did leave is taken back when never claimed).
    pub fn abandon(self) {
        self.leases.into_iter().for_each(Lease::abandon);
    }
}

impl Pool {
    /// An empty pool holding at most `limit` bytes of segments, and at most
    /// a quarter of this process's file descriptors.
    pub fn new(limit: usize) -> Pool {
        Pool::with_max_segments(limit, segments_for_this_process())
    }

    /// An empty pool holding at most `limit` bytes in at most
    /// `max_segments` segments (file descriptors).
    pub fn with_max_segments(limit: usize, max_segments: usize) -> Pool {
        Pool {
            inner: Mutex::new(PoolInner {
                segments: Vec::new(),
                cached: HashMap::new(),
                bytes: 0,
                seq: 0,
                max_segments: max_segments.max(1),
                warned_short: false,
            }),
            limit,
            stats: Arc::default(),
        }
    }

    /// What the pool did.
    pub fn stats(&self) -> &Arc<ShmStats> {
        &self.stats
    }

    /// Moves the large frames of `data`, a message to process `to_pid`, into
    /// shared memory; `None` sends the frames as they are (none is large, or
    /// no segment is free for any).
    pub fn stage(&self, data: &[Bytes], to_pid: u32) -> Option<Staged> {
        if !data.iter().any(|f| f.len() >= MIN_FRAME) {
            return None;
        }
        let mut staged = Staged {
            frames: Vec::new(),
            data: data.to_vec(),
            leases: Vec::new(),
            bytes: 0,
        };
        let mut hits = 0;
        for (i, frame) in data.iter().enumerate() {
            if frame.len() < MIN_FRAME {
                continue;
            }
            let Some(sent) = self.send(frame, to_pid, i as u32) else {
                continue;
            };
            hits += u64::from(!sent.copied);
            staged.frames.push(sent.frame);
            staged.leases.push(sent.lease);
            staged.data[i] = Bytes::new();
            staged.bytes += frame.len();
        }
        if hits > 0 {
            log::trace!(
                "shared memory: {hits} frames to process {to_pid} sent again without a copy"
            );
        }
        if staged.frames.is_empty() {
            return None;
        }
        let stats = &self.stats;
        stats
            .frames_sent
            .fetch_add(staged.frames.len() as u64, Ordering::Relaxed);
        stats
            .bytes_sent
            .fetch_add(staged.bytes as u64, Ordering::Relaxed);
        Some(staged)
    }

    /// Puts `frame` (data frame `index` of a message to process `to_pid`)
    /// in a segment and returns its descriptor, or `None` if the pool has
    /// no room (the frame goes over ZeroMQ: sending never waits).
    ///
    /// A frame sent before (the same address and length, while the pool
    /// knows those bytes are unchanged) is not copied again: the descriptor
    /// names the segment that holds it, whichever peer it went to. The pool
    /// knows the bytes are unchanged while the buffer lives: a
    /// [`super::Tracked`] (every large `SArray`) says when it dies; of any
    /// other frame the pool keeps a clone (see [`HELD_IDLE`](super::HELD_IDLE)).
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
        let Some(i) = self.pick(&mut inner, class(len), to_pid, now) else {
            self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
            return None;
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

    /// A free segment of `want` bytes for a frame to `to_pid`, made if the
    /// bounds allow: at most `limit` bytes and `max_segments` segments in
    /// all, at most half of those held by one receiver. `None`: the frame
    /// goes over ZeroMQ.
    fn pick(&self, inner: &mut PoolInner, want: usize, to_pid: u32, now: Instant) -> Option<usize> {
        if let Some(i) = inner.free_segment(want) {
            return Some(i);
        }
        let per_peer = (inner.max_segments / 2).max(1);
        if inner.is_full(want, self.limit) || inner.held_by(to_pid) >= per_peer {
            for seg in &mut inner.segments {
                seg.reclaim(now);
            }
            if let Some(i) = inner.free_segment(want) {
                return Some(i);
            }
            while inner.evict_one(want) {
                if let Some(i) = inner.free_segment(want) {
                    return Some(i);
                }
            }
            if inner.held_by(to_pid) >= per_peer {
                return None;
            }
            // Room for a new segment: free ones of other sizes go first,
            // then idle copies of other frames.
            while inner.is_full(want, self.limit) {
                let closed =
                    inner.close_one_free() || (inner.evict_one(0) && inner.close_one_free());
                if !closed {
                    return None;
                }
            }
        }
        inner.seq += 1;
        let seq = inner.seq;
        match Segment::create(want, seq, now) {
            Ok(seg) => {
                log::trace!(
                    "shared memory: new segment of {want} bytes (fd {})",
                    seg.fd.as_raw_fd()
                );
                inner.bytes += want;
                inner.segments.push(seg);
                Some(inner.segments.len() - 1)
            }
            Err(e) => {
                if e.is_local_shortage() {
                    // Keep to what this process could open.
                    inner.max_segments = inner.segments.len().max(1);
                }
                if !std::mem::replace(&mut inner.warned_short, true) {
                    log::warn!(
                        "{e}; large frames go over ZeroMQ until a segment is free (the pool now \
                         keeps at most {} segments; warned once)",
                        inner.max_segments
                    );
                } else {
                    log::debug!("{e}; sending over ZeroMQ");
                }
                None
            }
        }
    }

    /// Closes every segment no receiver holds and halves the number of
    /// segments the pool keeps: this process ran short of file descriptors
    /// or memory. Returns how many segments were closed.
    pub fn shrink(&self) -> usize {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        inner.drop_stale(now);
        for seg in &mut inner.segments {
            seg.reclaim(now);
        }
        while inner.evict_one(0) {}
        let mut closed = 0;
        while inner.close_one_free() {
            closed += 1;
        }
        inner.max_segments = (inner.max_segments / 2).max(MIN_SEGMENTS);
        closed
    }

    /// Bytes of segments the pool holds.
    pub fn bytes(&self) -> usize {
        lock(&self.inner).bytes
    }

    /// Segments (file descriptors) the pool holds.
    pub fn segments(&self) -> usize {
        lock(&self.inner).segments.len()
    }

    /// The most segments the pool keeps.
    pub fn max_segments(&self) -> usize {
        lock(&self.inner).max_segments
    }

    /// Frames the pool holds copies of.
    pub fn cached(&self) -> usize {
        lock(&self.inner).cached.len()
    }

    #[cfg(test)]
    pub(super) fn with_inner<T>(&self, f: impl FnOnce(&mut PoolInnerView<'_>) -> T) -> T {
        let mut inner = lock(&self.inner);
        f(&mut PoolInnerView(&mut inner))
    }
}

/// Tests' access to a pool's segments.
#[cfg(test)]
pub(super) struct PoolInnerView<'a>(&'a mut PoolInner);

#[cfg(test)]
impl PoolInnerView<'_> {
    pub(super) fn drop_stale(&mut self, now: Instant) {
        self.0.drop_stale(now);
    }

    pub(super) fn reclaim(&mut self, i: usize, now: Instant) {
        self.0.segments[i].reclaim(now);
    }

    pub(super) fn is_free(&self, i: usize) -> bool {
        self.0.segments[i].is_free()
    }
}
