//! The receiver's side of parts: [`Reassembly`] puts each sender's
//! messages back together within its [`PartialBound`] and the budget of
//! everything held for peers (the rules are in the docs of
//! [`crate::partition`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pslite_proto::{Message, Meta, NodeId};

use super::{data_bytes, PartialBound, MAX_PARTIAL_PER_SENDER};
use crate::counters::DropReason;

/// A message some of whose parts arrived.
#[derive(Debug)]
pub(super) struct Partial {
    count: u32,
    total: u64,
    /// Part 0's meta and frame lengths, once it arrived.
    head: Option<(Meta, Vec<u64>)>,
    /// Which parts arrived, a bit each, grown to the highest index seen
    /// (not allocated for the announced count up front).
    pub(super) got: Vec<u64>,
    missing: u32,
    /// The bytes so far: it grows as parts arrive (never allocated at the
    /// announced size up front), at most to `total`.
    pub(super) buf: Vec<u8>,
    /// Data bytes of the parts arrived.
    received: u64,
    /// Admitted as its sender's only incomplete message (see
    /// [`PartialBound`]): it counts in the budget by the bytes received,
    /// the others by their whole `total` from their first part on.
    first: bool,
    last: Instant,
}

impl Partial {
    /// What it counts in the budget of everything held for peers.
    fn held(&self) -> u64 {
        if self.first {
            self.received
        } else {
            self.total
        }
    }
}

/// Why a part was dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// Its sender.
    pub sender: NodeId,
    /// What was wrong, for the log line.
    pub why: String,
    /// The counter it goes to: [`DropReason::HoldLimit`] for a message
    /// beyond its sender's [`PartialBound`], else
    /// [`DropReason::Malformed`].
    pub reason: DropReason,
}

/// What became of a part handed to [`Reassembly::accept`].
// Lives only until the caller matches it: boxing the message would cost
// an allocation per complete message for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Accepted {
    /// The last missing part: the whole message.
    Complete(Message),
    /// Kept; more parts to come (or a part seen before, ignored).
    Pending,
    /// Refused.
    Dropped(Dropped),
}

/// Puts parts back together (the receiver's side), per sender and message
/// number, within the bounds of the module docs.
#[derive(Debug)]
pub struct Reassembly {
    pub(super) partial: HashMap<(NodeId, u64), Partial>,
    /// Per sender: its incomplete messages and the bytes they claim.
    claims: HashMap<NodeId, (usize, u64)>,
    bound: PartialBound,
    /// What the incomplete messages of all senders count in the budget
    /// ([`Partial::held`]).
    held: u64,
    /// What the node holds for peers elsewhere (its held messages), as the
    /// core last said ([`Reassembly::set_held_elsewhere`]).
    elsewhere: u64,
    /// Messages completed lately (a resend of one of their parts may still
    /// come), oldest first, at most [`MAX_DONE`].
    done: VecDeque<((NodeId, u64), Instant)>,
    done_set: HashSet<(NodeId, u64)>,
    max_message: u64,
    idle: Duration,
}

/// Completed messages remembered, so a late resend of one of their parts
/// is not taken for a new message.
pub const MAX_DONE: usize = 4096;

impl Reassembly {
    /// Messages of at most `max_message` bytes (`PS_MAX_MESSAGE_SIZE`),
    /// each sender's incomplete ones within `bound`; a message with no new
    /// part for `idle` is dropped.
    pub fn new(max_message: u64, bound: PartialBound, idle: Duration) -> Reassembly {
        Reassembly {
            partial: HashMap::new(),
            claims: HashMap::new(),
            bound,
            held: 0,
            elsewhere: 0,
            done: VecDeque::new(),
            done_set: HashSet::new(),
            max_message,
            idle,
        }
    }

    /// Takes one part (`meta.partition` set, `meta.sender` from the
    /// transport).
    pub fn accept(&mut self, part: Message, now: Instant) -> Accepted {
        let sender = part.meta.sender;
        let drop = |why: String| {
            Accepted::Dropped(Dropped {
                sender,
                why,
                reason: DropReason::Malformed,
            })
        };
        let Some(p) = part.meta.partition.as_deref() else {
            return drop("not a part".into());
        };
        let (id, index, count, total, offset) = (p.id, p.index, p.count, p.total, p.offset);
        let len = data_bytes(&part) as u64;
        // Every part carries a byte (but the one part of an empty message).
        if count == 0
            || index >= count
            || total > self.max_message
            || u64::from(count) > total.max(1)
        {
            return drop(format!(
                "part {index} of {count} of message {id}, {total} bytes (at most {})",
                self.max_message
            ));
        }
        if offset.checked_add(len).is_none_or(|end| end > total) || (len == 0 && total > 0) {
            return drop(format!(
                "part {index} of message {id}: {len} bytes at {offset} of {total}"
            ));
        }
        if index == 0 {
            let sum = p.frames.iter().try_fold(0u64, |a, &f| a.checked_add(f));
            if sum != Some(total) || p.frames.len() > 64 {
                return drop(format!(
                    "part 0 of message {id}: frame lengths {:?} for {total} bytes",
                    p.frames
                ));
            }
        }
        let key = (sender, id);
        if self.done_set.contains(&key) {
            return Accepted::Pending; // a late resend of a part of a message done
        }
        if !self.partial.contains_key(&key) {
            if let Some(refused) = self.refuses(&part) {
                return Accepted::Dropped(refused);
            }
            let first = !self.claims.contains_key(&sender);
            self.partial.insert(
                key,
                Partial {
                    count,
                    total,
                    head: None,
                    got: Vec::new(),
                    missing: count,
                    buf: Vec::new(),
                    received: 0,
                    first,
                    last: now,
                },
            );
            if !first {
                self.held += total;
            }
            let claim = self.claims.entry(sender).or_default();
            claim.0 += 1;
            claim.1 += total;
        }
        let Some(entry) = self.partial.get_mut(&key) else {
            return Accepted::Pending;
        };
        if entry.count != count || entry.total != total {
            return drop(format!(
                "part {index} of message {id} says {count} parts of {total} bytes, earlier \
                 parts {} of {}",
                entry.count, entry.total
            ));
        }
        let (word, bit) = ((index / 64) as usize, 1u64 << (index % 64));
        if entry.got.get(word).is_some_and(|w| w & bit != 0) {
            return Accepted::Pending; // a resend of a part already here
        }
        if word >= entry.got.len() {
            entry.got.resize(word + 1, 0);
        }
        // The buffer grows to the part's end (a part of a later offset
        // first, as after a lost part, fills the gap with zeros until its
        // part comes), by doubling but never beyond the admitted total.
        let (at, end) = (offset as usize, (offset + len) as usize);
        if end > entry.buf.len() {
            let want = end
                .max(entry.buf.capacity().saturating_mul(2))
                .min(total as usize);
            if want > entry.buf.capacity()
                && entry.buf.try_reserve_exact(want - entry.buf.len()).is_err()
            {
                return drop(format!("message {id}: cannot allocate {want} bytes"));
            }
            entry.buf.resize(end, 0);
        }
        let mut at = at;
        for frame in &part.data {
            entry.buf[at..at + frame.len()].copy_from_slice(frame);
            at += frame.len();
        }
        entry.got[word] |= bit;
        entry.received += len;
        if entry.first {
            self.held += len;
        }
        entry.missing -= 1;
        entry.last = now;
        if index == 0 {
            let mut meta = part.meta.clone();
            meta.partition = None;
            entry.head = Some((meta, p.frames.clone()));
        }
        if entry.missing > 0 {
            return Accepted::Pending;
        }
        let Some(done) = self.remove(key) else {
            return Accepted::Pending;
        };
        if self.done.len() >= MAX_DONE {
            if let Some((old, _)) = self.done.pop_front() {
                self.done_set.remove(&old);
            }
        }
        self.done.push_back((key, now));
        self.done_set.insert(key);
        let Some((mut meta, frames)) = done.head else {
            return drop(format!("message {id}: complete without part 0"));
        };
        meta.sender = sender;
        meta.recver = part.meta.recver;
        meta.sender_key = part.meta.sender_key;
        // Parts that overlap instead of covering the message leave its end
        // unwritten: zeros, as the frames' lengths say (part 0 checked
        // that they sum to `total`).
        let mut buf = done.buf;
        buf.resize(done.total as usize, 0);
        let buf = Bytes::from(buf);
        let mut data = Vec::with_capacity(frames.len());
        let mut start = 0usize;
        for len in frames {
            let end = start + len as usize;
            data.push(buf.slice(start..end));
            start = end;
        }
        Accepted::Complete(Message { meta, data })
    }

    /// Why `part` cannot be taken now for want of room: it would begin a
    /// message of its sender beyond the [`PartialBound`], or, beyond the
    /// sender's first incomplete message, beyond what is left of the budget
    /// of everything this node holds for peers (`PS_HOLD_LIMIT`, all
    /// senders together: [`Reassembly::held`] and what the core holds
    /// elsewhere). Checked on the part's announced total, before anything
    /// is allocated for it. A part of a message begun or completed lately
    /// is never refused for room.
    pub fn refuses(&self, part: &Message) -> Option<Dropped> {
        let p = part.meta.partition.as_deref()?;
        let key = (part.meta.sender, p.id);
        if self.partial.contains_key(&key) || self.done_set.contains(&key) {
            return None;
        }
        let (open, claimed) = self.claims.get(&key.0).copied().unwrap_or_default();
        let budget = self.bound.hold_limit();
        let in_use = self.held.saturating_add(self.elsewhere);
        let why = if !self.bound.admits(open, claimed, p.total) {
            format!(
                "message {} of {} bytes would begin beyond the bound on one sender's incomplete \
                 messages ({open} of {claimed} bytes incomplete; at most {} messages and \
                 PS_HOLD_LIMIT / 4 = {} bytes)",
                p.id, p.total, MAX_PARTIAL_PER_SENDER, self.bound.bytes
            )
        } else if open > 0 && in_use.saturating_add(p.total) > budget {
            format!(
                "message {} of {} bytes would pass the budget of everything this node holds for \
                 its peers (PS_HOLD_LIMIT = {budget} bytes, {in_use} in use)",
                p.id, p.total
            )
        } else {
            return None;
        };
        Some(Dropped {
            sender: key.0,
            why: format!(
                "{why}: it is taken once there is room (its parts come again under PS_RESEND)"
            ),
            reason: DropReason::HoldLimit,
        })
    }

    /// What the incomplete messages of all senders count in the budget of
    /// everything held for peers: their whole announced size, except each
    /// sender's first (admitted whatever its size, as a whole message of
    /// that size would be), which counts the bytes arrived.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// What the node holds for peers beyond its incomplete messages (its
    /// held messages, [`crate::hold::Holds::bytes`]): it counts in the
    /// same budget.
    pub fn set_held_elsewhere(&mut self, bytes: u64) {
        self.elsewhere = bytes;
    }

    /// Takes message `key` out of the incomplete ones.
    fn remove(&mut self, key: (NodeId, u64)) -> Option<Partial> {
        let p = self.partial.remove(&key)?;
        self.held = self.held.saturating_sub(p.held());
        release(&mut self.claims, key.0, p.total);
        Some(p)
    }

    /// Bytes claimed by `sender`'s incomplete messages.
    pub fn claimed(&self, sender: NodeId) -> u64 {
        self.claims.get(&sender).map_or(0, |c| c.1)
    }

    /// When the next incomplete message may time out.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let partial = self.partial.values().map(|p| p.last + self.idle).min();
        let done = self.done.front().map(|&(_, at)| at + self.idle);
        partial.into_iter().chain(done).min()
    }

    /// Drops the messages with no new part for `idle`.
    pub fn tick(&mut self, now: Instant) -> Vec<Dropped> {
        let idle = self.idle;
        while let Some(&(key, at)) = self.done.front() {
            if now < at + idle {
                break;
            }
            self.done.pop_front();
            self.done_set.remove(&key);
        }
        let mut dropped = Vec::new();
        let (claims, held) = (&mut self.claims, &mut self.held);
        self.partial.retain(|&(sender, id), p| {
            let keep = now < p.last + idle;
            if !keep {
                *held = held.saturating_sub(p.held());
                release(claims, sender, p.total);
                dropped.push(Dropped {
                    sender,
                    reason: DropReason::Malformed,
                    why: format!(
                        "message {id}: {} of {} parts arrived, none for {:.0} s",
                        p.count - p.missing,
                        p.count,
                        idle.as_secs_f64()
                    ),
                });
            }
            keep
        });
        dropped
    }

    /// Forgets node `id`'s incomplete messages (it died, or a new process
    /// took its id).
    pub fn forget(&mut self, id: NodeId) {
        let held = &mut self.held;
        self.partial.retain(|&(sender, _), p| {
            if sender == id {
                *held = held.saturating_sub(p.held());
            }
            sender != id
        });
        self.claims.remove(&id);
        self.done.retain(|&((sender, _), _)| sender != id);
        self.done_set.retain(|&(sender, _)| sender != id);
    }

    /// Messages partly received.
    pub fn incomplete(&self) -> usize {
        self.partial.len()
    }
}

/// Takes a completed or dropped message of `total` bytes off `sender`'s
/// claims.
fn release(claims: &mut HashMap<NodeId, (usize, u64)>, sender: NodeId, total: u64) {
    if let Some(c) = claims.get_mut(&sender) {
        c.0 = c.0.saturating_sub(1);
        c.1 = c.1.saturating_sub(total);
        if c.0 == 0 {
            claims.remove(&sender);
        }
    }
}
