//! A server stopped (SIGSTOP) while it waits in the job's last barrier,
//! across the barrier's release, as real processes (issue 43): resumed
//! (SIGCONT), it reads the release and exits 0, whether it was stopped for
//! less than the heartbeat timeout or for longer, declared dead before the
//! release or after it, with the scheduler still running or gone, and with
//! replicated key ranges (`PS_REPLICAS=2`: declared dead, its ranges fail
//! over; the scheduler did not send it the release, and it failed with
//! "lost the scheduler" once that exited).

use std::time::{Duration, Instant};

use pslite_tests::{free_port, node_command, node_env_with, spawn, spawn_with_stdin, Spawned};

/// A node of the `barriers` example (no rounds: it only starts and
/// finalizes) in a job of `servers` servers (`PS_REPLICAS=servers`) and 1
/// worker around 127.0.0.1:`port`, heartbeats every second and a 3 s
/// heartbeat timeout; the worker waits for a line on standard input before
/// it finalizes.
fn node(role: &str, port: u16, servers: usize) -> Spawned {
    let replicas = servers.to_string();
    let mut extra = vec![
        ("PS_REPLICAS", replicas.as_str()),
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
    let cmd = node_command("barriers", &node_env_with(role, servers, 1, port, &extra));
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
fn paused_across_the_release(servers: usize, before: Duration, after: Duration) {
    let port = free_port();
    let scheduler = node("scheduler", port, servers);
    let server = node("server", port, servers);
    let others: Vec<Spawned> = (1..servers)
        .map(|_| node("server", port, servers))
        .collect();
    let mut worker = node("worker", port, servers);
    worker
        .wait_for_line("ready", Duration::from_secs(60))
        .expect("the worker never started");
    // The start barrier (group 7) passed; now the scheduler and the server
    // wait in the last one (the worker waits for its line).
    let all = servers + 2;
    scheduler
        .wait_for_line(
            &format!("barrier 7: {all}/{all} arrived"),
            Duration::from_secs(30),
        )
        .expect("no start barrier");
    scheduler
        .wait_for_line(
            &format!("barrier 7: {}/{all} arrived", all - 1),
            Duration::from_secs(30),
        )
        .expect("the servers never entered the last barrier");
    server.signal(libc::SIGSTOP);
    if before > Duration::ZERO {
        std::thread::sleep(before);
        scheduler
            .wait_for_line("is dead", Duration::from_secs(10))
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
    for other in others {
        let run = other.wait(Duration::from_secs(120));
        assert!(run.ok(), "{}", run.output());
    }
}

#[test]
fn a_server_stopped_across_the_last_release_below_the_timeout_exits_0() {
    paused_across_the_release(1, Duration::ZERO, Duration::from_secs(2));
}

#[test]
fn a_server_stopped_across_the_last_release_and_the_schedulers_exit_exits_0() {
    // Past the 3 s heartbeat timeout (declared dead after the release),
    // and past the 5 s the scheduler waits for the nodes to leave: it has
    // exited when the server resumes.
    paused_across_the_release(1, Duration::ZERO, Duration::from_secs(8));
}

#[test]
fn a_server_declared_dead_before_the_last_release_still_gets_it() {
    paused_across_the_release(1, Duration::from_secs(5), Duration::from_secs(5));
}

#[test]
fn a_replicated_server_failed_over_before_the_last_release_still_gets_it() {
    paused_across_the_release(2, Duration::from_secs(5), Duration::from_secs(5));
}
