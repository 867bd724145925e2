//! Elastic workers from the command line: `pslite launch --workers MIN:MAX`,
//! `pslite launch --add-worker` against a running cluster, a worker killed
//! with SIGKILL, and `pslite demo --elastic`, with real processes.

use std::process::Command;
use std::time::Duration;

use pslite_tests::{pslite_bin, run, spawn, Spawned};

/// `pslite` with a clean ps-lite environment.
fn pslite(args: &[&str]) -> Command {
    let mut cmd = Command::new(pslite_bin());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("DMLC_") || k.starts_with("PS_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// The scheduler port a launch's nodes print as `port=N`.
fn printed_port(launcher: &Spawned) -> String {
    let line = launcher
        .wait_for_line("port=", Duration::from_secs(30))
        .expect("no node printed its port");
    line.rsplit("port=").next().unwrap_or_default().to_string()
}

#[test]
fn add_worker_refuses_a_cluster_without_elastic_workers() {
    // A real pslite scheduler (the nodes never register; it only has to answer).
    let launcher = spawn(pslite(&[
        "launch",
        "-s",
        "1",
        "-w",
        "1",
        "--timeout",
        "30",
        "--scheduler-program",
        "pslite",
        "--",
        "sh",
        "-c",
        "echo port=$DMLC_PS_ROOT_PORT; exec sleep 60",
    ]));
    let port = printed_port(&launcher);
    let add = run(
        pslite(&["launch", "--add-worker", "--port", &port, "--", "true"]),
        Duration::from_secs(30),
    );
    assert_eq!(add.code(), Some(2), "{}", add.output());
    assert_eq!(
        add.stderr.trim_end(),
        format!(
            "pslite launch --add-worker: the cluster at 127.0.0.1:{port} does not take more \
             workers: it was not started with elastic workers by `pslite launch --workers \
             MIN:MAX` (its scheduler's store has no pslite.launch record); if it is elastic all \
             the same, give its --workers MIN:MAX and --servers"
        ),
        "{}",
        add.output()
    );
    launcher.signal(libc::SIGTERM);
    let run = launcher.wait(Duration::from_secs(30));
    assert!(!run.timed_out, "{}", run.output());
}

#[test]
fn add_worker_says_when_no_scheduler_answers() {
    let port = pslite_tests::free_port().to_string();
    let add = run(
        pslite(&["launch", "--add-worker", "--port", &port, "--", "true"]),
        Duration::from_secs(30),
    );
    assert_eq!(add.code(), Some(2), "{}", add.output());
    assert!(
        add.stderr.starts_with(&format!(
            "pslite launch --add-worker: cannot reach the cluster's scheduler: no answer from \
             the scheduler at tcp://127.0.0.1:{port} within 3.0 s"
        )),
        "{}",
        add.output()
    );
    // Without a port at all, it says what to give.
    let add = run(
        pslite(&["launch", "--add-worker", "--", "true"]),
        Duration::from_secs(30),
    );
    assert_eq!(add.code(), Some(2), "{}", add.output());
    assert!(
        add.stderr.contains("which cluster? pass --port"),
        "{}",
        add.output()
    );
}

#[test]
fn bad_elastic_worker_counts_are_refused_before_anything_starts() {
    for (args, says) in [
        (
            &["--workers", "4:2"][..],
            "expected MIN:MAX with 1 <= MIN <= MAX, got \"4:2\"",
        ),
        (
            &["--workers", "0:3"],
            "expected MIN:MAX with 1 <= MIN <= MAX, got \"0:3\"",
        ),
        (
            &["--workers", "2:4", "--start-workers", "5"],
            "--start-workers 5 must be from 1 to MAX (4) of --workers 2:4",
        ),
        (
            &["--workers", "3", "--start-workers", "2"],
            "--start-workers goes with --workers MIN:MAX",
        ),
        (
            &["--workers", "2:4", "--worker-procs", "1"],
            "--worker-procs does not go with elastic workers",
        ),
    ] {
        let mut cmd = pslite(&["launch"]);
        cmd.args(args).args(["--", "sh", "-c", "echo started"]);
        let run = run(cmd, Duration::from_secs(30));
        assert_eq!(run.code(), Some(2), "{args:?}: {}", run.output());
        assert!(run.stderr.contains(says), "{args:?}: {}", run.output());
        assert!(!run.stdout.contains("started"), "{}", run.output());
    }
}

/// Lines of `text` that contain `needle`.
fn lines_with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

#[test]
fn the_elastic_demo_says_when_each_round_began_and_reaches_its_threshold() {
    let run = run(
        pslite(&[
            "demo",
            "--elastic",
            "--samples",
            "60000",
            "--epochs",
            "8",
            "--timeout",
            "120",
        ]),
        Duration::from_secs(150),
    );
    run.assert_ok();
    let out = &run.stdout;
    // The scheduler's address first.
    assert!(
        out.starts_with("scheduler at 127.0.0.1:")
            && out.lines().next().unwrap().contains(" status --port "),
        "{}",
        run.output()
    );
    // Round 0 with the 2 workers started, round 1 with the added one,
    // round 2 without the killed one; in that order. Workers are named by
    // rank in the round with their node id, never by launch order.
    let rounds = lines_with(out, " began ");
    assert_eq!(rounds.len(), 3, "{}", run.output());
    assert_eq!(
        rounds[0],
        "round 0 began before training: worker 0 (node 9), worker 1 (node 11)",
        "{}",
        run.output()
    );
    assert!(
        rounds[1].starts_with("round 1 began after epoch "),
        "{}",
        run.output()
    );
    assert!(
        rounds[2].starts_with("round 2 began after epoch "),
        "{}",
        run.output()
    );
    // `worker R (node ID)` for each rank R of a round line.
    let members = |line: &str| -> Vec<i32> {
        let list = line.split(": ").nth(1).unwrap_or_default();
        list.split(", ")
            .enumerate()
            .map(|(rank, member)| {
                let rest = member
                    .strip_prefix(&format!("worker {rank} (node "))
                    .unwrap_or_else(|| panic!("{member:?} in {line:?}"));
                rest.trim_end_matches(')').parse().unwrap()
            })
            .collect()
    };
    let (one, two) = (members(rounds[1]), members(rounds[2]));
    assert_eq!(one.len(), 3, "{}", run.output());
    assert_eq!(two.len(), 2, "{}", run.output());
    // The killed worker (rank 1 of round 1) is in round 1 and not in
    // round 2; the added one (13) is in both.
    assert!(one.contains(&13) && two.contains(&13), "{}", run.output());
    let killed = one[1];
    assert!(!two.contains(&killed), "{}", run.output());
    let pos = |needle: &str| {
        out.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing:\n{}", run.output()))
    };
    let kill_line = format!("killing worker 1 (node {killed}) with SIGKILL");
    assert!(pos("adding a worker") < pos("round 1 began"));
    assert!(pos("round 1 began") < pos(&kill_line));
    assert!(pos(&kill_line) < pos("round 2 began"));
    assert!(
        run.stderr.contains(&format!(
            "pslite launch: worker (node {killed}) was killed by signal 9 (SIGKILL); the job goes on without it"
        )),
        "{}",
        run.output()
    );
    // Every epoch is still reported, and training gets there.
    for epoch in 0..=8 {
        assert!(
            out.contains(&format!("epoch {epoch}/8  test loss")),
            "{}",
            run.output()
        );
    }
    assert!(out.contains("(threshold 0.8): ok"), "{}", run.output());
}

/// Waits for an elastic launch's round 0 of nodes 9 and 11 and returns
/// the scheduler port its workers were given.
fn first_round_port(launcher: &Spawned) -> String {
    assert!(
        launcher
            .wait_for_line(
                "round 0 began before training: worker 0 (node 9), worker 1 (node 11)",
                Duration::from_secs(60)
            )
            .is_some(),
        "the first round never began"
    );
    let (_, env) = child_with_env(launcher.pid(), "DMLC_ROLE", "worker").expect("no worker");
    env.iter()
        .find_map(|kv| kv.strip_prefix("DMLC_PS_ROOT_PORT="))
        .expect("no DMLC_PS_ROOT_PORT")
        .to_string()
}

/// The first child of `parent` whose environment has `var=value`, and that
/// environment.
fn child_with_env(parent: u32, var: &str, value: &str) -> Option<(u32, Vec<String>)> {
    let wanted = format!("{var}={value}");
    let tasks = std::fs::read_dir(format!("/proc/{parent}/task")).ok()?;
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let env: Vec<String> = env
                .split(|&b| b == 0)
                .map(|kv| String::from_utf8_lossy(kv).into_owned())
                .collect();
            if env.contains(&wanted) {
                return Some((pid, env));
            }
        }
    }
    None
}

#[test]
fn a_launch_with_elastic_workers_takes_an_added_worker_and_survives_a_killed_one() {
    // Demo nodes as the program: worker rank 0 prints each epoch and each
    // new round.
    let node = [
        "demo",
        "--node",
        "--samples",
        "100000",
        "--epochs",
        "8",
        "--threshold",
        "0.8",
    ];
    let bin = pslite_bin().to_string_lossy().into_owned();
    let heartbeats = |cmd: &mut Command| {
        cmd.env("PS_HEARTBEAT_INTERVAL", "1")
            .env("PS_HEARTBEAT_TIMEOUT", "3");
    };
    let mut cmd = pslite(&[
        "launch",
        "-s",
        "1",
        "-w",
        "2:4",
        "--timeout",
        "120",
        "--",
        &bin,
    ]);
    cmd.args(node);
    heartbeats(&mut cmd);
    let launcher = spawn(cmd);
    let port = first_round_port(&launcher);
    assert!(
        launcher
            .wait_for_line("epoch 1/8", Duration::from_secs(60))
            .is_some(),
        "epoch 1 never ended"
    );
    let mut add = pslite(&["launch", "--add-worker", "--port", &port, "--", &bin]);
    add.args(node);
    heartbeats(&mut add);
    let added = spawn(add);
    let round = launcher
        .wait_for_line("round 1 began after epoch", Duration::from_secs(60))
        .expect("the added worker never joined a round");
    assert!(
        round.ends_with(": worker 0 (node 9), worker 1 (node 11), worker 2 (node 13)"),
        "{round}"
    );
    let (victim, _) = child_with_env(launcher.pid(), "DMLC_ROLE", "worker").expect("no worker");
    // SAFETY: kill(2) on a worker process the launcher started.
    unsafe {
        libc::kill(victim as libc::pid_t, libc::SIGKILL);
    }
    let round = launcher
        .wait_for_line("round 2 began after epoch", Duration::from_secs(60))
        .expect("no round after the kill");
    assert!(
        !round.contains("worker 2 (") && round.contains("(node 13)"),
        "{round}"
    );
    let run = launcher.wait(Duration::from_secs(150));
    let added = added.wait(Duration::from_secs(30));
    run.assert_ok();
    added.assert_ok();
    assert!(
        run.stderr
            .contains("was killed by signal 9 (SIGKILL); the job goes on without it"),
        "{}",
        run.output()
    );
    // Training finished (worker 0 checks the threshold) and both the
    // surviving first worker and the added one reported their work.
    assert!(run.stdout.contains("epoch 8/8"), "{}", run.output());
    assert_eq!(
        lines_with(&run.stdout, "] worker ").len(),
        1,
        "{}",
        run.output()
    );
    assert!(
        added.stdout.contains("[worker (node 13)] worker "),
        "{}",
        added.output()
    );
}

/// `acked round R epoch E` lines of the elastic example, counted by round.
fn acked_by_round(stdout: &str) -> std::collections::BTreeMap<u64, u64> {
    let mut acked = std::collections::BTreeMap::new();
    for line in stdout.lines() {
        let Some(rest) = line.split(" acked round ").nth(1) else {
            continue;
        };
        if let Some(round) = rest.split(' ').next().and_then(|r| r.parse().ok()) {
            *acked.entry(round).or_insert(0) += 1;
        }
    }
    acked
}

#[test]
fn elastic_example_under_the_launcher_keeps_exact_sums_through_a_join_and_a_kill() {
    // The elastic example pushes 1 to the key of the current round per
    // epoch and prints each acknowledged push; the first worker to start
    // parks after its 20th (so its pushes are known when it is killed).
    let dir = std::env::temp_dir().join(format!("pslite-elastic-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot make a temporary directory");
    let elastic = pslite_tests::example("elastic")
        .to_string_lossy()
        .into_owned();
    let script = format!(
        "if [ \"$DMLC_ROLE\" = worker ] && mkdir '{}/parked' 2>/dev/null; then \
         export ELASTIC_PARK_AFTER=20; fi; exec {elastic}",
        dir.display()
    );
    let env = |cmd: &mut Command| {
        cmd.env("PS_HEARTBEAT_INTERVAL", "1")
            .env("PS_HEARTBEAT_TIMEOUT", "3")
            .env("ELASTIC_EPOCHS", "40")
            .env("ELASTIC_EPOCH_MS", "50");
    };
    let mut cmd = pslite(&[
        "launch",
        "-s",
        "1",
        "-w",
        "2:4",
        "--timeout",
        "120",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    env(&mut cmd);
    let launcher = spawn(cmd);
    assert!(
        launcher
            .wait_for_line("acked round 0 epoch 2", Duration::from_secs(60))
            .is_some(),
        "the workers never pushed"
    );
    let (_, worker_env) =
        child_with_env(launcher.pid(), "DMLC_ROLE", "worker").expect("no worker process");
    let port = worker_env
        .iter()
        .find_map(|kv| kv.strip_prefix("DMLC_PS_ROOT_PORT="))
        .expect("no DMLC_PS_ROOT_PORT")
        .to_string();
    let mut add = pslite(&[
        "launch",
        "--add-worker",
        "--port",
        &port,
        "--",
        "sh",
        "-c",
        &script,
    ]);
    env(&mut add);
    let added = spawn(add);
    assert!(
        launcher
            .wait_for_line("parked after 20 acked pushes", Duration::from_secs(60))
            .is_some(),
        "no worker parked"
    );
    let (victim, _) = child_with_env(launcher.pid(), "ELASTIC_PARK_AFTER", "20")
        .expect("the parked worker is not the launcher's child");
    // SAFETY: kill(2) on a worker process the launcher started.
    unsafe {
        libc::kill(victim as libc::pid_t, libc::SIGKILL);
    }
    let run = launcher.wait(Duration::from_secs(150));
    let added = added.wait(Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
    run.assert_ok();
    added.assert_ok();
    assert!(
        run.stderr
            .contains("was killed by signal 9 (SIGKILL); the job goes on without it"),
        "{}",
        run.output()
    );
    assert!(
        added.stdout.contains("] worker 13 starts at epoch ")
            && added.stdout.contains("[worker (node 13)] "),
        "{}",
        added.output()
    );
    // Every acknowledged push is in the server's sums, exactly, per round.
    let mut acked = acked_by_round(&run.stdout);
    for (round, n) in acked_by_round(&added.stdout) {
        *acked.entry(round).or_insert(0) += n;
    }
    let totals: std::collections::BTreeMap<u64, u64> = run
        .stdout
        .lines()
        .chain(added.stdout.lines())
        .filter_map(|l| {
            let rest = l.split("] round ").nth(1)?;
            let (round, total) = rest.split_once(" total ")?;
            Some((
                round.parse().ok()?,
                total.trim().parse::<f64>().ok()? as u64,
            ))
        })
        .collect();
    assert!(acked.len() >= 3, "rounds {acked:?}\n{}", run.output());
    for (round, n) in &acked {
        assert_eq!(
            totals.get(round),
            Some(n),
            "round {round}: {n} pushes acknowledged, totals {totals:?}\n{}\n{}",
            run.output(),
            added.output()
        );
    }
}

#[test]
fn status_shows_round_ranks_and_a_worker_waiting_for_a_full_round() {
    let bin = pslite_bin().to_string_lossy().into_owned();
    // Long enough to outlive the checks; the launcher is stopped at the end.
    let node = ["demo", "--node", "--samples", "20000", "--epochs", "100000"];
    let mut cmd = pslite(&[
        "launch",
        "-s",
        "1",
        "-w",
        "2:2",
        "--timeout",
        "120",
        "--",
        &bin,
    ]);
    cmd.args(node);
    let launcher = spawn(cmd);
    let port = first_round_port(&launcher);
    // The round is full (MAX = 2): the added worker registers and waits.
    let mut add = pslite(&["launch", "--add-worker", "--port", &port, "--", &bin]);
    add.args(node);
    let added = spawn(add);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let table = loop {
        let status = run(
            pslite(&["status", "--port", &port]),
            Duration::from_secs(20),
        );
        assert!(!status.timed_out && status.ok(), "{}", status.output());
        if status.stdout.contains("waiting for the next round") {
            break status.stdout;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the added worker never showed as waiting:\n{}",
            status.output()
        );
        // A polling period, not synchronisation: each poll is a full answer.
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        table.contains("1 server, 2 workers (1 waiting for the next round)"),
        "{table}"
    );
    let row = |id: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("no row for node {id}:\n{table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(row("9")[2], "0", "{table}");
    assert_eq!(row("11")[2], "1", "{table}");
    let waiting = row("13");
    assert_eq!(waiting[1], "worker", "{table}");
    assert!(
        waiting.join(" ").ends_with("waiting for the next round"),
        "{table}"
    );
    added.signal(libc::SIGTERM);
    launcher.signal(libc::SIGTERM);
    let added = added.wait(Duration::from_secs(30));
    let run = launcher.wait(Duration::from_secs(30));
    assert!(!added.timed_out, "{}", added.output());
    assert!(!run.timed_out, "{}", run.output());
}
