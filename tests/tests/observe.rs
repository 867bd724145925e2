//! Observability on real clusters: `pslite status` against a running demo
//! job (separate processes, heartbeats carrying counters), the metrics
//! endpoint scraped during a job, and the demo's chart.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use pslite::{DefaultHandle, KVOptions, KVServer, KVWorker, SArray};
use pslite_tests::{free_port, pslite_bin, run, spawn, LocalCluster};

/// Runs `pslite status` with `args` (bounded) and returns (exit ok, stdout, stderr).
fn status(port: u16, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(pslite_bin());
    cmd.arg("status")
        .arg("--port")
        .arg(port.to_string())
        .args(args);
    let r = run(cmd, Duration::from_secs(20));
    assert!(!r.timed_out, "pslite status hung");
    (r.ok(), r.stdout.clone(), r.stderr.clone())
}

#[test]
fn status_shows_a_running_job_with_every_nodes_counters() {
    let port = free_port();
    let mut demo = Command::new(pslite_bin());
    demo.args(["demo", "--port", &port.to_string(), "--epochs", "200"])
        .args(["--samples", "20000", "--timeout", "120"])
        .env("PS_HEARTBEAT_INTERVAL", "1");
    let job = spawn(demo);
    assert!(
        job.wait_for_line(" 1/200  test loss", Duration::from_secs(60))
            .is_some(),
        "the demo did not start training"
    );
    // Every node reports its counters with its next heartbeat (1 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let json = loop {
        let (ok, out, err) = status(port, &["--json"]);
        assert!(ok, "pslite status failed: {err}");
        let answering = out.matches("\"answering\":true").count();
        // Servers and workers have moved more than 100 kB each (their
        // first heartbeat, at joining, reports almost nothing).
        let big = out
            .split("\"bytes_sent\":")
            .skip(1)
            .filter_map(|s| s.split([',', '}']).next()?.parse::<u64>().ok())
            .filter(|&b| b > 100_000)
            .count();
        if answering == 5 && !out.contains("\"counters\":null") && big >= 4 {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "not every node reported counters:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(json.starts_with(&format!("{{\"scheduler\":\"127.0.0.1:{port}\"")));
    assert_eq!(json.matches("\"role\":\"scheduler\"").count(), 1, "{json}");
    assert_eq!(json.matches("\"role\":\"server\"").count(), 2, "{json}");
    assert_eq!(json.matches("\"role\":\"worker\"").count(), 2, "{json}");
    assert_eq!(json.matches("\"dead\":false").count(), 5, "{json}");
    for id in [1, 8, 9, 10, 11] {
        assert!(
            json.contains(&format!("{{\"id\":{id},")),
            "node {id} missing: {json}"
        );
    }
    let (ok, table, err) = status(port, &[]);
    assert!(ok, "{err}");
    assert!(table.contains("2 servers, 2 workers"), "{table}");
    assert_eq!(table.matches("  alive").count(), 5, "{table}");
    assert!(table.contains("msgs sent  bytes sent"), "{table}");
    assert!(!table.contains("NO ANSWER"), "{table}");

    job.signal(libc::SIGKILL);
    let run = job.wait(Duration::from_secs(20));
    assert!(!run.timed_out);
}

#[test]
fn status_without_a_scheduler_fails_within_its_deadline() {
    let port = free_port();
    pslite_bin(); // built before the clock starts
    let started = Instant::now();
    let (ok, _, err) = status(port, &["--timeout", "0.5"]);
    assert!(!ok);
    assert!(
        err.contains("no answer from the scheduler") && err.contains("within 0.5 s"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn status_watch_stops_once_the_scheduler_is_gone_for_stale() {
    let cluster = LocalCluster::start(1, 1);
    let port = cluster.scheduler.config().van.scheduler_port as u16;
    let mut cmd = Command::new(pslite_bin());
    cmd.args(["status", "--port", &port.to_string()]).args([
        "--watch",
        "0.2",
        "--stale",
        "2",
        "--timeout",
        "1",
    ]);
    let watch = spawn(cmd);
    assert!(
        watch
            .wait_for_line("1 server, 1 worker", Duration::from_secs(20))
            .is_some(),
        "the watch never showed the cluster"
    );
    cluster.finalize();
    let gone = Instant::now();
    let r = watch.wait(Duration::from_secs(30));
    assert!(!r.timed_out, "--watch kept going:\n{}", r.output());
    assert_eq!(r.code(), Some(1), "{}", r.output());
    assert!(
        r.stderr.contains(&format!(
            "the scheduler at 127.0.0.1:{port} has not answered for"
        )) && r.stderr.contains("(--stale 2): the job has ended"),
        "{}",
        r.output()
    );
    // Gone for --stale, not much more (the last ask is cut to what is left).
    assert!(
        gone.elapsed() < Duration::from_secs(10),
        "{:?}",
        gone.elapsed()
    );
}

#[test]
fn status_names_a_missing_or_wrong_token() {
    const TOKEN: &str = "status secret";
    let cluster = LocalCluster::start_with_token(1, 1, TOKEN);
    let port = cluster.scheduler.config().van.scheduler_port as u16;
    for (token, expected) in [
        (None, "requires a PS_AUTH_TOKEN"),
        (Some("wrong"), "refused this client's PS_AUTH_TOKEN"),
        (Some(TOKEN), ""),
    ] {
        let mut cmd = Command::new(pslite_bin());
        cmd.args(["status", "--port", &port.to_string(), "--timeout", "20"])
            .env_remove("PS_AUTH_TOKEN");
        if let Some(token) = token {
            cmd.env("PS_AUTH_TOKEN", token);
        }
        let r = run(cmd, Duration::from_secs(30));
        if expected.is_empty() {
            assert!(r.ok(), "{}", r.output());
            assert!(r.stdout.contains("1 server, 1 worker"), "{}", r.output());
            continue;
        }
        assert_eq!(r.code(), Some(1), "{}", r.output());
        // Without a token the scheduler may only hang up: that names the
        // token too.
        assert!(
            r.stderr.contains(expected)
                || (token.is_none() && r.stderr.contains("it requires a PS_AUTH_TOKEN")),
            "{token:?}: {}",
            r.output()
        );
        assert!(r.elapsed < Duration::from_secs(10), "took {:?}", r.elapsed);
    }
    cluster.finalize();
}

fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("cannot reach the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.0 200 OK"), "{out}");
    out
}

/// The value of the series `name{labels}` in a Prometheus text page.
fn metric(page: &str, series: &str) -> u64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{page}"))
}

#[test]
fn metrics_endpoint_counts_the_bytes_a_job_moves() {
    let c = LocalCluster::start_with(1, 1, |cfg| cfg.metrics_port = Some(0));
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    server.set_request_handle(DefaultHandle::new().into_handle());
    let kv = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    const KEYS: u64 = 10_000;
    const PUSHES: u64 = 5;
    // The last two pushes send one key array (80 KB: shared memory) twice.
    let same = SArray::from_vec((0..KEYS).map(|k| k * 7).collect::<Vec<u64>>());
    for round in 0..PUSHES {
        let keys = if round + 2 >= PUSHES {
            same.clone()
        } else {
            SArray::from_vec((0..KEYS).map(|k| k * 7).collect::<Vec<u64>>())
        };
        let vals = SArray::from_vec(vec![round as f32; KEYS as usize]);
        kv.zpush(keys, vals, KVOptions::new())
            .unwrap()
            .wait()
            .unwrap();
    }
    let worker_page = scrape(c.workers[0].metrics_addr().expect("worker metrics"));
    let server_addr = c.servers[0].metrics_addr().expect("server metrics");
    let server_page = scrape(server_addr);
    assert!(
        scrape(c.scheduler.metrics_addr().expect("scheduler metrics"))
            .contains("role=\"scheduler\"")
    );

    let sent = metric(
        &worker_page,
        "pslite_bytes_sent_total{node=\"9\",role=\"worker\",peer=\"8\"}",
    );
    let received = metric(
        &server_page,
        "pslite_bytes_received_total{node=\"8\",role=\"server\",peer=\"9\"}",
    );
    let msgs = metric(
        &worker_page,
        "pslite_messages_sent_total{node=\"9\",role=\"worker\",peer=\"8\"}",
    );
    // The pushes moved 8-byte keys and 4-byte values; each message adds its
    // meta frame (tens of bytes).
    let data = PUSHES * KEYS * 12;
    assert_eq!(sent, received, "both ends count the same bytes");
    assert_eq!(msgs, PUSHES);
    assert!(
        sent >= data && sent <= data + 100 * msgs,
        "sent {sent}, data {data}"
    );
    // The handler is counted when it returns, just after it answered.
    let deadline = Instant::now() + Duration::from_secs(20);
    let handler_calls = "pslite_handler_calls_total{node=\"8\",role=\"server\"}";
    while metric(&scrape(server_addr), handler_calls) < PUSHES {
        assert!(
            Instant::now() < deadline,
            "the server's handler calls were not counted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(metric(&scrape(server_addr), handler_calls), PUSHES);
    assert_eq!(
        metric(
            &worker_page,
            "pslite_requests_in_flight{node=\"9\",role=\"worker\"}"
        ),
        0
    );
    // Nodes of one process share a host: the keys went through shared
    // memory, the last time without a copy (the values, 40 KB, did not).
    let worker_shm = |name: &str| {
        metric(
            &worker_page,
            &format!("pslite_shm_{name}_total{{node=\"9\",role=\"worker\"}}"),
        )
    };
    assert_eq!(worker_shm("frames_sent"), PUSHES);
    assert_eq!(worker_shm("bytes_sent"), PUSHES * KEYS * 8);
    assert_eq!(worker_shm("frames_sent_without_copy"), 1);
    assert_eq!(worker_shm("fallbacks"), 0);
    assert_eq!(
        metric(
            &server_page,
            "pslite_shm_frames_received_total{node=\"8\",role=\"server\"}"
        ),
        PUSHES
    );
    // The Postoffice API reads the same counters.
    let api = c.workers[0].counters();
    let to_server = api.peers.iter().find(|p| p.peer == 8).unwrap();
    assert_eq!(to_server.bytes_sent, sent);
    drop((kv, server));
    c.finalize();
}

#[test]
fn the_demo_plots_one_point_per_epoch() {
    let dir = std::env::temp_dir().join(format!("pslite-observe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg_path = dir.join("curve.svg");
    let mut demo = Command::new(pslite_bin());
    demo.args([
        "demo",
        "--epochs",
        "3",
        "--samples",
        "20000",
        "--threshold",
        "0.6",
    ])
    .arg("--plot")
    .arg(&svg_path);
    let r = run(demo, Duration::from_secs(120));
    let svg = std::fs::read_to_string(&svg_path);
    std::fs::remove_dir_all(&dir).unwrap();
    r.assert_ok();
    // Output is not a terminal: plain lines, no progress bar.
    assert!(
        !r.stdout
            .lines()
            .any(|l| l.contains("] ") && l.contains("minibatches")),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("chart of loss and accuracy per epoch"),
        "{}",
        r.stdout
    );
    let svg = svg.expect("no chart written");
    let doc = roxmltree::Document::parse(&svg).expect("the chart is not well-formed XML");
    let points = doc
        .descendants()
        .filter(|n| n.has_tag_name("circle"))
        .count();
    assert_eq!(
        points,
        2 * 4,
        "epochs 0..=3, on the loss and the accuracy curves"
    );
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    for label in ["epoch", "held-out loss", "held-out accuracy"] {
        assert!(
            texts.iter().any(|t| t.contains(label)),
            "no axis label {label:?}"
        );
    }
}

/// One scrape of `addr` with `limit` for each step: the page, or why not.
fn try_scrape(addr: SocketAddr, limit: Duration) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, limit).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read: {e}"))?;
    if out.starts_with("HTTP/1.0 200 OK") {
        Ok(out)
    } else {
        Err(format!("answered {out:?}"))
    }
}

#[test]
fn metrics_are_served_while_hundreds_of_idle_connections_are_held() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let port = free_port();
    let metrics_port = free_port();
    let metrics = metrics_port.to_string();
    let extra = [("PS_METRICS_PORT", metrics.as_str())];
    let nodes: Vec<_> = ["scheduler", "server", "worker"]
        .iter()
        .map(|role| {
            let env = pslite_tests::node_env_with(role, 1, 1, port, &extra);
            let mut cmd = pslite_tests::node_command("store_watch", &env);
            cmd.arg("never-set");
            spawn(cmd)
        })
        .collect();
    assert!(
        nodes[2]
            .wait_for_line("watching never-set", Duration::from_secs(30))
            .is_some(),
        "the cluster did not form"
    );
    // Some node serves the first port (the others the next ones).
    let addr: SocketAddr = format!("127.0.0.1:{metrics_port}").parse().unwrap();
    assert!(
        pslite_tests::within(Duration::from_secs(10), || try_scrape(
            addr,
            Duration::from_secs(1)
        )
        .is_ok()),
        "no metrics at {addr}"
    );
    // 499 connections that never send anything, each opened again as soon
    // as the endpoint closes it (a client that holds idle connections).
    const IDLE: usize = 499;
    let stop = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicUsize::new(0));
    let holder = {
        let (stop, open) = (Arc::clone(&stop), Arc::clone(&open));
        std::thread::spawn(move || {
            let mut held: Vec<Option<TcpStream>> = (0..IDLE).map(|_| None).collect();
            while !stop.load(Ordering::SeqCst) {
                for slot in &mut held {
                    let closed = slot.as_ref().is_none_or(|s| {
                        let mut byte = [0u8; 1];
                        !matches!(s.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                    });
                    if closed {
                        *slot = TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                            .ok()
                            .filter(|s| s.set_nonblocking(true).is_ok());
                    }
                }
                open.store(held.iter().flatten().count(), Ordering::SeqCst);
                // Load, not synchronisation: how often the holder reopens.
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    assert!(
        pslite_tests::within(Duration::from_secs(20), || open.load(Ordering::SeqCst)
            >= IDLE),
        "could not hold {IDLE} connections (held {})",
        open.load(Ordering::SeqCst)
    );
    // Spread over several of the endpoint's 2 s idle deadlines, so some
    // scrapes meet the holder's bursts of new connections.
    let mut failed = Vec::new();
    for round in 0..8 {
        let scrapers: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(move || try_scrape(addr, Duration::from_secs(1))))
            .collect();
        for (i, s) in scrapers.into_iter().enumerate() {
            if let Err(e) = s.join().unwrap() {
                failed.push(format!("scrape {round}.{i}: {e}"));
            }
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    stop.store(true, Ordering::SeqCst);
    holder.join().unwrap();
    for node in &nodes {
        node.signal(libc::SIGKILL);
    }
    assert!(
        failed.is_empty(),
        "{} of 64 scrapes failed while {IDLE} idle connections were held: {failed:?}",
        failed.len()
    );
}
