//! Back-pressure as real processes: a server whose request handle sleeps
//! 30 s while requests keep coming fills its customer's queue
//! (`PS_QUEUE_LIMIT=2`), stops reading and holds the workers back through
//! ZeroMQ, while its heartbeats keep flowing: with a 3 s heartbeat timeout
//! nobody is declared dead or lost, and the job ends with exact sums.

use std::time::Duration;

use pslite_tests::Launch;

#[test]
fn a_server_whose_handle_sleeps_30_s_is_not_declared_dead_and_the_job_is_exact() {
    let run = Launch::example("kv_app", 1, 2)
        .env("KV_APP_SERVER_SLEEP_MS", "30000")
        .env("KV_APP_KEYS", "1000")
        .env("KV_APP_REPEAT", "20")
        .env("PS_QUEUE_LIMIT", "2")
        .env("PS_HEARTBEAT_INTERVAL", "1")
        .env("PS_HEARTBEAT_TIMEOUT", "3")
        .env("PS_VERBOSE", "1")
        .timeout(Duration::from_secs(120))
        .run();
    let output = run.output();
    run.assert_ok();
    assert_eq!(run.stdout.matches("sums exact").count(), 2, "{output}");
    assert!(
        run.stdout.contains("the request handle sleeps 30000 ms"),
        "{output}"
    );
    assert!(run.elapsed >= Duration::from_secs(30), "{output}");
    // The queue filled and the server stopped reading for a while...
    assert!(output.contains("not reading for now"), "{output}");
    assert!(output.contains("reading again after"), "{output}");
    // ... and nobody took that for a death.
    for death in [
        "is dead",
        "lost the scheduler",
        "declared",
        "did not acknowledge",
    ] {
        assert!(!output.contains(death), "{death:?} in:\n{output}");
    }
}
