//! The Van drives the transport: it owns the ZeroMQ sockets and the receive
//! thread, and moves frames between them and the [`Core`], which takes every
//! protocol decision and owns every deadline. The receive loop sleeps until
//! a message arrives or the core's next deadline ([`Core::poll_timeout`]);
//! waiters (`register`, `barrier`, a store call, the exit drain) wait on a
//! condition variable that the driver signals while holding the core's
//! lock, so no wake-up is lost.
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
use std::time::{Duration, Instant};

use bytes::Bytes;
use log::{debug, error, info, warn};
use pslite_proto::replica::RangeMap;
use pslite_proto::store::{StoreMsg, StoreOp};
use pslite_proto::{lock, wait_timeout_while, wait_while, Message, Node, NodeId, Role, K_EMPTY};

use crate::bind::{bind_local, bind_router, Waker};
use crate::config::VanConfig;
use crate::context::{self, Context, DescriptorFit};
use crate::core::{Core, LinkEvent, Output, Route};
use crate::counters::Counters;
use crate::dispatch::{describe, Delivered, Dispatch, Room};
use crate::error::{Failure, VanError};
use crate::links::{zmq_err, Links, Mode};
use crate::monitor::Monitors;
use crate::shm::{self, ShmStats};
use crate::transport::Transport;

mod receive;

/// A node's transport and control plane. Dropping it stops it.
pub struct Van {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
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
    links: Links,
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
    /// scheduler. Call [`Van::register`] to join the cluster.
    ///
    /// A scheduler configured with port 0 binds a free port (see
    /// [`Van::my_node`]), which is handy for tests.
    pub fn start(config: VanConfig, dispatch: Arc<dyn Dispatch>) -> Result<Van, VanError> {
        Van::start_with_counters(config, dispatch, Arc::new(Counters::new()))
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
        let mut core = Core::new(&config, port, Instant::now(), rand::random())
            .with_counters(Arc::clone(&counters));
        if let (Some(ck), true) = (&config.checkpoint, is_scheduler) {
            // What to restore is decided before anyone can register.
            let found = crate::checkpoint::disk::scan(&ck.dir)
                .map_err(|detail| VanError::Failed(Failure::Checkpoint { detail }))?;
            let ranges = crate::replica::key_ranges(config.num_servers.max(1) as usize);
            let catalog = crate::checkpoint::catalog(&found, &ranges)
                .map_err(|detail| VanError::Failed(Failure::Checkpoint { detail }))?;
            core.set_checkpoint_catalog(catalog);
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
                links: Links::new(
                    ctx.clone(),
                    config.clone(),
                    Arc::clone(&counters),
                    pool.clone(),
                    monitors,
                ),
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
        })
    }

    /// Joins the cluster as `customer_id`: sends ADD_NODE to the scheduler and
    /// waits (up to the start timeout) until the node table arrives. On the
    /// scheduler, waits until every node has registered. Returns at once if
    /// this node has already joined.
    pub fn register(&self, customer_id: i32) -> Result<(), VanError> {
        let shared = &self.shared;
        shared.with_core(Mode::Wait, |core, now| core.register(customer_id, now));
        let locked = wait_while(&shared.changed, lock(&shared.locked), |l| {
            l.core.join_status().is_none()
        });
        locked.core.join_status().unwrap_or(Err(VanError::NotReady))
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
        let Some(msg) = shared.with_core(mode, |core, now| core.send(msg, now))? else {
            return Ok(0); // held (replicated key ranges), or sent by the core
        };
        let sent = shared.links.send(&msg, mode);
        if sent.is_err() {
            shared.with_core(mode, |core, _| core.send_failed(&msg));
        }
        sent
    }

    /// Replicated key ranges: the range map this node knows, if the cluster
    /// replicates.
    pub fn range_map(&self) -> Option<RangeMap> {
        lock(&self.shared.locked).core.range_map().cloned()
    }

    /// Replicated key ranges, on a server: the apps whose state is copied
    /// to joining servers (app 0 unless set).
    pub fn set_replicated_apps(&self, apps: std::collections::BTreeSet<i32>) {
        self.shared
            .with_core(Self::mode(), |core, _| core.set_replicated_apps(apps));
    }

    /// App `app`'s answer to [`Dispatch::snapshot`] request `token`.
    pub fn snapshot_taken(&self, token: u64, app: i32, data: Bytes) {
        self.shared.with_core(Self::mode(), |core, now| {
            core.snapshot_taken(token, app, data, now)
        });
    }

    /// App `app` finished [`Dispatch::restore`] request `token`.
    pub fn restored(&self, token: u64, app: i32) {
        self.shared
            .with_core(Self::mode(), |core, now| core.restored(token, app, now));
    }

    /// App `app` cannot answer [`Dispatch::snapshot`] request `token` (its
    /// state cannot be copied): a checkpoint fails saying `why`.
    pub fn snapshot_failed(&self, token: u64, app: i32, why: &str) {
        self.shared.with_core(Self::mode(), |core, now| {
            core.snapshot_failed(token, app, why, now)
        });
    }

    /// App `app` refused [`Dispatch::restore`] request `token` (nothing
    /// changed): a server restoring a checkpoint fails saying `why`.
    pub fn restore_failed(&self, token: u64, app: i32, why: &str) {
        self.shared.with_core(Self::mode(), |core, now| {
            core.restore_failed(token, app, why, now)
        });
    }

    /// Whether this node's cluster takes checkpoints (its scheduler has
    /// `PS_CHECKPOINT_DIR`; known once joined).
    pub fn checkpointing(&self) -> bool {
        lock(&self.shared.locked).core.checkpointing()
    }

    /// Asks the scheduler for a checkpoint, labelled `label`, taken at the
    /// workers' next barrier where none has a request in flight (see
    /// `crate::checkpoint`), and waits up to `timeout` for the scheduler
    /// to accept it. Returns the ticket to wait on with
    /// [`Van::checkpoint_result`] and the checkpoint's id.
    pub fn checkpoint(&self, label: &str, timeout: Duration) -> Result<(u64, u64), VanError> {
        let ticket = self
            .shared
            .with_core(Mode::Wait, |core, now| core.checkpoint_request(label, now))?;
        let accepted = self.checkpoint_wait(ticket, timeout, false)?;
        if !accepted.error.is_empty() {
            lock(&self.shared.locked).core.end_checkpoint(ticket);
            return Err(Failure::Checkpoint {
                detail: format!("checkpoint refused: {}", accepted.error),
            }
            .into());
        }
        Ok((ticket, accepted.id))
    }

    /// Waits up to `timeout` for the checkpoint of `ticket` (from
    /// [`Van::checkpoint`]) to complete: every server's file (the answer's
    /// `files`, in `dir`), or why it failed.
    pub fn checkpoint_result(
        &self,
        ticket: u64,
        timeout: Duration,
    ) -> Result<pslite_proto::checkpoint::CheckpointMsg, VanError> {
        let result = self.checkpoint_wait(ticket, timeout, true);
        lock(&self.shared.locked).core.end_checkpoint(ticket);
        let result = result?;
        if !result.error.is_empty() {
            return Err(Failure::Checkpoint {
                detail: format!("checkpoint {} failed: {}", result.id, result.error),
            }
            .into());
        }
        Ok(result)
    }

    fn checkpoint_wait(
        &self,
        ticket: u64,
        timeout: Duration,
        result: bool,
    ) -> Result<pslite_proto::checkpoint::CheckpointMsg, VanError> {
        let shared = &self.shared;
        let (locked, timed_out) =
            wait_timeout_while(&shared.changed, lock(&shared.locked), timeout, |l| match l
                .core
                .checkpoint_answer(ticket)
            {
                Ok((accepted, done)) => if result { done } else { accepted }.is_none(),
                Err(_) => false,
            });
        let (accepted, done) = locked.core.checkpoint_answer(ticket)?;
        if let Some(answer) = if result { done } else { accepted } {
            return Ok(answer);
        }
        drop(locked);
        debug_assert!(timed_out);
        Err(Failure::Checkpoint {
            detail: format!(
                "no {} from the scheduler within {:.1} s{}",
                if result { "result" } else { "answer" },
                timeout.as_secs_f64(),
                if result {
                    " (a checkpoint is taken at the workers' next barrier where none has a \
                     request in flight)"
                } else {
                    ""
                }
            ),
        }
        .into())
    }

    /// Waits until every member of `group` (a sum of 1 scheduler, 2 servers,
    /// 4 workers) has called `barrier` for it; `timeout` bounds the wait.
    /// Fails with [`Failure::PeerDead`] if a member died and nothing
    /// replaced it within the recovery timeout (a pslite scheduler only).
    pub fn barrier(
        &self,
        customer_id: i32,
        group: i32,
        timeout: Option<Duration>,
    ) -> Result<(), VanError> {
        let shared = &self.shared;
        let token = shared.with_core(Mode::Wait, |core, now| {
            core.barrier(customer_id, group, timeout, now)
        })?;
        let mut locked = wait_while(&shared.changed, lock(&shared.locked), |l| {
            l.core.barrier_outcome(token).is_none()
        });
        let outcome = locked.core.barrier_outcome(token).unwrap_or(Ok(()));
        locked.core.end_barrier(token);
        outcome.map_err(|failure| match VanError::from(failure) {
            VanError::BarrierTimeout { group, secs, .. } => VanError::BarrierTimeout {
                group,
                secs,
                identity_conflicts: locked.core.identity_conflicts(),
            },
            e => e,
        })
    }

    /// Sends store request `req` to the scheduler and waits up to `limit`
    /// for its answer ([`VanError::StoreNoAnswer`] after that). Fails at
    /// once if the node failed or the scheduler is lost.
    pub fn store_call(&self, req: StoreMsg, limit: Duration) -> Result<StoreMsg, VanError> {
        let shared = &self.shared;
        let id = shared.with_core(Mode::Wait, |core, now| core.store_request(req, limit, now))?;
        let mut locked = wait_while(&shared.changed, lock(&shared.locked), |l| {
            l.core.store_answer(id).is_none()
        });
        let answer = locked.core.store_answer(id);
        locked.core.end_store(id);
        answer
            .unwrap_or(Err(Failure::Stopped))
            .map_err(VanError::from)
    }

    /// Sends every later change of `key` (store events, in order) to
    /// `events`, then registers the watch with the scheduler (see
    /// [`Van::store_call`]); returns the scheduler's answer.
    pub fn store_watch(
        &self,
        key: &str,
        events: mpsc::Sender<StoreMsg>,
        limit: Duration,
    ) -> Result<StoreMsg, VanError> {
        let shared = &self.shared;
        let watcher = shared.with_core(Mode::Wait, |core, _| core.store_watch(key));
        lock(&shared.watchers).insert(watcher, events);
        let req = StoreMsg::request(StoreOp::Watch, vec![key.to_string()]);
        let answer = self.store_call(req, limit);
        if answer.is_err() {
            lock(&shared.watchers).remove(&watcher);
            shared.with_core(Mode::Wait, |core, now| {
                core.store_watcher_gone(watcher, now)
            });
        }
        answer
    }

    /// Runs `f` on the core (for the read-only accessors below).
    fn read<T>(&self, f: impl FnOnce(&Core) -> T) -> T {
        f(&lock(&self.shared.locked).core)
    }

    /// On the scheduler: how many store requests (GET, WAIT) wait for keys
    /// to be set; 0 on other nodes.
    pub fn store_waiting(&self) -> usize {
        self.read(Core::store_waiting)
    }

    /// On the scheduler: how many store watches there are (members' and
    /// admin clients'); 0 on other nodes.
    pub fn store_watches(&self) -> usize {
        self.read(Core::store_watches)
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

    /// On a server of a job whose servers join and leave
    /// (`DMLC_NUM_SERVER=MIN:MAX`): asks the scheduler to let it leave and
    /// waits up to `limit` until its ranges are on the other servers. `Ok`:
    /// it left, its waits (a barrier) ended, and it may stop. Fails if the
    /// scheduler refuses (fewer than MIN servers would stay), does not
    /// answer in time, or the node failed.
    pub fn leave_job(&self, limit: Duration) -> Result<(), VanError> {
        let shared = &self.shared;
        shared.with_core(Mode::Wait, |core, now| core.leave_job(now))?;
        let (locked, timed_out) =
            wait_timeout_while(&shared.changed, lock(&shared.locked), limit, |l| {
                l.core.leave_outcome().is_none() && l.core.failure().is_none()
            });
        if let Some(outcome) = locked.core.leave_outcome() {
            return outcome.map_err(|detail| VanError::Setup {
                what: "leave the job",
                detail,
            });
        }
        if let Some(f) = locked.core.failure() {
            return Err(VanError::Failed(f.clone()));
        }
        debug_assert!(timed_out);
        Err(VanError::Setup {
            what: "leave the job",
            detail: format!(
                "the scheduler did not let this server go within {} s (its ranges are still \
                 being copied to the other servers, or the scheduler is unreachable)",
                limit.as_secs()
            ),
        })
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
    /// drain (see `Core::finish`). Waits in `register` or `barrier` fail with
    /// [`Failure::Stopped`].
    pub fn stop(&self) {
        let Some(thread) = lock(&self.thread).take() else {
            return;
        };
        let shared = &self.shared;
        shared.with_core(Mode::Wait, |core, now| {
            core.store_leave(now);
            core.finish(now);
        });
        drop(wait_while(&shared.changed, lock(&shared.locked), |l| {
            l.core.drain_outcome().is_none()
        }));
        shared.stopping.store(true, Ordering::SeqCst);
        shared.waker.wake();
        if thread.join().is_err() {
            error!("the receive thread panicked");
        }
        // What waits in a link (written while another thread held its
        // socket, or to a peer slow to read) goes out before the sockets
        // close: the last barrier's release to a node, say. The receive
        // thread, which retried it, is gone.
        let flush_until = Instant::now() + EXIT_FLUSH;
        if shared.links.any_waiting() {
            debug!("stopping: writing the messages that wait for their peers");
        }
        while shared.links.any_waiting() && Instant::now() < flush_until {
            if !shared.links.flush_waiting() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
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

/// How long [`Van::stop`] keeps writing messages that wait in links.
const EXIT_FLUSH: Duration = Duration::from_secs(1);

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
            for out in &outputs {
                match out {
                    Output::Connect { node, .. } => self.links.reserve(node.id),
                    Output::Disconnect(id) => self.links.remove(*id),
                    _ => {}
                }
            }
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
        self.carry_out(outputs, mode);
        value
    }

    /// Carries out the outputs that need no lock.
    fn carry_out(&self, outputs: Vec<Output>, mode: Mode) {
        let mut refused = Vec::new();
        for out in outputs {
            match out {
                Output::Connect {
                    node,
                    identity,
                    route,
                    key,
                } => self.connect(node, identity, key, route, mode),
                Output::Disconnect(_) => {}
                Output::Send(msg) => {
                    if let Err(e) = self.links.send(&msg, mode) {
                        debug!("cannot send {}: {e}", describe(&msg));
                    }
                }
                // In order: once one is refused, the rest wait behind it.
                Output::Deliver(msg) if !refused.is_empty() => refused.push(Output::Deliver(msg)),
                // A copy request is in request order too (replicated key
                // ranges): it waits behind a refused message.
                out @ (Output::Snapshot { .. } | Output::Restore { .. }) if !refused.is_empty() => {
                    refused.push(out)
                }
                Output::Deliver(msg) => {
                    if let Delivered::Full(msg) = self.dispatch.offer(msg, &self.room_signal) {
                        refused.push(Output::Deliver(msg));
                    }
                }
                Output::Reply {
                    route,
                    msg,
                    reserved,
                } => {
                    lock(&self.replies).push((route, msg, reserved));
                    if mode == Mode::Wait {
                        self.waker.wake();
                    }
                }
                Output::StoreEvent { watchers, event } => self.store_event(watchers, event, mode),
                Output::Undeliverable(msg, failure) => self.dispatch.undeliverable(msg, failure),
                Output::PeerDead(id, failure) => self.dispatch.peer_dead(id, &failure),
                Output::RoundBegan { round, workers } => self.dispatch.membership(round, &workers),
                Output::Snapshot {
                    token,
                    begin,
                    end,
                    apps,
                    ..
                } => {
                    for app in apps {
                        self.dispatch.snapshot(app, token, begin, end);
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
                        self.dispatch.restore(app, token, begin, end, data);
                    }
                }
                Output::RangeMap(map) => self.dispatch.range_map(&map),
                Output::Checkpoint { token, io } => self.checkpoint_io(token, io),
                Output::Failed(failure) => {
                    if failure != Failure::Stopped {
                        error!("{failure}");
                    }
                    self.dispatch.failed(&failure);
                }
                Output::Waiting {
                    waited,
                    limit,
                    what,
                } => log_waiting(&what, waited, limit),
            }
        }
        if !refused.is_empty() {
            self.with_core(mode, |core, now| core.park(refused, now));
        }
    }

    /// Carries out a checkpoint's file operation in a thread of its own
    /// (writes are fsynced: the receive thread never waits on the disk),
    /// then hands the core its result.
    fn checkpoint_io(&self, token: u64, io: crate::checkpoint::disk::Io) {
        let weak = self.this.clone();
        let spawned = std::thread::Builder::new()
            .name("pslite-checkpoint".into())
            .spawn(move || {
                let result = crate::checkpoint::disk::perform(&io);
                if let Some(shared) = weak.upgrade() {
                    shared.with_core(Mode::Wait, |core, now| {
                        core.checkpoint_io_done(token, result, now)
                    });
                }
            });
        if let Err(e) = spawned {
            let result = crate::checkpoint::disk::IoResult::Failed(format!(
                "cannot start a thread for the checkpoint's files: {e}"
            ));
            self.with_core(Mode::NoWait, |core, now| {
                core.checkpoint_io_done(token, result, now)
            });
        }
    }

    /// Opens the connection the core asked for (see [`Links::open`]). A
    /// registration's check to a host name is looked up first, in a thread
    /// of its own: the name comes from whoever registered, and ZeroMQ would
    /// look it up on its I/O thread, which a name that does not resolve
    /// would stall.
    fn connect(&self, node: Node, identity: NodeId, key: Option<u64>, route: Route, mode: Mode) {
        if node.id < 0 && node.hostname.parse::<std::net::IpAddr>().is_err() {
            self.connect_after_lookup(node);
            return;
        }
        if let Err(e) = self.links.open(&node, identity, key, &route, mode) {
            self.connect_failed(&node, &route, e, mode);
        }
    }

    /// A connection the core asked for could not be opened. Out of
    /// descriptors or sockets (or memory), the node fails naming the limit
    /// to raise; so does the scheduler for any reason (the job cannot form
    /// or go on without its connection to a member). A registration's check
    /// that cannot connect for another reason refuses the registration; a
    /// server or worker fails what it sends to that peer (as to an unknown
    /// one).
    fn connect_failed(&self, node: &Node, route: &Route, e: VanError, mode: Mode) {
        let exhausted = match &e {
            VanError::Zmq { source, .. } if context::is_exhaustion(*source) => Some(*source),
            _ => None,
        };
        let failure = match exhausted {
            Some(source) => Failure::Resources {
                peer: if node.id < 0 {
                    format!("{} (to check its registration)", route.endpoint)
                } else {
                    format!("node {} at {}", node.id, route.endpoint)
                },
                detail: context::exhaustion_advice(source, self.links.max_sockets()),
            },
            None if node.id < 0 => {
                let why = e.to_string();
                self.with_core(mode, |core, now| {
                    core.link_event(node.id, LinkEvent::Refused(why), now)
                });
                return;
            }
            None if self.config.role == Role::Scheduler => Failure::SendFailed {
                peer: node.id,
                reason: format!("cannot open a connection to it at {}: {e}", route.endpoint),
            },
            None => {
                error!("cannot connect to {node}: {e} (messages to it fail)");
                return;
            }
        };
        self.with_core(mode, |core, now| core.fail(failure, now));
    }

    /// [`Shared::connect`] for a registration's check whose address is a
    /// host name: a name that does not resolve refuses the check.
    fn connect_after_lookup(&self, node: Node) {
        let weak = self.this.clone();
        let spawned = std::thread::Builder::new()
            .name("pslite-lookup".into())
            .spawn(move || {
                let ip = crate::resolve::bind_ip(&node.hostname);
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                // The check may have ended meanwhile (its deadline passed).
                if !shared.with_core(Mode::Wait, |core, _| core.is_checking(node.id)) {
                    return;
                }
                let result = match ip {
                    Some(ip) => {
                        let route = Route {
                            endpoint: Transport::Tcp.connect_endpoint(&ip, node.port),
                            local: None,
                            shm_pid: None,
                            watch: true,
                        };
                        shared
                            .links
                            .open(&node, K_EMPTY, None, &route, Mode::Wait)
                            .map_err(|e| e.to_string())
                    }
                    None => Err(format!(
                        "its host name {:?} does not resolve",
                        node.hostname
                    )),
                };
                if let Err(why) = result {
                    shared.with_core(Mode::Wait, |core, now| {
                        core.link_event(node.id, LinkEvent::Refused(why), now)
                    });
                }
            });
        if let Err(e) = spawned {
            debug!("cannot start a name lookup: {e}");
        }
    }

    /// A watched DEALER's connection came up, closed or was refused: the
    /// core decides what it means for the peer the DEALER reaches now.
    fn on_link(&self, tag: u64, event: LinkEvent) {
        let Some(peer) = self.links.peer_of(tag) else {
            return; // a DEALER since replaced or closed
        };
        self.with_core(Mode::Wait, |core, now| core.link_event(peer, event, now));
    }

    /// Hands a store event to this process's watchers of its key; tells
    /// the core of those that are gone.
    fn store_event(&self, watchers: Vec<u64>, event: StoreMsg, mode: Mode) {
        let gone: Vec<u64> = {
            let mut senders = lock(&self.watchers);
            watchers
                .into_iter()
                .filter(|w| {
                    let sent = senders
                        .get(w)
                        .is_some_and(|tx| tx.send(event.clone()).is_ok());
                    if !sent {
                        senders.remove(w);
                    }
                    !sent
                })
                .collect()
        };
        for watcher in gone {
            self.with_core(mode, |core, now| core.store_watcher_gone(watcher, now));
        }
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

/// Logs a node's "still waiting to join" line.
fn log_waiting(what: &crate::WaitingFor, waited: Duration, limit: Duration) {
    let (secs, limit) = (waited.as_secs(), limit.as_secs());
    if waited.is_zero() {
        info!("{what} (up to {limit} s, PS_START_TIMEOUT)");
    } else {
        warn!("{what}: {secs} s of {limit} (PS_START_TIMEOUT)");
    }
}
