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
//!
//! The driver ([`crate::links`]) keeps one queue per peer and takes the
//! next message from it whenever the peer's connection has room (ZeroMQ
//! holds at most about one part, `PS_PARTITION_BYTES`, beyond what it is
//! writing): with large messages cut into parts ([`crate::partition`]), a
//! high-priority message waits for at most one part of a lower one.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a message may wait before it goes ahead of higher priorities.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// The priority control messages are sent with (before any data).
pub const CONTROL_PRIORITY: i64 = i64::MAX;

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
        }
    }

    /// Queues `item` of `bytes` with `priority` at `now`.
    pub fn push(&mut self, item: T, priority: i64, bytes: usize, now: Instant) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.insert(Queued {
            item,
            priority,
            since: now,
            seq,
            bytes,
        });
    }

    /// Puts back an item [`SendQueue::pop`] gave (it could not be sent):
    /// it keeps its place.
    pub fn put_back(&mut self, q: Queued<T>) {
        self.insert(q);
    }

    fn insert(&mut self, q: Queued<T>) {
        self.bytes += q.bytes;
        self.by_age.insert(q.seq, q.priority);
        self.by_priority.insert((Reverse(q.priority), q.seq), q);
    }

    /// The next item to send at `now`: the oldest if it has waited
    /// `max_wait`, else the highest priority (oldest among equals).
    pub fn pop(&mut self, now: Instant) -> Option<Queued<T>> {
        let key = self.next_key(now)?;
        let q = self.by_priority.remove(&key)?;
        self.by_age.remove(&q.seq);
        self.bytes -= q.bytes;
        Some(q)
    }

    /// The key of the item [`SendQueue::pop`] would give at `now`.
    fn next_key(&self, now: Instant) -> Option<(Reverse<i64>, u64)> {
        let (&oldest, &priority) = self.by_age.first_key_value()?;
        let overdue = self
            .by_priority
            .get(&(Reverse(priority), oldest))
            .is_some_and(|q| now.saturating_duration_since(q.since) >= self.max_wait);
        if overdue {
            return Some((Reverse(priority), oldest));
        }
        self.by_priority.first_key_value().map(|(k, _)| *k)
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

    proptest! {
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
