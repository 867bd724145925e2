//! Fixtures for hostile-peer tests: a raw ZeroMQ peer that presents any
//! identity, a `kv_app` cluster of 2 servers and 2 workers on fixed ports
//! (so tests know every node's id and port), and garbage frames.

use std::time::{Duration, Instant};

use pslite::{Command, Control, DataType, Message, Meta, Node, Role};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{assert_all_ok, free_port, node_command, node_env, spawn, spawn_with_stdin};
use crate::{Run, Spawned};

/// A raw ZeroMQ DEALER with identity `identity` (or none) connected to a
/// port on 127.0.0.1: a stranger speaking the wire.
pub struct Attacker {
    socket: zmq::Socket,
    _ctx: zmq::Context,
}

impl Attacker {
    /// Connects to 127.0.0.1:`port` as `identity` (none: anonymous).
    pub fn new(identity: Option<&str>, port: u16) -> Attacker {
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

    /// Sends `msg` (its meta encoded as a C++ node would, then its data).
    pub fn send(&self, msg: &Message) {
        let mut frames = vec![msg.meta.encode()];
        frames.extend(msg.data.iter().map(|d| d.to_vec()));
        self.send_frames(frames);
    }

    /// Sends raw frames as one message if ZeroMQ can queue them now (a
    /// node that is gone does not block the stranger).
    pub fn try_send_frames(&self, frames: Vec<Vec<u8>>) {
        let _ = self.socket.send_multipart(frames, zmq::DONTWAIT);
    }

    /// Sends raw frames as one message.
    pub fn send_frames(&self, frames: Vec<Vec<u8>>) {
        self.socket
            .send_multipart(frames, 0)
            .expect("the node stopped reading");
    }
}

/// Connects to 127.0.0.1:`port` as `identity`, waits until ZeroMQ's
/// handshake is through (bounded), and closes at once, sending nothing.
pub fn connect_and_close(identity: &str, port: u16) {
    connect_hold_close(identity, port, Duration::ZERO);
}

/// [`connect_and_close`], holding the connection open for `hold` first.
pub fn connect_hold_close(identity: &str, port: u16, hold: Duration) {
    let ctx = zmq::Context::new();
    let socket = ctx.socket(zmq::DEALER).unwrap();
    socket.set_identity(identity.as_bytes()).unwrap();
    socket.set_linger(0).unwrap();
    let monitor = format!("inproc://takeover-{port}-{identity}");
    socket
        .monitor(&monitor, zmq::SocketEvent::HANDSHAKE_SUCCEEDED as i32)
        .unwrap();
    let events = ctx.socket(zmq::PAIR).unwrap();
    events.connect(&monitor).unwrap();
    socket.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    let _ = events.poll(zmq::POLLIN, 2000);
    std::thread::sleep(hold);
}

/// kv_app node environment: a 2 + 2 cluster around 127.0.0.1:`port`,
/// workers waiting for "go", `KV_APP_REPEAT` rounds of 2000 keys.
pub fn kv_env(role: &str, port: u16, extra: &[(&str, String)]) -> Vec<(String, String)> {
    let mut e = node_env(role, 2, 2, port);
    e.push(("KV_APP_WAIT_STDIN".into(), "1".into()));
    e.push(("KV_APP_REPEAT".into(), "10".into()));
    e.push(("KV_APP_KEYS".into(), "2000".into()));
    for (k, v) in extra {
        e.retain(|(key, _)| key != k);
        e.push((k.to_string(), v.clone()));
    }
    e
}

/// Two distinct free ports, in increasing order (the lower gets the lower
/// id: nodes are numbered by (host, port)).
pub fn two_ports() -> (u16, u16) {
    loop {
        let (a, b) = (free_port(), free_port());
        if a != b {
            return (a.min(b), a.max(b));
        }
    }
}

/// Waits until something accepts connections on `port` (bounded).
pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A kv_app cluster whose ports (and so ids) are known: the scheduler
/// (id 1), servers 8 and 10, workers 9 and 11.
pub struct Cluster {
    /// The scheduler.
    pub scheduler: Spawned,
    /// Servers 8 and 10.
    pub servers: Vec<Spawned>,
    /// Workers 9 and 11 (waiting for "go").
    pub workers: Vec<Spawned>,
    /// The scheduler's port.
    pub port: u16,
    /// The servers' ports.
    pub server_ports: (u16, u16),
    /// The workers' ports.
    pub worker_ports: (u16, u16),
}

/// How to start a [`Cluster`].
pub struct ClusterSpec {
    /// Extra environment of every node.
    pub extra: Vec<(&'static str, String)>,
}

impl ClusterSpec {
    /// Default kv_app nodes.
    pub fn new() -> ClusterSpec {
        ClusterSpec { extra: Vec::new() }
    }

    /// Adds a variable to every node's environment.
    pub fn env(mut self, key: &'static str, value: &str) -> ClusterSpec {
        self.extra.push((key, value.to_string()));
        self
    }

    /// Starts the cluster; `before` runs once the first server and the
    /// scheduler listen, before anyone else starts (with the scheduler's
    /// port and the ports the servers and workers will use); waits until
    /// the workers are ready.
    pub fn start(&self, before: impl FnOnce(u16, (u16, u16), (u16, u16))) -> Cluster {
        let port = free_port();
        let servers = two_ports();
        let workers = two_ports();
        let with_port = |p: u16| {
            let mut e = self.extra.clone();
            e.push(("PORT", p.to_string()));
            e
        };
        let first = spawn(node_command(
            "kv_app",
            &kv_env("server", port, &with_port(servers.0)),
        ));
        let scheduler = spawn(node_command(
            "kv_app",
            &kv_env("scheduler", port, &self.extra),
        ));
        wait_listening(servers.0);
        wait_listening(port);
        before(port, servers, workers);
        let second = spawn(node_command(
            "kv_app",
            &kv_env("server", port, &with_port(servers.1)),
        ));
        let workers_v = [workers.0, workers.1]
            .into_iter()
            .map(|w| {
                spawn_with_stdin(node_command(
                    "kv_app",
                    &kv_env("worker", port, &with_port(w)),
                ))
            })
            .collect::<Vec<_>>();
        let formed = workers_v
            .iter()
            .all(|w| w.wait_for_line("ready", Duration::from_secs(60)).is_some());
        let cluster = Cluster {
            scheduler,
            servers: vec![first, second],
            workers: workers_v,
            port,
            server_ports: servers,
            worker_ports: workers,
        };
        if !formed {
            // Every node's output says why.
            let runs = cluster.wait(Duration::ZERO);
            let outputs: Vec<String> = runs.iter().map(Run::output).collect();
            panic!("the cluster did not form:\n{}", outputs.join("\n"));
        }
        cluster
    }
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec::new()
    }
}

impl Cluster {
    /// Every node's port, with the identity the node presents: scheduler
    /// (ps1), servers (ps8, ps10), workers (ps9, ps11).
    pub fn ports(&self) -> Vec<(u16, &'static str)> {
        vec![
            (self.port, "ps1"),
            (self.server_ports.0, "ps8"),
            (self.server_ports.1, "ps10"),
            (self.worker_ports.0, "ps9"),
            (self.worker_ports.1, "ps11"),
        ]
    }

    /// Lets the workers go.
    pub fn go(&mut self) {
        for w in &mut self.workers {
            w.write_stdin("go\n");
        }
    }

    /// Waits for every node (scheduler, servers, workers), each up to
    /// `limit` from its start.
    pub fn wait(self, limit: Duration) -> Vec<Run> {
        std::iter::once(self.scheduler)
            .chain(self.servers)
            .chain(self.workers)
            .map(|p| p.wait(limit))
            .collect()
    }

    /// Lets the workers go and waits for every node.
    pub fn finish(mut self, limit: Duration) -> Vec<Run> {
        self.go();
        self.wait(limit)
    }
}

/// Every node of a [`Cluster`] exited 0 without panicking, and both workers
/// report exact sums.
pub fn assert_exact(runs: &[Run]) {
    assert_all_ok(runs);
    for run in runs {
        assert!(!run.stderr.contains("panicked"), "{}", run.output());
    }
    for worker in &runs[3..] {
        assert!(worker.stdout.contains("sums exact"), "{}", worker.output());
    }
}

fn random_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let n = rng.random_range(0..=max);
    (0..n).map(|_| rng.random()).collect()
}

/// One mutation of `frame`: bit flips, truncation, insertion, deletion,
/// overwrite or garbage appended.
fn mutate(rng: &mut StdRng, mut frame: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..6) {
            0 if !frame.is_empty() => {
                let i = rng.random_range(0..frame.len());
                frame[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !frame.is_empty() => frame.truncate(rng.random_range(0..frame.len())),
            2 => {
                let i = rng.random_range(0..=frame.len());
                frame.insert(i, rng.random());
            }
            3 if !frame.is_empty() => {
                frame.remove(rng.random_range(0..frame.len()));
            }
            4 if !frame.is_empty() => {
                let i = rng.random_range(0..frame.len());
                frame[i] = rng.random();
            }
            _ => frame.extend(random_bytes(rng, 16)),
        }
    }
    frame
}

/// A well-formed meta with hostile values.
fn hostile_meta(rng: &mut StdRng) -> Vec<u8> {
    let mut meta = Meta {
        head: rng.random(),
        app_id: rng.random_range(-2..3),
        customer_id: rng.random_range(-2..3),
        timestamp: rng.random(),
        request: rng.random(),
        push: rng.random(),
        pull: rng.random(),
        simple_app: rng.random(),
        ..Meta::default()
    };
    let cmds = [
        Command::Empty,
        Command::Terminate,
        Command::AddNode,
        Command::Barrier,
        Command::Ack,
        Command::Heartbeat,
        Command::Leave,
    ];
    meta.control = Control {
        cmd: cmds[rng.random_range(0..cmds.len())],
        node: (0..rng.random_range(0..3))
            .map(|_| {
                let roles = [Role::Server, Role::Worker, Role::Scheduler];
                let mut n = Node::new(
                    roles[rng.random_range(0..3)],
                    if rng.random() {
                        "127.0.0.1"
                    } else {
                        "no-such-host.invalid"
                    },
                    rng.random_range(-5..70_000),
                );
                n.id = rng.random_range(-1..20);
                n.is_recovery = rng.random();
                n
            })
            .collect(),
        barrier_group: rng.random_range(-3..12),
        msg_sig: rng.random(),
        failed_peer: rng.random::<bool>().then(|| rng.random_range(-1..20)),
        dead_nodes: (0..rng.random_range(0..3))
            .map(|_| rng.random_range(-1..20))
            .collect(),
        round: rng.random::<bool>().then(|| rng.random()),
        round_members: (0..rng.random_range(0..3))
            .map(|_| rng.random_range(-1..20))
            .collect(),
        // A stranger's "the job stops": refused (it lacks the node's key).
        stop: rng
            .random::<bool>()
            .then(|| "a stranger says the job stops".to_string()),
        round_base: rng.random::<bool>().then(|| rng.random_range(0..4)),
        round_left: (0..rng.random_range(0..3))
            .map(|_| rng.random_range(-1..20))
            .collect(),
        shared: None,
    };
    let types = [
        DataType::UInt64,
        DataType::Float,
        DataType::Int32,
        DataType::Other,
    ];
    meta.data_type = (0..rng.random_range(0..4))
        .map(|_| types[rng.random_range(0..types.len())])
        .collect();
    meta.encode()
}

/// Message `i` of a fuzzer: random bytes, mutated golden frames (many of
/// them still valid pushes, pulls, barriers and tables), or well-formed
/// metas with hostile values, with up to 3 random data frames; every
/// 2500th carries 8 MiB more.
pub fn hostile_message(rng: &mut StdRng, i: usize) -> Vec<Vec<u8>> {
    use pslite::proto::golden::ALL as GOLDEN;
    let meta = match rng.random_range(0..4) {
        0 => random_bytes(rng, 200),
        1 | 2 => {
            let hex = GOLDEN[rng.random_range(0..GOLDEN.len())];
            let golden = pslite::proto::golden::bytes(hex).unwrap_or_default();
            mutate(rng, golden)
        }
        _ => hostile_meta(rng),
    };
    let mut frames = vec![meta];
    for _ in 0..rng.random_range(0..4) {
        frames.push(random_bytes(rng, 64));
    }
    if i % 2500 == 0 {
        frames.push(vec![0xab; 8 << 20]); // oversized
    }
    frames
}

/// A fuzzer's random source.
pub fn fuzz_rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}
