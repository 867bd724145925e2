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

mod reassembly;

use std::time::{Duration, Instant};

use bytes::Bytes;
use log::warn;
use pslite_proto::partition::Partition;
use pslite_proto::{Message, Meta, Node, FEATURE_PARTITION};

use crate::component::{Component, Cx};
use crate::counters::DropReason;
use crate::effects::{Effect, Event};

pub use reassembly::{Accepted, Dropped, Reassembly, MAX_DONE};

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

#[cfg(test)]
mod tests;
