//! The driver's watch on its DEALERs: one thread reads every DEALER's
//! ZeroMQ socket monitor and reports what happens to each connection (up,
//! closed, refused during the handshake) to a callback; the core decides
//! what it means ([`crate::Core::link_event`]).
//!
//! A DEALER is watched from before it connects ([`Monitors::watch`] sets up
//! its monitor, then the caller connects it), so no event is lost. The
//! thread's sockets do not keep the ZeroMQ context alive: once the Van
//! drops the context, they fail with `ETERM` and the thread ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;

use log::debug;
use pslite_proto::lock;

use crate::auth::{detached_socket, read_event, MonitorEvent};
use crate::context::Context;
use crate::VanError;
pub use pslite_van_core::LinkEvent;

/// Which events a watch asks libzmq for.
const EVENTS: u16 = zmq::SocketEvent::HANDSHAKE_SUCCEEDED as u16
    | zmq::SocketEvent::DISCONNECTED as u16
    | zmq::SocketEvent::CONNECT_RETRIED as u16
    | zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u16
    | zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL as u16
    | zmq::SocketEvent::MONITOR_STOPPED as u16;

/// One socket to watch: its tag, the monitor's socket and the endpoint the
/// DEALER connects to (for messages).
type Watch = (u64, zmq::Socket, String);

/// The monitor thread's handle: hands it new watches.
pub struct Monitors {
    ctx: Context,
    next: AtomicU64,
    new: Mutex<(mpsc::Sender<Watch>, zmq::Socket)>,
}

impl Monitors {
    /// Starts the monitor thread of `ctx`; `report(tag, event)` is called
    /// on it for each event of a watched socket.
    pub fn start(
        ctx: &Context,
        report: impl Fn(u64, LinkEvent) + Send + 'static,
    ) -> Result<Monitors, VanError> {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let wake_endpoint = format!(
            "inproc://pslite-monitors-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        let wake_rx = detached_socket(ctx, zmq::PULL)?;
        wake_rx.bind(&wake_endpoint).map_err(zmq_err("binding"))?;
        let wake_tx = detached_socket(ctx, zmq::PUSH)?;
        wake_tx.set_linger(0).map_err(zmq_err("setting LINGER"))?;
        wake_tx
            .connect(&wake_endpoint)
            .map_err(zmq_err("connecting"))?;
        let (tx, rx) = mpsc::channel::<Watch>();
        std::thread::Builder::new()
            .name("pslite-monitor".into())
            .spawn(move || run(wake_rx, rx, report))
            .map_err(|e| VanError::Setup {
                what: "start the monitor thread",
                detail: e.to_string(),
            })?;
        Ok(Monitors {
            ctx: ctx.clone(),
            next: AtomicU64::new(0),
            new: Mutex::new((tx, wake_tx)),
        })
    }

    /// Watches `socket` (before it connects to `endpoint`); returns the tag
    /// its events are reported with.
    pub fn watch(&self, socket: &zmq::Socket, endpoint: &str) -> Result<u64, VanError> {
        let tag = self.next.fetch_add(1, Ordering::Relaxed);
        let monitor_endpoint = format!(
            "inproc://pslite-link-{}-{}-{tag}",
            std::process::id(),
            self as *const Monitors as usize
        );
        socket
            .monitor(&monitor_endpoint, i32::from(EVENTS))
            .map_err(zmq_err("monitoring a DEALER"))?;
        let monitor = detached_socket(&self.ctx, zmq::PAIR)?;
        monitor
            .connect(&monitor_endpoint)
            .map_err(zmq_err("connecting a DEALER's monitor"))?;
        let new = lock(&self.new);
        // The thread may be gone (the Van is stopping): nothing to watch.
        let _ = new.0.send((tag, monitor, endpoint.to_string()));
        let _ = new.1.send(&b""[..], zmq::DONTWAIT);
        Ok(tag)
    }
}

fn zmq_err(context: &'static str) -> impl FnOnce(zmq::Error) -> VanError {
    crate::transport::zmq_err(format!("{context} (socket monitors)"))
}

/// The monitor thread: polls every watch and the wake-up socket until the
/// context ends.
fn run(wake: zmq::Socket, new: mpsc::Receiver<Watch>, report: impl Fn(u64, LinkEvent)) {
    let mut watches: HashMap<u64, (zmq::Socket, String)> = HashMap::new();
    loop {
        let tags: Vec<u64> = watches.keys().copied().collect();
        let mut items: Vec<zmq::PollItem> = Vec::with_capacity(tags.len() + 1);
        items.push(wake.as_poll_item(zmq::POLLIN));
        items.extend(tags.iter().map(|t| watches[t].0.as_poll_item(zmq::POLLIN)));
        match zmq::poll(&mut items, -1) {
            Ok(_) => {}
            Err(zmq::Error::EINTR) => continue,
            Err(_) => break,
        }
        let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
        drop(items);
        if ready[0] {
            if matches!(wake.recv_bytes(zmq::DONTWAIT), Err(zmq::Error::ETERM)) {
                break;
            }
            for (tag, socket, endpoint) in new.try_iter() {
                watches.insert(tag, (socket, endpoint));
            }
        }
        for (tag, _) in tags.iter().zip(&ready[1..]).filter(|(_, &r)| r) {
            let Some((socket, endpoint)) = watches.get(tag) else {
                continue;
            };
            let event = match read_event(socket) {
                Ok(Some(event)) => event,
                Ok(None) | Err(zmq::Error::EINTR) | Err(zmq::Error::EAGAIN) => continue,
                Err(_) => {
                    watches.remove(tag);
                    continue;
                }
            };
            if event.event == zmq::SocketEvent::MONITOR_STOPPED as u16 {
                watches.remove(tag);
                continue;
            }
            if let Some(link) = link_event(&event, endpoint) {
                report(*tag, link);
            }
        }
    }
    debug!("monitor thread stopped");
}

/// What a monitor event means for the connection.
fn link_event(event: &MonitorEvent, endpoint: &str) -> Option<LinkEvent> {
    let e = event.event;
    if e == zmq::SocketEvent::HANDSHAKE_SUCCEEDED as u16 {
        Some(LinkEvent::Up)
    } else if e == zmq::SocketEvent::DISCONNECTED as u16 {
        Some(LinkEvent::Down)
    } else if e == zmq::SocketEvent::CONNECT_RETRIED as u16 {
        Some(LinkEvent::Unreachable)
    } else if e == zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u16
        || e == zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL as u16
    {
        Some(LinkEvent::Refused(crate::auth::refusal_message(
            event, endpoint,
        )))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_dealers_connection_is_reported_up_then_down_when_the_peer_goes() {
        let ctx = Context::new(0).unwrap();
        let (tx, rx) = mpsc::channel();
        let monitors = Monitors::start(&ctx, move |tag, e| {
            let _ = tx.send((tag, e));
        })
        .unwrap();
        let peer_ctx = zmq::Context::new();
        let router = peer_ctx.socket(zmq::ROUTER).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = router.get_last_endpoint().unwrap().unwrap();
        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_linger(0).unwrap();
        let tag = monitors.watch(&dealer, &endpoint).unwrap();
        dealer.connect(&endpoint).unwrap();
        let wait = Duration::from_secs(10);
        assert_eq!(rx.recv_timeout(wait).unwrap(), (tag, LinkEvent::Up));
        drop(router);
        drop(peer_ctx);
        assert_eq!(rx.recv_timeout(wait).unwrap(), (tag, LinkEvent::Down));
        drop(dealer);
        drop(monitors);
        // The thread's sockets do not hold the context: this returns.
        drop(ctx);
    }
}
