//! What the Van hands to the layer above it ([`Dispatch`]): data messages,
//! failures of what this node sent, dead peers, the node's own failure,
//! elastic rounds. The receive thread calls it and must never wait on it:
//! a dispatcher whose queue is full refuses the message
//! ([`Delivered::Full`]) and calls [`Room::notify`] once it has room again;
//! meanwhile the Van keeps the message and reads nothing more.

use std::sync::Arc;

use bytes::Bytes;
use log::error;
use pslite_proto::replica::RangeMap;
use pslite_proto::{Message, NodeId};

use crate::Failure;

/// What became of a message offered to [`Dispatch::offer`].
// A refused message is handed back as it came: boxing it would cost an
// allocation per refusal for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Delivered {
    /// Taken (queued, handled or dropped with a log line).
    Taken,
    /// The queue it goes to is full: the Van keeps it, stops reading, and
    /// offers it again after [`Room::notify`].
    Full(Message),
}

/// Tells the Van that a full queue has room again (see [`Delivered::Full`]).
/// Cheap to clone; never blocks.
#[derive(Clone)]
pub struct Room(Arc<dyn Fn() + Send + Sync>);

impl Room {
    /// A room signal that calls `notify`.
    pub fn new(notify: impl Fn() + Send + Sync + 'static) -> Room {
        Room(Arc::new(notify))
    }

    /// There is room again.
    pub fn notify(&self) {
        (self.0)();
    }
}

impl std::fmt::Debug for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Room")
    }
}

/// Receives the data messages (no control command) that reach this node,
/// and the failures of what this node sent.
///
/// Called on the Van's receive thread: it must hand the message over
/// (e.g. to a queue) rather than do long work, and never wait.
pub trait Dispatch: Send + Sync + 'static {
    /// One data message, with `meta.sender` and `meta.recver` filled in.
    fn deliver(&self, msg: Message);

    /// Offers one data message: a dispatcher with bounded queues overrides
    /// it to refuse the message when its queue is full, keeping `room` to
    /// notify once there is room. By default, [`Dispatch::deliver`].
    fn offer(&self, msg: Message, room: &Room) -> Delivered {
        let _ = room;
        self.deliver(msg);
        Delivered::Taken
    }

    /// A data message this node sent was given up on (never acknowledged
    /// under `PS_RESEND=1`, or its receiver died): its request has failed.
    fn undeliverable(&self, msg: Message, failure: Failure) {
        let _ = (msg, failure);
    }

    /// Node `id` died and nothing replaced it in time: requests waiting
    /// for it should fail with `failure`.
    fn peer_dead(&self, id: NodeId, failure: &Failure) {
        let _ = (id, failure);
    }

    /// The node cannot go on (e.g. the scheduler is gone): every wait for
    /// remote work should fail with `failure`.
    fn failed(&self, failure: &Failure) {
        let _ = failure;
    }

    /// Elastic mode: round `round` began with `workers` (in rank order), or
    /// this node joined it.
    fn membership(&self, round: u64, workers: &[NodeId]) {
        let _ = (round, workers);
    }

    /// Replicated key ranges, on a server: app `app` should copy its state
    /// of keys `[begin, end)` as it is after every request delivered before
    /// this call (so: in its request order), and hand it to
    /// [`Van::snapshot_taken`](crate::Van::snapshot_taken) with `token`.
    /// The default copies nothing, so a joining server never catches up
    /// (and says so).
    fn snapshot(&self, app: i32, token: u64, begin: u64, end: u64) {
        let _ = (token, begin, end);
        error!(
            "app {app} cannot copy its state to a joining server (its node has no snapshot \
             support); the range stays with fewer replicas"
        );
    }

    /// Replicated key ranges, on a server: app `app` should replace its
    /// state of keys `[begin, end)` by `data` (a copy its peer made with
    /// [`Dispatch::snapshot`]), in its request order, then call
    /// [`Van::restored`](crate::Van::restored) with `token`.
    fn restore(&self, app: i32, token: u64, begin: u64, end: u64, data: Bytes) {
        let _ = (token, begin, end, data);
        error!("app {app} cannot restore a copy of its state (no snapshot support)");
    }

    /// Replicated key ranges: a new range map.
    fn range_map(&self, map: &RangeMap) {
        let _ = map;
    }
}
