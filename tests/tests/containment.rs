//! Containment (real sockets, one process): a panicking request handle or
//! callback fails only its own request, and the nodes go on.

use std::time::Duration;

use pslite::{DefaultHandle, Error, Failure, KVOptions, KVServer, KVWorker};
use pslite_tests::LocalCluster;

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn a_handle_that_panics_on_every_tenth_request_fails_exactly_those() {
    let c = LocalCluster::start(1, 1);
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    let store = DefaultHandle::new();
    let mut seen = 0;
    server.set_request_handle(move |meta, req, srv| {
        seen += 1;
        if seen % 10 == 0 {
            panic!("request {seen} refused on purpose");
        }
        let res = store.apply(meta, &req);
        srv.answer(meta, res).unwrap();
    });
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let server_id = c.servers[0].my_id().unwrap();
    for i in 1..=50 {
        let result = w
            .push(&[7], &[1.0], KVOptions::new())
            .unwrap()
            .wait_timeout(WAIT);
        if i % 10 == 0 {
            match result {
                Err(Error::RequestFailed {
                    cause: Failure::HandlerPanicked { node, message },
                    ..
                }) => {
                    assert_eq!(node, server_id);
                    assert!(message.contains("refused on purpose"), "{message}");
                }
                other => panic!("request {i}: expected a handler panic, got {other:?}"),
            }
        } else {
            result.unwrap_or_else(|e| panic!("request {i} failed: {e}"));
        }
    }
    // The 45 pushes that were handled are all in the store (the 60th
    // request, this pull, is handled too).
    let pull = w.pull(&[7], KVOptions::new()).unwrap();
    assert_eq!(&pull.take_timeout(WAIT).unwrap().vals[..], &[45.0]);
}

#[test]
fn a_callback_that_panics_fails_its_request_and_the_worker_goes_on() {
    let c = LocalCluster::start(1, 1);
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    server.set_request_handle(DefaultHandle::new().into_handle());
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let worker_id = c.workers[0].my_id().unwrap();
    let push = w
        .push(
            &[3],
            &[2.0],
            KVOptions::new().callback(|_| panic!("callback refused on purpose")),
        )
        .unwrap();
    // Every wait on the handle gives the same failure.
    for _ in 0..2 {
        match push.wait_timeout(WAIT) {
            Err(Error::RequestFailed {
                cause: Failure::HandlerPanicked { node, .. },
                ..
            }) => assert_eq!(node, worker_id),
            other => panic!("expected a handler panic, got {other:?}"),
        }
    }
    let pull = w.pull(&[3], KVOptions::new()).unwrap();
    assert_eq!(&pull.take_timeout(WAIT).unwrap().vals[..], &[2.0]);
}
