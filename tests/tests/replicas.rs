//! Replicated key ranges (`PS_REPLICAS`) with real processes on 127.0.0.1:
//! servers killed with SIGKILL mid-job and no replacement (k = 2, and
//! k = 3 with two kills), and a replacement that receives copies of its
//! ranges while the workers push. Every run must end exact: each key holds
//! rounds x workers (`kv_replicas` checks it).

use std::time::Duration;

use pslite_tests::{free_port, pslite_command, run, spawn_node, wait_all_ok, Spawned, TempDir};

const LIMIT: Duration = Duration::from_secs(120);

/// One job at a time: each is six processes on a 2-core machine, and a
/// node starved of CPU for the heartbeat timeout is taken for dead.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn env(k: &str, rounds: u32) -> [(&'static str, String); 6] {
    [
        ("RUST_LOG", "warn,pslite_van_core::replica=info".to_string()),
        ("PS_REPLICAS", k.to_string()),
        ("PS_HEARTBEAT_INTERVAL", "1".to_string()),
        ("PS_HEARTBEAT_TIMEOUT", "3".to_string()),
        ("KV_ROUNDS", rounds.to_string()),
        ("KV_ROUND_MS", "20".to_string()),
    ]
}

struct Job {
    scheduler: Spawned,
    servers: Vec<Spawned>,
    workers: Vec<Spawned>,
    port: u16,
    k: String,
    /// DMLC_NUM_SERVER and DMLC_NUM_WORKER.
    size: (usize, usize),
    /// KV_ROUNDS.
    rounds: u32,
}

impl Job {
    fn start(servers: usize, workers: usize, k: &str) -> Job {
        Job::start_rounds(servers, workers, k, 300)
    }

    fn start_rounds(servers: usize, workers: usize, k: &str, rounds: u32) -> Job {
        let port = free_port();
        let mut job = Job {
            scheduler: Job::node_at("scheduler", (servers, workers), port, k, rounds),
            servers: Vec::new(),
            workers: Vec::new(),
            port,
            k: k.to_string(),
            size: (servers, workers),
            rounds,
        };
        job.servers = (0..servers).map(|_| job.node("server")).collect();
        job.workers = (0..workers).map(|_| job.node("worker")).collect();
        job
    }

    fn node_at(role: &str, size: (usize, usize), port: u16, k: &str, rounds: u32) -> Spawned {
        let env = env(k, rounds);
        let extra: Vec<(&str, &str)> = env.iter().map(|(a, b)| (*a, b.as_str())).collect();
        spawn_node("kv_replicas", role, size.0, size.1, port, &extra)
    }

    fn node(&self, role: &str) -> Spawned {
        Job::node_at(role, self.size, self.port, &self.k, self.rounds)
    }

    /// Waits until every worker has done `round` rounds.
    fn wait_round(&self, round: u32) {
        for w in &self.workers {
            w.wait_for_line(&format!("round {round}"), LIMIT)
                .unwrap_or_else(|| panic!("a worker never reached round {round}"));
        }
    }

    /// Kills server `i` with SIGKILL; returns when (as [`log_ms`] counts).
    fn kill(&mut self, i: usize) -> u64 {
        let victim = self.servers.remove(i);
        let at = now_ms();
        victim.signal(libc::SIGKILL);
        let run = victim.wait(LIMIT);
        assert!(run.code().is_none(), "not killed: {}", run.output());
        at
    }

    /// Waits for every process to exit 0; returns the workers' output.
    fn finish(self) -> String {
        let runs = wait_all_ok(
            std::iter::once(self.scheduler)
                .chain(self.servers)
                .chain(self.workers),
            LIMIT,
        );
        let out: String = runs.iter().map(|r| r.stdout.clone()).collect();
        let errs: String = runs.iter().map(|r| r.stderr.clone()).collect();
        assert!(!errs.contains("panicked"), "{errs}");
        out + &errs
    }
}

/// Milliseconds since midnight of a log line's UTC time (`...THH:MM:SS.mmmZ`).
fn log_ms(line: &str) -> Option<u64> {
    let t = line.split_whitespace().next()?.split_once('T')?.1;
    let t = t.strip_suffix('Z')?;
    let (hms, ms) = t.split_once('.')?;
    let mut parts = hms.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, sec) = (parts.next()??, parts.next()??, parts.next()??);
    Some(((h * 60 + m) * 60 + sec) * 1000 + ms.parse::<u64>().ok()?)
}

/// Milliseconds since midnight UTC now (as [`log_ms`] counts).
fn now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (since.as_millis() % 86_400_000) as u64
}

/// How long after `killed` (a [`now_ms`] time) the scheduler declared the
/// server dead, from the logs.
fn declared_ms(out: &str, killed: u64) -> Option<u64> {
    let dead = out
        .lines()
        .find(|l| l.contains("its ranges fail over"))
        .and_then(log_ms)?;
    Some((dead + 86_400_000 - killed) % 86_400_000)
}

/// How long after the scheduler declared a server dead the last range it
/// was primary of had a new primary serving (synced), from the logs.
fn failover_ms(out: &str) -> Option<u64> {
    let dead = out
        .lines()
        .find(|l| l.contains("its ranges fail over"))
        .and_then(log_ms)?;
    out.lines()
        .filter(|l| l.contains("synced at seq"))
        .filter_map(log_ms)
        .filter(|&t| t >= dead)
        .max()
        .map(|t| t - dead)
}

fn assert_exact(out: &str, workers: usize) {
    assert_eq!(out.matches("exact:").count(), workers, "{out}");
}

#[test]
fn two_replicas_survive_a_server_killed_mid_job_with_no_replacement() {
    let _serial = one_at_a_time();
    let mut job = Job::start(3, 2, "2");
    job.wait_round(60);
    let killed = job.kill(0);
    let out = job.finish();
    assert_exact(&out, 2);
    assert!(out.contains("ranges fail over"), "{out}");
    // Figures, not checks (timing is measured, never asserted).
    let declared = declared_ms(&out, killed).expect("no death in the logs");
    let failover = failover_ms(&out).expect("no failover in the logs");
    eprintln!("death declared {declared} ms after the SIGKILL; failover {failover} ms after that");
}

#[test]
fn three_replicas_survive_two_servers_killed() {
    let _serial = one_at_a_time();
    let mut job = Job::start(3, 2, "3");
    job.wait_round(40);
    job.kill(0);
    job.wait_round(100);
    job.kill(0);
    let out = job.finish();
    assert_exact(&out, 2);
}

#[test]
fn a_replacement_receives_copies_of_its_ranges_while_workers_push() {
    let _serial = one_at_a_time();
    let mut job = Job::start(2, 2, "2");
    job.wait_round(40);
    job.kill(0);
    job.wait_round(100);
    // A new server registers: it takes the dead one's id and its ranges.
    let replacement = job.node("server");
    replacement
        .wait_for_line("serving (replacement)", LIMIT)
        .expect("the replacement never served");
    job.servers.push(replacement);
    let out = job.finish();
    assert_exact(&out, 2);
    assert!(out.contains("caught up"), "no copy finished:\n{out}");
}

/// `pslite demo --replicas 2 --kill-server 0 --kill-after 2`: server 0 is
/// killed after epoch 2, the output says which ranges moved where and
/// when, and training reaches its threshold with one server. With
/// `--checkpoint-dir`, the survivor alone writes the last epoch's
/// checkpoint (the one of the kill's epoch may fail, and training goes
/// on), and a new job of two servers resumes from it.
#[test]
fn the_demo_kills_a_server_prints_the_failover_and_reaches_its_threshold() {
    let _serial = one_at_a_time();
    let dir = TempDir::new("demo-failover");
    let dir_arg = dir.path().to_string_lossy().into_owned();
    let mut demo = pslite_command("demo");
    demo.args([
        "--replicas",
        "2",
        "--kill-server",
        "0",
        "--kill-after",
        "2",
        "--samples",
        "60000",
        "--epochs",
        "4",
        "--checkpoint-dir",
        &dir_arg,
    ]);
    let run = run(demo, LIMIT);
    run.assert_ok();
    let out = &run.stdout;
    let pos = |needle: &str| {
        out.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing:\n{}", run.output()))
    };
    assert!(
        pos("key ranges, 2 copies each: range 0 on node 8 (primary), 10; range 1 on node 10 (primary), 8")
            < pos("epoch 0/4"),
        "{}",
        run.output()
    );
    let kill = pos("killing server 0 (node 8) with SIGKILL after epoch 2");
    assert!(pos("epoch 2/4  test loss") < kill, "{}", run.output());
    let failover = pos("failover: range map version 2, ");
    assert!(kill < failover, "{}", run.output());
    // Node 8 was primary of range 0 and backup of range 1.
    assert!(
        failover < pos("  range 0: primary node 8 -> node 10, node 8 dropped")
            && failover < pos("  range 1: node 8 dropped"),
        "{}",
        run.output()
    );
    for epoch in 3..=4 {
        assert!(failover < pos(&format!("epoch {epoch}/4  test loss")));
    }
    assert!(
        out.contains("held at the end by 1 server (server 1: "),
        "{}",
        run.output()
    );
    assert!(out.contains("(threshold 0.8): ok"), "{}", run.output());
    assert!(
        run.stderr
            .contains("server 0 (node 8) was killed by signal 9 (SIGKILL); the job goes on"),
        "{}",
        run.output()
    );

    let mut resume = pslite_command("demo");
    resume.args([
        "--replicas",
        "2",
        "--samples",
        "60000",
        "--epochs",
        "5",
        "--checkpoint-dir",
        &dir_arg,
        "--resume",
    ]);
    let resumed = pslite_tests::run(resume, LIMIT);
    resumed.assert_ok();
    assert!(
        resumed.stdout.contains("(written after epoch 4) in "),
        "{}",
        resumed.output()
    );
    assert!(
        resumed.stdout.contains("epoch 5/5  test loss")
            && resumed.stdout.contains("(threshold 0.8): ok"),
        "{}",
        resumed.output()
    );
}

/// `--kill-server` without copies is refused before anything starts.
#[test]
fn the_demo_refuses_to_kill_a_server_without_replicas() {
    let mut demo = pslite_command("demo");
    demo.args(["--kill-server", "0"]);
    let run = run(demo, Duration::from_secs(30));
    assert!(!run.status.is_some_and(|s| s.success()), "{}", run.output());
    assert!(
        run.stderr
            .contains("--kill-server 0 needs --replicas 2 or more"),
        "{}",
        run.output()
    );
    assert!(!run.stdout.contains("scheduler at"), "{}", run.output());
}

/// A server stopped (SIGSTOP) for longer than the heartbeat timeout is
/// declared dead and its ranges fail over; continued (SIGCONT), it rejoins
/// as a fresh replica: the scheduler takes it back, its ranges copy to it
/// and the map holds it again. Then the other server is killed: the one
/// that was paused holds every range, and the job ends exact, every
/// process exiting 0 (before: it stayed alive and unused, a later kill
/// lost every range, and it failed at the job's end).
#[test]
fn a_server_back_from_a_false_death_rejoins_and_survives_the_others_death() {
    let _serial = one_at_a_time();
    // Rounds enough to go on well past the pause, the copies and the kill.
    let mut job = Job::start_rounds(2, 2, "2", 1500);
    job.wait_round(40);
    let paused = &job.servers[0];
    paused.signal(libc::SIGSTOP);
    job.scheduler
        .wait_for_line("its ranges fail over", LIMIT)
        .expect("the stopped server was never declared dead");
    paused.signal(libc::SIGCONT);
    let back = job
        .scheduler
        .wait_for_line("is back: it rejoins as a fresh replica", LIMIT)
        .expect("the continued server was not taken back");
    let id = back
        .split("server ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .expect("no server id in the line")
        .to_string();
    // Both ranges copy to it (2 servers, k = 2: every server holds both).
    for _ in 0..2 {
        job.scheduler
            .wait_for_line(&format!("node {id} caught up"), LIMIT)
            .expect("a copy to the continued server never finished");
    }
    job.kill(1);
    let out = job.finish();
    assert_exact(&out, 2);
    // The continued server was declared dead once, the killed one once.
    assert_eq!(out.matches("its ranges fail over").count(), 2, "{out}");
}

/// Both servers of a k = 2 job killed: every range has no replica left.
/// Every remaining process (the scheduler, both workers) ends at once
/// saying so, non-zero, though PS_RECOVERY_TIMEOUT is 600 s (before, the
/// scheduler and the nodes waited that timeout out, with nothing that
/// could recover).
#[test]
fn when_no_replica_of_a_range_is_left_every_node_ends_at_once_saying_so() {
    let _serial = one_at_a_time();
    let port = free_port();
    let mut env: Vec<(&str, String)> = env("2", 1500).to_vec();
    env.push(("PS_RECOVERY_TIMEOUT", "600".to_string()));
    let extra: Vec<(&str, &str)> = env.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let node = |role| spawn_node("kv_replicas", role, 2, 2, port, &extra);
    let scheduler = node("scheduler");
    let mut servers: Vec<Spawned> = (0..2).map(|_| node("server")).collect();
    let workers: Vec<Spawned> = (0..2).map(|_| node("worker")).collect();
    for w in &workers {
        w.wait_for_line("round 40", LIMIT)
            .expect("a worker never reached round 40");
    }
    for s in servers.drain(..) {
        s.signal(libc::SIGKILL);
        assert!(s.wait(LIMIT).code().is_none());
    }
    let runs: Vec<pslite_tests::Run> = std::iter::once(scheduler)
        .chain(workers)
        .map(|p| p.wait(LIMIT))
        .collect();
    for run in &runs {
        assert!(
            !run.ok() && !run.timed_out,
            "a process did not end at once, non-zero:\n{}",
            run.output()
        );
        assert!(
            run.output().contains("has no replica left"),
            "a process did not say why:\n{}",
            run.output()
        );
    }
}
