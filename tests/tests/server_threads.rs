//! Server engine threads (`PS_SERVER_THREADS`, `KVServer::set_threads`) on
//! in-process clusters (real ZeroMQ over 127.0.0.1): responses as one
//! thread gives them, requests on one key in arrival order, several threads
//! at work, a panicking part failing its request once. The process-level
//! check is kv_app's exact sums under `PS_SERVER_THREADS=4`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pslite::{
    shard_of, DefaultHandle, Error, Failure, KVOptions, KVPairs, KVServer, KVWorker, Key, Refusal,
};
use pslite_tests::{run, Launch, LocalCluster};

const T: Duration = Duration::from_secs(30);
const THREADS: usize = 4;

fn spread(n: u64) -> Vec<Key> {
    (0..n).map(|i| u64::MAX / n * i + 3).collect()
}

/// Pushes and pulls with uniform and variable lens against the sum store on
/// four threads: every response is what one thread gives (sums in key
/// order, lens only where keys hold different numbers of values).
#[test]
fn the_sum_store_on_four_threads_answers_as_on_one() {
    let c = LocalCluster::start(2, 2);
    let servers: Vec<KVServer<f32>> = c
        .servers
        .iter()
        .map(|po| {
            let s = KVServer::<f32>::new(po, 0).unwrap();
            s.set_threads(THREADS);
            s.set_concurrent_handle(DefaultHandle::new());
            assert_eq!(s.threads(), THREADS);
            s
        })
        .collect();
    let workers: Vec<_> = c
        .workers
        .iter()
        .map(|po| KVWorker::<f32>::new(po, 0, 0).unwrap())
        .collect();
    let keys = spread(1000);
    let vals: Vec<f32> = (0..1000).map(|i| i as f32).collect();
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
    let doubled: Vec<f32> = vals.iter().map(|v| 2.0 * v).collect();
    assert_eq!(&pulled.vals[..], &doubled[..]);
    assert!(pulled.lens.is_empty());
    // Variable lens: keys 0, 1, 2, ... hold 1, 2, 3, 1, 2, 3 ... values.
    let vkeys = spread(300).iter().map(|k| k + 1).collect::<Vec<_>>();
    let lens: Vec<i32> = (0..300).map(|i| 1 + i % 3).collect();
    let total: usize = lens.iter().map(|&l| l as usize).sum();
    let vvals: Vec<f32> = (0..total).map(|i| i as f32).collect();
    let out = workers[1]
        .push_pull(&vkeys, &vvals, KVOptions::new().lens(&lens))
        .unwrap()
        .take_timeout(T)
        .unwrap();
    assert_eq!(&out.keys[..], &vkeys[..]);
    assert_eq!(&out.vals[..], &vvals[..]);
    assert_eq!(&out.lens[..], &lens[..]);
    drop((workers, servers));
    c.finalize();
}

/// One worker sends 200 pushes without waiting, push `i` carrying `i` for
/// every key: on each key the handle sees 0, 1, 2, ... in that order, while
/// all four threads take part.
#[test]
fn requests_on_one_key_are_handled_in_arrival_order_on_all_threads() {
    let c = LocalCluster::start(1, 1);
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    server.set_threads(THREADS);
    let seen: Arc<Mutex<HashMap<Key, Vec<f32>>>> = Arc::default();
    let threads: Arc<Mutex<HashSet<String>>> = Arc::default();
    {
        let (seen, threads) = (Arc::clone(&seen), Arc::clone(&threads));
        server.set_concurrent_request_handle(move |meta, req: KVPairs<f32>, srv| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            threads.lock().unwrap().insert(name);
            let mut seen = seen.lock().unwrap();
            for (k, v) in req.keys.iter().zip(req.vals.iter()) {
                // Each key is its thread's.
                assert_eq!(shard_of(*k, THREADS), shard_of(req.keys[0], THREADS));
                seen.entry(*k).or_default().push(*v);
            }
            drop(seen);
            srv.response(meta, KVPairs::default()).unwrap();
        });
    }
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let keys = spread(64);
    let pushes: Vec<_> = (0..200)
        .map(|i| {
            w.push(&keys, &vec![i as f32; keys.len()], KVOptions::new())
                .unwrap()
        })
        .collect();
    for p in pushes {
        p.wait_timeout(T).unwrap();
    }
    let seen = seen.lock().unwrap();
    let in_order: Vec<f32> = (0..200).map(|i| i as f32).collect();
    for k in &keys {
        assert_eq!(seen[k], in_order, "key {k}");
    }
    let threads = threads.lock().unwrap();
    assert_eq!(threads.len(), THREADS, "{threads:?}");
    assert!(threads.iter().all(|t| t.starts_with("pslite-engine-")));
}

/// On 1, 2 and 4 engine threads, a push to the sum store in which one key
/// (on each thread in turn) carries 1 value instead of its 2 is refused
/// whole, naming that key, and nothing of it is applied on any thread; the
/// push sent again, right, is applied once.
#[test]
fn a_refused_push_applies_nothing_on_any_thread() {
    for threads in [1, 2, 4] {
        let c = LocalCluster::start(1, 1);
        let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
        server.set_threads(threads);
        server.set_concurrent_handle(DefaultHandle::new());
        assert_eq!(server.threads(), threads);
        let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
        let keys = spread(64);
        w.push(&keys, &vec![1.0f32; 128], KVOptions::new())
            .unwrap()
            .wait_timeout(T)
            .unwrap();
        let mut expected = 1.0;
        for shard in 0..threads {
            let Some(short) = keys.iter().position(|&k| shard_of(k, threads) == shard) else {
                continue;
            };
            let lens: Vec<i32> = (0..64).map(|i| if i == short { 1 } else { 2 }).collect();
            let refused = w
                .push(&keys, &vec![10.0f32; 127], KVOptions::new().lens(&lens))
                .unwrap()
                .wait_timeout(T);
            match refused {
                Err(Error::RequestFailed {
                    cause: Failure::Refused { refusal, .. },
                    ..
                }) => assert_eq!(
                    refusal,
                    Refusal::Lengths {
                        app: 0,
                        key: keys[short],
                        held: 2,
                        sent: 1
                    }
                ),
                other => {
                    panic!("{threads} threads, shard {shard}: expected a refusal, got {other:?}")
                }
            }
            let pulled = w
                .pull(&keys, KVOptions::new())
                .unwrap()
                .take_timeout(T)
                .unwrap();
            let changed = pulled.vals.iter().filter(|&&v| v != expected).count();
            assert_eq!(
                changed, 0,
                "{threads} threads, shard {shard}: values changed by a refused push"
            );
            // Sent again, right: applied once.
            w.push(&keys, &vec![10.0f32; 128], KVOptions::new())
                .unwrap()
                .wait_timeout(T)
                .unwrap();
            expected += 10.0;
        }
        let pulled = w
            .pull(&keys, KVOptions::new())
            .unwrap()
            .take_timeout(T)
            .unwrap();
        assert!(
            pulled.vals.iter().all(|&v| v == expected),
            "{threads} threads"
        );
        drop((w, server));
        c.finalize();
    }
}

/// A handle that panics on one thread's part of a request fails that
/// request once (the worker sees the panic); the next requests succeed.
#[test]
fn a_part_that_panics_fails_its_request_once() {
    let c = LocalCluster::start(1, 1);
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    server.set_threads(THREADS);
    let store = DefaultHandle::new();
    server.set_concurrent_request_handle(move |meta, req: KVPairs<f32>, srv| {
        if meta.push && req.vals.first() == Some(&13.0) && shard_of(req.keys[0], THREADS) == 1 {
            panic!("part refused on purpose");
        }
        let res = store.apply(meta, &req);
        srv.answer(meta, res).unwrap();
    });
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let keys = spread(64);
    let ones = vec![1.0f32; keys.len()];
    w.push(&keys, &ones, KVOptions::new())
        .unwrap()
        .wait_timeout(T)
        .unwrap();
    match w
        .push(&keys, &vec![13.0f32; keys.len()], KVOptions::new())
        .unwrap()
        .wait_timeout(T)
    {
        Err(Error::RequestFailed {
            cause: Failure::HandlerPanicked { message, .. },
            ..
        }) => assert!(message.contains("refused on purpose"), "{message}"),
        other => panic!("expected a handler panic, got {other:?}"),
    }
    w.push(&keys, &ones, KVOptions::new())
        .unwrap()
        .wait_timeout(T)
        .unwrap();
    let pulled = w
        .pull(&keys, KVOptions::new())
        .unwrap()
        .take_timeout(T)
        .unwrap();
    // The other threads' parts of the failed push were applied (at most
    // once, as a failed request may be); thread 1's keys were not.
    for (k, v) in pulled.keys.iter().zip(pulled.vals.iter()) {
        let expected = if shard_of(*k, THREADS) == 1 {
            2.0
        } else {
            15.0
        };
        assert_eq!(*v, expected, "key {k}");
    }
}

/// Processes: kv_app's servers run the sum store on `PS_SERVER_THREADS=4`
/// engine threads; every worker's push, pull and push-pull sums are exact.
#[test]
fn kv_app_is_exact_on_four_server_threads() {
    let launch = Launch::example("kv_app", 2, 4).env("PS_SERVER_THREADS", "4");
    let run = run(launch.command(), launch.timeout + Duration::from_secs(15));
    run.assert_ok();
    assert_eq!(
        run.stdout.matches("sums exact").count(),
        4,
        "{}",
        run.output()
    );
}
