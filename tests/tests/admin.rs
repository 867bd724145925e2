//! Admin requests (STATUS, STORE) from strangers, against real schedulers
//! (issue 24): the scheduler answers on the requester's own connection and
//! never connects to an address a request names, so a request naming a
//! member's port or thousands of host names that do not resolve costs the
//! cluster nothing; answers a client does not read and requests that wait
//! for keys are bounded in bytes (`PS_STORE_MAX_BYTES`); and `pslite store`
//! waiting on a scheduler that dies fails at once. The metrics endpoint
//! serves scrapes while idle and slow clients hold connections.

use std::time::{Duration, Instant};

use pslite::proto::store::{StoreMsg, StoreOp};
use pslite::{Command, Message, Node, Role};
use pslite_tests::hostile::{assert_exact, ClusterSpec};
use pslite_tests::{free_port, node_command, node_env_with, pslite_command, spawn, within};

/// A stranger's anonymous DEALER to 127.0.0.1:`port`, as an admin client
/// opens one.
fn dealer(ctx: &zmq::Context, port: u16) -> zmq::Socket {
    let socket = ctx.socket(zmq::DEALER).unwrap();
    socket.set_sndtimeo(10_000).unwrap();
    socket.set_linger(0).unwrap();
    socket.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    socket
}

fn send(socket: &zmq::Socket, msg: &Message) {
    let mut frames = vec![msg.meta.encode()];
    frames.extend(msg.data.iter().map(|d| d.to_vec()));
    socket.send_multipart(frames, 0).expect("send");
}

/// A STATUS request naming `host:port` as where to answer (as the old
/// admin clients did).
fn status(host: &str, port: i32) -> Message {
    let mut msg = Message::control(Command::Status, 1);
    msg.meta.request = true;
    msg.meta.timestamp = 1;
    msg.meta.control.node = vec![Node::new(Role::Worker, host, port)];
    msg
}

fn store(req: StoreMsg) -> Message {
    let mut msg = Message::control(Command::Store, 1);
    msg.meta.request = true;
    msg.meta.timestamp = 1;
    msg.meta.store = Some(Box::new(req));
    msg
}

/// Answers that came back on `socket` within `limit`.
fn answers(socket: &zmq::Socket, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    let mut n = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if socket
            .poll(zmq::POLLIN, left.as_millis() as i64)
            .unwrap_or(0)
            == 0
        {
            return n;
        }
        if socket.recv_multipart(0).is_ok() {
            n += 1;
        }
    }
}

#[test]
fn status_requests_naming_members_or_unresolvable_hosts_cost_nothing() {
    let ctx = zmq::Context::new();
    let mut early = None;
    pslite_tests::release_bins(); // built before the clock starts
    let started = Instant::now();
    let mut cluster = ClusterSpec::new().start(|port, _, _| {
        // Before the cluster forms: 2000 requests naming host names that
        // do not resolve (a name lookup each would freeze ZeroMQ's I/O
        // thread, and the cluster would never form).
        let socket = dealer(&ctx, port);
        for i in 0..2000 {
            send(&socket, &status(&format!("h{i}.pslite.invalid"), 9));
        }
        early = Some(socket);
    });
    let formed = started.elapsed();
    // Answered all the same, on the stranger's own connection.
    let early = early.expect("the stranger ran");
    // (30 s: beside this file's 885 MB store test on 2 loaded cores, the
    // full suite once read 1771 in 10 s; alone they come in 11-23 s.)
    assert_eq!(answers(&early, Duration::from_secs(30)), 2000);
    // Mid-job: requests naming every member's port (answering there with
    // the scheduler's identity once took it over on that member).
    cluster.go();
    let socket = dealer(&ctx, cluster.port);
    for _ in 0..20 {
        for (port, _) in cluster.ports() {
            send(&socket, &status("127.0.0.1", i32::from(port)));
        }
    }
    let runs = cluster.wait(Duration::from_secs(120));
    assert_exact(&runs);
    eprintln!("formed {formed:?} after the start despite 2000 unresolvable names");
    assert!(formed < Duration::from_secs(30), "took {formed:?}");
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// The address of the metrics endpoint `node` logged (it runs with
/// `PS_METRICS_PORT` and `PS_VERBOSE=1`).
fn metrics_address(node: &pslite_tests::Spawned) -> std::net::SocketAddr {
    let line = node
        .wait_for_line("metrics on http://", Duration::from_secs(30))
        .expect("no metrics endpoint");
    line.split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("an address")
}

/// One scrape of the metrics endpoint at `addr` (empty if it fails).
fn scrape(addr: &std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut page = String::new();
    if let Ok(mut s) = std::net::TcpStream::connect(addr) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        if s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").is_ok() {
            let _ = s.read_to_string(&mut page);
        }
    }
    page
}

/// The bytes a node has received from peers it does not know (admin
/// clients), by its metrics.
fn bytes_from_strangers(addr: &std::net::SocketAddr) -> u64 {
    scrape(addr)
        .lines()
        .filter(|l| l.starts_with("pslite_bytes_received_total{") && l.contains("peer=\"unknown\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn store_answers_and_waits_are_bounded_in_bytes() {
    let ctx = zmq::Context::new();
    let metrics = free_port();
    let spec = ClusterSpec::new()
        .env("PS_STORE_MAX_BYTES", "256M")
        .env("PS_METRICS_PORT", &metrics.to_string())
        .env("PS_VERBOSE", "1");
    let mut keep = Vec::new();
    let mut cluster = spec.start(|port, _, _| {
        let socket = dealer(&ctx, port);
        let mut set = StoreMsg::request(StoreOp::Set, vec!["big".into()]);
        set.value = Some(vec![7u8; 64 << 20].into());
        send(&socket, &store(set));
        assert_eq!(answers(&socket, Duration::from_secs(30)), 1);
        // 40 GETs of the 64 MiB value and 40 KEYS, from clients that never
        // read their answers (2.6 GB unbounded).
        let greedy: Vec<zmq::Socket> = (0..8).map(|_| dealer(&ctx, port)).collect();
        for i in 0..40 {
            send(
                &greedy[i % 8],
                &store(StoreMsg::request(StoreOp::Get, vec!["big".into()])),
            );
            send(
                &greedy[i % 8],
                &store(StoreMsg::request(StoreOp::Keys, vec![])),
            );
        }
        // 20 WAITs of 10 000 missing 4 KiB keys (40 MB each).
        for i in 0..20 {
            let keys = (0..10_000)
                .map(|k| format!("{i}-{k}-{}", "x".repeat(4080)))
                .collect();
            send(
                &greedy[i % 8],
                &store(StoreMsg::request(StoreOp::Wait, keys)),
            );
        }
        keep = greedy;
    });
    let scheduler_pid = cluster.scheduler.pid();
    // Let the scheduler take everything in: every byte sent has been
    // handed to it (counted from strangers as peer "unknown"; at least the
    // 64 MiB value and the WAITs' keys), then its memory stops changing.
    // Memory alone once "settled" mid-transfer on a loaded machine.
    let addr = metrics_address(&cluster.scheduler);
    let sent = (64u64 << 20) + 20 * 10_000 * 4080;
    let mut received = 0;
    assert!(
        within(Duration::from_secs(120), || {
            received = bytes_from_strangers(&addr);
            received >= sent
        }),
        "the scheduler took in {received} of at least {sent} bytes"
    );
    let mut last = 0;
    assert!(within(Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(300));
        let now = rss_mib(scheduler_pid);
        let settled = now == last;
        last = now;
        settled
    }));
    let held = rss_mib(scheduler_pid);
    eprintln!("scheduler holds {held} MiB with answers unread and waits pending");
    eprintln!("the scheduler took in {received} bytes from its clients");
    // 64 MiB stored, at most 256 MiB of unread answers, waits within the
    // 256 MiB with the store: far below the 2.6 + 2.4 GB it once held.
    assert!(held < 800, "the scheduler holds {held} MiB");
    cluster.go();
    let runs = cluster.wait(Duration::from_secs(120));
    assert_exact(&runs);
    drop(keep);
}

#[test]
fn a_store_wait_fails_at_once_when_the_scheduler_dies() {
    let port = free_port();
    let env = node_env_with(
        "scheduler",
        1,
        1,
        port,
        &[("PS_VERBOSE", "2"), ("PS_START_TIMEOUT", "120")],
    );
    let scheduler = spawn(node_command("kv_app", &env));
    let mut cmd = pslite_command("store");
    cmd.args([
        "--port",
        &port.to_string(),
        "--timeout",
        "60",
        "wait",
        "nope",
    ]);
    let client = spawn(cmd);
    scheduler
        .wait_for_line("Store request", Duration::from_secs(30))
        .expect("the wait never reached the scheduler");
    scheduler.signal(libc::SIGKILL);
    let killed = Instant::now();
    let run = client.wait(Duration::from_secs(70));
    let took = killed.elapsed();
    assert!(!run.ok(), "{}", run.output());
    assert!(
        run.stderr.contains("closed the connection"),
        "{}",
        run.output()
    );
    eprintln!("pslite store wait failed {took:?} after the scheduler was killed");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(scheduler.wait(Duration::from_secs(5)));
}

#[test]
fn the_metrics_endpoint_serves_while_130_idle_connections_are_held() {
    use std::io::{Read, Write};
    let metrics = free_port();
    let mut cluster = ClusterSpec::new()
        .env("PS_METRICS_PORT", &metrics.to_string())
        .env("PS_VERBOSE", "1")
        .start(|_, _, _| {});
    let addr = metrics_address(&cluster.scheduler);
    // The accept backlog's worth of connections that send nothing, and one
    // that sends a byte now and then.
    let idle: Vec<std::net::TcpStream> = (0..130)
        .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
        .collect();
    let mut slow = std::net::TcpStream::connect(addr).expect("connect");
    slow.write_all(b"G").unwrap();
    let started = Instant::now();
    for _ in 0..10 {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut page = String::new();
        s.read_to_string(&mut page).unwrap();
        assert!(page.starts_with("HTTP/1.0 200 OK"), "{page}");
        assert!(page.contains("pslite_uptime_seconds"), "{page}");
    }
    let took = started.elapsed();
    eprintln!("10 scrapes with 131 connections held: {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop((idle, slow));
    cluster.go();
    assert_exact(&cluster.wait(Duration::from_secs(120)));
}
