//! `PS_AUTH_TOKEN`: a kv_app cluster protected by a token, and strangers.
//!
//! Raw ZeroMQ DEALERs without the token and with a wrong one try ADD_NODE,
//! TERMINATE, BARRIER and data messages on the scheduler and a server while
//! the job runs; each stranger's handshake must be refused (seen on its own
//! socket monitor), the job must finish with exact sums, and no stranger may
//! receive a single frame. A node started with a wrong token must fail to
//! join, with an error naming `PS_AUTH_TOKEN`, long before the start timeout.

use std::time::{Duration, Instant};

use pslite::{Command, DataType, Message, Meta, Node, Role};
use pslite_tests::{
    free_port, node_command, node_env_with, pslite_bin, run, spawn, spawn_with_stdin, wait_all_ok,
};

const TOKEN: &str = "correct horse battery staple";

fn env(
    role: &str,
    port: u16,
    token: Option<&str>,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut e = node_env_with(role, 2, 2, port, extra);
    if let Some(token) = token {
        e.push(("PS_AUTH_TOKEN".into(), token.into()));
    }
    e
}

/// The messages a stranger tries: register as a server, a barrier, a
/// TERMINATE, and a push of one key.
fn hostile_messages() -> Vec<Vec<Vec<u8>>> {
    let control = |cmd: Command, nodes: Vec<Node>| {
        let mut m = Message::control(cmd, 1);
        m.meta.control.node = nodes;
        if cmd == Command::Barrier {
            m.meta.control.barrier_group = 7;
            m.meta.request = true;
        }
        vec![m.meta.encode().to_vec()]
    };
    let mut push = Meta {
        app_id: 0,
        customer_id: 0,
        timestamp: 1,
        request: true,
        push: true,
        recver: 8,
        ..Meta::default()
    };
    push.data_type = vec![DataType::UInt64, DataType::Float];
    vec![
        control(
            Command::AddNode,
            vec![Node::new(Role::Server, "127.0.0.1", 1)],
        ),
        control(Command::Barrier, vec![]),
        control(Command::Terminate, vec![]),
        vec![
            push.encode().to_vec(),
            1u64.to_le_bytes().to_vec(),
            1f32.to_le_bytes().to_vec(),
        ],
    ]
}

/// A raw DEALER to `endpoint`, presenting `password` (PLAIN) or nothing,
/// with identity `identity`, and the monitor that reports its handshakes.
struct Stranger {
    socket: zmq::Socket,
    monitor: zmq::Socket,
}

impl Stranger {
    fn new(
        ctx: &zmq::Context,
        endpoint: &str,
        password: Option<&str>,
        identity: &[u8],
        n: usize,
    ) -> Stranger {
        let socket = ctx.socket(zmq::DEALER).unwrap();
        socket.set_identity(identity).unwrap();
        socket.set_linger(0).unwrap();
        socket.set_sndtimeo(0).unwrap();
        if let Some(password) = password {
            socket.set_plain_username(Some("pslite")).unwrap();
            socket.set_plain_password(Some(password)).unwrap();
        }
        let monitor_endpoint = format!("inproc://stranger-{n}");
        socket
            .monitor(&monitor_endpoint, zmq::SocketEvent::ALL as i32)
            .unwrap();
        let monitor = ctx.socket(zmq::PAIR).unwrap();
        monitor.connect(&monitor_endpoint).unwrap();
        socket.connect(endpoint).unwrap();
        Stranger { socket, monitor }
    }

    /// Waits for a handshake outcome on the monitor: the event id.
    fn handshake(&self, limit: Duration) -> Option<u16> {
        let deadline = Instant::now() + limit;
        let ends = [
            zmq::SocketEvent::HANDSHAKE_SUCCEEDED as u16,
            zmq::SocketEvent::HANDSHAKE_FAILED_AUTH as u16,
            zmq::SocketEvent::HANDSHAKE_FAILED_PROTOCOL as u16,
            zmq::SocketEvent::HANDSHAKE_FAILED_NO_DETAIL as u16,
        ];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero()
                || self
                    .monitor
                    .poll(zmq::POLLIN, left.as_millis() as i64)
                    .ok()?
                    == 0
            {
                return None;
            }
            let frames = self.monitor.recv_multipart(0).ok()?;
            let event = u16::from_ne_bytes([frames[0][0], frames[0][1]]);
            if ends.contains(&event) {
                return Some(event);
            }
        }
    }

    /// Tries every hostile message (a refused DEALER may not even queue them).
    fn attack(&self) {
        for msg in hostile_messages() {
            let _ = self.socket.send_multipart(msg, zmq::DONTWAIT);
        }
    }

    /// Whether anything at all arrived on the socket.
    fn received_anything(&self) -> bool {
        self.socket.poll(zmq::POLLIN, 200).unwrap_or(0) > 0
    }
}

#[test]
fn strangers_are_refused_and_the_job_stays_exact() {
    let port = free_port();
    let server_port = free_port();
    let sp = server_port.to_string();
    let scheduler = spawn(node_command(
        "kv_app",
        &env("scheduler", port, Some(TOKEN), &[]),
    ));
    let servers = [
        spawn(node_command(
            "kv_app",
            &env("server", port, Some(TOKEN), &[("PORT", &sp)]),
        )),
        spawn(node_command(
            "kv_app",
            &env("server", port, Some(TOKEN), &[]),
        )),
    ];
    let wait = [("KV_APP_WAIT_STDIN", "1"), ("KV_APP_REPEAT", "10")];
    let mut workers = [
        spawn_with_stdin(node_command(
            "kv_app",
            &env("worker", port, Some(TOKEN), &wait),
        )),
        spawn_with_stdin(node_command(
            "kv_app",
            &env("worker", port, Some(TOKEN), &wait),
        )),
    ];
    for w in &workers {
        w.wait_for_line("ready", Duration::from_secs(60))
            .expect("the token-protected cluster did not form");
    }

    let ctx = zmq::Context::new();
    let mut strangers = Vec::new();
    let endpoints = [
        format!("tcp://127.0.0.1:{port}"),
        format!("tcp://127.0.0.1:{server_port}"),
    ];
    let mut n = 0;
    for endpoint in &endpoints {
        for password in [None, Some("wrong token")] {
            for identity in [&b"ps9"[..], b"ps8", b"stranger"] {
                strangers.push(Stranger::new(&ctx, endpoint, password, identity, n));
                n += 1;
            }
        }
    }
    let t0 = Instant::now();
    for s in &strangers {
        s.attack();
    }
    for (i, s) in strangers.iter().enumerate() {
        let outcome = s.handshake(Duration::from_secs(30));
        assert!(
            outcome.is_some() && outcome != Some(zmq::SocketEvent::HANDSHAKE_SUCCEEDED as u16),
            "stranger {i}: handshake outcome {outcome:?}, expected a refusal"
        );
    }
    eprintln!("strangers refused after {:?}", t0.elapsed());
    // The monitor proves the check works: the right token is let in.
    let control = Stranger::new(&ctx, &endpoints[0], Some(TOKEN), b"control", n);
    assert_eq!(
        control.handshake(Duration::from_secs(30)),
        Some(zmq::SocketEvent::HANDSHAKE_SUCCEEDED as u16)
    );
    drop(control);
    // Operators get in with the token, and only with it: `pslite status`
    // presents PS_AUTH_TOKEN and the scheduler answers through PLAIN too.
    let status = |token: Option<&str>| {
        let mut cmd = std::process::Command::new(pslite_bin());
        cmd.args([
            "status",
            "--json",
            "--timeout",
            "2",
            "--port",
            &port.to_string(),
        ])
        .env_remove("PS_AUTH_TOKEN");
        if let Some(token) = token {
            cmd.env("PS_AUTH_TOKEN", token);
        }
        let r = run(cmd, Duration::from_secs(30));
        assert!(!r.timed_out, "pslite status hung:\n{}", r.output());
        r
    };
    let with = status(Some(TOKEN));
    assert!(with.ok(), "{}", with.output());
    assert_eq!(
        with.stdout.matches("\"role\"").count(),
        5,
        "{}",
        with.output()
    );
    let without = status(None);
    assert!(!without.ok(), "status without the token got an answer");
    // Named at once: the scheduler refuses the handshake.
    assert!(
        without.stderr.contains("PS_AUTH_TOKEN"),
        "{}",
        without.output()
    );

    for w in &mut workers {
        w.write_stdin("go\n");
    }
    let limit = Duration::from_secs(120);
    let runs = wait_all_ok(
        std::iter::once(scheduler).chain(servers).chain(workers),
        limit,
    );
    eprintln!("job done after {:?}", t0.elapsed());
    for worker in &runs[3..] {
        assert!(worker.stdout.contains("sums exact"), "{}", worker.output());
    }
    for (i, s) in strangers.iter().enumerate() {
        assert!(!s.received_anything(), "stranger {i} received a frame");
    }
    // Our side says who was refused and why.
    for run in &runs[..2] {
        assert!(
            run.stderr.contains("presented a wrong PS_AUTH_TOKEN"),
            "{}",
            run.output()
        );
        // Without a token, either side may notice the mismatch first.
        assert!(
            run.stderr.contains("presented no PS_AUTH_TOKEN")
                || run.stderr.contains("a node without PS_AUTH_TOKEN"),
            "{}",
            run.output()
        );
    }
}

#[test]
fn a_node_with_a_wrong_token_fails_naming_the_variable() {
    let port = free_port();
    let env1 = |role, token| {
        node_env_with(
            role,
            1,
            1,
            port,
            &[("PS_AUTH_TOKEN", token), ("PS_START_TIMEOUT", "60")],
        )
    };
    let scheduler = spawn(node_command("kv_app", &env1("scheduler", TOKEN)));
    let server = spawn(node_command("kv_app", &env1("server", TOKEN)));
    let worker = spawn(node_command("kv_app", &env1("worker", "not the token")));
    let run = worker.wait(Duration::from_secs(50));
    assert!(!run.timed_out && !run.ok(), "{}", run.output());
    assert!(
        run.stderr.contains("refused this node's PS_AUTH_TOKEN"),
        "{}",
        run.output()
    );
    // It failed on the refusal, not at the 60 s start timeout.
    assert!(run.elapsed < Duration::from_secs(50), "{:?}", run.elapsed);
    for p in [scheduler, server] {
        p.signal(libc::SIGKILL);
        let run = p.wait(Duration::from_secs(10));
        assert!(!run.stderr.contains("panicked"), "{}", run.output());
    }
}

#[test]
fn a_healthy_token_job_on_one_host_logs_no_error() {
    // Same-host pslite nodes reach each other over abstract Unix sockets
    // (PS_IPC, on by default): finding out whether a peer listens there
    // must not look like a refused stranger to it.
    for _ in 0..2 {
        let port = free_port();
        let extra = [("KV_APP_REPEAT", "10"), ("PS_VERBOSE", "1")];
        let nodes: Vec<_> = ["scheduler", "server", "server", "worker", "worker"]
            .iter()
            .map(|role| {
                spawn(node_command(
                    "kv_app",
                    &env(role, port, Some(TOKEN), &extra),
                ))
            })
            .collect();
        let runs = wait_all_ok(nodes, Duration::from_secs(120));
        for run in &runs {
            let errors: Vec<&str> = run
                .stderr
                .lines()
                .filter(|l| l.contains(" ERROR ") || l.contains(" WARN "))
                .collect();
            assert!(errors.is_empty(), "{errors:#?}\n{}", run.output());
        }
        for worker in &runs[3..] {
            assert!(worker.stdout.contains("sums exact"), "{}", worker.output());
        }
    }
}
