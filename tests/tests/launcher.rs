//! `pslite launch` itself: environment, output prefixes, failures, early
//! exits, start timeouts, signals, restarts and per-role programs, with real
//! processes.

use std::process::Command;
use std::time::Duration;

use pslite_tests::{example, pslite_bin, pslite_command, run, spawn};

/// The launcher running `sh -c script` on every node (with a clean ps-lite
/// environment).
fn launch_command(args: &[&str], script: &str) -> Command {
    let mut cmd = pslite_command("launch");
    cmd.args(args).args(["--", "sh", "-c", script]);
    cmd
}

fn launch(args: &[&str], script: &str, limit: u64) -> pslite_tests::Run {
    run(launch_command(args, script), Duration::from_secs(limit))
}

/// The launcher's own lines (`pslite launch: ...`) on stderr.
fn launcher_lines(run: &pslite_tests::Run) -> Vec<&str> {
    run.stderr
        .lines()
        .filter(|l| l.starts_with("pslite launch: "))
        .collect()
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
    // Both workers fail at once; the scheduler and the server are stopped.
    let lines = launcher_lines(&run);
    assert_eq!(lines.len(), 1, "{}", run.output());
    assert!(
        lines[0].starts_with("pslite launch: worker ")
            && lines[0].contains(" failed with exit code 3")
            && lines[0].ends_with("; stopped scheduler, server 0"),
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
fn the_timeout_stops_everything_and_lists_every_running_node() {
    let run = launch(
        &["--servers", "2", "--workers", "3", "--timeout", "2"],
        "exec sleep 60",
        30,
    );
    assert_eq!(run.code(), Some(124), "{}", run.output());
    assert_eq!(
        launcher_lines(&run),
        [
            "pslite launch: timed out after 2 s (--timeout); stopped scheduler, server 0, \
          server 1, worker 0, worker 1, worker 2"
        ],
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

#[test]
fn a_node_killed_by_a_signal_is_named_with_the_signal() {
    let run = launch(
        &["--servers", "1", "--workers", "1", "--timeout", "60"],
        "if [ $DMLC_ROLE = worker ]; then kill -SEGV $$; fi; exec sleep 60",
        30,
    );
    assert_eq!(run.code(), Some(128 + 11), "{}", run.output());
    assert_eq!(
        launcher_lines(&run),
        ["pslite launch: worker 0 was killed by signal 11 (SIGSEGV); stopped scheduler, server 0"],
        "{}",
        run.output()
    );
}

#[test]
fn a_node_exiting_0_early_is_named_and_fails_the_job_after_the_grace() {
    // A server that "forgot to finalize": it exits 0 while the rest wait.
    let run = launch(
        &["--servers", "1", "--workers", "2", "--exit-grace", "5"],
        "if [ $DMLC_ROLE = server ]; then exit 0; fi; exec sleep 60",
        40,
    );
    assert_eq!(run.code(), Some(1), "{}", run.output());
    assert_eq!(
        launcher_lines(&run),
        [
            "pslite launch: server 0 exited 0 while 3 nodes kept running (scheduler, worker 0, \
             worker 1); stopping them in 2 s unless they finish (--exit-grace)",
            "pslite launch: server 0 exited 0 but 3 nodes kept running for 5 s (--exit-grace); \
             stopped scheduler, worker 0, worker 1"
        ],
        "{}",
        run.output()
    );
    assert!(
        run.elapsed < Duration::from_secs(30),
        "took {:?}",
        run.elapsed
    );
}

#[test]
fn nodes_ending_within_moments_of_each_other_are_not_reported() {
    let run = launch(
        &["--servers", "2", "--workers", "2"],
        "if [ $DMLC_ROLE = scheduler ]; then exit 0; fi; sleep 0.5",
        30,
    );
    run.assert_ok();
    assert!(launcher_lines(&run).is_empty(), "{}", run.output());
}

#[test]
fn on_a_start_timeout_the_schedulers_reason_is_printed_last() {
    // The server never starts: the scheduler and the workers all time out at
    // about the same moment, whichever first; the scheduler's line says who
    // is missing and must come last, every time.
    let connection = example("connection");
    let script = format!(
        "if [ $DMLC_ROLE = server ]; then exec sleep 60; fi; exec {}",
        connection.display()
    );
    for _ in 0..3 {
        let mut cmd = launch_command(&["--servers", "1", "--workers", "2"], &script);
        cmd.env("PS_START_TIMEOUT", "3");
        let run = run(cmd, Duration::from_secs(60));
        assert_eq!(run.code(), Some(1), "{}", run.output());
        let last = run.stderr.lines().last().unwrap_or_default();
        assert_eq!(
            last,
            "pslite launch: the scheduler said: error: the cluster did not form within 3 s \
             (PS_START_TIMEOUT): 1 of 1 servers and 0 of 2 workers never registered with the \
             scheduler",
            "{}",
            run.output()
        );
    }
}

#[test]
fn sigterm_to_the_launcher_says_why_the_job_stops() {
    let mut cmd = launch_command(
        &["--servers", "1", "--workers", "1"],
        "echo $DMLC_ROLE up; exec sleep 60",
    );
    cmd.env_remove("RUST_LOG");
    let launcher = spawn(cmd);
    for _ in 0..3 {
        assert!(
            launcher
                .wait_for_line(" up", Duration::from_secs(30))
                .is_some(),
            "the nodes never started"
        );
    }
    // Only the launcher: its nodes run in their own process groups.
    launcher.signal(libc::SIGTERM);
    let run = launcher.wait(Duration::from_secs(30));
    assert_eq!(run.code(), Some(128 + 15), "{}", run.output());
    assert_eq!(
        launcher_lines(&run),
        [
            "pslite launch: received SIGTERM: stopping the job (scheduler, server 0, worker 0); \
             send it again to kill them at once",
            "pslite launch: received SIGTERM; stopped scheduler, server 0, worker 0"
        ],
        "{}",
        run.output()
    );
}

#[test]
fn a_bad_setting_is_reported_once_before_any_node_starts() {
    let mut cmd = launch_command(&["--servers", "2", "--workers", "2"], "echo started");
    cmd.env("PS_VERBOSE", "loud");
    let run = run(cmd, Duration::from_secs(30));
    assert_eq!(run.code(), Some(2), "{}", run.output());
    assert_eq!(
        run.stderr.trim_end(),
        "pslite launch: PS_VERBOSE must be a whole number from 0 to 3 (0 warnings, 1 \
         connections, 2 every message; 3, which ps-lite scripts set, is 2), got \"loud\"",
        "{}",
        run.output()
    );
    assert!(!run.stdout.contains("started"), "{}", run.output());
}

#[test]
fn dmlc_interface_is_refused_rather_than_overridden() {
    let mut cmd = launch_command(&[], "echo started");
    cmd.env("DMLC_INTERFACE", "eth0");
    let run = run(cmd, Duration::from_secs(30));
    assert_eq!(run.code(), Some(2), "{}", run.output());
    assert!(
        run.stderr.contains(
            "pslite launch: DMLC_INTERFACE is set (eth0), but pslite launch gives every node \
             DMLC_NODE_HOST=127.0.0.1 (--host), which takes precedence"
        ),
        "{}",
        run.output()
    );
    assert!(!run.stdout.contains("started"), "{}", run.output());
}

#[test]
fn mxnet_programs_run_with_the_pslite_scheduler() {
    let mut cmd = Command::new(pslite_bin());
    cmd.args([
        "launch",
        "--servers",
        "1",
        "--workers",
        "2",
        "--timeout",
        "120",
    ])
    .args(["--scheduler-program", "pslite", "--server-program"])
    .arg(example("mxnet_server"))
    .arg("--")
    .arg(example("mxnet_worker"))
    .env_remove("RUST_LOG")
    .env_remove("PS_VERBOSE");
    let run = run(cmd, Duration::from_secs(140));
    run.assert_ok();
    assert!(
        run.stdout
            .contains("[scheduler] scheduler: every node finalized"),
        "{}",
        run.output()
    );
    for rank in 0..2 {
        assert!(
            run.stdout
                .contains(&format!("PASS [rust-worker rank {rank}] all checks")),
            "{}",
            run.output()
        );
    }
    assert!(
        run.stderr.contains(
            "[server 0] mxnet_server: finalized; 5 keys stored, 0 pushes left unmerged, 0 errors"
        ),
        "{}",
        run.output()
    );
}

/// The pid of a running child of `parent` whose environment has `var=value`.
fn child_with_env(parent: u32, var: &str, value: &str) -> Option<u32> {
    let wanted = format!("{var}={value}");
    let tasks = std::fs::read_dir(format!("/proc/{parent}/task")).ok()?;
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if env.split(|&b| b == 0).any(|kv| kv == wanted.as_bytes()) {
                return Some(pid);
            }
        }
    }
    None
}

#[test]
fn restart_on_failure_lets_kv_recovery_finish_under_the_launcher() {
    let mut cmd = Command::new(pslite_bin());
    cmd.args([
        "launch",
        "--servers",
        "2",
        "--workers",
        "2",
        "--timeout",
        "120",
    ])
    .args(["--restart-on-failure", "server", "--"])
    .arg(example("kv_recovery"))
    .env_remove("RUST_LOG")
    .env_remove("PS_VERBOSE")
    .env("PS_HEARTBEAT_INTERVAL", "1")
    .env("PS_HEARTBEAT_TIMEOUT", "3")
    .env("PS_RESEND", "1")
    .env("PS_RESEND_TIMEOUT", "300");
    let launcher = spawn(cmd);
    for _ in 0..2 {
        assert!(
            launcher
                .wait_for_line("round 200", Duration::from_secs(60))
                .is_some(),
            "the workers never got going"
        );
    }
    let server = child_with_env(launcher.pid(), "DMLC_ROLE", "server").expect("no server process");
    // SAFETY: kill(2) on a server process the launcher started.
    unsafe {
        libc::kill(server as libc::pid_t, libc::SIGKILL);
    }
    let run = launcher.wait(Duration::from_secs(140));
    run.assert_ok();
    assert!(
        run.stderr.contains(
            "was killed by signal 9 (SIGKILL); restarting it (restart 1 of 3, --restart-on-failure)"
        ),
        "{}",
        run.output()
    );
    assert!(
        run.stdout.contains("serving (recovered)"),
        "{}",
        run.output()
    );
    assert_eq!(
        run.stdout.matches("50 exact rounds after recovery").count(),
        2,
        "{}",
        run.output()
    );
}

#[test]
fn with_ps_verbose_the_launcher_says_which_process_is_which_node() {
    let mut cmd = launch_command(&["--servers", "1", "--workers", "2"], "echo pid=$$");
    cmd.env("PS_VERBOSE", "1");
    let run = run(cmd, Duration::from_secs(30));
    run.assert_ok();
    let started = launcher_lines(&run);
    assert_eq!(started.len(), 1, "{}", run.output());
    for node in ["scheduler", "server 0", "worker 0", "worker 1"] {
        let pid = run
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("[{node}] pid=")))
            .unwrap_or_else(|| panic!("{node} printed no pid:\n{}", run.output()));
        assert!(
            started[0].contains(&format!("{node} (pid {pid})")),
            "{node}: {}",
            run.output()
        );
    }
}
