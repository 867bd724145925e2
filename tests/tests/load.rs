//! Registration and exit under CPU load: a 1 + 100 + 100 `connection` job
//! (ps-lite's test_connection) started by `pslite launch` while two busy
//! loops take both cores. Every registration must count (the scheduler's
//! handshake checks wait behind each other under load) and every node must
//! end cleanly (the scheduler leaves last, so no node that is slow to read
//! the last barrier's release takes the scheduler for lost).

use std::process::{Child, Command};
use std::time::Duration;

use pslite_tests::Launch;

/// Busy loops that die with the test, panicking or not.
struct Busy(Vec<Child>);

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_200_node_job_under_cpu_load_registers_every_node_and_ends_cleanly() {
    let busy = Busy(
        (0..2)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("start a busy loop")
            })
            .collect(),
    );
    for round in 1..=3 {
        let run = Launch::example("connection", 100, 100)
            .timeout(Duration::from_secs(150))
            .run();
        let out = run.output();
        assert!(
            !out.contains("refusing the registration"),
            "run {round}: a real node's registration was refused:\n{out}"
        );
        assert!(
            !out.contains("lost the scheduler"),
            "run {round}: a node took the scheduler for lost at the end:\n{out}"
        );
        assert!(run.ok(), "run {round} failed:\n{out}");
        assert_eq!(
            out.matches("finalized").count(),
            201,
            "run {round}: not every node finalized:\n{out}"
        );
    }
    drop(busy);
}
