//! Tests of `supervisor`.

use super::*;

fn policy() -> Policy {
    Policy {
        timeout: None,
        exit_grace: Duration::from_secs(10),
        settle: Duration::from_secs(2),
        kill_grace: Duration::from_secs(3),
        restart_role: None,
        max_restarts: 3,
        elastic: false,
        replicas: 1,
    }
}

/// scheduler, server 0, worker 0, worker 1.
fn cluster(policy: Policy, t0: Instant) -> Supervisor {
    Supervisor::new(
        policy,
        vec![
            ("scheduler".into(), Role::Scheduler),
            ("server 0".into(), Role::Server),
            ("worker 0".into(), Role::Worker),
            ("worker 1".into(), Role::Worker),
        ],
        t0,
    )
}

fn secs(t0: Instant, s: f64) -> Instant {
    t0 + Duration::from_secs_f64(s)
}

fn sigterm(nodes: &[usize]) -> Action {
    Action::Signal {
        nodes: nodes.to_vec(),
        signal: libc::SIGTERM,
    }
}

#[test]
fn every_node_exiting_0_is_success() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    for i in 0..4 {
        assert!(s.on_exit(i, Ended::Code(0), secs(t0, 0.1)).is_empty());
    }
    assert_eq!(s.outcome(), Some(Outcome::Success));
}

#[test]
fn a_failure_waits_for_the_scheduler_then_reports_both() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    assert!(s.on_exit(2, Ended::Code(1), secs(t0, 5.0)).is_empty());
    assert_eq!(s.deadline(), Some(secs(t0, 7.0)));
    // The scheduler fails too, within the settle window: stop the rest.
    let actions = s.on_exit(0, Ended::Code(1), secs(t0, 5.1));
    assert_eq!(actions, [sigterm(&[1, 3])]);
    s.on_exit(1, Ended::Signal(libc::SIGTERM), secs(t0, 5.2));
    s.on_exit(3, Ended::Signal(libc::SIGTERM), secs(t0, 5.2));
    let outcome = s.outcome().unwrap();
    assert_eq!(
        outcome.summary(),
        "worker 0 failed with exit code 1; scheduler failed with exit code 1; \
         stopped server 0, worker 1"
    );
    assert_eq!(outcome.exit_code(), 1);
}

#[test]
fn a_failure_stops_the_others_after_the_settle_window() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    s.on_exit(3, Ended::Signal(libc::SIGSEGV), secs(t0, 1.0));
    assert!(s.on_tick(secs(t0, 2.9)).is_empty());
    assert_eq!(s.on_tick(secs(t0, 3.0)), [sigterm(&[0, 1, 2])]);
    // SIGKILL for whoever ignores SIGTERM.
    s.on_exit(0, Ended::Code(0), secs(t0, 3.1));
    assert_eq!(s.deadline(), Some(secs(t0, 6.0)));
    assert_eq!(
        s.on_tick(secs(t0, 6.0)),
        [Action::Signal {
            nodes: vec![1, 2],
            signal: libc::SIGKILL
        }]
    );
    s.on_exit(1, Ended::Signal(libc::SIGKILL), secs(t0, 6.1));
    s.on_exit(2, Ended::Signal(libc::SIGKILL), secs(t0, 6.1));
    let outcome = s.outcome().unwrap();
    assert_eq!(
        outcome.summary(),
        "worker 1 was killed by signal 11 (SIGSEGV); stopped scheduler, server 0, worker 0"
    );
    assert_eq!(outcome.exit_code(), 139);
}

#[test]
fn a_failed_scheduler_stops_the_others_at_once() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    assert_eq!(
        s.on_exit(0, Ended::Code(2), secs(t0, 1.0)),
        [sigterm(&[1, 2, 3])]
    );
}

#[test]
fn an_early_exit_0_is_named_then_fails_the_job_after_the_grace() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    assert!(s.on_exit(1, Ended::Code(0), secs(t0, 1.0)).is_empty());
    assert_eq!(s.deadline(), Some(secs(t0, 4.0)));
    assert!(s.on_tick(secs(t0, 3.9)).is_empty());
    let said = s.on_tick(secs(t0, 4.0));
    assert_eq!(
        said,
        [Action::Say(
            "server 0 exited 0 while 3 nodes kept running (scheduler, worker 0, worker 1); \
             stopping them in 7 s unless they finish (--exit-grace)"
                .into()
        )]
    );
    assert_eq!(s.deadline(), Some(secs(t0, 11.0)));
    assert_eq!(s.on_tick(secs(t0, 11.0)), [sigterm(&[0, 2, 3])]);
    for i in [0, 2, 3] {
        s.on_exit(i, Ended::Signal(libc::SIGTERM), secs(t0, 11.1));
    }
    let outcome = s.outcome().unwrap();
    assert_eq!(
        outcome.summary(),
        "server 0 exited 0 but 3 nodes kept running for 10 s (--exit-grace); \
         stopped scheduler, worker 0, worker 1"
    );
    assert_eq!(outcome.exit_code(), 1);
}

#[test]
fn a_grace_shorter_than_the_notice_just_stops_the_job() {
    let t0 = Instant::now();
    let mut s = cluster(
        Policy {
            exit_grace: Duration::from_secs(1),
            ..policy()
        },
        t0,
    );
    s.on_exit(1, Ended::Code(0), secs(t0, 1.0));
    assert_eq!(s.deadline(), Some(secs(t0, 2.0)));
    assert_eq!(s.on_tick(secs(t0, 2.0)), [sigterm(&[0, 2, 3])]);
}

#[test]
fn nodes_finishing_within_the_grace_are_a_success() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    s.on_exit(0, Ended::Code(0), secs(t0, 1.0));
    for i in 1..4 {
        assert!(s.on_exit(i, Ended::Code(0), secs(t0, 1.5)).is_empty());
    }
    assert_eq!(s.outcome(), Some(Outcome::Success));
}

#[test]
fn the_timeout_lists_every_running_node() {
    let t0 = Instant::now();
    let mut s = cluster(
        Policy {
            timeout: Some(Duration::from_secs(60)),
            ..policy()
        },
        t0,
    );
    s.on_exit(2, Ended::Code(0), secs(t0, 59.5));
    // The timeout comes before the early-exit notice.
    assert_eq!(s.deadline(), Some(secs(t0, 60.0)));
    assert_eq!(s.on_tick(secs(t0, 60.0)), [sigterm(&[0, 1, 3])]);
    for i in [0, 1, 3] {
        s.on_exit(i, Ended::Signal(libc::SIGTERM), secs(t0, 60.1));
    }
    let outcome = s.outcome().unwrap();
    assert_eq!(
        outcome.summary(),
        "timed out after 60 s (--timeout); stopped scheduler, server 0, worker 1"
    );
    assert_eq!(outcome.exit_code(), 124);
}

#[test]
fn a_signal_stops_the_job_and_a_second_kills_it() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    let actions = s.on_signal(libc::SIGINT, secs(t0, 1.0));
    assert_eq!(
        actions,
        [
            Action::Say(
                "received SIGINT: stopping the job (scheduler, server 0, worker 0, worker 1); \
                 send it again to kill them at once"
                    .into()
            ),
            sigterm(&[0, 1, 2, 3])
        ]
    );
    // Nodes dying of the stop are not failures.
    s.on_exit(0, Ended::Signal(libc::SIGTERM), secs(t0, 1.1));
    let again = s.on_signal(libc::SIGINT, secs(t0, 1.2));
    assert_eq!(
        again[1],
        Action::Signal {
            nodes: vec![1, 2, 3],
            signal: libc::SIGKILL
        }
    );
    for i in 1..4 {
        s.on_exit(i, Ended::Signal(libc::SIGKILL), secs(t0, 1.3));
    }
    let outcome = s.outcome().unwrap();
    assert_eq!(
        outcome.summary(),
        "received SIGINT; stopped scheduler, server 0, worker 0, worker 1"
    );
    assert_eq!(outcome.exit_code(), 130);
}

#[test]
fn failed_nodes_of_the_restart_role_are_restarted_a_bounded_number_of_times() {
    let t0 = Instant::now();
    let mut s = cluster(
        Policy {
            restart_role: Some(Role::Server),
            max_restarts: 1,
            ..policy()
        },
        t0,
    );
    let actions = s.on_exit(1, Ended::Signal(libc::SIGKILL), secs(t0, 1.0));
    assert_eq!(
        actions,
        [
            Action::Say(
                "server 0 was killed by signal 9 (SIGKILL); restarting it \
                 (restart 1 of 1, --restart-on-failure)"
                    .into()
            ),
            Action::Restart(1)
        ]
    );
    assert!(s.outcome().is_none());
    // The second failure is one too many; the scheduler still runs, so settle first.
    assert!(s.on_exit(1, Ended::Code(1), secs(t0, 2.0)).is_empty());
    assert_eq!(s.on_tick(secs(t0, 4.0)), [sigterm(&[0, 2, 3])]);
    // Workers are never restarted.
    let mut s = cluster(
        Policy {
            restart_role: Some(Role::Server),
            ..policy()
        },
        t0,
    );
    assert!(s.on_exit(2, Ended::Code(1), secs(t0, 1.0)).is_empty());
    assert!(matches!(s.state, State::Settling { .. }));
}

fn elastic() -> Policy {
    Policy {
        elastic: true,
        ..policy()
    }
}

#[test]
fn an_elastic_worker_killed_is_not_a_job_failure() {
    let t0 = Instant::now();
    let mut s = cluster(elastic(), t0);
    let said = s.on_exit(3, Ended::Signal(libc::SIGKILL), secs(t0, 1.0));
    assert_eq!(
        said,
        [Action::Say(
            "worker 1 was killed by signal 9 (SIGKILL); the job goes on without it \
             (elastic workers: the scheduler starts a new round with the others)"
                .into()
        )]
    );
    // Nothing to wait for, nothing stopped.
    assert_eq!(s.deadline(), None);
    assert!(s.outcome().is_none());
    for i in 0..3 {
        assert!(s.on_exit(i, Ended::Code(0), secs(t0, 9.0)).is_empty());
    }
    assert_eq!(s.outcome(), Some(Outcome::Success));
}

#[test]
fn with_replicas_a_server_killed_is_not_a_job_failure() {
    let t0 = Instant::now();
    let policy = Policy {
        replicas: 2,
        ..policy()
    };
    let mut s = cluster(policy.clone(), t0);
    let said = s.on_exit(1, Ended::Signal(libc::SIGKILL), secs(t0, 1.0));
    assert_eq!(
        said,
        [Action::Say(
            "server 0 was killed by signal 9 (SIGKILL); the job goes on without it \
             (PS_REPLICAS=2: other servers hold copies of its key ranges)"
                .into()
        )]
    );
    assert!(s.outcome().is_none());
    for i in [0, 2, 3] {
        assert!(s.on_exit(i, Ended::Code(0), secs(t0, 9.0)).is_empty());
    }
    assert_eq!(s.outcome(), Some(Outcome::Success));
    // A worker failing still fails the job (its range was lost, say).
    let mut s = cluster(policy, t0);
    s.on_exit(1, Ended::Signal(libc::SIGKILL), secs(t0, 1.0));
    assert!(s.on_exit(2, Ended::Code(1), secs(t0, 2.0)).is_empty());
    assert!(matches!(s.state, State::Settling { .. }));
}

#[test]
fn in_elastic_mode_the_survivors_and_the_scheduler_decide_the_exit_code() {
    let t0 = Instant::now();
    let mut s = cluster(elastic(), t0);
    // Both workers die: the scheduler waits for joiners, then fails (below MIN).
    s.on_exit(2, Ended::Code(1), secs(t0, 1.0));
    s.on_exit(3, Ended::Signal(libc::SIGKILL), secs(t0, 1.5));
    assert!(s.outcome().is_none());
    assert_eq!(
        s.on_exit(0, Ended::Code(1), secs(t0, 30.0)),
        [sigterm(&[1])]
    );
    s.on_exit(1, Ended::Signal(libc::SIGTERM), secs(t0, 30.1));
    let outcome = s.outcome().unwrap();
    assert_eq!(
        outcome.summary(),
        "scheduler failed with exit code 1; stopped server 0"
    );
    assert_eq!(outcome.exit_code(), 1);
    // A server failing does fail an elastic job.
    let mut s = cluster(elastic(), t0);
    s.on_exit(2, Ended::Signal(libc::SIGKILL), secs(t0, 1.0));
    assert!(s.on_exit(1, Ended::Code(4), secs(t0, 2.0)).is_empty());
    assert_eq!(s.on_tick(secs(t0, 4.0)), [sigterm(&[0, 3])]);
    s.on_exit(0, Ended::Signal(libc::SIGTERM), secs(t0, 4.1));
    s.on_exit(3, Ended::Signal(libc::SIGTERM), secs(t0, 4.1));
    assert_eq!(s.outcome().map(|o| o.exit_code()), Some(4));
}

#[test]
fn plain_mode_keeps_failing_on_a_killed_worker() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    assert!(s
        .on_exit(3, Ended::Signal(libc::SIGKILL), secs(t0, 1.0))
        .is_empty());
    assert!(matches!(s.state, State::Settling { .. }));
    assert_eq!(s.on_tick(secs(t0, 3.0)), [sigterm(&[0, 1, 2])]);
}

#[test]
fn an_elastic_worker_leaving_early_starts_no_grace_until_the_last_worker_ends() {
    let t0 = Instant::now();
    let mut s = cluster(elastic(), t0);
    assert!(s.on_exit(2, Ended::Code(0), secs(t0, 1.0)).is_empty());
    assert_eq!(s.deadline(), None);
    // The last worker ends; the server and scheduler must follow.
    s.on_exit(3, Ended::Code(0), secs(t0, 20.0));
    assert_eq!(s.deadline(), Some(secs(t0, 23.0)));
    assert_eq!(s.on_tick(secs(t0, 30.0)), [sigterm(&[0, 1])]);
    // In plain mode, the same early exit starts the grace at once.
    let mut s = cluster(policy(), t0);
    s.on_exit(2, Ended::Code(0), secs(t0, 1.0));
    assert_eq!(s.deadline(), Some(secs(t0, 4.0)));
}

#[test]
fn added_nodes_are_supervised_like_the_others() {
    let t0 = Instant::now();
    let mut s = cluster(elastic(), t0);
    assert_eq!(
        s.add_node("worker 2".into(), Role::Worker, secs(t0, 1.0)),
        Some(4)
    );
    s.on_exit(2, Ended::Signal(libc::SIGKILL), secs(t0, 2.0));
    for i in [0, 1, 3] {
        s.on_exit(i, Ended::Code(0), secs(t0, 5.0));
    }
    // The added worker still runs.
    assert!(s.outcome().is_none());
    s.on_exit(4, Ended::Code(0), secs(t0, 5.1));
    assert_eq!(s.outcome(), Some(Outcome::Success));
    // Once the job is stopping, nothing more is started.
    let mut s = cluster(policy(), t0);
    s.on_signal(libc::SIGTERM, secs(t0, 1.0));
    assert_eq!(
        s.add_node("worker 2".into(), Role::Worker, secs(t0, 1.1)),
        None
    );
}

#[test]
fn renamed_nodes_are_named_so_in_lines_and_summaries() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    s.rename(2, "worker 0 (node 9)".into());
    s.rename(1, "server 0 (node 8)".into());
    s.on_exit(2, Ended::Code(3), secs(t0, 1.0));
    assert_eq!(s.on_tick(secs(t0, 3.0)), [sigterm(&[0, 1, 3])]);
    for i in [0, 1, 3] {
        s.on_exit(i, Ended::Signal(libc::SIGTERM), secs(t0, 3.1));
    }
    assert_eq!(
        s.outcome().unwrap().summary(),
        "worker 0 (node 9) failed with exit code 3; stopped scheduler, server 0 (node 8), \
         worker 1"
    );
}

#[test]
fn failures_are_the_nodes_that_ended_badly_on_their_own_in_order() {
    let t0 = Instant::now();
    let mut s = cluster(policy(), t0);
    s.on_exit(3, Ended::Code(2), secs(t0, 1.5));
    // Within the settle window the scheduler fails too: a failure of its own.
    s.on_exit(0, Ended::Code(1), secs(t0, 2.0));
    // The others are stopped: not failures, whatever their exit.
    s.on_exit(1, Ended::Signal(libc::SIGTERM), secs(t0, 2.1));
    s.on_exit(2, Ended::Code(0), secs(t0, 2.2));
    let failures: Vec<(usize, Ended, Duration)> = s
        .failures()
        .into_iter()
        .map(|e| (e.index, e.ended.clone(), e.after))
        .collect();
    assert_eq!(
        failures,
        [
            (3, Ended::Code(2), Duration::from_millis(1500)),
            (0, Ended::Code(1), Duration::from_secs(2))
        ]
    );
    // A clean job has none.
    let mut s = cluster(policy(), t0);
    for i in 0..4 {
        s.on_exit(i, Ended::Code(0), secs(t0, 1.0));
    }
    assert!(s.failures().is_empty());
}

#[test]
fn the_failure_table_lines_up_its_columns() {
    let rows = [
        FailureRow {
            node: "worker 1 (node 11)".into(),
            rank: Some("1".into()),
            exit: Ended::Code(3).short(),
            time: "0.4 s".into(),
            first_error: Some("error: oops".into()),
        },
        FailureRow {
            node: "scheduler".into(),
            rank: None,
            exit: Ended::Signal(libc::SIGSEGV).short(),
            time: "12.0 s".into(),
            first_error: None,
        },
    ];
    assert_eq!(
        failure_table(&rows),
        [
            "  node                rank  exit                   time  first error line",
            "  worker 1 (node 11)  1     exit code 3           0.4 s  error: oops",
            "  scheduler           -     signal 11 (SIGSEGV)  12.0 s  -",
        ]
    );
    assert!(failure_table(&[]).is_empty());
}

#[test]
fn signal_names() {
    assert_eq!(
        Ended::Signal(11).describe(),
        "was killed by signal 11 (SIGSEGV)"
    );
    assert_eq!(
        Ended::Signal(6).describe(),
        "was killed by signal 6 (SIGABRT)"
    );
    assert_eq!(Ended::Code(3).describe(), "failed with exit code 3");
    assert_eq!(signal_name(200), "unknown signal");
}
