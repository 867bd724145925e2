//! The Van drives the transport: it owns the sockets and the receive thread,
//! runs the node side of the control plane (joining the cluster, barriers,
//! heartbeats) and, on the scheduler, feeds control messages to the
//! [`Scheduler`] state machine and carries out what it answers.
//!
//! Data messages go to the [`Dispatch`] the Van was started with; the ones
//! that arrive before this node has joined the cluster are held back and
//! delivered, in order, as soon as it has.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use log::{debug, error, info, trace, warn};
use pslite_proto::ids::{self, NodeId, SCHEDULER};
use pslite_proto::{Command, Message, Meta, Node, Role, K_EMPTY};

use crate::counters::{Counters, DropReason};
use crate::resender::{Received, Resender};
use crate::scheduler::{Action, Scheduler, SchedulerConfig};
use crate::transport::{self, RawMessage, Transport};
use crate::VanError;

/// Receives the data messages (no control command) that reach this node.
///
/// Called on the Van's receive thread: it must hand the message over
/// (e.g. to a queue) rather than do long work.
pub trait Dispatch: Send + Sync + 'static {
    /// One data message, with `meta.sender` and `meta.recver` filled in.
    fn deliver(&self, msg: Message);

    /// A data message this node sent was never acknowledged, even after
    /// every resend (`PS_RESEND=1`): the request it belongs to has failed.
    fn undeliverable(&self, msg: Message, reason: String) {
        let _ = (msg, reason);
    }

    /// The node cannot go on (e.g. the scheduler is gone): every wait for
    /// remote work should fail with `err`.
    fn failed(&self, err: &VanError) {
        let _ = err;
    }
}

/// What the Van needs to know to join (or, as scheduler, to form) a cluster.
#[derive(Clone, Debug)]
pub struct VanConfig {
    /// This node's role.
    pub role: Role,
    /// Servers in the cluster.
    pub num_servers: i32,
    /// Workers in the cluster.
    pub num_workers: i32,
    /// The scheduler's host (`DMLC_PS_ROOT_URI`).
    pub scheduler_host: String,
    /// The scheduler's port (`DMLC_PS_ROOT_PORT`).
    pub scheduler_port: i32,
    /// The host this node advertises to the others (`DMLC_NODE_HOST`);
    /// the scheduler advertises `scheduler_host`.
    pub host: String,
    /// Where to bind the ROUTER; `None` binds the advertised host's address.
    pub bind_host: Option<String>,
    /// The ROUTER's port (`PORT`); `None` picks a free one. The scheduler
    /// always uses `scheduler_port`.
    pub port: Option<i32>,
    /// TCP, or IPC under `/tmp` (`DMLC_LOCAL=1`).
    pub transport: Transport,
    /// Send high-water mark of each DEALER (`DMLC_PS_WATER_MARK`).
    pub water_mark: Option<i32>,
    /// How long joining the cluster may take (`PS_START_TIMEOUT`).
    pub start_timeout: Duration,
    /// How often to send heartbeats (`PS_HEARTBEAT_INTERVAL`).
    pub heartbeat_interval: Option<Duration>,
    /// When a silent node counts as dead (`PS_HEARTBEAT_TIMEOUT`); a node
    /// that hears nothing from the scheduler for this long fails.
    pub heartbeat_timeout: Option<Duration>,
    /// Acknowledge messages and resend unacknowledged ones after this long
    /// (`PS_RESEND=1`, `PS_RESEND_TIMEOUT`); `None` is off.
    pub resend_timeout: Option<Duration>,
    /// Resends before a message is given up on.
    pub max_resends: u32,
    /// Percentage of received messages to drop once joined (`PS_DROP_MSG`).
    pub drop_percent: u32,
    /// The cluster's shared secret (`PS_AUTH_TOKEN`); `None` keeps ps-lite's
    /// unauthenticated wire (see [`crate::auth`]).
    pub auth_token: Option<crate::AuthToken>,
}

impl VanConfig {
    /// A loopback TCP config with defaults, for tests and examples.
    pub fn local(role: Role, num_servers: i32, num_workers: i32, scheduler_port: i32) -> Self {
        VanConfig {
            role,
            num_servers,
            num_workers,
            scheduler_host: "127.0.0.1".into(),
            scheduler_port,
            host: "127.0.0.1".into(),
            bind_host: None,
            port: None,
            transport: Transport::Tcp,
            water_mark: None,
            start_timeout: Duration::from_secs(300),
            heartbeat_interval: None,
            heartbeat_timeout: None,
            resend_timeout: None,
            max_resends: 10,
            drop_percent: 0,
            auth_token: None,
        }
    }
}

/// How long DEALERs keep unsent messages when closed.
const LINGER_MS: i32 = 1000;

/// A node's transport and control plane. Dropping it stops it.
pub struct Van {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct BarrierWaiter {
    token: u64,
    group: i32,
    released: bool,
}

#[derive(Default)]
struct State {
    ready: bool,
    failure: Option<VanError>,
    stopped: bool,
    barriers: Vec<BarrierWaiter>,
}

type Sender = Arc<Mutex<zmq::Socket>>;

struct Shared {
    config: VanConfig,
    /// DEALERs by peer id; dropped before `ctx`.
    senders: Mutex<HashMap<NodeId, Sender>>,
    my_node: RwLock<Node>,
    /// Every node this one knows of (the scheduler's table), by id.
    table: RwLock<Vec<Node>>,
    state: Mutex<State>,
    changed: Condvar,
    timestamp: AtomicI32,
    barrier_token: AtomicU64,
    stopping: AtomicBool,
    scheduler: Option<Mutex<Scheduler>>,
    resender: Option<Mutex<Resender>>,
    /// How often clock-driven work runs (heartbeats, resends, dead-node
    /// checks); `None` when nothing is on a clock.
    tick: Option<Duration>,
    dispatch: Arc<dyn Dispatch>,
    counters: Arc<Counters>,
    wake_endpoint: String,
    last_scheduler_contact: Mutex<Instant>,
    ctx: zmq::Context,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        let is_scheduler = config.role == Role::Scheduler;
        let hostname = if is_scheduler {
            config.scheduler_host.clone()
        } else {
            config.host.clone()
        };
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
        let wanted_port = if is_scheduler {
            Some(config.scheduler_port)
        } else {
            config.port
        };
        let port = bind_router(&router, &config, &hostname, wanted_port.filter(|&p| p != 0))?;
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

        let mut me = Node::new(config.role, hostname, port);
        let scheduler = is_scheduler.then(|| {
            me.id = SCHEDULER;
            Mutex::new(Scheduler::new(SchedulerConfig {
                num_servers: config.num_servers,
                num_workers: config.num_workers,
                me: me.clone(),
                heartbeat_timeout: config.heartbeat_timeout,
            }))
        });
        // Wake up between messages when something is on a clock.
        let mut tick: i32 = -1;
        if config.heartbeat_interval.is_some() || config.heartbeat_timeout.is_some() {
            tick = 50;
        }
        if let Some(t) = config.resend_timeout {
            tick = (t.as_millis() as i32 / 4).clamp(1, 50);
        }
        router
            .set_rcvtimeo(tick)
            .map_err(zmq_err("setting the receive timeout"))?;
        info!("{} listening on {}", me.role, me.address());
        let resender = config
            .resend_timeout
            .map(|t| Mutex::new(Resender::new(t, config.max_resends)));

        let shared = Arc::new(Shared {
            config,
            senders: Mutex::new(HashMap::new()),
            my_node: RwLock::new(me.clone()),
            table: RwLock::new(Vec::new()),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            timestamp: AtomicI32::new(0),
            barrier_token: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            scheduler,
            resender,
            tick: (tick > 0).then(|| Duration::from_millis(tick as u64)),
            dispatch,
            counters,
            wake_endpoint,
            last_scheduler_contact: Mutex::new(Instant::now()),
            ctx,
        });
        let mut scheduler_node = Node::new(
            Role::Scheduler,
            shared.config.scheduler_host.clone(),
            shared.config.scheduler_port,
        );
        scheduler_node.id = SCHEDULER;
        // The scheduler talks to itself through its own ROUTER; a node makes
        // first contact with an empty identity (it has no id yet).
        shared.connect(&scheduler_node)?;
        if shared.config.auth_token.is_some() && !is_scheduler {
            let weak = Arc::downgrade(&shared);
            let dealer = shared.sender(SCHEDULER)?;
            let endpoint = (shared.config.transport)
                .connect_endpoint(&scheduler_node.hostname, scheduler_node.port);
            crate::auth::watch_refusal(&shared.ctx, &lock(&dealer), &endpoint, move |e| {
                if let Some(shared) = weak.upgrade() {
                    shared.fail(e);
                }
            })?;
        }
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("pslite-van-{}", me.role))
            .spawn(move || thread_shared.receive_loop(router))
            .map_err(|e| VanError::Failed(format!("cannot start the receive thread: {e}")))?;
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
        if lock(&shared.state).ready {
            return Ok(());
        }
        if shared.scheduler.is_none() {
            let mut me = shared.my_node();
            me.customer_id = customer_id;
            me.id = K_EMPTY;
            let mut msg = Message::control(Command::AddNode, SCHEDULER);
            msg.meta.control.node.push(me);
            msg.meta.timestamp = shared.next_timestamp();
            shared.send(msg)?;
        }
        let deadline = Instant::now() + shared.config.start_timeout;
        let mut state = lock(&shared.state);
        loop {
            if state.ready {
                return Ok(());
            }
            if let Some(err) = &state.failure {
                return Err(err.clone());
            }
            if state.stopped {
                return Err(VanError::Stopped);
            }
            let now = Instant::now();
            if now >= deadline {
                drop(state);
                return Err(VanError::StartTimeout(shared.start_timeout_message()));
            }
            state = shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends a message to `msg.meta.recver`; returns the bytes sent.
    pub fn send(&self, msg: Message) -> Result<usize, VanError> {
        self.shared.send(msg)
    }

    /// Waits until every member of `group` (a sum of 1 scheduler, 2 servers,
    /// 4 workers) has called `barrier` for it; `timeout` bounds the wait.
    pub fn barrier(
        &self,
        customer_id: i32,
        group: i32,
        timeout: Option<Duration>,
    ) -> Result<(), VanError> {
        let shared = &self.shared;
        let role = shared.config.role;
        if !ids::is_role_group(group) || group & ids::role_group(role) == 0 {
            return Err(VanError::InvalidGroup(group));
        }
        let token = shared.barrier_token.fetch_add(1, Ordering::Relaxed);
        {
            let mut state = lock(&shared.state);
            if !state.ready {
                return Err(VanError::NotReady);
            }
            state.barriers.push(BarrierWaiter {
                token,
                group,
                released: false,
            });
        }
        let mut msg = Message::control(Command::Barrier, SCHEDULER);
        msg.meta.request = true;
        msg.meta.app_id = 0;
        msg.meta.customer_id = customer_id;
        msg.meta.control.barrier_group = group;
        msg.meta.timestamp = shared.next_timestamp();
        if let Err(e) = shared.send(msg) {
            lock(&shared.state).barriers.retain(|w| w.token != token);
            return Err(e);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = lock(&shared.state);
        let result = loop {
            let waiter = state.barriers.iter().find(|w| w.token == token);
            if waiter.is_some_and(|w| w.released) {
                break Ok(());
            }
            if let Some(err) = &state.failure {
                break Err(err.clone());
            }
            if state.stopped {
                break Err(VanError::Stopped);
            }
            state = match deadline {
                None => shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        break Err(VanError::BarrierTimeout {
                            group,
                            secs: timeout.unwrap_or_default().as_secs(),
                        });
                    }
                    shared
                        .changed
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        };
        state.barriers.retain(|w| w.token != token);
        result
    }

    /// This node's counters (traffic per peer, resends, drops, and what the
    /// apps count: requests in flight, handler time).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.shared.counters
    }

    /// This node as the cluster knows it (its id once joined).
    pub fn my_node(&self) -> Node {
        self.shared.my_node()
    }

    /// The node table: every server and worker entry and the scheduler.
    pub fn nodes(&self) -> Vec<Node> {
        self.shared
            .table
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether this node has joined the cluster.
    pub fn is_ready(&self) -> bool {
        lock(&self.shared.state).ready
    }

    /// A fresh timestamp for a control message.
    pub fn next_timestamp(&self) -> i32 {
        self.shared.next_timestamp()
    }

    /// Ids of nodes silent for longer than `timeout` (ps-lite's
    /// `GetDeadNodes`): on the scheduler, servers and workers; elsewhere, the
    /// scheduler. Heartbeats (`PS_HEARTBEAT_INTERVAL`) keep live nodes heard.
    pub fn dead_nodes(&self, timeout: Duration) -> Vec<NodeId> {
        let now = Instant::now();
        if let Some(scheduler) = &self.shared.scheduler {
            return lock(scheduler).silent_nodes(now, timeout);
        }
        let silent = now.saturating_duration_since(*lock(&self.shared.last_scheduler_contact));
        if silent > timeout {
            vec![SCHEDULER]
        } else {
            Vec::new()
        }
    }

    /// Stops the receive thread and closes every socket. Waits in
    /// `register` or `barrier` fail with [`VanError::Stopped`].
    pub fn stop(&self) {
        let Some(thread) = lock(&self.thread).take() else {
            return;
        };
        let shared = &self.shared;
        shared.flush_resends();
        shared.stopping.store(true, Ordering::SeqCst);
        // Wake the receive thread through the in-process endpoint.
        if let Ok(waker) = shared.ctx.socket(zmq::DEALER) {
            let _ = waker.set_linger(0);
            if waker.connect(&shared.wake_endpoint).is_ok() {
                // Never block: the loop may have seen `stopping` and gone.
                let _ = waker.send(&b"stop"[..], zmq::DONTWAIT);
            }
        }
        if thread.join().is_err() {
            error!("the receive thread panicked");
        }
        lock(&shared.senders).clear();
        let mut state = lock(&shared.state);
        state.stopped = true;
        shared.changed.notify_all();
    }
}

impl Drop for Van {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds the ROUTER and returns the port it listens on.
fn bind_router(
    router: &zmq::Socket,
    config: &VanConfig,
    hostname: &str,
    port: Option<i32>,
) -> Result<i32, VanError> {
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
        return Err(VanError::Failed(
            "cannot find a free ipc:///tmp/<port> endpoint; set PORT".into(),
        ));
    }
    let bind_host = config.bind_host.as_deref().unwrap_or(hostname);
    let ip = transport::resolve_bind_ip(bind_host).ok_or_else(|| VanError::Resolve {
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
                .ok_or_else(|| VanError::Failed(format!("cannot read the port of {bound:?}")))
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

impl Shared {
    fn my_node(&self) -> Node {
        self.my_node
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Before stopping, gives unacknowledged messages (the scheduler's last
    /// barrier release, say) time to be resent and acknowledged: up to 15
    /// resend timeouts (four tries), at most 30 s.
    fn flush_resends(&self) {
        let (Some(r), Some(timeout)) = (&self.resender, self.config.resend_timeout) else {
            return;
        };
        let deadline = Instant::now() + (timeout * 15).min(Duration::from_secs(30));
        let mut state = lock(&self.state);
        while state.failure.is_none() {
            let left = lock(r).unacknowledged();
            if left == 0 {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                debug!("stopping with {left} messages unacknowledged");
                return;
            }
            state = self
                .changed
                .wait_timeout(state, (deadline - now).min(Duration::from_millis(20)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn my_id(&self) -> NodeId {
        self.my_node.read().unwrap_or_else(|e| e.into_inner()).id
    }

    fn next_timestamp(&self) -> i32 {
        self.timestamp.fetch_add(1, Ordering::Relaxed)
    }

    /// Opens (or replaces) the DEALER to `node`, identified as `ps<my id>`
    /// (or anonymous before this node has an id).
    fn connect(&self, node: &Node) -> Result<(), VanError> {
        let my_id = self.my_id();
        let socket = self
            .ctx
            .socket(zmq::DEALER)
            .map_err(zmq_err("creating a DEALER"))?;
        if my_id != K_EMPTY {
            socket
                .set_identity(transport::identity(my_id).as_bytes())
                .map_err(zmq_err("setting the identity"))?;
        }
        socket
            .set_linger(LINGER_MS)
            .map_err(zmq_err("setting LINGER"))?;
        crate::auth::secure_dealer(&socket, self.config.auth_token.as_ref())?;
        if let Some(hwm) = self.config.water_mark {
            socket
                .set_sndhwm(hwm)
                .map_err(zmq_err("setting the send high-water mark"))?;
        }
        let endpoint = self
            .config
            .transport
            .connect_endpoint(&node.hostname, node.port);
        if endpoint.starts_with("tcp://[") {
            socket
                .set_ipv6(true)
                .map_err(zmq_err("enabling IPv6 on a DEALER"))?;
        }
        socket
            .connect(&endpoint)
            .map_err(zmq_err(format!("connecting to {endpoint}")))?;
        debug!("connected to node {} at {endpoint}", node.id);
        lock(&self.senders).insert(node.id, Arc::new(Mutex::new(socket)));
        Ok(())
    }

    /// The DEALER to `id`, connecting on first use to a node of the table
    /// (servers do not connect to servers, nor workers to workers, until
    /// they need to).
    fn sender(&self, id: NodeId) -> Result<Sender, VanError> {
        if let Some(sender) = lock(&self.senders).get(&id) {
            return Ok(Arc::clone(sender));
        }
        if !lock(&self.state).ready {
            return Err(VanError::NotReady);
        }
        let node = self
            .table
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|n| n.id == id)
            .cloned()
            .ok_or(VanError::UnknownPeer(id))?;
        self.connect(&node)?;
        lock(&self.senders)
            .get(&id)
            .cloned()
            .ok_or(VanError::UnknownPeer(id))
    }

    fn send(&self, mut msg: Message) -> Result<usize, VanError> {
        if let Some(err) = &lock(&self.state).failure {
            return Err(err.clone());
        }
        let recver = msg.meta.recver;
        let sender = self.sender(recver)?;
        msg.meta.sender = self.my_id();
        // Remember it before it leaves: the ACK may beat us back.
        if let Some(r) = &self.resender {
            lock(r).on_send(&msg, Instant::now());
        }
        let sent = self.transmit(&sender, &msg);
        if sent.is_err() {
            if let Some(r) = &self.resender {
                lock(r).forget(&msg);
            }
        }
        sent
    }

    /// Sends `msg` to an admin client at `to` (not a cluster member) on a
    /// DEALER of its own, closed at once (it lingers until the message is out).
    fn answer(&self, to: &Node, mut msg: Message) -> Result<(), VanError> {
        let socket = self
            .ctx
            .socket(zmq::DEALER)
            .map_err(zmq_err("creating a DEALER"))?;
        socket
            .set_identity(transport::identity(self.my_id()).as_bytes())
            .map_err(zmq_err("setting the identity"))?;
        socket
            .set_linger(LINGER_MS)
            .map_err(zmq_err("setting LINGER"))?;
        // Admin clients listen on TCP, whatever the cluster uses.
        let endpoint = Transport::Tcp.connect_endpoint(&to.hostname, to.port);
        socket
            .connect(&endpoint)
            .map_err(zmq_err(format!("connecting to {endpoint}")))?;
        msg.meta.sender = self.my_id();
        let mut socket = socket;
        transport::send_message(&mut socket, &msg.meta.encode(), &msg.data)
            .map_err(zmq_err(format!("sending to {endpoint}")))?;
        Ok(())
    }

    /// Puts a message on the wire (no resender bookkeeping).
    fn transmit(&self, sender: &Sender, msg: &Message) -> Result<usize, VanError> {
        let meta = msg.meta.encode();
        let sent = {
            let mut socket = lock(sender);
            transport::send_message(&mut socket, &meta, &msg.data)
                .map_err(zmq_err(format!("sending to node {}", msg.meta.recver)))?
        };
        self.counters.sent(msg.meta.recver, sent);
        trace!("send {}", describe(msg));
        Ok(sent)
    }

    fn start_timeout_message(&self) -> String {
        let secs = self.config.start_timeout.as_secs();
        match &self.scheduler {
            Some(scheduler) => {
                let missing = lock(scheduler).missing();
                format!(
                    "the cluster did not form within {secs} s (PS_START_TIMEOUT): {} of {} \
                     servers and {} of {} workers never registered with the scheduler",
                    missing.servers,
                    self.config.num_servers,
                    missing.workers,
                    self.config.num_workers
                )
            }
            None => format!(
                "no node table from the scheduler at {}:{} within {secs} s (PS_START_TIMEOUT): \
                 either it is unreachable (check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT), or \
                 it cannot reach this node at the address it advertises, {} (check \
                 DMLC_NODE_HOST, DMLC_INTERFACE and firewalls), or some of the {} servers \
                 and {} workers never started",
                self.config.scheduler_host,
                self.config.scheduler_port,
                self.my_node().address(),
                self.config.num_servers,
                self.config.num_workers
            ),
        }
    }

    fn receive_loop(&self, router: zmq::Socket) {
        let mut held_back = Vec::new();
        let mut next_heartbeat = Instant::now();
        let mut next_tick = Instant::now();
        loop {
            match transport::recv_message(&router) {
                Ok(raw) => {
                    if self.stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    self.process(raw, &mut held_back);
                }
                Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => {}
                Err(zmq::Error::ETERM) => break,
                Err(e) => {
                    error!("receiving failed: {e}");
                    if self.stopping.load(Ordering::SeqCst) {
                        break;
                    }
                }
            }
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            // Clock-driven work runs once per tick period, not after every
            // message (it takes locks and walks the resender's queues).
            if let Some(period) = self.tick {
                let now = Instant::now();
                if now >= next_tick {
                    next_tick = now + period;
                    self.tick(&mut next_heartbeat);
                }
            }
        }
        debug!("receive loop stopped");
    }

    /// Periodic work between messages: heartbeats, watching the scheduler,
    /// resends, and the scheduler's own clock.
    fn tick(&self, next_heartbeat: &mut Instant) {
        let now = Instant::now();
        let ready = lock(&self.state).ready;
        if let Some(scheduler) = &self.scheduler {
            let actions = lock(scheduler).tick(now);
            self.apply(actions);
        } else if ready {
            if let Some(interval) = self.config.heartbeat_interval {
                if now >= *next_heartbeat {
                    *next_heartbeat = now + interval;
                    let mut msg = Message::control(Command::Heartbeat, SCHEDULER);
                    msg.meta.control.node.push(self.my_node());
                    msg.meta.counters = Some(self.counters.snapshot());
                    msg.meta.timestamp = self.next_timestamp();
                    if let Err(e) = self.send(msg) {
                        debug!("cannot send a heartbeat: {e}");
                    }
                }
            }
            if let Some(timeout) = self.config.heartbeat_timeout {
                let silent = now.saturating_duration_since(*lock(&self.last_scheduler_contact));
                if silent > timeout && lock(&self.state).failure.is_none() {
                    self.fail(VanError::Failed(format!(
                        "lost the scheduler at {}:{}: nothing heard from it for {:.1} s \
                         (PS_HEARTBEAT_TIMEOUT is {} s)",
                        self.config.scheduler_host,
                        self.config.scheduler_port,
                        silent.as_secs_f64(),
                        timeout.as_secs()
                    )));
                }
            }
        }
        let Some(r) = &self.resender else {
            return;
        };
        let due = lock(r).tick(now);
        for msg in due.resend {
            debug!("resending {}", describe(&msg));
            self.counters.resent();
            match self.sender(msg.meta.recver) {
                Ok(sender) => {
                    if let Err(e) = self.transmit(&sender, &msg) {
                        debug!("resend failed: {e}");
                    }
                }
                Err(e) => debug!("resend failed: {e}"),
            }
        }
        for msg in due.failed {
            let reason = format!(
                "node {} did not acknowledge {} after {} resends",
                msg.meta.recver,
                describe(&msg),
                self.config.max_resends
            );
            warn!("{reason}");
            if msg.is_control() {
                if msg.meta.recver == SCHEDULER && self.scheduler.is_none() {
                    self.fail(VanError::Failed(format!("lost the scheduler: {reason}")));
                }
            } else {
                self.dispatch.undeliverable(msg, reason);
            }
        }
    }

    fn process(&self, raw: RawMessage, held_back: &mut Vec<Message>) {
        self.process_one(raw, held_back);
        if !held_back.is_empty() && lock(&self.state).ready {
            for held in held_back.drain(..) {
                self.deliver_from_member(held);
            }
        }
    }

    fn process_one(&self, raw: RawMessage, held_back: &mut Vec<Message>) {
        self.counters.received(raw.sender, raw.size());
        let Some(meta_frame) = raw.meta else {
            self.counters.dropped(DropReason::Malformed);
            warn!(
                "dropping a message without a meta frame from {}",
                peer_name(&raw.identity)
            );
            return;
        };
        let mut meta = match Meta::decode(&meta_frame) {
            Ok(meta) => meta,
            Err(e) => {
                self.counters.dropped(DropReason::Malformed);
                warn!("dropping a message from {}: {e}", peer_name(&raw.identity));
                return;
            }
        };
        meta.sender = raw.sender;
        meta.recver = self.my_id();
        let msg = Message {
            meta,
            data: raw.data,
        };
        trace!("recv {}", describe(&msg));
        if msg.meta.sender == SCHEDULER {
            *lock(&self.last_scheduler_contact) = Instant::now();
        }
        if self.config.drop_percent > 0
            && msg.meta.control.cmd != Command::Terminate
            && lock(&self.state).ready
            && rand::random_range(0..100) < self.config.drop_percent
        {
            self.counters.dropped(DropReason::Injected);
            debug!("dropping {} (PS_DROP_MSG)", describe(&msg));
            return;
        }
        if let Some(r) = &self.resender {
            let (received, ack) = lock(r).on_receive(&msg, Instant::now());
            if let Some(ack) = ack {
                if let Err(e) = self.send(ack) {
                    debug!("cannot acknowledge node {}: {e}", msg.meta.sender);
                }
            }
            match received {
                Received::Deliver => {}
                Received::Duplicate => {
                    self.counters.dropped(DropReason::Duplicate);
                    debug!("dropping a duplicate {}", describe(&msg));
                    return;
                }
                Received::Ack => {
                    if lock(r).unacknowledged() == 0 {
                        self.changed.notify_all();
                    }
                    return;
                }
            }
        }
        match msg.meta.control.cmd {
            Command::Empty => self.process_data(msg, held_back),
            Command::Terminate => {
                if msg.meta.sender == self.my_id() && msg.meta.sender != K_EMPTY {
                    self.stopping.store(true, Ordering::SeqCst);
                } else {
                    warn!("dropping TERMINATE from node {}", msg.meta.sender);
                }
            }
            Command::AddNode | Command::Heartbeat | Command::Status if self.scheduler.is_some() => {
                self.run_scheduler(&msg)
            }
            Command::Barrier if self.scheduler.is_some() && msg.meta.request => {
                self.run_scheduler(&msg)
            }
            Command::AddNode => self.process_node_table(&msg),
            Command::Barrier => self.process_barrier_release(&msg),
            Command::Heartbeat => {} // the contact time is already recorded
            Command::Ack => debug!("dropping ACK from node {}: resend is off", msg.meta.sender),
            Command::Status => warn!("dropping STATUS: only the scheduler answers it"),
            // (With the resender on, ACKs never get here.)
        }
    }

    fn process_data(&self, msg: Message, held_back: &mut Vec<Message>) {
        if msg.meta.sender == K_EMPTY {
            self.counters.dropped(DropReason::UnknownPeer);
            warn!("dropping a data message from an unknown sender (identity is not ps<id>)");
            return;
        }
        if !msg.meta.data_type.is_empty() && msg.meta.data_type.len() != msg.data.len() {
            warn!(
                "dropping a message from node {}: {} data frames but {} data types",
                msg.meta.sender,
                msg.data.len(),
                msg.meta.data_type.len()
            );
            self.counters.dropped(DropReason::Malformed);
            return;
        }
        if lock(&self.state).ready {
            self.deliver_from_member(msg);
        } else {
            held_back.push(msg);
        }
    }

    /// Delivers a data message if its sender is in the node table: only
    /// cluster members send data (an unknown `ps<id>` is dropped).
    fn deliver_from_member(&self, msg: Message) {
        let sender = msg.meta.sender;
        let member = self
            .table
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|n| n.id == sender);
        if member {
            self.dispatch.deliver(msg);
        } else {
            self.counters.dropped(DropReason::UnknownPeer);
            warn!("dropping a data message from node {sender}, which is not in the node table");
        }
    }

    fn run_scheduler(&self, msg: &Message) {
        let Some(scheduler) = &self.scheduler else {
            return;
        };
        let actions = lock(scheduler).handle(msg, Instant::now());
        self.apply(actions);
    }

    /// Carries out what the scheduler state machine asked for.
    fn apply(&self, actions: Vec<Action>) {
        let Some(scheduler) = &self.scheduler else {
            return;
        };
        if actions.is_empty() {
            return;
        }
        for action in actions {
            match action {
                Action::Connect(node) => {
                    if let Err(e) = self.connect(&node) {
                        error!("cannot connect to {node}: {e}");
                    } else if node.is_recovery {
                        self.peer_replaced(node.id);
                    }
                }
                Action::Send(mut msg) => {
                    msg.meta.timestamp = self.next_timestamp();
                    let recver = msg.meta.recver;
                    if let Err(e) = self.send(msg) {
                        warn!("cannot send to node {recver}: {e}");
                    }
                }
                Action::Answer { to, mut msg } => {
                    // The scheduler's own row gets its own counters.
                    if let Some(row) = msg.meta.status.iter_mut().find(|r| r.node.id == SCHEDULER) {
                        row.counters = Some(self.counters.snapshot());
                        row.counters_age = Some(Duration::ZERO);
                    }
                    if let Err(e) = self.answer(&to, msg) {
                        warn!("cannot answer the admin client at {}: {e}", to.address());
                    }
                }
                Action::Ready => {
                    let mut table = lock(scheduler).nodes().to_vec();
                    table.push(self.my_node());
                    *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
                    info!(
                        "scheduler: cluster formed with {} servers and {} workers",
                        self.config.num_servers, self.config.num_workers
                    );
                    self.set_ready();
                }
            }
        }
        // Keep the table current after recoveries.
        if lock(&self.state).ready {
            let mut table = lock(scheduler).nodes().to_vec();
            table.push(self.my_node());
            *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
        }
    }

    fn set_ready(&self) {
        let mut state = lock(&self.state);
        state.ready = true;
        self.changed.notify_all();
    }

    fn fail(&self, err: VanError) {
        error!("{err}");
        {
            let mut state = lock(&self.state);
            if state.failure.is_some() {
                return;
            }
            state.failure = Some(err.clone());
            self.changed.notify_all();
        }
        self.dispatch.failed(&err);
    }

    /// The scheduler's ADD_NODE: the whole table when joining, or the
    /// entries of recovered nodes afterwards.
    fn process_node_table(&self, msg: &Message) {
        if msg.meta.sender != SCHEDULER {
            warn!(
                "dropping ADD_NODE from node {}: only the scheduler sends node tables",
                msg.meta.sender
            );
            return;
        }
        let nodes = &msg.meta.control.node;
        let ready = lock(&self.state).ready;
        if !ready {
            let me = self.my_node();
            let Some(mine) = nodes.iter().find(|n| n.same_process(&me)).cloned() else {
                self.fail(VanError::Failed(format!(
                    "the scheduler's node table has no entry for this node ({}); check \
                     DMLC_NODE_HOST",
                    me.address()
                )));
                return;
            };
            if ids::role_of_id(mine.id) != Some(me.role) {
                self.fail(VanError::Failed(format!(
                    "the scheduler gave this {} the id {}, which is not a {} id",
                    me.role, mine.id, me.role
                )));
                return;
            }
            {
                let mut my_node = self.my_node.write().unwrap_or_else(|e| e.into_inner());
                my_node.id = mine.id;
                my_node.is_recovery = mine.is_recovery;
            }
            *self.table.write().unwrap_or_else(|e| e.into_inner()) = nodes.clone();
            // Reconnect to the scheduler under our new identity, and connect
            // to ourselves and to every node of the other role.
            let mut connected = std::collections::HashSet::new();
            for node in nodes {
                let wanted = node.id == SCHEDULER || node.id == mine.id || node.role != me.role;
                if wanted && connected.insert(node.id) {
                    if let Err(e) = self.connect(node) {
                        self.fail(e);
                        return;
                    }
                }
            }
            info!(
                "{} joined as node {}{}",
                me.role,
                mine.id,
                if mine.is_recovery { " (recovered)" } else { "" }
            );
            self.set_ready();
            return;
        }
        // Updates: a node was replaced by a restarted one.
        let my_id = self.my_id();
        let recovery = nodes.len() == 1;
        for node in nodes {
            if node.id == my_id || node.id == SCHEDULER {
                continue;
            }
            let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
            let moved = table
                .iter()
                .filter(|n| n.id == node.id)
                .any(|n| !n.same_process(node));
            let known = table.iter().any(|n| n.id == node.id);
            for entry in table.iter_mut().filter(|n| n.id == node.id) {
                entry.hostname = node.hostname.clone();
                entry.port = node.port;
                entry.is_recovery = node.is_recovery;
            }
            if !known {
                table.push(node.clone());
            }
            drop(table);
            let had_socket = lock(&self.senders).contains_key(&node.id);
            if moved || (!known && had_socket) {
                info!("node {} moved to {}: reconnecting", node.id, node.address());
                if let Err(e) = self.connect(node) {
                    warn!("cannot reconnect to {node}: {e}");
                }
            }
            if recovery && node.is_recovery {
                self.peer_replaced(node.id);
            }
        }
    }

    /// Node `id` restarted: the requests it never answered go to the new
    /// process (the old one may have taken them to its grave).
    fn peer_replaced(&self, id: NodeId) {
        let Some(r) = &self.resender else {
            return;
        };
        let again = lock(r).on_peer_replaced(id, Instant::now());
        if again.is_empty() {
            return;
        }
        info!(
            "sending {} unanswered requests again to the new node {id}",
            again.len()
        );
        if let Ok(sender) = self.sender(id) {
            for msg in again {
                self.counters.resent();
                if let Err(e) = self.transmit(&sender, &msg) {
                    debug!("cannot resend to node {id}: {e}");
                }
            }
        }
    }

    fn process_barrier_release(&self, msg: &Message) {
        if msg.meta.sender != SCHEDULER || msg.meta.request {
            warn!(
                "dropping BARRIER from node {}: only the scheduler releases barriers",
                msg.meta.sender
            );
            return;
        }
        let group = msg.meta.control.barrier_group;
        let mut state = lock(&self.state);
        let matching = state
            .barriers
            .iter()
            .any(|w| w.group == group && !w.released);
        if matching {
            for w in state.barriers.iter_mut().filter(|w| w.group == group) {
                w.released = true;
            }
        } else if !ids::is_role_group(group) {
            // A C++ scheduler leaves the group of its replies uninitialised:
            // the release is for whatever barrier we are waiting on.
            for w in state.barriers.iter_mut() {
                w.released = true;
            }
        } else {
            debug!("barrier release for group {group}, which nobody here waits on");
        }
        self.changed.notify_all();
    }
}

fn peer_name(identity: &[u8]) -> String {
    match transport::parse_identity(identity) {
        K_EMPTY => format!("an unknown peer (identity {:02x?})", identity),
        id => format!("node {id}"),
    }
}
