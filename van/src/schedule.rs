//! The order in which a node sends to one peer: a priority queue with no
//! sockets and no clock ([`SendQueue`]).
//!
//! The rules (P3 / ByteScheduler's, with a bound on waiting):
//! - Higher priority first: a message's `priority` (ps-lite's meta field;
//!   a request's answer carries its request's). Control messages (barriers,
//!   heartbeats, acknowledgements) go before any data: they are small, and
//!   a late acknowledgement would only cause a resend.
//! - First come, first served among equals.
//! - Nothing waits forever: a message that has waited [`MAX_WAIT`] goes
//!   before anything that has not, oldest first, so a stream of
//!   higher-priority messages delays a lower one by at most that (plus
//!   the time to send what became overdue before it).
//! - **The bound on begun messages** (a queue made [`SendQueue::with_bound`]):
//!   the parts of a message cut into parts ([`PartOf`]) are queued together;
//!   the message is *begun* once one of them went and until the last one
//!   went. A part may begin a message only while the begun ones and it fit
//!   the receiver's bound ([`PartialBound::admits`]: a quarter of
//!   `PS_HOLD_LIMIT`, any one message when none is begun); otherwise the
//!   highest-priority item that needs no room goes: a part of a begun
//!   message, or a whole message. So the peer never holds more incomplete
//!   messages of this node than its bound (it receives a connection's
//!   parts in the order they went), and a high-priority message still waits
//!   for at most one part of a lower one while the bound is not reached.
//!   An overdue part that cannot begin keeps new messages from beginning
//!   until it can (the begun ones finish: all their parts are queued), so
//!   it waits a bounded time too. A part queued alone (a resend) is a
//!   message of its own, of its message's size.
//!
//! The driver ([`crate::links`]) keeps one queue per peer and takes the
//! next message from it whenever the peer's connection has room (ZeroMQ
//! holds at most about one part, `PS_PARTITION_BYTES`, beyond what it is
//! writing): with large messages cut into parts ([`crate::partition`]), a
//! high-priority message waits for at most one part of a lower one.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use pslite_van_core::partition::PartialBound;

/// How long a message may wait before it goes ahead of higher priorities.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// The priority control messages are sent with (before any data).
pub const CONTROL_PRIORITY: i64 = i64::MAX;

/// The message a queued part belongs to (its number and size, as
/// `PBMeta.partition` says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartOf {
    /// The message's number.
    pub message: u64,
    /// Its size in bytes (what the receiver claims for it).
    pub total: u64,
}

/// A message with parts in the queue.
#[derive(Debug)]
struct Parted {
    total: u64,
    /// Its parts in the queue.
    queued: usize,
    /// One of its parts went.
    begun: bool,
}

/// One queued item and what its place depends on.
#[derive(Debug)]
pub struct Queued<T> {
    /// The item.
    pub item: T,
    /// Its priority (higher first).
    pub priority: i64,
    /// When it was queued.
    pub since: Instant,
    /// Its place among equals (queue order).
    pub seq: u64,
    /// Its size, as the caller counts it.
    pub bytes: usize,
    /// The message it is a part of, if it is one.
    pub part: Option<PartOf>,
}

/// Items in sending order (see the module docs).
#[derive(Debug)]
pub struct SendQueue<T> {
    /// By (priority, highest first; then queue order).
    by_priority: BTreeMap<(Reverse<i64>, u64), Queued<T>>,
    /// Queue order → priority, for the oldest.
    by_age: BTreeMap<u64, i64>,
    next_seq: u64,
    bytes: usize,
    max_wait: Duration,
    /// The receiver's bound on begun messages (`None`: no bound).
    bound: Option<PartialBound>,
    /// Messages with parts queued, by number.
    parted: HashMap<u64, Parted>,
    /// Begun messages and their bytes.
    begun: (usize, u64),
}

impl<T> Default for SendQueue<T> {
    fn default() -> Self {
        SendQueue::new(MAX_WAIT)
    }
}

impl<T> SendQueue<T> {
    /// An empty queue whose items wait at most `max_wait` before going
    /// ahead of higher priorities.
    pub fn new(max_wait: Duration) -> SendQueue<T> {
        SendQueue {
            by_priority: BTreeMap::new(),
            by_age: BTreeMap::new(),
            next_seq: 0,
            bytes: 0,
            max_wait,
            bound: None,
            parted: HashMap::new(),
            begun: (0, 0),
        }
    }

    /// An empty queue that keeps the receiver's `bound` on begun messages
    /// (see the module docs).
    pub fn with_bound(max_wait: Duration, bound: PartialBound) -> SendQueue<T> {
        SendQueue {
            bound: Some(bound),
            ..SendQueue::new(max_wait)
        }
    }

    /// Queues `item` of `bytes` with `priority` at `now`.
    pub fn push(&mut self, item: T, priority: i64, bytes: usize, now: Instant) {
        self.push_part(item, priority, bytes, None, now);
    }

    /// Queues `item`, a part of message `part` (if any), of `bytes` with
    /// `priority` at `now`. The parts of one message are queued together,
    /// before any of them goes (see the module docs).
    pub fn push_part(
        &mut self,
        item: T,
        priority: i64,
        bytes: usize,
        part: Option<PartOf>,
        now: Instant,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.insert(Queued {
            item,
            priority,
            since: now,
            seq,
            bytes,
            part,
        });
    }

    /// Puts back an item [`SendQueue::pop`] gave (it could not be sent):
    /// it keeps its place (its message stays begun).
    pub fn put_back(&mut self, q: Queued<T>) {
        if let Some(p) = q.part {
            let begun = &mut self.begun;
            self.parted.entry(p.message).or_insert_with(|| {
                begun.0 += 1;
                begun.1 += p.total;
                Parted {
                    total: p.total,
                    queued: 0,
                    begun: true,
                }
            });
        }
        self.insert(q);
    }

    fn insert(&mut self, q: Queued<T>) {
        if let Some(p) = q.part {
            self.parted
                .entry(p.message)
                .or_insert(Parted {
                    total: p.total,
                    queued: 0,
                    begun: false,
                })
                .queued += 1;
        }
        self.bytes += q.bytes;
        self.by_age.insert(q.seq, q.priority);
        self.by_priority.insert((Reverse(q.priority), q.seq), q);
    }

    /// The next item to send at `now`: the oldest if it has waited
    /// `max_wait`, else the highest priority (oldest among equals), among
    /// those the bound on begun messages lets go (see the module docs).
    pub fn pop(&mut self, now: Instant) -> Option<Queued<T>> {
        let key = self.next_key(now)?;
        let q = self.by_priority.remove(&key)?;
        self.by_age.remove(&q.seq);
        self.bytes -= q.bytes;
        if let Some(p) = q.part {
            if let Some(m) = self.parted.get_mut(&p.message) {
                if !m.begun {
                    m.begun = true;
                    self.begun.0 += 1;
                    self.begun.1 += m.total;
                }
                m.queued -= 1;
                if m.queued == 0 {
                    let total = m.total;
                    self.parted.remove(&p.message);
                    self.begun.0 -= 1;
                    self.begun.1 -= total;
                }
            }
        }
        Some(q)
    }

    /// Whether `q` may go now: no part, or a part of a begun message, or
    /// (unless `reserved`: an overdue message waits to begin) one whose
    /// message fits the bound.
    fn may_go(&self, q: &Queued<T>, reserved: bool) -> bool {
        let (Some(bound), Some(p)) = (self.bound, q.part) else {
            return true;
        };
        match self.parted.get(&p.message) {
            Some(m) if m.begun => true,
            _ => !reserved && bound.admits(self.begun.0, self.begun.1, p.total),
        }
    }

    /// The key of the item [`SendQueue::pop`] would give at `now`. Skips
    /// the parts of messages that cannot begin (a bounded queue only).
    fn next_key(&self, now: Instant) -> Option<(Reverse<i64>, u64)> {
        let mut reserved = false;
        for (&seq, &priority) in &self.by_age {
            let key = (Reverse(priority), seq);
            let q = self.by_priority.get(&key)?;
            if now.saturating_duration_since(q.since) < self.max_wait {
                break;
            }
            if self.may_go(q, reserved) {
                return Some(key);
            }
            // Overdue and cannot begin: nothing new begins before it.
            reserved = true;
            if self.bound.is_none() {
                break;
            }
        }
        self.by_priority
            .iter()
            .find(|(_, q)| self.may_go(q, reserved))
            .map(|(k, _)| *k)
    }

    /// Messages begun (a part went, not all) and the bytes they claim.
    pub fn begun(&self) -> (usize, u64) {
        self.begun
    }

    /// The priority of the item [`SendQueue::pop`] would give at `now`.
    pub fn peek_priority(&self, now: Instant) -> Option<i64> {
        self.next_key(now).map(|(Reverse(p), _)| p)
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.by_priority.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.by_priority.is_empty()
    }

    /// Bytes queued (as the callers counted them).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes every item, in sending order at `now`.
    pub fn drain(&mut self, now: Instant) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len());
        while let Some(q) = self.pop(now) {
            out.push(q.item);
        }
        self.parted.clear();
        self.begun = (0, 0);
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn popped<T: Copy>(q: &mut SendQueue<T>, now: Instant) -> Vec<T> {
        std::iter::from_fn(|| q.pop(now).map(|x| x.item)).collect()
    }

    #[test]
    fn higher_first_and_first_come_first_served_among_equals() {
        let now = Instant::now();
        let mut q = SendQueue::default();
        for (i, p) in [
            (0, 0),
            (1, 5),
            (2, 0),
            (3, 5),
            (4, -3),
            (5, CONTROL_PRIORITY),
        ] {
            q.push(i, p, 10, now);
        }
        assert_eq!(q.bytes(), 60);
        assert_eq!(popped(&mut q, now), vec![5, 1, 3, 0, 2, 4]);
        assert!(q.is_empty() && q.bytes() == 0);
    }

    #[test]
    fn a_popped_item_put_back_keeps_its_place() {
        let now = Instant::now();
        let mut q = SendQueue::default();
        q.push('a', 1, 1, now);
        q.push('b', 1, 1, now);
        let a = q.pop(now).unwrap();
        q.push('c', 1, 1, now);
        q.put_back(a);
        assert_eq!(popped(&mut q, now), vec!['a', 'b', 'c']);
    }

    #[test]
    fn a_low_priority_item_waits_at_most_max_wait() {
        let t0 = Instant::now();
        let wait = Duration::from_millis(100);
        let mut q = SendQueue::new(wait);
        q.push("low", -10, 1, t0);
        // Higher priorities keep coming: each pop takes one of them...
        let mut at = t0;
        let mut sent = Vec::new();
        for i in 0..20 {
            at = t0 + Duration::from_millis(10 * i);
            q.push("high", 10, 1, at);
            sent.push(q.pop(at).unwrap().item);
        }
        // ... until the low one has waited `wait`: it went then, not last.
        let low_at = sent.iter().position(|&s| s == "low").unwrap();
        assert_eq!(low_at, 10, "{sent:?}");
        assert!(at > t0 + wait);
    }

    /// Queues message `id` of `parts` parts of `part` bytes with
    /// `priority`, its items `(id, index)`.
    fn push_message(
        q: &mut SendQueue<(u64, usize)>,
        id: u64,
        parts: usize,
        part: u64,
        priority: i64,
        now: Instant,
    ) {
        let of = PartOf {
            message: id,
            total: parts as u64 * part,
        };
        for index in 0..parts {
            q.push_part((id, index), priority, part as usize, Some(of), now);
        }
    }

    /// The bound holds while begun messages would exceed it.
    fn within(q: &SendQueue<(u64, usize)>, bound: PartialBound) {
        let (open, claimed) = q.begun();
        assert!(
            open <= 1 || claimed <= bound.bytes,
            "{open} begun, {claimed} bytes"
        );
    }

    /// The layer-wise step of `tests/bench/links.py --only priority`: 10
    /// layers of 12 MB pushed back to front, the first layer's priority
    /// highest, while the wire takes one 1 MB part per push. Under the
    /// default bound (64 MiB) five layers are begun at most, a layer that
    /// would pass it waits while the highest-priority begun one goes on,
    /// and the first layer still goes whole before every layer that had
    /// not begun.
    #[test]
    fn a_layer_wise_step_stays_within_the_bound() {
        const MB: u64 = 1 << 20;
        let bound = PartialBound::from_hold_limit(256 << 20);
        let now = Instant::now();
        let mut q = SendQueue::with_bound(MAX_WAIT, bound);
        let mut sent = Vec::new();
        for layer in (0..10u64).rev() {
            push_message(&mut q, layer, 12, MB, -(layer as i64), now);
            sent.push(q.pop(now).unwrap().item);
            within(&q, bound);
            assert!(q.begun().0 <= 5, "{:?}", q.begun());
        }
        while let Some(x) = q.pop(now) {
            sent.push(x.item);
            within(&q, bound);
        }
        assert_eq!(sent.len(), 120);
        let first = |layer: u64| sent.iter().position(|&(l, _)| l == layer).unwrap();
        let last = |layer: u64| sent.iter().rposition(|&(l, _)| l == layer).unwrap();
        // Layers 9..5 began as they came; 4..0 waited for room; layer 0
        // went first of them, whole, as soon as layer 5 (the highest begun)
        // was done.
        for layer in 5..10 {
            assert_eq!(first(layer), 9 - layer as usize);
        }
        assert_eq!(first(0), last(5) + 1);
        assert_eq!(last(0), first(0) + 11);
        for layer in 1..5 {
            assert!(first(layer) > last(0), "layer {layer}: {sent:?}");
        }
        // Without the pressure of the bound, a message waits for one part.
        let mut q = SendQueue::with_bound(MAX_WAIT, bound);
        push_message(&mut q, 9, 12, MB, -9, now);
        assert_eq!(q.pop(now).unwrap().item, (9, 0));
        push_message(&mut q, 0, 12, MB, 0, now);
        assert_eq!(q.pop(now).unwrap().item, (0, 0));
    }

    /// A message larger than the bound begins once nothing else is begun,
    /// and, once overdue, keeps new messages from beginning until it can:
    /// a stream of small high-priority messages does not starve it.
    #[test]
    fn a_message_larger_than_the_bound_waits_a_bounded_time() {
        let bound = PartialBound { bytes: 10 };
        let wait = Duration::from_millis(100);
        let t0 = Instant::now();
        let mut q = SendQueue::with_bound(wait, bound);
        push_message(&mut q, 0, 2, 2, 5, t0);
        assert_eq!(q.pop(t0).unwrap().item, (0, 0));
        push_message(&mut q, 1000, 10, 10, -5, t0);
        let mut huge_at = None;
        for i in 1..100u64 {
            let at = t0 + Duration::from_millis(10 * i);
            push_message(&mut q, i, 2, 2, 5, at);
            let (id, index) = q.pop(at).unwrap().item;
            within(&q, bound);
            if id == 1000 && huge_at.is_none() {
                assert_eq!(index, 0);
                huge_at = Some(i);
            }
        }
        // Overdue at i = 10; the small message begun then finishes first.
        let huge_at = huge_at.expect("the large message never began");
        assert!((10..=12).contains(&huge_at), "began at {huge_at}");
    }

    proptest! {
        /// Messages in parts of any sizes and priorities, queued and sent
        /// in any interleaving and at any pace: the messages begun never
        /// pass the bound (unless one alone), and a receiver of the same
        /// bound, getting the parts in the order they went, takes every
        /// part and puts every message back together exactly.
        #[test]
        fn a_receiver_of_the_same_bound_never_refuses_a_part(
            ops in prop::collection::vec((any::<bool>(), 1usize..6, 1usize..400, -3i64..3, 0u64..80), 1..120),
            bound_bytes in 200u64..3000,
        ) {
            use pslite_proto::Message;
            use pslite_van_core::partition::{Accepted, Partitioner, Reassembly};
            let bound = PartialBound { bytes: bound_bytes };
            let t0 = Instant::now();
            let mut q: SendQueue<Message> = SendQueue::with_bound(Duration::from_millis(200), bound);
            let mut cut = Partitioner::new(100, 7);
            let mut r = Reassembly::new(1 << 20, bound, Duration::from_secs(3600));
            let mut now = t0;
            let mut want = Vec::new();
            let mut got = Vec::new();
            let mut take = |q: &mut SendQueue<Message>, now: Instant, got: &mut Vec<Message>| -> Result<(), TestCaseError> {
                let Some(x) = q.pop(now) else { return Ok(()) };
                let (open, claimed) = q.begun();
                prop_assert!(open <= 1 || claimed <= bound.bytes, "{} begun, {} bytes", open, claimed);
                let mut part = x.item;
                if part.meta.partition.is_none() {
                    return Ok(()); // a whole message
                }
                part.meta.sender = 9;
                match r.accept(part, now) {
                    Accepted::Complete(whole) => got.push(whole),
                    Accepted::Pending => {}
                    Accepted::Dropped(d) => prop_assert!(false, "refused: {}", d.why),
                }
                Ok(())
            };
            for (i, (push, pops, len, priority, step)) in ops.into_iter().enumerate() {
                now += Duration::from_millis(step);
                if push {
                    let mut m = Message::default();
                    m.meta.timestamp = i as i32;
                    m.meta.priority = priority as i32;
                    m.data = vec![bytes::Bytes::from(vec![i as u8; len * 3])];
                    want.push(m.clone());
                    let parts = cut.split(m);
                    for p in parts {
                        let of = p.meta.partition.as_deref().map(|x| PartOf { message: x.id, total: x.total });
                        q.push_part(p, priority, len, of, now);
                    }
                }
                for _ in 0..pops {
                    take(&mut q, now, &mut got)?;
                }
            }
            while !q.is_empty() {
                now += Duration::from_millis(7);
                take(&mut q, now, &mut got)?;
            }
            // Whole messages (one part) went as they were.
            prop_assert_eq!(r.incomplete(), 0);
            let parted: Vec<&Message> = want.iter().filter(|m| m.data[0].len() > 100).collect();
            prop_assert_eq!(got.len(), parted.len());
            for m in parted {
                let back = got.iter().find(|g| g.meta.timestamp == m.meta.timestamp).unwrap();
                prop_assert_eq!(&back.data, &m.data);
            }
        }

        /// Any mix of pushes and pops: every item comes out once; at each
        /// pop, the item is the highest priority among those queued (oldest
        /// among equals) unless some item is overdue, in which case it is the
        /// oldest overdue one.
        #[test]
        fn pops_follow_the_rules(ops in prop::collection::vec((any::<bool>(), -3i64..3, 0u64..50), 1..200)) {
            let t0 = Instant::now();
            let wait = Duration::from_millis(200);
            let mut q = SendQueue::new(wait);
            let mut model: Vec<(u64, i64, Instant)> = Vec::new();
            let mut n = 0u64;
            let mut now = t0;
            for (push, priority, step) in ops {
                now += Duration::from_millis(step);
                if push {
                    q.push(n, priority, 1, now);
                    model.push((n, priority, now));
                    n += 1;
                } else if let Some(got) = q.pop(now) {
                    let overdue = model.iter().filter(|m| now.duration_since(m.2) >= wait).min_by_key(|m| m.0);
                    let want = match overdue {
                        Some(m) => m.0,
                        None => model.iter().max_by_key(|m| (m.1, Reverse(m.0))).unwrap().0,
                    };
                    prop_assert_eq!(got.item, want);
                    model.retain(|m| m.0 != want);
                } else {
                    prop_assert!(model.is_empty());
                }
                prop_assert_eq!(q.len(), model.len());
            }
        }
    }
}
