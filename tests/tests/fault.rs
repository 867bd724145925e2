//! Fault tolerance with real processes on 127.0.0.1: lost messages resent,
//! a server killed and replaced, the scheduler killed, garbage frames.

use std::time::{Duration, Instant};

use pslite_tests::{free_port, spawn_node as node, wait_all_ok, Launch};

#[test]
fn kv_app_is_exact_with_ten_percent_of_messages_dropped() {
    let run = Launch::example("kv_app", 2, 2)
        .env("PS_RESEND", "1")
        .env("PS_RESEND_TIMEOUT", "100")
        .env("PS_DROP_MSG", "10")
        .env("KV_APP_REPEAT", "20")
        .env("KV_APP_KEYS", "2000")
        .timeout(Duration::from_secs(240))
        .run();
    run.assert_ok();
    assert_eq!(
        run.stdout.matches("sums exact").count(),
        2,
        "{}",
        run.output()
    );
}

#[test]
fn a_pull_sent_in_chunks_is_exact_with_ten_percent_of_messages_dropped() {
    // 1 M keys: 4 MB of keys for each server, a pull of 4 chunks (256 KiB
    // of keys, then 512 KiB, 1 MiB and the rest), each an ordinary request
    // the resender sends again when it or its answer is lost.
    let run = Launch::example("kv_app", 2, 2)
        .env("PS_RESEND", "1")
        .env("PS_RESEND_TIMEOUT", "200")
        .env("PS_DROP_MSG", "10")
        .env("KV_APP_REPEAT", "1")
        .env("KV_APP_KEYS", "1000000")
        .timeout(Duration::from_secs(240))
        .run();
    run.assert_ok();
    assert_eq!(
        run.stdout.matches("sums exact").count(),
        2,
        "{}",
        run.output()
    );
}

const FAULT_ENV: [(&str, &str); 4] = [
    ("PS_HEARTBEAT_INTERVAL", "1"),
    ("PS_HEARTBEAT_TIMEOUT", "3"),
    ("PS_RESEND", "1"),
    ("PS_RESEND_TIMEOUT", "300"),
];

#[test]
fn a_killed_server_is_replaced_and_serves_again() {
    let port = free_port();
    let n = |role| node("kv_recovery", role, 2, 2, port, &FAULT_ENV);
    let scheduler = n("scheduler");
    let servers = [n("server"), n("server")];
    let workers = [n("worker"), n("worker")];
    let limit = Duration::from_secs(60);
    // Which node ids did the servers get?
    let line = servers[0]
        .wait_for_line("serving", limit)
        .expect("server 0 never served");
    let victim_id = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_string();
    for w in &workers {
        w.wait_for_line("round 200", limit)
            .expect("workers never got going");
    }
    let [victim, survivor] = servers;
    victim.signal(libc::SIGKILL);
    let killed = victim.wait(limit);
    assert!(
        killed.code().is_none(),
        "the server was not killed: {}",
        killed.output()
    );
    // Restart it: it takes over the dead server's id once the scheduler
    // misses its heartbeats, and the workers' pending requests are resent.
    let replacement = n("server");
    let runs = wait_all_ok(
        [scheduler, survivor, replacement]
            .into_iter()
            .chain(workers),
        Duration::from_secs(120),
    );
    let replaced = &runs[2].stdout;
    assert!(
        replaced.contains(&format!("server node {victim_id} serving (recovered)")),
        "the replacement did not take id {victim_id}:\n{}",
        runs[2].output()
    );
    for worker in &runs[3..] {
        assert!(
            worker.stdout.contains("50 exact rounds after recovery"),
            "{}",
            worker.output()
        );
    }
}

#[test]
fn every_node_fails_fast_when_the_scheduler_dies() {
    let port = free_port();
    let env = [
        ("PS_HEARTBEAT_INTERVAL", "1"),
        ("PS_HEARTBEAT_TIMEOUT", "2"),
    ];
    let n = |role| node("kv_recovery", role, 1, 2, port, &env);
    let scheduler = n("scheduler");
    let others = [n("server"), n("worker"), n("worker")];
    let limit = Duration::from_secs(60);
    for w in &others[1..] {
        w.wait_for_line("round 200", limit)
            .expect("workers never got going");
    }
    scheduler.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    drop(scheduler.wait(limit));
    for p in others {
        let run = p.wait(Duration::from_secs(30));
        let after = killed_at.elapsed();
        assert!(
            !run.timed_out,
            "a node hung after the scheduler died:\n{}",
            run.output()
        );
        assert_eq!(run.code(), Some(1), "{}", run.output());
        assert!(
            run.stderr.contains("lost the scheduler"),
            "{}",
            run.output()
        );
        // PS_HEARTBEAT_TIMEOUT (2 s) plus a few seconds.
        assert!(
            after < Duration::from_secs(8),
            "took {after:?}:\n{}",
            run.output()
        );
        assert!(!run.stderr.contains("panicked"), "{}", run.output());
    }
}
