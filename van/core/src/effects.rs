//! What the parts of the core ask for, as values: a component emits
//! [`Effect`]s (a message to send, a connection, something for the apps or
//! the driver, an [`Event`] for the others); the core carries each out in
//! order and hands the driver [`Output`]s. A leaf: it names messages,
//! nodes and failures, no state machine, and no component is imported
//! here.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use pslite_proto::store::StoreMsg;
use pslite_proto::{Message, Node, NodeId};

use crate::error::Failure;

/// Something a component asks for. The core carries effects out in the
/// order they were emitted, each before the next: what carrying one out
/// makes (another component's effects) comes first.
// Most effects are sends that live only until the core takes them:
// boxing the message would cost an allocation per send for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Send this message to `meta.recver`. It goes through the outgoing
    /// pipeline from the stage after the component that made it: the
    /// sender and (for control messages) a timestamp are stamped, the
    /// connection is opened on first use, and it is kept for resending.
    Send(Message),
    /// Open (or replace) the connection to this node, under this node's
    /// identity.
    Connect(Node),
    /// Open a connection to this node without an identity (the scheduler's
    /// check of a registration's address).
    ConnectAnonymous(Node),
    /// Close the connection to this node (or check link).
    Disconnect(NodeId),
    /// Something for the apps ([`Output::Deliver`], [`Output::Snapshot`],
    /// [`Output::Restore`]), in order: behind what the apps were not given
    /// yet (see `crate::hold`).
    ForApps(Output),
    /// Something for the driver.
    Out(Output),
    /// An answer to an admin client (a status table) on connection
    /// `route`, within the budget of unread answers; the scheduler's own
    /// row gets its counters.
    Reply(Bytes, Message),
    /// Tell the components that take it.
    Event(Event),
    /// The node cannot go on: every wait fails with this.
    Fail(Failure),
    /// Something a waiter looks at changed.
    Changed,
    /// Route this message again through the core's table, as if it had
    /// just arrived (past the transport's checks): a message released from
    /// a hold.
    Route(Message),
}

/// What a component announces for the others; the core routes each to the
/// components that take it (see `core/events.rs`). Components never call
/// each other: this is how one learns what another did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// This node joined: its id and node table are known (membership).
    Joined,
    /// This node took a node table from the scheduler (membership): what
    /// came with it applies now.
    TableTaken,
    /// Node `id` restarted and took its old id (membership, or on the
    /// scheduler its recovery): what it never answered goes to the new
    /// process.
    PeerReplaced(NodeId),
    /// Node `id` died and nothing replaced it in time (membership).
    PeerDead(NodeId),
    /// The nodes the scheduler declares dead now changed (membership, from
    /// a pslite scheduler's heartbeat): they may still be replaced.
    DeadNodes(Vec<NodeId>),
    /// Elastic mode: this node's round began (membership).
    RoundBegan {
        /// The round number.
        round: u64,
        /// Its workers in rank order.
        workers: Vec<NodeId>,
    },
    /// This node still waits to join (membership): a log line.
    Waiting {
        /// How long it has waited.
        waited: Duration,
        /// The start timeout.
        limit: Duration,
    },
    /// The scheduler is about to send the node tables that form the
    /// cluster, to these servers (the range map forms first, so the tables
    /// carry it).
    Forming(Vec<NodeId>),
    /// The scheduler formed the cluster: its table, this scheduler last.
    Formed(Vec<Node>),
    /// The scheduler's table changed after the cluster formed: its table,
    /// this scheduler last.
    TableChanged(Vec<Node>),
    /// Restarted processes are about to take over these ids (the node
    /// tables and updates naming them follow).
    Replacing(Vec<NodeId>),
    /// The processes that took over these ids have been told their table,
    /// and the others the new addresses.
    Replaced(Vec<NodeId>),
    /// Elastic mode: the scheduler began a round.
    Round {
        /// The round number.
        round: u64,
        /// Its workers in rank order.
        workers: Vec<NodeId>,
    },
    /// The scheduler is about to release the barrier over `group` to
    /// `to` (the releases follow, one message each).
    Releasing {
        /// The barrier's group.
        group: i32,
        /// The nodes released.
        to: Vec<NodeId>,
    },
    /// A registration whose address completed a handshake: the scheduler
    /// takes it.
    Registered(Box<Message>),
    /// Replicated key ranges: server `server`'s ranges failed over (or a
    /// replacement took its id again: `false`); barriers stop (or start
    /// again) waiting for it.
    FailedOver {
        /// The server.
        server: NodeId,
        /// Whether its ranges moved to the others.
        failed_over: bool,
    },
    /// A server left the job by itself, its ranges handed over.
    ServerLeft(NodeId),
    /// On the scheduler: the job cannot go on (a key range with no replica
    /// left): every node is told why, then the scheduler fails.
    StopJob(String),
    /// On the scheduler: process `id`, held dead, was heard from again and
    /// nothing took its place (a pause, lost heartbeats): it is taken back.
    /// With replicated key ranges it rejoins as a fresh replica.
    Back(NodeId),
    /// Key ranges are replicated in this cluster (a dead server's ranges
    /// fail over; nothing waits for its replacement).
    Replicated,
    /// A worker's request was answered: copies of it still resent to
    /// earlier primaries stop.
    Answered {
        /// Its app.
        app: i32,
        /// Its customer.
        customer: i32,
        /// Its timestamp.
        timestamp: i32,
        /// Its range.
        range: u32,
    },
    /// This server left the job (its ranges are on the others): its waits
    /// are over, and closed connections are no deaths any more.
    Left,
    /// This node failed (the core announces it once): every wait ends
    /// with it, and nobody is watched any more.
    Failed(Failure),
    /// The resender gave up on a data message (never acknowledged, or its
    /// receiver is dead): its request fails, unless the range map decides
    /// where it goes next.
    GaveUp(Box<(Message, Failure)>),
}

/// The effects a component emitted, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects(Vec<Effect>);

impl Effects {
    /// Emits `effect`.
    pub fn push(&mut self, effect: Effect) {
        self.0.push(effect);
    }

    /// Sends `msg` (see [`Effect::Send`]).
    pub fn send(&mut self, msg: Message) {
        self.0.push(Effect::Send(msg));
    }

    /// Announces `event` (see [`Effect::Event`]).
    pub fn event(&mut self, event: Event) {
        self.0.push(Effect::Event(event));
    }

    /// Hands `out` to the driver.
    pub fn out(&mut self, out: Output) {
        self.0.push(Effect::Out(out));
    }

    /// Whether nothing was emitted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many effects were emitted.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The effects, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Effect> {
        self.0.iter()
    }

    /// Takes the effects, in order.
    pub fn take(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.0)
    }

    /// The messages sent, in order.
    pub fn sends(&self) -> Vec<&Message> {
        self.0
            .iter()
            .filter_map(|e| match e {
                Effect::Send(m) => Some(m),
                _ => None,
            })
            .collect()
    }
}

impl Extend<Effect> for Effects {
    fn extend<I: IntoIterator<Item = Effect>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl IntoIterator for Effects {
    type Item = Effect;
    type IntoIter = std::vec::IntoIter<Effect>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

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
        io: Io,
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
    /// Whether the core wants this connection's [`crate::LinkEvent`]s:
    /// every connection of the scheduler (deaths, registration checks),
    /// and a node's connection to its scheduler. A socket monitor costs
    /// the driver two sockets, so nothing else is watched.
    pub watch: bool,
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

/// What happened to one of this node's connections (its DEALER to a peer),
/// as the driver's socket monitor saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// ZeroMQ's handshake with the peer went through: the connection is up.
    Up,
    /// The connection closed (the peer's process is gone, or the network
    /// dropped it); ZeroMQ tries to connect again.
    Down,
    /// An attempt to connect failed (refused, or not accepted in time) and
    /// ZeroMQ will try again: nothing listens at the peer's address, say
    /// its process died before this node's connection came up.
    Unreachable,
    /// The peer refused the handshake (a wrong `PS_AUTH_TOKEN`, or a
    /// mechanism mismatch); with why, naming what to set.
    Refused(String),
}

/// A file operation the checkpoint protocol asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Io {
    /// Write `bytes` to `path` atomically.
    Write {
        /// Where.
        path: PathBuf,
        /// What.
        bytes: Bytes,
    },
    /// Read each of `paths` whole (the first that exists of each list).
    Read {
        /// Candidates per file wanted, in order of preference.
        paths: Vec<Vec<PathBuf>>,
    },
    /// Delete the checkpoints of job `job` in `dir` below id `below`
    /// (another job's are left alone).
    Prune {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The oldest id to keep.
        below: u64,
        /// The job whose checkpoints go.
        job: String,
    },
    /// Write a manifest, then `LATEST` naming its checkpoint.
    Complete {
        /// The manifest's path.
        manifest: PathBuf,
        /// Its bytes.
        bytes: Bytes,
        /// `LATEST`'s path.
        latest: PathBuf,
        /// What it holds (`checkpoint::disk::latest_text`).
        text: String,
    },
    /// Delete a checkpoint's directory (a failed one leaves nothing).
    Remove {
        /// The directory.
        dir: PathBuf,
    },
}

/// What came of an [`Io`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoResult {
    /// Written (or pruned).
    Done,
    /// Read: for each list of candidates, the path read and its bytes.
    Read(Vec<(PathBuf, Bytes)>),
    /// It failed; says which file and why.
    Failed(String),
}

/// Tokens of the apps' snapshot and restore requests made for checkpoints
/// have this bit set (replication's never do).
pub const TOKEN_BIT: u64 = 1 << 63;

/// Whether an apps' request token is a checkpoint's.
pub fn is_checkpoint_token(token: u64) -> bool {
    token & TOKEN_BIT != 0
}
