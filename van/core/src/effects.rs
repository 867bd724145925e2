//! What the core asks its driver to do ([`Output`]), and the words for it:
//! how to reach a peer ([`Route`]), what a joining node waits for
//! ([`WaitingFor`]). A leaf: it names messages, nodes and failures, no
//! state machine.

use std::time::Duration;

use pslite_proto::store::StoreMsg;
use pslite_proto::{Message, Node, NodeId};

use crate::error::Failure;

/// Something the driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Open (or replace) the connection to `node`, identified as `identity`
    /// ([`pslite_proto::K_EMPTY`]: anonymous, before this node has an id), the way
    /// `route` says.
    Connect {
        /// The peer.
        node: Node,
        /// This node's identity on that connection.
        identity: NodeId,
        /// How to reach it.
        route: Route,
        /// The key to present with it (`ps<id>/<key>`, see
        /// [`crate::address::keyed_identity`]), when both entries carry one.
        key: Option<u64>,
    },
    /// Close the connection to `id` (opened by [`Output::Connect`]).
    Disconnect(NodeId),
    /// Put this message on the connection to `meta.recver`.
    Send(Message),
    /// Hand this data message to the apps.
    Deliver(Message),
    /// A data message this node sent was given up on: its request failed.
    Undeliverable(Message, Failure),
    /// Node `id` died and nothing replaced it in time, or it restarted
    /// without `PS_RESEND`: requests waiting on it fail with the failure.
    PeerDead(NodeId, Failure),
    /// The node cannot go on: every wait fails.
    Failed(Failure),
    /// Send this message to an admin client (`pslite status`, `pslite
    /// store`), which is not a cluster member, back on the connection its
    /// request came on: through this node's ROUTER, to routing id `route`.
    /// `reserved` bytes were added to [`crate::Core::reply_gauge`] for it; the
    /// driver takes them off once ZeroMQ has written or dropped it.
    Reply {
        /// The client's connection (the routing id ZeroMQ generated).
        route: bytes::Bytes,
        /// The answer.
        msg: Message,
        /// Its share of the reply budget.
        reserved: usize,
    },
    /// Elastic mode: a round began (or this node joined one): `workers`
    /// in rank order.
    RoundBegan {
        /// The round number.
        round: u64,
        /// Its workers in rank order.
        workers: Vec<NodeId>,
    },
    /// Replicated key ranges: ask app `apps[..]` for a copy of its state
    /// of keys `[begin, end)` (range `range`), in request order; answer
    /// with [`crate::Core::snapshot_taken`], one part per app.
    Snapshot {
        /// Pairs the answers with the request.
        token: u64,
        /// The range.
        range: u32,
        /// Its first key.
        begin: u64,
        /// One past its last key (`u64::MAX`: every key from `begin` on).
        end: u64,
        /// The apps to ask.
        apps: Vec<i32>,
    },
    /// Replicated key ranges: replace the apps' state of keys `[begin, end)`
    /// by these copies (`data[i]` for app `apps[i]`); answer with
    /// [`crate::Core::restored`] per app.
    Restore {
        /// Pairs the answers with the request.
        token: u64,
        /// The range.
        range: u32,
        /// Its first key.
        begin: u64,
        /// One past its last key.
        end: u64,
        /// The app of each copy.
        apps: Vec<i32>,
        /// The copies.
        data: Vec<bytes::Bytes>,
    },
    /// Replicated key ranges: a new range map (for observers).
    RangeMap(pslite_proto::replica::RangeMap),
    /// Checkpoints: carry out this file operation
    /// (the driver's `checkpoint::disk::perform`) and answer with
    /// [`crate::Core::checkpoint_io_done`] and `token`.
    Checkpoint {
        /// Pairs the result with the request.
        token: u64,
        /// What to do.
        io: crate::checkpoint::disk::Io,
    },
    /// An event of a watched store key, for these watchers of this process
    /// (see [`crate::Core::store_watch`]); a watcher that is gone is reported back
    /// with [`crate::Core::store_watcher_gone`].
    StoreEvent {
        /// The watchers of the key.
        watchers: Vec<u64>,
        /// The event.
        event: StoreMsg,
    },
    /// This node is still waiting to join (a log line for the operator).
    Waiting {
        /// How long it has waited.
        waited: Duration,
        /// The start timeout.
        limit: Duration,
        /// What it waits for (its `Display` is the log line's wording).
        what: WaitingFor,
    },
}

/// How to reach a peer, as the core chose it from the peer's node-table
/// entry and this node's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The address the peer advertises (always works).
    pub endpoint: String,
    /// A same-host pslite peer's abstract Unix socket (`PS_IPC`), to use
    /// instead when something listens on it (a peer with `PS_IPC=0` binds
    /// none: the driver checks before connecting).
    pub local: Option<String>,
    /// The peer's process, when large frames to it go through shared memory
    /// (`PS_SHM`: a pslite peer of this host; the driver checks it may open
    /// that process's descriptors).
    pub shm_pid: Option<u32>,
}

/// What a node that has not joined yet waits for, worded for its log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitingFor {
    /// The scheduler: servers and workers that have not registered yet.
    Registrations {
        /// Servers still to register, and `DMLC_NUM_SERVER`.
        servers: (i32, i32),
        /// Workers still to register, and `DMLC_NUM_WORKER`; `None` in
        /// elastic mode (the first round's workers decide).
        workers: Option<(i32, i32)>,
    },
    /// A server or worker: the node table, which the scheduler sends once
    /// every node has registered (not only once the scheduler is up).
    NodeTable {
        /// The scheduler's address.
        scheduler: String,
        /// `DMLC_NUM_SERVER`.
        servers: i32,
        /// `DMLC_NUM_WORKER` (`MIN:MAX` in elastic mode).
        workers: String,
    },
}

impl std::fmt::Display for WaitingFor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: i32, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        // "2 servers" when none registered yet, else "1 of 2 servers".
        let of = |missing: i32, all: i32, what: &str| {
            if missing == all {
                plural(all, what)
            } else {
                format!("{missing} of {}", plural(all, what))
            }
        };
        match self {
            WaitingFor::Registrations {
                servers: (missing_servers, servers),
                workers,
            } => {
                let mut missing = Vec::new();
                if *missing_servers > 0 {
                    missing.push(of(*missing_servers, *servers, "server"));
                }
                match workers {
                    Some((0, _)) => {}
                    Some((missing_workers, workers)) => {
                        missing.push(of(*missing_workers, *workers, "worker"))
                    }
                    None => {
                        missing.push("the first round's workers (DMLC_NUM_WORKER=MIN:MAX)".into())
                    }
                }
                if missing.is_empty() {
                    f.write_str("waiting for the last registrations to be processed")
                } else {
                    write!(f, "waiting for {} to register", missing.join(" and "))
                }
            }
            WaitingFor::NodeTable {
                scheduler,
                servers,
                workers,
            } => write!(
                f,
                "waiting for the node table from the scheduler at {scheduler} (sent once \
                 {} and {workers} worker{} have registered)",
                plural(*servers, "server"),
                if workers == "1" { "" } else { "s" },
            ),
        }
    }
}
