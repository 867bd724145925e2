//! Hostile input: 10 000 random and mutated frames each to a live scheduler
//! and a live server, from raw ZeroMQ DEALERs with unknown identities; then
//! `kv_app` runs on the same cluster and must give exact results, and no
//! node may panic.

use std::time::Duration;

use pslite::{Command, Control, DataType, Meta, Node, Role};
use pslite_tests::{free_port, node_command, node_env, spawn, spawn_with_stdin, wait_all_ok};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const FRAMES: usize = 10_000;

use pslite::proto::golden::ALL as GOLDEN;

fn unhex(s: &str) -> Vec<u8> {
    pslite::proto::golden::bytes(s).unwrap()
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

/// A multipart message of garbage.
fn hostile_message(rng: &mut StdRng, i: usize) -> Vec<Vec<u8>> {
    let meta = match rng.random_range(0..4) {
        0 => random_bytes(rng, 200),
        1 | 2 => {
            let golden = unhex(GOLDEN[rng.random_range(0..GOLDEN.len())]);
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

fn fuzz(endpoint: &str, seed: u64) {
    let ctx = zmq::Context::new();
    let identities: [Option<&[u8]>; 3] = [None, Some(b"ps1000"), Some(b"fuzz\xff\x01")];
    let sockets: Vec<zmq::Socket> = identities
        .iter()
        .map(|id| {
            let s = ctx.socket(zmq::DEALER).unwrap();
            if let Some(id) = id {
                s.set_identity(id).unwrap();
            }
            s.set_sndtimeo(10_000).unwrap();
            s.set_linger(10_000).unwrap();
            s.connect(endpoint).unwrap();
            s
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..FRAMES {
        let frames = hostile_message(&mut rng, i);
        sockets[i % sockets.len()]
            .send_multipart(frames, 0)
            .expect("a node stopped reading (send timed out)");
    }
}

#[test]
fn garbage_frames_do_not_hurt_a_live_cluster() {
    let port = free_port();
    let server_port = free_port();
    let env = |role: &str, extra: &[(&str, String)]| {
        let mut e = node_env(role, 2, 2, port);
        e.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        e.push(("KV_APP_WAIT_STDIN".into(), "1".into()));
        e.push(("KV_APP_REPEAT".into(), "10".into()));
        e
    };
    let scheduler = spawn(node_command("kv_app", &env("scheduler", &[])));
    let servers = [
        spawn(node_command(
            "kv_app",
            &env("server", &[("PORT", server_port.to_string())]),
        )),
        spawn(node_command("kv_app", &env("server", &[]))),
    ];
    let mut workers = [
        spawn_with_stdin(node_command("kv_app", &env("worker", &[]))),
        spawn_with_stdin(node_command("kv_app", &env("worker", &[]))),
    ];
    for w in &workers {
        w.wait_for_line("ready", Duration::from_secs(60))
            .expect("the cluster did not form");
    }
    fuzz(&format!("tcp://127.0.0.1:{port}"), 1);
    fuzz(&format!("tcp://127.0.0.1:{server_port}"), 2);
    for w in &mut workers {
        w.write_stdin("go\n");
    }
    let limit = Duration::from_secs(120);
    let runs = wait_all_ok(
        std::iter::once(scheduler).chain(servers).chain(workers),
        limit,
    );
    for run in &runs {
        assert!(!run.stderr.contains("panicked"), "{}", run.output());
    }
    for worker in &runs[3..] {
        assert!(worker.stdout.contains("sums exact"), "{}", worker.output());
    }
    // The garbage was seen and dropped, and logged (not ignored silently;
    // undecodable frames once per sender identity).
    for run in &runs[..2] {
        let dropped = run.stderr.matches("dropping").count();
        eprintln!("dropped and logged: {dropped}");
        assert!(dropped > 0, "no drop logged:\n{}", run.output());
        assert!(
            run.stderr
                .contains("(further ones are logged at debug level)"),
            "{}",
            run.output()
        );
    }
}
