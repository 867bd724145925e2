//! The sockets a node listens on: its ROUTER (the port it advertises, the
//! scheduler's port, or a free one; and, for same-host pslite peers, an
//! abstract Unix socket) and the in-process wake-up sockets of its receive
//! loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use log::{debug, info};
use pslite_proto::lock;

use crate::context::{Context, Socket};
use crate::links::zmq_err;
use crate::transport::{self, Transport};
use crate::VanConfig;
use crate::VanError;

/// Pending connections a ROUTER accepts before the kernel drops SYNs.
const LISTEN_BACKLOG: i32 = 4096;

/// The identity of the in-process socket that wakes the receive thread
/// while it reads its ROUTER.
pub(crate) const WAKE_IDENTITY: &[u8] = b"pslite-wake";

/// Also binds `router` to the abstract Unix socket of a same-host pslite
/// node (`PS_IPC`; see [`transport::local_endpoint`]); whether it could.
pub(crate) fn bind_local(router: &zmq::Socket, host: &str, pid: u32, port: i32) -> bool {
    let endpoint = transport::local_endpoint(host, pid, port);
    match router.bind(&endpoint) {
        Ok(()) => {
            debug!("also listening on {endpoint} for same-host peers");
            true
        }
        Err(e) => {
            info!("same-host peers use TCP: cannot bind {endpoint}: {e}");
            false
        }
    }
}

/// Wakes the receive thread, whether it reads its ROUTER (a message from
/// [`WAKE_IDENTITY`] on it) or, not reading, waits on its own socket.
pub(crate) struct Waker {
    router: Mutex<Socket>,
    side: Mutex<Socket>,
}

impl Waker {
    /// The waker of `router`'s receive loop, and the socket the loop waits
    /// on while it does not read `router`.
    pub(crate) fn new(ctx: &Context, router: &zmq::Socket) -> Result<(Waker, Socket), VanError> {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let endpoint = format!("inproc://pslite-wake-{pid}-{n}");
        router
            .bind(&endpoint)
            .map_err(zmq_err("binding the wake-up endpoint"))?;
        let to_router = ctx
            .socket(zmq::DEALER)
            .map_err(zmq_err("creating the wake-up socket"))?;
        to_router
            .set_identity(WAKE_IDENTITY)
            .map_err(zmq_err("setting the wake-up identity"))?;
        to_router
            .set_linger(0)
            .map_err(zmq_err("setting LINGER on the wake-up socket"))?;
        to_router
            .connect(&endpoint)
            .map_err(zmq_err("connecting the wake-up socket"))?;
        let side_endpoint = format!("inproc://pslite-wake-side-{pid}-{n}");
        let side_rx = ctx
            .socket(zmq::PULL)
            .map_err(zmq_err("creating the side wake-up socket"))?;
        side_rx
            .bind(&side_endpoint)
            .map_err(zmq_err("binding the side wake-up socket"))?;
        let side = ctx
            .socket(zmq::PUSH)
            .map_err(zmq_err("creating the side wake-up socket"))?;
        side.set_linger(0)
            .map_err(zmq_err("setting LINGER on the side wake-up socket"))?;
        side.connect(&side_endpoint)
            .map_err(zmq_err("connecting the side wake-up socket"))?;
        let waker = Waker {
            router: Mutex::new(to_router),
            side: Mutex::new(side),
        };
        Ok((waker, side_rx))
    }

    /// Wakes the receive thread. Never blocks: the loop may have gone.
    pub(crate) fn wake(&self) {
        let _ = lock(&self.router).send(&b"wake"[..], zmq::DONTWAIT);
        let _ = lock(&self.side).send(&b"wake"[..], zmq::DONTWAIT);
    }
}

/// Removes the socket file of this node's `ipc:///tmp/<port>` ROUTER
/// (`DMLC_LOCAL=1`) once the ROUTER is closed: libzmq 4.3 unlinks the file
/// of a named ipc endpoint only when it binds it again, so each node would
/// leave one behind. A file that is not a socket is left alone.
pub(crate) fn remove_ipc_file(transport: Transport, port: i32) {
    use std::os::unix::fs::FileTypeExt;
    if transport != Transport::Ipc || port <= 0 {
        return;
    }
    let path = std::path::PathBuf::from(format!("/tmp/{port}"));
    let is_socket = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
    if is_socket {
        if let Err(e) = std::fs::remove_file(&path) {
            log::debug!("cannot remove {}: {e}", path.display());
        }
    }
}

/// Binds the ROUTER of the node `config` describes and returns the port it
/// listens on (the scheduler's port, `PORT`, or a free one).
pub(crate) fn bind_router(router: &zmq::Socket, config: &VanConfig) -> Result<i32, VanError> {
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
            router.bind(&endpoint).map_err(|source| VanError::Bind {
                endpoint,
                source: std::sync::Arc::new(source),
            })?;
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
            router.bind(&endpoint).map_err(|source| VanError::Bind {
                endpoint,
                source: std::sync::Arc::new(source),
            })?;
            Ok(port)
        }
        None => {
            let endpoint = Transport::Tcp.bind_endpoint(&ip, 0).replace(":0", ":*");
            router.bind(&endpoint).map_err(|source| VanError::Bind {
                endpoint: endpoint.clone(),
                source: std::sync::Arc::new(source),
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
