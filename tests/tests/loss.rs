//! Loss without death, with real processes on 127.0.0.1: a replicated job
//! (k = 2) with 10% of messages lost, `PS_RESEND=1` and a 2 s heartbeat
//! timeout ends exact, and nobody is taken for dead. Resends follow the
//! measured round trip (milliseconds on loopback), heartbeats are resent
//! like any message, and a node that does not hear the scheduler keeps
//! calling it. `kv_loss` runs the same job many times beside a loss-free
//! one and prints the throughput of both.

use std::time::Duration;

use pslite_tests::Launch;

/// Jobs in this file, one at a time (six processes each on a small
/// machine).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lossy_job(rounds: u32) -> Launch {
    Launch::example("kv_replicas", 3, 2)
        .env("RUST_LOG", "warn")
        .env("PS_REPLICAS", "2")
        .env("PS_RESEND", "1")
        .env("PS_DROP_MSG", "10")
        .env("PS_HEARTBEAT_INTERVAL", "1")
        .env("PS_HEARTBEAT_TIMEOUT", "2")
        .env("KV_ROUNDS", &rounds.to_string())
        .env("KV_ROUND_MS", "10")
        .timeout(Duration::from_secs(120))
}

#[test]
fn a_replicated_job_with_ten_percent_loss_is_exact_and_nobody_dies() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for run in 1..=3 {
        let out = lossy_job(200).run();
        out.assert_ok();
        let text = out.output();
        assert_eq!(
            out.stdout.matches(" exact: ").count(),
            2,
            "run {run}: not every worker read exact sums:\n{text}"
        );
        for death in [" is dead (", "the scheduler declared", "lost the scheduler"] {
            assert!(
                !text.contains(death),
                "run {run}: a false death ({death:?}):\n{text}"
            );
        }
        assert!(
            !text.contains("nothing heard from the scheduler"),
            "run {run}: a node lost the scheduler for a while:\n{text}"
        );
        assert!(!text.contains("panicked"), "{text}");
    }
}
