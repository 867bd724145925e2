//! The segment pool and the descriptor checks, in one process (a process
//! may open its own `/proc/<pid>/fd`, as a same-host peer does).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pslite_proto::shm::ShmFrame;
use pslite_proto::NodeId;

use super::host::fnv1a;
use super::mapping::HEADER;
use super::pool::{class, MAX_CAPACITY};
use super::track::{foreign_gone, register_tracked, Registration};
use super::*;

const MIN_CAPACITY: usize = 64 << 10;

/// Errors compare by what they say (an I/O error has no equality).
impl PartialEq for ShmError {
    fn eq(&self, other: &ShmError) -> bool {
        self.to_string() == other.to_string()
    }
}

const SENDER: NodeId = 9;

fn me() -> Option<u32> {
    Some(std::process::id())
}

/// A descriptor for a fresh copy of `frame` (dropped at once: the pool's
/// clone becomes the last one), sent to this process.
fn send(pool: &Pool, frame: &[u8], index: u32) -> ShmFrame {
    let bytes = Bytes::copy_from_slice(frame);
    pool.send(&bytes, std::process::id(), index).unwrap().frame
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn frames_arrive_exact_in_place_and_free_their_segment_when_dropped() {
    let pool = Pool::new(DEFAULT_POOL_BYTES);
    let mut rx = Receiver::new();
    let big = pattern(MIN_FRAME * 3 + 5);
    let d = send(&pool, &big, 1);
    let mut data = vec![Bytes::from_static(b"small"), Bytes::new()];
    assert_eq!(
        rx.resolve(SENDER, me(), &[d], &mut data).unwrap(),
        big.len()
    );
    assert_eq!(&data[1][..], &big[..]);
    assert_eq!(
        data[1].as_ptr() as usize % 4096,
        0,
        "the data area is page-aligned"
    );
    assert_eq!(rx.mapped(), 1);
    // Claimed: the segment is not free, so the next frame gets another one.
    let d2 = send(&pool, &big, 0);
    assert_ne!((d2.fd, d2.token), (d.fd, d.token));
    let mut other = vec![Bytes::new()];
    rx.resolve(SENDER, me(), &[d2], &mut other).unwrap();
    drop(other);
    // Dropping every reference frees the first segment: it is reused.
    let keep = data[1].slice(10..20);
    drop(data);
    let d3 = send(&pool, &big, 0);
    assert_ne!((d3.fd, d3.token), (d.fd, d.token), "a slice still holds it");
    drop(keep);
    let mut data3 = vec![Bytes::new()];
    rx.resolve(SENDER, me(), &[d3], &mut data3).unwrap();
    drop(data3);
    let d4 = send(&pool, &big, 0);
    assert_eq!((d4.fd, d4.token), (d.fd, d.token));
    assert_eq!(d4.generation, d.generation + 1);
    assert_eq!(pool.bytes(), 2 * class(big.len()));
    assert_eq!(pool.stats.cache_hits.load(Ordering::Relaxed), 0);
}

#[test]
fn a_frame_sent_again_is_not_copied_and_several_receivers_share_it() {
    let pool = Pool::new(DEFAULT_POOL_BYTES);
    let frame = Bytes::from(pattern(MIN_FRAME * 2 - 10));
    let mut rx = Receiver::new();
    // Another receiving process, as this process (its slot is its pid's).
    let other_pid = std::process::id() + 1;
    let mut rx2 = Receiver::new();
    rx2.me = other_pid;
    let first = pool.send(&frame, std::process::id(), 0).unwrap();
    assert!(first.copied);
    let again = pool.send(&frame, std::process::id(), 0).unwrap();
    assert!(!again.copied, "the same frame is sent without a copy");
    assert_eq!(again.frame, first.frame);
    // A slice with the same address and length is the same frame.
    let to_other = pool.send(&frame.slice(..), other_pid, 1).unwrap();
    assert!(!to_other.copied);
    assert_eq!(
        (to_other.frame.fd, to_other.frame.generation),
        (first.frame.fd, first.frame.generation)
    );
    assert_eq!(pool.stats.cache_hits.load(Ordering::Relaxed), 2);
    assert_eq!(pool.cached(), 1);

    let mut a = vec![Bytes::new()];
    let mut b = vec![Bytes::new()];
    let mut c = vec![Bytes::new(), Bytes::new()];
    rx.resolve(SENDER, me(), &[first.frame], &mut a).unwrap();
    rx.resolve(SENDER, me(), &[again.frame], &mut b).unwrap();
    rx2.resolve(SENDER, me(), &[to_other.frame], &mut c)
        .unwrap();
    for got in [&a[0], &b[0], &c[1]] {
        assert_eq!(&got[..], &frame[..]);
    }
    assert_eq!(a[0].as_ptr(), b[0].as_ptr(), "one copy, read in place");
    // Each descriptor is claimed once: a third claim of this process fails.
    assert_eq!(
        rx.resolve(SENDER, me(), &[first.frame], &mut [Bytes::new()]),
        Err(ShmError::WrongGeneration(first.frame.generation))
    );
    // The app drops its frame: the copy stays while a receiver holds it.
    drop(frame);
    let next = Bytes::from(pattern(MIN_FRAME * 2 - 20));
    drop((a, b));
    let sent = pool.send(&next, std::process::id(), 0).unwrap();
    assert_ne!(sent.frame.fd, first.frame.fd, "the other receiver holds it");
    drop(c);
    let next2 = Bytes::from(pattern(MIN_FRAME * 2 - 30));
    let reused = pool.send(&next2, std::process::id(), 0).unwrap();
    assert_eq!(reused.frame.fd, first.frame.fd, "free again: refilled");
    assert_eq!(reused.frame.generation, first.frame.generation + 1);
    let mut d = vec![Bytes::new()];
    rx.resolve(SENDER, me(), &[reused.frame], &mut d).unwrap();
    assert_eq!(&d[0][..], &next2[..]);
    // The old generation's descriptor no longer claims anything.
    assert_eq!(
        rx2.resolve(
            SENDER,
            me(),
            &[to_other.frame],
            &mut [Bytes::new(), Bytes::new()]
        ),
        Err(ShmError::WrongGeneration(to_other.frame.generation))
    );
}

/// A [`Tracked`], as an `SArray` holds one; `dropped` turns true when
/// its memory is freed.
struct Owned {
    values: Tracked<Vec<u8>>,
    dropped: Arc<AtomicBool>,
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        self.values.as_ref()
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

fn owned(values: Vec<u8>) -> (Bytes, Arc<AtomicBool>) {
    let dropped = Arc::new(AtomicBool::new(false));
    let owner = Owned {
        values: Tracked::new(values),
        dropped: Arc::clone(&dropped),
    };
    (Bytes::from_owner(owner), dropped)
}

#[test]
fn a_tracked_frame_is_cached_without_keeping_it_alive() {
    let pool = Pool::new(DEFAULT_POOL_BYTES);
    let mut rx = Receiver::new();
    assert!(
        !Tracked::new(vec![0u8; 100]).is_tracked(),
        "small buffers are not tracked"
    );
    assert!(Tracked::new(vec![0u8; MIN_FRAME]).is_tracked());
    let len = MIN_FRAME * 4;
    let (frame, dropped) = owned(pattern(len));
    let first = pool.send(&frame, std::process::id(), 0).unwrap();
    let again = pool.send(&frame, std::process::id(), 0).unwrap();
    assert!(first.copied && !again.copied);
    for d in [first.frame, again.frame] {
        let mut got = vec![Bytes::new()];
        rx.resolve(SENDER, me(), &[d], &mut got).unwrap();
        assert_eq!(&got[0][..], &frame[..]);
    }
    // A part of it is another frame (its own copy, also tracked).
    let part = pool.send(&frame.slice(8..), std::process::id(), 0).unwrap();
    assert!(part.copied);
    assert_ne!(part.frame.fd, first.frame.fd);
    let mut got = vec![Bytes::new()];
    rx.resolve(SENDER, me(), &[part.frame], &mut got).unwrap();
    assert_eq!(&got[0][..], &frame[8..]);
    drop(got);
    drop(frame);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the pool holds no clone of a tracked frame"
    );
    // New buffers of the same length at the same address (memory freed and
    // reused): never taken for the dead one.
    let base: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    let base = base.as_mut_ptr() as usize;
    for round in 0..20u8 {
        // SAFETY: no `Reused` of the previous round lives (it was dropped
        // with its Bytes), so nothing reads the buffer while it is written.
        let buf = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, len) };
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i * 7 % 253) as u8 ^ round;
        }
        let fresh = Bytes::from_owner(Reused {
            _tracked: register_tracked(base, base + len),
            base,
            len,
        });
        let sent = pool.send(&fresh, std::process::id(), 0).unwrap();
        assert!(sent.copied, "round {round}: a new buffer is copied");
        let again = pool.send(&fresh, std::process::id(), 0).unwrap();
        assert!(!again.copied, "round {round}: and cached while it lives");
        for d in [sent.frame, again.frame] {
            let mut got = vec![Bytes::new()];
            rx.resolve(SENDER, me(), &[d], &mut got).unwrap();
            assert_eq!(&got[0][..], &fresh[..], "round {round}");
        }
    }
    // Two segments serve every round: each dead frame's copy is reused.
    assert_eq!(pool.bytes(), 2 * class(len));
}

/// A registered buffer at a fixed address, rewritten between rounds.
struct Reused {
    _tracked: Registration,
    base: usize,
    len: usize,
}

impl AsRef<[u8]> for Reused {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: a leaked buffer of `len` bytes, written only while no
        // `Reused` lives.
        unsafe { std::slice::from_raw_parts(self.base as *const u8, self.len) }
    }
}

#[test]
fn a_full_pool_falls_back_instead_of_waiting() {
    let pool = Pool::new(2 * MIN_CAPACITY);
    let frames: Vec<Bytes> = (0..3).map(|i| Bytes::from(vec![i; MIN_FRAME])).collect();
    let a = pool.send(&frames[0], std::process::id(), 0).unwrap();
    let _b = pool.send(&frames[1], std::process::id(), 0).unwrap();
    assert!(pool.send(&frames[2], std::process::id(), 0).is_none());
    assert_eq!(pool.stats.fallbacks.load(Ordering::Relaxed), 1);
    // A descriptor that never left gives its count back; with the pool
    // full, the least recently sent idle copy is let go for a new frame.
    a.lease.abandon();
    let c = pool.send(&frames[2], std::process::id(), 0).unwrap();
    assert!(c.copied);
    assert_eq!(c.frame.fd, a.frame.fd);
    assert!(
        pool.send(&frames[0], std::process::id(), 0).is_none(),
        "frame 0 is no longer cached and no segment is free"
    );
    assert!(pool.send(&Bytes::from(vec![0; 10]), 1, 0).is_none());
    assert!(pool
        .send(&Bytes::from(vec![0; MAX_CAPACITY + 1]), 1, 0)
        .is_none());
}

#[test]
fn segments_claimed_by_a_dead_process_are_taken_back() {
    let pool = Pool::new(MIN_CAPACITY);
    // A pid that does not exist (beyond pid_max).
    let frame = Bytes::from(vec![1; 100]);
    let _ = pool.send(&frame, 0x7fff_fff0, 0).unwrap();
    drop(frame);
    assert!(
        pool.send(&Bytes::from(vec![2; 100]), 1, 0).is_some(),
        "the dead receiver's segment is reused"
    );
}

#[test]
fn descriptors_never_claimed_are_taken_back_after_the_limit() {
    let pool = Pool::new(DEFAULT_POOL_BYTES);
    let frame = Bytes::from(pattern(MIN_FRAME));
    let lost = pool.send(&frame, std::process::id(), 0).unwrap();
    drop(frame);
    pool.with_inner(|inner| {
        inner.drop_stale(Instant::now());
        assert!(!inner.is_free(0), "a descriptor is out");
        inner.reclaim(0, Instant::now());
        assert!(!inner.is_free(0), "not yet");
        inner.reclaim(0, Instant::now() + UNCLAIMED_LIMIT);
        assert!(inner.is_free(0));
    });
    // A late arrival of the lost message is refused, not read.
    let mut rx = Receiver::new();
    assert_eq!(
        rx.resolve(SENDER, me(), &[lost.frame], &mut [Bytes::new()]),
        Err(ShmError::WrongGeneration(lost.frame.generation))
    );
}

fn rejected(rx: &mut Receiver, pid: Option<u32>, d: ShmFrame, data: &mut [Bytes]) -> ShmError {
    let before: Vec<Bytes> = data.to_vec();
    let err = rx.resolve(SENDER, pid, &[d], data).unwrap_err();
    assert_eq!(
        data,
        &before[..],
        "a rejected descriptor leaves the frames alone"
    );
    err
}

#[test]
fn hostile_descriptors_are_rejected_without_reading() {
    let pool = Pool::new(DEFAULT_POOL_BYTES);
    let mut rx = Receiver::new();
    let frame = pattern(MIN_FRAME);
    let good = send(&pool, &frame, 0);
    let empty = || vec![Bytes::new()];

    // Not a same-host shared-memory peer (another host, a C++ node, PS_SHM=0).
    assert_eq!(
        rejected(&mut rx, None, good, &mut empty()),
        ShmError::NotShmPeer
    );
    // Frame index absent, or the frame on the wire is not empty.
    let bad = ShmFrame { index: 3, ..good };
    assert_eq!(
        rejected(&mut rx, me(), bad, &mut empty()),
        ShmError::BadIndex(3)
    );
    let mut full = vec![Bytes::from_static(b"wire data")];
    assert_eq!(
        rejected(&mut rx, me(), good, &mut full),
        ShmError::BadIndex(0)
    );
    let err = rx
        .resolve(
            SENDER,
            me(),
            &[good, good],
            &mut [Bytes::new(), Bytes::new()],
        )
        .unwrap_err();
    assert_eq!(err, ShmError::BadIndex(0));
    // Out of bounds, overflowing, empty.
    let cap = class(frame.len()) as u64;
    for (offset, length) in [(0, cap + 1), (cap, 1), (u64::MAX, 2), (1, u64::MAX), (0, 0)] {
        let bad = ShmFrame {
            offset,
            length,
            ..good
        };
        assert!(matches!(
            rejected(&mut rx, me(), bad, &mut empty()),
            ShmError::OutOfBounds { .. }
        ));
    }
    // Wrong token, wrong or absurd generation.
    let bad = ShmFrame {
        token: good.token ^ 2,
        ..good
    };
    assert_eq!(
        rejected(&mut rx, me(), bad, &mut empty()),
        ShmError::WrongToken
    );
    for generation in [0, good.generation + 1, 1 << 32 | good.generation, u64::MAX] {
        let bad = ShmFrame { generation, ..good };
        assert_eq!(
            rejected(&mut rx, me(), bad, &mut empty()),
            ShmError::WrongGeneration(generation)
        );
    }
    // Unknown fds, and fds that are not pslite segments.
    let file = std::fs::File::open("/proc/self/status").unwrap();
    for fd in [-1, 999_999, 0, file.as_raw_fd()] {
        let bad = ShmFrame { fd, ..good };
        let err = rejected(&mut rx, me(), bad, &mut empty());
        assert!(
            matches!(
                err,
                ShmError::BadFd(_) | ShmError::Open { .. } | ShmError::NotASegment { .. }
            ),
            "{err}"
        );
        assert!(!err.is_local_shortage(), "{err}");
    }
    // A pid that is not the sender's.
    assert!(matches!(
        rejected(&mut rx, Some(0x7fff_fff0), good, &mut empty()),
        ShmError::Open { .. }
    ));
    // A segment sent to another process: this one has no slot in it.
    let mut stranger = Receiver::new();
    stranger.me = std::process::id() + 1;
    assert_eq!(
        rejected(&mut stranger, me(), good, &mut empty()),
        ShmError::NotAddressed
    );
    // After all that, the good descriptor still works, exactly once.
    let mut data = empty();
    rx.resolve(SENDER, me(), &[good], &mut data).unwrap();
    assert_eq!(&data[0][..], &frame[..]);
    assert_eq!(
        rejected(&mut rx, me(), good, &mut empty()),
        ShmError::WrongGeneration(good.generation),
        "a replayed descriptor is refused while the first claim holds"
    );
    drop(data);
    assert_eq!(
        rejected(&mut rx, me(), good, &mut empty()),
        ShmError::WrongGeneration(good.generation),
        "and after it was released"
    );
}

#[test]
fn a_memfd_without_a_pslite_header_is_refused() {
    // Named like ours but not written by a pool.
    let name = CString::new(format!("{NAME_PREFIX}forged")).unwrap();
    // SAFETY: a valid C string.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a fresh fd.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: our fd.
    assert_eq!(
        unsafe { libc::ftruncate(raw, (HEADER + MIN_CAPACITY) as libc::off_t) },
        0
    );
    let d = ShmFrame {
        index: 0,
        fd: fd.as_raw_fd(),
        token: 1,
        generation: 1,
        offset: 0,
        length: 10,
    };
    let mut rx = Receiver::new();
    let err = rx
        .resolve(SENDER, me(), &[d], &mut [Bytes::new()])
        .unwrap_err();
    assert!(matches!(err, ShmError::NoHeader { .. }), "{err}");
}

#[test]
fn host_identity_is_a_stable_digest() {
    let id = host_identity().unwrap();
    assert_eq!(id.len(), 16, "{id}");
    assert_eq!(id, host_identity().unwrap());
    // The digest is stable (peers built apart must agree) and sensitive.
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_ne!(fnv1a(b"boot/uid0/net:[1]"), fnv1a(b"boot/uid0/net:[2]"));
    assert!(can_reach(std::process::id()));
    assert!(!can_reach(0));
}

#[test]
fn mappings_of_gone_processes_are_forgotten() {
    let pool = Pool::new(DEFAULT_POOL_BYTES);
    let mut rx = Receiver::new();
    let d = send(&pool, &pattern(MIN_FRAME), 0);
    rx.resolve(SENDER, me(), &[d], &mut [Bytes::new()]).unwrap();
    assert_eq!(rx.mapped(), 1);
    rx.prune(Instant::now());
    assert_eq!(rx.mapped(), 1, "this process lives");
    // Pretend the mapping came from a process that is gone.
    for (pid, _) in rx.maps.values_mut() {
        *pid = 0x7fff_fff0;
    }
    rx.prune(Instant::now());
    assert_eq!(rx.mapped(), 1, "at most once a second");
    rx.prune(Instant::now() + Duration::from_secs(2));
    assert_eq!(rx.mapped(), 0);
}

#[test]
fn a_received_frame_sent_on_is_cached_until_its_sender_is_gone() {
    // A worker's pool, and a server's that answers with the keys it got.
    let worker = Pool::new(DEFAULT_POOL_BYTES);
    let server = Pool::new(DEFAULT_POOL_BYTES);
    let mut rx = Receiver::new();
    let keys = Bytes::from(pattern(MIN_FRAME * 2));
    let d = worker.send(&keys, std::process::id(), 0).unwrap().frame;
    let mut got = vec![Bytes::new()];
    rx.resolve(SENDER, me(), &[d], &mut got).unwrap();
    let view = got.pop().unwrap();
    let first = server.send(&view, std::process::id(), 0).unwrap();
    let again = server.send(&view, std::process::id(), 0).unwrap();
    assert!(first.copied && !again.copied, "held: the claim keeps it");
    assert!(!foreign_gone(view.as_ptr() as usize));
    // The worker's process is gone (pretend): the copy is let go.
    for (pid, _) in rx.maps.values_mut() {
        *pid = 0x7fff_fff0;
    }
    rx.prune(Instant::now());
    assert_eq!(rx.mapped(), 0);
    assert!(foreign_gone(view.as_ptr() as usize));
    assert!(server.send(&view, std::process::id(), 0).unwrap().copied);
    // Unmapped: the registry forgets it.
    let addr = view.as_ptr() as usize;
    drop(view);
    drop(server);
    assert!(!foreign_gone(addr));
}

/// A live process other than this one (the test runner's parent).
fn other_live_pid() -> u32 {
    // SAFETY: getppid has no preconditions.
    let pid = unsafe { libc::getppid() } as u32;
    assert!(can_reach(pid), "the parent process is reachable");
    pid
}

#[test]
fn a_pool_keeps_to_its_descriptor_bound_and_a_peer_to_half_of_it() {
    let pool = Pool::with_max_segments(DEFAULT_POOL_BYTES, 4);
    let mut rx = Receiver::new();
    let frames: Vec<Bytes> = (0..8u8).map(|i| Bytes::from(vec![i; MIN_FRAME])).collect();
    // This process claims two frames and holds them: half the bound.
    let mut held = Vec::new();
    for f in &frames[..2] {
        let d = pool.send(f, std::process::id(), 0).unwrap().frame;
        let mut got = vec![Bytes::new()];
        rx.resolve(SENDER, me(), &[d], &mut got).unwrap();
        held.push(got);
    }
    assert!(
        pool.send(&frames[2], std::process::id(), 0).is_none(),
        "one peer holds at most half of the segments"
    );
    // Another process gets the other half (descriptors out count as held).
    let other = other_live_pid();
    let _d = pool.send(&frames[3], other, 0).unwrap();
    let _e = pool.send(&frames[4], other, 0).unwrap();
    assert!(pool.send(&frames[5], other, 0).is_none());
    assert_eq!(pool.segments(), 4);
    assert_eq!(pool.stats.fallbacks.load(Ordering::Relaxed), 2);
    // A view let go frees its segment for the next frame: no fifth one.
    held.pop();
    let again = pool.send(&frames[6], std::process::id(), 0).unwrap();
    assert!(again.copied);
    assert_eq!(pool.segments(), 4, "a segment is reused, not added");
}

#[test]
fn at_the_bound_a_free_segment_of_another_size_makes_room() {
    let pool = Pool::with_max_segments(DEFAULT_POOL_BYTES, 2);
    let small = Bytes::from(pattern(MIN_FRAME));
    let big = Bytes::from(pattern(MIN_FRAME * 4));
    let huge = Bytes::from(pattern(MIN_FRAME * 16));
    for f in [&small, &big] {
        let mut got = vec![Bytes::new()];
        let d = pool.send(f, std::process::id(), 0).unwrap().frame;
        Receiver::new()
            .resolve(SENDER, me(), &[d], &mut got)
            .unwrap();
    }
    assert_eq!(pool.segments(), 2);
    // Both segments hold cached copies nobody claims: the older one goes.
    let sent = pool.send(&huge, std::process::id(), 0).unwrap();
    assert!(sent.copied);
    assert_eq!(pool.segments(), 2);
    assert_eq!(pool.bytes(), class(big.len()) + class(huge.len()));
    // Short of descriptors: free segments close and the bound halves.
    sent.lease.abandon();
    drop((small, big, huge));
    assert_eq!(pool.shrink(), 2);
    assert_eq!((pool.segments(), pool.bytes()), (0, 0));
    assert_eq!(pool.max_segments(), 4, "never below the floor");
}

#[test]
fn the_default_bound_is_a_quarter_of_the_descriptor_limit() {
    let pool = Pool::new(DEFAULT_POOL_BYTES);
    let limit = super::host::open_files_limit();
    let max = pool.max_segments();
    match limit {
        Some(n) => assert_eq!(max as u64, (n / 4).clamp(4, 4096)),
        None => assert_eq!(max, 4096),
    }
}
