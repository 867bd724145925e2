//! Bounded staleness between real processes (`PS_STALENESS`, the
//! `kv_staleness` example under `pslite launch`): s = 0 acts synchronous
//! (every pull sees every worker's pushes of the iterations before), a
//! slow worker with s = 2 lets the others run exactly up to 2 iterations
//! ahead and no further, a bad value is refused by name, and killing a
//! worker does not hang the others (it leaves the bound once it is given
//! up on). The bound is checked by every worker on every pull (the
//! example fails otherwise) and reported by the servers.

use std::time::{Duration, Instant};

use pslite_tests::{free_port, spawn_node, Launch, Spawned};

/// The largest gap each worker printed, by rank.
fn gaps(out: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.split("largest gap seen ").nth(1))
        .filter_map(|g| g.trim().parse().ok())
        .collect()
}

/// Pulls the servers held, summed.
fn held(out: &str) -> u64 {
    out.lines()
        .filter_map(|l| l.split("server: held ").nth(1))
        .filter_map(|r| r.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn launch(s: &str, slow_ms: &str) -> Launch {
    Launch::example("kv_staleness", 2, 3)
        .env("PS_STALENESS", s)
        .env("STALENESS_ITERS", "20")
        .env("STALENESS_SLOW_RANK", "1")
        .env("STALENESS_SLOW_MS", slow_ms)
        .timeout(Duration::from_secs(90))
}

#[test]
fn s0_acts_synchronous() {
    let run = launch("0", "20").run();
    run.assert_ok();
    let out = run.output();
    assert_eq!(gaps(&out), vec![0, 0, 0], "{out}");
    assert!(held(&out) > 0, "nobody waited for the slow worker:\n{out}");
}

#[test]
fn a_slow_worker_with_s2_lets_the_others_be_at_most_2_ahead() {
    let run = launch("2", "40").run();
    run.assert_ok();
    let out = run.output();
    let g = gaps(&out);
    assert_eq!(g.len(), 3, "{out}");
    // The example fails on a gap above 2; the fast workers reach it.
    assert_eq!(g.iter().max(), Some(&2), "{out}");
    assert!(held(&out) > 0, "{out}");
    assert!(
        out.contains("largest gap let through 2"),
        "the servers' figure:\n{out}"
    );
}

#[test]
fn a_bad_value_is_refused_by_name() {
    let run = launch("soon", "0").run();
    assert!(!run.ok());
    assert!(
        run.output().contains("PS_STALENESS must be"),
        "{}",
        run.output()
    );
}

#[test]
fn killing_a_worker_does_not_hang_the_others() {
    let port = free_port();
    let extra = [
        ("PS_STALENESS", "1"),
        ("PS_RECOVERY_TIMEOUT", "20"),
        ("STALENESS_ITERS", "30"),
        ("STALENESS_SLOW_RANK", "2"),
        ("STALENESS_SLOW_MS", "50"),
        ("STALENESS_SKIP_RANK", "2"),
    ];
    let node = |role: &str| spawn_node("kv_staleness", role, 1, 3, port, &extra);
    let scheduler = node("scheduler");
    let server = node("server");
    let workers: Vec<Spawned> = (0..3).map(|_| node("worker")).collect();
    // The slow worker (rank 2) is killed at its clock 3; the others leave
    // it out of the bound once the scheduler declares it dead (its
    // connection closed), well before its 20 s recovery window ends.
    let deadline = Instant::now() + Duration::from_secs(60);
    let victim = loop {
        assert!(Instant::now() < deadline, "rank 2 never reached clock 3");
        if let Some(i) = workers.iter().position(|w| {
            w.wait_for_line("worker rank 2 clock 3", Duration::from_millis(50))
                .is_some()
        }) {
            break i;
        }
    };
    workers[victim].signal(libc::SIGKILL);
    let killed = Instant::now();
    let mut runs = Vec::new();
    for (i, w) in workers.into_iter().enumerate() {
        let run = w.wait(Duration::from_secs(90));
        if i != victim {
            assert!(!run.timed_out, "a survivor hung:\n{}", run.output());
            assert!(
                run.stdout.contains(": 30 iterations, bound 1"),
                "a survivor did not finish its iterations:\n{}",
                run.output()
            );
            eprintln!(
                "survivor exited {:?} after the kill (code {:?})",
                killed.elapsed(),
                run.code()
            );
        }
        runs.push(run);
    }
    for n in [scheduler, server] {
        let run = n.wait(Duration::from_secs(60));
        assert!(!run.timed_out, "{}", run.output());
    }
}
