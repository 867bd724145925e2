//! The key-value store the scheduler hosts, on real clusters: every
//! operation through the Postoffice's `Store` handle (in-process nodes on
//! real sockets), 8 worker processes hammering `add` on one key, and the
//! `pslite store` subcommands against a running scheduler.

use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pslite::{Store, StoreError};
use pslite_tests::{pslite_bin, run, Launch, LocalCluster};

/// Waits (up to 10 s) until `n` store requests wait on the scheduler.
fn wait_until_waiting(scheduler: &pslite::Postoffice, n: usize) {
    let van = scheduler.van().expect("the scheduler started");
    let deadline = Instant::now() + Duration::from_secs(10);
    while van.store_waiting() != n {
        assert!(
            Instant::now() < deadline,
            "{n} requests never waited on the scheduler"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn store(po: &pslite::Postoffice) -> Store {
    po.store()
        .expect("a started node has a store")
        .with_timeout(Duration::from_secs(20))
}

#[test]
fn every_store_operation_works_across_nodes() {
    let c = LocalCluster::start(1, 2);
    let (w0, w1) = (store(&c.workers[0]), store(&c.workers[1]));
    let (srv, sched) = (store(&c.servers[0]), store(&c.scheduler));

    // get before set from another node returns when the set happens.
    let getter = w1.clone();
    let started = Instant::now();
    let t = std::thread::spawn(move || getter.get("config/lr"));
    wait_until_waiting(&c.scheduler, 1);
    assert!(!sched.check(&["config/lr"]).unwrap());
    w0.set("config/lr", "0.01").unwrap();
    let got = t.join().expect("get panicked").expect("get failed");
    assert_eq!(&got[..], b"0.01");
    assert!(started.elapsed() < Duration::from_secs(15));

    // add is atomic and returns the sum; get reads decimal text.
    assert_eq!(srv.add("n", 5).unwrap(), 5);
    assert_eq!(w0.add("n", -2).unwrap(), 3);
    assert_eq!(&sched.get("n").unwrap()[..], b"3");

    // compare_set.
    let r = w0.compare_set("leader", None, "w0").unwrap();
    assert!(r.swapped);
    let r = w1.compare_set("leader", None, "w1").unwrap();
    assert!(!r.swapped, "the key exists already");
    assert_eq!(r.value.as_deref(), Some(&b"w0"[..]));
    let r = w1.compare_set("leader", Some(b"w0"), "w1").unwrap();
    assert!(r.swapped);
    assert_eq!(&srv.get("leader").unwrap()[..], b"w1");

    // check, num_keys, keys, delete.
    assert!(w1.check(&["n", "leader", "config/lr"]).unwrap());
    assert!(!w1.check(&["n", "missing"]).unwrap());
    assert_eq!(w0.num_keys().unwrap(), 3);
    assert_eq!(w0.keys().unwrap(), vec!["config/lr", "leader", "n"]);
    assert!(w0.delete("n").unwrap());
    assert!(!w0.delete("n").unwrap());
    assert_eq!(sched.num_keys().unwrap(), 2);

    // wait, and its deadline as a typed error naming the missing key.
    w0.wait(&["leader", "config/lr"]).unwrap();
    let t0 = Instant::now();
    match w1.wait_within(&["leader", "never"], Duration::from_millis(500)) {
        Err(StoreError::Timeout { keys, .. }) => assert_eq!(keys, vec!["never".to_string()]),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t0.elapsed() >= Duration::from_millis(500));
    let e = w1
        .get_within("never", Duration::from_millis(300))
        .unwrap_err();
    assert!(
        e.to_string().contains("key \"never\" not set within 0.3 s"),
        "{e}"
    );

    // A too-large value gets a clear error, not an allocation on the scheduler.
    let big = vec![0u8; 64 * 1024 * 1024 + 1];
    let e = w0.set("big", big).unwrap_err();
    assert!(matches!(e, StoreError::TooLarge { .. }), "{e:?}");
    assert!(e.to_string().contains("over the store's limit"), "{e}");
    assert!(!w0.check(&["big"]).unwrap());

    c.finalize();
}

#[test]
fn watchers_see_every_change_in_order() {
    let c = LocalCluster::start(1, 2);
    let (w0, w1) = (store(&c.workers[0]), store(&c.workers[1]));
    let watch = w1.watch("epoch").unwrap();
    assert_eq!(watch.version, 0);
    let (tx, rx) = mpsc::channel();
    store(&c.servers[0])
        .watch_with("epoch", move |e| {
            tx.send(e).ok();
        })
        .unwrap();
    for i in 1..=50 {
        w0.set("epoch", i.to_string()).unwrap();
    }
    w0.delete("epoch").unwrap();
    let mut from_watch = || watch.recv_timeout(Duration::from_secs(10));
    let mut from_callback = || rx.recv_timeout(Duration::from_secs(10)).ok();
    let sources: [(&str, &mut dyn FnMut() -> Option<pslite::StoreEvent>); 2] =
        [("watch", &mut from_watch), ("callback", &mut from_callback)];
    for (who, next) in sources {
        for i in 1..=50u64 {
            let e = next().unwrap_or_else(|| panic!("{who}: event {i} missing"));
            assert_eq!(e.key, "epoch");
            assert_eq!(e.version, i, "{who}: events in order");
            assert_eq!(e.value.as_deref(), Some(i.to_string().as_bytes()));
        }
        let e = next().unwrap_or_else(|| panic!("{who}: the delete event is missing"));
        assert_eq!((e.version, e.value), (51, None));
    }
    c.finalize();
}

#[test]
fn eight_processes_adding_to_one_key_give_the_exact_total() {
    let r = Launch::example("store_counter", 1, 8)
        .program_arg("300")
        .timeout(Duration::from_secs(180))
        .run();
    r.assert_ok();
    let out = r.output();
    assert_eq!(
        out.matches("count = 2400 (expected 2400)").count(),
        8,
        "every worker reads the exact total:\n{out}"
    );
}

fn cli(port: u16, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(pslite_bin());
    cmd.arg("store")
        .arg("--port")
        .arg(port.to_string())
        .args(args)
        .env_remove("DMLC_LOCAL");
    let r = run(cmd, Duration::from_secs(20));
    assert!(!r.timed_out, "pslite store hung");
    (r.ok(), r.stdout.clone(), r.stderr.clone())
}

#[test]
fn pslite_store_subcommands_talk_to_a_running_scheduler() {
    let c = LocalCluster::start(1, 1);
    let port = c.scheduler.config().van.scheduler_port as u16;
    let w = store(&c.workers[0]);
    assert_eq!(
        cli(port, &["set", "addr", "10.0.0.1:80"]),
        (true, String::new(), String::new())
    );
    assert_eq!(&w.get("addr").unwrap()[..], b"10.0.0.1:80");
    w.set("from-node", "hello").unwrap();
    assert_eq!(cli(port, &["get", "from-node"]).1, "hello\n");
    assert_eq!(cli(port, &["add", "n", "40"]).1, "40\n");
    assert_eq!(cli(port, &["add", "n", "-38"]).1, "2\n");
    assert_eq!(w.add("n", 1).unwrap(), 3);
    assert_eq!(cli(port, &["keys"]).1, "addr\nfrom-node\nn\n");
    assert!(cli(port, &["wait", "addr", "n"]).0);

    // get waits for a set made while it waits.
    let mut cmd = Command::new(pslite_bin());
    cmd.args(["store", "--port", &port.to_string(), "get", "late"]);
    let getter = pslite_tests::spawn(cmd);
    // Set only once the CLI's request is waiting on the scheduler.
    wait_until_waiting(&c.scheduler, 1);
    w.set("late", "now").unwrap();
    let r = getter.wait(Duration::from_secs(20));
    assert!(r.ok(), "{}", r.output());
    assert_eq!(r.stdout, "now\n");

    // Deadlines and refusals fail with a message and exit 1.
    let (ok, _, err) = cli(port, &["--timeout", "0.3", "wait", "nope"]);
    assert!(!ok);
    assert!(err.contains("\"nope\" not set within 0.3 s"), "{err}");
    let (ok, _, err) = cli(port, &["add", "addr", "1"]);
    assert!(!ok);
    assert!(err.contains("not a decimal integer"), "{err}");
    let (ok, _, err) = cli(port, &["delete", "nope"]);
    assert!(!ok && err.contains("does not exist"), "{err}");
    c.finalize();
}

#[test]
fn pslite_store_without_a_scheduler_fails_within_its_deadline() {
    let port = pslite_tests::free_port();
    let t0 = Instant::now();
    let (ok, _, err) = cli(port, &["--timeout", "0.5", "get", "x"]);
    assert!(!ok);
    assert!(err.contains("no answer from the scheduler"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}
