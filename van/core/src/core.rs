//! The control-plane core of one node: its components behind one
//! interface, with no sockets, no threads and no clock.
//!
//! The driver (`pslite_van::Van`, or the harness) feeds it what arrives
//! ([`Core::handle`]), what the apps send ([`Core::send`]), the user's
//! blocking calls (a [`Call`] to [`Core::call`]: joining, a barrier, a
//! store request...) and the time ([`Core::tick`] at [`Core::poll_timeout`]); it collects
//! [`Output`]s to carry out ([`Core::take_output`], then `crate::carry`).
//!
//! The core itself decides little: it is a router. Each message goes
//! through one table (`route.rs`: identity, duplicates, then the command's
//! component); each [`Component`](crate::component::Component) answers with
//! effects, which the core carries out in order (`Core::apply`): messages
//! through the outgoing pipeline (`pipeline.rs`), events to the components
//! that take them (`events.rs`), what is for the apps through the hold
//! facility, the rest to the driver. What belongs to no component is here:
//! the data path (`data.rs`) and the node's lifecycle (`lifecycle.rs`:
//! listening, failing, the exit drain). `parts.rs` holds the components
//! and the view each gets of the others.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use log::debug;
use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::{Message, Node, Role};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checkpoint::checkpoints::Checkpoints;
use crate::config::VanConfig;
use crate::counters::Counters;
use crate::effects::Output;
use crate::effects::{Effect, Effects};
use crate::error::Failure;
use crate::hold::{ForApps, Holds};
use crate::leave::Leave;
use crate::log_once::LogOnce;
use crate::member::{Barriers, Liveness, NodeTable};
use crate::partition::{PartialBound, Partitions};
use crate::registration::Registrations;
use crate::replica::replication::Replication;
use crate::reply::Replies;
use crate::resender::Resender;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::store::component::Store;

mod api;
mod data;
mod events;
mod features;
mod lifecycle;
mod parts;
mod pipeline;
mod route;
mod waits;

pub use features::REFUSAL_WAIT;
pub use lifecycle::{DrainOutcome, DRAIN_RESEND_TIMEOUTS, LEAVE_LAST, MAX_DRAIN};
use parts::{Origin, Parts};
pub use route::IdentityRefused;
pub use waits::{Call, Done, Ticket, EXIT_FLUSH};

/// One node's control plane.
pub struct Core {
    cfg: VanConfig,
    /// What this node counts (traffic, resends, drops); atomics, shared
    /// with the driver and the apps.
    counters: Arc<Counters>,
    rng: StdRng,
    /// Wall-clock time as the driver last passed it in, and the monotonic
    /// time it was read with (see [`Core::tick`]).
    wall: (Instant, SystemTime),
    /// The components.
    parts: Parts,
    /// The one place messages are held.
    holds: Holds,
    /// What callers of the driver wait for.
    waits: waits::Waits,
    /// Effects emitted and not carried out yet.
    fx: Effects,
    /// Why the node failed, if it did (see [`Core::fail`]).
    failure: Option<Failure>,
    /// What the driver must do, in order.
    out: Vec<Output>,
    /// This node as it registers (what a component reads of itself is
    /// never asked of it: see `parts.rs`).
    blank: Node,
    next_timestamp: i32,
    /// Peers with an open connection (asked for with [`Output::Connect`]).
    connected: HashSet<NodeId>,
    /// Peers heard from at least once.
    heard: HashSet<NodeId>,
    /// Identities that sent something before they could have been assigned.
    early_ids: BTreeSet<NodeId>,
    /// Ids whose identity was refused (logged once each).
    refused_identities: HashSet<NodeId>,
    /// On the scheduler: earlier processes (id, key) told to stop.
    fenced: HashSet<(NodeId, u64)>,
    /// Data messages dropped because their sender may not send them.
    rejected: u64,
    /// Drops already warned about, by sender and cause.
    dropped: LogOnce<(NodeId, &'static str)>,
    /// The budget of answers to admin clients.
    replies: Replies,
    /// The driver cannot read for a reason of its own (short of file
    /// descriptors for a shared-memory frame, say).
    stalled: bool,
    /// Since when this node reads nothing (see [`Core::is_listening`]).
    deaf_since: Option<Instant>,
    stopped: bool,
    /// Stopping (finalized): only resends go on until the exit drain ends.
    drain: Option<lifecycle::Drain>,
    /// The app is finalizing (see [`Core::finalizing`]): its last barrier's
    /// release starts the leaving.
    finalize_pending: bool,
    /// Leaving (the last barrier was released): closed connections are no
    /// deaths.
    finalizing: bool,
    /// On a leaving scheduler: the processes whose connection closed since
    /// (they left). Its exit drain waits for them (see [`LEAVE_LAST`]).
    left_at_exit: HashSet<NodeId>,
    changed: bool,
}

/// How long an incomplete message waits for its next part: longer than a
/// lost part's resends take (`PS_RESEND`), at least a minute.
fn parts_idle(cfg: &VanConfig) -> Duration {
    let resends = cfg
        .resend_timeout
        .map_or(Duration::ZERO, |t| t * 8 * (cfg.max_resends + 2));
    resends.max(Duration::from_secs(60))
}

impl Core {
    /// The core of the node `cfg` describes, listening at `port`, started
    /// at `now` (wall-clock time `wall`). The first output connects to the
    /// scheduler (the scheduler to itself).
    pub fn new(cfg: &VanConfig, port: i32, now: Instant, wall: SystemTime, seed: u64) -> Core {
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
        // What this node reads beyond ps-lite's messages (pslite peers send
        // partitioned and compressed messages only to entries that say so).
        me.features = pslite_proto::FEATURE_PARTITION
            | pslite_proto::FEATURE_COMPRESSION
            | pslite_proto::FEATURE_STALENESS;
        if let Some((host, pid)) = &cfg.shm_identity {
            me.host = host.clone();
            me.pid = *pid;
        }
        let scheduler_port = if is_scheduler {
            port
        } else {
            cfg.scheduler_port
        };
        let mut scheduler_node =
            Node::new(Role::Scheduler, cfg.scheduler_host.clone(), scheduler_port);
        scheduler_node.id = SCHEDULER;
        if is_scheduler {
            me.id = SCHEDULER;
        }
        let scheduler = is_scheduler.then(|| {
            Scheduler::new(
                SchedulerConfig {
                    me: me.clone(),
                    van: cfg.clone(),
                },
                now,
            )
        });
        let replies = Replies::new(cfg.store_limits.max_total);
        // From a counter that starts at random: a process that replaces a
        // server must not repeat its predecessor's signatures.
        let replica_ts = rng.random::<i32>() & i32::MAX;
        let parts = Parts {
            table: NodeTable::new(me.clone()),
            liveness: Liveness::new(cfg, scheduler_node.clone(), now),
            barriers: Barriers::default(),
            scheduler,
            registrations: Registrations::with_limit(cfg.hold_limit),
            store: Store::new(cfg, replies.clone()),
            replication: Replication::new(cfg, replica_ts),
            leave: Leave::default(),
            checkpoints: Checkpoints::for_config(cfg),
            resender: cfg
                .resend_timeout
                .map(|t| Resender::new(t, cfg.max_resends)),
            // Message numbers from the process's random key (no draw from
            // the generator, whose sequence the harness's seeds fix).
            partition: Partitions::new(
                cfg.partition_bytes,
                cfg.max_message_size.map_or(u64::MAX, |m| m.max(0) as u64),
                PartialBound::from_hold_limit(cfg.hold_limit),
                parts_idle(cfg),
                me.key.rotate_left(29),
            ),
            staleness: Default::default(),
        };
        let mut core = Core {
            cfg: cfg.clone(),
            counters: Arc::new(Counters::new(now)),
            rng,
            wall: (now, wall),
            parts,
            holds: Holds::new(cfg.hold_limit),
            waits: waits::Waits::default(),
            fx: Effects::default(),
            failure: None,
            out: Vec::new(),
            blank: me.clone(),
            next_timestamp: 0,
            connected: HashSet::new(),
            heard: HashSet::new(),
            early_ids: BTreeSet::new(),
            refused_identities: HashSet::new(),
            fenced: HashSet::new(),
            rejected: 0,
            dropped: LogOnce::new(log::Level::Warn),
            replies,
            stalled: false,
            deaf_since: None,
            stopped: false,
            drain: None,
            finalize_pending: false,
            finalizing: false,
            left_at_exit: HashSet::new(),
            changed: false,
        };
        // The scheduler talks to itself through its own ROUTER; a node makes
        // first contact with an empty identity (it has no id yet).
        let identity = me.id;
        let first = if is_scheduler { me } else { scheduler_node };
        core.connect(first, identity);
        core
    }

    /// Counts into `counters` instead of counters of its own (the
    /// Postoffice shares them with its apps).
    pub fn with_counters(mut self, counters: Arc<Counters>) -> Core {
        self.counters = counters;
        self
    }

    /// Tests: this node advertises `features` in its entry (as an older
    /// pslite node, `0`, would); before it registers.
    #[cfg(any(test, feature = "harness"))]
    pub fn set_features(&mut self, features: u32) {
        self.parts.table.set_features(features);
        self.blank.features = features;
    }

    /// What the driver must do now, in order.
    pub fn take_output(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.out)
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

    /// When [`Core::tick`] has work next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let p = &self.parts;
        let resends = p
            .resender
            .as_ref()
            .filter(|_| self.deaf_since.is_none())
            .and_then(Resender::poll_timeout);
        let waits = self.waits.tickets.poll_timeout();
        if let Some(drain) = &self.drain {
            let deadline = drain.outcome.is_none().then_some(drain.deadline);
            return [resends, deadline, waits].into_iter().flatten().min();
        }
        use crate::component::Component;
        [
            waits,
            p.table.poll_timeout(),
            p.liveness.poll_timeout(),
            p.scheduler.as_ref().and_then(Component::poll_timeout),
            resends,
            p.registrations.poll_timeout(),
            p.store.poll_timeout(),
            p.checkpoints.poll_timeout(),
            p.partition.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Clock-driven work at `now`, when wall-clock time is `wall` (what
    /// checkpoint files say they were made at): deadlines, heartbeats,
    /// resends.
    pub fn tick(&mut self, now: Instant, wall: SystemTime) {
        self.wall = (now, wall);
        if self.drain.is_none() {
            for part in parts::Part::CLOCK {
                self.on_part(part, now, |c, cx| c.tick(now, cx));
            }
        } else {
            self.with_store(now, |s, cx| s.tick_host(now, cx));
        }
        if self.deaf_since.is_none() {
            self.with_resender(now, |r, cx| crate::component::Component::tick(r, now, cx));
        }
        if self.waits.tickets.tick(now) {
            self.changed = true;
        }
        self.check_drain(now);
    }

    /// Carries out the effects the part `origin` just emitted, in order,
    /// each before the next (what one makes comes before the next).
    fn settle(&mut self, origin: Origin, now: Instant) {
        if self.fx.is_empty() {
            return;
        }
        for effect in self.fx.take() {
            self.apply(effect, origin, now);
        }
    }

    /// Carries out one effect.
    fn apply(&mut self, effect: Effect, origin: Origin, now: Instant) {
        match effect {
            Effect::Send(msg) => self.send_from(msg, origin, now),
            Effect::Connect(node) => {
                let identity = self.me().id;
                self.connect(node, identity);
            }
            Effect::ConnectAnonymous(node) => self.connect(node, pslite_proto::K_EMPTY),
            Effect::Disconnect(id) => {
                self.connected.remove(&id);
                self.out.push(Output::Disconnect(id));
            }
            Effect::ForApps(out) => self.for_apps(out, now),
            Effect::Out(out) => self.out.push(out),
            Effect::Reply(route, msg) => self.status_reply(route, msg, now),
            Effect::Event(event) => self.route_event(event, origin, now),
            Effect::Fail(failure) => self.fail(failure, now),
            Effect::Changed => self.changed = true,
            Effect::Route(msg) => self.dispatch(msg, now),
        }
    }

    /// Hands `out` to the apps, behind what waits for them (see
    /// `crate::hold`).
    fn for_apps(&mut self, out: Output, now: Instant) {
        match self.holds.for_apps(out) {
            ForApps::Now(out) => self.out.push(out),
            ForApps::Held => {}
            ForApps::Overflow => self.restore_overflow(now),
        }
    }

    /// The scheduler's answer to an admin client's status request: its own
    /// row gets its counters; within the budget of unread answers.
    fn status_reply(&mut self, route: bytes::Bytes, mut msg: Message, now: Instant) {
        if let Some(row) = msg.meta.status.iter_mut().find(|r| r.node.id == SCHEDULER) {
            row.counters = Some(self.counters.snapshot(now));
            row.counters_age = Some(Duration::ZERO);
        }
        msg.meta.sender = SCHEDULER;
        match self.replies.reply(route, msg) {
            Some(out) => self.out.push(out),
            None => debug!("scheduler: a status answer waits on too many unread answers"),
        }
    }
}
