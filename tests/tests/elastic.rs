//! Elastic workers (`DMLC_NUM_WORKER=MIN:MAX`) with real processes on
//! 127.0.0.1: two workers start, a third joins mid-job, one is killed -9,
//! the survivors finish and the server's sums equal exactly what each
//! round's members pushed; below MIN the job fails at `PS_RDZV_TIMEOUT` on
//! every node; bad MIN:MAX values are refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pslite_tests::{assert_all_ok, free_port, node_command, node_env, run, spawn, Spawned};

/// A node of the `elastic` example around 127.0.0.1:`port`, with
/// `DMLC_NUM_WORKER=workers`, short heartbeats and `extra`.
fn node(role: &str, workers: &str, port: u16, extra: &[(&str, &str)]) -> Spawned {
    let mut env = node_env(role, 1, 1, port);
    env.retain(|(k, _)| k != "DMLC_NUM_WORKER");
    env.push(("DMLC_NUM_WORKER".into(), workers.into()));
    let common = [
        ("PS_HEARTBEAT_INTERVAL", "1"),
        ("PS_HEARTBEAT_TIMEOUT", "3"),
        ("PS_RDZV_LAST_CALL", "1"),
    ];
    env.extend(
        common
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    spawn(node_command("elastic", &env))
}

/// `acked round R` lines of a worker's output, counted per round.
fn acked(stdout: &str, into: &mut BTreeMap<u64, u64>) {
    for line in stdout.lines() {
        let mut words = line.split_whitespace();
        if let (Some("worker"), _, Some("acked"), Some("round"), Some(r)) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) {
            *into.entry(r.parse().expect("a round number")).or_default() += 1;
        }
    }
}

/// `round R total T` lines.
fn totals(stdout: &str) -> BTreeMap<u64, u64> {
    stdout
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("round ")?;
            let (r, t) = rest.split_once(" total ")?;
            Some((r.parse().ok()?, t.parse::<f64>().ok()? as u64))
        })
        .collect()
}

#[test]
fn a_joiner_and_a_killed_worker_leave_the_sums_exact() {
    let port = free_port();
    let extra = [("ELASTIC_EPOCHS", "60"), ("ELASTIC_EPOCH_MS", "50")];
    let n = |role, more: &[(&str, &str)]| {
        let all: Vec<(&str, &str)> = extra.iter().chain(more).copied().collect();
        node(role, "2:4", port, &all)
    };
    let scheduler = n("scheduler", &[]);
    let server = n("server", &[]);
    let first = n("worker", &[]);
    let victim = n("worker", &[("ELASTIC_PARK_AFTER", "30")]);
    let limit = Duration::from_secs(60);
    first
        .wait_for_line("epoch 5", limit)
        .expect("the first round never got going");
    let joiner = n("worker", &[]);
    let start = joiner
        .wait_for_line("starts at epoch", limit)
        .expect("the joiner was never admitted");
    assert!(!start.contains("in round 0"), "{start}");
    victim
        .wait_for_line("parked after 30", limit)
        .expect("the victim never parked");
    victim.signal(libc::SIGKILL);
    let victim = victim.wait(limit);
    assert!(victim.code().is_none(), "not killed: {}", victim.output());
    let runs: Vec<_> = [scheduler, server, first, joiner]
        .into_iter()
        .map(|p| p.wait(Duration::from_secs(120)))
        .collect();
    assert_all_ok(&runs);
    let mut pushed = BTreeMap::new();
    for out in [&victim.stdout, &runs[2].stdout, &runs[3].stdout] {
        acked(out, &mut pushed);
    }
    let summed = totals(&runs[2].stdout);
    // Rounds with no push (a round that lasted while everyone waited) sum to 0.
    let nonzero: BTreeMap<u64, u64> = summed.into_iter().filter(|&(_, t)| t > 0).collect();
    assert_eq!(
        nonzero,
        pushed,
        "the server's sums per round differ from the acknowledged pushes:\n{}",
        runs[2].output()
    );
    // The victim's 30, the first worker's 60, the joiner's from its start.
    let joined_at: u64 = start
        .split_whitespace()
        .nth(5)
        .and_then(|e| e.parse().ok())
        .expect("the joiner's start epoch");
    assert_eq!(pushed.values().sum::<u64>(), 30 + 60 + (60 - joined_at));
    assert!(pushed.len() >= 2, "pushes in only one round: {pushed:?}");
    assert!(
        victim
            .stdout
            .lines()
            .filter(|l| l.contains("acked round"))
            .count()
            == 30,
        "{}",
        victim.output()
    );
    // The survivors, re-ranked: the first worker and the joiner (13: ids
    // go in registration order and are never reused).
    let id_of = |line: &str| {
        line.split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    let first_start = runs[2]
        .stdout
        .lines()
        .find(|l| l.contains("starts at epoch"))
        .unwrap_or_default();
    assert!(start.starts_with("worker 13 "), "{start}");
    let last = runs[2]
        .stdout
        .lines()
        .rfind(|l| l.contains("began with workers"))
        .unwrap_or_default();
    let expected = format!("workers [{}, 13]", id_of(first_start));
    assert!(
        last.ends_with(&expected),
        "{expected}: {}",
        runs[2].output()
    );
    assert!(runs[3].stdout.contains("finished 60 epochs"));
}

#[test]
fn below_min_every_node_fails_at_the_rendezvous_timeout() {
    let port = free_port();
    let extra = [("PS_RDZV_TIMEOUT", "3")];
    let started = Instant::now();
    let nodes = [
        node("scheduler", "2:4", port, &extra),
        node("server", "2:4", port, &extra),
        node("worker", "2:4", port, &extra),
    ];
    for p in nodes {
        let run = p.wait(Duration::from_secs(30));
        assert!(!run.timed_out, "hung: {}", run.output());
        assert!(
            run.code().is_some_and(|c| c != 0),
            "must fail: {}",
            run.output()
        );
        assert!(
            run.stderr.contains(
                "elastic rendezvous failed: 1 worker(s) for 3 s, fewer than the minimum 2"
            ),
            "{}",
            run.output()
        );
    }
    let took = started.elapsed();
    assert!(
        (Duration::from_secs(3)..Duration::from_secs(15)).contains(&took),
        "failed after {took:?}"
    );
}

#[test]
fn bad_min_max_values_are_refused_with_the_fix() {
    for bad in ["4:2", "0:3", "a:b"] {
        let mut env = node_env("worker", 1, 1, free_port());
        env.retain(|(k, _)| k != "DMLC_NUM_WORKER");
        env.push(("DMLC_NUM_WORKER".into(), bad.into()));
        let run = run(node_command("elastic", &env), Duration::from_secs(10));
        assert_eq!(run.code(), Some(2), "{}", run.output());
        assert!(
            run.stderr.contains(&format!(
                "DMLC_NUM_WORKER must be a whole number from 1 to 1000000 (or MIN:MAX for \
                 elastic workers, MIN <= MAX), got {bad:?}"
            )),
            "{}",
            run.output()
        );
    }
}
