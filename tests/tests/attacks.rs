//! Hostile peers and unlucky operators, as real processes: a raw ZeroMQ
//! peer (forged, well-formed control and data messages) against a running
//! `kv_app` cluster, and nodes killed with SIGKILL under default settings.
//! In each, the job finishes exact, or every survivor fails promptly with a
//! typed error naming the cause; none hangs, and no single forged message
//! costs a node.

use std::time::{Duration, Instant};

use pslite::{Command as Cmd, Message, Node, Role};
use pslite_tests::hostile::{
    assert_exact, kv_env as env, two_ports, wait_listening, Attacker, Cluster, ClusterSpec,
};
use pslite_tests::{free_port, kv_push, node_command, spawn, spawn_with_stdin, Spawned};

#[test]
fn a_forged_node_table_does_not_kill_a_forming_server() {
    let cluster = ClusterSpec::new().start(|port, servers, _| {
        // Claiming the scheduler's identity, before the cluster forms: a
        // table without this server, then one giving it a worker's id.
        let attacker = Attacker::new(Some("ps1"), servers.0);
        let mut table = Message::control(Cmd::AddNode, 8);
        let mut stranger = Node::new(Role::Server, "10.1.2.3", 4);
        stranger.id = 8;
        let mut scheduler = Node::new(Role::Scheduler, "127.0.0.1", i32::from(port));
        scheduler.id = 1;
        table.meta.control.node = vec![stranger, scheduler.clone()];
        table.meta.timestamp = 0;
        attacker.send(&table);
        let mut me = Node::new(Role::Server, "127.0.0.1", i32::from(servers.0));
        me.id = 9;
        table.meta.control.node = vec![me, scheduler];
        attacker.send(&table);
        // The real scheduler must be able to take identity ps1 later.
        drop(attacker);
    });
    let runs = cluster.finish(Duration::from_secs(120));
    assert_exact(&runs);
    assert!(
        runs[1].stderr.contains("ignoring a node table"),
        "{}",
        runs[1].output()
    );
}

#[test]
fn forged_data_and_terminate_are_dropped_and_the_job_stays_exact() {
    let cluster = ClusterSpec::new().start(|_, _, _| {});
    let (port, servers, workers) = (cluster.port, cluster.server_ports, cluster.worker_ports);
    // To server 8, from ps10 (a server: servers send no KV requests): a
    // push of huge values on every key the workers use.
    let from_server = Attacker::new(Some("ps10"), servers.0);
    // To worker 9, from ps11 (a worker: workers send no KV responses):
    // responses to every timestamp it will use.
    let from_worker = Attacker::new(Some("ps11"), workers.0);
    // And TERMINATE to everyone, from identities they do not hold.
    let terminators: Vec<Attacker> = [port, servers.0, servers.1, workers.0, workers.1]
        .into_iter()
        .map(|p| Attacker::new(Some("ps12"), p))
        .collect();
    let keys: Vec<u64> = (0..2000u64).map(|i| u64::MAX / 2000 * i).collect();
    let key_frame: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
    let val_frame: Vec<u8> = keys.iter().flat_map(|_| 1e9f32.to_le_bytes()).collect();
    for ts in 0..40 {
        let push = kv_push(ts, key_frame.clone(), val_frame.clone());
        from_server.send(&push);
        let mut response = push.clone();
        response.meta.request = false;
        response.meta.pull = true;
        from_worker.send(&response);
    }
    for t in &terminators {
        let mut stop = Message::control(Cmd::Terminate, 8);
        stop.meta.timestamp = 0;
        t.send(&stop);
    }
    let runs = cluster.finish(Duration::from_secs(120));
    assert_exact(&runs);
    // Between pslite nodes a member's identity carries its key: the forged
    // ones are refused before anything else is looked at, and said so once.
    let (run, id) = (&runs[1], "ps10");
    let line = format!("ignoring messages with identity {id}:");
    assert_eq!(run.stderr.matches(&line).count(), 1, "{}", run.output());
    assert!(run.stderr.contains("from 127.0.0.1:"), "{}", run.output());
    // A worker holds no other worker in its table (it talks to servers and
    // the scheduler only): another worker's identity is no member's, and
    // what comes with it is dropped as from a stranger, said once.
    let run = &runs[3];
    let line = "dropping a data message from node 11: its sender is not in the node table";
    assert_eq!(run.stderr.matches(line).count(), 1, "{}", run.output());
}

/// Kills `victim` ("scheduler", "server" or "worker": the one with the
/// higher id) once the workers are ready, lets them go, and checks that
/// every other node exits non-zero within `bound`, naming `cause`.
fn survivors_fail(victim: &str, cause: &str, bound: Duration) {
    let c = ClusterSpec::new().start(|_, _, _| {});
    let mut nodes: Vec<(&str, Spawned)> = vec![("scheduler", c.scheduler)];
    nodes.extend(c.servers.into_iter().map(|s| ("server", s)));
    nodes.extend(c.workers.into_iter().map(|w| ("worker", w)));
    let at = nodes
        .iter()
        .rposition(|(role, _)| *role == victim)
        .expect("no such victim");
    let (_, killed) = nodes.remove(at);
    killed.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    drop(killed.wait(Duration::from_secs(10)));
    for (role, node) in &mut nodes {
        if *role == "worker" {
            node.write_stdin("go\n");
        }
    }
    for (_, node) in nodes {
        let run = node.wait(bound + Duration::from_secs(30));
        let after = killed_at.elapsed();
        assert!(!run.timed_out, "a survivor hung:\n{}", run.output());
        assert_eq!(run.code(), Some(1), "{}", run.output());
        assert!(run.stderr.contains(cause), "{}", run.output());
        assert!(after < bound, "took {after:?}:\n{}", run.output());
        assert!(!run.stderr.contains("panicked"), "{}", run.output());
    }
}

#[test]
fn with_default_settings_a_killed_worker_fails_every_survivor() {
    // Declared dead after 10 s of silence, unreplaced 30 s later.
    survivors_fail("worker", "node 11 is dead", Duration::from_secs(60));
}

#[test]
fn with_default_settings_a_killed_server_fails_every_survivor() {
    survivors_fail("server", "node 10 is dead", Duration::from_secs(60));
}

#[test]
fn with_default_settings_a_killed_scheduler_fails_every_survivor() {
    // Heartbeats every second, lost after 10 s of silence.
    survivors_fail("scheduler", "lost the scheduler", Duration::from_secs(20));
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> u64 {
    proc_status_mib(pid, "VmRSS:")
}

/// A memory figure of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`), in MiB.
fn proc_status_mib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// A data message of `size` bytes for `app_id`.
fn junk(app_id: i32, size: usize) -> Message {
    let mut msg = Message::default();
    msg.meta.app_id = app_id;
    msg.meta.customer_id = 0;
    msg.meta.request = true;
    msg.meta.push = true;
    msg.meta.timestamp = 0;
    msg.data = vec![vec![0x5a; size].into()];
    msg
}

#[test]
fn strangers_cannot_pin_memory() {
    let port = free_port();
    let servers = two_ports();
    let workers = two_ports();
    let limit = Duration::from_secs(120);
    // The scheduler alone, before the cluster forms: 10 x 100 MB from an
    // anonymous peer and from ps1000 (an id no member can have).
    let scheduler = spawn(node_command("kv_app", &env("scheduler", port, &[])));
    wait_listening(port);
    for identity in [None, Some("ps1000")] {
        let attacker = Attacker::new(identity, port);
        for _ in 0..5 {
            attacker.send(&junk(0, 100 << 20));
        }
    }
    // A server alone: 500 x 1 MB for app 99 (no such app) from ps11, a
    // member id, which leaves before the real node 11 needs its identity.
    let p = |v: u16| vec![("PORT", v.to_string())];
    let server = spawn(node_command("kv_app", &env("server", port, &p(servers.0))));
    wait_listening(servers.0);
    {
        let attacker = Attacker::new(Some("ps11"), servers.0);
        for _ in 0..500 {
            attacker.send(&junk(99, 1 << 20));
        }
    }
    // The attackers' sockets have closed (their LINGER flushed them); let
    // the nodes finish reading: wait until their memory stops changing.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut sched_mib, mut server_mib) = (0, 0);
    while Instant::now() < deadline {
        sched_mib = rss_mib(scheduler.pid());
        server_mib = rss_mib(server.pid());
        std::thread::sleep(Duration::from_millis(200));
        if rss_mib(scheduler.pid()) == sched_mib && rss_mib(server.pid()) == server_mib {
            break;
        }
    }
    let peaks = (
        proc_status_mib(scheduler.pid(), "VmHWM:"),
        proc_status_mib(server.pid(), "VmHWM:"),
    );
    let second = spawn(node_command("kv_app", &env("server", port, &p(servers.1))));
    let workers: Vec<Spawned> = [workers.0, workers.1]
        .into_iter()
        .map(|w| spawn_with_stdin(node_command("kv_app", &env("worker", port, &p(w)))))
        .collect();
    for w in &workers {
        w.wait_for_line("ready", Duration::from_secs(60))
            .expect("the cluster did not form");
    }
    let cluster = Cluster {
        scheduler,
        servers: vec![server, second],
        workers,
        port,
        server_ports: servers,
        worker_ports: (0, 0),
    };
    let runs = cluster.finish(limit);
    assert_exact(&runs);
    eprintln!(
        "after the junk: scheduler {sched_mib} MiB, server {server_mib} MiB resident \
         (peaks {} and {} MiB)",
        peaks.0, peaks.1
    );
    // 1 GB sent to the scheduler, 500 MB to the server: what stays is the
    // per-sender hold budget (PS_HOLD_LIMIT / 4 = 64 MiB) and the process.
    assert!(sched_mib < 150, "the scheduler holds {sched_mib} MiB");
    assert!(server_mib < 200, "the server holds {server_mib} MiB");
}

#[test]
fn a_squatted_identity_costs_nothing() {
    let port = free_port();
    let scheduler = spawn(node_command("kv_app", &env("scheduler", port, &[])));
    wait_listening(port);
    // A squatter takes ps8 on the scheduler's port before anyone joins, and
    // keeps it while the cluster forms and works.
    let squatter = Attacker::new(Some("ps8"), port);
    let mut hello = Message::control(Cmd::Heartbeat, 1);
    hello.meta.timestamp = 0;
    squatter.send(&hello);
    let servers = two_ports();
    let workers = two_ports();
    let mut others: Vec<Spawned> = [servers.0, servers.1, workers.0, workers.1]
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let role = if i < 2 { "server" } else { "worker" };
            let extra = [("PORT", p.to_string())];
            spawn_with_stdin(node_command("kv_app", &env(role, port, &extra)))
        })
        .collect();
    let started = Instant::now();
    // Server 8 presents ps8/<its key> to the scheduler, not the squatted
    // ps8: the job forms and finishes exact, as without the squatter.
    for w in &mut others[2..] {
        w.wait_for_line("ready", Duration::from_secs(60))
            .expect("the cluster did not form");
        w.write_stdin("go\n");
    }
    let workers_v = others.split_off(2);
    let cluster = Cluster {
        scheduler,
        servers: others,
        workers: workers_v,
        port,
        server_ports: servers,
        worker_ports: workers,
    };
    let runs = cluster.wait(Duration::from_secs(60));
    assert_exact(&runs);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    drop(squatter);
}

#[test]
fn forged_registrations_before_the_nodes_start_are_refused() {
    let cluster = ClusterSpec::new().start(|port, _, _| {
        // Before the other server and the workers start: registrations for
        // every role at addresses where no node listens, and at host names
        // that do not resolve (a lookup must not stall the scheduler).
        let stranger = Attacker::new(None, port);
        for i in 0..20 {
            let role = if i % 2 == 0 {
                Role::Server
            } else {
                Role::Worker
            };
            let host = if i < 10 {
                "127.0.0.1"
            } else {
                "forged.pslite.invalid"
            };
            let mut reg = Message::control(Cmd::AddNode, 1);
            reg.meta.control.node = vec![Node::new(role, host, 1 + i)];
            stranger.send(&reg);
        }
    });
    let runs = cluster.finish(Duration::from_secs(120));
    assert_exact(&runs);
    // Those naming host names that do not resolve are refused at once;
    // those naming addresses where nothing listens never counted (they
    // would be refused 5 s later).
    let sched = &runs[0].stderr;
    assert!(
        sched.contains("refusing the registration of server at forged.pslite.invalid:"),
        "{sched}"
    );
}

/// The sum of the series of metric `name` whose labels contain every one
/// of `labels`, in a Prometheus text page.
fn metric_sum(page: &str, name: &str, labels: &[&str]) -> u64 {
    page.lines()
        .filter(|l| l.starts_with(name) && l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The server's metrics page, if it answers within a second.
fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.0 200 OK").then_some(out)
}

/// A part of message `id` (`total` bytes, parts of `part` bytes): part
/// `index`, as pslite's links send it.
fn forged_part(id: u64, index: u32, total: u64, part: usize) -> Message {
    let mut msg = junk(0, part);
    msg.meta.priority = -1;
    let offset = u64::from(index) * part as u64;
    msg.meta.partition = Some(Box::new(pslite::proto::partition::Partition {
        id,
        index,
        count: total.div_ceil(part as u64) as u32,
        total,
        offset,
        frames: if index == 0 { vec![total] } else { Vec::new() },
    }));
    msg
}

/// Issue 43's attack on parts, scaled to run in seconds: with no
/// `PS_AUTH_TOKEN`, made-up identities send a joined server all but the
/// last part of 64 MiB messages (6 of them) and part 0 of 2 GiB ones (20),
/// 398 MiB in all, with `PS_HOLD_LIMIT` 16 MiB. The server holds nothing for
/// them (parts are taken only from members, through the identity the node
/// table names): its resident and virtual memory stay within the budget
/// and a margin of what they were, and the job then runs exact, its
/// workers' requests in parts (`KV_APP_PRIORITY`), none refused for room
/// (nodes of one configuration never meet the bound).
#[test]
fn strangers_cannot_pin_memory_through_parts() {
    const MIB: u64 = 1 << 20;
    let port = free_port();
    let server_port = free_port();
    let metrics_port = free_port();
    let workers = two_ports();
    let common = [
        ("DMLC_NUM_SERVER", "1".to_string()),
        ("PS_HOLD_LIMIT", (16 * MIB).to_string()),
        ("PS_PARTITION_BYTES", (64 << 10).to_string()),
        ("PS_SHM", "0".to_string()),
        ("KV_APP_KEYS", "100000".to_string()),
        ("KV_APP_REPEAT", "20".to_string()),
        ("KV_APP_PRIORITY", "-1".to_string()),
    ];
    let with = |extra: &[(&'static str, String)]| {
        let mut e = common.to_vec();
        e.extend(extra.iter().cloned());
        e
    };
    let scheduler = spawn(node_command("kv_app", &env("scheduler", port, &with(&[]))));
    let server = spawn(node_command(
        "kv_app",
        &env(
            "server",
            port,
            &with(&[
                ("PORT", server_port.to_string()),
                ("PS_METRICS_PORT", metrics_port.to_string()),
            ]),
        ),
    ));
    let mut workers: Vec<Spawned> = [workers.0, workers.1]
        .into_iter()
        .map(|w| {
            spawn_with_stdin(node_command(
                "kv_app",
                &env("worker", port, &with(&[("PORT", w.to_string())])),
            ))
        })
        .collect();
    for w in &workers {
        w.wait_for_line("ready", Duration::from_secs(60))
            .expect("the cluster did not form");
    }
    let pid = server.pid();
    let before = (rss_mib(pid), proc_status_mib(pid, "VmSize:"));
    let dropped = |page: &str| {
        metric_sum(
            page,
            "pslite_dropped_total",
            &["role=\"server\"", "reason=\"unknown_peer\""],
        )
    };
    let dropped_before = scrape(metrics_port).map_or(0, |p| dropped(&p));
    // The attack: 6 x 63 parts of 1 MiB, and 20 first parts of 2 GiB - 1.
    let part = 1 << 20;
    let mut sent = 0u64;
    let attackers: Vec<Attacker> = (0..6)
        .map(|i| {
            let a = Attacker::new(Some(&format!("ps{}", 13 + 2 * i)), server_port);
            for index in 0..63 {
                a.send(&forged_part(7, index, 64 * MIB, part));
                sent += 1;
            }
            a
        })
        .collect();
    let mut identities: Vec<Option<String>> =
        (0..18).map(|i| Some(format!("ps{}", 101 + i))).collect();
    identities.push(Some("ps9".into())); // a member's id without its key
    identities.push(None);
    let others: Vec<Attacker> = identities
        .iter()
        .map(|id| {
            let a = Attacker::new(id.as_deref(), server_port);
            a.send(&forged_part(8, 0, (2 << 30) - 1, part));
            sent += 1;
            a
        })
        .collect();
    // Wait until the server has read and dropped every forged part.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = 0;
    while Instant::now() < deadline {
        if let Some(p) = scrape(metrics_port) {
            seen = dropped(&p).saturating_sub(dropped_before);
        }
        if seen >= sent {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = (rss_mib(pid), proc_status_mib(pid, "VmSize:"));
    drop((attackers, others));
    eprintln!(
        "{sent} forged parts ({seen} dropped as from unknown peers): server resident {} -> {} \
         MiB, virtual {} -> {} MiB (peak resident {} MiB)",
        before.0,
        after.0,
        before.1,
        after.1,
        proc_status_mib(pid, "VmHWM:")
    );
    assert!(
        seen >= sent,
        "the server dropped {seen} of {sent} forged parts"
    );
    // PS_HOLD_LIMIT (16 MiB) and a margin for the allocator and ZeroMQ.
    assert!(
        after.0 <= before.0 + 16 + 48,
        "the server went from {} to {} MiB resident",
        before.0,
        after.0
    );
    assert!(
        after.1 <= before.1 + 1024,
        "the server went from {} to {} MiB virtual",
        before.1,
        after.1
    );
    // The job still runs, in parts: watch the server's counters meanwhile.
    for w in &mut workers {
        w.write_stdin("go\n");
    }
    let mut last = String::new();
    let done = Instant::now() + Duration::from_secs(120);
    let mut finished = [false, false];
    while Instant::now() < done && !finished.iter().all(|&f| f) {
        if let Some(p) = scrape(metrics_port) {
            last = p;
        }
        for (w, f) in workers.iter().zip(&mut finished) {
            *f = *f
                || w.wait_for_line("sums exact", Duration::from_millis(10))
                    .is_some();
        }
    }
    let runs: Vec<_> = std::iter::once(scheduler)
        .chain(std::iter::once(server))
        .chain(workers)
        .map(|p| p.wait(Duration::from_secs(120)))
        .collect();
    pslite_tests::assert_all_ok(&runs);
    for run in &runs[2..] {
        assert!(run.stdout.contains("sums exact"), "{}", run.output());
    }
    // 41 requests of 1.2 MB per worker, 19 parts each: far more messages
    // than requests had arrived when last seen, and none refused for room.
    let from_workers = metric_sum(
        &last,
        "pslite_messages_received_total",
        &["role=\"server\"", "peer=\"9\""],
    );
    eprintln!("the server had received {from_workers} messages from worker 9 when last seen");
    assert!(
        from_workers >= 100,
        "{from_workers} messages from worker 9: not in parts?\n{last}"
    );
    let refused = metric_sum(
        &last,
        "pslite_dropped_total",
        &["role=\"server\"", "reason=\"hold_limit\""],
    );
    assert_eq!(refused, 0, "{last}");
}
