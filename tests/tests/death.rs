//! Liveness with default settings, as real processes (issue 24): a node
//! killed -9 is known dead from its closed connection in about a second
//! (not after the 10 s heartbeat timeout); a server stopped for 15 s
//! (SIGSTOP, then SIGCONT) comes back and the job finishes exact; an
//! elastic worker killed while it waits for the first round is noticed
//! within the heartbeat timeout. The measured figures are printed.

use std::time::{Duration, Instant};

use pslite_tests::hostile::{assert_exact, ClusterSpec};
use pslite_tests::{node_command, node_env, spawn, wait_all_ok, Spawned};

#[test]
fn a_killed_worker_is_known_dead_in_about_a_second() {
    let cluster = ClusterSpec::new()
        .env("PS_VERBOSE", "1")
        .start(|_, _, _| {});
    let mut workers = cluster.workers;
    let victim = workers.pop().expect("two workers");
    victim.signal(libc::SIGKILL);
    let killed = Instant::now();
    drop(victim.wait(Duration::from_secs(10)));
    let line = cluster
        .scheduler
        .wait_for_line("is dead", Duration::from_secs(30))
        .expect("the scheduler never declared the worker dead");
    let noticed = killed.elapsed();
    if !line.contains("node 11 is dead (its connection closed") {
        let run = cluster.scheduler.wait(Duration::ZERO);
        panic!("{line}\n{}", run.output());
    }
    for w in &mut workers {
        w.write_stdin("go\n");
    }
    let survivors: Vec<Spawned> = std::iter::once(cluster.scheduler)
        .chain(cluster.servers)
        .chain(workers)
        .collect();
    let mut exits = Vec::new();
    for node in survivors {
        let run = node.wait(Duration::from_secs(90));
        assert!(!run.timed_out, "a survivor hung:\n{}", run.output());
        assert_eq!(run.code(), Some(1), "{}", run.output());
        assert!(run.stderr.contains("node 11 is dead"), "{}", run.output());
        exits.push(killed.elapsed());
    }
    let last = exits.iter().max().copied().unwrap_or_default();
    eprintln!(
        "kill -9 of worker 11: declared dead after {noticed:?}; survivors exited after {:?} \
         (recovery window 30 s)",
        exits
    );
    assert!(noticed < Duration::from_secs(3), "took {noticed:?}");
    assert!(last < Duration::from_secs(36), "took {last:?}");
}

#[test]
fn a_server_stopped_for_15_s_comes_back_and_the_job_finishes_exact() {
    // About 4 s of pushes and pulls without the pause.
    let spec = ClusterSpec::new()
        .env("KV_APP_REPEAT", "2000")
        .env("KV_APP_KEYS", "20000");
    let mut cluster = spec.start(|_, _, _| {});
    cluster.go();
    std::thread::sleep(Duration::from_millis(300));
    let server = &cluster.servers[1];
    server.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    // The pause itself is the test: 15 s, longer than the heartbeat
    // timeout (10 s), shorter than it plus the recovery window (40 s).
    std::thread::sleep(Duration::from_secs(15));
    server.signal(libc::SIGCONT);
    eprintln!("server 10 stopped for {:?}", stopped.elapsed());
    let runs = cluster.wait(Duration::from_secs(150));
    assert_exact(&runs);
    for w in &runs[3..] {
        assert!(
            !w.stdout.is_empty() && w.elapsed > Duration::from_secs(15),
            "{}",
            w.output()
        );
    }
    // The scheduler took it for dead, then back; the server says why its
    // clock jumped.
    assert!(runs[0].stderr.contains("is back"), "{}", runs[0].output());
    assert!(
        runs[2].stderr.contains("was stopped for"),
        "{}",
        runs[2].output()
    );
}

/// A node of the `elastic` example around 127.0.0.1:`port` with default
/// liveness (a 10 s heartbeat timeout).
fn elastic(role: &str, port: u16, extra: &[(&str, &str)]) -> Spawned {
    let mut env = node_env(role, 1, 1, port);
    env.retain(|(k, _)| k != "DMLC_NUM_WORKER");
    env.push(("DMLC_NUM_WORKER".into(), "2:3".into()));
    env.push(("PS_RDZV_LAST_CALL".into(), "3".into()));
    env.push(("ELASTIC_EPOCHS".into(), "20".into()));
    env.push(("ELASTIC_EPOCH_MS".into(), "20".into()));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    spawn(node_command("elastic", &env))
}

#[test]
fn an_elastic_worker_killed_while_waiting_for_the_first_round_is_noticed() {
    let port = pslite_tests::free_port();
    let scheduler = elastic("scheduler", port, &[("PS_VERBOSE", "1")]);
    let server = elastic("server", port, &[]);
    let first = elastic("worker", port, &[]);
    scheduler
        .wait_for_line("registered as node 9", Duration::from_secs(30))
        .expect("the first worker never registered");
    let victim = elastic("worker", port, &[]);
    scheduler
        .wait_for_line("registered as node 11", Duration::from_secs(30))
        .expect("the second worker never registered");
    // Before the first round begins (3 s of last call): killed.
    victim.signal(libc::SIGKILL);
    let killed = Instant::now();
    drop(victim.wait(Duration::from_secs(10)));
    if scheduler
        .wait_for_line("worker 11 is dead", Duration::from_secs(20))
        .is_none()
    {
        let runs = [scheduler, server, first].map(|p| p.wait(Duration::ZERO));
        let outputs: Vec<String> = runs.iter().map(|r| r.output()).collect();
        panic!(
            "the dead waiting worker was never noticed:\n{}",
            outputs.join("\n")
        );
    }
    let noticed = killed.elapsed();
    eprintln!("elastic worker 11 killed while waiting: noticed after {noticed:?}");
    assert!(noticed < Duration::from_secs(10), "took {noticed:?}");
    // The round begins without it once another worker comes.
    let third = elastic("worker", port, &[]);
    wait_all_ok([scheduler, server, first, third], Duration::from_secs(90));
}
