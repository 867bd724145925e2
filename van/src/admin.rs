//! An admin client: a program that is not a cluster member (`pslite status`,
//! `pslite store`) talking to a running cluster's scheduler.
//!
//! It opens a DEALER (with no identity) to the scheduler and sends it
//! pslite-only requests; the scheduler answers (and sends store events, see
//! [`AdminClient::store_event`]) back on that same connection, through its
//! ROUTER: it never connects to an address a client names. The protocol
//! (which answer completes which call, deadlines, what the DEALER's monitor
//! means: nothing accepting the connection, a scheduler that accepted it and
//! did not answer, a handshake refused over `PS_AUTH_TOKEN`, a connection
//! that closed) is `pslite_van_core::admin`, on the core's tickets: this
//! client moves bytes and waits on a ticket.
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

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use pslite_proto::checkpoint::{CheckpointMsg, CheckpointOp};
use pslite_proto::stats::NodeStatus;
use pslite_proto::store::StoreMsg;
use pslite_van_core::admin::{Admin, Handshake};
pub use pslite_van_core::admin::{AdminError, Connection, ANSWER_GRACE};
use pslite_van_core::Ticket;

/// How the scheduler is reached (see [`AdminClient::connect_via`]).
pub use crate::auth::AuthToken;
pub use crate::transport::Transport;
use crate::{transport, Call, Done, LinkEvent};

fn zmq_err(context: impl Into<String>) -> impl FnOnce(zmq::Error) -> AdminError {
    let context = context.into();
    move |source| AdminError::Zmq {
        context,
        source: std::sync::Arc::new(source),
    }
}

/// A connection to a scheduler for admin requests. See the module docs.
pub struct AdminClient {
    /// The protocol: calls under way, what the connection did.
    admin: Admin,
    /// The DEALER's socket monitor (connections, handshakes, closes).
    monitor: zmq::Socket,
    dealer: zmq::Socket,
    /// This machine's address on the route to the scheduler.
    local: String,
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
            admin: Admin::new(scheduler, token.is_some(), rand::random()),
            monitor,
            dealer,
            local,
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
        self.admin.connection()
    }

    /// The scheduler's status table: itself first, then every node with its
    /// liveness and the counters it last sent with a heartbeat.
    pub fn status(&mut self, timeout: Duration) -> Result<Vec<NodeStatus>, AdminError> {
        Ok(self.call(Call::Status, timeout)?.status()?)
    }

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
    ) -> Result<CheckpointMsg, AdminError> {
        let label = label.to_string();
        let (request, accepted) = self
            .call(Call::Checkpoint { label }, accept)?
            .checkpoint()?;
        if accepted.op != CheckpointOp::Accepted || !accepted.error.is_empty() {
            return Ok(accepted);
        }
        let result = self.call(Call::CheckpointResult { request }, complete)?;
        Ok(result.checkpoint()?.1)
    }

    /// Sends the scheduler store request `req` and waits up to `timeout`
    /// for its answer. A request that waits on the scheduler (GET, WAIT or
    /// MULTI_GET with `req.timeout`) is answered when that wait ends: once
    /// the scheduler is known to be there, the answer may take
    /// [`ANSWER_GRACE`] longer than `timeout` (give `timeout` at least
    /// `req.timeout`).
    pub fn store(&mut self, req: StoreMsg, timeout: Duration) -> Result<StoreMsg, AdminError> {
        Ok(self.call(Call::Store(req), timeout)?.store()?)
    }

    /// The next event of this client's store watches (a WATCH request with
    /// a timeout, see [`AdminClient::store`]), waiting up to `timeout`;
    /// `None` if none came. Events arrive on separate connections, so they
    /// may come out of order: order them by [`StoreMsg::version`].
    pub fn store_event(&mut self, timeout: Duration) -> Result<Option<StoreMsg>, AdminError> {
        let ticket = self.admin.next_event(timeout, Instant::now());
        match self.wait(ticket)? {
            Done::Store(event) => Ok(Some(event)),
            _ => Ok(None),
        }
    }

    /// Sends `call`'s request and waits up to `timeout` for its answer.
    fn call(&mut self, call: Call, timeout: Duration) -> Result<Done, AdminError> {
        let ticket = self.admin.call(call, timeout, Instant::now())?;
        for msg in self.admin.take_output() {
            if let Err(e) = transport::send_message(&mut self.dealer, &msg.meta.encode(), &msg.data)
            {
                self.admin.end_wait(ticket);
                return Err(zmq_err(format!("sending to {}", self.admin.scheduler()))(e));
            }
        }
        self.wait(ticket)
    }

    /// Moves what the scheduler's connection and the DEALER's monitor bring
    /// to the protocol, and the time, until `ticket`'s call ends.
    fn wait(&mut self, ticket: Ticket) -> Result<Done, AdminError> {
        let outcome = self.drive(ticket);
        self.admin.end_wait(ticket);
        outcome
    }

    fn drive(&mut self, ticket: Ticket) -> Result<Done, AdminError> {
        loop {
            let now = Instant::now();
            self.admin.tick(now);
            if let Some(outcome) = self.admin.outcome(ticket) {
                return outcome;
            }
            let ms = self.admin.poll_timeout().map_or(-1, |deadline| {
                let left = deadline.saturating_duration_since(now);
                left.as_millis().clamp(1, i64::MAX as u128) as i64
            });
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
            // An answer that came before the connection closed still counts.
            if answer_ready {
                match self.dealer.recv_multipart(0) {
                    Ok(frames) => self.admin.handle(frames),
                    Err(zmq::Error::EINTR) | Err(zmq::Error::EAGAIN) => {}
                    Err(e) => return Err(zmq_err("receiving the answer")(e)),
                }
            }
            if event_ready {
                self.read_monitor()?;
            }
        }
    }

    /// Hands the DEALER monitor's events to the protocol.
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
            let (e, value) = (event.event, event.value);
            let admin = &mut self.admin;
            if e == E::HANDSHAKE_SUCCEEDED as u16 {
                admin.link_event(LinkEvent::Up);
            } else if e == E::DISCONNECTED as u16 {
                admin.link_event(LinkEvent::Down);
            } else if e == E::CONNECT_RETRIED as u16 {
                admin.link_event(LinkEvent::Unreachable);
            } else if e == E::HANDSHAKE_FAILED_NO_DETAIL as u16 {
                admin.handshake_failed(Handshake::Dropped);
            } else if e == E::HANDSHAKE_FAILED_AUTH as u16 {
                admin.handshake_failed(Handshake::TokenRefused(value));
            } else if e == E::HANDSHAKE_FAILED_PROTOCOL as u16 {
                admin.handshake_failed(if value == crate::auth::ZMTP_MECHANISM_MISMATCH {
                    Handshake::MechanismMismatch
                } else {
                    Handshake::Protocol(value)
                });
            }
        }
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
