//! Cutting and reassembly as pure code: round trips in any order with
//! resends, and parts a hostile peer could send.

use proptest::prelude::*;
use pslite_proto::{DataType, NodeId};

use super::*;

const IDLE: Duration = Duration::from_secs(60);
/// No bound in bytes (the count bound stays).
const WIDE: PartialBound = PartialBound { bytes: u64::MAX };

fn message(frames: &[usize], seed: u8) -> Message {
    let mut m = Message::default();
    m.meta.app_id = 0;
    m.meta.customer_id = 3;
    m.meta.timestamp = 17;
    m.meta.request = true;
    m.meta.push = true;
    m.meta.head = 5;
    m.meta.priority = -2;
    m.meta.sender = 9;
    m.meta.recver = 8;
    m.meta.body = Bytes::from_static(b"body");
    m.data = frames
        .iter()
        .enumerate()
        .map(|(f, &n)| {
            Bytes::from(
                (0..n)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed ^ f as u8))
                    .collect::<Vec<u8>>(),
            )
        })
        .collect();
    m.meta.data_type = vec![DataType::UInt64; frames.len()];
    m
}

/// `msg` as it arrives: the receiver's fields from the transport.
fn arrived(mut m: Message) -> Message {
    m.meta.sender = 9;
    m.meta.recver = 8;
    m
}

#[test]
fn small_and_control_messages_are_not_cut() {
    let mut p = Partitioner::new(100, 1);
    assert_eq!(p.split(message(&[40, 60], 0)).len(), 1);
    let mut control = message(&[400], 0);
    control.meta.control = pslite_proto::Control::new(pslite_proto::Command::Barrier);
    assert_eq!(p.split(control).len(), 1);
    let mut off = Partitioner::new(0, 1);
    assert_eq!(off.split(message(&[10_000], 0)).len(), 1);
}

#[test]
fn parts_carry_slices_and_routing_fields() {
    let mut p = Partitioner::new(100, 7);
    let m = message(&[80, 150, 20], 1);
    let parts = p.split(m.clone());
    assert_eq!(parts.len(), 3);
    for (i, part) in parts.iter().enumerate() {
        let info = part.meta.partition.as_deref().unwrap();
        assert_eq!(
            (info.id, info.index, info.count, info.total),
            (7, i as u32, 3, 250)
        );
        assert_eq!(info.offset, 100 * i as u64);
        assert_eq!(data_bytes(part), if i < 2 { 100 } else { 50 });
        assert_eq!(
            (
                part.meta.timestamp,
                part.meta.app_id,
                part.meta.customer_id,
                part.meta.priority
            ),
            (17, 0, 3, -2)
        );
        assert!(part.meta.request && part.meta.push);
        if i == 0 {
            assert_eq!(info.frames, vec![80, 150, 20]);
            assert_eq!(part.meta.body, m.meta.body);
        } else {
            assert!(info.frames.is_empty() && part.meta.body.is_empty());
        }
    }
    // No copy: part 1's first frame points into the message's frame 1.
    assert_eq!(parts[1].data[0].as_ptr(), m.data[1][20..].as_ptr());
    // The next message gets the next number.
    assert_eq!(
        p.split(m)
            .first()
            .unwrap()
            .meta
            .partition
            .as_ref()
            .unwrap()
            .id,
        8
    );
}

proptest! {
    /// Whatever the frames, the part size, the order of arrival and the
    /// resends, the receiver gets the message back exactly, once.
    #[test]
    fn any_order_with_resends_reassembles_exactly(
        frames in prop::collection::vec(0usize..3000, 1..4),
        part in 1usize..1500,
        order in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
        seed in any::<u8>(),
    ) {
        let m = message(&frames, seed);
        prop_assume!(data_bytes(&m) > part);
        let parts = Partitioner::new(part, 1).split(m.clone());
        prop_assert!(parts.len() >= 2);
        // Arrival order: a shuffle (by `order`), with resends of some parts.
        let mut arrivals: Vec<usize> = (0..parts.len()).collect();
        for (i, ix) in order.iter().enumerate() {
            let j = ix.index(arrivals.len());
            if i % 3 == 0 {
                arrivals.push(arrivals[j]);
            } else {
                let k = i % arrivals.len();
                arrivals.swap(j, k);
            }
        }
        let mut r = Reassembly::new(1 << 30, WIDE, IDLE);
        let now = Instant::now();
        let mut done = Vec::new();
        for &a in &arrivals {
            match r.accept(arrived(parts[a].clone()), now) {
                Accepted::Complete(whole) => done.push(whole),
                Accepted::Pending => {}
                Accepted::Dropped(d) => prop_assert!(false, "dropped: {}", d.why),
            }
        }
        prop_assert_eq!(done.len(), 1);
        let whole = &done[0];
        prop_assert_eq!(&whole.data, &m.data);
        let mut want = m.meta.clone();
        want.sender = 9;
        want.recver = 8;
        prop_assert_eq!(&whole.meta, &want);
        prop_assert_eq!(r.incomplete(), 0);
    }

    /// Parts with any fields never panic the receiver, and whatever
    /// completes has the size it claimed.
    #[test]
    fn hostile_parts_never_panic(
        parts in prop::collection::vec(
            (0u64..3, any::<u32>(), 0u32..5, any::<u64>(), 0u64..400, prop::collection::vec(0u64..300, 0..4), 0usize..300),
            1..30,
        ),
    ) {
        let mut r = Reassembly::new(10_000, WIDE, IDLE);
        let now = Instant::now();
        for (id, index, count, total, offset, frames, len) in parts {
            let mut m = Message::default();
            m.meta.sender = 11;
            m.meta.partition = Some(Box::new(Partition {
                id,
                index: index % 6,
                count,
                total: total % 1000,
                offset,
                frames,
            }));
            m.data = vec![Bytes::from(vec![1u8; len])];
            if let Accepted::Complete(whole) = r.accept(m, now) {
                let claimed: usize = whole.data.iter().map(Bytes::len).sum();
                prop_assert!(claimed <= 1000);
            }
        }
    }
}

#[test]
fn inconsistent_and_oversized_parts_are_dropped() {
    let m = message(&[500], 0);
    let parts = Partitioner::new(200, 1).split(m);
    let now = Instant::now();
    let mut r = Reassembly::new(400, WIDE, IDLE);
    // Claims more than PS_MAX_MESSAGE_SIZE.
    assert!(matches!(
        r.accept(arrived(parts[0].clone()), now),
        Accepted::Dropped(_)
    ));
    let mut r = Reassembly::new(1 << 20, WIDE, IDLE);
    assert!(matches!(
        r.accept(arrived(parts[1].clone()), now),
        Accepted::Pending
    ));
    // Another count for the same message.
    let mut liar = arrived(parts[2].clone());
    if let Some(p) = liar.meta.partition.as_mut() {
        p.count = 4;
    }
    assert!(matches!(r.accept(liar, now), Accepted::Dropped(_)));
    // Bytes beyond the message's end.
    let mut beyond = arrived(parts[2].clone());
    if let Some(p) = beyond.meta.partition.as_mut() {
        p.offset = 450;
    }
    assert!(matches!(r.accept(beyond, now), Accepted::Dropped(_)));
    // Part 0 whose frames do not add up.
    let mut frames = arrived(parts[0].clone());
    if let Some(p) = frames.meta.partition.as_mut() {
        p.frames = vec![10];
    }
    assert!(matches!(r.accept(frames, now), Accepted::Dropped(_)));
    // The honest parts still complete it.
    assert!(matches!(
        r.accept(arrived(parts[0].clone()), now),
        Accepted::Pending
    ));
    assert!(matches!(
        r.accept(arrived(parts[2].clone()), now),
        Accepted::Complete(_)
    ));
}

#[test]
fn one_sender_cannot_open_unbounded_messages() {
    let mut r = Reassembly::new(1 << 20, WIDE, IDLE);
    let now = Instant::now();
    let mut p = Partitioner::new(10, 0);
    for i in 0..MAX_PARTIAL_PER_SENDER {
        let parts = p.split(message(&[100], i as u8));
        assert!(matches!(
            r.accept(arrived(parts[1].clone()), now),
            Accepted::Pending
        ));
    }
    let parts = p.split(message(&[100], 0));
    assert!(matches!(
        r.accept(arrived(parts[1].clone()), now),
        Accepted::Dropped(_)
    ));
    // Another sender is not affected.
    let mut other = arrived(parts[1].clone());
    other.meta.sender = 13;
    assert!(matches!(r.accept(other, now), Accepted::Pending));
    r.forget(9);
    assert_eq!(r.incomplete(), 1);
}

#[test]
fn stalled_messages_time_out() {
    let mut r = Reassembly::new(1 << 20, WIDE, IDLE);
    let now = Instant::now();
    let parts = Partitioner::new(100, 0).split(message(&[300], 0));
    assert!(matches!(
        r.accept(arrived(parts[0].clone()), now),
        Accepted::Pending
    ));
    assert_eq!(r.poll_timeout(), Some(now + IDLE));
    assert!(r.tick(now + IDLE / 2).is_empty());
    // A part keeps it alive.
    assert!(matches!(
        r.accept(arrived(parts[1].clone()), now + IDLE / 2),
        Accepted::Pending
    ));
    assert!(r.tick(now + IDLE).is_empty());
    let dropped = r.tick(now + IDLE * 2);
    assert_eq!(dropped.len(), 1);
    assert!(
        dropped[0].why.contains("2 of 3 parts"),
        "{}",
        dropped[0].why
    );
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn a_late_resend_of_a_part_is_not_a_new_message() {
    let mut r = Reassembly::new(1 << 20, WIDE, IDLE);
    let now = Instant::now();
    let parts = Partitioner::new(100, 0).split(message(&[200], 0));
    assert!(matches!(
        r.accept(arrived(parts[0].clone()), now),
        Accepted::Pending
    ));
    assert!(matches!(
        r.accept(arrived(parts[1].clone()), now),
        Accepted::Complete(_)
    ));
    assert!(matches!(
        r.accept(arrived(parts[1].clone()), now),
        Accepted::Pending
    ));
    assert_eq!(r.incomplete(), 0);
    // Remembered for `idle`, then forgotten.
    assert_eq!(r.poll_timeout(), Some(now + IDLE));
    assert!(r.tick(now + IDLE).is_empty());
    assert_eq!(r.poll_timeout(), None);
}

fn accepted(r: &mut Reassembly, part: &Message, now: Instant) -> Accepted {
    r.accept(arrived(part.clone()), now)
}

/// PS_HOLD_LIMIT / 4 bounds what one sender's incomplete messages claim:
/// a new message beyond it is refused, before it is acknowledged, with the
/// variable named; its parts come again (PS_RESEND) and are taken once the
/// earlier message completed. Another sender has its own share.
#[test]
fn a_message_beyond_the_bound_is_refused_then_taken_once_there_is_room() {
    // 400 bytes per sender: one message of 300 and one of 250 do not fit.
    let bound = PartialBound::from_hold_limit(1600);
    assert_eq!(bound.bytes, 400);
    let mut r = Reassembly::new(1 << 20, bound, IDLE);
    let now = Instant::now();
    let mut cut = Partitioner::new(100, 0);
    let a = cut.split(message(&[300], 1));
    let b = cut.split(message(&[250], 2));
    assert!(matches!(accepted(&mut r, &a[0], now), Accepted::Pending));
    assert_eq!(r.claimed(9), 300);
    // B would claim 550 of 400.
    let refused = r.refuses(&arrived(b[1].clone())).expect("beyond the bound");
    assert_eq!(refused.reason, DropReason::HoldLimit);
    assert!(refused.why.contains("PS_HOLD_LIMIT"), "{}", refused.why);
    match accepted(&mut r, &b[0], now) {
        Accepted::Dropped(d) => assert_eq!(d.reason, DropReason::HoldLimit),
        other => panic!("{other:?}"),
    }
    assert_eq!((r.incomplete(), r.claimed(9)), (1, 300));
    // Another sender is not affected.
    let mut other = arrived(b[0].clone());
    other.meta.sender = 13;
    assert!(r.refuses(&other).is_none());
    assert!(matches!(r.accept(other, now), Accepted::Pending));
    // A's later parts are never refused for room; it completes.
    assert!(r.refuses(&arrived(a[1].clone())).is_none());
    assert!(matches!(accepted(&mut r, &a[1], now), Accepted::Pending));
    assert!(matches!(
        accepted(&mut r, &a[2], now),
        Accepted::Complete(_)
    ));
    assert_eq!(r.claimed(9), 0);
    // B's parts again (resent): taken now, and B comes back exact.
    assert!(matches!(accepted(&mut r, &b[1], now), Accepted::Pending));
    assert!(matches!(accepted(&mut r, &b[0], now), Accepted::Pending));
    match accepted(&mut r, &b[2], now) {
        Accepted::Complete(whole) => assert_eq!(whole.data, message(&[250], 2).data),
        other => panic!("{other:?}"),
    }
    // A late resend of a completed message's part is no new message.
    assert!(r.refuses(&arrived(a[0].clone())).is_none());
    assert!(matches!(accepted(&mut r, &a[0], now), Accepted::Pending));
    assert_eq!(r.claimed(9), 0);
}

/// A sender's first incomplete message is taken whatever its size (up to
/// PS_MAX_MESSAGE_SIZE), so one message larger than the bound still goes;
/// while it is incomplete nothing else of that sender begins, and its
/// claim is given back when it completes, times out or its sender is
/// forgotten.
#[test]
fn one_message_larger_than_the_bound_is_taken() {
    let bound = PartialBound { bytes: 100 };
    let mut r = Reassembly::new(1 << 20, bound, IDLE);
    let now = Instant::now();
    let mut cut = Partitioner::new(64, 0);
    let big = cut.split(message(&[1000, 24], 3));
    let small = cut.split(message(&[80], 4));
    for part in &big[1..] {
        assert!(matches!(accepted(&mut r, part, now), Accepted::Pending));
        assert!(r.refuses(&arrived(small[0].clone())).is_some());
    }
    match accepted(&mut r, &big[0], now) {
        Accepted::Complete(whole) => assert_eq!(whole.data, message(&[1000, 24], 3).data),
        other => panic!("{other:?}"),
    }
    // Room again: the small one, then a big one once it is done.
    assert!(matches!(
        accepted(&mut r, &small[0], now),
        Accepted::Pending
    ));
    let big2 = cut.split(message(&[500], 5));
    assert!(r.refuses(&arrived(big2[0].clone())).is_some());
    assert!(matches!(
        accepted(&mut r, &small[1], now),
        Accepted::Complete(_)
    ));
    assert!(matches!(accepted(&mut r, &big2[3], now), Accepted::Pending));
    assert_eq!(r.claimed(9), 500);
    // Timed out: its claim goes with it.
    assert_eq!(r.tick(now + IDLE).len(), 1);
    assert_eq!(r.claimed(9), 0);
    assert!(matches!(
        accepted(&mut r, &big2[0], now + IDLE),
        Accepted::Pending
    ));
    r.forget(9);
    assert_eq!((r.incomplete(), r.claimed(9)), (0, 0));
    assert!(r.refuses(&arrived(small[0].clone())).is_none());
}

#[test]
fn the_bound_admits_the_first_message_and_counts_messages_too() {
    let bound = PartialBound::from_hold_limit(256 << 20);
    assert_eq!(bound.bytes, 64 << 20);
    assert!(bound.admits(0, 0, u64::MAX));
    assert!(bound.admits(5, 60 << 20, 4 << 20));
    assert!(!bound.admits(5, 60 << 20, (4 << 20) + 1));
    assert!(!bound.admits(MAX_PARTIAL_PER_SENDER, 0, 1));
    assert!(!bound.admits(1, u64::MAX, 1));
}

/// Part `index` of a message of `total` bytes in parts of 100, from
/// `sender`, as it arrives: 100 bytes (fewer for the last), whatever
/// `total` announces (no message of that size is made).
fn part_of(sender: NodeId, id: u64, index: u32, total: u64) -> Message {
    let count = total.div_ceil(100) as u32;
    let offset = u64::from(index) * 100;
    let len = (total - offset).min(100) as usize;
    let mut m = message(&[len], index as u8);
    m.meta.sender = sender;
    m.meta.recver = 8;
    m.meta.partition = Some(Box::new(Partition {
        id,
        index,
        count,
        total,
        offset,
        frames: if index == 0 { vec![total] } else { Vec::new() },
    }));
    m
}

fn dropped(a: Accepted) -> Dropped {
    match a {
        Accepted::Dropped(d) => d,
        other => panic!("{other:?}"),
    }
}

/// The attack of issue 43 in miniature: many senders each begin a message
/// announcing 1 GiB and send one part; others begin messages they never
/// finish. What they make the node hold is one budget (PS_HOLD_LIMIT) for
/// all senders together, with what the node holds elsewhere: a sender's
/// first incomplete message counts (and pins) the bytes arrived, never
/// its announced size; any further one counts its whole size, checked
/// before anything is allocated for it, and is refused beyond the budget.
#[test]
fn one_budget_holds_for_all_senders_together() {
    // PS_HOLD_LIMIT 4000: a quarter (1000) per sender.
    let bound = PartialBound::from_hold_limit(4000);
    let mut r = Reassembly::new(1 << 31, bound, IDLE);
    let now = Instant::now();
    // Ten senders announce 1 GiB each and send part 0: 100 bytes each.
    for sender in 20..30 {
        let a = r.accept(part_of(sender, 1, 0, 1 << 30), now);
        assert!(matches!(a, Accepted::Pending), "{a:?}");
    }
    assert_eq!((r.incomplete(), r.held()), (10, 1000));
    for p in r.partial.values() {
        assert!(p.buf.capacity() <= 100, "{}", p.buf.capacity());
        assert!(p.got.len() <= 1);
    }
    // Ten more begin messages of 300 bytes: 1000 more.
    for sender in 40..50 {
        assert!(matches!(
            r.accept(part_of(sender, 1, 0, 300), now),
            Accepted::Pending
        ));
    }
    assert_eq!(r.held(), 2000);
    // Each of these begins a second one of 600 (within its own quarter):
    // three fit the budget, the others are refused for it.
    let mut refused = 0;
    for sender in 40..50 {
        match r.accept(part_of(sender, 2, 0, 600), now) {
            Accepted::Pending => {}
            Accepted::Dropped(d) => {
                assert_eq!(d.reason, DropReason::HoldLimit);
                assert!(d.why.contains("budget of everything"), "{}", d.why);
                assert!(d.why.contains("PS_HOLD_LIMIT = 4000"), "{}", d.why);
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
        assert!(r.held() <= 4000, "{}", r.held());
    }
    assert_eq!((refused, r.held()), (7, 3800));
    // What the node holds elsewhere counts too.
    r.set_held_elsewhere(150);
    let d = dropped(r.accept(part_of(45, 3, 0, 100), now));
    assert_eq!(d.reason, DropReason::HoldLimit);
    r.set_held_elsewhere(0);
    // A sender's first message is still taken (a member's one message may
    // be as large as a whole message may), counting what arrived.
    assert!(matches!(
        r.accept(part_of(60, 1, 0, 1 << 20), now),
        Accepted::Pending
    ));
    assert_eq!(r.held(), 3900);
    // More parts of the 1 GiB messages count as they arrive.
    assert!(matches!(
        r.accept(part_of(20, 1, 1, 1 << 30), now),
        Accepted::Pending
    ));
    assert_eq!(r.held(), 4000);
    // Senders forgotten (they died) or timed out give their share back, and
    // a refused message, coming again, is taken.
    for sender in 20..30 {
        r.forget(sender);
    }
    assert_eq!(r.held(), 2900);
    assert!(matches!(
        r.accept(part_of(49, 2, 0, 600), now),
        Accepted::Pending
    ));
    let open = r.incomplete();
    assert_eq!(r.tick(now + IDLE).len(), open);
    assert_eq!((r.incomplete(), r.held()), (0, 0));
}

/// A part far into a message announced huge allocates up to its own end
/// (the gap zeroed), never the announced size; the count of parts must fit
/// the bytes announced.
#[test]
fn buffers_grow_with_what_arrived() {
    let mut r = Reassembly::new(1 << 31, WIDE, IDLE);
    let now = Instant::now();
    assert!(matches!(
        r.accept(part_of(9, 1, 7, 1 << 31), now),
        Accepted::Pending
    ));
    let p = r.partial.values().next().expect("begun");
    assert_eq!(p.buf.len(), 800);
    assert!(p.buf.capacity() < 4096, "{}", p.buf.capacity());
    assert_eq!(r.held(), 100);
    // Four billion parts of one byte each for a message of 1000 bytes.
    let mut m = part_of(9, 2, 0, 1000);
    if let Some(p) = m.meta.partition.as_deref_mut() {
        p.count = u32::MAX;
    }
    assert_eq!(dropped(r.accept(m, now)).reason, DropReason::Malformed);
    // A message whose parts overlap instead of covering it completes with
    // its announced size (zeros where nothing arrived), never short.
    let mut r = Reassembly::new(1 << 20, WIDE, IDLE);
    let first = part_of(9, 3, 0, 200);
    let mut second = part_of(9, 3, 1, 200);
    if let Some(p) = second.meta.partition.as_deref_mut() {
        p.offset = 0;
    }
    assert!(matches!(r.accept(first, now), Accepted::Pending));
    match r.accept(second, now) {
        Accepted::Complete(whole) => assert_eq!(whole.data[0].len(), 200),
        other => panic!("{other:?}"),
    }
}
