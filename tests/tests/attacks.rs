//! Hostile peers and unlucky operators, as real processes: a raw ZeroMQ
//! peer (forged, well-formed control and data messages) against a running
//! `kv_app` cluster, and nodes killed with SIGKILL under default settings.
//! In each, the job finishes exact, or every survivor fails promptly with a
//! typed error naming the cause; none hangs, and no single forged message
//! costs a node.

use std::time::{Duration, Instant};

use pslite::{Command as Cmd, Message, Node, Role};
use pslite_tests::{assert_all_ok, free_port, node_command, node_env, spawn, spawn_with_stdin};
use pslite_tests::{kv_push, Run, Spawned};

/// A raw ZeroMQ peer with identity `ps<id>` (or none) connected to a port.
struct Attacker {
    socket: zmq::Socket,
    _ctx: zmq::Context,
}

impl Attacker {
    fn new(identity: Option<&str>, port: u16) -> Attacker {
        let ctx = zmq::Context::new();
        let socket = ctx.socket(zmq::DEALER).unwrap();
        if let Some(id) = identity {
            socket.set_identity(id.as_bytes()).unwrap();
        }
        socket.set_sndtimeo(10_000).unwrap();
        socket.set_linger(5_000).unwrap();
        socket.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
        Attacker { socket, _ctx: ctx }
    }

    fn send(&self, msg: &Message) {
        let mut frames = vec![msg.meta.encode()];
        frames.extend(msg.data.iter().map(|d| d.to_vec()));
        self.socket
            .send_multipart(frames, 0)
            .expect("the node stopped reading");
    }
}

/// kv_app node environment: a 2 + 2 cluster, workers waiting for "go".
fn env(role: &str, port: u16, extra: &[(&str, String)]) -> Vec<(String, String)> {
    let mut e = node_env(role, 2, 2, port);
    e.push(("KV_APP_WAIT_STDIN".into(), "1".into()));
    e.push(("KV_APP_REPEAT".into(), "10".into()));
    e.push(("KV_APP_KEYS".into(), "2000".into()));
    e.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    e
}

/// Two distinct free ports, in increasing order (the lower gets the lower
/// id: nodes are numbered by (host, port)).
fn two_ports() -> (u16, u16) {
    loop {
        let (a, b) = (free_port(), free_port());
        if a != b {
            return (a.min(b), a.max(b));
        }
    }
}

struct Cluster {
    scheduler: Spawned,
    servers: Vec<Spawned>,
    workers: Vec<Spawned>,
}

/// Starts a kv_app cluster with fixed ports for the servers (ids 8, 10)
/// and the workers (ids 9, 11); `before` runs once the first server
/// listens, before anyone else starts.
fn start(port: u16, servers: (u16, u16), workers: (u16, u16), before: impl FnOnce()) -> Cluster {
    let p = |v: u16| vec![("PORT", v.to_string())];
    let first = spawn(node_command("kv_app", &env("server", port, &p(servers.0))));
    wait_listening(servers.0);
    before();
    let scheduler = spawn(node_command("kv_app", &env("scheduler", port, &[])));
    let second = spawn(node_command("kv_app", &env("server", port, &p(servers.1))));
    let workers = [workers.0, workers.1]
        .into_iter()
        .map(|w| spawn_with_stdin(node_command("kv_app", &env("worker", port, &p(w)))))
        .collect::<Vec<_>>();
    for w in &workers {
        w.wait_for_line("ready", Duration::from_secs(60))
            .expect("the cluster did not form");
    }
    Cluster {
        scheduler,
        servers: vec![first, second],
        workers,
    }
}

/// Waits until something accepts connections on `port` (bounded).
fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Cluster {
    /// Lets the workers go and waits for every node.
    fn finish(mut self, limit: Duration) -> Vec<Run> {
        for w in &mut self.workers {
            w.write_stdin("go\n");
        }
        std::iter::once(self.scheduler)
            .chain(self.servers)
            .chain(self.workers)
            .map(|p| p.wait(limit))
            .collect()
    }
}

fn assert_exact(runs: &[Run]) {
    assert_all_ok(runs);
    for run in runs {
        assert!(!run.stderr.contains("panicked"), "{}", run.output());
    }
    for worker in &runs[3..] {
        assert!(worker.stdout.contains("sums exact"), "{}", worker.output());
    }
}

#[test]
fn a_forged_node_table_does_not_kill_a_forming_server() {
    let port = free_port();
    let servers = two_ports();
    let workers = two_ports();
    let cluster = start(port, servers, workers, || {
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
    let port = free_port();
    let servers = two_ports();
    let workers = two_ports();
    let cluster = start(port, servers, workers, || {});
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
    assert!(runs[1]
        .stderr
        .contains("servers take KV requests from workers only"));
    assert!(runs[3]
        .stderr
        .contains("workers take KV responses from servers only"));
}

/// Kills `victim` ("scheduler", "server" or "worker": the one with the
/// higher id) once the workers are ready, lets them go, and checks that
/// every other node exits non-zero within `bound`, naming `cause`.
fn survivors_fail(victim: &str, cause: &str, bound: Duration) {
    let port = free_port();
    let servers = two_ports();
    let workers = two_ports();
    let c = start(port, servers, workers, || {});
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
fn a_squatted_identity_is_taken_over_or_named_as_a_possible_identity_conflict() {
    let port = free_port();
    let start_timeout = [("PS_START_TIMEOUT", "5".to_string())];
    let scheduler = spawn(node_command(
        "kv_app",
        &env("scheduler", port, &start_timeout),
    ));
    wait_listening(port);
    // A squatter takes ps8 on the scheduler's port before anyone joins.
    let squatter = Attacker::new(Some("ps8"), port);
    let mut hello = Message::control(Cmd::Heartbeat, 1);
    hello.meta.timestamp = 0;
    squatter.send(&hello);
    let servers = two_ports();
    let workers = two_ports();
    let others: Vec<Spawned> = [servers.0, servers.1, workers.0, workers.1]
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let role = if i < 2 { "server" } else { "worker" };
            let mut extra = start_timeout.to_vec();
            extra.push(("PORT", p.to_string()));
            spawn(node_command("kv_app", &env(role, port, &extra)))
        })
        .collect();
    let started = Instant::now();
    let bound = Duration::from_secs(20);
    // The ROUTER hands a squatted identity over to the node that connects
    // with it later (ROUTER_HANDOVER), so the real server usually wins and
    // the job finishes exact (kv_app checks its sums); if the squatter keeps
    // the identity, every node fails promptly naming the conflict. Never a
    // hang, never a mix.
    let run = scheduler.wait(bound + Duration::from_secs(10));
    assert!(!run.timed_out, "the scheduler hung:\n{}", run.output());
    let formed = run.code() == Some(0);
    if !formed {
        assert_eq!(run.code(), Some(1), "{}", run.output());
        assert!(
            run.stderr.contains("ps8") && run.stderr.contains("possible identity conflict"),
            "{}",
            run.output()
        );
    }
    for node in others {
        let run = node.wait(bound + Duration::from_secs(10));
        assert!(!run.timed_out, "a node hung:\n{}", run.output());
        let expected = if formed { 0 } else { 1 };
        assert_eq!(run.code(), Some(expected), "{}", run.output());
    }
    assert!(started.elapsed() < bound, "took {:?}", started.elapsed());
    drop(squatter);
}
