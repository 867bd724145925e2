//! Holding messages until something is ready: [`Holds`], the one place
//! the core holds them, each with its [`Reason`], and the rule for what
//! goes to the apps in which order; and [`HoldQueue`], the byte-budgeted
//! queue behind it (the postoffice holds its own messages in one too: a
//! customer not registered yet, an app without its handle).
//!
//! What the core holds, and until when:
//! - [`Reason::Joining`]: data (and early replication copies) that arrived
//!   before this node joined, until it has its node table;
//! - [`Reason::NoMap`]: replication copies for a server that has no range
//!   map yet, until the map;
//! - [`Reason::Newcomer`]: elastic mode, data from a worker id the table
//!   does not name yet, until the next round's table;
//! - [`Reason::Map`]: replication messages of a newer map, until it comes;
//! - [`Reason::Sync`]: requests for a range whose new primary is syncing,
//!   until the sync ends;
//! - [`Reason::Checkpoint`] (scheduler): the releases of the barrier a
//!   checkpoint is taken at, until the checkpoint is complete or failed;
//! - for the apps ([`Output::Deliver`], [`Output::Snapshot`],
//!   [`Output::Restore`]): [`Reason::Restoring`] while this server restores
//!   a checkpoint (all but the restore's own requests), and [`Reason::Room`]
//!   once the apps refused one (their queue is full): that one and
//!   everything for the apps after it, in order, until they have room.
//!
//! **The delivery-order rule.** The apps get what is for them in the order
//! the core made it: once one is refused or held, everything for the apps
//! after it waits behind it ([`Holds::for_apps`]); a driver carrying out a
//! batch applies the same rule ([`waits_behind`]) and hands the refused
//! back ([`Holds::park`]).
//!
//! The rule (`PS_HOLD_LIMIT`, 256 MiB by default): the queue holds at most
//! its limit in bytes, and at most a quarter of it from any one sender, so
//! one peer cannot use the budget up for the others. Every item counts
//! [`HoldQueue::OVERHEAD`] bytes beyond its payload, so many empty messages
//! are bounded too. What does not fit is refused and handed back; the
//! holder drops it with a log line. The core's messages held before
//! joining, for a map and from newcomers count in one budget with the
//! incomplete messages in parts (`crate::partition`) and the scheduler's
//! registrations (`crate::registration`): everything the node holds for
//! its peers, all senders together.

use std::collections::{BTreeMap, HashMap, VecDeque};

use pslite_proto::{Message, NodeId};

use crate::effects::Output;

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

    /// The items, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter().map(|h| &h.item)
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

/// Why the core holds a message (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// This node has not joined: no node table yet.
    Joining,
    /// A replication copy for a server with no range map yet.
    NoMap,
    /// Elastic mode: its sender is not in the node table yet.
    Newcomer,
    /// A replication message of range map `version`, not here yet.
    Map(u64),
    /// A request for range `range`, whose new primary is syncing.
    Sync(u32),
    /// A barrier's release, until the checkpoint taken at that barrier
    /// ends (one runs at a time).
    Checkpoint,
    /// For the apps: their queue was full (this, or one before it).
    Room,
    /// For the apps: this server restores a checkpoint.
    Restoring,
    /// Bounded staleness: a worker's pull, held by its app's gate until
    /// every worker finished the clocks its bound needs (ticket).
    Stale(u64),
}

/// The most replication messages of newer maps held.
const MAX_AHEAD: usize = 100_000;

/// What became of something for the apps ([`Holds::for_apps`]).
// It lives only until the core takes it: boxing the output would cost an
// allocation per delivery for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum ForApps {
    /// It goes to the apps now.
    Now(Output),
    /// It waits (behind a refused one, or for a restore).
    Held,
    /// More than `PS_HOLD_LIMIT` bytes wait for a restore: the server
    /// cannot go on (everything held for the restore was dropped).
    Overflow,
}

/// Whether `out` is for the apps: it goes to them in order, and once one
/// is refused, it waits behind that one.
pub fn waits_behind(out: &Output) -> bool {
    matches!(
        out,
        Output::Deliver(_) | Output::Snapshot { .. } | Output::Restore { .. }
    )
}

/// Whether a restore holds `out` back: everything for the apps but the
/// restore's own requests (a checkpoint's tokens have the top bit set).
fn held_by_restore(out: &Output) -> bool {
    match out {
        Output::Deliver(_) => true,
        Output::Snapshot { token, .. } | Output::Restore { token, .. } => {
            !crate::effects::is_checkpoint_token(*token)
        }
        _ => false,
    }
}

/// The one place the core holds messages, each with its [`Reason`] (see
/// the module docs). Messages held before joining, for a map and from
/// newcomers share one budget (`PS_HOLD_LIMIT`, a quarter per sender) with
/// the incomplete messages in parts ([`Holds::set_held_elsewhere`]),
/// messages of newer maps are bounded in number, and what waits for a
/// restore in bytes.
pub struct Holds {
    limit: usize,
    /// Joining and NoMap, in arrival order.
    early: HoldQueue<(Reason, Message)>,
    newcomers: HoldQueue<Message>,
    /// Map(version), in arrival order.
    ahead: Vec<(u64, Message)>,
    /// Sync(range), per range in arrival order.
    syncing: BTreeMap<u32, Vec<Message>>,
    /// Checkpoint: one release per member of the barrier.
    releases: Vec<Message>,
    /// Stale(ticket): pulls the staleness gate holds (no byte budget: a
    /// worker has few pulls in flight, and they carry keys only).
    stale: BTreeMap<u64, Message>,
    /// For the apps, in order: Room or Restoring.
    apps: VecDeque<(Reason, Output)>,
    /// Outputs held for Room.
    parked: usize,
    restoring: bool,
    restoring_bytes: usize,
    /// What the node holds for peers elsewhere (incomplete messages in
    /// parts), as the core last said: it counts in the same budget.
    elsewhere: usize,
}

impl Holds {
    /// Nothing held; `limit` is `PS_HOLD_LIMIT`.
    pub fn new(limit: usize) -> Holds {
        Holds {
            limit,
            early: HoldQueue::new(limit),
            newcomers: HoldQueue::new(limit),
            ahead: Vec::new(),
            syncing: BTreeMap::new(),
            releases: Vec::new(),
            stale: BTreeMap::new(),
            apps: VecDeque::new(),
            parked: 0,
            restoring: false,
            restoring_bytes: 0,
            elsewhere: 0,
        }
    }

    /// Bytes of the messages held within the budget (joining, map-less and
    /// newcomers', with their overheads).
    pub fn bytes(&self) -> usize {
        self.early.bytes() + self.newcomers.bytes()
    }

    /// What the node holds for peers beyond these messages (incomplete
    /// messages in parts, [`crate::partition::Partitions::held`], and
    /// registrations): a message is held only if it fits the budget with
    /// it.
    pub fn set_held_elsewhere(&mut self, bytes: usize) {
        self.elsewhere = bytes;
    }

    /// Holds `msg` for `reason` (a message reason: not Room or Restoring);
    /// hands it back if it does not fit its budget (the caller drops it
    /// with a log line).
    // A refused message is handed back as it came (boxing it would cost an
    // allocation for nothing: the caller drops it).
    #[allow(clippy::result_large_err)]
    pub fn hold(&mut self, reason: Reason, msg: Message) -> Result<(), Refused<Message>> {
        if matches!(reason, Reason::Joining | Reason::NoMap | Reason::Newcomer) {
            // One budget with everything else held for peers.
            let needed = message_bytes(&msg).saturating_add(HoldQueue::<Message>::OVERHEAD);
            let in_use = self.bytes().saturating_add(self.elsewhere);
            if in_use.saturating_add(needed) > self.limit {
                return Err(Refused {
                    item: msg,
                    why: Overflow::Total,
                });
            }
        }
        match reason {
            Reason::Joining | Reason::NoMap => {
                let (sender, bytes) = (msg.meta.sender, message_bytes(&msg));
                self.early
                    .push(sender, bytes, (reason, msg))
                    .map_err(|r| Refused {
                        item: r.item.1,
                        why: r.why,
                    })
            }
            Reason::Newcomer => self.newcomers.push_message(msg),
            Reason::Map(version) if self.ahead.len() < MAX_AHEAD => {
                self.ahead.push((version, msg));
                Ok(())
            }
            Reason::Map(_) => Err(Refused {
                item: msg,
                why: Overflow::Total,
            }),
            Reason::Sync(range) => {
                self.syncing.entry(range).or_default().push(msg);
                Ok(())
            }
            Reason::Checkpoint => {
                self.releases.push(msg);
                Ok(())
            }
            Reason::Stale(ticket) => {
                self.stale.insert(ticket, msg);
                Ok(())
            }
            Reason::Room | Reason::Restoring => Err(Refused {
                item: msg,
                why: Overflow::Total,
            }),
        }
    }

    /// Takes the messages held for reasons `which` picks, in arrival order
    /// per kind (joining and map-less ones, newcomers, newer maps, syncs by
    /// range, then a checkpoint's barrier releases).
    pub fn release(&mut self, which: impl Fn(Reason) -> bool) -> Vec<Message> {
        let mut out: Vec<Message> = self
            .early
            .take_if(|(r, _)| which(*r))
            .into_iter()
            .map(|(_, m)| m)
            .collect();
        if which(Reason::Newcomer) {
            out.extend(self.newcomers.drain());
        }
        if self.ahead.iter().any(|(v, _)| which(Reason::Map(*v))) {
            let (taken, kept) = std::mem::take(&mut self.ahead)
                .into_iter()
                .partition(|(v, _)| which(Reason::Map(*v)));
            self.ahead = kept;
            out.extend(taken.into_iter().map(|(_, m): (u64, Message)| m));
        }
        let ranges: Vec<u32> = self
            .syncing
            .keys()
            .copied()
            .filter(|&r| which(Reason::Sync(r)))
            .collect();
        for r in ranges {
            out.extend(self.syncing.remove(&r).unwrap_or_default());
        }
        if which(Reason::Checkpoint) {
            out.append(&mut self.releases);
        }
        if !self.stale.is_empty() {
            let tickets: Vec<u64> = self
                .stale
                .keys()
                .copied()
                .filter(|&t| which(Reason::Stale(t)))
                .collect();
            out.extend(tickets.iter().filter_map(|t| self.stale.remove(t)));
        }
        out
    }

    /// How many messages are held for reasons `which` picks (for logs).
    pub fn count(&self, which: impl Fn(Reason) -> bool) -> usize {
        let early = if which(Reason::Joining) || which(Reason::NoMap) {
            let mut n = 0;
            for (r, _) in self.early.iter() {
                n += usize::from(which(*r));
            }
            n
        } else {
            0
        };
        let newcomers = if which(Reason::Newcomer) {
            self.newcomers.len()
        } else {
            0
        };
        let ahead = self
            .ahead
            .iter()
            .filter(|(v, _)| which(Reason::Map(*v)))
            .count();
        let syncing: usize = self
            .syncing
            .iter()
            .filter(|(r, _)| which(Reason::Sync(**r)))
            .map(|(_, m)| m.len())
            .sum();
        let releases = if which(Reason::Checkpoint) {
            self.releases.len()
        } else {
            0
        };
        let stale = self
            .stale
            .keys()
            .filter(|&&t| which(Reason::Stale(t)))
            .count();
        early + newcomers + ahead + syncing + releases + stale
    }

    /// Something for the apps: it goes now, or waits in order behind what
    /// waits already (see the module docs).
    pub fn for_apps(&mut self, out: Output) -> ForApps {
        if self.restoring && held_by_restore(&out) {
            if let Output::Deliver(m) = &out {
                self.restoring_bytes += message_bytes(m);
            }
            self.apps.push_back((Reason::Restoring, out));
            if self.restoring_bytes > self.limit {
                self.end_restore();
                return ForApps::Overflow;
            }
            return ForApps::Held;
        }
        if self.parked > 0 {
            self.park(vec![out]);
            return ForApps::Held;
        }
        ForApps::Now(out)
    }

    /// The apps refused these (in order, the first refused and everything
    /// for them after it): they wait until [`Holds::room`].
    pub fn park(&mut self, refused: Vec<Output>) {
        self.parked += refused.len();
        self.apps
            .extend(refused.into_iter().map(|o| (Reason::Room, o)));
    }

    /// The apps have room again: what they refused, in order, to offer
    /// again (what waits for a restore stays).
    pub fn room(&mut self) -> Vec<Output> {
        self.parked = 0;
        let (room, rest) = std::mem::take(&mut self.apps)
            .into_iter()
            .partition(|(r, _)| *r == Reason::Room);
        self.apps = rest;
        room.into_iter().map(|(_, o): (Reason, Output)| o).collect()
    }

    /// Outputs the apps refused, waiting for room.
    pub fn parked(&self) -> usize {
        self.parked
    }

    /// This server starts restoring a checkpoint: what is for the apps
    /// waits (see [`Holds::for_apps`]).
    pub fn start_restore(&mut self) {
        self.restoring = true;
    }

    /// Whether a restore holds what is for the apps.
    pub fn restoring(&self) -> bool {
        self.restoring
    }

    /// The restore ended: what it held, in order, for the apps now.
    pub fn restored(&mut self) -> Vec<Output> {
        self.restoring = false;
        self.restoring_bytes = 0;
        let (held, rest) = std::mem::take(&mut self.apps)
            .into_iter()
            .partition(|(r, _)| *r == Reason::Restoring);
        self.apps = rest;
        held.into_iter().map(|(_, o): (Reason, Output)| o).collect()
    }

    /// The restore failed and the server waits to be stopped: what it held
    /// is dropped, and what comes for the apps meanwhile is held (and
    /// counted) as before.
    pub fn drop_restore_held(&mut self) {
        self.restoring_bytes = 0;
        self.apps.retain(|(r, _)| *r != Reason::Restoring);
    }

    /// The restore is abandoned (the node fails): what it held is dropped,
    /// and nothing more is held for it.
    pub fn end_restore(&mut self) {
        self.restoring = false;
        self.restoring_bytes = 0;
        self.apps.retain(|(r, _)| *r != Reason::Restoring);
    }

    /// Drops what is held for `reason` (a range that moved away).
    pub fn discard(&mut self, reason: Reason) {
        drop(self.release(|r| r == reason));
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
