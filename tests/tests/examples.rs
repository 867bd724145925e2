//! ps-lite's test programs under `pslite launch`, run repeatedly: at 2
//! servers + 2 workers and at 1 + 1, 20 consecutive runs each, and again
//! while two busy-loop processes compete for the CPUs.

use std::process::Command;

use pslite_tests::{spawn, Launch, Spawned};

const RUNS: usize = 20;

fn launch(example: &str, servers: usize, workers: usize) -> Launch {
    let l = Launch::example(example, servers, workers);
    if example == "kv_app_multi_workers" {
        // One worker process hosting every worker.
        l.arg("--worker-procs").arg("1")
    } else {
        l
    }
}

fn repeat(example: &str, servers: usize, workers: usize, runs: usize, marker: &str) {
    for i in 0..runs {
        let run = launch(example, servers, workers).run();
        assert!(
            run.ok(),
            "{example} {servers}+{workers} failed on run {}/{runs}:\n{}",
            i + 1,
            run.output()
        );
        assert_eq!(
            run.stdout.matches(marker).count(),
            match example {
                "simple_app" => 1 + servers + workers,
                _ => workers,
            },
            "{}",
            run.output()
        );
    }
}

#[test]
fn simple_app_20_runs() {
    repeat("simple_app", 2, 2, RUNS, "100 requests received, 0 wrong");
    repeat("simple_app", 1, 1, RUNS, "100 requests received, 0 wrong");
}

#[test]
fn kv_app_20_runs() {
    repeat("kv_app", 2, 2, RUNS, "sums exact");
    repeat("kv_app", 1, 1, RUNS, "sums exact");
}

#[test]
fn kv_app_multi_workers_20_runs() {
    repeat("kv_app_multi_workers", 2, 2, RUNS, "every push_pull exact");
    repeat("kv_app_multi_workers", 1, 1, RUNS, "every push_pull exact");
}

/// Busy-loop processes, killed when dropped.
struct Hogs(Vec<Spawned>);

impl Drop for Hogs {
    fn drop(&mut self) {
        for hog in &self.0 {
            hog.signal(libc::SIGKILL);
        }
    }
}

#[test]
fn examples_under_cpu_load() {
    let hogs = Hogs(
        (0..2)
            .map(|_| {
                let mut cmd = Command::new("sh");
                cmd.args(["-c", "while :; do :; done"]);
                spawn(cmd)
            })
            .collect(),
    );
    repeat("simple_app", 2, 2, 3, "100 requests received, 0 wrong");
    repeat("kv_app", 2, 2, 3, "sums exact");
    repeat("kv_app_multi_workers", 2, 2, 3, "every push_pull exact");
    drop(hogs);
}
