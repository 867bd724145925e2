//! The metrics endpoint (`PS_METRICS_PORT`): a node's counters in
//! Prometheus' text format at `http://host:port/metrics`.
//!
//! The server is a few dozen lines of std-only HTTP/1.0 on purpose: a scrape
//! endpoint answers one GET at a time with a small text body and closes the
//! connection, which needs no keep-alive, chunking, TLS or async runtime. A
//! crate such as `tiny_http` would bring all of that (and its dependencies)
//! into every node for nothing, and the `prometheus` / `metrics` crates would
//! keep a second registry next to our atomics. One thread serves every
//! connection at once over non-blocking sockets; each has a deadline and a
//! size limit, so idle, slow or hostile clients cannot hold the endpoint;
//! anything but `GET /metrics` (or `GET /`) gets 404 or 405.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use pslite_proto::stats::NodeCounters;
use pslite_proto::{Node, K_EMPTY};
use pslite_van::counters::OTHER_PEER;
use pslite_van::shm::ShmStats;

/// How long a client may take to send its request and read the answer.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request head accepted.
const MAX_REQUEST: usize = 8192;
/// When the configured port is taken (another node of the same machine has
/// it), the next free one of this many is used.
const PORT_TRIES: u16 = 100;

/// What the endpoint serves: a fresh rendering on every scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A running metrics endpoint; dropping it stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `render()` on `bind_ip`, on `port` or, if that is taken, the
    /// first free port after it (port 0: any free port).
    pub fn start(bind_ip: &str, port: u16, render: Render) -> io::Result<MetricsServer> {
        let listener = bind(bind_ip, port)?;
        let addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let thread = std::thread::Builder::new()
            .name("pslite-metrics".into())
            .spawn(move || serve(listener, &stop, &render))?;
        info!("metrics on http://{addr}/metrics");
        Ok(MetricsServer {
            addr,
            stopping,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the accept call with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn bind(bind_ip: &str, port: u16) -> io::Result<TcpListener> {
    let ip = if bind_ip.contains(':') {
        format!("[{bind_ip}]")
    } else {
        bind_ip.to_string()
    };
    if port == 0 {
        return TcpListener::bind(format!("{ip}:0"));
    }
    let mut last = None;
    for p in (port..=u16::MAX).take(PORT_TRIES as usize) {
        match TcpListener::bind(format!("{ip}:{p}")) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "no free port")))
}

/// Connections served at once; the oldest idle one is dropped to make room.
const MAX_CONNECTIONS: usize = 512;

/// Connections one client address may hold at once; past it, that
/// address's oldest idle connection is dropped, so a client that holds
/// idle connections crowds out only itself.
const MAX_PER_CLIENT: usize = 64;

/// A connection younger than this that has sent nothing yet is no idle
/// client: its request may be on the way (a scrape connects, then writes).
const IDLE_GRACE: Duration = Duration::from_millis(500);

/// The listen backlog: a client that opens hundreds of connections at once
/// must not fill the kernel's queue of unaccepted ones, where a scrape's
/// SYN would be dropped (and retried only a second later).
const BACKLOG: libc::c_int = 4096;

/// One client: what it sent, what is left to write, and until when it may
/// take.
struct Client {
    stream: TcpStream,
    peer: Option<std::net::IpAddr>,
    head: Vec<u8>,
    out: Vec<u8>,
    written: usize,
    deadline: Instant,
}

/// Serves every connection at once from one thread, without blocking on
/// any: sockets are non-blocking and polled, and each connection has
/// [`READ_TIMEOUT`] in all to send its request and read the answer. Idle
/// or slow clients cost a slot each, never a scrape.
fn serve(listener: TcpListener, stopping: &AtomicBool, render: &Render) {
    if let Err(e) = listener.set_nonblocking(true) {
        warn!("metrics: cannot serve: {e}");
        return;
    }
    // std listens with a backlog of 128; listen(2) again raises it.
    // SAFETY: listen(2) on a socket this thread owns; no memory is passed.
    if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) } != 0 {
        debug!(
            "metrics: cannot raise the listen backlog: {}",
            io::Error::last_os_error()
        );
    }
    let mut clients: Vec<Client> = Vec::new();
    while !stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        clients.retain(|c| c.deadline > now);
        let mut fds = vec![libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        fds.extend(clients.iter().map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: if c.out.is_empty() {
                libc::POLLIN
            } else {
                libc::POLLOUT
            },
            revents: 0,
        }));
        let wait = clients
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let ready = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis().max(1) as i32,
            )
        };
        if ready <= 0 {
            continue;
        }
        let mut done = vec![false; clients.len()];
        for (i, client) in clients.iter_mut().enumerate() {
            if fds[i + 1].revents != 0 {
                done[i] = step(client, render);
            }
        }
        let mut i = 0;
        clients.retain(|_| {
            i += 1;
            !done[i - 1]
        });
        if fds[0].revents != 0 {
            accept(&listener, &mut clients, render);
        }
    }
}

/// Takes every pending connection.
fn accept(listener: &TcpListener, clients: &mut Vec<Client>, render: &Render) {
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                let peer = Some(from.ip());
                let mine = clients.iter().filter(|c| c.peer == peer).count();
                if mine >= MAX_PER_CLIENT {
                    drop_idle(clients, |c| c.peer == peer, render);
                }
                if clients.len() >= MAX_CONNECTIONS && !drop_idle(clients, |_| true, render) {
                    clients.remove(0);
                }
                clients.push(Client {
                    stream,
                    peer,
                    head: Vec::new(),
                    out: Vec::new(),
                    written: 0,
                    deadline: Instant::now() + READ_TIMEOUT,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                debug!("metrics: accept failed: {e}");
                return;
            }
        }
    }
}

/// Frees a slot among the `clients` that `pick` picks: the oldest one that
/// has sent nothing for [`IDLE_GRACE`] (what it sent meanwhile is read
/// first: a scrape whose request arrived is served, not dropped). Returns
/// whether one went.
fn drop_idle(clients: &mut Vec<Client>, pick: impl Fn(&Client) -> bool, render: &Render) -> bool {
    let now = Instant::now();
    let mut i = 0;
    while i < clients.len() {
        let c = &clients[i];
        let accepted = c.deadline.checked_sub(READ_TIMEOUT).unwrap_or(now);
        let candidate = pick(c)
            && c.head.is_empty()
            && c.out.is_empty()
            && now.saturating_duration_since(accepted) >= IDLE_GRACE;
        if candidate {
            let done = step(&mut clients[i], render);
            if done || clients[i].head.is_empty() {
                clients.remove(i);
                return true;
            }
        }
        i += 1;
    }
    false
}

/// Reads what a client sent or writes what is left of its answer; true
/// once it is done with (answered, gone, or broken).
fn step(client: &mut Client, render: &Render) -> bool {
    if client.out.is_empty() {
        let mut buf = [0u8; 1024];
        loop {
            match client.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(n) => client.head.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return true,
            }
            if client.head.len() > MAX_REQUEST {
                break;
            }
        }
        match answer(&client.head, render) {
            Some(out) => client.out = out,
            None => return false,
        }
    }
    loop {
        match client.stream.write(&client.out[client.written..]) {
            Ok(0) => return true,
            Ok(n) => {
                client.written += n;
                if client.written == client.out.len() {
                    return true;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
}

/// The answer to a request head, once it is complete (`None` before).
fn answer(head: &[u8], render: &Render) -> Option<Vec<u8>> {
    if head.len() > MAX_REQUEST {
        return Some(respond("413 Payload Too Large", "request too large\n"));
    }
    let complete =
        head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n");
    if !complete {
        return None;
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    Some(match (method, path) {
        ("GET", "/metrics") => respond("200 OK", &render()),
        ("GET", "/") => respond("200 OK", "pslite node: see /metrics\n"),
        ("GET", _) => respond("404 Not Found", "not found: try /metrics\n"),
        _ => respond("405 Method Not Allowed", "only GET\n"),
    })
}

fn respond(status: &str, body: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

/// `node`'s counters in Prometheus' text format, and what its shared-memory
/// path did (`shm`, when it is on). Every series carries the node's id and
/// role; per-peer series also the peer's id (`unknown` for traffic with
/// peers that had no id yet).
pub fn render(node: &Node, c: &NodeCounters, shm: Option<&ShmStats>) -> String {
    let id = if node.id == K_EMPTY {
        "none".to_string()
    } else {
        node.id.to_string()
    };
    let labels = format!("node=\"{id}\",role=\"{}\"", node.role);
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (extra, value) in rows {
            let _ = writeln!(out, "{name}{{{labels}{extra}}} {value}");
        }
    };
    let peer = |p: i32| match p {
        OTHER_PEER => ",peer=\"unknown\"".to_string(),
        p => format!(",peer=\"{p}\""),
    };
    type Field = fn(&pslite_proto::stats::PeerCounters) -> u64;
    let per_peer: [(&str, &str, Field); 4] = [
        (
            "pslite_messages_sent_total",
            "Messages sent, per peer (resends included).",
            |p| p.messages_sent,
        ),
        (
            "pslite_bytes_sent_total",
            "Bytes sent (meta and data frames), per peer.",
            |p| p.bytes_sent,
        ),
        (
            "pslite_messages_received_total",
            "Messages received, per peer.",
            |p| p.messages_received,
        ),
        (
            "pslite_bytes_received_total",
            "Bytes received (meta and data frames), per peer.",
            |p| p.bytes_received,
        ),
    ];
    for (name, help, field) in per_peer {
        let rows = c
            .peers
            .iter()
            .map(|p| (peer(p.peer), field(p).to_string()))
            .collect();
        family(name, "counter", help, rows);
    }
    family(
        "pslite_resends_total",
        "counter",
        "Messages sent again because they were not acknowledged in time.",
        vec![(String::new(), c.resends.to_string())],
    );
    family(
        "pslite_dropped_total",
        "counter",
        "Received messages dropped, by reason.",
        [
            ("malformed", c.dropped_malformed),
            ("unknown_peer", c.dropped_unknown_peer),
            ("injected", c.dropped_injected),
            ("duplicate", c.dropped_duplicate),
            ("hold_limit", c.dropped_hold_limit),
        ]
        .into_iter()
        .map(|(reason, n)| (format!(",reason=\"{reason}\""), n.to_string()))
        .collect(),
    );
    family(
        "pslite_requests_in_flight",
        "gauge",
        "Requests sent whose responses have not all arrived.",
        vec![(String::new(), c.requests_in_flight.to_string())],
    );
    family(
        "pslite_handler_calls_total",
        "counter",
        "Requests handled by this node's apps.",
        vec![(String::new(), c.handler_calls.to_string())],
    );
    family(
        "pslite_handler_seconds_total",
        "counter",
        "Time spent in request handlers.",
        vec![(
            String::new(),
            format!("{:.9}", c.handler_nanos as f64 / 1e9),
        )],
    );
    family(
        "pslite_uptime_seconds",
        "gauge",
        "How long the node has been running.",
        vec![(String::new(), format!("{:.3}", c.uptime.as_secs_f64()))],
    );
    if let Some(s) = shm {
        let shm_families: [(&str, &str, &AtomicU64); 6] = [
            (
                "pslite_shm_frames_sent_total",
                "Data frames sent to same-host peers through shared memory.",
                &s.frames_sent,
            ),
            (
                "pslite_shm_bytes_sent_total",
                "Bytes of those frames.",
                &s.bytes_sent,
            ),
            (
                "pslite_shm_frames_sent_without_copy_total",
                "Frames sent through shared memory as a descriptor of a copy made before.",
                &s.cache_hits,
            ),
            (
                "pslite_shm_fallbacks_total",
                "Frames sent over ZeroMQ because no segment was free.",
                &s.fallbacks,
            ),
            (
                "pslite_shm_frames_received_total",
                "Data frames received through shared memory.",
                &s.frames_received,
            ),
            (
                "pslite_shm_rejected_total",
                "Shared-memory descriptors rejected (their messages dropped).",
                &s.rejected,
            ),
        ];
        for (name, help, n) in shm_families {
            family(
                name,
                "counter",
                help,
                vec![(String::new(), n.load(Ordering::Relaxed).to_string())],
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pslite_proto::stats::PeerCounters;
    use pslite_proto::Role;

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn renders_prometheus_text() {
        let mut node = Node::new(Role::Worker, "127.0.0.1", 9000);
        node.id = 9;
        let c = NodeCounters {
            peers: vec![
                PeerCounters {
                    peer: 0,
                    messages_sent: 1,
                    bytes_sent: 40,
                    ..PeerCounters::default()
                },
                PeerCounters {
                    peer: 8,
                    bytes_received: 1234,
                    ..PeerCounters::default()
                },
            ],
            dropped_injected: 3,
            handler_nanos: 1_500_000_000,
            ..NodeCounters::default()
        };
        let shm = ShmStats::default();
        shm.cache_hits.store(7, Ordering::Relaxed);
        assert!(!render(&node, &c, None).contains("pslite_shm_"));
        let text = render(&node, &c, Some(&shm));
        for line in [
            "# TYPE pslite_bytes_sent_total counter",
            "pslite_bytes_sent_total{node=\"9\",role=\"worker\",peer=\"unknown\"} 40",
            "pslite_bytes_received_total{node=\"9\",role=\"worker\",peer=\"8\"} 1234",
            "pslite_dropped_total{node=\"9\",role=\"worker\",reason=\"injected\"} 3",
            "pslite_handler_seconds_total{node=\"9\",role=\"worker\"} 1.500000000",
            "# TYPE pslite_shm_frames_sent_without_copy_total counter",
            "pslite_shm_frames_sent_without_copy_total{node=\"9\",role=\"worker\"} 7",
            "pslite_shm_rejected_total{node=\"9\",role=\"worker\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn serves_get_and_refuses_the_rest() {
        let server = MetricsServer::start("127.0.0.1", 0, Arc::new(|| "x 1\n".into())).unwrap();
        let ok = get(server.addr(), "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nx 1\n"), "{ok}");
        assert!(get(server.addr(), "GET /nope HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
        assert!(get(server.addr(), "POST /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 405"));
        // A client that sends garbage and hangs up does not stop the server.
        drop(TcpStream::connect(server.addr()).unwrap());
        assert!(get(server.addr(), "GET / HTTP/1.0\r\n\r\n").contains("/metrics"));
    }

    #[test]
    fn scrapes_are_served_while_idle_and_slow_clients_hold_connections() {
        let server = MetricsServer::start("127.0.0.1", 0, Arc::new(|| "x 1\n".into())).unwrap();
        // 130 connections that send nothing (the accept backlog), and one
        // that sends a byte a second.
        let idle: Vec<TcpStream> = (0..130)
            .map(|_| TcpStream::connect(server.addr()).unwrap())
            .collect();
        let mut slow = TcpStream::connect(server.addr()).unwrap();
        slow.write_all(b"G").unwrap();
        let started = Instant::now();
        for _ in 0..5 {
            let ok = get(server.addr(), "GET /metrics HTTP/1.0\r\n\r\n");
            assert!(ok.ends_with("x 1\n"), "{ok}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        // The slow one is cut off at its deadline, whatever it sends.
        let _ = slow.write_all(b"E");
        slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        let cut = slow.read_to_end(&mut rest);
        assert!(cut.is_err() || rest.is_empty(), "{rest:?}");
        drop(idle);
    }

    #[test]
    fn a_client_that_holds_many_connections_crowds_out_only_itself() {
        let server = MetricsServer::start("127.0.0.1", 0, Arc::new(|| "x 1\n".into())).unwrap();
        let port = server.addr().port();
        // Another client (127.0.0.2 is loopback too) connects first and is
        // slow to send its request.
        let mut other = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let from = |ip: &str| {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.bind(&format!("{ip}:0").parse::<SocketAddr>().unwrap().into())
                .unwrap();
            sock.connect(&server.addr().into()).unwrap();
            TcpStream::from(sock)
        };
        let mut held: Vec<TcpStream> = (0..MAX_PER_CLIENT).map(|_| from("127.0.0.2")).collect();
        // Idle for longer than the grace (a connection's age is what is
        // tested here, so this sleep is the subject, not synchronisation).
        std::thread::sleep(IDLE_GRACE + Duration::from_millis(100));
        held.extend((0..10).map(|_| from("127.0.0.2")));
        // The holder's 10 oldest were dropped, well before their deadline.
        let started = Instant::now();
        for mut s in held.iter().take(10) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut rest = Vec::new();
            assert!(matches!(s.read_to_end(&mut rest), Ok(0)), "{rest:?}");
        }
        assert!(started.elapsed() < READ_TIMEOUT);
        // The other client, older than all of them, is still served.
        other.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut page = String::new();
        other.read_to_string(&mut page).unwrap();
        assert!(page.ends_with("x 1\n"), "{page}");
        drop(held);
    }

    #[test]
    fn a_taken_port_moves_to_the_next_free_one() {
        let first = MetricsServer::start("127.0.0.1", 0, Arc::new(String::new)).unwrap();
        let port = first.addr().port();
        let second = MetricsServer::start("127.0.0.1", port, Arc::new(String::new)).unwrap();
        assert_ne!(second.addr().port(), port);
    }
}
