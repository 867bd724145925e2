//! Clusters form, run barriers and shut down: real processes under
//! `pslite launch` on 127.0.0.1.

use std::time::Duration;

use pslite_tests::{node_prefix, Launch};

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn connection_2_servers_2_workers() {
    let run = Launch::example("connection", 2, 2).run();
    run.assert_ok();
    assert_eq!(count(&run.stdout, "finalized"), 5, "{}", run.output());
    // `[server 0]`, or `[server 0 (node 8)]` once the launcher knew the id.
    for node in [
        "[scheduler]",
        "[server 0",
        "[server 1",
        "[worker 0",
        "[worker 1",
    ] {
        assert!(
            run.stdout.contains(node),
            "no output from {node}:\n{}",
            run.output()
        );
    }
    // Ids: servers 8, 10; workers 9, 11.
    for id in ["(node 8)", "(node 9)", "(node 10)", "(node 11)", "(node 1)"] {
        assert!(run.stdout.contains(id), "{id} missing:\n{}", run.output());
    }
    // The prefix's rank is the node's own (`worker rank 1 (node 11)`), and
    // so is the id when the prefix has it.
    let mut said = 0;
    for line in run.stdout.lines() {
        let (Some(prefix), Some(rest)) = (node_prefix(line), line.split_once("] ")) else {
            continue;
        };
        let words: Vec<&str> = rest.1.split_whitespace().collect();
        if let [role, "rank", rank, "(node", id, ..] = words[..] {
            said += 1;
            assert_eq!(prefix.role, role, "{line}");
            if role != "scheduler" {
                assert_eq!(
                    prefix.rank.map(|r| r.to_string()).as_deref(),
                    Some(rank),
                    "{line}"
                );
            }
            if let Some(prefix_id) = prefix.id {
                assert_eq!(format!("{prefix_id})"), id, "{line}");
            }
        }
    }
    assert_eq!(said, 5, "{}", run.output());
}

#[test]
fn connection_8_servers_8_workers() {
    let run = Launch::example("connection", 8, 8).run();
    run.assert_ok();
    assert_eq!(count(&run.stdout, "finalized"), 17, "{}", run.output());
    assert!(run.stdout.contains("(node 23)") && run.stdout.contains("(node 22)"));
}

/// A larger cluster forms, and a node opens connections only to the
/// scheduler and itself until it sends to a peer (no 2 * 24 * 24 handshakes
/// on the start path). The 1+100+100 figure is in docs/BENCHMARKS.md.
#[test]
fn connection_24_servers_24_workers_connects_on_demand() {
    let run = Launch::example("connection", 24, 24)
        .env("PS_VERBOSE", "1")
        .timeout(Duration::from_secs(120))
        .run();
    run.assert_ok();
    assert_eq!(count(&run.stdout, "finalized"), 49, "{}", run.output());
    for (role, rank) in [("server", 3), ("worker", 17)] {
        let node = format!("{role} {rank}");
        let connects = run
            .stderr
            .lines()
            .filter(|l| {
                node_prefix(l).is_some_and(|p| p.role == role && p.rank == Some(rank))
                    && l.contains("connecting to node")
            })
            .count();
        // The scheduler (first contact, then as ps<id>) and itself.
        assert_eq!(connects, 3, "{node} connected to:\n{}", run.output());
    }
}

#[test]
fn barriers_over_every_group() {
    let run = Launch::example("barriers", 2, 2)
        .env("BARRIER_ROUNDS", "5")
        .run();
    run.assert_ok();
    // Each role belongs to 4 of the 7 groups: 20 barriers in 5 rounds.
    assert_eq!(
        count(&run.stdout, "20 barriers passed"),
        5,
        "{}",
        run.output()
    );
}

#[test]
fn ipc_transport_with_dmlc_local() {
    let run = Launch::example("barriers", 2, 2)
        .env("DMLC_LOCAL", "1")
        .env("BARRIER_ROUNDS", "2")
        .run();
    run.assert_ok();
    assert_eq!(
        count(&run.stdout, "8 barriers passed"),
        5,
        "{}",
        run.output()
    );
}

#[test]
fn host_names_work_where_ips_do() {
    let run = Launch::example("connection", 1, 2)
        .arg("--host")
        .arg("localhost")
        .run();
    run.assert_ok();
    assert_eq!(count(&run.stdout, "finalized"), 4, "{}", run.output());
}

#[test]
fn node_ids_are_deterministic_for_fixed_addresses() {
    // With PORT fixed per process, the (hostname, port) order fixes the ids.
    // The launcher cannot give each node its own PORT, so run nodes directly.
    use pslite_tests::{free_port, node_command, node_env, spawn};
    let mut ids = Vec::new();
    for _ in 0..2 {
        let port = free_port();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut procs = vec![spawn(node_command(
            "connection",
            &node_env("scheduler", 1, 2, port),
        ))];
        for (i, role) in ["server", "worker", "worker"].iter().enumerate() {
            let mut env = node_env(role, 1, 2, port);
            env.push(("PORT".into(), ports[i].to_string()));
            procs.push(spawn(node_command("connection", &env)));
        }
        let runs: Vec<_> = procs
            .into_iter()
            .map(|p| p.wait(Duration::from_secs(60)))
            .collect();
        for run in &runs {
            run.assert_ok();
        }
        // Worker ids follow port order.
        let (lo, hi) = if ports[1] < ports[2] { (2, 3) } else { (3, 2) };
        assert!(
            runs[lo].stdout.contains("(node 9)"),
            "{}",
            runs[lo].output()
        );
        assert!(
            runs[hi].stdout.contains("(node 11)"),
            "{}",
            runs[hi].output()
        );
        ids.push(runs[1].stdout.contains("(node 8)"));
    }
    assert_eq!(ids, vec![true, true]);
}

#[test]
fn the_demo_trains_to_its_threshold() {
    // The README's first command, shortened to 2 epochs.
    let mut cmd = std::process::Command::new(pslite_tests::pslite_bin());
    cmd.args(["demo", "--epochs", "2", "--timeout", "120"]);
    let run = pslite_tests::run(cmd, Duration::from_secs(150));
    run.assert_ok();
    assert!(run.stdout.contains("epoch 2/2"), "{}", run.output());
    assert!(
        run.stdout.contains("(threshold 0.8): ok"),
        "{}",
        run.output()
    );
}
