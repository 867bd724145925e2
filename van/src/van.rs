//! The Van drives the transport: it owns the ZeroMQ sockets and the receive
//! thread, and moves frames between them and the [`Core`], which takes every
//! protocol decision. The receive thread sleeps until a message arrives or
//! the core's next deadline ([`Core::poll_timeout`]); waiters (`register`,
//! `barrier`, the flush at exit) wait on a condition variable that the
//! driver signals while holding the core's lock, so no wake-up is lost.
//!
//! Data messages go to the [`Dispatch`] the Van was started with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use log::{debug, error, info, trace, warn};
use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::{lock, wait_while, Command, Message, Meta, Node, K_EMPTY};

use crate::config::VanConfig;
use crate::core::{Core, Output};
use crate::counters::{Counters, DropReason};
use crate::error::{Failure, VanError};
use crate::log_once::LogOnce;
use crate::shm::{self, ShmStats};
use crate::transport::{self, RawMessage, Transport};

/// Receives the data messages (no control command) that reach this node,
/// and the failures of what this node sent.
///
/// Called on the Van's receive thread: it must hand the message over
/// (e.g. to a queue) rather than do long work.
pub trait Dispatch: Send + Sync + 'static {
    /// One data message, with `meta.sender` and `meta.recver` filled in.
    fn deliver(&self, msg: Message);

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
}

/// How long DEALERs keep unsent messages when closed.
const LINGER_MS: i32 = 1000;
/// How long a DEALER waits for its TCP connection to be accepted before
/// ZeroMQ abandons the attempt and retries (after `ZMQ_RECONNECT_IVL`,
/// 100 ms by default). Loopback and LAN connections take well under a
/// millisecond; a longer wait means the SYN was dropped.
const CONNECT_TIMEOUT_MS: i32 = 500;
/// Connections to admin clients the scheduler keeps open.
const ADMIN_DEALERS: usize = 32;
/// Pending connections a ROUTER accepts before the kernel drops SYNs.
const LISTEN_BACKLOG: i32 = 4096;

/// The identity of the in-process socket that wakes the receive thread.
const WAKE_IDENTITY: &[u8] = b"pslite-wake";

/// A node's transport and control plane. Dropping it stops it.
pub struct Van {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

type Sender = Arc<Mutex<zmq::Socket>>;

/// The core and what the driver knows about the receive thread's sleep.
struct Locked {
    core: Core,
    /// When the receive thread will look at the clock next (`None`: only
    /// when a message arrives).
    sleeping_until: Option<Instant>,
}

struct Shared {
    config: VanConfig,
    locked: Mutex<Locked>,
    changed: Condvar,
    /// DEALERs by peer id; dropped before `ctx`.
    senders: Mutex<HashMap<NodeId, Sender>>,
    /// Where the store events of this process's watchers go, by watcher.
    watchers: Mutex<HashMap<u64, std::sync::mpsc::Sender<pslite_proto::store::StoreMsg>>>,
    /// On the scheduler: DEALERs to admin clients, by endpoint, most
    /// recently used last (at most [`ADMIN_DEALERS`]). One per client keeps
    /// its answers and store events in order, and a client's ROUTER takes
    /// only one connection at a time with the scheduler's identity.
    admin_dealers: Mutex<Vec<(String, zmq::Socket)>>,
    stopping: AtomicBool,
    dispatch: Arc<dyn Dispatch>,
    waker: Mutex<zmq::Socket>,
    /// The core's counters, for the hot path without its lock.
    counters: Arc<Counters>,
    /// The shared-memory path, when on (`PS_SHM`) and this host has one.
    shm: Option<ShmSide>,
    /// This node's host identity when it listens on its abstract Unix
    /// socket for same-host pslite peers and reaches theirs (`PS_IPC`).
    ipc_host: Option<String>,
    ctx: zmq::Context,
}

/// This node's side of the shared-memory path ([`crate::shm`]).
struct ShmSide {
    /// This node's host identity.
    host: String,
    /// The segments this node sends from.
    pool: shm::Pool,
    /// Same-host peers, by id: their pid (from their node-table entries,
    /// recorded when connecting to them).
    peers: Mutex<HashMap<NodeId, u32>>,
}

fn zmq_err(context: impl Into<String>) -> impl FnOnce(zmq::Error) -> VanError {
    let context = context.into();
    move |source| VanError::Zmq { context, source }
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
        let ctx = zmq::Context::new();
        let is_scheduler = config.role == pslite_proto::Role::Scheduler;
        let router = ctx
            .socket(zmq::ROUTER)
            .map_err(zmq_err("creating the ROUTER"))?;
        if let Some(token) = &config.auth_token {
            crate::auth::serve_router(&ctx, &router, token)?;
        }
        // A node replacing one whose link was cut (no FIN ever arrived)
        // connects with the same identity `ps<id>`: it takes over the dead
        // connection instead of being turned away as a duplicate.
        router
            .set_router_handover(true)
            .map_err(zmq_err("setting ROUTER_HANDOVER"))?;
        let port = bind_router(&router, &config)?;
        if is_scheduler {
            config.scheduler_port = port;
        }
        static VAN_COUNT: AtomicU64 = AtomicU64::new(0);
        let wake_endpoint = format!(
            "inproc://pslite-wake-{}-{}",
            std::process::id(),
            VAN_COUNT.fetch_add(1, Ordering::Relaxed)
        );
        router
            .bind(&wake_endpoint)
            .map_err(zmq_err("binding the wake-up endpoint"))?;
        let waker = ctx
            .socket(zmq::DEALER)
            .map_err(zmq_err("creating the wake-up socket"))?;
        waker
            .set_identity(WAKE_IDENTITY)
            .map_err(zmq_err("setting the wake-up identity"))?;
        waker
            .set_linger(0)
            .map_err(zmq_err("setting LINGER on the wake-up socket"))?;
        waker
            .connect(&wake_endpoint)
            .map_err(zmq_err("connecting the wake-up socket"))?;

        if config.drop_percent > 0 && config.resend_timeout.is_none() {
            warn!(
                "PS_DROP_MSG={} drops messages but PS_RESEND is off: nothing resends them, so \
                 requests and barriers may wait until their deadlines (set PS_RESEND=1)",
                config.drop_percent
            );
        }
        let shm_side = if config.shm {
            match shm::host_identity() {
                Ok(host) => {
                    config.shm_identity = Some((host.clone(), std::process::id()));
                    Some(ShmSide {
                        host,
                        pool: shm::Pool::new(shm::DEFAULT_POOL_BYTES),
                        peers: Mutex::new(HashMap::new()),
                    })
                }
                Err(e) => {
                    info!("shared memory with same-host peers is off: {e}");
                    None
                }
            }
        } else {
            config.shm_identity = None;
            None
        };
        let ipc_host = match (&config.shm_identity, config.transport) {
            (Some((host, pid)), Transport::Tcp) if config.ipc => {
                let endpoint = transport::local_endpoint(host, *pid, port);
                match router.bind(&endpoint) {
                    Ok(()) => {
                        debug!("also listening on {endpoint} for same-host peers");
                        Some(host.clone())
                    }
                    Err(e) => {
                        info!("same-host peers use TCP: cannot bind {endpoint}: {e}");
                        None
                    }
                }
            }
            _ => None,
        };
        let seed = rand::random();
        let core =
            Core::new(&config, port, Instant::now(), seed).with_counters(Arc::clone(&counters));
        info!("{} listening on {}", core.me().role, core.me().address());
        let shared = Arc::new(Shared {
            config,
            locked: Mutex::new(Locked {
                core,
                sleeping_until: None,
            }),
            changed: Condvar::new(),
            senders: Mutex::new(HashMap::new()),
            watchers: Mutex::new(HashMap::new()),
            admin_dealers: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            dispatch,
            waker: Mutex::new(waker),
            counters,
            shm: shm_side,
            ipc_host,
            ctx,
        });
        // The first output connects to the scheduler.
        shared.with_core(|_, _| ())?;
        if shared.config.auth_token.is_some() && !is_scheduler {
            shared.watch_auth_refusal()?;
        }
        let thread_shared = Arc::clone(&shared);
        let role = shared.config.role;
        let thread = std::thread::Builder::new()
            .name(format!("pslite-van-{role}"))
            .spawn(move || thread_shared.receive_thread(router))
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
        shared.with_core(|core, now| core.register(customer_id, now))?;
        let locked = lock(&shared.locked);
        let locked = wait_while(&shared.changed, locked, |l| l.core.join_status().is_none());
        locked.core.join_status().unwrap_or(Err(VanError::NotReady))
    }

    /// Sends a message to `msg.meta.recver`; returns the bytes sent.
    pub fn send(&self, msg: Message) -> Result<usize, VanError> {
        self.shared.send(msg)
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
        let token =
            shared.with_core(|core, now| core.barrier(customer_id, group, timeout, now))??;
        let locked = lock(&shared.locked);
        let mut locked = wait_while(&shared.changed, locked, |l| {
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
    pub fn store_call(
        &self,
        req: pslite_proto::store::StoreMsg,
        limit: Duration,
    ) -> Result<pslite_proto::store::StoreMsg, VanError> {
        let shared = &self.shared;
        let id = shared.with_core(|core, now| core.store_request(req, limit, now))??;
        let locked = lock(&shared.locked);
        let mut locked = wait_while(&shared.changed, locked, |l| {
            l.core.store_answer(id).is_none()
        });
        let answer = locked.core.store_answer(id);
        locked.core.end_store(id);
        answer
            .unwrap_or(Err(Failure::Stopped))
            .map_err(VanError::from)
    }

    /// On the scheduler: how many store requests (GET, WAIT) wait for keys
    /// to be set; 0 on other nodes.
    pub fn store_waiting(&self) -> usize {
        lock(&self.shared.locked).core.store_waiting()
    }

    /// The configuration this Van runs with.
    pub fn config(&self) -> &VanConfig {
        &self.shared.config
    }

    /// On the scheduler: how many store watches there are (members' and
    /// admin clients'); 0 on other nodes.
    pub fn store_watches(&self) -> usize {
        lock(&self.shared.locked).core.store_watches()
    }

    /// Sends every later change of `key` (store events, in order) to
    /// `events`, then registers the watch with the scheduler (see
    /// [`Van::store_call`]); returns the scheduler's answer.
    pub fn store_watch(
        &self,
        key: &str,
        events: std::sync::mpsc::Sender<pslite_proto::store::StoreMsg>,
        limit: Duration,
    ) -> Result<pslite_proto::store::StoreMsg, VanError> {
        use pslite_proto::store::{StoreMsg, StoreOp};
        let shared = &self.shared;
        let watcher = shared.with_core(|core, _| core.store_watch(key))?;
        lock(&shared.watchers).insert(watcher, events);
        let answer = self.store_call(
            StoreMsg::request(StoreOp::Watch, vec![key.to_string()]),
            limit,
        );
        if answer.is_err() {
            lock(&shared.watchers).remove(&watcher);
            let _ = shared.with_core(|core, now| core.store_watcher_gone(watcher, now));
        }
        answer
    }

    /// What the shared-memory path did (`None` when it is off).
    pub fn shm_stats(&self) -> Option<Arc<ShmStats>> {
        self.shared.shm.as_ref().map(|s| Arc::clone(&s.pool.stats))
    }

    /// This node's counters (traffic per peer, resends, drops, and what the
    /// apps count: requests in flight, handler time).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.shared.counters
    }

    /// This node as the cluster knows it (its id once joined).
    pub fn my_node(&self) -> Node {
        lock(&self.shared.locked).core.me().clone()
    }

    /// The node table: every server and worker entry and the scheduler.
    pub fn nodes(&self) -> Vec<Node> {
        lock(&self.shared.locked).core.nodes()
    }

    /// Elastic mode: the current round and its workers in rank order.
    pub fn round(&self) -> Option<(u64, Vec<NodeId>)> {
        lock(&self.shared.locked).core.round()
    }

    /// Elastic mode: the round this node joined in.
    pub fn joined_round(&self) -> Option<u64> {
        lock(&self.shared.locked).core.joined_round()
    }

    /// Elastic mode, on a worker: tells the scheduler this worker leaves
    /// the job (call before [`Van::stop`]).
    pub fn leave(&self) -> Result<(), VanError> {
        self.shared.with_core(|core, now| core.leave(now))
    }

    /// Whether this node has joined the cluster.
    pub fn is_ready(&self) -> bool {
        lock(&self.shared.locked).core.is_joined()
    }

    /// A fresh timestamp for a control message.
    pub fn next_timestamp(&self) -> i32 {
        lock(&self.shared.locked).core.next_timestamp()
    }

    /// Data messages dropped because their sender may not send them.
    pub fn rejected_messages(&self) -> u64 {
        lock(&self.shared.locked).core.rejected()
    }

    /// Ids of nodes silent for longer than `timeout` (ps-lite's
    /// `GetDeadNodes`): on the scheduler, servers and workers; elsewhere, the
    /// scheduler. Heartbeats (`PS_HEARTBEAT_INTERVAL`) keep live nodes heard.
    pub fn dead_nodes(&self, timeout: Duration) -> Vec<NodeId> {
        lock(&self.shared.locked)
            .core
            .dead_nodes(Instant::now(), timeout)
    }

    /// Stops the receive thread and closes every socket. Waits in
    /// `register` or `barrier` fail with [`Failure::Stopped`].
    pub fn stop(&self) {
        let Some(thread) = lock(&self.thread).take() else {
            return;
        };
        let shared = &self.shared;
        let _ = shared.with_core(|core, now| {
            core.store_leave(now);
            core.finish(now);
        });
        // The exit drain: the core ends it (see `Core::finish`).
        drop(wait_while(&shared.changed, lock(&shared.locked), |l| {
            l.core.drain_outcome().is_none()
        }));
        shared.stopping.store(true, Ordering::SeqCst);
        shared.wake();
        if thread.join().is_err() {
            error!("the receive thread panicked");
        }
        let _ = shared.with_core(|core, now| core.stop(now));
        lock(&shared.senders).clear();
        lock(&shared.admin_dealers).clear();
        if let Some(side) = &shared.shm {
            if let Some(line) = side.pool.stats().summary(side.pool.bytes()) {
                info!("{line}");
            }
        }
    }
}

impl Drop for Van {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds the ROUTER of the node `config` describes and returns the port it
/// listens on (the scheduler's port, `PORT`, or a free one).
fn bind_router(router: &zmq::Socket, config: &VanConfig) -> Result<i32, VanError> {
    let is_scheduler = config.role == pslite_proto::Role::Scheduler;
    let (hostname, port) = if is_scheduler {
        (&config.scheduler_host, Some(config.scheduler_port))
    } else {
        (&config.host, config.port)
    };
    let port = port.filter(|&p| p != 0);
    // ZeroMQ listens with a backlog of 100: when a few hundred nodes connect
    // at once (registration, then reconnecting as `ps<id>`), the kernel drops
    // the SYNs beyond it and the peers retry only after TCP's 1 s timeout.
    // The kernel caps this at net.core.somaxconn.
    router
        .set_backlog(LISTEN_BACKLOG)
        .map_err(zmq_err("setting the listen backlog"))?;
    if let Some(max) = config.max_message_size {
        router
            .set_maxmsgsize(max)
            .map_err(zmq_err("setting the maximum message size"))?;
    }
    if config.transport == Transport::Ipc {
        if let Some(port) = port {
            let endpoint = Transport::Ipc.bind_endpoint("", port);
            router
                .bind(&endpoint)
                .map_err(|source| VanError::Bind { endpoint, source })?;
            return Ok(port);
        }
        // Pick an unused socket name; ps-lite names them after a port.
        for _ in 0..100 {
            let port = rand::random_range(20_000..60_000);
            if std::path::Path::new(&format!("/tmp/{port}")).exists() {
                continue;
            }
            if router.bind(&Transport::Ipc.bind_endpoint("", port)).is_ok() {
                return Ok(port);
            }
        }
        return Err(VanError::Setup {
            what: "find a free ipc:///tmp/<port> endpoint",
            detail: "100 tries failed; set PORT".into(),
        });
    }
    let bind_host = config.bind_host.as_deref().unwrap_or(hostname);
    let ip = crate::resolve::bind_ip(bind_host).ok_or_else(|| VanError::Resolve {
        host: bind_host.to_string(),
    })?;
    if ip.contains(':') {
        router
            .set_ipv6(true)
            .map_err(zmq_err("enabling IPv6 on the ROUTER"))?;
    }
    match port {
        Some(port) => {
            let endpoint = Transport::Tcp.bind_endpoint(&ip, port);
            router
                .bind(&endpoint)
                .map_err(|source| VanError::Bind { endpoint, source })?;
            Ok(port)
        }
        None => {
            let endpoint = Transport::Tcp.bind_endpoint(&ip, 0).replace(":0", ":*");
            router.bind(&endpoint).map_err(|source| VanError::Bind {
                endpoint: endpoint.clone(),
                source,
            })?;
            let bound = router
                .get_last_endpoint()
                .map_err(zmq_err("reading the bound endpoint"))?
                .unwrap_or_default();
            bound
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| VanError::Setup {
                    what: "read the bound port",
                    detail: format!("ZeroMQ reported the endpoint {bound:?}"),
                })
        }
    }
}

/// A one-line description of a message for logs.
pub fn describe(msg: &Message) -> String {
    let m = &msg.meta;
    let mut s = format!("{} -> {}", m.sender, m.recver);
    if !m.control.is_empty() {
        s += &format!(" {:?}", m.control.cmd);
        if m.control.cmd == Command::Barrier {
            s += &format!(" group {}", m.control.barrier_group);
        }
        if !m.control.node.is_empty() {
            s += &format!(" {} node(s)", m.control.node.len());
        }
    } else {
        s += &format!(" app {} customer {}", m.app_id, m.customer_id);
        if m.simple_app {
            s += " simple";
        }
        if m.push {
            s += " push";
        }
        if m.pull {
            s += " pull";
        }
        s += &format!(" head {}", m.head);
    }
    s += if m.request { " request" } else { " response" };
    if m.timestamp != K_EMPTY {
        s += &format!(" ts {}", m.timestamp);
    }
    if !msg.data.is_empty() {
        s += &format!(
            " data {:?}",
            msg.data.iter().map(Bytes::len).collect::<Vec<_>>()
        );
    }
    s
}

/// What the receive thread keeps between messages.
struct Receiving {
    /// Peers' shared-memory segments mapped.
    shm: shm::Receiver,
    /// Senders of rejected descriptors already warned about.
    shm_rejections: LogOnce<NodeId>,
}

/// Ends every wait if the receive thread ends without being asked to.
struct ReceiveThreadGuard<'a>(&'a Shared);

impl Drop for ReceiveThreadGuard<'_> {
    fn drop(&mut self) {
        if self.0.stopping.load(Ordering::SeqCst) {
            return;
        }
        let reason = if std::thread::panicking() {
            "it panicked".to_string()
        } else {
            "it stopped unexpectedly".to_string()
        };
        let failure = Failure::ReceiveThreadDied { reason };
        let _ = self
            .0
            .with_core(|core, now| core.fail(failure.clone(), now));
    }
}

impl Shared {
    /// Runs `f` on the core under its lock, then carries out the core's
    /// outputs: connections while still holding the lock (so a message
    /// prepared for a new peer finds its socket), waiters woken while
    /// holding it (no lost wake-ups), the rest after releasing it (sends
    /// may block on a slow peer; deliveries run app code).
    fn with_core<T>(&self, f: impl FnOnce(&mut Core, Instant) -> T) -> Result<T, VanError> {
        let mut wake = false;
        let (value, outputs) = {
            let mut locked = lock(&self.locked);
            let now = Instant::now();
            let value = f(&mut locked.core, now);
            let outputs = locked.core.take_output();
            for out in &outputs {
                if let Output::Connect { node, identity } = out {
                    if let Err(e) = self.connect(node, *identity) {
                        error!("cannot connect to {node}: {e}");
                    }
                }
            }
            if locked.core.take_changed() {
                self.changed.notify_all();
            }
            // A new deadline earlier than the receive thread's sleep: wake it.
            if let Some(next) = locked.core.poll_timeout() {
                if locked.sleeping_until.is_none_or(|s| next < s) {
                    locked.sleeping_until = Some(next);
                    wake = true;
                }
            }
            (value, outputs)
        };
        if wake
            && !std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("pslite-van"))
        {
            self.wake();
        }
        self.carry_out(outputs);
        Ok(value)
    }

    /// Carries out the outputs that need no lock.
    fn carry_out(&self, outputs: Vec<Output>) {
        for out in outputs {
            match out {
                Output::Connect { .. } => {}
                Output::Send(msg) => {
                    if let Err(e) = self.transmit(&msg) {
                        debug!("cannot send {}: {e}", describe(&msg));
                    }
                }
                Output::Deliver(msg) => self.dispatch.deliver(msg),
                Output::Answer { to, msg } => {
                    if let Err(e) = self.answer(&to, &msg) {
                        warn!("cannot answer the admin client at {}: {e}", to.address());
                    }
                }
                Output::Undeliverable(msg, failure) => self.dispatch.undeliverable(msg, failure),
                Output::PeerDead(id, failure) => self.dispatch.peer_dead(id, &failure),
                Output::RoundBegan { round, workers } => self.dispatch.membership(round, &workers),
                Output::StoreEvent { watchers, event } => {
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
                        let _ = self.with_core(|core, now| core.store_watcher_gone(watcher, now));
                    }
                }
                Output::Failed(failure) => {
                    if failure != Failure::Stopped {
                        error!("{failure}");
                    }
                    self.dispatch.failed(&failure);
                }
                Output::Waiting { waited, limit } => {
                    let scheduler = format!(
                        "{}:{}",
                        self.config.scheduler_host, self.config.scheduler_port
                    );
                    let what = if self.config.role == pslite_proto::Role::Scheduler {
                        "waiting for the servers and workers to register".to_string()
                    } else {
                        format!("waiting for the scheduler at {scheduler}")
                    };
                    if waited.is_zero() {
                        info!("{what} (up to {} s, PS_START_TIMEOUT)", limit.as_secs());
                    } else {
                        warn!(
                            "{what}: {} s of {} (PS_START_TIMEOUT)",
                            waited.as_secs(),
                            limit.as_secs()
                        );
                    }
                }
            }
        }
    }

    /// Wakes the receive thread (it re-reads the core's next deadline).
    fn wake(&self) {
        // Never block: the loop may have seen `stopping` and gone.
        let _ = lock(&self.waker).send(&b"wake"[..], zmq::DONTWAIT);
    }

    /// Opens (or replaces) the DEALER to `node`, identified as `ps<identity>`
    /// (anonymous for [`K_EMPTY`]).
    fn connect(&self, node: &Node, identity: NodeId) -> Result<(), VanError> {
        let endpoint = self.peer_endpoint(node);
        let socket = self.open_dealer(identity, &endpoint)?;
        // ZeroMQ connects in the background: "connected" is logged when the
        // first message from the node arrives.
        debug!("connecting to node {} at {endpoint}", node.id);
        if let Some(side) = &self.shm {
            let mut peers = lock(&side.peers);
            if shm_peer(side, node).is_some() {
                if node.pid != std::process::id() {
                    info!(
                        "node {} (process {}) shares this host: large frames go through shared \
                         memory",
                        node.id, node.pid
                    );
                }
                peers.insert(node.id, node.pid);
            } else {
                peers.remove(&node.id);
            }
        }
        lock(&self.senders).insert(node.id, Arc::new(Mutex::new(socket)));
        Ok(())
    }

    /// Where to reach `node`: its abstract Unix socket when it is a pslite
    /// node of this host that listens on one (`PS_IPC`), else the address
    /// it advertises (C++ nodes and other hosts: always).
    fn peer_endpoint(&self, node: &Node) -> String {
        if let Some(host) = &self.ipc_host {
            if node.pslite && node.pid != 0 && node.host == *host {
                let local = transport::local_endpoint(host, node.pid, node.port);
                if transport::local_listening(&local) {
                    return local;
                }
            }
        }
        self.config
            .transport
            .connect_endpoint(&node.hostname, node.port)
    }

    /// A DEALER connected to `endpoint` as `ps<identity>` (anonymous for
    /// [`K_EMPTY`]), with this node's linger, high-water mark and token.
    fn open_dealer(&self, identity: NodeId, endpoint: &str) -> Result<zmq::Socket, VanError> {
        let socket = self
            .ctx
            .socket(zmq::DEALER)
            .map_err(zmq_err("creating a DEALER"))?;
        if identity != K_EMPTY {
            socket
                .set_identity(transport::identity(identity).as_bytes())
                .map_err(zmq_err("setting the identity"))?;
        }
        socket
            .set_linger(LINGER_MS)
            .map_err(zmq_err("setting LINGER"))?;
        // A SYN lost to a full listen queue is otherwise retried by TCP after
        // 1 s (then 3 s, 7 s ...): give up on the attempt sooner and let
        // ZeroMQ reconnect after its interval.
        socket
            .set_connect_timeout(CONNECT_TIMEOUT_MS)
            .map_err(zmq_err("setting CONNECT_TIMEOUT"))?;
        crate::auth::secure_dealer(&socket, self.config.auth_token.as_ref())?;
        if let Some(hwm) = self.config.water_mark {
            socket
                .set_sndhwm(hwm)
                .map_err(zmq_err("setting the send high-water mark"))?;
        }
        if endpoint.starts_with("tcp://[") {
            socket
                .set_ipv6(true)
                .map_err(zmq_err("enabling IPv6 on a DEALER"))?;
        }
        socket
            .connect(endpoint)
            .map_err(zmq_err(format!("connecting to {endpoint}")))?;
        Ok(socket)
    }

    fn send(&self, msg: Message) -> Result<usize, VanError> {
        let msg = self.with_core(|core, now| core.send(msg, now))??;
        let sent = self.transmit(&msg);
        if sent.is_err() {
            let _ = self.with_core(|core, _| core.send_failed(&msg));
        }
        sent
    }

    /// Puts a message on the wire, on the connection to `meta.recver`.
    fn transmit(&self, msg: &Message) -> Result<usize, VanError> {
        let recver = msg.meta.recver;
        let sender = lock(&self.senders)
            .get(&recver)
            .cloned()
            .ok_or(VanError::UnknownPeer(recver))?;
        let staged = self.stage(recver, &msg.data);
        let (meta, data) = match &staged {
            Some(st) => (msg.meta.encode_with_shm(&st.frames), &st.data[..]),
            None => (msg.meta.encode(), &msg.data[..]),
        };
        let sent = {
            let mut socket = lock(&sender);
            transport::send_message(&mut socket, &meta, data)
        };
        let sent = match (sent, staged) {
            (Ok(sent), None) => sent,
            (Ok(sent), Some(st)) => sent + st.bytes,
            (Err(e), staged) => {
                // Descriptors that did not leave give their segments back;
                // one that did is taken back when never claimed.
                if let Some(st) = staged {
                    st.abandon();
                }
                return Err(zmq_err(format!("sending to node {recver}"))(e));
            }
        };
        self.counters.sent(recver, sent);
        trace!("send {}", describe(msg));
        Ok(sent)
    }

    /// Moves the large frames of a message to `recver` into shared memory
    /// when it is a same-host peer; `None` sends the frames as they are.
    fn stage(&self, recver: NodeId, data: &[Bytes]) -> Option<shm::Staged> {
        let side = self.shm.as_ref()?;
        if !data.iter().any(|f| f.len() >= shm::MIN_FRAME) {
            return None;
        }
        let pid = *lock(&side.peers).get(&recver)?;
        side.pool.stage(data, pid)
    }

    /// Sends `msg` to an admin client at `to` (not a cluster member) on the
    /// DEALER kept for it (the [`ADMIN_DEALERS`] most recent clients keep
    /// theirs, so a watcher's events arrive in order on one connection).
    /// Admin clients listen on TCP, whatever the cluster uses.
    fn answer(&self, to: &Node, msg: &Message) -> Result<(), VanError> {
        let endpoint = Transport::Tcp.connect_endpoint(&to.hostname, to.port);
        let mut dealers = lock(&self.admin_dealers);
        let socket = match dealers.iter().position(|(e, _)| *e == endpoint) {
            Some(i) => dealers.remove(i).1,
            None => {
                let socket = self.open_dealer(SCHEDULER, &endpoint)?;
                // A client that is gone must not block the receive thread
                // once its queue is full: its messages are dropped instead.
                socket
                    .set_sndtimeo(0)
                    .map_err(zmq_err("setting the send timeout"))?;
                socket
            }
        };
        if dealers.len() >= ADMIN_DEALERS {
            // The least recently used one lingers and closes.
            dealers.remove(0);
        }
        dealers.push((endpoint.clone(), socket));
        let Some((_, socket)) = dealers.last_mut() else {
            return Ok(());
        };
        transport::send_message(socket, &msg.meta.encode(), &msg.data)
            .map_err(zmq_err(format!("sending to {endpoint}")))?;
        Ok(())
    }

    /// With `PS_AUTH_TOKEN`, fails the node at once if the scheduler refuses
    /// its token (instead of at the start timeout).
    fn watch_auth_refusal(self: &Arc<Self>) -> Result<(), VanError> {
        let Some(dealer) = lock(&self.senders).get(&SCHEDULER).cloned() else {
            return Ok(());
        };
        let endpoint = self
            .config
            .transport
            .connect_endpoint(&self.config.scheduler_host, self.config.scheduler_port);
        let weak = Arc::downgrade(self);
        let socket = lock(&dealer);
        crate::auth::watch_refusal(&self.ctx, &socket, &endpoint, move |failure| {
            if let Some(shared) = weak.upgrade() {
                let _ = shared.with_core(|core, now| core.fail(failure, now));
            }
        })
    }

    fn receive_thread(&self, router: zmq::Socket) {
        let _guard = ReceiveThreadGuard(self);
        let mut rx = Receiving {
            shm: shm::Receiver::new(),
            shm_rejections: LogOnce::new(log::Level::Warn),
        };
        self.receive_loop(&router, &mut rx);
        debug!("receive loop stopped");
    }

    /// Receives until stopped: one blocking receive per message, bounded by
    /// the core's next deadline (`ZMQ_RCVTIMEO`), and runs the core's clock
    /// when that deadline passes. A blocking receive costs ZeroMQ one wait;
    /// a poll followed by non-blocking receives costs several syscalls more
    /// per message (each empty look checks the socket's mailbox).
    fn receive_loop(&self, router: &zmq::Socket, rx: &mut Receiving) {
        // The ROUTER's receive timeout as last set (ZeroMQ's default: none).
        let mut timeout_set: i32 = -1;
        loop {
            let next = {
                let mut locked = lock(&self.locked);
                let next = locked.core.poll_timeout();
                locked.sleeping_until = next;
                next
            };
            let timeout_ms = match next {
                None => -1,
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    // Round up: waking before the deadline only loops again.
                    left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
                }
            };
            if timeout_ms != timeout_set {
                if let Err(e) = router.set_rcvtimeo(timeout_ms) {
                    error!("setting the receive timeout failed: {e}");
                    return;
                }
                timeout_set = timeout_ms;
            }
            match transport::recv_message(router) {
                Ok(raw) => {
                    if self.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    self.on_raw(raw, rx);
                }
                Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => {}
                Err(zmq::Error::ETERM) => return,
                Err(e) => {
                    error!("receiving failed: {e}");
                    return;
                }
            }
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            if next.is_some_and(|at| Instant::now() >= at) {
                let _ = self.with_core(|core, now| core.tick(now));
            }
            if rx.shm.mapped() > 0 {
                rx.shm.prune(Instant::now());
            }
        }
    }

    /// One message from the ROUTER: decoded and handed to the core.
    fn on_raw(&self, mut raw: RawMessage, rx: &mut Receiving) {
        if raw.identity == WAKE_IDENTITY {
            return;
        }
        let size = raw.size();
        let Some(meta_frame) = raw.meta.take() else {
            self.counters.received(raw.sender, size);
            self.counters.dropped(DropReason::Malformed);
            warn!(
                "dropping a message without a meta frame from {}",
                peer_name(&raw.identity)
            );
            return;
        };
        let (mut meta, descs) = match Meta::decode_with_shm(&meta_frame) {
            Ok(decoded) => decoded,
            Err(e) => {
                self.counters.received(raw.sender, size);
                self.counters.dropped(DropReason::Malformed);
                warn!("dropping a message from {}: {e}", peer_name(&raw.identity));
                return;
            }
        };
        let mut shm_bytes = 0;
        if !descs.is_empty() {
            match self.resolve_shm(raw.sender, &descs, &mut raw.data, &mut rx.shm) {
                Ok(bytes) => shm_bytes = bytes,
                Err(e) => {
                    self.counters.received(raw.sender, size);
                    self.counters.dropped(DropReason::Malformed);
                    if let Some(side) = &self.shm {
                        side.pool.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    }
                    let what = format!(
                        "dropping a message from {} with a bad shared-memory descriptor: {e}",
                        peer_name(&raw.identity)
                    );
                    rx.shm_rejections.log(raw.sender, || what);
                    return;
                }
            }
        }
        self.counters.received(raw.sender, size + shm_bytes);
        meta.sender = raw.sender;
        let msg = Message {
            meta,
            data: raw.data,
        };
        trace!("recv {}", describe(&msg));
        let _ = self.with_core(|core, now| core.handle(msg, now));
    }
}

impl Shared {
    /// Replaces the frames a message carries in shared memory by views of
    /// the sender's segments; returns their bytes.
    fn resolve_shm(
        &self,
        sender: NodeId,
        descs: &[pslite_proto::shm::ShmFrame],
        data: &mut [Bytes],
        shm_rx: &mut shm::Receiver,
    ) -> Result<usize, shm::ShmError> {
        let side = self.shm.as_ref().ok_or(shm::ShmError::NotShmPeer)?;
        // The sender's pid from the node table, never from the message.
        let pid = if sender == K_EMPTY {
            None
        } else {
            let locked = lock(&self.locked);
            locked
                .core
                .node(sender)
                .filter(|n| same_host(side, n))
                .map(|n| n.pid)
        };
        let bytes = shm_rx.resolve(sender, pid, descs, data)?;
        side.pool
            .stats
            .frames_received
            .fetch_add(descs.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }
}

/// `node`'s pid if it is a pslite node of this host that uses shared memory
/// and whose segments this process can open.
fn shm_peer(side: &ShmSide, node: &Node) -> Option<u32> {
    (same_host(side, node) && shm::can_reach(node.pid)).then_some(node.pid)
}

/// Whether `node` is a pslite node of this host that uses shared memory.
fn same_host(side: &ShmSide, node: &Node) -> bool {
    node.pslite && node.pid != 0 && !node.host.is_empty() && node.host == side.host
}

fn peer_name(identity: &[u8]) -> String {
    match transport::parse_identity(identity) {
        K_EMPTY => format!("an unknown peer (identity {:02x?})", identity),
        id => format!("node {id}"),
    }
}
