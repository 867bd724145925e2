//! [`HoldQueue`]: messages held until something is ready (this node has
//! joined, a customer has registered, an app has set its handle, a newcomer
//! appears in the node table), in arrival order and within a byte budget,
//! so that peers cannot pin unbounded memory by sending early.
//!
//! The rule (`PS_HOLD_LIMIT`, 256 MiB by default): the queue holds at most
//! its limit in bytes, and at most a quarter of it from any one sender, so
//! one peer cannot use the budget up for the others. Every item counts
//! [`HoldQueue::OVERHEAD`] bytes beyond its payload, so many empty messages
//! are bounded too. What does not fit is refused and handed back; the
//! holder drops it with a log line.

use std::collections::{HashMap, VecDeque};

use pslite_proto::{Message, NodeId};

/// Why a [`HoldQueue`] refused an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// The queue holds its whole budget.
    Total,
    /// The sender holds its quarter of the budget.
    Sender,
}

/// An item a [`HoldQueue`] did not take, given back.
#[derive(Debug)]
pub struct Refused<T> {
    /// The item.
    pub item: T,
    /// Which bound it would have passed.
    pub why: Overflow,
}

#[derive(Debug)]
struct Held<T> {
    sender: NodeId,
    bytes: usize,
    item: T,
}

/// Items held in arrival order within a byte budget, a quarter of it per
/// sender (see the module docs).
///
/// ```
/// use pslite_van_core::HoldQueue;
///
/// let mut q = HoldQueue::new(4000);
/// // 436 bytes + 64 of overhead: two per sender fit in a quarter.
/// assert!(q.push(9, 436, "a").is_ok());
/// assert!(q.push(9, 436, "b").is_ok());
/// assert!(q.push(9, 436, "c").is_err());
/// assert!(q.push(11, 436, "d").is_ok());
/// assert_eq!(q.drain(), vec!["a", "b", "d"]);
/// ```
#[derive(Debug)]
pub struct HoldQueue<T> {
    items: VecDeque<Held<T>>,
    bytes: usize,
    by_sender: HashMap<NodeId, usize>,
    limit: usize,
}

impl<T> HoldQueue<T> {
    /// Bytes every item counts beyond its payload (its bookkeeping).
    pub const OVERHEAD: usize = 64;

    /// An empty queue holding at most `limit` bytes.
    pub fn new(limit: usize) -> HoldQueue<T> {
        HoldQueue {
            items: VecDeque::new(),
            bytes: 0,
            by_sender: HashMap::new(),
            limit,
        }
    }

    /// Holds `item` from `sender`, of `payload` bytes, at the back; hands it
    /// back if it does not fit the budget.
    #[allow(clippy::result_large_err)]
    pub fn push(&mut self, sender: NodeId, payload: usize, item: T) -> Result<(), Refused<T>> {
        let bytes = payload.saturating_add(Self::OVERHEAD);
        let from_sender = self.by_sender.get(&sender).copied().unwrap_or(0);
        let why = if self.bytes.saturating_add(bytes) > self.limit {
            Overflow::Total
        } else if from_sender.saturating_add(bytes) > self.limit / 4 {
            Overflow::Sender
        } else {
            self.bytes += bytes;
            *self.by_sender.entry(sender).or_default() += bytes;
            self.items.push_back(Held {
                sender,
                bytes,
                item,
            });
            return Ok(());
        };
        Err(Refused { item, why })
    }

    /// Puts back at the front an item just taken with
    /// [`HoldQueue::pop_front`] (of `payload` bytes, from `sender`), whatever
    /// the budget: it was held already.
    pub fn push_front(&mut self, sender: NodeId, payload: usize, item: T) {
        let bytes = payload.saturating_add(Self::OVERHEAD);
        self.bytes += bytes;
        *self.by_sender.entry(sender).or_default() += bytes;
        self.items.push_front(Held {
            sender,
            bytes,
            item,
        });
    }

    /// The oldest item.
    pub fn front(&self) -> Option<&T> {
        self.items.front().map(|h| &h.item)
    }

    /// Takes the oldest item.
    pub fn pop_front(&mut self) -> Option<T> {
        let held = self.items.pop_front()?;
        self.release(held.sender, held.bytes);
        Some(held.item)
    }

    /// Takes every item, oldest first.
    pub fn drain(&mut self) -> Vec<T> {
        self.take_if(|_| true)
    }

    /// Takes the items `wanted` picks, oldest first; the others stay.
    pub fn take_if(&mut self, mut wanted: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(self.items.len());
        for held in std::mem::take(&mut self.items) {
            if wanted(&held.item) {
                self.release(held.sender, held.bytes);
                taken.push(held.item);
            } else {
                kept.push_back(held);
            }
        }
        self.items = kept;
        taken
    }

    fn release(&mut self, sender: NodeId, bytes: usize) {
        self.bytes -= bytes;
        if let Some(b) = self.by_sender.get_mut(&sender) {
            *b -= bytes;
            if *b == 0 {
                self.by_sender.remove(&sender);
            }
        }
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes held (payloads and overheads).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// The payload a held message pins: its data frames and its body.
pub fn message_bytes(msg: &Message) -> usize {
    msg.data_size() + msg.meta.body.len()
}

impl HoldQueue<Message> {
    /// Holds `msg`, counted from its sender with its frames and body.
    // A refused message is handed back as it came (boxing it would cost an
    // allocation for nothing: the caller drops it).
    #[allow(clippy::result_large_err)]
    pub fn push_message(&mut self, msg: Message) -> Result<(), Refused<Message>> {
        let sender = msg.meta.sender;
        let bytes = message_bytes(&msg);
        self.push(sender, bytes, msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_in_total_and_per_sender_and_frees_on_release() {
        let mut q = HoldQueue::new(4000);
        for i in 0..3 {
            let r = q.push(9, 436, i);
            assert_eq!(r.is_ok(), i < 2, "{i}");
        }
        assert_eq!(q.push(9, 436, 9).unwrap_err().why, Overflow::Sender);
        for sender in [11, 13, 15] {
            q.push(sender, 436, sender).unwrap();
            q.push(sender, 436, sender).unwrap();
        }
        assert_eq!((q.len(), q.bytes()), (8, 4000));
        assert_eq!(q.push(17, 0, 0).unwrap_err().why, Overflow::Total);
        // Taking items out frees their sender's share and the total.
        assert_eq!(q.take_if(|&i| i == 13), vec![13, 13]);
        assert_eq!(q.bytes(), 3000);
        assert_eq!(q.pop_front(), Some(0));
        q.push(9, 436, 2).unwrap();
        assert_eq!(q.drain(), vec![1, 11, 11, 15, 15, 2]);
        assert_eq!((q.len(), q.bytes()), (0, 0));
        assert!(q.by_sender.is_empty());
    }

    #[test]
    fn huge_sizes_are_refused_not_overflowed() {
        let mut q = HoldQueue::new(usize::MAX);
        assert!(q.push(1, usize::MAX, ()).is_err());
        assert!(q.is_empty());
    }
}
