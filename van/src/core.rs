//! The control-plane core of one node: the [`Member`] (node side), on the
//! scheduler the [`Scheduler`], and with `PS_RESEND=1` the [`Resender`],
//! composed behind one interface with no sockets, no threads and no clock.
//!
//! The driver ([`crate::Van`]) feeds it what arrives ([`Core::handle`]),
//! what the apps send ([`Core::send`]), the user's waits ([`Core::register`],
//! [`Core::barrier`]) and the time ([`Core::tick`] at
//! [`Core::poll_timeout`]); it collects [`Output`]s to carry out
//! ([`Core::take_output`]). Every decision (who may send what, when to
//! acknowledge, resend, hold back, give up) is taken here, so whole clusters
//! of cores can be tested in an in-memory network with virtual time
//! (see `harness.rs`).

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use std::sync::Arc;

use crate::config::VanConfig;
use crate::counters::{Counters, DropReason};
use crate::error::{Failure, StartTimeout, VanError};
use crate::hold::HoldQueue;
use crate::log_once::LogOnce;
use crate::member::{BarrierOutcome, Member, MemberAction, MemberConfig};
use crate::registration::{Offered, Registrations};
use crate::resender::{Received, Resender};
use crate::scheduler::{Action, Scheduler, SchedulerConfig};
use crate::store::{ClientInput, Requester, StoreClient, StoreHost, StoreReply};
use crate::transport::Transport;
use pslite_proto::store::{OverLimit, StoreLimit, StoreMsg, StoreOp};

/// Something the driver must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Open (or replace) the connection to `node`, identified as `identity`
    /// ([`K_EMPTY`]: anonymous, before this node has an id), the way
    /// `route` says.
    Connect {
        /// The peer.
        node: Node,
        /// This node's identity on that connection.
        identity: NodeId,
        /// How to reach it.
        route: Route,
        /// The key to present with it (`ps<id>/<key>`, see
        /// [`crate::transport::keyed_identity`]), when both entries carry one.
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
    /// `reserved` bytes were added to [`Core::reply_gauge`] for it; the
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
    /// with [`Core::snapshot_taken`], one part per app.
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
    /// [`Core::restored`] per app.
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
    /// ([`crate::checkpoint::disk::perform`]) and answer with
    /// [`Core::checkpoint_io_done`] and `token`.
    Checkpoint {
        /// Pairs the result with the request.
        token: u64,
        /// What to do.
        io: crate::checkpoint::disk::Io,
    },
    /// An event of a watched store key, for these watchers of this process
    /// (see [`Core::store_watch`]); a watcher that is gone is reported back
    /// with [`Core::store_watcher_gone`].
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
    /// Whether the core wants this connection's [`LinkEvent`]s: every
    /// connection of the scheduler (deaths, registration checks), and a
    /// node's connection to its scheduler. A socket monitor costs the
    /// driver two sockets, so nothing else is watched.
    pub watch: bool,
}

/// A message refused because its identity names a node of the table
/// without that node's key: a stranger using a member's identity, or an
/// earlier process of a node that was replaced. Its `Display` is the log
/// line (the driver adds the connection's address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityRefused {
    /// The id the identity names.
    pub id: NodeId,
    /// The key it carried, if any.
    pub presented: Option<u64>,
    /// The message, described.
    pub what: String,
}

impl std::fmt::Display for IdentityRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.id;
        let identity = crate::transport::keyed_identity(id, self.presented);
        write!(
            f,
            "ignoring messages with identity {identity}: it names node {id} without the key of \
             node {id}'s process in the node table (a stranger using its identity, or an earlier \
             process of node {id}); first one: {}",
            self.what
        )
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

/// One node's control plane.
pub struct Core {
    cfg: VanConfig,
    member: Member,
    scheduler: Option<Scheduler>,
    resender: Option<Resender>,
    rng: StdRng,
    /// What this node counts (traffic, resends, drops); atomics, shared
    /// with the driver and the apps.
    counters: Arc<Counters>,
    next_timestamp: i32,
    /// Peers with an open connection (asked for with [`Output::Connect`]).
    connected: HashSet<NodeId>,
    /// Peers heard from at least once.
    heard: HashSet<NodeId>,
    /// Peers that acknowledged at least once (the others may never: a C++
    /// node without `PS_RESEND`).
    acked_by: HashSet<NodeId>,
    /// Data that arrived before this node joined (`PS_HOLD_LIMIT`).
    held: HoldQueue<Message>,
    /// Elastic mode, on a server: data from a worker id not in the table
    /// yet (a newcomer whose push beat the scheduler's table here); looked
    /// at again when the next table arrives.
    held_newcomers: HoldQueue<Message>,
    /// Data messages the apps could not take yet (a customer's queue is
    /// full), in order: while any waits, the driver reads nothing more.
    parked: VecDeque<Output>,
    /// The driver cannot read for a reason of its own (short of file
    /// descriptors for a shared-memory frame, say).
    stalled: bool,
    /// Since when this node reads nothing (see [`Core::is_listening`]).
    deaf_since: Option<Instant>,
    /// Identities that sent something before they could have been assigned.
    early_ids: BTreeSet<NodeId>,
    /// Data messages dropped because their sender may not send them.
    rejected: u64,
    /// Drops already warned about, by sender and cause.
    dropped: LogOnce<(NodeId, &'static str)>,
    /// Ids whose identity was refused (logged once each).
    refused_identities: HashSet<NodeId>,
    /// On the scheduler: earlier processes (id, key) told to stop.
    fenced: HashSet<(NodeId, u64)>,
    /// On the scheduler: registrations waiting for their address to be
    /// checked.
    registrations: Registrations,
    /// Refused registration addresses logged at warning level.
    refusals_logged: HashSet<String>,
    /// Bytes of answers to admin clients not written yet (see
    /// [`Core::reply_gauge`]).
    reply_bytes: Arc<std::sync::atomic::AtomicUsize>,
    stopped: bool,
    /// Stopping (finalized): only resends go on (no more deaths or losses
    /// declared) until the exit drain ends.
    drain: Option<Drain>,
    /// The app is finalizing (see [`Core::finalizing`]): its last barrier's
    /// release starts the leaving.
    finalize_pending: bool,
    /// Leaving (the last barrier was released): closed connections are no
    /// deaths.
    finalizing: bool,
    changed: bool,
    out: Vec<Output>,
    /// On the scheduler: the key-value store it hosts.
    store_host: Option<StoreHost>,
    /// This node's store requests and watches.
    store_client: StoreClient,
    /// On the scheduler: the nodes dead at the last tick, whose waits and
    /// watches the store has dropped.
    store_dead: BTreeSet<NodeId>,
    /// Replicated key ranges (`crate::replica`).
    replication: replication::Replication,
    /// On the scheduler: servers whose death the range map has taken in.
    replica_dead: BTreeSet<NodeId>,
    /// On a server: the apps whose state is copied to joining servers.
    replicated_apps: BTreeSet<i32>,
    /// The timestamp of this node's next replication message.
    replica_ts: i32,
    /// Checkpoints (`crate::checkpoint`).
    checkpoints: checkpoint::Checkpoints,
    /// On a server: its leave from the job (`DMLC_NUM_SERVER=MIN:MAX`).
    leave: servers::Leave,
}

mod checkpoint;
mod replication;
mod servers;

/// The exit drain: a stopping node gives what it sent time to be
/// acknowledged (the scheduler's last barrier release, say), up to 15 resend
/// timeouts and at most [`MAX_DRAIN`].
struct Drain {
    started: Instant,
    deadline: Instant,
    outcome: Option<DrainOutcome>,
}

/// The longest exit drain.
pub const MAX_DRAIN: Duration = Duration::from_secs(30);
/// Resend timeouts an exit drain lasts at most.
pub const DRAIN_RESEND_TIMEOUTS: u32 = 15;

/// How a stopping node's exit drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Nothing worth waiting for is unacknowledged.
    Flushed,
    /// The drain's deadline passed with these messages unacknowledged
    /// (described for logs).
    GaveUp {
        /// How long it waited.
        waited: Duration,
        /// What it waited for.
        left: Vec<String>,
    },
    /// The node failed meanwhile: nothing is worth waiting for.
    Failed,
}

/// Why a data message with inconsistent frames is dropped.
const MALFORMED: &str = "its data frames and data types differ in number";

/// The UNWATCH a finalizing node sends ([`Core::store_leave`]): not worth
/// waiting for at exit (the scheduler may be stopping too; a scheduler that
/// stays drops the watches when the node is declared dead).
fn is_leaving_unwatch(msg: &Message) -> bool {
    msg.meta.control.cmd == Command::Store
        && msg
            .meta
            .store
            .as_ref()
            .is_some_and(|s| s.op == StoreOp::Unwatch && s.keys.is_empty())
}

/// About how many bytes a store answer takes on the wire.
fn reply_size(store: &StoreMsg) -> usize {
    store.value.as_ref().map_or(0, |v| v.len())
        + store.expected.as_ref().map_or(0, |v| v.len())
        + store.values.iter().map(|v| v.len() + 4).sum::<usize>()
        + store.keys.iter().map(|k| k.len() + 4).sum::<usize>()
        + 64
}

impl Core {
    /// The core of the node `cfg` describes, listening at `port`. The first
    /// output connects to the scheduler (the scheduler to itself).
    pub fn new(cfg: &VanConfig, port: i32, now: Instant, seed: u64) -> Core {
        let is_scheduler = cfg.role == Role::Scheduler;
        let host = if is_scheduler {
            cfg.scheduler_host.clone()
        } else {
            cfg.host.clone()
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let mut me = Node::new(cfg.role, host, port);
        me.pslite = true;
        // The key this process presents in its identity to pslite peers:
        // random, never 0 (0 means "no key").
        me.key = rng.random::<u64>() | 1;
        if let Some((host, pid)) = &cfg.shm_identity {
            me.host = host.clone();
            me.pid = *pid;
        }
        let mut scheduler_node = Node::new(Role::Scheduler, cfg.scheduler_host.clone(), {
            if is_scheduler {
                port
            } else {
                cfg.scheduler_port
            }
        });
        scheduler_node.id = SCHEDULER;
        let scheduler = is_scheduler.then(|| {
            me.id = SCHEDULER;
            Scheduler::new(
                SchedulerConfig {
                    num_servers: cfg.num_servers,
                    min_servers: cfg.min_servers,
                    num_workers: cfg.num_workers,
                    me: me.clone(),
                    heartbeat_timeout: cfg.heartbeat_timeout,
                    recovery_timeout: cfg.recovery_timeout,
                    watch_all: cfg.watch_all,
                    elastic: cfg.elastic,
                },
                now,
            )
        });
        let member = Member::new(
            MemberConfig {
                me: me.clone(),
                scheduler: scheduler_node.clone(),
                num_servers: cfg.num_servers,
                num_workers: cfg.num_workers,
                start_timeout: cfg.start_timeout,
                heartbeat_interval: cfg.heartbeat_interval,
                heartbeat_timeout: cfg.heartbeat_timeout,
                watch_all: cfg.watch_all,
                recovery_timeout: cfg.recovery_timeout,
            },
            now,
        );
        let mut core = Core {
            cfg: cfg.clone(),
            member,
            scheduler,
            resender: cfg
                .resend_timeout
                .map(|t| Resender::new(t, cfg.max_resends)),
            rng,
            counters: Arc::new(Counters::new()),
            next_timestamp: 0,
            connected: HashSet::new(),
            heard: HashSet::new(),
            acked_by: HashSet::new(),
            held: HoldQueue::new(cfg.hold_limit),
            held_newcomers: HoldQueue::new(cfg.hold_limit),
            parked: VecDeque::new(),
            stalled: false,
            deaf_since: None,
            early_ids: BTreeSet::new(),
            rejected: 0,
            dropped: LogOnce::new(log::Level::Warn),
            refused_identities: HashSet::new(),
            fenced: HashSet::new(),
            registrations: Registrations::default(),
            refusals_logged: HashSet::new(),
            reply_bytes: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            stopped: false,
            drain: None,
            finalize_pending: false,
            finalizing: false,
            changed: false,
            out: Vec::new(),
            store_host: is_scheduler.then(|| StoreHost::new(cfg.store_limits)),
            store_client: StoreClient::default(),
            store_dead: BTreeSet::new(),
            replication: if is_scheduler {
                replication::Replication::for_scheduler(
                    cfg.num_servers,
                    cfg.replicas,
                    cfg.min_servers.is_some(),
                )
            } else {
                replication::Replication::Off
            },
            replica_dead: BTreeSet::new(),
            replicated_apps: BTreeSet::from([0]),
            replica_ts: 0,
            checkpoints: checkpoint::Checkpoints::for_config(cfg),
            leave: servers::Leave::No,
        };
        core.replica_ts = core.rng.random::<i32>() & i32::MAX;
        // The scheduler talks to itself through its own ROUTER; a node makes
        // first contact with an empty identity (it has no id yet).
        let identity = core.member.me().id;
        let first = if is_scheduler {
            core.member.me().clone()
        } else {
            scheduler_node
        };
        core.connect(first, identity);
        core
    }

    /// Counts into `counters` instead of counters of its own (the
    /// Postoffice shares them with its apps).
    pub fn with_counters(mut self, counters: Arc<Counters>) -> Core {
        self.counters = counters;
        self
    }

    /// What this node counts.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// This node as the cluster knows it (its id once joined).
    pub fn me(&self) -> &Node {
        self.member.me()
    }

    /// The entry of node `id` in the node table, if it has one.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.member.node(id)
    }

    /// The node table: servers, workers and the scheduler, once joined.
    pub fn nodes(&self) -> Vec<Node> {
        self.member.table().to_vec()
    }

    /// Whether this node has joined the cluster.
    pub fn is_joined(&self) -> bool {
        self.member.is_joined()
    }

    /// Elastic mode: the current round and its workers in rank order, once
    /// known.
    pub fn round(&self) -> Option<(u64, Vec<NodeId>)> {
        self.member.round().map(|(n, m)| (n, m.to_vec()))
    }

    /// Elastic mode: the round this node joined in (a worker admitted after
    /// the first round skips the start barrier: the others are past it).
    pub fn joined_round(&self) -> Option<u64> {
        self.member.joined_round()
    }

    /// Elastic mode, on a worker: leaves the job (its round ends).
    pub fn leave(&mut self, now: Instant) {
        if self.cfg.elastic.is_none() || self.cfg.role != Role::Worker || !self.is_joined() {
            return;
        }
        let msg = Message::control(Command::Leave, SCHEDULER);
        self.emit(msg, now);
    }

    /// Why the node failed, if it did.
    pub fn failure(&self) -> Option<&Failure> {
        self.member.failure()
    }

    /// Identities heard from before they could have been assigned: a hint
    /// of an identity conflict when the cluster does not form.
    pub fn identity_conflicts(&self) -> Vec<NodeId> {
        self.early_ids.iter().copied().collect()
    }

    /// Data messages dropped because their sender may not send them.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// What the driver must do now, in order.
    pub fn take_output(&mut self) -> Vec<Output> {
        let out = std::mem::take(&mut self.out);
        self.checkpoint_filter(out)
    }

    /// Whether something a waiter looks at changed since the last call
    /// (joined, a barrier ended, an acknowledgement, a failure).
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// A fresh timestamp for a control message.
    pub fn next_timestamp(&mut self) -> i32 {
        let ts = self.next_timestamp;
        self.next_timestamp = self.next_timestamp.wrapping_add(1) & i32::MAX;
        ts
    }

    /// Starts joining the cluster as `customer_id` (see [`Core::join_status`]).
    pub fn register(&mut self, customer_id: i32, now: Instant) {
        let actions = self.member.register(customer_id, now);
        self.apply_member(actions, now);
    }

    /// What this node waits for while it joins.
    fn waiting_for(&self) -> WaitingFor {
        match &self.scheduler {
            Some(s) => {
                let missing = s.missing();
                WaitingFor::Registrations {
                    servers: (
                        missing.servers,
                        self.cfg.min_servers.unwrap_or(self.cfg.num_servers),
                    ),
                    workers: self
                        .cfg
                        .elastic
                        .is_none()
                        .then_some((missing.workers, self.cfg.num_workers)),
                }
            }
            None => WaitingFor::NodeTable {
                scheduler: format!("{}:{}", self.cfg.scheduler_host, self.cfg.scheduler_port),
                servers: self.cfg.num_servers,
                workers: match &self.cfg.elastic {
                    Some(e) => format!("{}:{}", e.min, e.max),
                    None => self.cfg.num_workers.to_string(),
                },
            },
        }
    }

    /// `None` while joining; then joined, or why not.
    pub fn join_status(&self) -> Option<Result<(), VanError>> {
        if self.member.is_joined() {
            return Some(Ok(()));
        }
        if let Some(f) = self.member.failure() {
            return Some(Err(f.clone().into()));
        }
        let waited = self.member.timed_out()?;
        let missing = self.scheduler.as_ref().map(|s| s.missing());
        Some(Err(VanError::StartTimeout(Box::new(StartTimeout {
            waited,
            missing_servers: missing.map(|m| m.servers),
            missing_workers: missing.map(|m| m.workers),
            num_servers: self.cfg.num_servers,
            num_workers: self.cfg.num_workers,
            scheduler: format!("{}:{}", self.cfg.scheduler_host, self.cfg.scheduler_port),
            advertised: self.member.me().address(),
            identity_conflicts: self.identity_conflicts(),
            refused_registrations: self.registrations.refused().into(),
        }))))
    }

    /// Prepares a message an app sends: checks that the node can send it,
    /// opens the connection on first use, stamps the sender and records it
    /// for resending. Returns the message to put on the wire.
    /// Returns `None` when there is nothing to send now (replicated key
    /// ranges: an answer held until the backups have the push).
    pub fn send(&mut self, msg: Message, now: Instant) -> Result<Option<Message>, VanError> {
        if let Some(f) = self.member.failure() {
            return Err(f.clone().into());
        }
        let Some(msg) = self.replica_outgoing(msg, now)? else {
            return Ok(None);
        };
        self.prepare(msg, now).map(Some)
    }

    /// A message [`Core::send`] prepared could not be put on the wire.
    pub fn send_failed(&mut self, msg: &Message) {
        if let Some(r) = &mut self.resender {
            r.forget(msg);
        }
    }

    fn prepare(&mut self, mut msg: Message, now: Instant) -> Result<Message, VanError> {
        let recver = msg.meta.recver;
        if !self.connected.contains(&recver) {
            if !self.member.is_joined() {
                return Err(VanError::NotReady);
            }
            let node = self
                .member
                .node(recver)
                .cloned()
                .ok_or(VanError::UnknownPeer(recver))?;
            let identity = self.member.me().id;
            self.connect(node, identity);
        }
        msg.meta.sender = self.member.me().id;
        // Remember it before it leaves: the ACK may beat us back.
        if let Some(r) = &mut self.resender {
            r.on_send(&msg, now);
        }
        Ok(msg)
    }

    fn connect(&mut self, node: Node, identity: NodeId) {
        self.connected.insert(node.id);
        let route = self.route(&node);
        let key = if identity == K_EMPTY {
            None
        } else {
            self.expected_key_of(&node).map(|_| self.member.me().key)
        };
        self.out.push(Output::Connect {
            node,
            identity,
            route,
            key,
        });
    }

    /// How to reach `node`: over its abstract Unix socket when it is a
    /// pslite node of this host and both listen on one (`PS_IPC`), else at
    /// the address it advertises (C++ nodes and other hosts: always); large
    /// frames through shared memory when it is a same-host shared-memory
    /// peer.
    fn route(&self, node: &Node) -> Route {
        let endpoint = self
            .cfg
            .transport
            .connect_endpoint(&node.hostname, node.port);
        if node.id < 0 {
            // A registration's check: the address it names, as named.
            return Route {
                endpoint,
                local: None,
                shm_pid: None,
                watch: true,
            };
        }
        let local = match (&self.cfg.shm_identity, self.cfg.transport) {
            (Some((host, _)), Transport::Tcp) if self.cfg.ipc && self.same_host(node) => {
                Some(crate::transport::local_endpoint(host, node.pid, node.port))
            }
            _ => None,
        };
        Route {
            endpoint,
            local,
            shm_pid: self.shm_peer_node(node),
            watch: self.scheduler.is_some() || node.id == SCHEDULER,
        }
    }

    /// Whether `node` is a pslite node of this host (same host identity)
    /// that uses shared memory.
    fn same_host(&self, node: &Node) -> bool {
        self.cfg.shm_identity.as_ref().is_some_and(|(host, _)| {
            node.pslite && node.pid != 0 && !node.host.is_empty() && node.host == *host
        })
    }

    fn shm_peer_node(&self, node: &Node) -> Option<u32> {
        self.same_host(node).then_some(node.pid)
    }

    /// Node `id`'s process, if its frames may come through shared memory:
    /// a same-host pslite peer in the node table (never from the message).
    /// `key` is the key the message's identity carried: a stranger using a
    /// member's id is no shared-memory peer.
    pub fn shm_peer(&self, id: NodeId, key: Option<u64>) -> Option<u32> {
        self.sender_node(id, key)
            .and_then(|node| self.shm_peer_node(node))
    }

    /// What happened to this node's connection to `peer` (see
    /// [`LinkEvent`]): a connection that closes and stays closed, with
    /// nothing heard from the peer meanwhile, means its process is gone,
    /// noticed within `LINK_GRACE` (1 s) instead of a heartbeat
    /// timeout (the scheduler declares it dead; a node loses its
    /// scheduler). A refused handshake with the scheduler fails a node
    /// that has `PS_AUTH_TOKEN` at once.
    pub fn link_event(&mut self, peer: NodeId, event: LinkEvent, now: Instant) {
        if self.registrations.is_check(peer) {
            match event {
                LinkEvent::Up => {
                    for msg in self.registrations.link_up(peer) {
                        self.run_scheduler(&msg, now);
                    }
                    self.end_check(peer, now);
                }
                LinkEvent::Refused(why) => {
                    if let Some((node, why)) = self.registrations.link_refused(peer, &why) {
                        self.registration_refused(&node, &why);
                    }
                    self.end_check(peer, now);
                }
                // ZeroMQ tries again until the check's deadline.
                LinkEvent::Down | LinkEvent::Unreachable => {}
            }
            return;
        }
        let to_scheduler = peer == SCHEDULER && self.scheduler.is_none();
        match event {
            LinkEvent::Refused(why) => {
                if to_scheduler && self.cfg.auth_token.is_some() {
                    self.fail(Failure::AuthRefused { detail: why }, now);
                } else {
                    debug!("the handshake with node {peer} failed: {why}");
                }
            }
            // The scheduler connects to a process once it has registered,
            // so it listens: a connection that cannot be made is as closed
            // (a process killed before the scheduler's connection came up
            // sends no DISCONNECTED). A node ignores it: it may reach the
            // scheduler before the scheduler listens.
            LinkEvent::Unreachable | LinkEvent::Down if self.finalizing => {
                debug!("connection to node {peer} closed while finalizing");
            }
            LinkEvent::Unreachable => {
                if let Some(s) = &mut self.scheduler {
                    debug!("cannot connect to node {peer} (ZeroMQ tries again)");
                    s.link_down(peer, now);
                }
            }
            LinkEvent::Up | LinkEvent::Down => {
                let up = event == LinkEvent::Up;
                debug!(
                    "connection to node {peer} {}",
                    if up { "up" } else { "closed" }
                );
                if let Some(s) = &mut self.scheduler {
                    if up {
                        s.link_up(peer);
                    } else {
                        s.link_down(peer, now);
                    }
                }
                if to_scheduler {
                    self.member.scheduler_link(up, now);
                }
            }
        }
    }

    /// The app is finalizing this node: its next barrier is the last. Once
    /// the scheduler releases it, everyone leaves: from then on a peer's
    /// closed connection is no death and the scheduler's is no loss (a node
    /// slow to stop must not fail because the scheduler was quicker), and
    /// what closed before is forgotten. Heartbeats still notice a peer that
    /// hangs. (Apps such as ps-lite's servers wait in that barrier for the
    /// whole job: until the release, deaths count as ever.)
    pub fn finalizing(&mut self) {
        self.finalize_pending = true;
    }

    /// The last barrier was released: see [`Core::finalizing`].
    fn leaving(&mut self, now: Instant) {
        self.finalizing = true;
        self.member.scheduler_link(true, now);
        if let Some(s) = &mut self.scheduler {
            s.forget_closed_links();
        }
    }

    /// Whether this node's ROUTER may let a new connection take over an
    /// identity in use (`ZMQ_ROUTER_HANDOVER`): yes while every member
    /// presents a key (only the same process can present it again, say
    /// after its old connection died silently); no once the table has a
    /// node without one (a C++ node, whose plain `ps<id>` anyone can
    /// present): then, as in C++ ps-lite, the first connection keeps it.
    pub fn router_handover(&self) -> bool {
        self.member.table().iter().all(|n| n.pslite && n.key != 0)
    }

    /// This node's own entry: in the node table once joined, else as it
    /// registers.
    fn my_entry(&self) -> &Node {
        let me = self.member.me();
        self.member.node(me.id).unwrap_or(me)
    }

    /// The key `peer` presents in its identity to this node (and this node
    /// to it): its entry's, when both entries carry one (pslite nodes under
    /// a pslite scheduler); `None`: the plain `ps<id>` of C++ ps-lite.
    fn expected_key_of(&self, peer: &Node) -> Option<u64> {
        let keyed = |n: &Node| n.pslite && n.key != 0;
        (keyed(self.my_entry()) && keyed(peer)).then_some(peer.key)
    }

    /// The table entry of `sender` if a message whose identity carried
    /// `key` may come from it (see [`Core::handle`]).
    pub fn sender_node(&self, sender: NodeId, key: Option<u64>) -> Option<&Node> {
        if self.identity_matches(sender, key) != Some(true) {
            return None;
        }
        self.member.node(sender)
    }

    /// Whether a message from `sender` whose identity carried `key` may be
    /// from that node: the key its table entry names, or none for a node
    /// without a key. `None`: the sender is not in the table (yet).
    fn identity_matches(&self, sender: NodeId, key: Option<u64>) -> Option<bool> {
        if sender == K_EMPTY {
            return Some(key.is_none());
        }
        let entry = if sender == self.member.me().id {
            self.my_entry()
        } else {
            self.member.node(sender)?
        };
        Some(self.expected_key_of(entry) == key)
    }

    /// Sends a control message of the core's own (stamped with a timestamp
    /// when it has none).
    fn emit(&mut self, mut msg: Message, now: Instant) {
        if msg.meta.timestamp == K_EMPTY && msg.meta.control.cmd != Command::Ack {
            msg.meta.timestamp = self.next_timestamp();
        }
        let recver = msg.meta.recver;
        match self.prepare(msg, now) {
            Ok(msg) => self.out.push(Output::Send(msg)),
            Err(e) => debug!("cannot send to node {recver}: {e}"),
        }
    }

    /// Starts waiting on a barrier over `group` as `customer_id`; ask
    /// [`Core::barrier_outcome`] with the token.
    /// [`Core::tick`] ends it with [`Failure::BarrierTimeout`] once `timeout`
    /// has passed.
    pub fn barrier(
        &mut self,
        customer_id: i32,
        group: i32,
        timeout: Option<Duration>,
        now: Instant,
    ) -> Result<u64, VanError> {
        let role = self.cfg.role;
        if !ids::is_role_group(group) || group & ids::role_group(role) == 0 {
            return Err(VanError::InvalidGroup(group));
        }
        if !self.member.is_joined() {
            return Err(VanError::NotReady);
        }
        let (token, mut request) = self.member.barrier(customer_id, group, timeout, now);
        if let MemberAction::Send(msg) = &mut request {
            self.checkpoint_barrier(msg);
        }
        self.apply_member(vec![request], now);
        Ok(token)
    }

    /// How barrier `token` ended, if it has.
    pub fn barrier_outcome(&self, token: u64) -> Option<BarrierOutcome> {
        self.member.barrier_outcome(token)
    }

    /// Forgets barrier `token` (its waiter returned).
    pub fn end_barrier(&mut self, token: u64) {
        self.member.end_barrier(token);
    }

    /// The node is about to stop (finalized): from now on the clock only
    /// drives resends and the exit drain ([`Core::drain_outcome`]); peers
    /// that exit first are neither declared dead nor taken for a lost
    /// scheduler.
    pub fn finish(&mut self, now: Instant) {
        if self.drain.is_some() {
            return;
        }
        let limit = self.cfg.resend_timeout.map_or(Duration::ZERO, |t| {
            t.saturating_mul(DRAIN_RESEND_TIMEOUTS).min(MAX_DRAIN)
        });
        self.drain = Some(Drain {
            started: now,
            deadline: now + limit,
            outcome: None,
        });
        let left = self.unacknowledged_at_exit();
        if !left.is_empty() {
            debug!(
                "stopping once these are acknowledged (up to {:.1} s): {}",
                limit.as_secs_f64(),
                left.join("; ")
            );
        }
        self.check_drain(now);
    }

    /// How the exit drain ended; `None` while it goes on (or before
    /// [`Core::finish`]).
    pub fn drain_outcome(&self) -> Option<&DrainOutcome> {
        self.drain.as_ref().and_then(|d| d.outcome.as_ref())
    }

    /// Ends the exit drain if nothing is left to wait for, or at its
    /// deadline (saying what it waited for).
    fn check_drain(&mut self, now: Instant) {
        let failed = self.member.failure().is_some();
        let flushed = !failed && !self.has_unacknowledged_at_exit();
        let left = if !failed && !flushed && self.drain.as_ref().is_some_and(|d| now >= d.deadline)
        {
            self.unacknowledged_at_exit()
        } else {
            Vec::new()
        };
        let Some(drain) = &mut self.drain else {
            return;
        };
        if drain.outcome.is_some() {
            return;
        }
        let outcome = if failed {
            DrainOutcome::Failed
        } else if flushed {
            DrainOutcome::Flushed
        } else if now >= drain.deadline {
            let waited = now.saturating_duration_since(drain.started);
            warn!(
                "stopping after {:.1} s with {} messages unacknowledged (at most {} resend \
                 timeouts and {} s, PS_RESEND_TIMEOUT): {}",
                waited.as_secs_f64(),
                left.len(),
                DRAIN_RESEND_TIMEOUTS,
                MAX_DRAIN.as_secs(),
                left.join("; ")
            );
            DrainOutcome::GaveUp { waited, left }
        } else {
            return;
        };
        drain.outcome = Some(outcome);
        self.changed = true;
    }

    /// Stops the node: every wait ends with [`Failure::Stopped`].
    pub fn stop(&mut self, now: Instant) {
        self.stopped = true;
        if let Some(action) = self.member.fail(Failure::Stopped) {
            self.apply_member(vec![action], now);
        }
        self.changed = true;
    }

    /// Fails the node (the receive thread died, say).
    pub fn fail(&mut self, failure: Failure, now: Instant) {
        if let Some(action) = self.member.fail(failure) {
            self.apply_member(vec![action], now);
        }
        self.check_drain(now);
    }

    /// The apps could not take these data messages ([`Output::Deliver`], in
    /// order, with the copy requests of replicated key ranges after the
    /// first refused one, [`Output::Snapshot`] and [`Output::Restore`]): a
    /// customer's queue is full. They wait here, and the driver reads
    /// nothing more (ZeroMQ's high-water marks then hold the senders back)
    /// until [`Core::room`]; timers go on.
    pub fn park(&mut self, outputs: Vec<Output>, now: Instant) {
        self.parked.extend(outputs);
        self.update_listening(now);
    }

    /// A customer's queue has room again: the parked outputs are handed
    /// over again, in order; messages the apps refuse again come back
    /// through [`Core::park`].
    pub fn room(&mut self, now: Instant) {
        let parked = std::mem::take(&mut self.parked);
        self.out.extend(parked);
        self.update_listening(now);
    }

    /// Data messages parked (see [`Core::park`]).
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// The driver cannot read for a reason of its own (`stalled`), or can
    /// again.
    pub fn set_stalled(&mut self, stalled: bool, now: Instant) {
        self.stalled = stalled;
        self.update_listening(now);
    }

    /// Whether the driver reads what arrives: not while messages are parked
    /// or the driver is stalled. Meanwhile the node still sends (heartbeats
    /// go on), but nobody's silence counts: it cannot hear them.
    pub fn is_listening(&self) -> bool {
        self.parked.is_empty() && !self.stalled
    }

    /// Tells the state machines when the node stops or starts listening:
    /// the time spent deaf counts as nobody's silence, and resends and
    /// give-ups wait (their acknowledgements may be waiting unread).
    fn update_listening(&mut self, now: Instant) {
        let listening = self.is_listening();
        match (listening, self.deaf_since) {
            (false, None) => {
                if self.stalled {
                    debug!("not reading for now: short of file descriptors");
                } else {
                    debug!("not reading for now: an app's queue is full");
                }
                self.deaf_since = Some(now);
                self.member.set_deaf(true, now);
                if let Some(s) = &mut self.scheduler {
                    s.set_deaf(true, now);
                }
            }
            (true, Some(since)) => {
                let deaf = now.saturating_duration_since(since);
                debug!("reading again after {:.3} s", deaf.as_secs_f64());
                self.deaf_since = None;
                self.member.set_deaf(false, now);
                if let Some(s) = &mut self.scheduler {
                    s.set_deaf(false, now);
                }
                if let Some(r) = &mut self.resender {
                    r.postpone(deaf);
                }
            }
            _ => {}
        }
    }

    /// Messages still unacknowledged that are worth waiting for at exit,
    /// described for logs: heartbeats are not, nor messages to a peer that
    /// never acknowledged anything (a C++ node without `PS_RESEND`).
    pub fn unacknowledged_at_exit(&self) -> Vec<String> {
        self.waited_for_at_exit().map(crate::describe).collect()
    }

    /// Whether [`Core::unacknowledged_at_exit`] is not empty.
    fn has_unacknowledged_at_exit(&self) -> bool {
        self.waited_for_at_exit().next().is_some()
    }

    fn waited_for_at_exit(&self) -> impl Iterator<Item = &Message> {
        self.resender
            .iter()
            .flat_map(|r| r.unacknowledged_to(|id| self.acked_by.contains(&id)))
            .filter(|m| m.meta.control.cmd != Command::Heartbeat && !is_leaving_unwatch(m))
    }

    /// Ids of nodes silent for longer than `timeout` (ps-lite's
    /// `GetDeadNodes`): on the scheduler, servers and workers; elsewhere,
    /// the scheduler.
    pub fn dead_nodes(&self, now: Instant, timeout: Duration) -> Vec<NodeId> {
        if let Some(s) = &self.scheduler {
            return s.silent_nodes(now, timeout);
        }
        let silent = now.saturating_duration_since(self.member.last_scheduler_contact());
        if silent > timeout {
            vec![SCHEDULER]
        } else {
            Vec::new()
        }
    }

    /// When [`Core::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let resends = self
            .resender
            .as_ref()
            .filter(|_| self.deaf_since.is_none())
            .and_then(Resender::poll_timeout);
        if let Some(drain) = &self.drain {
            let deadline = drain.outcome.is_none().then_some(drain.deadline);
            return resends.into_iter().chain(deadline).min();
        }
        [
            self.member.poll_timeout(),
            self.scheduler.as_ref().and_then(Scheduler::poll_timeout),
            resends,
            self.registrations.poll_timeout(),
            self.store_host.as_ref().and_then(StoreHost::poll_timeout),
            self.checkpoint_poll(),
            self.store_client.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Clock-driven work at `now`: deadlines, heartbeats, resends.
    pub fn tick(&mut self, now: Instant) {
        if self.drain.is_none() {
            let actions = self.member.tick(now);
            if self.member.timed_out().is_some() && !self.member.is_joined() {
                self.changed = true;
            }
            self.apply_member(actions, now);
            if let Some(s) = &mut self.scheduler {
                let actions = s.tick(now);
                self.apply_scheduler(actions, now);
            }
            self.replica_tick(now);
            self.checkpoint_tick(now);
            for (link, node, why) in self.registrations.tick(now) {
                self.registration_refused(&node, &why);
                self.end_check(link, now);
            }
            if self.deaf_since.is_none() {
                self.store_forget_dead(now);
            }
            self.changed |= self.store_client.tick(now);
        }
        if let Some(host) = &mut self.store_host {
            let replies = host.tick(now);
            self.send_store_replies(replies, now);
        }
        if self.deaf_since.is_none() {
            self.resend(now);
        }
        self.check_drain(now);
    }

    /// Resends what is due, and gives up on what was resent too often.
    fn resend(&mut self, now: Instant) {
        let Some(r) = &mut self.resender else {
            return;
        };
        let due = r.tick(now);
        for msg in due.resend {
            debug!("resending {}", crate::describe(&msg));
            self.counters.resent();
            self.out.push(Output::Send(msg));
        }
        for msg in due.failed {
            let failure = Failure::NotAcknowledged {
                peer: msg.meta.recver,
                tries: self.cfg.max_resends,
                what: crate::describe(&msg),
            };
            if msg.is_control() {
                // A scheduler that never acknowledged anything runs without
                // PS_RESEND (a C++ one, say): its silence proves nothing.
                let acks = self.acked_by.contains(&SCHEDULER);
                if msg.meta.recver == SCHEDULER && self.scheduler.is_none() && acks {
                    warn!("{failure}");
                    self.fail(failure, now);
                } else {
                    debug!("{failure}");
                }
            } else if self.replica_owns(&msg) {
                debug!("{failure}: the range map decides where it goes next");
            } else {
                warn!("{failure}");
                self.out.push(Output::Undeliverable(msg, failure));
            }
            self.changed = true;
        }
    }

    /// Handles one message that arrived, with `meta.sender` (and
    /// `meta.sender_key`) set from the sender's identity ([`K_EMPTY`] if it
    /// had none). Returns, the first time a sender is refused for it, why
    /// its identity was refused (the driver logs it with the connection's
    /// address).
    pub fn handle(&mut self, msg: Message, now: Instant) -> Option<IdentityRefused> {
        let refused = self.receive(msg, now);
        if self.drain.is_some() {
            self.check_drain(now);
        }
        refused
    }

    fn receive(&mut self, mut msg: Message, now: Instant) -> Option<IdentityRefused> {
        if self.stopped {
            return None;
        }
        let sender = msg.meta.sender;
        msg.meta.recver = self.member.me().id;
        if self.identity_matches(sender, msg.meta.sender_key) == Some(false) {
            return self.refuse_identity(&msg, now);
        }
        if sender != K_EMPTY {
            self.member.heard_from(sender, now);
            if self.heard.insert(sender) {
                debug!("connected to node {sender} (first message heard from it)");
            }
            self.note_early(&msg);
        }
        if self.cfg.drop_percent > 0
            && self.member.is_joined()
            && msg.meta.control.cmd != Command::Terminate
            && self.rng.random_range(0..100) < self.cfg.drop_percent
        {
            self.counters.dropped(DropReason::Injected);
            debug!("dropping {} (PS_DROP_MSG)", crate::describe(&msg));
            return None;
        }
        let mut ack = None;
        if self.scheduler.is_some() && sender != K_EMPTY {
            // Anything from a node proves it has its table (a C++ node cannot
            // acknowledge the table: it has no id when it arrives). Only a
            // table that names the node: an update of another's entry (a
            // replacement's new address and key) is not proven by a message
            // the node may have sent before it arrived, and lost, it leaves
            // the node refusing the replacement's identity for good.
            if let Some(r) = &mut self.resender {
                r.settle(|m| {
                    m.meta.recver == sender
                        && m.meta.control.cmd == Command::AddNode
                        && m.meta.control.node.iter().any(|n| n.id == sender)
                });
            }
        }
        if self.resender.is_some() {
            if msg.meta.control.cmd == Command::AddNode
                && sender == SCHEDULER
                && !self.member.is_joined()
            {
                // The table was sent to the id it assigns us: acknowledge as
                // that id, so that its first copy counts.
                if let Some(mine) = self.member.my_entry(&msg.meta.control.node) {
                    msg.meta.recver = mine.id;
                }
            }
            let Some(r) = &mut self.resender else {
                return None;
            };
            let (received, a) = r.on_receive(&msg, now);
            ack = a;
            match received {
                Received::Deliver => {}
                Received::Duplicate => {
                    self.counters.dropped(DropReason::Duplicate);
                    debug!("dropping a duplicate {}", crate::describe(&msg));
                    if let Some(ack) = ack {
                        self.emit(ack, now);
                    }
                    return None;
                }
                Received::Ack => {
                    self.acked_by.insert(sender);
                    self.changed = true;
                    return None;
                }
            }
        }
        self.dispatch(msg, now);
        // After processing: a node that just joined acknowledges the table
        // under its new identity.
        if let Some(ack) = ack {
            self.emit(ack, now);
        }
        None
    }

    /// Drops a message whose identity names a node of the table without
    /// that node's key (see [`Core::handle`]). On the scheduler, a message
    /// from an earlier process of a node that was replaced gets that
    /// process fenced: it is told (LEAVE naming its replacement) and stops.
    fn refuse_identity(&mut self, msg: &Message, now: Instant) -> Option<IdentityRefused> {
        let sender = msg.meta.sender;
        let fence = self
            .scheduler
            .as_ref()
            .and_then(|s| s.replaced(sender, msg.meta.sender_key))
            .map(|(old, new)| (old.clone(), new.clone()));
        if let Some((mut old, new)) = fence {
            // A replacement at the old process's address: that process is
            // gone (its port is the new one's), and a LEAVE to the address
            // would reach the replacement.
            if !old.same_process(&new) && self.fenced.insert((sender, old.key)) {
                warn!(
                    "scheduler: {old} sent a message after {} took its place: telling it to stop",
                    new.address()
                );
                // Its own connection (never node `sender`'s): under an id
                // no node has.
                old.id = -sender;
                let link = old.id;
                self.connect(old, SCHEDULER);
                let mut leave = Message::control(Command::Leave, link);
                leave.meta.control.node = vec![new];
                self.emit(leave, now);
            }
        }
        self.counters.dropped(DropReason::UnknownPeer);
        let first = self.refused_identities.len() < 1024 && self.refused_identities.insert(sender);
        let refusal = IdentityRefused {
            id: sender,
            presented: msg.meta.sender_key,
            what: crate::describe(msg),
        };
        if first {
            Some(refusal)
        } else {
            debug!("{refusal}");
            None
        }
    }

    fn dispatch(&mut self, msg: Message, now: Instant) {
        let is_scheduler = self.scheduler.is_some();
        match msg.meta.control.cmd {
            Command::Empty => self.data(msg, now),
            // Never obeyed from the wire: a node stops itself in-process.
            Command::Terminate => {
                self.drop_logged(msg.meta.sender, "TERMINATE", "nodes stop themselves")
            }
            Command::AddNode if is_scheduler && msg.meta.sender == K_EMPTY => {
                self.check_registration(msg, now)
            }
            Command::AddNode if is_scheduler && self.replica_refuses(&msg) => {}
            Command::AddNode | Command::Heartbeat | Command::Status if is_scheduler => {
                self.run_scheduler(&msg, now)
            }
            Command::Replica => self.replica_control(msg, now),
            Command::Checkpoint => self.checkpoint_control(msg, now),
            Command::Barrier if is_scheduler && msg.meta.request => {
                self.checkpoint_arrival(&msg);
                self.run_scheduler(&msg, now)
            }
            Command::Leave if is_scheduler => self.run_scheduler(&msg, now),
            Command::Leave if msg.meta.sender == SCHEDULER => {
                let actions = self.member.on_leave(&msg);
                self.apply_member(actions, now);
            }
            Command::Leave => self.drop_logged(
                msg.meta.sender,
                "LEAVE",
                "only workers send it, and only to the scheduler",
            ),
            Command::AddNode => {
                self.checkpoint_table(&msg, now);
                let actions = self.member.on_node_table(&msg, now);
                self.apply_member(actions, now);
                if msg.meta.sender == SCHEDULER {
                    if let Some(map) = msg.meta.replica.and_then(|r| r.map) {
                        self.on_range_map(map, now);
                    }
                }
            }
            Command::Barrier if msg.meta.sender != SCHEDULER || msg.meta.request => self
                .drop_logged(
                    msg.meta.sender,
                    "BARRIER",
                    "only the scheduler releases barriers",
                ),
            Command::Barrier => {
                self.member.on_barrier_release(&msg);
                self.settle_with_scheduler(Command::Barrier, &msg);
                self.changed = true;
                let release = msg.meta.sender == SCHEDULER && !msg.meta.request;
                if release && self.finalize_pending && !self.finalizing {
                    self.leaving(now);
                }
            }
            Command::Heartbeat => {
                self.settle_with_scheduler(Command::Heartbeat, &msg);
                if msg.meta.sender == SCHEDULER && self.member.is_joined() {
                    // Only a pslite scheduler sends a dead list; from a C++
                    // one (whose identity carries no key) it is forged.
                    let dead: &[NodeId] = if self.scheduler_is_pslite() {
                        &msg.meta.control.dead_nodes
                    } else {
                        &[]
                    };
                    self.member.on_scheduler_heartbeat(dead, now);
                }
            }
            Command::Store if is_scheduler && msg.meta.request => self.run_store(msg, now),
            Command::Store => self.on_store_message(msg, now),
            Command::Ack => debug!("dropping ACK from node {}: resend is off", msg.meta.sender),
            Command::Status => {
                self.drop_logged(msg.meta.sender, "STATUS", "only the scheduler answers it")
            }
        }
    }

    /// Whether this node's scheduler is a pslite one (its table entry says
    /// so; the scheduler itself is).
    fn scheduler_is_pslite(&self) -> bool {
        self.scheduler.is_some() || self.member.node(SCHEDULER).is_some_and(|n| n.pslite)
    }

    /// The scheduler's answer settles this node's requests of the same kind:
    /// a released barrier proves its requests arrived, a heartbeat answer
    /// makes older heartbeats moot (a C++ scheduler may never acknowledge
    /// them, and they must not be resent or waited for at exit).
    fn settle_with_scheduler(&mut self, cmd: Command, answer: &Message) {
        if answer.meta.sender != SCHEDULER || answer.meta.request {
            return;
        }
        // A C++ scheduler's barrier replies carry no real group: they
        // settle every barrier request.
        let group = answer.meta.control.barrier_group;
        let any_group = cmd != Command::Barrier || !ids::is_role_group(group);
        if let Some(r) = &mut self.resender {
            r.settle(|m| {
                m.meta.recver == SCHEDULER
                    && m.meta.control.cmd == cmd
                    && (any_group || m.meta.control.barrier_group == group)
            });
        }
    }

    /// Records identities heard from before they could have been assigned:
    /// a hint of an identity conflict if the cluster does not form.
    fn note_early(&mut self, msg: &Message) {
        let sender = msg.meta.sender;
        let early = match &self.scheduler {
            Some(s) => !s.is_ready() && sender != SCHEDULER,
            None => !self.member.is_joined() && sender != SCHEDULER,
        };
        if early && self.early_ids.len() < 16 {
            self.early_ids.insert(sender);
        }
    }

    /// On the scheduler: a registration (ADD_NODE from a process without
    /// an id) counts once its address completed a handshake (see
    /// [`crate::registration`]).
    fn check_registration(&mut self, msg: Message, now: Instant) {
        let node = match msg.meta.control.node.as_slice() {
            [node] if !node.hostname.is_empty() && (1..=65535).contains(&node.port) => node.clone(),
            // Malformed: the scheduler says why.
            _ => return self.run_scheduler(&msg, now),
        };
        match self.registrations.offer(msg, &node, now) {
            Offered::Check(target) => self.connect(target, K_EMPTY),
            Offered::Held | Offered::Queued => {}
            Offered::Refused(why) => self.registration_refused(&node, &why),
        }
    }

    fn registration_refused(&mut self, node: &Node, why: &str) {
        let line = format!(
            "scheduler: refusing the registration of {node}: {why} (a forged registration, or \
             a node the scheduler cannot reach at the address it advertises: check \
             DMLC_NODE_HOST)"
        );
        if self.refusals_logged.len() < 256 && self.refusals_logged.insert(node.address()) {
            warn!("{line}");
        } else {
            debug!("{line}");
        }
    }

    /// Whether `link` is the connection of a registration check under way.
    pub fn is_checking(&self, link: NodeId) -> bool {
        self.registrations.is_check(link)
    }

    /// Closes the connection of a registration check.
    fn end_check(&mut self, link: NodeId, now: Instant) {
        self.connected.remove(&link);
        self.out.push(Output::Disconnect(link));
        for target in self.registrations.start_queued(now) {
            self.connect(target, K_EMPTY);
        }
    }

    fn run_scheduler(&mut self, msg: &Message, now: Instant) {
        let Some(s) = &mut self.scheduler else {
            return;
        };
        let actions = s.handle(msg, now);
        self.apply_scheduler(actions, now);
    }

    fn scheduler_table(&self) -> Vec<Node> {
        let mut table = self
            .scheduler
            .as_ref()
            .map(|s| s.nodes().to_vec())
            .unwrap_or_default();
        table.push(self.member.me().clone());
        table
    }

    /// Carries out what the scheduler state machine asked for.
    fn apply_scheduler(&mut self, actions: Vec<Action>, now: Instant) {
        if actions.is_empty() {
            return;
        }
        self.replica_before(&actions, now);
        let actions = self.checkpoint_releases(actions, now);
        let formed = actions.iter().any(|a| matches!(a, Action::Ready));
        let recoveries: Vec<Action> = actions
            .iter()
            .filter(|a| matches!(a, Action::Connect(n) if n.is_recovery))
            .cloned()
            .collect();
        for action in actions {
            match action {
                Action::Connect(node) => {
                    let recovered = node.is_recovery.then_some(node.id);
                    self.connect(node, SCHEDULER);
                    if let Some(id) = recovered {
                        self.peer_replaced(id, now);
                    }
                }
                Action::Send(mut msg) => {
                    self.replica_attach(&mut msg);
                    self.checkpoint_attach(&mut msg);
                    self.emit(msg, now)
                }
                Action::Reply { route, mut msg } => {
                    // The scheduler's own row carries its own counters.
                    if let Some(row) = msg.meta.status.iter_mut().find(|r| r.node.id == SCHEDULER) {
                        row.counters = Some(self.counters.snapshot());
                        row.counters_age = Some(Duration::ZERO);
                    }
                    msg.meta.sender = SCHEDULER;
                    if !self.reply(route, msg) {
                        debug!("scheduler: a status answer waits on too many unread answers");
                    }
                }
                Action::Failed(f) => self.fail(f, now),
                Action::RoundBegan { round, workers } => {
                    let actions = self.member.set_round(round, workers);
                    self.apply_member(actions, now);
                }
                Action::Ready => {
                    let servers = match (&self.scheduler, self.cfg.min_servers) {
                        // Servers that join and leave: as many as registered.
                        (Some(s), Some(_)) => s
                            .nodes()
                            .iter()
                            .filter(|n| n.role == Role::Server)
                            .map(|n| n.id)
                            .collect::<BTreeSet<_>>()
                            .len() as i32,
                        _ => self.cfg.num_servers,
                    };
                    info!(
                        "scheduler: cluster formed with {servers} servers and {} workers",
                        self.cfg.num_workers
                    );
                    let actions = self.member.formed(self.scheduler_table());
                    self.apply_member(actions, now);
                }
            }
        }
        // Keep the table current after recoveries.
        if self.member.is_joined() {
            let table = self.scheduler_table();
            self.member.formed(table);
        }
        self.replica_after(&recoveries, now);
        if formed {
            self.checkpoint_formed(now);
        }
    }

    /// Carries out what the node side asked for.
    fn apply_member(&mut self, actions: Vec<MemberAction>, now: Instant) {
        for action in actions {
            match action {
                MemberAction::Connect(node) => {
                    let identity = self.member.me().id;
                    self.connect(node, identity);
                }
                MemberAction::Send(mut msg) => {
                    // pslite-only: a node's heartbeat carries its counters
                    // (C++ schedulers skip the field).
                    if msg.meta.control.cmd == Command::Heartbeat && self.scheduler.is_none() {
                        msg.meta.counters = Some(Box::new(self.counters.snapshot()));
                    }
                    self.emit(msg, now)
                }
                MemberAction::Joined => {
                    self.changed = true;
                    for msg in self.held.drain() {
                        if msg.meta.control.cmd == Command::Replica {
                            self.replica_control(msg, now);
                        } else {
                            self.data(msg, now);
                        }
                    }
                }
                MemberAction::PeerReplaced(id) => self.peer_replaced(id, now),
                MemberAction::PeerDead(id) => {
                    let failure = Failure::PeerDead {
                        id,
                        secs: self.cfg.recovery_timeout.as_secs(),
                    };
                    if let Some(r) = &mut self.resender {
                        for msg in r.forget_peer(id) {
                            if !self.replica_owns(&msg) {
                                self.out.push(Output::Undeliverable(msg, failure.clone()));
                            }
                        }
                    }
                    // Replicated key ranges: a dead server's ranges failed
                    // over; its requests went to the new primaries.
                    if !self.replica_covers(id) {
                        self.out.push(Output::PeerDead(id, failure));
                    }
                    self.changed = true;
                }
                MemberAction::Failed(f) => {
                    self.changed = true;
                    self.out.push(Output::Failed(f));
                }
                MemberAction::BarrierEnded => self.changed = true,
                MemberAction::Waiting { waited, limit } => {
                    let what = self.waiting_for();
                    self.out.push(Output::Waiting {
                        waited,
                        limit,
                        what,
                    });
                }
                MemberAction::RoundBegan { round, workers } => {
                    self.changed = true;
                    self.out.push(Output::RoundBegan { round, workers });
                    for msg in self.held_newcomers.drain() {
                        if self.member.is_member(msg.meta.sender) {
                            self.data(msg, now);
                        } else {
                            self.reject(&msg, "its sender is not in the node table");
                        }
                    }
                }
            }
        }
    }

    /// Node `id` restarted: the requests it never answered go to the new
    /// process (the old one may have taken them to its grave); without a
    /// resender they cannot, and fail instead of waiting forever.
    fn peer_replaced(&mut self, id: NodeId, now: Instant) {
        self.store_forget(id, "was replaced by a restarted process");
        if let Some(r) = &mut self.resender {
            // The new process's timestamps start over.
            r.forget_seen(id);
            if self.scheduler.is_some() {
                // Sent before the new process registered (it gets the
                // current table and map with its own). Not elsewhere: a
                // node may learn of the replacement after it sent the new
                // process something (a copy of its ranges, by the map).
                r.forget_control_to(id);
            }
        }
        let Some(r) = &mut self.resender else {
            if self.scheduler.is_none() && !self.replica_covers(id) {
                self.out
                    .push(Output::PeerDead(id, Failure::PeerRestarted { id }));
            }
            return;
        };
        let again = r.on_peer_replaced(id, now);
        if !again.is_empty() {
            info!(
                "sending {} unanswered requests again to the new node {id}",
                again.len()
            );
        }
        for msg in again {
            self.counters.resent();
            self.out.push(Output::Send(msg));
        }
    }

    /// A data message: delivered if its sender may send it, held back until
    /// this node joins (within the byte budget), else dropped.
    fn data(&mut self, msg: Message, now: Instant) {
        let sender = msg.meta.sender;
        if sender == K_EMPTY {
            self.reject(&msg, "its sender has no ps<id> identity");
            return;
        }
        if !msg.meta.data_type.is_empty() && msg.meta.data_type.len() != msg.data.len() {
            self.reject(&msg, MALFORMED);
            return;
        }
        if !self.member.is_joined() {
            self.hold(msg);
            return;
        }
        if self.identity_matches(sender, msg.meta.sender_key) == Some(false) {
            // Held before the table named its sender's key.
            self.reject(&msg, "its identity lacks the key of its node's process");
            return;
        }
        if !self.member.is_member(sender) {
            let newcomer = self.cfg.elastic.is_some()
                && self.cfg.role == Role::Server
                && ids::role_of_id(sender) == Some(Role::Worker);
            if !newcomer {
                self.reject(&msg, "its sender is not in the node table");
                return;
            }
            match self.held_newcomers.push_message(msg) {
                Ok(()) => debug!("holding data from node {sender} until the next table names it"),
                Err(refused) => self.reject(
                    &refused.item,
                    "its sender is not in the node table (and too much data from newcomers \
                     waits: PS_HOLD_LIMIT)",
                ),
            }
            return;
        }
        if msg.meta.replica.is_some() {
            self.replica_data(msg, now);
            return;
        }
        if let Some(why) = self.forbidden(&msg) {
            self.reject(&msg, why);
            return;
        }
        self.deliver(msg);
    }

    /// Hands `msg` to the apps ([`Output::Deliver`]), behind the parked ones
    /// if any, in order.
    fn deliver(&mut self, msg: Message) {
        self.for_apps(Output::Deliver(msg));
    }

    /// Hands `out` (for the apps' queues, in their order) over, behind the
    /// parked ones if any.
    fn for_apps(&mut self, out: Output) {
        if self.parked.is_empty() {
            self.out.push(out);
        } else {
            self.parked.push_back(out);
        }
    }

    /// Why a member may not send `msg` to this node, given both roles.
    fn forbidden(&self, msg: &Message) -> Option<&'static str> {
        if msg.meta.simple_app {
            return None; // the app decides who may talk to it
        }
        let from = ids::role_of_id(msg.meta.sender);
        match (self.cfg.role, msg.meta.request, from) {
            (Role::Server, true, Some(Role::Worker)) => None,
            (Role::Server, true, _) => Some("servers take KV requests from workers only"),
            (Role::Worker, false, Some(Role::Server)) => None,
            (Role::Worker, false, _) => Some("workers take KV responses from servers only"),
            (Role::Server, false, _) => Some("servers send no KV requests, so take no responses"),
            _ => None,
        }
    }

    fn hold(&mut self, msg: Message) {
        let sender = msg.meta.sender;
        // Elastic mode hands out worker ids without bound.
        let member_id = if self.cfg.elastic.is_some() {
            ids::role_of_id(sender).is_some()
        } else {
            ids::group_members(ids::ALL_GROUP, self.cfg.num_servers, self.cfg.num_workers)
                .contains(&sender)
        };
        if !member_id {
            self.reject(&msg, "its sender's id cannot be a member of this cluster");
            return;
        }
        if let Err(refused) = self.held.push_message(msg) {
            self.reject(
                &refused.item,
                "too much data arrived before this node joined (PS_HOLD_LIMIT)",
            );
        }
    }

    fn reject(&mut self, msg: &Message, why: &'static str) {
        self.rejected += 1;
        self.counters.dropped(if why == MALFORMED {
            DropReason::Malformed
        } else {
            DropReason::UnknownPeer
        });
        self.drop_logged(msg.meta.sender, "a data message", why);
    }

    /// Logs a dropped message: a warning the first time `sender` sends one
    /// for `why`, at debug level after that, so a hostile or confused peer
    /// cannot flood the log.
    fn drop_logged(&mut self, sender: NodeId, what: &str, why: &'static str) {
        self.dropped.log((sender, why), || {
            format!("dropping {what} from node {sender}: {why}")
        });
    }
}

/// The key-value store: the scheduler's side ([`StoreHost`]) and every
/// node's ([`StoreClient`]).
impl Core {
    /// Sends store request `req` to the scheduler; ask
    /// [`Core::store_answer`] with the id it returns (it fails with
    /// [`Failure::StoreNoAnswer`] once `limit` has passed). Fails if this
    /// node has not joined or the scheduler is not pslite (C++ ps-lite has
    /// no store).
    pub fn store_request(
        &mut self,
        mut req: StoreMsg,
        limit: Duration,
        now: Instant,
    ) -> Result<u64, VanError> {
        if let Some(f) = self.member.failure() {
            return Err(f.clone().into());
        }
        if !self.member.is_joined() {
            return Err(VanError::NotReady);
        }
        let pslite =
            self.scheduler.is_some() || self.member.node(SCHEDULER).is_some_and(|n| n.pslite);
        if !pslite {
            return Err(VanError::StoreUnsupported);
        }
        let id = self.store_client.start(&mut req, limit, now);
        self.send_store(req, now);
        Ok(id)
    }

    /// The answer to store request `id`, once here; the node's failure if
    /// it failed (the scheduler was lost, say).
    pub fn store_answer(&self, id: u64) -> Option<Result<StoreMsg, Failure>> {
        match self.store_client.answer(id) {
            Some(Ok(answer)) => Some(Ok(answer.clone())),
            Some(Err(waited)) => Some(Err(Failure::StoreNoAnswer { waited })),
            None => self.member.failure().map(|f| Err(f.clone())),
        }
    }

    /// On the scheduler: how many store requests wait for keys (0 elsewhere).
    pub fn store_waiting(&self) -> usize {
        self.store_host.as_ref().map_or(0, StoreHost::waiting)
    }

    /// On the scheduler: how many store watches there are (0 elsewhere).
    pub fn store_watches(&self) -> usize {
        self.store_host.as_ref().map_or(0, StoreHost::watch_count)
    }

    /// This node is leaving (finalized): if it watches keys, tells the
    /// scheduler to drop its watches (one UNWATCH without a key), so no
    /// event goes to a process that is gone.
    pub fn store_leave(&mut self, now: Instant) {
        if !self.store_client.is_watching() || !self.member.is_joined() {
            return;
        }
        if let Some(host) = &mut self.store_host {
            let me = self.member.me().id;
            host.forget(&Requester::Member(me));
            return;
        }
        let mut req = StoreMsg::request(StoreOp::Unwatch, Vec::new());
        self.store_client.fresh_id(&mut req);
        self.send_store(req, now);
    }

    /// On the scheduler: drops the waits and watches of nodes declared dead
    /// since the last tick (their answers and events would go nowhere, or
    /// to the process that takes over the id).
    fn store_forget_dead(&mut self, now: Instant) {
        let (Some(s), Some(_)) = (&self.scheduler, &self.store_host) else {
            return;
        };
        let dead: BTreeSet<NodeId> = s.dead_nodes(now).into_iter().collect();
        let newly: Vec<NodeId> = dead.difference(&self.store_dead).copied().collect();
        for id in newly {
            self.store_forget(id, "is dead");
        }
        self.store_dead = dead;
    }

    /// On the scheduler: drops node `id`'s store waits and watches.
    fn store_forget(&mut self, id: NodeId, why: &str) {
        let Some(host) = &mut self.store_host else {
            return;
        };
        let gone = host.forget(&Requester::Member(id));
        if gone.waits + gone.watches > 0 {
            info!(
                "scheduler: node {id} {why}: the store dropped its {} watches and {} waiting \
                 requests",
                gone.watches, gone.waits
            );
        }
    }

    /// Forgets store request `id` (its waiter returned).
    pub fn end_store(&mut self, id: u64) {
        self.store_client.end(id);
    }

    /// A new watcher of `key` in this process: every later change of it
    /// comes as [`Output::StoreEvent`] for the returned watcher (call before
    /// the WATCH request, so no change slips between them).
    pub fn store_watch(&mut self, key: &str) -> u64 {
        self.store_client.watch(key)
    }

    /// Watcher `watcher` is gone (its receiver was dropped): if nobody in
    /// this process watches its key any more, tells the scheduler.
    pub fn store_watcher_gone(&mut self, watcher: u64, now: Instant) {
        if let Some(key) = self.store_client.unwatch(watcher) {
            self.send_unwatch(key, now);
        }
    }

    fn send_unwatch(&mut self, key: String, now: Instant) {
        let mut req = StoreMsg::request(StoreOp::Unwatch, vec![key]);
        self.store_client.fresh_id(&mut req);
        self.send_store(req, now);
    }

    fn send_store(&mut self, req: StoreMsg, now: Instant) {
        let mut msg = Message::control(Command::Store, SCHEDULER);
        msg.meta.request = true;
        msg.meta.store = Some(Box::new(req));
        self.emit(msg, now);
    }

    /// A store request that reached the scheduler.
    fn run_store(&mut self, msg: Message, now: Instant) {
        let sender = msg.meta.sender;
        let Some(req) = msg.meta.store else {
            warn!("scheduler: dropping a STORE request from node {sender} without a request");
            return;
        };
        let from = if sender == K_EMPTY {
            // An admin client: answered on its connection, whatever
            // address its request names.
            match msg.meta.route {
                Some(route) => Requester::Admin(route),
                None => {
                    debug!("scheduler: dropping a STORE request from an unknown peer");
                    return;
                }
            }
        } else if sender == SCHEDULER || self.member.is_member(sender) {
            Requester::Member(sender)
        } else {
            warn!("scheduler: dropping a STORE request from node {sender}: not a cluster member");
            return;
        };
        let Some(host) = &mut self.store_host else {
            return;
        };
        let replies = host.handle(from, *req, now);
        self.send_store_replies(replies, now);
    }

    fn send_store_replies(&mut self, replies: Vec<StoreReply>, now: Instant) {
        for StoreReply { to, msg: store } in replies {
            match to {
                Requester::Member(id) => {
                    let mut msg = Message::control(Command::Store, id);
                    msg.meta.store = Some(Box::new(store));
                    self.emit(msg, now);
                }
                Requester::Admin(route) => {
                    let mut msg = Message::control(Command::Store, K_EMPTY);
                    // The admin client pairs answers by timestamp: its
                    // requests carry it as their id.
                    msg.meta.timestamp = (store.id & i32::MAX as u64) as i32;
                    msg.meta.sender = SCHEDULER;
                    let event = store.op == StoreOp::Event;
                    let over = OverLimit {
                        which: StoreLimit::Bytes,
                        size: reply_size(&store) as u64,
                        limit: self.cfg.store_limits.max_total as u64,
                    };
                    let refusal = (!event).then(|| store.over_limit(over));
                    msg.meta.store = Some(Box::new(store));
                    if self.reply(route.clone(), msg.clone()) {
                        continue;
                    }
                    // Over the budget of unread answers: an answer becomes
                    // its refusal; a client too slow for its events loses
                    // its watches (it is told nothing more).
                    match refusal {
                        Some(refusal) => {
                            msg.meta.store = Some(Box::new(refusal));
                            self.reply_unbudgeted(route, msg);
                        }
                        None => {
                            if let Some(host) = &mut self.store_host {
                                host.forget(&Requester::Admin(route));
                            }
                            debug!("scheduler: an admin client reads its events too slowly: its watches end");
                        }
                    }
                }
            }
        }
    }

    /// Sends `msg` back to an admin client on connection `route`, if the
    /// answers to admin clients that ZeroMQ has not written yet leave room
    /// for it under `PS_STORE_MAX_BYTES`; false if not (nothing is sent).
    fn reply(&mut self, route: bytes::Bytes, msg: Message) -> bool {
        use std::sync::atomic::Ordering;
        let size =
            msg.meta.store.as_deref().map_or(0, reply_size) + msg.meta.status.len() * 512 + 256;
        let budget = self.cfg.store_limits.max_total;
        let queued = self.reply_bytes.load(Ordering::Relaxed);
        if queued + size > budget {
            return false;
        }
        self.reply_bytes.fetch_add(size, Ordering::Relaxed);
        self.out.push(Output::Reply {
            route,
            msg,
            reserved: size,
        });
        true
    }

    /// Sends a small answer (a refusal) back to an admin client whatever
    /// the budget.
    fn reply_unbudgeted(&mut self, route: bytes::Bytes, msg: Message) {
        self.out.push(Output::Reply {
            route,
            msg,
            reserved: 0,
        });
    }

    /// Bytes of answers to admin clients that ZeroMQ has not written (or
    /// dropped) yet: the driver takes each [`Output::Reply`]'s `reserved`
    /// off once it has.
    pub fn reply_gauge(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        Arc::clone(&self.reply_bytes)
    }

    /// A store answer or event from the scheduler.
    fn on_store_message(&mut self, msg: Message, now: Instant) {
        let sender = msg.meta.sender;
        if sender != SCHEDULER || msg.meta.request {
            self.drop_logged(sender, "a STORE message", "only the scheduler answers them");
            return;
        }
        let Some(store) = msg.meta.store else {
            self.drop_logged(sender, "a STORE answer", "it has no store part");
            return;
        };
        match self.store_client.on_message(*store) {
            ClientInput::Answer => self.changed = true,
            ClientInput::Event { watchers, event } => {
                self.out.push(Output::StoreEvent { watchers, event })
            }
            ClientInput::Unwatched(key) => self.send_unwatch(key, now),
            ClientInput::Nothing => {}
        }
    }
}
