//! The one interpreter of what the core asks for: [`carry_out`] walks a
//! batch of [`Output`]s in order and hands each to a [`Backend`]. The Van's
//! backend moves bytes over sockets and calls the apps; the harness's
//! moves packets through its simulated network and runs its apps in
//! place. Both drivers run this code, so the harness tests the order the
//! Van really uses.
//!
//! A driver carries a batch out in two passes: [`links_first`] (the
//! connections the batch opens and closes, in order: the Van does it under
//! the core's lock, so that a message prepared for a new peer finds its
//! link), then [`carry_out`] (the rest, after the lock: deliveries run app
//! code). What the apps refused comes back, in order, for
//! [`crate::Core::park`]: once one delivery is refused, everything for the
//! apps after it waits behind it (the rule is `crate::hold`'s,
//! [`waits_behind`](crate::hold::waits_behind)).

use std::time::Duration;

use bytes::Bytes;
use pslite_proto::replica::RangeMap;
use pslite_proto::store::StoreMsg;
use pslite_proto::{Message, Node, NodeId};

use crate::checkpoint::disk::Io;
use crate::effects::{Output, Route, WaitingFor};
use crate::error::Failure;
use crate::hold::waits_behind;

/// Where a driver carries the core's outputs out.
pub trait Backend {
    /// The link to `node` (this node's identity on it, and the key it
    /// presents) is reserved: messages to it may be written from now on.
    fn link(&mut self, node: &Node, identity: NodeId, key: Option<u64>);
    /// The link to `id` is gone.
    fn unlink(&mut self, id: NodeId);
    /// Opens the connection reserved with [`Backend::link`], the way
    /// `route` says.
    fn connect(&mut self, node: Node, identity: NodeId, key: Option<u64>, route: Route);
    /// Puts `msg` on the connection to `meta.recver`.
    fn send(&mut self, msg: Message);
    /// Offers a data message to the apps; `Err` hands it back when their
    /// queue is full.
    // A refused message is handed back as it came: boxing it would cost an
    // allocation per refusal for nothing.
    #[allow(clippy::result_large_err)]
    fn deliver(&mut self, msg: Message) -> Result<(), Message>;
    /// Asks app `app` for a copy of its state of keys `[begin, end)`.
    fn snapshot(&mut self, app: i32, token: u64, begin: u64, end: u64);
    /// Hands app `app` a copy of its state of keys `[begin, end)`.
    fn restore(&mut self, app: i32, token: u64, begin: u64, end: u64, data: Bytes);
    /// A data message this node sent was given up on.
    fn undeliverable(&mut self, msg: Message, failure: Failure);
    /// Node `id` is dead for good.
    fn peer_dead(&mut self, id: NodeId, failure: Failure);
    /// The node cannot go on.
    fn failed(&mut self, failure: Failure);
    /// Elastic mode: a round began.
    fn round_began(&mut self, round: u64, workers: Vec<NodeId>);
    /// Replicated key ranges: a new range map.
    fn range_map(&mut self, map: RangeMap);
    /// Checkpoints: a file operation, answered with
    /// [`crate::Core::checkpoint_io_done`].
    fn checkpoint_io(&mut self, token: u64, io: Io);
    /// An answer to an admin client on connection `route` (`reserved`
    /// bytes of the reply budget, given back once written or dropped).
    fn reply(&mut self, route: Bytes, msg: Message, reserved: usize);
    /// An event of a watched store key, for these watchers.
    fn store_event(&mut self, watchers: Vec<u64>, event: StoreMsg);
    /// This node still waits to join.
    fn waiting(&mut self, what: WaitingFor, waited: Duration, limit: Duration);
}

/// The first pass over a batch: the links it opens and closes, in order
/// (a connection closed and opened again in one batch ends up open).
pub fn links_first(outputs: &[Output], to: &mut impl Backend) {
    for out in outputs {
        match out {
            Output::Connect {
                node,
                identity,
                key,
                ..
            } => to.link(node, *identity, *key),
            Output::Disconnect(id) => to.unlink(*id),
            _ => {}
        }
    }
}

/// The second pass: carries `outputs` out in order. Returns what the apps
/// refused (the first refused, and everything for the apps after it), for
/// [`crate::Core::park`].
pub fn carry_out(outputs: Vec<Output>, to: &mut impl Backend) -> Vec<Output> {
    let mut refused = Vec::new();
    for out in outputs {
        if !refused.is_empty() && waits_behind(&out) {
            refused.push(out);
            continue;
        }
        match out {
            Output::Connect {
                node,
                identity,
                route,
                key,
            } => to.connect(node, identity, key, route),
            // Closed by the first pass.
            Output::Disconnect(_) => {}
            Output::Send(msg) => to.send(msg),
            Output::Deliver(msg) => {
                if let Err(msg) = to.deliver(msg) {
                    refused.push(Output::Deliver(msg));
                }
            }
            Output::Snapshot {
                token,
                begin,
                end,
                apps,
                ..
            } => {
                for app in apps {
                    to.snapshot(app, token, begin, end);
                }
            }
            Output::Restore {
                token,
                begin,
                end,
                apps,
                data,
                ..
            } => {
                for (app, data) in apps.into_iter().zip(data) {
                    to.restore(app, token, begin, end, data);
                }
            }
            Output::Undeliverable(msg, failure) => to.undeliverable(msg, failure),
            Output::PeerDead(id, failure) => to.peer_dead(id, failure),
            Output::Failed(failure) => to.failed(failure),
            Output::RoundBegan { round, workers } => to.round_began(round, workers),
            Output::RangeMap(map) => to.range_map(map),
            Output::Checkpoint { token, io } => to.checkpoint_io(token, io),
            Output::Reply {
                route,
                msg,
                reserved,
            } => to.reply(route, msg, reserved),
            Output::StoreEvent { watchers, event } => to.store_event(watchers, event),
            Output::Waiting {
                waited,
                limit,
                what,
            } => to.waiting(what, waited, limit),
        }
    }
    refused
}
