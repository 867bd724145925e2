//! Liveness inside one process (real sockets): dead-node detection through
//! heartbeats, and a request to a node that never acknowledges failing with
//! an error after the last resend instead of aborting the process.

use std::time::{Duration, Instant};

use pslite::{DefaultHandle, Error, Failure, KVOptions, KVServer, KVWorker};
use pslite_tests::LocalCluster;

#[test]
fn a_request_nobody_acknowledges_fails_after_the_last_resend() {
    let c = LocalCluster::start_with(1, 1, |config| {
        config.van.resend_timeout = Some(Duration::from_millis(20));
    });
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    server.set_request_handle(DefaultHandle::new().into_handle());
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    w.push(&[1], &[1.0], KVOptions::new())
        .unwrap()
        .wait_timeout(Duration::from_secs(20))
        .unwrap();
    // The server goes away without a word.
    drop(server);
    c.servers[0].finalize(0, false).unwrap();
    let started = Instant::now();
    let push = w.push(&[1], &[1.0], KVOptions::new()).unwrap();
    let err = push.wait_timeout(Duration::from_secs(60)).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::RequestFailed {
                cause: Failure::NotAcknowledged {
                    peer: 8,
                    tries: 10,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    // 10 resends, waiting 20 ms doubling up to 160 ms: about 1.3 s.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn silent_nodes_are_reported_dead() {
    let c = LocalCluster::start_with(1, 2, |config| {
        config.van.heartbeat_interval = Some(Duration::from_millis(1000));
        config.van.heartbeat_timeout = Some(Duration::from_secs(3));
    });
    let window = Duration::from_millis(2500);
    assert!(c.scheduler.dead_nodes(window).is_empty());
    assert!(c.workers[0].dead_nodes(window).is_empty());
    let gone = c.workers[1].my_id().unwrap();
    c.workers[1].finalize(0, false).unwrap();
    // Wait on the scheduler's view changing, with a deadline.
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.scheduler.dead_nodes(window) != vec![gone] {
        assert!(
            Instant::now() < deadline,
            "worker {gone} never reported dead"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(c.scheduler.dead_nodes(Duration::ZERO).is_empty());
}
