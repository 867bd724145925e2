//! `pslite launch` itself: environment, the scheduler's address, output
//! prefixes by rank, log files, failures and their summary, early exits,
//! start timeouts, signals, restarts, per-role programs, and nodes dying
//! with a launcher killed with SIGKILL, with real processes.

use std::process::Command;
use std::time::Duration;

use pslite_tests::{
    example, node_prefix, process_gone, pslite_bin, pslite_command, run, spawn, within, workspace,
    Launch,
};

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

/// The launcher's own lines (`pslite launch: ...`) on stderr, after the
/// first one (the scheduler's address, see
/// `the_schedulers_address_comes_first_with_a_status_command_that_works`).
fn launcher_lines(run: &pslite_tests::Run) -> Vec<&str> {
    run.stderr
        .lines()
        .filter(|l| {
            l.starts_with("pslite launch: ") && !l.starts_with("pslite launch: scheduler at ")
        })
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
    assert_eq!(lines.len(), 5, "{}", run.output());
    assert!(
        lines[0].starts_with("pslite launch: worker ")
            && lines[0].contains(" failed with exit code 3")
            && lines[0].ends_with("; stopped scheduler, server 0"),
        "{}",
        run.output()
    );
    // Then the table of failed nodes: both workers, by rank, with the
    // time and the line they wrote.
    assert_eq!(lines[1], "pslite launch: failed nodes:", "{}", run.output());
    let columns = |line: &str| -> Vec<String> {
        line.trim_start_matches("pslite launch:")
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect()
    };
    assert_eq!(
        columns(lines[2]),
        ["node", "rank", "exit", "time", "first error line"],
        "{}",
        run.output()
    );
    let mut ranks = Vec::new();
    for row in &lines[3..] {
        let cells = columns(row);
        assert_eq!(cells.len(), 5, "{row}");
        assert_eq!(cells[0], format!("worker {}", cells[1]), "{row}");
        assert_eq!(cells[2], "exit code 3", "{row}");
        assert!(cells[3].ends_with(" s"), "{row}");
        assert_eq!(cells[4], "oops", "{row}");
        ranks.push(cells[1].clone());
    }
    ranks.sort();
    assert_eq!(ranks, ["0", "1"], "{}", run.output());
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
    // A process of several workers is named as one until the scheduler
    // says which ranks it hosts.
    assert!(
        run.stdout.contains("[worker process 1] worker 2"),
        "{}",
        run.output()
    );
    assert!(
        !run.stdout.contains("[worker process 2]"),
        "{}",
        run.output()
    );
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
    let lines = launcher_lines(&run);
    assert_eq!(
        lines[0],
        "pslite launch: worker 0 was killed by signal 11 (SIGSEGV); stopped scheduler, server 0",
        "{}",
        run.output()
    );
    assert_eq!(lines.len(), 4, "{}", run.output());
    assert!(
        lines[3].starts_with("pslite launch:   worker 0  0     signal 11 (SIGSEGV)  "),
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
    let finalized = run
        .stderr
        .lines()
        .find(|l| {
            l.ends_with(
                "] mxnet_server: finalized; 5 keys stored, 0 pushes left unmerged, 0 errors",
            )
        })
        .unwrap_or_else(|| panic!("the server did not finalize:\n{}", run.output()));
    let server = node_prefix(finalized).expect("no node prefix");
    assert_eq!(
        (server.role.as_str(), server.rank),
        ("server", Some(0)),
        "{finalized}"
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

#[test]
fn the_schedulers_address_comes_first_with_a_status_command_that_works() {
    // A real pslite scheduler; the nodes never register (it only has to answer).
    let mut cmd = launch_command(
        &[
            "--servers",
            "1",
            "--workers",
            "1",
            "--scheduler-program",
            "pslite",
        ],
        "echo port=$DMLC_PS_ROOT_PORT; exec sleep 60",
    );
    // From the workspace, where `cargo run` leaves the binary: the command
    // names it by its path from there.
    cmd.current_dir(workspace());
    let launcher = spawn(cmd);
    let first = launcher
        .wait_for_line("pslite launch: ", Duration::from_secs(30))
        .expect("the launcher said nothing");
    let port = launcher
        .wait_for_line("port=", Duration::from_secs(30))
        .and_then(|l| l.rsplit("port=").next().map(str::to_string))
        .expect("no node printed its port");
    let bin = pslite_bin().canonicalize().unwrap();
    let bin = bin
        .strip_prefix(workspace().canonicalize().unwrap())
        .unwrap_or(&bin)
        .display()
        .to_string();
    assert_eq!(
        first,
        format!(
            "pslite launch: scheduler at 127.0.0.1:{port}; see the job with: {bin} status --port {port}"
        )
    );
    // Pasted into a shell in the same directory, the command answers.
    let command = first
        .split("see the job with: ")
        .nth(1)
        .unwrap()
        .to_string();
    let mut shell = Command::new("sh");
    shell.args(["-c", &command]).current_dir(workspace());
    let status = run(shell, Duration::from_secs(30));
    status.assert_ok();
    assert!(
        status
            .stdout
            .starts_with(&format!("cluster at 127.0.0.1:{port}: ")),
        "{}",
        status.output()
    );
    launcher.signal(libc::SIGTERM);
    let run = launcher.wait(Duration::from_secs(30));
    assert!(!run.timed_out, "{}", run.output());
    // The address is the launcher's first line.
    assert!(
        run.stderr
            .starts_with("pslite launch: scheduler at 127.0.0.1:"),
        "{}",
        run.output()
    );
}

#[test]
fn prefixes_name_nodes_by_rank_with_their_node_id_and_log_dir_keeps_a_file_each() {
    let dir = std::env::temp_dir().join(format!("pslite-log-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let launch = Launch {
        servers: 2,
        workers: 2,
        launcher_args: vec!["--log-dir".into(), dir.display().to_string()],
        program: [&pslite_bin().display().to_string(), "demo", "--node"]
            .into_iter()
            .chain(["--samples", "100000", "--epochs", "3"])
            .map(String::from)
            .collect(),
        env: Default::default(),
        timeout: Duration::from_secs(120),
    };
    let run = launch.run();
    run.assert_ok();
    // Each node's report names its rank (`worker 1: ...`, `server 0: ...`);
    // the prefix says the same rank, and the id that goes with it.
    let mut reports = 0;
    for line in run.stdout.lines() {
        let Some(prefix) = node_prefix(line) else {
            continue;
        };
        let Some(text) = line.split_once("] ").map(|(_, t)| t) else {
            continue;
        };
        let rank = prefix
            .rank
            .expect("a server or worker prefix without a rank");
        for (role, base) in [("server", 8), ("worker", 9)] {
            if text.starts_with(&format!("{role} ")) && text.contains(": ") {
                reports += 1;
                assert_eq!(prefix.role, role, "{line}");
                assert!(text.starts_with(&format!("{role} {rank}: ")), "{line}");
                assert_eq!(prefix.id, Some(base + 2 * rank as i32), "{line}");
            }
        }
    }
    assert_eq!(reports, 4, "{}", run.output());
    // One file per node, its lines without prefixes.
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "scheduler.log",
            "server-0.log",
            "server-1.log",
            "worker-0.log",
            "worker-1.log"
        ]
    );
    let worker1 = std::fs::read_to_string(dir.join("worker-1.log")).unwrap();
    assert!(worker1.starts_with("worker 1: 45 000 samples"), "{worker1}");
    let worker0 = std::fs::read_to_string(dir.join("worker-0.log")).unwrap();
    assert!(worker0.starts_with("epoch 0/3  test loss"), "{worker0}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_launcher_killed_with_sigkill_leaves_no_node_or_child_behind() {
    // Every node starts a child of its own and prints both pids.
    let launcher = spawn(launch_command(
        &["--servers", "1", "--workers", "2"],
        "sleep 300 & echo pids $$ $!; wait",
    ));
    let mut pids = Vec::new();
    for _ in 0..4 {
        let line = launcher
            .wait_for_line(" pids ", Duration::from_secs(30))
            .expect("a node never started");
        pids.extend(
            line.rsplit(" pids ")
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .map(|p| p.parse::<u32>().unwrap()),
        );
    }
    assert_eq!(pids.len(), 8);
    assert!(pids.iter().all(|&p| !process_gone(p)), "{pids:?}");
    launcher.signal(libc::SIGKILL);
    let run = launcher.wait(Duration::from_secs(30));
    assert!(!run.timed_out, "{}", run.output());
    assert!(
        within(Duration::from_secs(10), || pids
            .iter()
            .all(|&p| process_gone(p))),
        "still running: {:?}",
        pids.iter()
            .filter(|&&p| !process_gone(p))
            .collect::<Vec<_>>()
    );
}
