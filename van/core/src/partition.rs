//! Large data messages cut into parts, and put back together, with no
//! sockets and no clock: the sender's [`Partitioner`] and the receiver's
//! [`Reassembly`].
//!
//! Why: a node sends to each peer in priority order (the Van's links,
//! `schedule.rs` in `pslite-van`),
//! but a message that has started to leave goes out whole. Cut into parts
//! of `PS_PARTITION_BYTES`, a large message of low priority holds a
//! message of higher priority back by at most one part.
//!
//! The rules:
//! - Only data messages to a pslite peer whose node-table entry has
//!   [`pslite_proto::FEATURE_PARTITION`], reached over the network (not
//!   through shared memory), with more data bytes than the part size, are
//!   cut, and only once this node has sent a data message of non-zero
//!   priority (its apps use priorities): among equal priorities the queue
//!   goes first come first served, so parts would only cost (cutting,
//!   reassembling: a copy of every byte). A C++ peer never sees a part.
//! - The message's data frames, back to back, are cut in order into parts
//!   of at most the part size; a part's data frames are slices of the
//!   message's (no copy). Each part is a message with the routing fields of
//!   the original (app, customer, timestamp, request, push, pull,
//!   simple_app, head, priority) and `PBMeta.partition`: the message's
//!   number (unique per sender and receiver), the part's index, the number
//!   of parts, the total bytes and where the part's bytes start; part 0
//!   also carries the whole meta and every frame's length.
//! - Parts are taken only from a member of the node table through the
//!   identity (with the key) the table names for it: the core checks that
//!   (`Core::data_part` in `core/data.rs`) before a part reaches
//!   [`Reassembly`], holds one that came before this node joined, or from
//!   an elastic newcomer, like any data message, and drops anyone else's as
//!   from an unknown peer, so that no stranger makes this node hold
//!   anything for a message.
//! - The receiver copies each part's bytes into one buffer per message,
//!   grown as parts arrive (to the furthest part's end, never beyond the
//!   message's `total`: nothing is allocated for an announced size), and
//!   hands the message on when every part arrived, its frames slices of
//!   that buffer. Parts may arrive in any order and more than once (a
//!   resend): a part seen before is ignored. Each part is acknowledged and
//!   resent on its own under `PS_RESEND` (the resender tells parts apart by
//!   their index), so a lost part costs one part.
//! - Nothing from the network is trusted: a part whose fields disagree
//!   with its message's earlier parts, or that claims more than
//!   `PS_MAX_MESSAGE_SIZE` bytes, is dropped with a reason; a message
//!   whose parts stopped arriving is dropped after `idle` (its sender died,
//!   or a part was lost without `PS_RESEND`).
//! - **The bound on what one sender has begun** ([`PartialBound`]): the
//!   incomplete messages of one sender claim their whole size (`total`),
//!   and together at most a quarter of `PS_HOLD_LIMIT` (64 MiB by default,
//!   the share of one sender everywhere pslite holds data), and they are
//!   at most [`MAX_PARTIAL_PER_SENDER`]; a sender's first incomplete
//!   message is always admitted (up to `PS_MAX_MESSAGE_SIZE`, as a whole
//!   message of that size would be), so one message larger than the bound
//!   still goes.
//! - **One budget for everything held for peers**: beyond its sender's
//!   first, a message begins only if its `total` fits what is left of
//!   `PS_HOLD_LIMIT` for all senders together ([`Reassembly::held`]: the
//!   other incomplete messages, a first one counting the bytes arrived,
//!   the others their `total`) with the messages the core holds
//!   ([`Reassembly::set_held_elsewhere`]; they in turn are held only
//!   within what is left). Both are checked on the announced `total`,
//!   before anything is allocated. The first part of a message beyond
//!   either is dropped before it is acknowledged
//!   ([`DropReason::HoldLimit`], logged once per sender naming
//!   `PS_HOLD_LIMIT`): under `PS_RESEND` its parts come again and are
//!   taken once there is room, so nothing acknowledged is lost.
//! - The sender keeps the same bound per peer, so that nodes of one
//!   configuration never meet it: its links (`schedule.rs` in
//!   `pslite-van`) begin a new message to a peer only while the messages it
//!   has begun and not finished sending to that peer, with the new one,
//!   fit [`PartialBound::admits`]; otherwise the highest-priority begun
//!   message goes on. Parts of one connection arrive in the order they were
//!   sent, so what the receiver holds incomplete is always a subset of what
//!   the sender has begun (unless a part was lost, which `PS_RESEND`
//!   repairs). The budget of all senders is not met either while at most
//!   four peers send parts at once; more, each with its quarter begun
//!   beyond its first message, can meet it, and then only `PS_RESEND`
//!   brings the refused part again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use log::warn;
use pslite_proto::partition::Partition;
use pslite_proto::{Message, Meta, Node, NodeId, FEATURE_PARTITION};

use crate::component::{Component, Cx};
use crate::counters::DropReason;
use crate::effects::{Effect, Event};

/// Messages one sender may have partly received at once.
pub const MAX_PARTIAL_PER_SENDER: usize = 256;

/// The bound both ends keep on one sender's incomplete messages (see the
/// module docs): bytes claimed (each message's `total`) and messages.
///
/// ```
/// use pslite_van_core::partition::PartialBound;
///
/// let bound = PartialBound::from_hold_limit(256 << 20); // 64 MiB a sender
/// assert!(bound.admits(0, 0, 1 << 30)); // the first one, whatever its size
/// assert!(bound.admits(1, 12 << 20, 50 << 20));
/// assert!(!bound.admits(2, 60 << 20, 12 << 20));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartialBound {
    /// Bytes one sender's incomplete messages may claim together (beyond
    /// its first one).
    pub bytes: u64,
}

impl PartialBound {
    /// A quarter of `PS_HOLD_LIMIT` (`hold_limit` bytes): one sender's
    /// share, as for every other hold.
    pub fn from_hold_limit(hold_limit: usize) -> PartialBound {
        PartialBound {
            bytes: (hold_limit / 4) as u64,
        }
    }

    /// The whole budget (`PS_HOLD_LIMIT`) this share is a quarter of: what
    /// all senders' incomplete messages, with everything else the node
    /// holds for peers, may count together.
    pub fn hold_limit(&self) -> u64 {
        self.bytes.saturating_mul(4)
    }

    /// Whether a new message of `total` bytes may begin while `open`
    /// messages claiming `claimed` bytes are incomplete.
    pub fn admits(&self, open: usize, claimed: u64, total: u64) -> bool {
        open == 0 || (open < MAX_PARTIAL_PER_SENDER && claimed.saturating_add(total) <= self.bytes)
    }
}

/// Cuts large messages into parts (the sender's side).
#[derive(Debug)]
pub struct Partitioner {
    part_bytes: usize,
    next_id: u64,
}

impl Partitioner {
    /// Parts of at most `part_bytes` (0: never cut); message numbers start
    /// at `first_id` (random: a restarted process does not reuse its
    /// predecessor's).
    pub fn new(part_bytes: usize, first_id: u64) -> Partitioner {
        Partitioner {
            part_bytes,
            next_id: first_id,
        }
    }

    /// The part size (0: off).
    pub fn part_bytes(&self) -> usize {
        self.part_bytes
    }

    /// Whether `msg` has more data bytes than one part.
    pub fn would_cut(&self, msg: &Message) -> bool {
        self.part_bytes > 0
            && msg.meta.control.is_empty()
            && msg.meta.partition.is_none()
            && data_bytes(msg) > self.part_bytes
    }

    /// `msg` cut into parts, or `[msg]` if it fits one (see the module
    /// docs for who should be sent parts).
    pub fn split(&mut self, msg: Message) -> Vec<Message> {
        if !self.would_cut(&msg) {
            return vec![msg];
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let total = data_bytes(&msg);
        let count = total.div_ceil(self.part_bytes);
        let frames: Vec<u64> = msg.data.iter().map(|f| f.len() as u64).collect();
        let mut parts = Vec::with_capacity(count);
        let (mut frame, mut at) = (0usize, 0usize);
        for index in 0..count {
            let offset = index * self.part_bytes;
            let mut want = self.part_bytes.min(total - offset);
            let mut data = Vec::new();
            while want > 0 {
                let f = &msg.data[frame];
                let take = want.min(f.len() - at);
                if take > 0 {
                    data.push(f.slice(at..at + take));
                }
                at += take;
                want -= take;
                if at == f.len() {
                    frame += 1;
                    at = 0;
                }
            }
            let mut meta = if index == 0 {
                msg.meta.clone()
            } else {
                routing(&msg.meta)
            };
            meta.partition = Some(Box::new(Partition {
                id,
                index: index as u32,
                count: count as u32,
                total: total as u64,
                offset: offset as u64,
                frames: if index == 0 {
                    frames.clone()
                } else {
                    Vec::new()
                },
            }));
            meta.data_type = if index == 0 {
                msg.meta.data_type.clone()
            } else {
                Vec::new()
            };
            parts.push(Message { meta, data });
        }
        parts
    }
}

/// The core's component for parts (`Part::Partition`):
/// the wire's cut of what this node sends to peers that reassemble (see
/// the module docs for which; [`Partitions::cut`], called by the core's
/// way out once a message has passed the pipeline's stages, since one
/// message becomes several) and, behind the component contract, the
/// reassembly of what arrives: the core routes every part here; the whole
/// message goes back through the core's table ([`Effect::Route`]) once its
/// last part arrived.
#[derive(Debug)]
pub struct Partitions {
    cut: Partitioner,
    reassembly: Reassembly,
    /// This node has sent a data message of non-zero priority.
    prioritized: bool,
}

impl Partitions {
    /// Parts of `part_bytes` (0: this node cuts nothing; it still
    /// reassembles), messages of at most `max_message` bytes, each
    /// sender's incomplete ones within `bound`, dropped after `idle`
    /// without a new part; message numbers from `first_id`.
    pub fn new(
        part_bytes: usize,
        max_message: u64,
        bound: PartialBound,
        idle: Duration,
        first_id: u64,
    ) -> Partitions {
        Partitions {
            cut: Partitioner::new(part_bytes, first_id),
            reassembly: Reassembly::new(max_message, bound, idle),
            prioritized: false,
        }
    }

    /// Why a part that arrived cannot be taken now for want of room (its
    /// message would begin beyond its sender's [`PartialBound`]), checked
    /// before the part is acknowledged: under `PS_RESEND` it comes again.
    pub fn refuses(&self, part: &Message) -> Option<Dropped> {
        self.reassembly.refuses(part)
    }

    /// `msg` for `peer` (its node-table entry), in parts if the peer
    /// reassembles and is reached over the network (`by_shm` false) and
    /// this node's apps use priorities, else whole.
    pub fn cut(&mut self, msg: Message, peer: Option<&Node>, by_shm: bool) -> Vec<Message> {
        if msg.meta.priority != 0 && msg.meta.control.is_empty() {
            self.prioritized = true;
        }
        let reassembles = peer.is_some_and(|n| n.pslite && n.features & FEATURE_PARTITION != 0);
        if reassembles && !by_shm && self.prioritized {
            self.cut.split(msg)
        } else {
            vec![msg]
        }
    }

    /// Messages partly received.
    pub fn incomplete(&self) -> usize {
        self.reassembly.incomplete()
    }

    /// What the incomplete messages count in the budget of everything held
    /// for peers ([`Reassembly::held`]).
    pub fn held(&self) -> u64 {
        self.reassembly.held()
    }

    /// What the node holds for peers elsewhere
    /// ([`Reassembly::set_held_elsewhere`]).
    pub fn set_held_elsewhere(&mut self, bytes: u64) {
        self.reassembly.set_held_elsewhere(bytes);
    }
}

impl Component for Partitions {
    /// A part (the core routes only data messages with
    /// `PBMeta.partition` here): the whole message goes back through the
    /// core's table once its last part arrived.
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        match self.reassembly.accept(msg, now) {
            Accepted::Complete(whole) => cx.fx.push(Effect::Route(whole)),
            Accepted::Pending => {}
            Accepted::Dropped(d) => {
                cx.facts.counters().dropped(d.reason);
                warn!("dropping a part from node {}: {}", d.sender, d.why);
            }
        }
    }

    /// Drops incomplete messages whose parts stopped coming (logged).
    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        for d in self.reassembly.tick(now) {
            cx.facts.counters().dropped(DropReason::Malformed);
            warn!(
                "dropping an incomplete message from node {}: {}",
                d.sender, d.why
            );
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.reassembly.poll_timeout()
    }

    /// A peer died or a new process took its id: its incomplete messages
    /// go (the new process starts its messages over).
    fn on_event(&mut self, event: &Event, _now: Instant, _cx: &mut Cx<'_>) {
        if let Event::PeerDead(id) | Event::PeerReplaced(id) = event {
            self.reassembly.forget(*id);
        }
    }
}

/// Bytes in a message's data frames.
pub fn data_bytes(msg: &Message) -> usize {
    msg.data.iter().map(Bytes::len).sum()
}

/// The fields every part carries: those the receiver routes and
/// acknowledges by.
fn routing(meta: &Meta) -> Meta {
    Meta {
        head: meta.head,
        request: meta.request,
        push: meta.push,
        pull: meta.pull,
        simple_app: meta.simple_app,
        app_id: meta.app_id,
        customer_id: meta.customer_id,
        timestamp: meta.timestamp,
        priority: meta.priority,
        replica: meta.replica.clone(),
        sender: meta.sender,
        recver: meta.recver,
        ..Meta::default()
    }
}

/// A message some of whose parts arrived.
#[derive(Debug)]
struct Partial {
    count: u32,
    total: u64,
    /// Part 0's meta and frame lengths, once it arrived.
    head: Option<(Meta, Vec<u64>)>,
    /// Which parts arrived, a bit each, grown to the highest index seen
    /// (not allocated for the announced count up front).
    got: Vec<u64>,
    missing: u32,
    /// The bytes so far: it grows as parts arrive (never allocated at the
    /// announced size up front), at most to `total`.
    buf: Vec<u8>,
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
    partial: HashMap<(NodeId, u64), Partial>,
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

#[cfg(test)]
mod tests;
