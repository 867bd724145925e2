//! `pslite launch` itself: environment, output prefixes, failure and timeout.

use std::process::Command;
use std::time::Duration;

use pslite_tests::{pslite_bin, run};

fn launch(args: &[&str], script: &str, limit: u64) -> pslite_tests::Run {
    let mut cmd = Command::new(pslite_bin());
    cmd.arg("launch")
        .args(args)
        .args(["--", "sh", "-c", script]);
    run(cmd, Duration::from_secs(limit))
}

#[test]
fn every_node_gets_the_ps_lite_environment() {
    let run = launch(
        &["--servers", "2", "--workers", "3"],
        "echo role=$DMLC_ROLE s=$DMLC_NUM_SERVER w=$DMLC_NUM_WORKER \
         uri=$DMLC_PS_ROOT_URI host=$DMLC_NODE_HOST port=${DMLC_PS_ROOT_PORT:+set}",
        30,
    );
    run.assert_ok();
    let line = |node: &str, role: &str| {
        format!("[{node}] role={role} s=2 w=3 uri=127.0.0.1 host=127.0.0.1 port=set")
    };
    for expected in [
        line("scheduler", "scheduler"),
        line("server 0", "server"),
        line("server 1", "server"),
        line("worker 0", "worker"),
        line("worker 2", "worker"),
    ] {
        assert!(
            run.stdout.contains(&expected),
            "{expected:?} missing:\n{}",
            run.output()
        );
    }
}

#[test]
fn a_failing_node_stops_the_others_and_is_named() {
    // Workers fail; the others would run for a minute.
    let run = launch(
        &["--servers", "1", "--workers", "2", "--timeout", "60"],
        "if [ $DMLC_ROLE = worker ]; then echo oops >&2; exit 3; fi; exec sleep 60",
        30,
    );
    assert_eq!(run.code(), Some(3), "{}", run.output());
    assert!(run.stderr.contains("[worker "), "{}", run.output());
    assert!(
        run.stderr
            .contains("failed with exit code 3; stopped the other nodes"),
        "{}",
        run.output()
    );
    assert!(
        run.elapsed < Duration::from_secs(20),
        "took {:?}",
        run.elapsed
    );
}

#[test]
fn the_timeout_stops_everything() {
    let run = launch(
        &["--servers", "1", "--workers", "1", "--timeout", "1"],
        "exec sleep 60",
        30,
    );
    assert_eq!(run.code(), Some(124), "{}", run.output());
    assert!(
        run.stderr
            .contains("timed out after 1 s; stopped scheduler, server 0, worker 0"),
        "{}",
        run.output()
    );
}

#[test]
fn worker_procs_must_divide_workers() {
    let run = launch(&["--workers", "3", "--worker-procs", "2"], "true", 10);
    assert_eq!(run.code(), Some(2), "{}", run.output());
    assert!(run
        .stderr
        .contains("--worker-procs 2 must divide --workers 3"));
}

#[test]
fn worker_procs_host_several_workers() {
    let run = launch(
        &["--workers", "4", "--worker-procs", "2"],
        "echo $DMLC_ROLE ${PSLITE_WORKERS_PER_PROCESS:-none}",
        30,
    );
    run.assert_ok();
    assert!(
        run.stdout.contains("[worker 1] worker 2"),
        "{}",
        run.output()
    );
    assert!(!run.stdout.contains("[worker 2]"), "{}", run.output());
    assert!(
        run.stdout.contains("[server 0] server none"),
        "{}",
        run.output()
    );
}
