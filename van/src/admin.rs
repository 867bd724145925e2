//! An admin client: a program that is not a cluster member (`pslite status`,
//! `pslite store`) talking to a running cluster's scheduler.
//!
//! It opens a DEALER (with no identity) to the scheduler and sends it
//! pslite-only requests; the scheduler answers (and sends store events, see
//! [`AdminClient::store_event`]) back on that same connection, through its
//! ROUTER: it never connects to an address a client names. Every wait has a
//! deadline, so a scheduler that is not there (or is C++ ps-lite, which does
//! not know these requests) gives a clear error instead of a hang, and a
//! scheduler that goes away while the client waits (its connection closes)
//! fails the wait at once. A monitor on the DEALER tells the errors apart:
//! nothing accepting the connection, a scheduler that accepted it and did
//! not answer, a handshake refused over `PS_AUTH_TOKEN` (reported at once,
//! as nodes report it), and a connection that closed.
//!
//! ```no_run
//! use std::time::Duration;
//! use pslite_van::admin::AdminClient;
//!
//! let mut client = AdminClient::connect("127.0.0.1", 9091, None)?;
//! for row in client.status(Duration::from_secs(2))? {
//!     println!("{} last heard {:?} ago", row.node, row.last_seen);
//! }
//! # Ok::<(), pslite_van::admin::AdminError>(())
//! ```

use std::collections::VecDeque;
use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pslite_proto::ids::SCHEDULER;
use pslite_proto::stats::NodeStatus;
use pslite_proto::store::{StoreMsg, StoreOp};
use pslite_proto::{Command, Message, Meta, K_EMPTY};

/// How the scheduler is reached (see [`AdminClient::connect_via`]).
pub use crate::auth::AuthToken;
use crate::transport;
pub use crate::transport::Transport;

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A ZeroMQ call failed.
    #[error("{context}: {source}")]
    Zmq {
        /// What was being done.
        context: String,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
    /// Setting up the client's sockets failed (e.g. `PS_AUTH_TOKEN`).
    #[error(transparent)]
    Van(#[from] crate::VanError),
    /// The host of the scheduler does not resolve.
    #[error("cannot find the way to the scheduler: host {0:?} does not resolve")]
    Resolve(String),
    /// No answer came back in time.
    #[error("{}", no_answer(scheduler, *timeout, *connection))]
    NoAnswer {
        /// The scheduler's address.
        scheduler: String,
        /// How long we waited (the timeout asked for, and the grace of a
        /// request waiting on the scheduler if it was given).
        timeout: Duration,
        /// What became of the connection to the scheduler.
        connection: Connection,
    },
    /// The scheduler refused this client's ZeroMQ handshake: a wrong or
    /// missing `PS_AUTH_TOKEN`, or one it does not expect.
    #[error("{detail}")]
    Refused {
        /// What was refused and what to set.
        detail: String,
    },
    /// The scheduler's connection closed while the client waited: it
    /// stopped or died.
    #[error("the scheduler at {scheduler} closed the connection (it stopped or died)")]
    SchedulerGone {
        /// The scheduler's address.
        scheduler: String,
    },
}

/// What an admin client saw of its connection to the scheduler (from its
/// DEALER's socket monitor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// No connection attempt has finished (a host that does not answer).
    Pending,
    /// Connecting failed this many times (nothing listens there).
    Failing(u32),
    /// Connections were made but the peer hung up during the ZeroMQ
    /// handshake, this many times in a row (a scheduler that wants a
    /// `PS_AUTH_TOKEN` does that to a client without one, or not a ZeroMQ
    /// socket at all).
    Dropped(u32),
    /// A ZeroMQ socket there accepted the connection and the handshake.
    Accepted,
}

/// The message of [`AdminError::NoAnswer`]: why there may have been none.
fn no_answer(scheduler: &str, timeout: Duration, connection: Connection) -> String {
    let head = format!(
        "no answer from the scheduler at {scheduler} within {:.1} s",
        timeout.as_secs_f64()
    );
    match connection {
        Connection::Accepted => format!(
            "{head}, although it accepted the connection: is it a pslite scheduler (C++ \
             ps-lite does not answer these requests)?"
        ),
        Connection::Failing(attempts) => format!(
            "{head}: nothing accepted the connection ({attempts} attempt{}): is a pslite \
             scheduler running there? (check DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT, or \
             --host/--port)",
            if attempts == 1 { "" } else { "s" }
        ),
        Connection::Dropped(times) => format!(
            "{head}: it closed the connection during the ZeroMQ handshake ({times} time{}): \
             does it require a PS_AUTH_TOKEN (set the cluster's), and is it a pslite scheduler?",
            if times == 1 { "" } else { "s" }
        ),
        Connection::Pending => format!(
            "{head}: the connection was not made in that time: is the host reachable and a \
             pslite scheduler running there? (check DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT, or \
             --host/--port)"
        ),
    }
}

/// Handshakes dropped in a row after which a client without a token takes
/// it that the scheduler wants one (ZeroMQ retries every 100 ms).
const DROPS_MEAN_A_TOKEN: u32 = 5;

/// How much longer than its deadline a request that waits on the scheduler
/// (a GET or WAIT with a timeout) may wait for its answer, once the
/// scheduler is known to be there: the answer leaves it at that deadline.
pub const ANSWER_GRACE: Duration = Duration::from_secs(2);

fn zmq_err(context: impl Into<String>) -> impl FnOnce(zmq::Error) -> AdminError {
    let context = context.into();
    move |source| AdminError::Zmq { context, source }
}

/// A connection to a scheduler for admin requests. See the module docs.
pub struct AdminClient {
    /// The DEALER's socket monitor (connections, handshakes, closes).
    monitor: zmq::Socket,
    connection: Connection,
    /// Why the scheduler refused the handshake, once it has.
    refused: Option<String>,
    /// Whether this client presents a `PS_AUTH_TOKEN`.
    has_token: bool,
    /// Store events that arrived while waiting for an answer.
    events: VecDeque<StoreMsg>,
    dealer: zmq::Socket,
    /// This machine's address on the route to the scheduler.
    local: String,
    scheduler: String,
    // Dropped last: the sockets above belong to it.
    _ctx: zmq::Context,
}

impl AdminClient {
    /// Prepares requests to the scheduler at `scheduler_host:scheduler_port`.
    /// `local_host` is what [`AdminClient::local_address`] reports (default:
    /// this machine's address on the route to the scheduler, 127.0.0.1 for
    /// a local one); answers come back on the client's own connection.
    pub fn connect(
        scheduler_host: &str,
        scheduler_port: i32,
        local_host: Option<&str>,
    ) -> Result<AdminClient, AdminError> {
        AdminClient::connect_via(
            Transport::Tcp,
            scheduler_host,
            scheduler_port,
            local_host,
            None,
        )
    }

    /// [`AdminClient::connect`] to a scheduler listening on `transport`
    /// (IPC for a `DMLC_LOCAL=1` cluster), presenting `token` to a cluster
    /// that runs with `PS_AUTH_TOKEN`.
    pub fn connect_via(
        transport: Transport,
        scheduler_host: &str,
        scheduler_port: i32,
        local_host: Option<&str>,
        token: Option<&crate::AuthToken>,
    ) -> Result<AdminClient, AdminError> {
        let local = match local_host {
            Some(host) => host.to_string(),
            None => local_address_towards(scheduler_host, scheduler_port)
                .ok_or_else(|| AdminError::Resolve(scheduler_host.to_string()))?,
        };
        let ctx = zmq::Context::new();
        let dealer = ctx
            .socket(zmq::DEALER)
            .map_err(zmq_err("creating a DEALER"))?;
        dealer.set_linger(0).map_err(zmq_err("setting LINGER"))?;
        crate::auth::secure_dealer(&dealer, token)?;
        let monitor_endpoint = crate::auth::monitor_endpoint("admin");
        dealer
            .monitor(
                &monitor_endpoint,
                (zmq::SocketEvent::CONNECT_RETRIED as u16
                    | zmq::SocketEvent::HANDSHAKE_SUCCEEDED as u16
                    | zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL as u16
                    | zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL as u16
                    | zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u16
                    | zmq::SocketEvent::DISCONNECTED as u16) as i32,
            )
            .map_err(zmq_err("monitoring the DEALER"))?;
        let monitor = ctx
            .socket(zmq::PAIR)
            .map_err(zmq_err("creating the monitor socket"))?;
        monitor.set_linger(0).map_err(zmq_err("setting LINGER"))?;
        monitor
            .connect(&monitor_endpoint)
            .map_err(zmq_err("connecting the monitor socket"))?;
        let scheduler = transport.connect_endpoint(scheduler_host, scheduler_port);
        dealer
            .connect(&scheduler)
            .map_err(zmq_err(format!("connecting to {scheduler}")))?;
        Ok(AdminClient {
            monitor,
            connection: Connection::Pending,
            refused: None,
            has_token: token.is_some(),
            events: VecDeque::new(),
            dealer,
            local,
            scheduler,
            _ctx: ctx,
        })
    }

    /// This machine's address on the route to the scheduler (or the host
    /// given to [`AdminClient::connect`]), with port 0.
    pub fn local_address(&self) -> String {
        if self.local.contains(':') {
            format!("[{}]:0", self.local)
        } else {
            format!("{}:0", self.local)
        }
    }

    /// What this client has seen of its connection to the scheduler.
    pub fn connection(&self) -> Connection {
        self.connection
    }

    /// Sends the scheduler a `cmd` request (the caller fills in anything
    /// else in `msg`) and waits up to `timeout` for its answer. A refused
    /// handshake fails at once.
    pub fn request(&mut self, msg: Message, timeout: Duration) -> Result<Message, AdminError> {
        self.exchange(msg, timeout, Duration::ZERO)
    }

    /// [`AdminClient::request`], waiting up to `grace` longer if the
    /// scheduler accepted the connection by the deadline.
    fn exchange(
        &mut self,
        mut msg: Message,
        timeout: Duration,
        grace: Duration,
    ) -> Result<Message, AdminError> {
        if let Some(detail) = &self.refused {
            return Err(AdminError::Refused {
                detail: detail.clone(),
            });
        }
        let cmd = msg.meta.control.cmd;
        msg.meta.request = true;
        msg.meta.recver = SCHEDULER;
        // A fresh timestamp pairs the answer with this request (and keeps a
        // resending scheduler from taking it for a duplicate of the last one).
        msg.meta.timestamp = rand::random_range(0..i32::MAX);
        if let Some(store) = &mut msg.meta.store {
            // The scheduler answers store requests with their id as timestamp.
            store.id = msg.meta.timestamp as u64;
        }
        transport::send_message(&mut self.dealer, &msg.meta.encode(), &msg.data)
            .map_err(zmq_err(format!("sending to {}", self.scheduler)))?;
        let start = Instant::now();
        let mut deadline = start + timeout;
        let mut extended = grace.is_zero();
        loop {
            let Some(answer) = self.receive(deadline)? else {
                if !extended && self.connection == Connection::Accepted {
                    extended = true;
                    deadline += grace;
                    continue;
                }
                return Err(AdminError::NoAnswer {
                    scheduler: self.scheduler.clone(),
                    timeout: deadline - start,
                    connection: self.connection,
                });
            };
            if answer.meta.control.cmd == cmd && answer.meta.timestamp == msg.meta.timestamp {
                return Ok(answer);
            }
        }
    }

    /// Takes in the DEALER monitor's events; a refused handshake is an error.
    fn read_monitor(&mut self) -> Result<(), AdminError> {
        use zmq::SocketEvent as E;
        loop {
            let waiting = self
                .monitor
                .poll(zmq::POLLIN, 0)
                .map_err(zmq_err("polling the DEALER monitor"))?;
            if waiting == 0 {
                return Ok(());
            }
            let event = match crate::auth::read_event(&self.monitor) {
                Ok(Some(event)) => event,
                Ok(None) | Err(zmq::Error::EINTR) => continue,
                Err(e) => return Err(zmq_err("reading the DEALER monitor")(e)),
            };
            match (event.event, self.connection) {
                (e, _) if e == E::HANDSHAKE_SUCCEEDED as u16 => {
                    self.connection = Connection::Accepted
                }
                // Up once and closed: the scheduler stopped or died (a
                // wait there would last its whole timeout for nothing).
                (e, Connection::Accepted) if e == E::DISCONNECTED as u16 => {
                    return Err(AdminError::SchedulerGone {
                        scheduler: self.scheduler.clone(),
                    });
                }
                // Retries follow every failure; they count only connections
                // nothing accepted.
                (e, Connection::Pending) if e == E::CONNECT_RETRIED as u16 => {
                    self.connection = Connection::Failing(1)
                }
                (e, Connection::Failing(n)) if e == E::CONNECT_RETRIED as u16 => {
                    self.connection = Connection::Failing(n + 1)
                }
                (e, c) if e == E::HANDSHAKE_FAILED_NO_DETAIL as u16 => {
                    let times = match c {
                        Connection::Dropped(n) => n + 1,
                        _ => 1,
                    };
                    self.connection = Connection::Dropped(times);
                    // A scheduler with a token hangs up on a client without
                    // one (or sends a greeting it refuses: the next branch).
                    if times >= DROPS_MEAN_A_TOKEN && !self.has_token {
                        let detail = format!(
                            "the scheduler at {} closed the connection during the ZeroMQ \
                             handshake {times} times in a row: it requires a PS_AUTH_TOKEN and \
                             this client presented none (set PS_AUTH_TOKEN to the cluster's \
                             token), or it is not a pslite scheduler",
                            self.scheduler
                        );
                        self.refused = Some(detail.clone());
                        return Err(AdminError::Refused { detail });
                    }
                }
                (e, _)
                    if e == E::HANDSHAKE_FAILED_AUTH as u16
                        || e == E::HANDSHAKE_FAILED_PROTOCOL as u16 =>
                {
                    let detail = refusal(&event, &self.scheduler, self.has_token);
                    self.refused = Some(detail.clone());
                    return Err(AdminError::Refused { detail });
                }
                _ => {}
            }
        }
    }

    /// The next message from the scheduler that is not a request, before
    /// `deadline` (`None` after it); store events go to the event queue.
    /// Anything else (garbage) is skipped. Fails if the scheduler's
    /// connection closes.
    fn receive(&mut self, deadline: Instant) -> Result<Option<Message>, AdminError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let ms = left.as_millis().clamp(1, i64::MAX as u128) as i64;
            let mut items = [
                self.dealer.as_poll_item(zmq::POLLIN),
                self.monitor.as_poll_item(zmq::POLLIN),
            ];
            match zmq::poll(&mut items, ms) {
                Ok(_) => {}
                Err(zmq::Error::EINTR) => continue,
                Err(e) => return Err(zmq_err("waiting for the answer")(e)),
            }
            let (answer_ready, event_ready) = (items[0].is_readable(), items[1].is_readable());
            if event_ready {
                self.read_monitor()?;
            }
            if answer_ready {
                if let Some(msg) = self.read_answer()? {
                    return Ok(Some(msg));
                }
            }
        }
    }

    /// Reads one message from the scheduler's connection: an answer, or
    /// `None` for an event (queued) or garbage.
    fn read_answer(&mut self) -> Result<Option<Message>, AdminError> {
        let frames = match self.dealer.recv_multipart(0) {
            Ok(frames) => frames,
            Err(zmq::Error::EINTR) | Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(e) => return Err(zmq_err("receiving the answer")(e)),
        };
        let mut frames = frames.into_iter();
        let Some(mut meta) = frames.next().and_then(|m| Meta::decode(&m).ok()) else {
            return Ok(None);
        };
        if meta.request {
            return Ok(None);
        }
        meta.sender = SCHEDULER;
        meta.recver = K_EMPTY;
        match meta.store.take() {
            Some(event) if event.op == StoreOp::Event => {
                self.events.push_back(*event);
                Ok(None)
            }
            store => {
                meta.store = store;
                Ok(Some(Message {
                    meta,
                    data: frames.map(Bytes::from).collect(),
                }))
            }
        }
    }

    /// The scheduler's status table: itself first, then every node with its
    /// liveness and the counters it last sent with a heartbeat.
    pub fn status(&mut self, timeout: Duration) -> Result<Vec<NodeStatus>, AdminError> {
        let answer = self.request(Message::control(Command::Status, SCHEDULER), timeout)?;
        Ok(answer.meta.status)
    }
}

impl AdminClient {
    /// Asks the scheduler for a checkpoint labelled `label` (see
    /// `crate::checkpoint`): waits up to `accept` for it to be accepted, then
    /// up to `complete` for it to be written (it is taken at the workers'
    /// next barrier where none has a request in flight). Returns the
    /// scheduler's RESULT: the checkpoint's id, directory and files, or
    /// `error` saying why it was refused or failed (a cluster without
    /// `PS_CHECKPOINT_DIR` refuses at once).
    pub fn checkpoint(
        &mut self,
        label: &str,
        accept: Duration,
        complete: Duration,
    ) -> Result<pslite_proto::checkpoint::CheckpointMsg, AdminError> {
        use pslite_proto::checkpoint::{CheckpointMsg, CheckpointOp};
        let mut req = CheckpointMsg::new(CheckpointOp::Request, 0);
        req.label = label.to_string();
        let mut msg = Message::control(Command::Checkpoint, SCHEDULER);
        msg.meta.checkpoint = Some(Box::new(req));
        let answer = self.exchange(msg, accept, Duration::ZERO)?;
        let ts = answer.meta.timestamp;
        let no_answer = |client: &AdminClient, timeout| AdminError::NoAnswer {
            scheduler: client.scheduler.clone(),
            timeout,
            connection: client.connection,
        };
        let Some(accepted) = answer.meta.checkpoint else {
            return Err(no_answer(self, accept));
        };
        if accepted.op != CheckpointOp::Accepted || !accepted.error.is_empty() {
            return Ok(*accepted);
        }
        let deadline = Instant::now() + complete;
        loop {
            let Some(answer) = self.receive(deadline)? else {
                return Err(no_answer(self, complete));
            };
            if answer.meta.control.cmd != Command::Checkpoint || answer.meta.timestamp != ts {
                continue;
            }
            match answer.meta.checkpoint {
                Some(result) if result.op == CheckpointOp::Result => return Ok(*result),
                _ => continue,
            }
        }
    }

    /// Sends the scheduler store request `req` and waits up to `timeout`
    /// for its answer. A request that waits on the scheduler (GET, WAIT or
    /// MULTI_GET with `req.timeout`) is answered when that wait ends: once
    /// the scheduler is known to be there, the answer may take
    /// [`ANSWER_GRACE`] longer than `timeout` (give `timeout` at least
    /// `req.timeout`).
    pub fn store(
        &mut self,
        req: pslite_proto::store::StoreMsg,
        timeout: Duration,
    ) -> Result<pslite_proto::store::StoreMsg, AdminError> {
        let waits = req.timeout.is_some()
            && matches!(req.op, StoreOp::Get | StoreOp::Wait | StoreOp::MultiGet);
        let grace = if waits { ANSWER_GRACE } else { Duration::ZERO };
        let mut msg = Message::control(Command::Store, SCHEDULER);
        msg.meta.store = Some(Box::new(req));
        let answer = self.exchange(msg, timeout, grace)?;
        answer.meta.store.map(|s| *s).ok_or(AdminError::NoAnswer {
            scheduler: self.scheduler.clone(),
            timeout,
            connection: self.connection,
        })
    }

    /// The next event of this client's store watches (a WATCH request with
    /// a timeout, see [`AdminClient::store`]), waiting up to `timeout`;
    /// `None` if none came. Events arrive on separate connections, so they
    /// may come out of order: order them by [`StoreMsg::version`].
    pub fn store_event(&mut self, timeout: Duration) -> Result<Option<StoreMsg>, AdminError> {
        let deadline = Instant::now() + timeout;
        while self.events.is_empty() {
            // Answers without a request waiting for them are stale: dropped.
            if self.receive(deadline)?.is_none() {
                break;
            }
        }
        Ok(self.events.pop_front())
    }
}

/// Why the scheduler refused this client's handshake, naming the variable
/// to fix (`offered`: whether the client presented a token).
fn refusal(event: &crate::auth::MonitorEvent, scheduler: &str, offered: bool) -> String {
    if event.event == zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u16 {
        format!(
            "the scheduler at {scheduler} refused this client's PS_AUTH_TOKEN (status {}): set \
             PS_AUTH_TOKEN to the cluster's token",
            event.value
        )
    } else if event.value == crate::auth::ZMTP_MECHANISM_MISMATCH && offered {
        format!(
            "the scheduler at {scheduler} does not authenticate (its cluster has no \
             PS_AUTH_TOKEN) but this client presents one: unset PS_AUTH_TOKEN"
        )
    } else if event.value == crate::auth::ZMTP_MECHANISM_MISMATCH {
        format!(
            "the scheduler at {scheduler} requires a PS_AUTH_TOKEN and this client presented \
             none: set PS_AUTH_TOKEN to the cluster's token"
        )
    } else {
        format!(
            "the ZeroMQ handshake with the scheduler at {scheduler} failed (protocol error \
             {:#x}): check PS_AUTH_TOKEN",
            event.value
        )
    }
}

/// The address of this machine on the route to `host:port` (no packet is
/// sent: connecting a UDP socket only picks the route).
fn local_address_towards(host: &str, port: i32) -> Option<String> {
    let target = crate::resolve::bind_ip(host)?;
    let ip: IpAddr = target.parse().ok()?;
    if ip.is_loopback() {
        return Some(ip.to_string());
    }
    let socket = UdpSocket::bind(if ip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).ok()?;
    socket.connect((ip, port.clamp(1, 65535) as u16)).ok()?;
    Some(socket.local_addr().ok()?.ip().to_string())
}
