//! The segment pool and the descriptor checks, in one process (a process
//! may open its own `/proc/<pid>/fd`, as a same-host peer does).

use super::*;

const SENDER: NodeId = 9;

fn me() -> Option<u32> {
    Some(std::process::id())
}

/// A descriptor for `frame`, sent through a fresh lease of `pool`.
fn send(pool: &Pool, frame: &[u8], index: u32) -> ShmFrame {
    let lease = pool.lease(frame.len(), std::process::id()).unwrap();
    lease.fill(frame, index)
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
    assert_eq!(rx.resolve(SENDER, me(), &[d], &mut data), Ok(big.len()));
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
}

#[test]
fn a_full_pool_falls_back_instead_of_waiting() {
    let pool = Pool::new(2 * MIN_CAPACITY);
    let a = pool.lease(MIN_FRAME, std::process::id()).unwrap();
    let _b = pool.lease(MIN_FRAME, std::process::id()).unwrap();
    assert!(pool.lease(MIN_FRAME, std::process::id()).is_none());
    assert_eq!(pool.stats.fallbacks.load(Ordering::Relaxed), 1);
    // A segment whose descriptor never left comes back at once.
    a.abandon();
    assert!(pool.lease(MIN_FRAME, std::process::id()).is_some());
    assert!(pool.lease(MAX_CAPACITY + 1, std::process::id()).is_none());
}

#[test]
fn segments_claimed_by_a_dead_process_are_taken_back() {
    let pool = Pool::new(MIN_CAPACITY);
    // A pid that does not exist (beyond pid_max).
    let lease = pool.lease(100, 0x7fff_fff0).unwrap();
    let _ = lease.fill(b"x", 0);
    assert!(
        pool.lease(100, 1).is_some(),
        "the dead receiver's segment is reused"
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
    for generation in [0, good.generation + 1, u64::MAX] {
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
        assert!(matches!(
            rejected(&mut rx, me(), bad, &mut empty()),
            ShmError::Segment(_)
        ));
    }
    // A pid that is not the sender's.
    assert!(matches!(
        rejected(&mut rx, Some(0x7fff_fff0), good, &mut empty()),
        ShmError::Segment(_)
    ));
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
    assert!(
        matches!(err, ShmError::Segment(ref e) if e.contains("no pslite header")),
        "{err}"
    );
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
