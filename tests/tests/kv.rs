//! KVWorker and KVServer features on in-process clusters (real ZeroMQ over
//! 127.0.0.1): lens, callbacks, slicers, partial key ownership, late
//! responses, late handles, early data, input errors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use pslite::{
    DefaultHandle, Error, KVMeta, KVOptions, KVPairs, KVServer, KVWorker, Key, KeyRange, SArray,
};
use pslite_tests::LocalCluster;

const T: Duration = Duration::from_secs(20);

fn serve_default<V: pslite::Val>(c: &LocalCluster) -> Vec<KVServer<V>> {
    c.servers
        .iter()
        .map(|po| {
            let s = KVServer::<V>::new(po, 0).unwrap();
            s.set_request_handle(DefaultHandle::new().into_handle());
            s
        })
        .collect()
}

/// Keys spread over the whole key space (so every server owns some).
fn spread(n: u64) -> Vec<Key> {
    (0..n).map(|i| u64::MAX / n * i + 3).collect()
}

/// Polls `cond` until it holds, failing after `T`: waits on an observable
/// state change, not on a guessed duration.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + T;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn push_then_pull_sums_over_two_servers_in_key_order() {
    let c = LocalCluster::start(2, 2);
    let _servers = serve_default::<f32>(&c);
    let keys = spread(100);
    let vals: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let workers: Vec<_> = c
        .workers
        .iter()
        .map(|po| KVWorker::<f32>::new(po, 0, 0).unwrap())
        .collect();
    for w in &workers {
        w.push(&keys, &vals, KVOptions::new())
            .unwrap()
            .wait_timeout(T)
            .unwrap();
    }
    let pulled = workers[0]
        .pull(&keys, KVOptions::new())
        .unwrap()
        .take_timeout(T)
        .unwrap();
    assert_eq!(&pulled.keys[..], &keys[..]);
    let expected: Vec<f32> = vals.iter().map(|v| v * 2.0).collect();
    assert_eq!(&pulled.vals[..], &expected[..]);
    drop(workers);
    c.finalize();
}

#[test]
fn variable_lens_round_trip() {
    let c = LocalCluster::start(2, 1);
    let _servers = serve_default::<f64>(&c);
    let w = KVWorker::<f64>::new(&c.workers[0], 0, 0).unwrap();
    let keys = spread(4);
    let lens = [1, 3, 0, 2];
    let vals = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    for _ in 0..2 {
        let push = w.push(&keys, &vals, KVOptions::new().lens(&lens)).unwrap();
        push.wait_timeout(T).unwrap();
    }
    let pull = w.pull(&keys, KVOptions::new()).unwrap();
    let pulled = pull.take_timeout(T).unwrap();
    assert_eq!(&pulled.vals[..], &[2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
    // The third key was pushed with no values: it holds none.
    assert_eq!(&pulled.lens[..], &[1, 3, 0, 2]);
    drop(w);
    c.finalize();
}

#[test]
fn callbacks_run_on_completion_with_pulled_values() {
    let c = LocalCluster::start(2, 1);
    let _servers = serve_default::<i64>(&c);
    let w = KVWorker::<i64>::new(&c.workers[0], 0, 0).unwrap();
    let keys = spread(10);
    let (tx, rx) = unbounded();
    let tx2 = tx.clone();
    let push = w
        .push(
            &keys,
            &[7; 10],
            KVOptions::new().callback(move |r| {
                let _ = tx2.send(("push", r.map(|p| p.vals.to_vec())));
            }),
        )
        .unwrap();
    // The callback has run by the time wait returns.
    push.wait_timeout(T).unwrap();
    let (what, vals) = rx.try_recv().unwrap();
    assert_eq!(what, "push");
    assert_eq!(vals.unwrap(), Vec::<i64>::new());
    let pull = w
        .pull(
            &keys,
            KVOptions::new().callback(move |r| {
                let _ = tx.send(("pull", r.map(|p| p.vals.to_vec())));
            }),
        )
        .unwrap();
    pull.wait_timeout(T).unwrap();
    let (what, vals) = rx.try_recv().unwrap();
    assert_eq!(what, "pull");
    assert_eq!(vals.unwrap(), vec![7; 10]);
    // Its values went to the callback, so there is nothing to take.
    assert!(matches!(pull.take(), Err(Error::InvalidInput(_))));
    drop(w);
    c.finalize();
}

type Counters = Vec<Arc<AtomicUsize>>;

/// Default-store servers that count the requests and keys they get.
fn counting_servers(c: &LocalCluster) -> (Vec<KVServer<f32>>, Counters, Counters) {
    let new = || -> Counters { (0..c.servers.len()).map(|_| Arc::default()).collect() };
    let (requests, keys) = (new(), new());
    let servers = c
        .servers
        .iter()
        .enumerate()
        .map(|(i, po)| {
            let s = KVServer::<f32>::new(po, 0).unwrap();
            let (r, k) = (Arc::clone(&requests[i]), Arc::clone(&keys[i]));
            let store = DefaultHandle::new();
            s.set_request_handle(move |meta, req, server| {
                r.fetch_add(1, Ordering::SeqCst);
                k.fetch_add(req.keys.len(), Ordering::SeqCst);
                server.answer(meta, store.apply(meta, &req)).unwrap();
            });
            s
        })
        .collect();
    (servers, requests, keys)
}

#[test]
fn only_servers_owning_keys_are_contacted() {
    let c = LocalCluster::start(3, 1);
    let (_servers, requests, _) = counting_servers(&c);
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let ranges = c.workers[0].server_key_ranges();
    // Keys of servers 0 and 2 only.
    let keys = vec![
        ranges[0].begin + 1,
        ranges[2].begin + 1,
        ranges[2].begin + 2,
    ];
    let push = w.push(&keys, &[1.0, 2.0, 3.0], KVOptions::new()).unwrap();
    push.wait_timeout(T).unwrap();
    assert_eq!(push.num_responses(), 2, "two servers answered");
    let pull = w.pull(&keys, KVOptions::new()).unwrap();
    assert_eq!(&pull.take_timeout(T).unwrap().vals[..], &[1.0, 2.0, 3.0]);
    let counts: Vec<_> = requests.iter().map(|h| h.load(Ordering::SeqCst)).collect();
    assert_eq!(counts, vec![2, 0, 2]);
    // No keys at all: complete at once, nobody contacted.
    let empty = w.push(&[], &[], KVOptions::new()).unwrap();
    empty.wait_timeout(T).unwrap();
    assert_eq!(
        requests
            .iter()
            .map(|h| h.load(Ordering::SeqCst))
            .sum::<usize>(),
        4
    );
    drop(w);
    c.finalize();
}

#[test]
fn custom_slicer_replaces_the_key_ranges() {
    let c = LocalCluster::start(2, 1);
    let (_servers, _, keys_seen) = counting_servers(&c);
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    // Everything to the last server.
    w.set_slicer(|kvs: &KVPairs<f32>, ranges: &[KeyRange]| {
        let mut out = vec![None; ranges.len()];
        out[ranges.len() - 1] = Some(kvs.clone());
        out
    });
    let keys = spread(10);
    w.push(&keys, &[1.0; 10], KVOptions::new())
        .unwrap()
        .wait_timeout(T)
        .unwrap();
    let pull = w.pull(&keys, KVOptions::new()).unwrap();
    assert_eq!(&pull.take_timeout(T).unwrap().vals[..], &[1.0; 10]);
    assert_eq!(keys_seen[0].load(Ordering::SeqCst), 0);
    assert_eq!(keys_seen[1].load(Ordering::SeqCst), 20);
    // A slicer returning the wrong number of slices is an error.
    w.set_slicer(|_: &KVPairs<f32>, _: &[KeyRange]| Vec::new());
    assert!(matches!(
        w.push(&keys, &[1.0; 10], KVOptions::new()),
        Err(Error::InvalidInput(_))
    ));
    drop(w);
    c.finalize();
}

#[test]
fn a_response_can_come_later_from_another_thread() {
    let c = LocalCluster::start(1, 1);
    let (tx, rx) = unbounded::<(KVMeta, KVPairs<u32>, KVServer<u32>)>();
    let server = KVServer::<u32>::new(&c.servers[0], 0).unwrap();
    server.set_request_handle(move |meta, req, server| {
        let _ = tx.send((meta.clone(), req, server.clone()));
    });
    let responder = std::thread::spawn(move || {
        // Answer the two requests in reverse order.
        let a = rx.recv_timeout(T).unwrap();
        let b = rx.recv_timeout(T).unwrap();
        for (meta, req, server) in [b, a] {
            let res = KVPairs::new(req.keys.clone(), vec![meta.cmd as u32; req.keys.len()]);
            server.response(&meta, res).unwrap();
        }
    });
    let w = KVWorker::<u32>::new(&c.workers[0], 0, 0).unwrap();
    let first = w.pull(&[1, 2], KVOptions::new().cmd(5)).unwrap();
    let second = w.pull(&[3], KVOptions::new().cmd(9)).unwrap();
    assert_eq!(&second.take_timeout(T).unwrap().vals[..], &[9]);
    assert_eq!(&first.take_timeout(T).unwrap().vals[..], &[5, 5]);
    responder.join().unwrap();
    drop((w, server));
    c.finalize();
}

#[test]
fn requests_wait_for_a_handle_and_data_waits_for_its_app() {
    let c = LocalCluster::start(1, 1);
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    // No KVServer exists yet: the push is held by the server's Postoffice.
    let t1 = w.push(&[1, 2], &[1.0, 2.0], KVOptions::new()).unwrap();
    wait_for("the push to be held", || c.servers[0].held_messages() == 1);
    assert!(matches!(
        t1.wait_timeout(Duration::from_millis(50)),
        Err(Error::Timeout { .. })
    ));
    // The app registers without a handle: the request waits, for the app.
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    assert_eq!(c.servers[0].held_messages(), 0);
    let t2 = w.push(&[1, 2], &[1.0, 2.0], KVOptions::new()).unwrap();
    wait_for("both pushes to queue", || server.queued_requests() == 2);
    server.set_request_handle(DefaultHandle::new().into_handle());
    // The handle that timed out waits again.
    t1.wait_timeout(T).unwrap();
    t2.wait_timeout(T).unwrap();
    let pull = w.pull(&[1, 2], KVOptions::new()).unwrap();
    assert_eq!(&pull.take_timeout(T).unwrap().vals[..], &[2.0, 4.0]);
    drop((w, server));
    c.finalize();
}

#[test]
fn simple_app_requests_wait_for_its_request_handle_in_order() {
    let c = LocalCluster::start(1, 1);
    // The server's SimpleApp exists without a handle: the Postoffice holds
    // the requests for it (the one queue for apps that are not ready).
    let server = pslite::SimpleApp::new(&c.servers[0], 2, 2).unwrap();
    let w = pslite::SimpleApp::new(&c.workers[0], 2, 0).unwrap();
    let to = c.servers[0].my_id().unwrap();
    let sent: Vec<_> = (1..=3)
        .map(|head| w.request(head, b"", to).unwrap())
        .collect();
    wait_for("three requests to wait", || {
        c.servers[0].held_for(2, 2) == 3
    });
    assert_eq!(c.servers[0].held_messages(), 0, "the app is registered");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let heads = Arc::clone(&seen);
    server.set_request_handle(move |req, app| {
        heads.lock().unwrap().push(req.head);
        app.response(req, b"").unwrap();
    });
    for request in sent {
        request.wait_timeout(T).unwrap();
    }
    assert_eq!(*seen.lock().unwrap(), vec![1, 2, 3], "in arrival order");
    assert_eq!(c.servers[0].held_for(2, 2), 0);
    drop((w, server));
    c.finalize();
}

#[test]
fn requests_waiting_for_a_handle_are_bounded_in_bytes() {
    // 64 KiB of hold budget: a quarter per sender, 16 KiB.
    let c = LocalCluster::start_with(1, 1, |c| c.van.hold_limit = 64 << 10);
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    // About 4 KiB per push (500 keys and values): a few fit, the rest go.
    let keys: Vec<u64> = (0..500).collect();
    let ts: Vec<i32> = (0..10)
        .map(|_| {
            w.push(&keys, &[1.0; 500], KVOptions::new())
                .unwrap()
                .into_ts()
        })
        .collect();
    let last = *ts.last().unwrap();
    let worker = c.workers[0].my_id().unwrap();
    wait_for("the pushes to arrive", || {
        let counters = c.servers[0].counters();
        let from_worker = counters.peers.iter().find(|p| p.peer == worker);
        from_worker.is_some_and(|p| p.messages_received >= 10)
    });
    let queued = server.queued_requests();
    assert!((1..10).contains(&queued), "{queued} of 10 queued");
    server.set_request_handle(DefaultHandle::new().into_handle());
    // The queued ones are answered; those that did not fit were refused at
    // once, saying why (never left waiting).
    for &t in &ts[..queued] {
        w.wait_timeout(t, T).unwrap();
    }
    match w.wait_timeout(last, T) {
        Err(Error::RequestFailed {
            cause: pslite::Failure::Refused { refusal, .. },
            ..
        }) => assert!(refusal.to_string().contains("PS_HOLD_LIMIT"), "{refusal}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    drop((w, server));
    c.finalize();
}

#[test]
fn bad_input_is_an_error_and_sends_nothing() {
    let c = LocalCluster::start(1, 1);
    let hits = Arc::new(AtomicUsize::new(0));
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    let h = Arc::clone(&hits);
    server.set_request_handle(move |meta, _req, server| {
        h.fetch_add(1, Ordering::SeqCst);
        server.response(meta, KVPairs::default()).unwrap();
    });
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let o = KVOptions::new;
    assert!(matches!(
        w.push(&[2, 1], &[1.0, 2.0], o()),
        Err(Error::UnsortedKeys { index: 1 })
    ));
    assert!(matches!(
        w.push(&[1, 1], &[1.0, 2.0], o()),
        Err(Error::DuplicateKey { key: 1 })
    ));
    assert!(matches!(
        w.pull(&[3, 3], o()),
        Err(Error::DuplicateKey { key: 3 })
    ));
    assert!(matches!(
        w.push(&[1, 2], &[1.0; 3], o()),
        Err(Error::ValsMismatch { .. })
    ));
    assert!(matches!(
        w.push(&[1, 2], &[], o()),
        Err(Error::ValsMismatch { .. })
    ));
    assert!(matches!(
        w.push(&[1, 2], &[1.0; 3], o().lens(&[1])),
        Err(Error::LensMismatch { keys: 2, lens: 1 })
    ));
    assert!(matches!(
        w.push(&[1, 2], &[1.0; 3], o().lens(&[1, 1])),
        Err(Error::ValsMismatch { .. })
    ));
    assert!(matches!(w.wait(12345), Err(Error::UnknownTimestamp(12345))));
    // A good request still works, and none of the bad ones reached the server.
    w.push(&[1], &[1.0], o()).unwrap().wait_timeout(T).unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    drop((w, server));
    c.finalize();
}

#[test]
fn zero_copy_push_shares_the_callers_buffers() {
    let c = LocalCluster::start(1, 1);
    let received = Arc::new(Mutex::new(Vec::new()));
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    let r = Arc::clone(&received);
    server.set_request_handle(move |meta, req, server| {
        r.lock().unwrap().extend_from_slice(&req.vals);
        server.response(meta, KVPairs::default()).unwrap();
    });
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let keys = SArray::from_vec((0..1000u64).collect());
    let vals = SArray::from_vec((0..1000).map(|i| i as f32).collect());
    let push = w
        .zpush(keys.clone(), vals.clone(), KVOptions::new())
        .unwrap();
    push.wait_timeout(T).unwrap();
    assert_eq!(&received.lock().unwrap()[..], &vals[..]);
    drop((w, server));
    c.finalize();
}

#[test]
fn two_apps_and_two_worker_customers_in_one_process() {
    let c = LocalCluster::start(1, 1);
    let s0 = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    s0.set_request_handle(DefaultHandle::new().into_handle());
    let s1 = KVServer::<f32>::new(&c.servers[0], 1).unwrap();
    s1.set_request_handle(DefaultHandle::new().into_handle());
    // App 0 has two customers on the worker; app 1 one.
    let a = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let b = KVWorker::<f32>::new(&c.workers[0], 0, 1).unwrap();
    let other = KVWorker::<f32>::new(&c.workers[0], 1, 0).unwrap();
    assert!(KVWorker::<f32>::new(&c.workers[0], 0, 1).is_err());
    for (w, v) in [(&a, 1.0), (&b, 2.0), (&other, 10.0)] {
        w.push(&[7], &[v], KVOptions::new())
            .unwrap()
            .wait_timeout(T)
            .unwrap();
    }
    let pull = |w: &KVWorker<f32>| {
        w.pull(&[7], KVOptions::new())
            .unwrap()
            .take_timeout(T)
            .unwrap()
            .vals[0]
    };
    assert_eq!(pull(&a), 3.0);
    assert_eq!(pull(&b), 3.0);
    assert_eq!(pull(&other), 10.0);
    drop((a, b, other, s0, s1));
    c.finalize();
}

#[test]
fn simple_app_commands_on_kv_apps() {
    // MXNet's style: the worker sends commands on its KVWorker, the server
    // answers them on its KVServer.
    let c = LocalCluster::start(2, 1);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let servers: Vec<_> = c
        .servers
        .iter()
        .map(|po| {
            let s = KVServer::<u8>::new(po, 0).unwrap();
            let seen = Arc::clone(&seen);
            s.set_simple_request_handle(move |req, server| {
                seen.lock().unwrap().push((req.head, req.body.to_vec()));
                server.simple_response(req, b"ok").unwrap();
            });
            s
        })
        .collect();
    let w = KVWorker::<u8>::new(&c.workers[0], 0, 0).unwrap();
    let command = w.request(3, b"", pslite::SERVER_GROUP).unwrap();
    command.wait_timeout(T).unwrap();
    assert_eq!(command.num_responses(), 2);
    assert_eq!(seen.lock().unwrap().len(), 2);
    // Without a command handle, a server with a KV handle answers empty.
    let plain = KVServer::<u8>::new(&c.servers[0], 1).unwrap();
    plain.set_request_handle(DefaultHandle::new().into_handle());
    let w1 = KVWorker::<u8>::new(&c.workers[0], 1, 0).unwrap();
    w1.request(2, b"stop", c.servers[0].my_id().unwrap())
        .unwrap()
        .wait_timeout(T)
        .unwrap();
    drop((w, w1, servers, plain));
    c.finalize();
}

#[test]
fn an_inline_handle_runs_on_the_receive_thread() {
    let c = LocalCluster::start(1, 1);
    let threads = Arc::new(Mutex::new(Vec::new()));
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    let seen = Arc::clone(&threads);
    let store = DefaultHandle::new();
    server.set_request_handle_inline(move |meta, req, server| {
        let name = std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string();
        seen.lock().unwrap().push(name);
        server.answer(meta, store.apply(meta, &req)).unwrap();
    });
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    w.push(&[4, 5], &[1.0, 2.0], KVOptions::new())
        .unwrap()
        .wait_timeout(T)
        .unwrap();
    let pull = w.pull(&[4, 5], KVOptions::new()).unwrap();
    assert_eq!(&pull.take_timeout(T).unwrap().vals[..], &[1.0, 2.0]);
    let names = threads.lock().unwrap().clone();
    assert_eq!(names.len(), 2);
    assert!(
        names.iter().all(|n| n.starts_with("pslite-van")),
        "{names:?}"
    );
    drop((w, server));
    c.finalize();
}

#[test]
fn requests_are_waited_for_by_handle_or_by_timestamp() {
    let c = LocalCluster::start(2, 1);
    let _servers = serve_default::<f32>(&c);
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let keys = spread(6);
    // ps-lite's way: timestamps, waited for on the worker; a handle passed
    // where a timestamp goes is its timestamp.
    let ts: i32 = w.push(&keys, &[1.0; 6], KVOptions::new()).unwrap().into();
    w.wait_timeout(ts, T).unwrap();
    assert_eq!(w.num_responses(ts), 0, "collected: the record is gone");
    w.wait(ts).unwrap(); // waited before: returns at once
    let pull = w.pull(&keys, KVOptions::new()).unwrap();
    let pulled = w.take_pull_timeout(pull, T).unwrap();
    assert_eq!(&pulled.vals[..], &[1.0; 6]);
    // Waiting first keeps a pull's values for take; they are taken once.
    let pull = w.pull(&keys, KVOptions::new()).unwrap();
    pull.wait_timeout(T).unwrap();
    assert_eq!(pull.num_responses(), 2);
    assert_eq!(&pull.take().unwrap().vals[..], &[1.0; 6]);
    assert!(matches!(pull.take(), Err(Error::InvalidInput(_))));
    let ts = w.pull(&keys, KVOptions::new()).unwrap().into_ts();
    w.wait_timeout(ts, T).unwrap();
    assert_eq!(&w.take_pull(ts).unwrap().vals[..], &[1.0; 6]);
    assert!(w.take_pull(ts).is_err());
    // A dropped handle gives up its request; the push is still applied.
    let (tx, rx) = unbounded();
    drop(
        w.push(
            &keys,
            &[2.0; 6],
            KVOptions::new().callback(move |r| {
                let _ = tx.send(r.is_ok());
            }),
        )
        .unwrap(),
    );
    assert_eq!(rx.recv_timeout(T), Ok(true));
    let pull = w.pull(&keys, KVOptions::new()).unwrap();
    assert_eq!(&pull.take_timeout(T).unwrap().vals[..], &[3.0; 6]);
    drop(w);
    c.finalize();
}

#[test]
fn a_large_pull_over_the_network_is_answered_without_its_keys() {
    // Over TCP (no shared memory), a pull of 300 000 keys goes to each
    // pslite server in chunks whose answers leave their keys out (the
    // worker has them): the worker receives the values, 4 bytes a key, and
    // not the keys again, 8 more.
    let c = LocalCluster::start_with(2, 1, |cfg| {
        cfg.van.shm = false;
        cfg.van.ipc = false;
    });
    let copying = Arc::new(AtomicUsize::new(0));
    let servers: Vec<KVServer<f32>> = c
        .servers
        .iter()
        .enumerate()
        .map(|(rank, po)| {
            let s = KVServer::<f32>::new(po, 0).unwrap();
            let store = DefaultHandle::<f32>::new();
            let copying = Arc::clone(&copying);
            s.set_request_handle(move |meta: &KVMeta, req: KVPairs<f32>, s: &KVServer<f32>| {
                let mut res = store.apply(meta, &req).unwrap();
                if rank == 1 && meta.pull {
                    // Equal keys in a buffer of its own: left out as well.
                    res.keys = SArray::from_vec(res.keys.to_vec());
                    copying.fetch_add(1, Ordering::SeqCst);
                }
                s.response(meta, res).unwrap();
            });
            s
        })
        .collect();
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let n = 300_000u64;
    let keys = spread(n);
    let vals: Vec<f32> = (0..n).map(|i| i as f32).collect();
    w.push(&keys, &vals, KVOptions::new())
        .unwrap()
        .wait_timeout(T)
        .unwrap();
    let before = c.workers[0].counters().bytes_received();
    let pulled = w
        .pull(&keys, KVOptions::new())
        .unwrap()
        .take_timeout(T)
        .unwrap();
    let received = c.workers[0].counters().bytes_received() - before;
    assert_eq!(&pulled.keys[..], &keys[..]);
    assert_eq!(&pulled.vals[..], &vals[..]);
    assert!(
        copying.load(Ordering::SeqCst) > 1,
        "server 1 answered in chunks"
    );
    let n = n as usize;
    assert!(
        received >= (n * 4) as u64 && received < (n * 4 + n) as u64,
        "the worker received {received} bytes for {n} values of 4 bytes (with keys: {})",
        n * 12
    );
    // With a callback, the same answers.
    let (tx, rx) = unbounded();
    let pull = w
        .pull(
            &keys,
            KVOptions::new().callback(move |r| {
                let _ = tx.send(r.map(|p| p.vals.to_vec()));
            }),
        )
        .unwrap();
    assert_eq!(rx.recv_timeout(T).unwrap().unwrap(), vals);
    drop(pull);
    drop((w, servers));
    c.finalize();
}

/// Layers of a model pushed back to front with priorities (the first layer
/// highest), in parts (`PS_PARTITION_BYTES` 8 KiB), rounds after rounds,
/// then pulled: every sum exact. Layer `i` is `(i + 1) * 2000` keys
/// (24 KiB to 240 KiB a push), so the server's bound on one sender's
/// incomplete messages (`PS_HOLD_LIMIT / 4`) holds a few small layers or
/// one large one.
fn push_layers_in_parts(c: &LocalCluster, rounds: usize) {
    let _servers = serve_default::<f32>(c);
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let layers: Vec<Vec<Key>> = (0..10u64)
        .map(|i| ((i << 32)..(i << 32) + (i + 1) * 2000).collect())
        .collect();
    for round in 0..rounds {
        let ts: Vec<i32> = (0..10usize)
            .rev()
            .map(|i| {
                let vals = vec![(i + round) as f32; layers[i].len()];
                w.push(&layers[i], &vals, KVOptions::new().priority(-(i as i32)))
                    .unwrap()
                    .into_ts()
            })
            .collect();
        for t in ts {
            w.wait_timeout(t, T).unwrap();
        }
    }
    for (i, keys) in layers.iter().enumerate() {
        let want = (0..rounds).map(|r| (i + r) as f32).sum::<f32>();
        let got = w
            .pull(keys, KVOptions::new().priority(-(i as i32)))
            .unwrap()
            .take_timeout(T)
            .unwrap();
        assert!(got.vals.iter().all(|&v| v == want), "layer {i}");
        assert_eq!(got.vals.len(), keys.len());
    }
}

/// Same configuration on both ends (`PS_HOLD_LIMIT` 256 KiB, so 64 KiB per
/// sender; no `PS_RESEND`): the worker's links keep the server's bound, so
/// the server never refuses a part, and the pushes went in parts.
#[test]
fn prioritized_pushes_in_parts_keep_a_small_hold_limit() {
    let c = LocalCluster::start_with(1, 1, |c| {
        c.van.hold_limit = 256 << 10;
        c.van.partition_bytes = 8 << 10;
        c.van.shm = false;
    });
    push_layers_in_parts(&c, 3);
    let server = c.servers[0].counters();
    assert_eq!(server.dropped_hold_limit, 0, "{server:?}");
    let worker = c.workers[0].my_id().unwrap();
    let from_worker = server.peers.iter().find(|p| p.peer == worker).unwrap();
    // 3 rounds of 10 layers, 3 to 30 parts each (keys and values).
    assert!(
        from_worker.messages_received >= 3 * 165,
        "{} messages: not in parts",
        from_worker.messages_received
    );
    c.finalize();
}

/// A server with a smaller `PS_HOLD_LIMIT` (16 KiB per sender) than its
/// worker's: the parts beyond its bound are dropped unacknowledged, resent
/// (`PS_RESEND`) and taken once there is room: every sum still exact.
#[test]
fn parts_beyond_a_smaller_hold_limit_are_resent_and_taken() {
    let c = LocalCluster::start_with(1, 1, |c| {
        c.van.hold_limit = if c.van.role == pslite::Role::Server {
            64 << 10
        } else {
            16 << 20
        };
        c.van.partition_bytes = 8 << 10;
        c.van.shm = false;
        c.van.resend_timeout = Some(Duration::from_millis(100));
    });
    push_layers_in_parts(&c, 2);
    let server = c.servers[0].counters();
    assert!(server.dropped_hold_limit > 0, "{server:?}");
    c.finalize();
}
