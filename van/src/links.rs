//! This node's connections to its peers: one DEALER per peer, opened the
//! way the core's [`Route`] says, and the messages put on them in priority
//! order.
//!
//! Each link hands ZeroMQ about `PS_PARTITION_BYTES` at a time: what
//! ZeroMQ still holds of a link's large frames is counted (each frame
//! handed over by reference carries a guard that ZeroMQ drops once it has
//! written the frame to the kernel: [`window`]), and further messages
//! wait in the link's [`SendQueue`](crate::schedule::SendQueue)
//! ([`crate::schedule`]: higher priority first, first come first served
//! among equals, nothing waits forever) until it drops
//! below. With large messages cut into parts ([`crate::partition`]), a
//! message of higher priority waits for at most about one part of a lower
//! one. A message's parts are queued together ([`Links::send_parts`]), and
//! the queue begins a new message to the peer only within the peer's bound
//! on incomplete messages (`PS_HOLD_LIMIT / 4`, see [`crate::schedule`]),
//! so a peer of the same configuration never drops one for want of room.
//! A message that finds its link's queue empty and room in ZeroMQ is
//! written at once, by the thread that sends it (the fast path of small
//! requests). When ZeroMQ has written enough, the link's next messages are
//! written by this node's sending thread ([`Links::start_pump`]), woken
//! from ZeroMQ's I/O thread (which only counts and wakes: it never touches
//! a socket). `PS_PARTITION_BYTES=0` gives ZeroMQ everything at once.
//!
//! A write never blocks the receive thread: what it cannot write at once
//! (the peer's high-water mark is reached, another thread is writing to
//! the peer, the link is being opened) waits in the queue, within a byte
//! budget (`PS_HOLD_LIMIT / 4` per peer), and the receive loop tries again
//! ([`Links::flush_waiting`]) at its next wake and on a short timer while
//! any is stuck. An app thread ([`Mode::Wait`]) writes what waits first,
//! in order, then its own message, and may block on a slow peer: when a
//! link holds [`MAX_QUEUED`] messages (or `DMLC_PS_WATER_MARK`), it waits
//! for room (back-pressure to the app); it never holds the core's lock.
//!
//! Sockets are created outside the core's lock: the core only reserves the
//! link ([`Links::reserve`]) when it asks for a connection, so that a
//! message prepared for the new peer finds it and waits there until the
//! thread that carries out the connection has opened the socket.

mod dealer;
mod outgoing;
mod window;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::time::Instant;

use log::{debug, info, trace, warn};
use pslite_proto::{lock, wait_while, Message, Node, NodeId};

use crate::context::{Context, Socket};
use crate::counters::Counters;
use crate::monitor::Monitors;
use crate::partition::PartialBound;
use crate::schedule::Queued;
use crate::shm;
use crate::transport;
use crate::LogOnce;
use crate::Route;
use crate::VanConfig;
use crate::VanError;

/// Messages a link may hold before an app thread's send waits for room
/// (unless `DMLC_PS_WATER_MARK` says otherwise): ZeroMQ's own default
/// high-water mark, which bounded the same wait before links queued.
pub(crate) const MAX_QUEUED: usize = 1000;
/// What a queued message counts beyond its bytes (its bookkeeping).
const OVERHEAD: usize = 64;

pub(crate) use crate::transport::zmq_err;
use dealer::open_dealer;
use outgoing::Outgoing;
use window::{Pump, Sched};

/// Whether a write may wait for the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// An app thread: it may block on a slow peer (back-pressure).
    Wait,
    /// The receive thread: what cannot be written at once waits in the link.
    NoWait,
}

/// One peer's connection.
struct Link {
    /// The DEALER; `None` until the thread carrying out the connection has
    /// opened it.
    socket: Mutex<Option<Socket>>,
    /// Messages not written yet, in sending order.
    sched: Arc<Sched>,
    /// The peer's process, when large frames go through shared memory (0:
    /// they do not).
    shm_pid: AtomicU32,
}

/// This node's DEALERs, by peer id.
pub(crate) struct Links {
    ctx: Context,
    config: VanConfig,
    links: Mutex<HashMap<NodeId, Arc<Link>>>,
    /// Links whose queue is stuck (see [`window::SchedState::stuck`]).
    stuck: AtomicUsize,
    counters: Arc<Counters>,
    pool: Option<Arc<shm::Pool>>,
    /// Peers whose messages were dropped for want of room, warned about.
    dropped: Mutex<LogOnce<NodeId>>,
    /// The watch on every DEALER's connection ([`crate::monitor`]).
    monitors: Monitors,
    /// Which peer each watched DEALER reaches, by its watch's tag (only the
    /// current DEALER of each peer).
    tags: Mutex<HashMap<u64, NodeId>>,
    pump: Arc<Pump>,
    /// Each link's byte budget for what the receive thread queues.
    budget: usize,
    /// Messages a link may hold before an app thread waits.
    max_queued: usize,
    /// Each peer's bound on this node's incomplete messages.
    bound: PartialBound,
}

impl Links {
    pub(crate) fn new(
        ctx: Context,
        config: VanConfig,
        counters: Arc<Counters>,
        pool: Option<Arc<shm::Pool>>,
        monitors: Monitors,
    ) -> Links {
        let budget = config.hold_limit / 4;
        let bound = PartialBound::from_hold_limit(config.hold_limit);
        let max_queued = config.water_mark.map_or(MAX_QUEUED, |w| w.max(1) as usize);
        Links {
            ctx,
            config,
            links: Mutex::new(HashMap::new()),
            stuck: AtomicUsize::new(0),
            counters,
            pool,
            dropped: Mutex::new(LogOnce::new(log::Level::Warn)),
            monitors,
            tags: Mutex::new(HashMap::new()),
            pump: Arc::new(Pump::default()),
            budget,
            max_queued,
            bound,
        }
    }

    /// Starts this node's sending thread: it writes what waits in a link
    /// once ZeroMQ has written enough of what it holds ([`window`]), and
    /// ends with [`Links::clear`] or when the links are dropped.
    pub(crate) fn start_pump(self: &Arc<Self>) -> Result<(), VanError> {
        let links: Weak<Links> = Arc::downgrade(self);
        let pump = Arc::clone(&self.pump);
        std::thread::Builder::new()
            .name("pslite-send".into())
            .spawn(move || loop {
                let Some(peers) = pump.next() else { return };
                let Some(links) = links.upgrade() else { return };
                for peer in peers {
                    if let Some(link) = links.link(peer) {
                        links.pump_if_free(&link);
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| VanError::Setup {
                what: "start the sending thread",
                detail: e.to_string(),
            })
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
            let lost = self.close(&old);
            self.discard(lost);
        }
    }

    /// Makes room for the connection to peer `id` (replacing any), to be
    /// opened by [`Links::open`]: messages to it wait until then. Cheap:
    /// called under the core's lock.
    pub(crate) fn reserve(&self, id: NodeId) {
        // ZeroMQ holds at most about one part beyond what it writes (0:
        // no limit, everything goes to ZeroMQ at once).
        let link = Arc::new(Link {
            socket: Mutex::new(None),
            sched: Arc::new(Sched::new(
                self.config.partition_bytes,
                self.bound,
                &self.pump,
                id,
            )),
            shm_pid: AtomicU32::new(0),
        });
        if let Some(old) = lock(&self.links).insert(id, link) {
            let lost = self.close(&old);
            self.discard(lost);
        }
    }

    /// Marks `link` closed and takes what waits in it.
    fn close(&self, link: &Link) -> Vec<Outgoing<'static>> {
        let mut st = lock(&link.sched.state);
        st.closed = true;
        if st.stuck {
            st.stuck = false;
            self.stuck.fetch_sub(1, Ordering::Relaxed);
        }
        st.budgeted = 0;
        let lost = st.queue.drain(Instant::now());
        drop(st);
        link.sched.room.notify_all();
        lost
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
            self.pump(&link, socket, mode);
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
        let lost = self.close(link);
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
        if mode == Mode::Wait {
            self.wait_for_room(&link);
        }
        let out = self.outgoing(&link, msg);
        self.write(&link, out, mode)
    }

    /// Puts the parts of one message (all to one peer, in order) on its
    /// connection: queued together, so that the link's queue knows the
    /// message whole before any part goes (its bound on begun messages, see
    /// [`crate::schedule`]). An app thread waits for room once, for the
    /// message; the receive thread queues all of its parts or none (the
    /// link's budget). Returns the bytes they carry.
    pub(crate) fn send_parts(&self, parts: &[Message], mode: Mode) -> Result<usize, VanError> {
        let [first, ..] = parts else {
            return Ok(0);
        };
        if parts.len() == 1 {
            return self.send(first, mode);
        }
        let recver = first.meta.recver;
        let link = self.link(recver).ok_or(VanError::UnknownPeer(recver))?;
        if mode == Mode::Wait {
            self.wait_for_room(&link);
        }
        let outs: Vec<Outgoing<'_>> = parts.iter().map(|m| self.outgoing(&link, m)).collect();
        let bytes = outs.iter().map(Outgoing::bytes).sum();
        let Some(mut guard) = lock_socket(&link, mode) else {
            self.enqueue(&link, outs, mode, true);
            return Ok(bytes);
        };
        self.enqueue(&link, outs, mode, false);
        if let Some(socket) = guard.as_mut() {
            self.pump(&link, socket, mode);
        }
        Ok(bytes)
    }

    /// `msg` encoded for `link` (its large frames in shared memory when the
    /// peer shares this host).
    fn outgoing<'a>(&self, link: &Link, msg: &'a Message) -> Outgoing<'a> {
        let shm_pid = link.shm_pid.load(Ordering::Relaxed);
        Outgoing::encode(msg, self.pool.as_deref(), shm_pid)
    }

    /// An app thread waits while `link` holds its most messages (the
    /// sending thread and ZeroMQ's progress make room).
    fn wait_for_room(&self, link: &Link) {
        let st = lock(&link.sched.state);
        if st.queue.len() < self.max_queued {
            return;
        }
        let max = self.max_queued;
        drop(wait_while(&link.sched.room, st, |st| {
            st.queue.len() >= max && !st.closed
        }));
    }

    /// Writes `out` on `link`: at once if nothing waits there and ZeroMQ
    /// has room, else in its place in the queue, then what may go.
    fn write(&self, link: &Link, out: Outgoing<'_>, mode: Mode) -> Result<usize, VanError> {
        let bytes = out.bytes();
        let Some(mut guard) = lock_socket(link, mode) else {
            // Another thread writes to this peer: it writes what waits
            // after its own message; the receive loop retries if that one
            // finished first.
            self.enqueue(link, vec![out], mode, true);
            return Ok(bytes);
        };
        let Some(socket) = guard.as_mut() else {
            self.enqueue(link, vec![out], mode, false); // being opened
            return Ok(bytes);
        };
        let direct = {
            let st = lock(&link.sched.state);
            st.queue.is_empty() && st.in_flight < link.sched.window
        };
        if !direct {
            self.enqueue(link, vec![out], mode, false);
            self.pump(link, socket, mode);
            return Ok(bytes);
        }
        match self.put(link, socket, &out, mode) {
            Ok(sent) => Ok(self.sent(&out, sent)),
            Err(zmq::Error::EAGAIN) if mode == Mode::NoWait => {
                self.enqueue(link, vec![out], mode, true);
                Ok(bytes)
            }
            Err(e) => {
                let recver = out.recver;
                if let Some(st) = out.staged {
                    st.abandon();
                }
                Err(zmq_err(format!("sending to node {recver}"))(e))
            }
        }
    }

    /// Queues `outs` (one message, or the parts of one) on `link`, together
    /// (or drops them, warning once per peer, when the receive thread's
    /// budget for the link is spent); `stuck`: the receive loop must try
    /// again.
    fn enqueue(&self, link: &Link, outs: Vec<Outgoing<'_>>, mode: Mode, stuck: bool) {
        let Some(recver) = outs.first().map(|o| o.recver) else {
            return;
        };
        let bytes: usize = outs.iter().map(|o| o.bytes() + OVERHEAD).sum();
        let mut outs: Vec<Outgoing<'static>> = outs.into_iter().map(Outgoing::into_owned).collect();
        let mut st = lock(&link.sched.state);
        if st.closed {
            drop(st);
            self.discard(outs);
            return;
        }
        if mode == Mode::NoWait {
            if st.budgeted + bytes > self.budget {
                drop(st);
                lock(&self.dropped).log(recver, || {
                    format!(
                        "dropping a message to node {recver}: it has not read what was sent \
                         to it (PS_HOLD_LIMIT / 4 bytes wait)"
                    )
                });
                self.discard(outs);
                return;
            }
            st.budgeted += bytes;
            for out in &mut outs {
                out.budgeted = true;
            }
        }
        let now = Instant::now();
        for out in outs {
            let (priority, part, bytes) = (out.priority, out.part, out.bytes() + OVERHEAD);
            st.queue.push_part(out, priority, bytes, part, now);
        }
        if stuck && !st.stuck {
            st.stuck = true;
            self.stuck.fetch_add(1, Ordering::Relaxed);
        }
        trace!("a message to node {recver} waits in its link");
    }

    /// Writes what waits on `link`, in sending order, while ZeroMQ has
    /// room. The caller holds the link's socket.
    fn pump(&self, link: &Link, socket: &mut zmq::Socket, mode: Mode) {
        loop {
            let q = {
                let mut st = lock(&link.sched.state);
                if st.queue.is_empty() || st.in_flight >= link.sched.window {
                    if st.queue.is_empty() && st.stuck {
                        st.stuck = false;
                        self.stuck.fetch_sub(1, Ordering::Relaxed);
                    }
                    return;
                }
                let Some(q) = st.queue.pop(Instant::now()) else {
                    return;
                };
                if q.item.budgeted {
                    st.budgeted = st.budgeted.saturating_sub(q.bytes);
                }
                q
            };
            link.sched.room.notify_all();
            match self.put(link, socket, &q.item, mode) {
                Ok(sent) => {
                    self.sent(&q.item, sent);
                }
                Err(zmq::Error::EAGAIN) if mode == Mode::NoWait => {
                    // Back in its place: nothing overtakes it, as the
                    // caller holds the socket.
                    self.put_back(link, q);
                    return;
                }
                Err(e) => {
                    debug!("cannot send to node {}: {e}", q.item.recver);
                    self.discard(vec![q.item]);
                }
            }
        }
    }

    /// Puts a message that would have blocked back in its place; the
    /// receive loop tries again.
    fn put_back(&self, link: &Link, q: Queued<Outgoing<'static>>) {
        let mut st = lock(&link.sched.state);
        if st.closed {
            drop(st);
            self.discard(vec![q.item]);
            return;
        }
        if q.item.budgeted {
            st.budgeted += q.bytes;
        }
        st.queue.put_back(q);
        if !st.stuck {
            st.stuck = true;
            self.stuck.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes what waits on `link` unless another thread holds its socket
    /// (that thread writes it).
    fn pump_if_free(&self, link: &Link) {
        if let Ok(mut socket) = link.socket.try_lock() {
            if let Some(socket) = socket.as_mut() {
                self.pump(link, socket, Mode::NoWait);
            }
        }
    }

    /// Hands `out` to ZeroMQ, its large frames counted against `link`'s
    /// window until ZeroMQ drops them.
    fn put(
        &self,
        link: &Link,
        socket: &mut zmq::Socket,
        out: &Outgoing<'_>,
        mode: Mode,
    ) -> zmq::Result<usize> {
        let flags = match mode {
            Mode::Wait => 0,
            Mode::NoWait => zmq::DONTWAIT,
        };
        let mut credit = |bytes: usize| link.sched.credit(bytes);
        transport::send_message_guarded(socket, &out.meta, &out.data, flags, &mut credit)
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

    /// Whether a message waits for a retry (see [`Links::flush_waiting`]).
    pub(crate) fn any_waiting(&self) -> bool {
        self.stuck.load(Ordering::Relaxed) > 0
    }

    /// Whether any link holds a message (stuck, or waiting for ZeroMQ to
    /// write what it holds).
    pub(crate) fn any_queued(&self) -> bool {
        lock(&self.links)
            .values()
            .any(|l| !lock(&l.sched.state).queue.is_empty())
    }

    /// Writes what waits on every link without blocking; whether any
    /// message went.
    pub(crate) fn flush_waiting(&self) -> bool {
        let links: Vec<Arc<Link>> = lock(&self.links).values().cloned().collect();
        let mut progress = false;
        for link in links {
            let before = lock(&link.sched.state).queue.len();
            if before == 0 {
                continue;
            }
            // An app thread writing to this peer writes what waits itself.
            self.pump_if_free(&link);
            progress |= lock(&link.sched.state).queue.len() < before;
        }
        progress
    }

    /// Closes every DEALER (what still waits is dropped, and said) and
    /// stops the sending thread.
    pub(crate) fn clear(&self) {
        self.pump.stop();
        lock(&self.tags).clear();
        let links: Vec<(NodeId, Arc<Link>)> = lock(&self.links).drain().collect();
        for (id, link) in links {
            let lost = self.close(&link);
            if !lost.is_empty() {
                warn!(
                    "closing the connection to node {id} with {} message(s) it never took",
                    lost.len()
                );
            }
            self.discard(lost);
        }
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        self.pump.stop();
    }
}

/// The lock on `link`'s socket: waited for (`Mode::Wait`), or taken only
/// if free (`Mode::NoWait`; `None` while another thread writes there).
fn lock_socket(link: &Link, mode: Mode) -> Option<MutexGuard<'_, Option<Socket>>> {
    match mode {
        Mode::Wait => Some(lock(&link.socket)),
        Mode::NoWait => match link.socket.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use bytes::Bytes;
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

    /// A link to a peer that is not listening yet: ZeroMQ holds the first
    /// large message, so the rest wait in the link, and go in priority
    /// order once the peer is there.
    #[test]
    fn what_waits_goes_higher_priority_first_and_in_order_among_equals() {
        let peer_ctx = zmq::Context::new();
        let router = peer_ctx.socket(zmq::ROUTER).unwrap();
        let ctx = Context::new(0).unwrap();
        let endpoint = format!("ipc://@pslite-links-priority-{}", std::process::id());
        let config = VanConfig {
            partition_bytes: 64 << 10,
            ..VanConfig::default()
        };
        let monitors = Monitors::start(&ctx, |_, _| {}).unwrap();
        let links = Arc::new(Links::new(
            ctx.clone(),
            config,
            Arc::new(Counters::new(std::time::Instant::now())),
            None,
            monitors,
        ));
        links.start_pump().unwrap();
        let mut peer = Node::new(Role::Server, "127.0.0.1", 1);
        peer.id = 8;
        let route = Route {
            endpoint,
            local: None,
            shm_pid: None,
            watch: true,
        };
        links.reserve(8);
        links.open(&peer, 9, None, &route, Mode::Wait).unwrap();
        let send = |ts: i32, priority: i32, control: bool| {
            let mut msg = Message::default();
            msg.meta.recver = 8;
            msg.meta.timestamp = ts;
            msg.meta.priority = priority;
            if control {
                msg.meta.control = pslite_proto::Control::new(pslite_proto::Command::Heartbeat);
            }
            msg.data = vec![Bytes::from(vec![ts as u8; 1 << 20])];
            links.send(&msg, Mode::Wait).unwrap();
        };
        send(0, 0, false); // handed to ZeroMQ at once
        for ts in 1..4 {
            send(ts, 0, false);
        }
        send(4, 7, false);
        send(5, -1, false);
        send(6, 7, false);
        send(7, 0, true);
        assert!(links.any_queued());
        router.bind(&route.endpoint).unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < 8 && Instant::now() < deadline {
            if router.poll(zmq::POLLIN, 10).unwrap_or(0) == 0 {
                continue;
            }
            while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
                let meta = Meta::decode(&frames[1]).unwrap();
                assert_eq!(frames[2].len(), 1 << 20);
                got.push(meta.timestamp);
            }
        }
        // 0 was in ZeroMQ already; then control, the two of priority 7 in
        // order, the three of 0 in order, the one of -1.
        assert_eq!(got, vec![0, 7, 4, 6, 1, 2, 3, 5]);
        links.clear();
    }
}
