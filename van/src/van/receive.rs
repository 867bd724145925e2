//! The receive thread: one loop that reads the ROUTER (or, while the node
//! does not listen, only its wake-up socket), decodes each message, maps
//! its shared-memory frames and hands it to the core, and runs what is
//! due: the core's clock, parked messages offered again, writes waiting in
//! links, a frame that could not be mapped for want of descriptors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use log::{debug, error, trace, warn};
use pslite_proto::shm::ShmFrame;
use pslite_proto::{lock, Message, Meta, NodeId, K_EMPTY};

use super::Shared;
use crate::bind::WAKE_IDENTITY;
use crate::counters::DropReason;
use crate::describe;
use crate::links::Mode;
use crate::shm::{self, ShmError};
use crate::transport;
use crate::Failure;
use crate::LogOnce;

/// Ends every wait if the receive thread ends without being asked to.
struct ReceiveThreadGuard<'a>(&'a Shared);

impl Drop for ReceiveThreadGuard<'_> {
    fn drop(&mut self) {
        if self.0.stopping.load(Ordering::SeqCst) {
            return;
        }
        let reason = if std::thread::panicking() {
            "it panicked"
        } else {
            "it stopped unexpectedly"
        };
        let failure = Failure::ReceiveThreadDied {
            reason: reason.to_string(),
        };
        self.0
            .with_core(Mode::NoWait, |core, now| core.fail(failure, now));
    }
}

thread_local! {
    /// Whether this thread is a Van's receive thread (an inline handler's
    /// send from it must never wait).
    static ON_RECEIVE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is a Van's receive thread.
pub(super) fn on_receive_thread() -> bool {
    ON_RECEIVE_THREAD.get()
}

/// The first retry of writes that wait in a link, then twice as long each
/// time nothing went, up to [`FLUSH_MAX`].
const FLUSH_FIRST: Duration = Duration::from_millis(1);
const FLUSH_MAX: Duration = Duration::from_millis(100);
/// The first retry of a shared-memory frame this process could not map,
/// then twice as long, up to [`STALL_MAX`].
const STALL_FIRST: Duration = Duration::from_millis(10);
const STALL_MAX: Duration = Duration::from_secs(1);

/// A message decoded from the ROUTER, before its shared-memory frames (if
/// any) are mapped.
struct Incoming {
    sender: NodeId,
    /// The key its identity carried (`ps<id>/<key>`), if any.
    key: Option<u64>,
    identity: Vec<u8>,
    /// Its meta frame (kept to name the connection's address in a log line).
    frame: zmq::Message,
    /// Bytes of its meta and data frames on the wire.
    size: usize,
    meta: Meta,
    descs: Vec<ShmFrame>,
    data: Vec<bytes::Bytes>,
}

/// A message waiting for descriptors to map its frames.
struct Stalled {
    incoming: Incoming,
    /// When to try again, and the interval after that.
    retry_at: Instant,
    every: Duration,
}

/// What the receive thread keeps between messages.
struct Receiving {
    /// Peers' shared-memory segments mapped.
    shm: shm::Receiver,
    /// Senders of rejected descriptors, and of malformed messages, already
    /// warned about.
    shm_rejections: LogOnce<NodeId>,
    /// Processes (sender, pid) whose messages were dropped because their
    /// segments went with them, already logged.
    shm_exited: LogOnce<(NodeId, u32)>,
    malformed: LogOnce<Vec<u8>>,
    /// A message whose shared-memory frames this process could not map yet
    /// (short of descriptors).
    stalled: Option<Stalled>,
    /// When to write what waits in links again, and the interval.
    flush_at: Option<Instant>,
    flush_every: Duration,
}

impl Shared {
    pub(super) fn receive_thread(
        &self,
        mut router: crate::context::Socket,
        side: crate::context::Socket,
    ) {
        ON_RECEIVE_THREAD.set(true);
        let _guard = ReceiveThreadGuard(self);
        let mut rx = Receiving {
            shm: shm::Receiver::new(),
            shm_rejections: LogOnce::new(log::Level::Warn),
            shm_exited: LogOnce::new(log::Level::Info),
            malformed: LogOnce::new(log::Level::Warn),
            stalled: None,
            flush_at: None,
            flush_every: FLUSH_FIRST,
        };
        self.receive_loop(&mut router, &side, &mut rx);
        debug!("receive loop stopped");
    }

    /// Receives until stopped, and runs the core's clock. While listening it
    /// makes one blocking receive per message on the ROUTER, bounded by the
    /// next deadline (`ZMQ_RCVTIMEO`): a blocking receive costs ZeroMQ one
    /// wait, a poll followed by non-blocking receives several syscalls more
    /// per message. While not listening it waits on its side socket only.
    fn receive_loop(&self, router: &mut zmq::Socket, side: &zmq::Socket, rx: &mut Receiving) {
        // The ROUTER's receive timeout as last set (ZeroMQ's default: none).
        let mut timeout_set: i32 = -1;
        let mut handover_set = true;
        loop {
            let handover = self.handover.load(Ordering::Relaxed);
            if handover != handover_set {
                if let Err(e) = router.set_router_handover(handover) {
                    error!("setting ROUTER_HANDOVER failed: {e}");
                }
                handover_set = handover;
            }
            let (next, listening) = {
                let mut locked = lock(&self.locked);
                let next = locked.core.poll_timeout();
                locked.sleeping_until = next;
                (next, locked.core.is_listening())
            };
            // Stopping: also while the sending thread still writes what
            // is queued (the loop looks again on the same short timer).
            let flushing = self.flushing.load(Ordering::SeqCst) && self.links.any_queued();
            if !self.links.any_waiting() && !flushing {
                (rx.flush_at, rx.flush_every) = (None, FLUSH_FIRST);
            } else if rx.flush_at.is_none() {
                rx.flush_at = Some(Instant::now() + rx.flush_every);
            }
            let stall_at = rx.stalled.as_ref().map(|s| s.retry_at);
            let wake_at = [next, rx.flush_at, stall_at].into_iter().flatten().min();
            let timeout_ms = match wake_at {
                None => -1,
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    // Round up: waking before the deadline only loops again.
                    left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
                }
            };
            let received = if listening {
                if timeout_ms != timeout_set {
                    if let Err(e) = router.set_rcvtimeo(timeout_ms) {
                        error!("setting the receive timeout failed: {e}");
                        return;
                    }
                    timeout_set = timeout_ms;
                }
                transport::recv_message(router).map(Some)
            } else {
                let mut items = [side.as_poll_item(zmq::POLLIN)];
                zmq::poll(&mut items, i64::from(timeout_ms)).map(|_| {
                    while side.recv_msg(zmq::DONTWAIT).is_ok() {}
                    None
                })
            };
            match received {
                Ok(Some(raw)) => {
                    if self.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    if raw.identity != WAKE_IDENTITY {
                        if let Some(incoming) = self.decode(raw, rx) {
                            self.take(incoming, rx);
                        }
                    }
                }
                Ok(None) | Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => {}
                Err(zmq::Error::ETERM) => return,
                Err(e) => {
                    error!("receiving failed: {e}");
                    return;
                }
            }
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            self.run_timers(next, rx);
            self.send_replies(router);
        }
    }

    /// Sends the answers to admin clients waiting in the outbox through the
    /// ROUTER, each back on the connection its request came on. A ROUTER
    /// never blocks: a client that is gone, or whose queue is full, loses
    /// the answer. The budget each reserved is released once ZeroMQ has
    /// written or dropped it.
    fn send_replies(&self, router: &mut zmq::Socket) {
        let replies = std::mem::take(&mut *lock(&self.replies));
        for (route, msg, reserved) in replies {
            let meta = bytes::Bytes::from_owner(Reserved {
                data: msg.meta.encode(),
                gauge: Arc::clone(&self.reply_gauge),
                reserved,
            });
            if let Err(e) = send_routed(router, &route, &meta, &msg.data) {
                debug!("cannot answer an admin client: {e}");
            }
        }
    }

    /// What is due after a wake: parked messages offered again, a stalled
    /// frame tried again, waiting writes, the core's clock, and mappings of
    /// peers that are gone.
    fn run_timers(&self, next: Option<Instant>, rx: &mut Receiving) {
        if self.room.swap(false, Ordering::SeqCst) {
            self.with_core(Mode::NoWait, |core, now| core.room(now));
        }
        let now = Instant::now();
        if rx.stalled.as_ref().is_some_and(|s| now >= s.retry_at) {
            self.take_stalled(rx);
        }
        if rx.flush_at.is_some_and(|at| now >= at) {
            let progress = self.links.flush_waiting();
            rx.flush_every = if progress {
                FLUSH_FIRST
            } else {
                (rx.flush_every * 2).min(FLUSH_MAX)
            };
            rx.flush_at = None;
        }
        // Stopping: the core waits until nothing waits in the links.
        if self.flushing.load(Ordering::SeqCst) && !self.links.any_queued() {
            self.with_core(Mode::NoWait, |core, _| core.links_flushed());
        }
        if next.is_some_and(|at| now >= at) {
            self.with_core(Mode::NoWait, |core, now| core.tick(now, SystemTime::now()));
        }
        if rx.shm.mapped() > 0 {
            rx.shm.prune(now);
        }
    }

    /// Decodes a message from the ROUTER; `None` if it is malformed (logged
    /// once per sender identity, counted).
    fn decode(&self, mut raw: transport::RawMessage, rx: &mut Receiving) -> Option<Incoming> {
        let size = raw.size();
        let decoded = match raw.meta.take() {
            None => Err("it has no meta frame".to_string()),
            Some(frame) => Meta::decode_with_shm(&frame)
                .map(|decoded| (decoded, frame))
                .map_err(|e| e.to_string()),
        };
        match decoded {
            Ok(((meta, descs), frame)) => Some(Incoming {
                sender: raw.sender,
                key: raw.key,
                identity: raw.identity,
                frame,
                size,
                meta,
                descs,
                data: raw.data,
            }),
            Err(why) => {
                self.counters.received(raw.sender, size);
                self.counters.dropped(DropReason::Malformed);
                let from = peer_name(&raw.identity);
                rx.malformed.log(raw.identity, || {
                    format!("dropping a message from {from}: {why}")
                });
                None
            }
        }
    }

    /// Maps a message's shared-memory frames and hands it to the core. A
    /// frame this process has no descriptor left to map stalls the loop
    /// (see [`Receiving::stalled`]); a bad descriptor drops the message.
    fn take(&self, mut incoming: Incoming, rx: &mut Receiving) {
        if incoming.descs.is_empty() {
            return self.hand_over(incoming, 0);
        }
        match self.resolve_shm(&mut incoming, rx) {
            Ok(bytes) => self.hand_over(incoming, bytes),
            Err(e) if e.is_local_shortage() => {
                warn!(
                    "cannot map a shared-memory frame from {} for now ({e}): not reading until \
                     it can",
                    peer_name(&incoming.identity)
                );
                rx.stalled = Some(Stalled {
                    incoming,
                    retry_at: Instant::now() + STALL_FIRST,
                    every: STALL_FIRST,
                });
                self.with_core(Mode::NoWait, |core, now| core.set_stalled(true, now));
            }
            Err(e) => self.reject(incoming, &e, rx),
        }
    }

    /// Tries the stalled message again (see [`Shared::take`]).
    fn take_stalled(&self, rx: &mut Receiving) {
        let Some(Stalled {
            mut incoming,
            every,
            ..
        }) = rx.stalled.take()
        else {
            return;
        };
        let result = self.resolve_shm(&mut incoming, rx);
        if matches!(&result, Err(e) if e.is_local_shortage()) {
            let every = (every * 2).min(STALL_MAX);
            rx.stalled = Some(Stalled {
                incoming,
                retry_at: Instant::now() + every,
                every,
            });
            return;
        }
        debug!("reading again: the shared-memory frame could be mapped");
        self.with_core(Mode::NoWait, |core, now| core.set_stalled(false, now));
        match result {
            Ok(bytes) => self.hand_over(incoming, bytes),
            Err(e) => self.reject(incoming, &e, rx),
        }
    }

    /// Hands a received message, with `shm_bytes` mapped, to the core.
    fn hand_over(&self, incoming: Incoming, shm_bytes: usize) {
        self.counters
            .received(incoming.sender, incoming.size + shm_bytes);
        let mut meta = incoming.meta;
        meta.sender = incoming.sender;
        meta.sender_key = incoming.key;
        // ZeroMQ generates a routing id (0 and 4 bytes) for a connection
        // without an identity: an admin client's, answered on it.
        if incoming.sender == K_EMPTY && incoming.identity.first() == Some(&0) {
            meta.route = Some(bytes::Bytes::copy_from_slice(&incoming.identity));
        }
        let msg = Message {
            meta,
            data: incoming.data,
        };
        trace!("recv {}", describe(&msg));
        let refused = self.with_core(Mode::NoWait, |core, now| core.handle(msg, now));
        if let Some(refused) = refused {
            let mut frame = incoming.frame;
            warn!("{refused}; from {}", transport::peer_address(&mut frame));
        }
    }

    /// Drops a message with a bad shared-memory descriptor (warned once per
    /// sender, counted).
    fn reject(&self, incoming: Incoming, e: &ShmError, rx: &mut Receiving) {
        self.counters.received(incoming.sender, incoming.size);
        // A message a peer sent just before its process exited (killed, say)
        // names segments that went with it: no fault of anyone's, so one
        // line per process at info level, and no bad descriptor counted.
        let sender = incoming.sender;
        let exited = match e {
            ShmError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                let pid = lock(&self.locked).core.shm_peer(sender, incoming.key);
                pid.filter(|&pid| shm::has_exited(pid))
            }
            _ => None,
        };
        if let Some(pid) = exited {
            self.counters.dropped(DropReason::UnknownPeer);
            rx.shm_exited.log((sender, pid), || {
                format!(
                    "dropping the messages node {sender} sent before its process (pid {pid}) \
                     exited: their data was in its shared memory, which went with it"
                )
            });
            return;
        }
        self.counters.dropped(DropReason::Malformed);
        if let Some(pool) = &self.pool {
            pool.stats().rejected.fetch_add(1, Ordering::Relaxed);
        }
        let from = peer_name(&incoming.identity);
        rx.shm_rejections.log(incoming.sender, || {
            format!("dropping a message from {from} with a bad shared-memory descriptor: {e}")
        });
    }

    /// Replaces the frames a message carries in shared memory by views of
    /// the sender's segments; returns their bytes. Short of descriptors, it
    /// closes this node's idle segments and tries once more.
    fn resolve_shm(&self, incoming: &mut Incoming, rx: &mut Receiving) -> Result<usize, ShmError> {
        let pool = self.pool.as_ref().ok_or(ShmError::NotShmPeer)?;
        let sender = incoming.sender;
        // The sender's pid from the node table, never from the message.
        let pid = if sender == K_EMPTY {
            None
        } else {
            lock(&self.locked).core.shm_peer(sender, incoming.key)
        };
        let (descs, data) = (&incoming.descs, &mut incoming.data);
        let bytes = match rx.shm.resolve(sender, pid, descs, data) {
            Err(e) if e.is_local_shortage() && pool.shrink() > 0 => {
                rx.shm.resolve(sender, pid, descs, data)
            }
            result => result,
        }?;
        pool.stats()
            .frames_received
            .fetch_add(descs.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }
}

/// Who sent a message, from its identity alone (not checked against the
/// node table: for messages dropped before that).
fn peer_name(identity: &[u8]) -> String {
    match transport::parse_identity(identity) {
        K_EMPTY => format!("an unknown peer (identity {identity:02x?})"),
        _ => format!("identity {}", String::from_utf8_lossy(identity)),
    }
}

/// Bytes of an answer to an admin client, holding its share of the reply
/// budget until ZeroMQ lets go of them.
struct Reserved {
    data: Vec<u8>,
    gauge: Arc<AtomicUsize>,
    reserved: usize,
}

impl AsRef<[u8]> for Reserved {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.gauge.fetch_sub(self.reserved, Ordering::Relaxed);
    }
}

/// Sends `[route][meta][data...]` through a ROUTER (to the connection with
/// routing id `route`).
fn send_routed(
    socket: &mut zmq::Socket,
    route: &[u8],
    meta: &bytes::Bytes,
    data: &[bytes::Bytes],
) -> zmq::Result<()> {
    socket.send(route, zmq::SNDMORE | zmq::DONTWAIT)?;
    let frames = std::iter::once(meta).chain(data);
    let count = data.len() + 1;
    for (i, frame) in frames.enumerate() {
        transport::send_frame(socket, frame, i + 1 < count, zmq::DONTWAIT)?;
    }
    Ok(())
}
