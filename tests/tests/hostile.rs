//! Hostile input: 10 000 random and mutated frames each to a live scheduler
//! and a live server, from raw ZeroMQ DEALERs with unknown identities; then
//! `kv_app` runs on the same cluster and must give exact results, and no
//! node may panic.

use std::time::Duration;

use pslite_tests::hostile::{fuzz_rng, hostile_message};
use pslite_tests::{
    free_port, node_command, node_env, pslite_command, run, spawn, spawn_with_stdin, wait_all_ok,
    within,
};

const FRAMES: usize = 10_000;

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
    let mut rng = fuzz_rng(seed);
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
    // Counted: the server's counters reach the scheduler with its
    // heartbeats (every second).
    let mut dropped_before_exit = Vec::new();
    within(Duration::from_secs(20), || {
        dropped_before_exit = dropped(port, server_port);
        dropped_before_exit
            .iter()
            .all(|&(_, n)| n > FRAMES as u64 / 2)
    });
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
    // The garbage was seen and dropped, logged once per sender and reason
    // (the log cannot be flooded), and counted.
    for run in &runs[..2] {
        let warned = run.stderr.lines().filter(|l| l.contains(" WARN ")).count();
        eprintln!("warning lines: {warned}");
        assert!(
            (1..=100).contains(&warned),
            "{warned} warnings:\n{}",
            run.output()
        );
    }
    for (node, dropped) in dropped_before_exit {
        assert!(
            dropped > FRAMES as u64 / 2,
            "{node} counted only {dropped} drops"
        );
    }
}

/// The messages the scheduler (its own row) and the server at
/// `server_port` (by port) dropped as malformed or from unknown peers, as
/// `pslite status --json` reports them.
fn dropped(port: u16, server_port: u16) -> Vec<(&'static str, u64)> {
    let mut cmd = pslite_command("status");
    cmd.args(["--json", "--timeout", "5", "--port", &port.to_string()]);
    let run = run(cmd, Duration::from_secs(30));
    assert!(run.ok(), "{}", run.output());
    let json: serde_json::Value = serde_json::from_str(&run.stdout).expect("status JSON");
    let rows = json["nodes"].as_array().cloned().unwrap_or_default();
    let total = |row: &serde_json::Value| {
        let d = &row["counters"]["dropped"];
        d["malformed"].as_u64().unwrap_or(0) + d["unknown_peer"].as_u64().unwrap_or(0)
    };
    let find = |pred: &dyn Fn(&serde_json::Value) -> bool| {
        rows.iter().find(|r| pred(r)).map(total).unwrap_or(0)
    };
    vec![
        ("the scheduler", find(&|r| r["role"] == "scheduler")),
        (
            "the server",
            find(&|r| r["port"].as_u64() == Some(u64::from(server_port))),
        ),
    ]
}
