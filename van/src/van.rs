//! The Van drives the transport: it owns the ZeroMQ sockets and the receive
//! thread, and moves frames between them and the [`Core`], which takes every
//! protocol decision and owns every deadline. The receive loop sleeps until
//! a message arrives or the core's next deadline ([`Core::poll_timeout`]).
//! Every blocking call (joining, a barrier, a store request, a checkpoint,
//! a server's leave, the exit drain and flush) is a [`Call`] given to
//! [`Van::call`], one wait on a ticket the core completes or times out at
//! the deadline the caller gave; the caller
//! sleeps on a condition variable that the driver signals while holding
//! the core's lock, so no wake-up is lost. The Van reads the clocks and
//! passes them in; it keeps no deadline of its own.
//!
//! The core's outputs are carried out by `pslite_van_core::carry`, the
//! Van's side of it being `van/out.rs`; `van/features.rs` holds what the
//! features are told or asked without waiting (replicated ranges,
//! checkpoints, the store's watchers).
//!
//! The receive loop never blocks on anything but its own wait:
//! - a message the apps cannot take (a full customer queue) is parked in the
//!   core, and the loop stops reading its ROUTER until the queue has room
//!   ([`Room`]); ZeroMQ's high-water marks then hold the senders back, while
//!   the core's timers go on (heartbeats keep flowing, and the time spent
//!   not reading counts as nobody's silence);
//! - a write that would block on a peer waits in its link and is tried
//!   again ([`Links`]);
//! - a shared-memory frame this process has no descriptor left to map is
//!   tried again later, the loop not reading meanwhile.
//!
//! Sockets are created outside the core's lock. Data messages go to the
//! [`Dispatch`] the Van was started with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use log::{debug, error, info, warn};
use pslite_proto::store::StoreMsg;
use pslite_proto::{lock, wait_while, Message, Node, NodeId, Role};

use crate::bind::{bind_local, bind_router, Waker};
use crate::context::{self, Context, DescriptorFit};
use crate::counters::Counters;
use crate::dispatch::{Dispatch, Room};
use crate::links::{zmq_err, Links, Mode};
use crate::monitor::Monitors;
use crate::shm::{self, ShmStats};
use crate::transport::Transport;
use crate::VanConfig;
use crate::VanError;
use crate::{Core, LinkEvent, Output};
use pslite_van_core::carry;
use pslite_van_core::{Call, Done, EXIT_FLUSH};

mod features;
mod out;
mod receive;

use out::VanOut;

/// A node's transport and control plane. Dropping it stops it.
pub struct Van {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// A scheduler's hold on its `PS_CHECKPOINT_DIR` (one job per directory).
    _checkpoint_lock: Option<crate::checkpoint::disk::DirLock>,
}

/// The core and what the driver knows about the receive thread's sleep.
struct Locked {
    core: Core,
    /// When the receive thread will look at the clock next (`None`: only
    /// when woken).
    sleeping_until: Option<Instant>,
}

struct Shared {
    config: VanConfig,
    locked: Mutex<Locked>,
    changed: Condvar,
    links: Arc<Links>,
    /// Answers to admin clients for the receive thread to send through the
    /// ROUTER (the thread that owns it), each back on the connection its
    /// request came on: routing id, message, and its share of the core's
    /// reply budget.
    replies: Mutex<Vec<(Bytes, Message, usize)>>,
    /// The core's reply budget in use ([`Core::reply_gauge`]).
    reply_gauge: Arc<AtomicUsize>,
    /// What the core wants for the ROUTER's `ZMQ_ROUTER_HANDOVER`
    /// ([`Core::router_handover`]); the receive thread applies it.
    handover: AtomicBool,
    /// This `Shared`, for the threads it starts (name lookups).
    this: Weak<Shared>,
    /// Where the store events of this process's watchers go, by watcher.
    watchers: Mutex<HashMap<u64, mpsc::Sender<StoreMsg>>>,
    stopping: AtomicBool,
    /// Stopping: the receive thread tells the core once nothing waits in
    /// the links ([`Core::links_flushed`]).
    flushing: AtomicBool,
    /// A full customer queue has room: offer the parked messages again.
    room: AtomicBool,
    room_signal: Room,
    dispatch: Arc<dyn Dispatch>,
    waker: Waker,
    /// The core's counters, for the hot path without its lock.
    counters: Arc<Counters>,
    /// The segments this node sends from (shared memory on, `PS_SHM`).
    pool: Option<Arc<shm::Pool>>,
    /// Dropped last: every socket above belongs to it.
    _ctx: Context,
}

impl Van {
    /// Binds this node's ROUTER, starts the receive thread and, on a
    /// non-scheduler node, opens the first-contact connection to the
    /// scheduler. Join the cluster with [`Van::call`] ([`Call::Join`]).
    ///
    /// A scheduler configured with port 0 binds a free port (see
    /// [`Van::my_node`]), which is handy for tests.
    pub fn start(config: VanConfig, dispatch: Arc<dyn Dispatch>) -> Result<Van, VanError> {
        Van::start_with_counters(config, dispatch, Arc::new(Counters::new(Instant::now())))
    }

    /// [`Van::start`], counting traffic, resends and drops in `counters`
    /// (the Postoffice shares them with its apps).
    pub fn start_with_counters(
        mut config: VanConfig,
        dispatch: Arc<dyn Dispatch>,
        counters: Arc<Counters>,
    ) -> Result<Van, VanError> {
        let ctx = sized_context(&config)?;
        let is_scheduler = config.role == Role::Scheduler;
        let router = ctx
            .socket(zmq::ROUTER)
            .map_err(zmq_err("creating the ROUTER"))?;
        if let Some(token) = &config.auth_token {
            crate::auth::serve_router(&ctx, &router, token)?;
        }
        // A process whose old connection died without a FIN (a cut link)
        // reconnects with the same identity: it takes over the dead
        // connection instead of being turned away as a duplicate. Between
        // pslite nodes identities carry the process's key, so nobody else
        // can present them; the core turns this off once a member has no
        // key (a C++ node), as C++ ps-lite runs ([`Core::router_handover`]).
        router
            .set_router_handover(true)
            .map_err(zmq_err("setting ROUTER_HANDOVER"))?;
        let port = bind_router(&router, &config)?;
        if is_scheduler {
            config.scheduler_port = port;
        }
        let (waker, side) = Waker::new(&ctx, &router)?;
        if config.drop_percent > 0 && config.resend_timeout.is_none() {
            warn!(
                "PS_DROP_MSG={} drops messages but PS_RESEND is off: nothing resends them, so \
                 requests and barriers may wait until their deadlines (set PS_RESEND=1)",
                config.drop_percent
            );
        }
        config.shm_identity = None;
        let pool = if config.shm {
            match shm::host_identity() {
                Ok(host) => {
                    config.shm_identity = Some((host, std::process::id()));
                    Some(Arc::new(shm::Pool::new(shm::DEFAULT_POOL_BYTES)))
                }
                Err(e) => {
                    info!("shared memory with same-host peers is off: {e}");
                    None
                }
            }
        } else {
            None
        };
        config.ipc = match (&config.shm_identity, config.transport) {
            (Some((host, pid)), Transport::Tcp) if config.ipc => {
                bind_local(&router, host, *pid, port)
            }
            _ => false,
        };
        let mut core = Core::new(
            &config,
            port,
            Instant::now(),
            SystemTime::now(),
            rand::random(),
        )
        .with_counters(Arc::clone(&counters));
        let mut checkpoint_lock = None;
        if let (Some(ck), true) = (&config.checkpoint, is_scheduler) {
            // What to restore is decided before anyone can register.
            let ranges = pslite_van_core::replica::key_ranges(config.num_servers.max(1) as usize);
            match crate::checkpoint::open_dir(ck, &ranges) {
                Ok((catalog, lock)) => {
                    checkpoint_lock = Some(lock);
                    core.set_checkpoint_catalog(catalog);
                }
                // The job cannot start: every node that registers is told
                // why before this scheduler exits with it.
                Err(detail) => core.refuse_job(detail, Instant::now()),
            }
        }
        info!("{} listening on {}", core.me().role, core.me().address());
        let reply_gauge = core.reply_gauge();
        // The monitor thread reports to the Shared made below.
        let slot: Arc<OnceLock<Weak<Shared>>> = Arc::default();
        let report = Arc::clone(&slot);
        let monitors = Monitors::start(&ctx, move |tag, event| {
            if let Some(shared) = report.get().and_then(Weak::upgrade) {
                shared.on_link(tag, event);
            }
        })?;
        let shared = Arc::new_cyclic(|me: &Weak<Shared>| {
            let this = me.clone();
            let me = me.clone();
            Shared {
                links: Arc::new(Links::new(
                    ctx.clone(),
                    config.clone(),
                    Arc::clone(&counters),
                    pool.clone(),
                    monitors,
                )),
                config,
                locked: Mutex::new(Locked {
                    core,
                    sleeping_until: None,
                }),
                changed: Condvar::new(),
                replies: Mutex::new(Vec::new()),
                reply_gauge,
                handover: AtomicBool::new(true),
                this,
                watchers: Mutex::new(HashMap::new()),
                stopping: AtomicBool::new(false),
                flushing: AtomicBool::new(false),
                room: AtomicBool::new(false),
                room_signal: Room::new(move || {
                    if let Some(shared) = me.upgrade() {
                        shared.room.store(true, Ordering::SeqCst);
                        shared.waker.wake();
                    }
                }),
                dispatch,
                waker,
                counters,
                pool,
                _ctx: ctx,
            }
        });
        let _ = slot.set(Arc::downgrade(&shared));
        // The first output connects to the scheduler (watched: with
        // PS_AUTH_TOKEN, a refusal fails the node at once, not at the start
        // timeout; see Core::link_event).
        shared.with_core(Mode::Wait, |_, _| ());
        shared.links.start_pump()?;
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("pslite-van-{}", shared.config.role))
            .spawn(move || thread_shared.receive_thread(router, side))
            .map_err(|e| VanError::Setup {
                what: "start the receive thread",
                detail: e.to_string(),
            })?;
        Ok(Van {
            shared,
            thread: Mutex::new(Some(thread)),
            _checkpoint_lock: checkpoint_lock,
        })
    }

    /// The one way a caller blocks: `call` starts in the core (joining, a
    /// barrier, a store request, a checkpoint, a server's leave, ...: see
    /// [`Call`]) and the caller sleeps on the condition variable until the
    /// core completes its ticket or times it out after `limit` (every
    /// deadline is the core's: the receive thread ticks it). Joining waits
    /// up to `PS_START_TIMEOUT` whatever `limit` says, and returns at once
    /// if this node has joined.
    pub fn call(&self, call: Call, limit: Option<Duration>) -> Result<Done, VanError> {
        // No waiting send while joining: one to a refused scheduler blocks
        // past the failure.
        let mode = match call {
            Call::Join { .. } => Mode::NoWait,
            _ => Mode::Wait,
        };
        let shared = &self.shared;
        let ticket = shared.with_core(mode, |core, now| core.call(call, limit, now))?;
        if mode == Mode::NoWait {
            // What waits in a link, and a new deadline: the receive thread's.
            shared.waker.wake();
        }
        let mut locked = wait_while(&shared.changed, lock(&shared.locked), |l| {
            l.core.outcome(ticket).is_none()
        });
        let outcome = locked
            .core
            .outcome(ticket)
            .unwrap_or(Err(VanError::NotReady));
        locked.core.end_wait(ticket);
        outcome
    }

    /// How the calling thread may use the core: never waiting on the
    /// receive thread (an inline handler), else waiting for a slow peer.
    fn mode() -> Mode {
        if receive::on_receive_thread() {
            Mode::NoWait
        } else {
            Mode::Wait
        }
    }

    /// Sends a message to `msg.meta.recver`; returns the bytes sent. From
    /// an app thread it may wait for a slow peer; from the receive thread
    /// (an inline handler) it never waits: the message waits in its link.
    pub fn send(&self, msg: Message) -> Result<usize, VanError> {
        let shared = &self.shared;
        let mode = Self::mode();
        // Nothing: held (replicated key ranges), or sent by the core; more
        // than one: parts.
        let msgs = shared.with_core(mode, |core, now| core.send(msg, now))?;
        // Parts go to the link together (its bound on begun messages).
        match shared.links.send_parts(&msgs, mode) {
            Ok(bytes) => Ok(bytes),
            Err(e) => {
                shared.with_core(mode, |core, _| {
                    for m in &msgs {
                        core.send_failed(m);
                    }
                });
                Err(e)
            }
        }
    }

    /// Runs `f` on the core (for the read-only accessors below).
    fn read<T>(&self, f: impl FnOnce(&Core) -> T) -> T {
        f(&lock(&self.shared.locked).core)
    }

    /// The configuration this Van runs with.
    pub fn config(&self) -> &VanConfig {
        &self.shared.config
    }

    /// What the shared-memory path did (`None` when it is off).
    pub fn shm_stats(&self) -> Option<Arc<ShmStats>> {
        self.shared.pool.as_ref().map(|p| Arc::clone(p.stats()))
    }

    /// This node's counters (traffic per peer, resends, drops, and what the
    /// apps count: requests in flight, handler time).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.shared.counters
    }

    /// This node as the cluster knows it (its id once joined).
    pub fn my_node(&self) -> Node {
        self.read(|core| core.me().clone())
    }

    /// The node table: every server and worker entry and the scheduler.
    pub fn nodes(&self) -> Vec<Node> {
        self.read(Core::nodes)
    }

    /// What node `id` can receive beyond ps-lite's messages
    /// ([`pslite_proto::FEATURE_PARTITION`], ...): its table entry's
    /// features; 0 for a node not in the table, a C++ node, or any node
    /// under a C++ scheduler.
    pub fn peer_features(&self, id: NodeId) -> u32 {
        self.read(|core| core.node(id).map_or(0, |n| n.features))
    }

    /// Whether data to node `id` goes through shared memory (a pslite node
    /// of this host), not over a network link.
    pub fn shares_memory_with(&self, id: NodeId) -> bool {
        self.read(|core| core.shares_memory_with(id))
    }

    /// Elastic mode: the current round and its workers in rank order.
    pub fn round(&self) -> Option<(u64, Vec<NodeId>)> {
        self.read(Core::round)
    }

    /// Elastic mode: the round this node joined in.
    pub fn joined_round(&self) -> Option<u64> {
        self.read(Core::joined_round)
    }

    /// Elastic mode, on a worker: tells the scheduler this worker leaves
    /// the job (call before [`Van::stop`]).
    pub fn leave(&self) -> Result<(), VanError> {
        self.shared
            .with_core(Mode::Wait, |core, now| core.leave(now));
        Ok(())
    }

    /// This node is finalizing: its next barrier is the last. Once that is
    /// released everyone leaves (the scheduler may exit first), so from then
    /// on a closed connection no longer means a death (see
    /// `Core::finalizing`).
    pub fn finalizing(&self) {
        self.shared
            .with_core(Mode::Wait, |core, _| core.finalizing());
    }

    /// Whether this node has joined the cluster.
    pub fn is_ready(&self) -> bool {
        self.read(Core::is_joined)
    }

    /// A fresh timestamp for a control message.
    pub fn next_timestamp(&self) -> i32 {
        lock(&self.shared.locked).core.next_timestamp()
    }

    /// Data messages dropped because their sender may not send them.
    pub fn rejected_messages(&self) -> u64 {
        self.read(Core::rejected)
    }

    /// Ids of nodes silent for longer than `timeout` (ps-lite's
    /// `GetDeadNodes`): on the scheduler, servers and workers; elsewhere, the
    /// scheduler. Heartbeats (`PS_HEARTBEAT_INTERVAL`) keep live nodes heard.
    pub fn dead_nodes(&self, timeout: Duration) -> Vec<NodeId> {
        self.read(|core| core.dead_nodes(Instant::now(), timeout))
    }

    /// Stops the receive thread and closes every socket, after the exit
    /// drain (see `Core::finish`). Calls waiting (joining, a barrier) fail with
    /// [`Failure::Stopped`](crate::Failure::Stopped).
    pub fn stop(&self) {
        let Some(thread) = lock(&self.thread).take() else {
            return;
        };
        let shared = &self.shared;
        // The exit drain: what this node sent is given time to be
        // acknowledged.
        let _ = self.call(Call::Drain, None);
        // What waits in a link (queued behind higher priorities or what
        // ZeroMQ still writes, written while another thread held its
        // socket, or to a peer slow to read) goes out before the sockets
        // close: the last barrier's release to a node, say. The receive
        // thread retries it and says when nothing waits (up to EXIT_FLUSH).
        shared.flushing.store(true, Ordering::SeqCst);
        let waiting = shared.links.any_queued();
        if waiting {
            debug!("stopping: writing the messages that wait for their peers");
        }
        let _ = self.call(Call::Flush { waiting }, Some(EXIT_FLUSH));
        shared.stopping.store(true, Ordering::SeqCst);
        shared.waker.wake();
        if thread.join().is_err() {
            error!("the receive thread panicked");
        }
        // The receive thread closed the ROUTER; an ipc socket file stays.
        crate::bind::remove_ipc_file(shared.config.transport, self.my_node().port);
        shared.with_core(Mode::Wait, |core, now| core.stop(now));
        shared.links.clear();
        lock(&shared.replies).clear();
        if let Some(line) = shared
            .pool
            .as_ref()
            .and_then(|p| p.stats().summary(p.bytes()))
        {
            info!("{line}");
        }
    }
}

impl Drop for Van {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    /// Runs `f` on the core under its lock, then carries out the core's
    /// outputs: links reserved while still holding the lock (so a message
    /// prepared for a new peer finds it), waiters woken while holding it (no
    /// lost wake-ups), the rest after releasing it (no socket is created
    /// under the lock; deliveries run app code). `mode` says whether the
    /// caller may wait on a peer: app threads may, the receive thread never.
    fn with_core<T>(&self, mode: Mode, f: impl FnOnce(&mut Core, Instant) -> T) -> T {
        let mut wake = false;
        let (value, outputs) = {
            let mut locked = lock(&self.locked);
            let value = f(&mut locked.core, Instant::now());
            let outputs = locked.core.take_output();
            // In order, under the lock: a connection closed and opened again
            // in one batch ends up open.
            carry::links_first(&outputs, &mut VanOut { shared: self, mode });
            if locked.core.take_changed() {
                self.changed.notify_all();
            }
            self.handover
                .store(locked.core.router_handover(), Ordering::Relaxed);
            // A new deadline earlier than the receive thread's sleep: wake
            // it (the receive thread itself looks again anyway).
            if let Some(next) = locked.core.poll_timeout() {
                if locked.sleeping_until.is_none_or(|s| next < s) {
                    locked.sleeping_until = Some(next);
                    wake = mode == Mode::Wait;
                }
            }
            (value, outputs)
        };
        if wake {
            self.waker.wake();
        }
        let refused = carry::carry_out(outputs, &mut VanOut { shared: self, mode });
        if !refused.is_empty() {
            self.park(refused, mode);
        }
        value
    }

    /// The apps refused these: the core keeps them until there is room.
    fn park(&self, refused: Vec<Output>, mode: Mode) {
        self.with_core(mode, |core, now| core.park(refused, now));
    }

    /// A watched DEALER's connection came up, closed or was refused: the
    /// core decides what it means for the peer the DEALER reaches now.
    fn on_link(&self, tag: u64, event: LinkEvent) {
        let Some(peer) = self.links.peer_of(tag) else {
            return; // a DEALER since replaced or closed
        };
        self.with_core(Mode::Wait, |core, now| core.link_event(peer, event, now));
    }
}

/// The ZeroMQ context of the node `config` describes, holding as many
/// sockets as its job may need, with the descriptor limit raised towards
/// that need (said; see [`crate::context`]).
fn sized_context(config: &VanConfig) -> Result<Context, VanError> {
    let need = context::needed_descriptors(config);
    let nodes = format!(
        "a {} of a job of {} servers and {} workers",
        config.role, config.num_servers, config.num_workers
    );
    match context::fit_descriptor_limit(need) {
        DescriptorFit::Enough => {}
        DescriptorFit::Raised { from, to } => info!(
            "raised this process's file descriptor limit (ulimit -n) from {from} to {to}: {nodes} \
             may need {need}"
        ),
        DescriptorFit::Short { limit, raised } => warn!(
            "{nodes} may need {need} file descriptors, and this process may open {limit}{}: \
             raise the hard limit (ulimit -Hn, LimitNOFILE= in systemd, --ulimit nofile= in \
             Docker) if it runs out",
            if raised {
                " (raised to the hard limit)"
            } else {
                ""
            }
        ),
    }
    Context::new(context::needed_sockets(config))
}
