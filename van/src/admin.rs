//! An admin client: a program that is not a cluster member (`pslite status`)
//! talking to a running cluster's scheduler.
//!
//! It binds a ROUTER of its own on a free port, opens a DEALER (with no
//! identity) to the scheduler and sends it pslite-only requests carrying the
//! ROUTER's address in their one node entry; the scheduler answers (and
//! sends store events, see [`AdminClient::store_event`]) from a DEALER of its
//! own to that address, one per client. Every wait has a deadline,
//! so a scheduler that is gone (or is C++ ps-lite, which does not know these
//! requests) gives a clear error instead of a hang.
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

use pslite_proto::ids::SCHEDULER;
use pslite_proto::stats::NodeStatus;
use pslite_proto::store::{StoreMsg, StoreOp};
use pslite_proto::{Command, Message, Meta, Node, Role, K_EMPTY};

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
    /// The host to listen on for answers does not resolve.
    #[error("cannot listen for the scheduler's answer: host {0:?} does not resolve; pass an IP address of this machine that the scheduler can reach")]
    Resolve(String),
    /// No answer came back in time.
    #[error(
        "no answer from the scheduler at {scheduler} within {:.1} s: is a pslite scheduler \
         running there (check DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT), and can it reach this \
         machine at {reply_to}?",
        timeout.as_secs_f64()
    )]
    NoAnswer {
        /// The scheduler's address.
        scheduler: String,
        /// Where the answer was expected.
        reply_to: String,
        /// How long we waited.
        timeout: Duration,
    },
}

fn zmq_err(context: impl Into<String>) -> impl FnOnce(zmq::Error) -> AdminError {
    let context = context.into();
    move |source| AdminError::Zmq { context, source }
}

/// A connection to a scheduler for admin requests. See the module docs.
pub struct AdminClient {
    router: zmq::Socket,
    /// Store events that arrived while waiting for an answer.
    events: VecDeque<StoreMsg>,
    dealer: zmq::Socket,
    me: Node,
    scheduler: String,
    // Dropped last: the sockets above belong to it.
    _ctx: zmq::Context,
}

impl AdminClient {
    /// Prepares requests to the scheduler at `scheduler_host:scheduler_port`.
    /// Answers come back to `reply_host` (default: this machine's address
    /// on the route to the scheduler, which is 127.0.0.1 for a local one).
    pub fn connect(
        scheduler_host: &str,
        scheduler_port: i32,
        reply_host: Option<&str>,
    ) -> Result<AdminClient, AdminError> {
        AdminClient::connect_via(
            Transport::Tcp,
            scheduler_host,
            scheduler_port,
            reply_host,
            None,
        )
    }

    /// [`AdminClient::connect`] to a scheduler listening on `transport`
    /// (IPC for a `DMLC_LOCAL=1` cluster; answers still come over TCP),
    /// presenting `token` to a cluster that runs with `PS_AUTH_TOKEN` (and
    /// accepting the scheduler's answer only with it).
    pub fn connect_via(
        transport: Transport,
        scheduler_host: &str,
        scheduler_port: i32,
        reply_host: Option<&str>,
        token: Option<&crate::AuthToken>,
    ) -> Result<AdminClient, AdminError> {
        let reply_host = match reply_host {
            Some(host) => host.to_string(),
            None => local_address_towards(scheduler_host, scheduler_port)
                .ok_or_else(|| AdminError::Resolve(scheduler_host.to_string()))?,
        };
        let ip = crate::resolve::bind_ip(&reply_host)
            .ok_or_else(|| AdminError::Resolve(reply_host.clone()))?;
        let ctx = zmq::Context::new();
        let router = ctx
            .socket(zmq::ROUTER)
            .map_err(zmq_err("creating the ROUTER"))?;
        router.set_linger(0).map_err(zmq_err("setting LINGER"))?;
        if let Some(token) = token {
            crate::auth::serve_router(&ctx, &router, token)?;
        }
        let endpoint = Transport::Tcp.bind_endpoint(&ip, 0).replace(":0", ":*");
        router
            .bind(&endpoint)
            .map_err(zmq_err(format!("binding {endpoint}")))?;
        let bound = router
            .get_last_endpoint()
            .map_err(zmq_err("reading the bound endpoint"))?
            .unwrap_or_default();
        let port: i32 = bound
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| AdminError::Zmq {
                context: format!("reading the port of {bound:?}"),
                source: zmq::Error::EINVAL,
            })?;
        let dealer = ctx
            .socket(zmq::DEALER)
            .map_err(zmq_err("creating a DEALER"))?;
        dealer.set_linger(0).map_err(zmq_err("setting LINGER"))?;
        crate::auth::secure_dealer(&dealer, token)?;
        let scheduler = transport.connect_endpoint(scheduler_host, scheduler_port);
        dealer
            .connect(&scheduler)
            .map_err(zmq_err(format!("connecting to {scheduler}")))?;
        Ok(AdminClient {
            router,
            events: VecDeque::new(),
            dealer,
            me: Node::new(Role::Worker, reply_host, port),
            scheduler,
            _ctx: ctx,
        })
    }

    /// Where this client listens for answers.
    pub fn reply_address(&self) -> String {
        self.me.address()
    }

    /// Sends the scheduler a `cmd` request (the caller fills in anything
    /// else in `msg`) and waits up to `timeout` for its answer.
    pub fn request(&mut self, mut msg: Message, timeout: Duration) -> Result<Message, AdminError> {
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
        msg.meta.control.node = vec![self.me.clone()];
        transport::send_message(&mut self.dealer, &msg.meta.encode(), &msg.data)
            .map_err(zmq_err(format!("sending to {}", self.scheduler)))?;
        let deadline = Instant::now() + timeout;
        loop {
            let Some(answer) = self.receive(deadline)? else {
                return Err(AdminError::NoAnswer {
                    scheduler: self.scheduler.clone(),
                    reply_to: self.reply_address(),
                    timeout,
                });
            };
            if answer.meta.control.cmd == cmd && answer.meta.timestamp == msg.meta.timestamp {
                return Ok(answer);
            }
        }
    }

    /// The next message from the scheduler that is not a request, before
    /// `deadline` (`None` after it); store events go to the event queue.
    /// Anything else (garbage, another sender) is skipped.
    fn receive(&mut self, deadline: Instant) -> Result<Option<Message>, AdminError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            self.router
                .set_rcvtimeo(ms)
                .map_err(zmq_err("setting the receive timeout"))?;
            let raw = match transport::recv_message(&self.router) {
                Ok(raw) => raw,
                Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => continue,
                Err(e) => return Err(zmq_err("receiving the answer")(e)),
            };
            let Some(mut meta) = raw.meta.as_deref().and_then(|m| Meta::decode(m).ok()) else {
                continue;
            };
            if raw.sender != SCHEDULER || meta.request {
                continue;
            }
            meta.sender = raw.sender;
            meta.recver = K_EMPTY;
            match meta.store.take() {
                Some(event) if event.op == StoreOp::Event => self.events.push_back(*event),
                store => {
                    meta.store = store;
                    return Ok(Some(Message {
                        meta,
                        data: raw.data,
                    }));
                }
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
    /// Sends the scheduler store request `req` and waits up to `timeout`
    /// for its answer (a GET or WAIT waits on the scheduler for
    /// `req.timeout`: give `timeout` more than that).
    pub fn store(
        &mut self,
        req: pslite_proto::store::StoreMsg,
        timeout: Duration,
    ) -> Result<pslite_proto::store::StoreMsg, AdminError> {
        let mut msg = Message::control(Command::Store, SCHEDULER);
        msg.meta.store = Some(Box::new(req));
        let answer = self.request(msg, timeout)?;
        answer.meta.store.map(|s| *s).ok_or(AdminError::NoAnswer {
            scheduler: self.scheduler.clone(),
            reply_to: self.reply_address(),
            timeout,
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
