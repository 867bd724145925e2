//! Servers that join and leave a running job (`DMLC_NUM_SERVER=MIN:MAX`)
//! with real processes on 127.0.0.1: a job of `1:2` servers starts with
//! one; a second server joins while the workers push and takes its ranges
//! with their state; then the first leaves on SIGTERM (its ranges move to
//! the second first) and exits 0. Every run must end exact: each key holds
//! rounds x workers (`kv_replicas` checks it).

use std::time::Duration;

use pslite_tests::{spawn_node, wait_all_ok, Spawned};

const LIMIT: Duration = Duration::from_secs(120);

fn node(role: &str, port: u16) -> Spawned {
    let extra = [
        (
            "RUST_LOG",
            "warn,pslite_van_core::replica=info,pslite_van_core::leave=info,pslite_van_core::scheduler=info",
        ),
        ("DMLC_NUM_SERVER", "1:2"),
        ("PS_HEARTBEAT_INTERVAL", "1"),
        ("PS_HEARTBEAT_TIMEOUT", "3"),
        ("KV_ROUNDS", "300"),
        ("KV_ROUND_MS", "20"),
    ];
    // DMLC_NUM_SERVER in `extra` comes after node_env's and wins.
    spawn_node("kv_replicas", role, 1, 2, port, &extra)
}

fn wait_round(workers: &[Spawned], round: u32) {
    for w in workers {
        w.wait_for_line(&format!("round {round}"), LIMIT)
            .unwrap_or_else(|| panic!("a worker never reached round {round}"));
    }
}

#[test]
fn a_server_joins_a_running_job_and_another_leaves_it() {
    let port = pslite_tests::free_port();
    let scheduler = node("scheduler", port);
    let first = node("server", port);
    let workers = vec![node("worker", port), node("worker", port)];
    first
        .wait_for_line("serving", LIMIT)
        .expect("the first server never served");
    wait_round(&workers, 40);

    // A second server joins while the workers push: it gets the next rank
    // and a copy of the ranges whose target it is.
    let joiner = node("server", port);
    let line = joiner
        .wait_for_line("serving", LIMIT)
        .expect("the joining server never served");
    assert!(line.contains("node 10 serving (replacement)"), "{line}");
    scheduler
        .wait_for_line("caught up", LIMIT)
        .expect("no copy to the joining server finished");
    wait_round(&workers, 120);

    // The first server leaves: SIGTERM, its ranges move to the joiner, and
    // only then it exits 0.
    first.signal(libc::SIGTERM);
    let left = first.wait(LIMIT);
    assert!(left.ok(), "the leaving server failed:\n{}", left.output());
    assert!(left.stdout.contains("left the job"), "{}", left.output());

    let runs = wait_all_ok(
        std::iter::once(scheduler)
            .chain(std::iter::once(joiner))
            .chain(workers),
        LIMIT,
    );
    let out: String = runs
        .iter()
        .map(|r| format!("{}{}", r.stdout, r.stderr))
        .collect();
    assert!(!out.contains("panicked"), "{out}");
    assert_eq!(out.matches("exact:").count(), 2, "{out}");
    assert!(
        out.contains("server 8 left the job"),
        "the scheduler never let the leaver go:\n{out}"
    );
    // Its leaving is no failure anywhere.
    assert!(!out.contains("fail over"), "{out}");
}
