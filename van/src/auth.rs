//! Cluster authentication (`PS_AUTH_TOKEN`): ZeroMQ's PLAIN mechanism with
//! an in-process ZAP handler that accepts exactly one secret.
//!
//! With a token, every node's ROUTER is a PLAIN server and every DEALER a
//! PLAIN client presenting the token as its password. A peer without the
//! token is refused during the ZeroMQ handshake, before any of its frames
//! reach the Van: it cannot register, send data or control messages, nor
//! receive anything. Without a token nothing here runs and the wire stays
//! exactly ps-lite's (NULL mechanism), so C++ nodes can join.
//!
//! PLAIN sends the token in clear text: it keeps strangers out of a cluster,
//! it does not hide traffic from someone who can read the network. The
//! bundled libzmq is built without CURVE (the `zmq-sys` crate only enables it
//! when linking a system libsodium), so encryption is left to the network
//! (a VPN, WireGuard, a private Kubernetes network).
//!
//! One auth thread per ZeroMQ context answers ZAP requests and reads the
//! ROUTER's monitor to log refused peers. Its sockets do not hold a reference
//! to the context, so dropping the context (when the Van stops) makes them
//! fail with `ETERM` and the thread closes them and ends.

use std::sync::atomic::{AtomicU64, Ordering};

use log::{debug, warn};

pub use pslite_van_core::AuthToken;

use crate::{LogOnce, VanError};

/// The ZAP endpoint libzmq asks (RFC 27), one per context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";
/// The ZAP domain our ROUTERs declare.
const ZAP_DOMAIN: &str = "pslite";
/// The PLAIN user name our DEALERs present (the token is the password).
const USERNAME: &str = "pslite";
/// Refused peers logged once each, up to this many (a stranger retrying
/// every 100 ms must not flood the log).
const MAX_LOGGED_PEERS: usize = 256;
/// libzmq's protocol error for a peer speaking another security mechanism.
pub(crate) const ZMTP_MECHANISM_MISMATCH: u32 = 0x1100_0002;

use crate::transport::zmq_err;

/// A fresh in-process endpoint for a socket monitor.
pub(crate) fn monitor_endpoint(what: &str) -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    format!(
        "inproc://pslite-auth-{what}-{}",
        COUNT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A socket of `ctx` that does not keep `ctx` alive: once the context is
/// dropped, calls on it fail with `ETERM`.
pub(crate) fn detached_socket(
    ctx: &crate::context::Context,
    kind: zmq::SocketType,
) -> Result<zmq::Socket, VanError> {
    ctx.detached(kind)
        .map_err(zmq_err("creating an auth or monitor socket"))
}

/// Makes `router` (not yet bound) a PLAIN server that accepts only `token`,
/// and starts the context's auth thread (the ZAP handler). Call once per
/// context, before binding.
pub(crate) fn serve_router(
    ctx: &crate::context::Context,
    router: &zmq::Socket,
    token: &AuthToken,
) -> Result<(), VanError> {
    let zap = detached_socket(ctx, zmq::REP)?;
    zap.bind(ZAP_ENDPOINT)
        .map_err(zmq_err("binding the ZAP handler (one per context)"))?;
    let monitor_endpoint = monitor_endpoint("router");
    router
        .monitor(
            &monitor_endpoint,
            (zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL as u16
                | zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u16
                | zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL as u16) as i32,
        )
        .map_err(zmq_err("monitoring the ROUTER"))?;
    let monitor = detached_socket(ctx, zmq::PAIR)?;
    monitor
        .connect(&monitor_endpoint)
        .map_err(zmq_err("connecting the ROUTER monitor"))?;
    router
        .set_zap_domain(ZAP_DOMAIN)
        .map_err(zmq_err("setting the ZAP domain"))?;
    router
        .set_plain_server(true)
        .map_err(zmq_err("making the ROUTER a PLAIN server"))?;
    let token = token.clone();
    std::thread::Builder::new()
        .name("pslite-auth".into())
        .spawn(move || auth_loop(zap, monitor, token))
        .map_err(|e| VanError::Setup {
            what: "start the auth thread",
            detail: e.to_string(),
        })?;
    Ok(())
}

/// Makes `dealer` (not yet connected) a PLAIN client presenting `token`.
pub fn secure_dealer(dealer: &zmq::Socket, token: Option<&AuthToken>) -> Result<(), VanError> {
    let Some(token) = token else {
        return Ok(());
    };
    dealer
        .set_plain_username(Some(USERNAME))
        .map_err(zmq_err("setting the PLAIN user name"))?;
    dealer
        .set_plain_password(Some(token.secret()))
        .map_err(zmq_err("setting the PLAIN password"))
}

/// Why the scheduler at `endpoint` refused us (a handshake-failure event
/// of the DEALER's monitor), naming the variable to fix.
pub(crate) fn refusal_message(event: &MonitorEvent, endpoint: &str) -> String {
    if event.event == zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u16 {
        format!(
            "the scheduler at {endpoint} refused this node's PS_AUTH_TOKEN \
             (status {}): set the same PS_AUTH_TOKEN on every node",
            event.value
        )
    } else if event.value == ZMTP_MECHANISM_MISMATCH {
        format!(
            "the scheduler at {endpoint} does not authenticate nodes but this node has \
             PS_AUTH_TOKEN set: set the same PS_AUTH_TOKEN on every node, or unset it \
             (C++ ps-lite nodes cannot authenticate)"
        )
    } else {
        format!(
            "the authentication handshake with the scheduler at {endpoint} failed \
             (ZeroMQ protocol error {:#x}): check PS_AUTH_TOKEN on every node",
            event.value
        )
    }
}

/// One event from a ZeroMQ socket monitor.
pub(crate) struct MonitorEvent {
    /// The raw event id (compared with `zmq::SocketEvent::X as u16`;
    /// `SocketEvent::from_raw` panics on ids it does not know).
    pub(crate) event: u16,
    /// The event's value (an error code for failed handshakes).
    pub(crate) value: u32,
    /// The endpoint it concerns.
    pub(crate) address: String,
}

/// Reads one monitor event (`None`: a malformed one, skipped).
pub(crate) fn read_event(monitor: &zmq::Socket) -> zmq::Result<Option<MonitorEvent>> {
    let head = monitor.recv_msg(0)?;
    let address = if head.get_more() {
        let address = monitor.recv_msg(0)?;
        String::from_utf8_lossy(&address).into_owned()
    } else {
        String::new()
    };
    if head.len() < 6 {
        return Ok(None);
    }
    let event = u16::from_ne_bytes([head[0], head[1]]);
    let value = u32::from_ne_bytes([head[2], head[3], head[4], head[5]]);
    Ok(Some(MonitorEvent {
        event,
        value,
        address,
    }))
}

/// The auth thread: answers ZAP requests and logs refused peers until the
/// context ends.
fn auth_loop(zap: zmq::Socket, monitor: zmq::Socket, token: AuthToken) {
    let mut logged = LogOnce::with_max_keys(log::Level::Error, MAX_LOGGED_PEERS);
    let mut hung_up = LogOnce::with_max_keys(log::Level::Warn, MAX_LOGGED_PEERS);
    loop {
        let mut items = [
            zap.as_poll_item(zmq::POLLIN),
            monitor.as_poll_item(zmq::POLLIN),
        ];
        match zmq::poll(&mut items, -1) {
            Ok(_) => {}
            Err(zmq::Error::EINTR) => continue,
            Err(_) => break,
        }
        let (zap_ready, monitor_ready) = (items[0].is_readable(), items[1].is_readable());
        if zap_ready {
            match answer_zap(&zap, &token) {
                Ok(Some(refused)) => {
                    logged.log(refused.clone(), || {
                        format!(
                            "refused a node at {refused}: it presented a wrong PS_AUTH_TOKEN \
                             (every node of the cluster must set the same one)"
                        )
                    });
                }
                Ok(None) => {}
                Err(zmq::Error::EINTR) | Err(zmq::Error::EAGAIN) => {}
                Err(_) => break,
            }
        }
        if monitor_ready {
            match read_event(&monitor) {
                Ok(Some(event)) => {
                    if let Some(line) = refused_peer_line(&event) {
                        let key = format!("{} {}", event.event, event.address);
                        // A peer that hung up before authenticating may be
                        // a port probe or scan: a warning. A mechanism
                        // mismatch is a node without the token: an error.
                        if event.event == zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL as u16 {
                            hung_up.log(key, || line);
                        } else {
                            logged.log(key, || line);
                        }
                    }
                }
                Ok(None) | Err(zmq::Error::EINTR) | Err(zmq::Error::EAGAIN) => {}
                Err(_) => break,
            }
        }
    }
    debug!("auth thread stopped");
}

/// A log line for a handshake the ROUTER refused, if the ZAP handler has
/// not already said why.
fn refused_peer_line(event: &MonitorEvent) -> Option<String> {
    let line = if event.event == zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u16 {
        return None; // the ZAP handler logged it with the peer's address
    } else if event.event == zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL as u16 {
        // The peer hung up first (it saw our PLAIN greeting and gave up).
        "the peer left during the authentication handshake: a node without \
         PS_AUTH_TOKEN (a C++ ps-lite node cannot authenticate), or a port probe"
            .to_string()
    } else if event.value == ZMTP_MECHANISM_MISMATCH {
        "the peer presented no PS_AUTH_TOKEN (a node without PS_AUTH_TOKEN, or a C++ \
         ps-lite node, which cannot authenticate)"
            .to_string()
    } else {
        format!(
            "the authentication handshake failed (ZeroMQ protocol error {:#x})",
            event.value
        )
    };
    Some(format!("refused a connection on {}: {line}", event.address))
}

/// Answers one ZAP request (RFC 27): 200 for the token, 400 otherwise.
/// Returns the peer's address when it was refused.
fn answer_zap(zap: &zmq::Socket, token: &AuthToken) -> zmq::Result<Option<String>> {
    let frames = zap.recv_multipart(0)?;
    // version, request id, domain, address, identity, mechanism, credentials
    let field = |i: usize| frames.get(i).map(Vec::as_slice).unwrap_or_default();
    let request_id = field(1).to_vec();
    let address = String::from_utf8_lossy(field(3)).into_owned();
    let accepted =
        frames.len() >= 8 && field(0) == b"1.0" && field(5) == b"PLAIN" && token.matches(field(7));
    if frames.len() < 2 || field(0) != b"1.0" {
        warn!("malformed ZAP request ({} frames): refusing", frames.len());
    }
    let (status, text): (&[u8], &[u8]) = if accepted {
        (b"200", b"OK")
    } else {
        (b"400", b"wrong PS_AUTH_TOKEN")
    };
    let user: &[u8] = if accepted { USERNAME.as_bytes() } else { b"" };
    zap.send_multipart([&b"1.0"[..], &request_id, status, text, user, b""], 0)?;
    Ok((!accepted).then_some(address))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tokens() {
        assert!(AuthToken::new("").is_none());
        assert!(AuthToken::new(&"x".repeat(256)).is_none());
        assert!(AuthToken::new("a\0b").is_none());
        let t = AuthToken::new("s3cret").unwrap();
        assert!(t.matches(b"s3cret"));
        assert!(!t.matches(b"s3creT"));
        assert!(!t.matches(b"s3cret!"));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "AuthToken(<hidden>)");
    }

    #[test]
    fn bundled_libzmq_has_no_curve() {
        // PLAIN is always built (zmq_has does not list it); CURVE needs
        // libsodium, which zmq-sys only links from the system.
        assert_eq!(zmq::has("curve"), Some(false));
    }

    /// A ROUTER on a free loopback port, protected by `token` if given,
    /// and its endpoint.
    fn router(token: Option<&str>) -> (crate::context::Socket, String) {
        let ctx = crate::context::Context::new(0).unwrap();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        if let Some(token) = token {
            serve_router(&ctx, &router, &AuthToken::new(token).unwrap()).unwrap();
        }
        router.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = router.get_last_endpoint().unwrap().unwrap();
        (router, endpoint)
    }

    /// A DEALER in a context of its own (another process, as far as
    /// ZeroMQ's authentication goes), offering `offered` (or no token).
    fn dealer(offered: Option<&str>) -> (crate::context::Context, crate::context::Socket) {
        let client = crate::context::Context::new(0).unwrap();
        let dealer = client.socket(zmq::DEALER).unwrap();
        dealer.set_linger(0).unwrap();
        secure_dealer(&dealer, offered.and_then(AuthToken::new).as_ref()).unwrap();
        (client, dealer)
    }

    /// Why a DEALER offering `offered` is refused by a ROUTER protected by
    /// `token` (none: a plain one), as the link monitors report it.
    fn refusal(token: Option<&str>, offered: &str) -> String {
        let (_router, endpoint) = router(token);
        let (client, dealer) = dealer(Some(offered));
        let (tx, rx) = std::sync::mpsc::channel();
        let monitors = crate::monitor::Monitors::start(&client, move |_, e| {
            if let crate::monitor::LinkEvent::Refused(why) = e {
                let _ = tx.send(why);
            }
        })
        .unwrap();
        monitors.watch(&dealer, &endpoint).unwrap();
        dealer.connect(&endpoint).unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    /// A ROUTER with a token, a DEALER with `offered` (or none): whether a
    /// message gets through within a short wait.
    fn delivered(offered: Option<&str>) -> bool {
        let (router, endpoint) = router(Some("right"));
        let (_client, dealer) = dealer(offered);
        dealer.connect(&endpoint).unwrap();
        dealer.send(&b"hello"[..], 0).unwrap();
        router.poll(zmq::POLLIN, 2000).unwrap() > 0
    }

    #[test]
    fn only_the_token_gets_through() {
        assert!(delivered(Some("right")));
        assert!(!delivered(Some("wrong")));
        assert!(!delivered(None));
    }

    #[test]
    fn a_refused_client_is_told_why() {
        let reason = refusal(Some("right"), "wrong");
        assert!(
            reason.contains("refused this node's PS_AUTH_TOKEN"),
            "{reason}"
        );
    }

    #[test]
    fn a_client_without_auth_against_a_plain_server_is_refused() {
        let reason = refusal(None, "mine");
        assert!(reason.contains("does not authenticate nodes"), "{reason}");
    }
}
