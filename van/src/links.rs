//! This node's connections to its peers: one DEALER per peer, opened the
//! way the core's [`Route`] says, and the messages put on them.
//!
//! A write never blocks the receive thread. Each link keeps the messages
//! that could not be written yet, in order, within a byte budget
//! ([`HoldQueue`], `PS_HOLD_LIMIT`): those sent while the link is being
//! opened, and those the receive thread could not write at once (the peer's
//! high-water mark is reached, or an app thread is writing to it). The
//! receive loop tries them again ([`Links::flush_waiting`]) at its next wake
//! and on a short timer while any wait. An app thread's write
//! ([`Mode::Wait`]) writes what waits first, then its own message, and may
//! block on a slow peer: that is back-pressure to the app, and it never
//! holds the core's lock.
//!
//! Sockets are created outside the core's lock: the core only reserves the
//! link ([`Links::reserve`]) when it asks for a connection, so that a
//! message prepared for the new peer finds it and waits there until the
//! thread that carries out the connection has opened the socket.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

use bytes::Bytes;
use log::{debug, info, trace, warn};
use pslite_proto::{lock, Message, Node, NodeId, K_EMPTY};

use crate::context::{Context, Socket};
use crate::counters::Counters;
use crate::hold::HoldQueue;
use crate::monitor::Monitors;
use crate::shm;
use crate::transport;
use crate::LogOnce;
use crate::Route;
use crate::VanConfig;
use crate::VanError;

/// How long DEALERs keep unsent messages when closed.
const LINGER_MS: i32 = 1000;
/// How long a DEALER waits for its TCP connection to be accepted before
/// ZeroMQ abandons the attempt and retries (after `ZMQ_RECONNECT_IVL`,
/// 100 ms by default). Loopback and LAN connections take well under a
/// millisecond; a longer wait means the SYN was dropped.
const CONNECT_TIMEOUT_MS: i32 = 500;

pub(crate) use crate::transport::zmq_err;

/// Whether a write may wait for the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// An app thread: it may block on a slow peer (back-pressure).
    Wait,
    /// The receive thread: what cannot be written at once waits in the link.
    NoWait,
}

/// A message encoded for the wire (its data frames borrowed until it has
/// to wait).
struct Outgoing<'a> {
    recver: NodeId,
    meta: Vec<u8>,
    data: Cow<'a, [Bytes]>,
    /// Its frames moved into shared memory, given back if it never leaves.
    staged: Option<shm::Staged>,
}

impl Outgoing<'_> {
    fn into_owned(self) -> Outgoing<'static> {
        Outgoing {
            recver: self.recver,
            meta: self.meta,
            data: Cow::Owned(self.data.into_owned()),
            staged: self.staged,
        }
    }
}

/// One peer's connection.
struct Link {
    /// The DEALER; `None` until the thread carrying out the connection has
    /// opened it.
    socket: Mutex<Option<Socket>>,
    /// Messages not written yet, in order.
    waiting: Mutex<HoldQueue<Outgoing<'static>>>,
    /// The peer's process, when large frames go through shared memory (0:
    /// they do not).
    shm_pid: AtomicU32,
}

/// This node's DEALERs, by peer id.
pub(crate) struct Links {
    ctx: Context,
    config: VanConfig,
    links: Mutex<HashMap<NodeId, Arc<Link>>>,
    /// Messages waiting in all links.
    waiting: AtomicUsize,
    counters: Arc<Counters>,
    pool: Option<Arc<shm::Pool>>,
    /// Peers whose messages were dropped for want of room, warned about.
    dropped: Mutex<LogOnce<NodeId>>,
    /// The watch on every DEALER's connection ([`crate::monitor`]).
    monitors: Monitors,
    /// Which peer each watched DEALER reaches, by its watch's tag (only the
    /// current DEALER of each peer).
    tags: Mutex<HashMap<u64, NodeId>>,
}

/// Opens a DEALER connected to `endpoint` as `ps<identity>` or
/// `ps<identity>/<key>` (anonymous for [`K_EMPTY`]), with `config`'s linger,
/// high-water mark and token; `before_connect` runs on it just before it
/// connects (to watch it from its first event).
fn open_dealer(
    ctx: &Context,
    config: &VanConfig,
    identity: NodeId,
    key: Option<u64>,
    endpoint: &str,
    before_connect: impl FnOnce(&zmq::Socket) -> Result<(), VanError>,
) -> Result<Socket, VanError> {
    let socket = ctx
        .socket(zmq::DEALER)
        .map_err(zmq_err("creating a DEALER"))?;
    if identity != K_EMPTY {
        socket
            .set_identity(transport::keyed_identity(identity, key).as_bytes())
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
    crate::auth::secure_dealer(&socket, config.auth_token.as_ref())?;
    if let Some(hwm) = config.water_mark {
        socket
            .set_sndhwm(hwm)
            .map_err(zmq_err("setting the send high-water mark"))?;
    }
    if endpoint.starts_with("tcp://[") {
        socket
            .set_ipv6(true)
            .map_err(zmq_err("enabling IPv6 on a DEALER"))?;
    }
    before_connect(&socket)?;
    socket
        .connect(endpoint)
        .map_err(zmq_err(format!("connecting to {endpoint}")))?;
    Ok(socket)
}

impl Links {
    pub(crate) fn new(
        ctx: Context,
        config: VanConfig,
        counters: Arc<Counters>,
        pool: Option<Arc<shm::Pool>>,
        monitors: Monitors,
    ) -> Links {
        Links {
            ctx,
            config,
            links: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            counters,
            pool,
            dropped: Mutex::new(LogOnce::new(log::Level::Warn)),
            monitors,
            tags: Mutex::new(HashMap::new()),
        }
    }

    /// The most sockets this node's ZeroMQ context holds.
    pub(crate) fn max_sockets(&self) -> u64 {
        self.ctx.max_sockets()
    }

    /// The peer whose current DEALER the watch `tag` is on (`None`: a
    /// DEALER since replaced or closed).
    pub(crate) fn peer_of(&self, tag: u64) -> Option<NodeId> {
        lock(&self.tags).get(&tag).copied()
    }

    /// Closes the connection to `id` (what waits for it is dropped).
    pub(crate) fn remove(&self, id: NodeId) {
        lock(&self.tags).retain(|_, p| *p != id);
        if let Some(old) = lock(&self.links).remove(&id) {
            let lost = lock(&old.waiting).drain();
            self.waiting.fetch_sub(lost.len(), Ordering::Relaxed);
            self.discard(lost);
        }
    }

    /// Makes room for the connection to peer `id` (replacing any), to be
    /// opened by [`Links::open`]: messages to it wait until then. Cheap:
    /// called under the core's lock.
    pub(crate) fn reserve(&self, id: NodeId) {
        let link = Arc::new(Link {
            socket: Mutex::new(None),
            waiting: Mutex::new(HoldQueue::new(self.config.hold_limit)),
            shm_pid: AtomicU32::new(0),
        });
        if let Some(old) = lock(&self.links).insert(id, link) {
            let lost = lock(&old.waiting).drain();
            self.waiting.fetch_sub(lost.len(), Ordering::Relaxed);
            self.discard(lost);
        }
    }

    /// Opens the DEALER to `node` reserved by [`Links::reserve`], as
    /// `ps<identity>` (with `key`, see [`transport::keyed_identity`]), the
    /// way `route` says, watched from before it connects; then writes what
    /// waits for it.
    pub(crate) fn open(
        &self,
        node: &Node,
        identity: NodeId,
        key: Option<u64>,
        route: &Route,
        mode: Mode,
    ) -> Result<(), VanError> {
        let Some(link) = self.link(node.id) else {
            return Ok(()); // stopped meanwhile
        };
        // A same-host peer with PS_IPC=0 binds no abstract socket.
        let endpoint = match &route.local {
            Some(local) if transport::local_listening(local, self.config.auth_token.is_some()) => {
                local
            }
            _ => &route.endpoint,
        };
        let watch = |socket: &zmq::Socket| {
            if !route.watch {
                // Nothing to watch for: no monitor, which would cost two
                // sockets (a node's peers other than its scheduler).
                lock(&self.tags).retain(|_, p| *p != node.id);
                return Ok(());
            }
            let tag = self.monitors.watch(socket, endpoint)?;
            let mut tags = lock(&self.tags);
            tags.retain(|_, p| *p != node.id);
            tags.insert(tag, node.id);
            Ok(())
        };
        let opened = open_dealer(&self.ctx, &self.config, identity, key, endpoint, watch);
        let socket = match opened {
            Ok(socket) => socket,
            Err(e) => {
                // Messages to the peer fail as to an unknown one.
                self.forget(node.id, &link);
                return Err(e);
            }
        };
        // ZeroMQ connects in the background: "connected" is logged when the
        // first message from the node arrives.
        if node.id < 0 {
            debug!("connecting to {endpoint} (a registration's check)");
        } else {
            debug!("connecting to node {} at {endpoint}", node.id);
        }
        let shm_pid = route.shm_pid.filter(|&pid| shm::can_reach(pid));
        if let Some(pid) = shm_pid.filter(|&pid| pid != std::process::id()) {
            info!(
                "node {} (process {pid}) shares this host: large frames go through shared memory",
                node.id
            );
        }
        link.shm_pid.store(shm_pid.unwrap_or(0), Ordering::Relaxed);
        let mut slot = lock(&link.socket);
        *slot = Some(socket);
        if let Some(socket) = slot.as_mut() {
            self.write_waiting(&link, socket, mode);
        }
        Ok(())
    }

    /// Removes `link`, the connection to `id` (unless replaced since).
    fn forget(&self, id: NodeId, link: &Arc<Link>) {
        let mut links = lock(&self.links);
        if links.get(&id).is_some_and(|l| Arc::ptr_eq(l, link)) {
            links.remove(&id);
        }
        drop(links);
        let lost = lock(&link.waiting).drain();
        self.waiting.fetch_sub(lost.len(), Ordering::Relaxed);
        self.discard(lost);
    }

    fn link(&self, id: NodeId) -> Option<Arc<Link>> {
        lock(&self.links).get(&id).cloned()
    }

    /// Puts `msg` on the connection to `meta.recver` (see the module docs
    /// for `mode`); returns the bytes it carries.
    pub(crate) fn send(&self, msg: &Message, mode: Mode) -> Result<usize, VanError> {
        let recver = msg.meta.recver;
        let link = self.link(recver).ok_or(VanError::UnknownPeer(recver))?;
        let shm_pid = link.shm_pid.load(Ordering::Relaxed);
        let staged = match &self.pool {
            Some(pool) if shm_pid != 0 => pool.stage(&msg.data, shm_pid),
            _ => None,
        };
        let out = match staged {
            Some(mut st) => Outgoing {
                recver,
                meta: msg.meta.encode_with_shm(&st.frames),
                data: Cow::Owned(std::mem::take(&mut st.data)),
                staged: Some(st),
            },
            None => Outgoing {
                recver,
                meta: msg.meta.encode(),
                data: Cow::Borrowed(&msg.data),
                staged: None,
            },
        };
        self.write(&link, out, mode)
    }

    /// Writes `out` on `link`: behind what waits there, and into the wait
    /// if it cannot go now without blocking (`NoWait`).
    fn write(&self, link: &Link, out: Outgoing<'_>, mode: Mode) -> Result<usize, VanError> {
        let mut guard = match mode {
            Mode::Wait => lock(&link.socket),
            Mode::NoWait => match link.socket.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return Ok(self.hold(link, out)),
            },
        };
        let Some(socket) = guard.as_mut() else {
            return Ok(self.hold(link, out)); // being opened
        };
        if !self.write_waiting(link, socket, mode) {
            return Ok(self.hold(link, out));
        }
        let flags = match mode {
            Mode::Wait => 0,
            Mode::NoWait => zmq::DONTWAIT,
        };
        match transport::send_message_with(socket, &out.meta, &out.data, flags) {
            Ok(sent) => Ok(self.sent(&out, sent)),
            Err(zmq::Error::EAGAIN) if mode == Mode::NoWait => Ok(self.hold(link, out)),
            Err(e) => {
                let recver = out.recver;
                if let Some(st) = out.staged {
                    st.abandon();
                }
                Err(zmq_err(format!("sending to node {recver}"))(e))
            }
        }
    }

    /// Writes what waits on `link` (in order); whether nothing is left. The
    /// caller holds the link's socket; the wait itself is locked only
    /// between writes, never across a write that may block.
    fn write_waiting(&self, link: &Link, socket: &mut zmq::Socket, mode: Mode) -> bool {
        if !self.any_waiting() {
            return true;
        }
        let flags = match mode {
            Mode::Wait => 0,
            Mode::NoWait => zmq::DONTWAIT,
        };
        loop {
            let Some(out) = lock(&link.waiting).pop_front() else {
                return true;
            };
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            match transport::send_message_with(socket, &out.meta, &out.data, flags) {
                Ok(sent) => {
                    self.sent(&out, sent);
                }
                Err(zmq::Error::EAGAIN) if mode == Mode::NoWait => {
                    // Back at the front: nothing can have overtaken it, as
                    // the caller holds the socket.
                    self.waiting.fetch_add(1, Ordering::Relaxed);
                    let bytes = out.meta.len() + out.data.iter().map(Bytes::len).sum::<usize>();
                    lock(&link.waiting).push_front(out.recver, bytes, out);
                    return false;
                }
                Err(e) => {
                    debug!("cannot send to node {}: {e}", out.recver);
                    self.discard(vec![out]);
                }
            }
        }
    }

    /// Keeps `out` in `link`'s wait (or drops it, warning once per peer,
    /// when the wait holds its budget); returns the bytes it carries.
    fn hold(&self, link: &Link, out: Outgoing<'_>) -> usize {
        let bytes = out.meta.len() + out.data.iter().map(Bytes::len).sum::<usize>();
        let recver = out.recver;
        match lock(&link.waiting).push(recver, bytes, out.into_owned()) {
            Ok(()) => {
                self.waiting.fetch_add(1, Ordering::Relaxed);
                trace!("node {recver} cannot take more now: a message waits");
            }
            Err(refused) => {
                lock(&self.dropped).log(recver, || {
                    format!(
                        "dropping a message to node {recver}: it has not read what was sent \
                         to it (PS_HOLD_LIMIT / 4 bytes wait)"
                    )
                });
                self.discard(vec![refused.item]);
            }
        }
        bytes
    }

    fn sent(&self, out: &Outgoing<'_>, sent: usize) -> usize {
        let bytes = sent + out.staged.as_ref().map_or(0, |st| st.bytes);
        self.counters.sent(out.recver, bytes);
        bytes
    }

    fn discard(&self, outs: Vec<Outgoing<'_>>) {
        for out in outs {
            if let Some(st) = out.staged {
                st.abandon();
            }
        }
    }

    /// Whether any message waits.
    pub(crate) fn any_waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Writes what waits on every link without blocking; whether any
    /// message went.
    pub(crate) fn flush_waiting(&self) -> bool {
        if !self.any_waiting() {
            return false;
        }
        let before = self.waiting.load(Ordering::Relaxed);
        let links: Vec<Arc<Link>> = lock(&self.links).values().cloned().collect();
        for link in links {
            if lock(&link.waiting).is_empty() {
                continue;
            }
            // An app thread writing to this peer writes what waits itself.
            if let Ok(mut socket) = link.socket.try_lock() {
                if let Some(socket) = socket.as_mut() {
                    self.write_waiting(&link, socket, Mode::NoWait);
                }
            }
        }
        self.waiting.load(Ordering::Relaxed) < before
    }

    /// Closes every DEALER (what still waits is dropped, and said).
    pub(crate) fn clear(&self) {
        lock(&self.tags).clear();
        let links: Vec<(NodeId, Arc<Link>)> = lock(&self.links).drain().collect();
        for (id, link) in links {
            let lost = lock(&link.waiting).drain();
            if !lost.is_empty() {
                warn!(
                    "closing the connection to node {id} with {} message(s) it never took",
                    lost.len()
                );
            }
            self.waiting.fetch_sub(lost.len(), Ordering::Relaxed);
            self.discard(lost);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use pslite_proto::{Meta, Role};

    use super::*;

    #[test]
    fn writes_that_would_block_wait_in_order_and_go_once_the_peer_reads() {
        let peer_ctx = zmq::Context::new();
        let router = peer_ctx.socket(zmq::ROUTER).unwrap();
        router.set_rcvhwm(10).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = router.get_last_endpoint().unwrap().unwrap();
        let config = VanConfig {
            water_mark: Some(10),
            ..VanConfig::default()
        };
        let ctx = Context::new(0).unwrap();
        let monitors = Monitors::start(&ctx, |_, _| {}).unwrap();
        let links = Links::new(
            ctx.clone(),
            config,
            Arc::new(Counters::new(std::time::Instant::now())),
            None,
            monitors,
        );
        let mut peer = Node::new(Role::Server, "127.0.0.1", 1);
        peer.id = 8;
        let route = Route {
            endpoint,
            local: None,
            shm_pid: None,
            watch: true,
        };
        links.reserve(8);
        links.open(&peer, 9, None, &route, Mode::NoWait).unwrap();
        // The peer reads nothing: far more than both high-water marks go,
        // and none of the writes blocks.
        let started = Instant::now();
        for ts in 0..2000 {
            let mut msg = Message::default();
            msg.meta.recver = 8;
            msg.meta.timestamp = ts;
            msg.data = vec![Bytes::from(vec![7u8; 1000])];
            links.send(&msg, Mode::NoWait).unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(links.any_waiting(), "the peer's queue is full: writes wait");
        // The peer reads: everything arrives once, in order.
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < 2000 && Instant::now() < deadline {
            links.flush_waiting();
            match router.poll(zmq::POLLIN, 10) {
                Ok(n) if n > 0 => {}
                _ => continue,
            }
            while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
                let meta = Meta::decode(&frames[1]).unwrap();
                got.push(meta.timestamp);
            }
        }
        assert_eq!(got, (0..2000).collect::<Vec<_>>());
        assert!(!links.any_waiting());
        links.clear();
    }
}
