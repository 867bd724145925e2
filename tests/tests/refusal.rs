//! A server that cannot take a request answers with why, and the worker's
//! wait fails at once with `Failure::Refused`: values of another type,
//! value lengths the sum store cannot take, an app the server does not
//! have, a handle's own refusal. Nothing refused is applied.

use std::time::{Duration, Instant};

use pslite::{
    DataType, DefaultHandle, Error, Failure, KVOptions, KVRequest, KVServer, KVWorker, Refusal, Val,
};
use pslite_tests::{Launch, LocalCluster};

const WAIT: Duration = Duration::from_secs(30);

/// The refusal `req` failed with, checking it came within `bound`.
fn refused<V: Val>(req: KVRequest<V>, bound: Duration) -> (i32, Refusal) {
    let t = Instant::now();
    match req.wait_timeout(WAIT) {
        Err(Error::RequestFailed {
            cause: Failure::Refused { node, refusal },
            ..
        }) => {
            assert!(t.elapsed() < bound, "refused only after {:?}", t.elapsed());
            (node, refusal)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn sum_store(c: &LocalCluster) -> Vec<KVServer<f32>> {
    c.servers
        .iter()
        .map(|po| {
            let s = KVServer::<f32>::new(po, 0).unwrap();
            s.set_request_handle(DefaultHandle::new().into_handle());
            s
        })
        .collect()
}

#[test]
fn another_dtype_is_refused_naming_both() {
    let c = LocalCluster::start(2, 1);
    let _servers = sum_store(&c);
    let w = KVWorker::<f64>::new(&c.workers[0], 0, 0).unwrap();
    let (node, refusal) = refused(
        w.push(&[1, u64::MAX], &[1.0, 2.0], KVOptions::new())
            .unwrap(),
        Duration::from_secs(1),
    );
    assert!(c.servers.iter().any(|s| s.my_id().unwrap() == node));
    assert_eq!(
        refusal,
        Refusal::DataType {
            app: 0,
            held: DataType::Float,
            sent: DataType::Double
        }
    );
    let text = Failure::Refused { node, refusal }.to_string();
    assert!(
        text.contains("float32") && text.contains("float64"),
        "{text}"
    );
    // A pull of another dtype is refused too (its values would be misread).
    let (_, refusal) = refused(
        w.pull(&[1], KVOptions::new()).unwrap(),
        Duration::from_secs(1),
    );
    assert!(matches!(refusal, Refusal::DataType { .. }), "{refusal:?}");
}

#[test]
fn lengths_the_sum_store_cannot_take_are_refused_and_nothing_is_applied() {
    let c = LocalCluster::start(1, 1);
    let _servers = sum_store(&c);
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    w.push(&[3, 4], &[1.0, 2.0, 3.0, 4.0], KVOptions::new())
        .unwrap()
        .wait_timeout(WAIT)
        .unwrap();
    // 1 value per key for keys of 2; then key 5 new (fine) with key 4 of 3.
    let (_, refusal) = refused(
        w.push(&[3, 4], &[9.0, 9.0], KVOptions::new()).unwrap(),
        Duration::from_secs(1),
    );
    assert_eq!(
        refusal,
        Refusal::Lengths {
            app: 0,
            key: 3,
            held: 2,
            sent: 1
        }
    );
    let opts = KVOptions::new().lens(&[3, 1]);
    let (_, refusal) = refused(
        w.push(&[4, 5], &[1.0, 1.0, 1.0, 7.0], opts).unwrap(),
        Duration::from_secs(1),
    );
    assert_eq!(
        refusal,
        Refusal::Lengths {
            app: 0,
            key: 4,
            held: 2,
            sent: 3
        }
    );
    let pulled = w
        .pull(&[3, 4, 5], KVOptions::new())
        .unwrap()
        .take_timeout(WAIT)
        .unwrap();
    // Key 5 was never applied (its request was refused whole): one zero.
    assert_eq!(&pulled.vals[..], &[1.0, 2.0, 3.0, 4.0, 0.0]);
    assert_eq!(&pulled.lens[..], &[2, 2, 1]);
}

#[test]
fn an_app_the_server_lacks_is_refused_after_ps_app_wait() {
    let c = LocalCluster::start_with(1, 1, |cfg| cfg.app_wait = Duration::from_millis(300));
    let _servers = sum_store(&c);
    let w = KVWorker::<f32>::new(&c.workers[0], 7, 0).unwrap();
    let (_, refusal) = refused(
        w.push(&[1], &[1.0], KVOptions::new()).unwrap(),
        Duration::from_secs(3),
    );
    match refusal {
        Refusal::NoApp {
            app: 7,
            customer: 7,
            waited_ms,
        } => assert!(waited_ms >= 300, "{waited_ms}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_app_created_within_ps_app_wait_gets_its_requests() {
    let c = LocalCluster::start_with(1, 1, |cfg| cfg.app_wait = Duration::from_secs(20));
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let push = w.push(&[1], &[1.0], KVOptions::new()).unwrap();
    // The server creates its app only now: the request was held.
    std::thread::sleep(Duration::from_millis(200)); // the push arrives first; any delay would do
    let _servers = sum_store(&c);
    push.wait_timeout(WAIT).unwrap();
}

#[test]
fn a_handle_refuses_with_its_own_reason() {
    let c = LocalCluster::start(1, 1);
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    server.set_request_handle(|meta, _req, server| {
        server.refuse(
            meta,
            Refusal::Other {
                app: meta.app_id,
                reason: format!("command {} is not known", meta.cmd),
            },
        )
    });
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let (_, refusal) = refused(
        w.push(&[1], &[1.0], KVOptions::new().cmd(42)).unwrap(),
        Duration::from_secs(1),
    );
    assert_eq!(refusal.to_string(), "app 0: command 42 is not known");
}

#[test]
fn process_cluster_refuses_each_request_it_cannot_take() {
    let run = Launch::example("refusals", 2, 1)
        .env("PS_APP_WAIT", "300")
        .timeout(Duration::from_secs(60))
        .run();
    run.assert_ok();
    let out = run.output();
    assert!(out.contains("PASS refusals"), "{out}");
    assert!(
        out.contains("holds float32 values and the request sent float64"),
        "{out}"
    );
    assert!(
        out.contains("holds 2 values for key 1 and the request sent 1"),
        "{out}"
    );
    assert!(out.contains("there is no app 1 (waited"), "{out}");
}

#[test]
fn a_key_value_request_to_a_simple_app_is_refused() {
    let c = LocalCluster::start(1, 1);
    let app = pslite::SimpleApp::new(&c.servers[0], 3, 3).unwrap();
    app.set_request_handle(pslite::SimpleApp::reply_empty);
    let w = KVWorker::<f32>::new(&c.workers[0], 3, 0).unwrap();
    let (_, refusal) = refused(
        w.push(&[1], &[1.0], KVOptions::new()).unwrap(),
        Duration::from_secs(1),
    );
    assert!(
        refusal
            .to_string()
            .contains("a key-value request to a SimpleApp"),
        "{refusal}"
    );
}
