//! A server stopped (SIGSTOP) while it waits in the job's last barrier,
//! across the barrier's release, as real processes (issue 43): resumed
//! (SIGCONT), it reads the release and exits 0, whether it was stopped for
//! less than the heartbeat timeout or for longer, declared dead before the
//! release or after it, with the scheduler still running or gone.

use std::time::{Duration, Instant};

use pslite_tests::{free_port, node_command, node_env_with, spawn, spawn_with_stdin, Spawned};

/// A node of the `barriers` example (no rounds: it only starts and
/// finalizes) in a 1 + 1 job around 127.0.0.1:`port`, heartbeats every
/// second and a 3 s heartbeat timeout; the worker waits for a line on
/// standard input before it finalizes.
fn node(role: &str, port: u16) -> Spawned {
    let mut extra = vec![
        ("BARRIER_ROUNDS", "0"),
        ("PS_HEARTBEAT_INTERVAL", "1"),
        ("PS_HEARTBEAT_TIMEOUT", "3"),
    ];
    if role == "scheduler" {
        extra.push((
            "RUST_LOG",
            "info,pslite_van_core::scheduler::barriers=debug",
        ));
    }
    if role == "worker" {
        extra.push(("BARRIER_WAIT_STDIN", "1"));
    }
    let cmd = node_command("barriers", &node_env_with(role, 1, 1, port, &extra));
    if role == "worker" {
        spawn_with_stdin(cmd)
    } else {
        spawn(cmd)
    }
}

/// Stops the server once it waits in the last barrier, waits `before`,
/// lets the worker finalize (the scheduler releases the barrier while the
/// server is stopped), waits `after`, resumes it, and requires it to exit
/// 0 within 15 s.
fn paused_across_the_release(before: Duration, after: Duration) {
    let port = free_port();
    let scheduler = node("scheduler", port);
    let server = node("server", port);
    let mut worker = node("worker", port);
    worker
        .wait_for_line("ready", Duration::from_secs(60))
        .expect("the worker never started");
    // The start barrier (group 7) passed; now the scheduler and the server
    // wait in the last one (the worker waits for its line).
    scheduler
        .wait_for_line("barrier 7: 3/3 arrived", Duration::from_secs(30))
        .expect("no start barrier");
    scheduler
        .wait_for_line("barrier 7: 2/3 arrived", Duration::from_secs(30))
        .expect("the server never entered the last barrier");
    server.signal(libc::SIGSTOP);
    if before > Duration::ZERO {
        std::thread::sleep(before);
        scheduler
            .wait_for_line("node 8 is dead", Duration::from_secs(10))
            .expect("the stopped server was not declared dead");
    }
    worker.write_stdin("go\n");
    // The worker exits 0 once released: the release went out.
    let worker = worker.wait(Duration::from_secs(90));
    assert!(worker.ok(), "{}", worker.output());
    std::thread::sleep(after);
    server.signal(libc::SIGCONT);
    let resumed = Instant::now();
    let server = server.wait(Duration::from_secs(120));
    let took = resumed.elapsed();
    let scheduler = scheduler.wait(Duration::from_secs(120));
    eprintln!(
        "server stopped {before:?} before the release and {after:?} after: exited {:?} \
         {took:?} after SIGCONT",
        server.code()
    );
    assert!(
        server.ok() && took < Duration::from_secs(15),
        "the server took {took:?}:\n{}\nscheduler:\n{}",
        server.output(),
        scheduler.output()
    );
    assert!(scheduler.ok(), "{}", scheduler.output());
}

#[test]
fn a_server_stopped_across_the_last_release_below_the_timeout_exits_0() {
    paused_across_the_release(Duration::ZERO, Duration::from_secs(2));
}

#[test]
fn a_server_stopped_across_the_last_release_and_the_schedulers_exit_exits_0() {
    // Past the 3 s heartbeat timeout (declared dead after the release),
    // and past the 5 s the scheduler waits for the nodes to leave: it has
    // exited when the server resumes.
    paused_across_the_release(Duration::ZERO, Duration::from_secs(8));
}

#[test]
fn a_server_declared_dead_before_the_last_release_still_gets_it() {
    paused_across_the_release(Duration::from_secs(5), Duration::from_secs(5));
}
