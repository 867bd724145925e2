//! The key-value store the scheduler hosts, on real clusters: every
//! operation through the Postoffice's `Store` handle (in-process nodes on
//! real sockets), 8 worker processes hammering `add` on one key, the
//! `pslite store` subcommands (watch included, with `PS_AUTH_TOKEN`)
//! against a running scheduler, bounds set by configuration, and a watcher
//! process killed -9 whose watch the scheduler drops.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use pslite::{Error, Store, StoreLimit};
use pslite_tests::{node_command, node_env_with, pslite_command, run, spawn, Launch, LocalCluster};

/// Waits (up to 10 s) until `what` of the scheduler's Van is `n` (the Van
/// offers no event for it: it is polled).
fn wait_until(
    scheduler: &pslite::Postoffice,
    n: usize,
    name: &str,
    what: impl Fn(&pslite::Postoffice) -> usize,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while what(scheduler) != n {
        assert!(
            Instant::now() < deadline,
            "the scheduler never had {n} {name} (has {})",
            what(scheduler)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (up to 10 s) until `n` store requests wait on the scheduler.
fn wait_until_waiting(scheduler: &pslite::Postoffice, n: usize) {
    wait_until(scheduler, n, "waiting requests", |po| {
        po.van().map_or(0, |v| v.store_waiting())
    });
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
        Err(Error::StoreTimeout { keys, .. }) => assert_eq!(keys, vec!["never".to_string()]),
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
    assert!(matches!(e, Error::TooLarge { .. }), "{e:?}");
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

fn cli_command(port: u16, args: &[&str]) -> std::process::Command {
    let mut cmd = pslite_command("store");
    cmd.arg("--port").arg(port.to_string()).args(args);
    cmd
}

fn cli(port: u16, args: &[&str]) -> (bool, String, String) {
    let r = run(cli_command(port, args), Duration::from_secs(20));
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
    let getter = spawn(cli_command(port, &["get", "late"]));
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
fn pslite_store_without_a_scheduler_fails_at_the_timeout_it_names() {
    let port = pslite_tests::free_port();
    pslite_tests::pslite_bin(); // built before the clock starts
    for (args, timeout) in [
        (&["--timeout", "0.5", "get", "x"][..], "0.5"),
        (&["--timeout", "1", "keys"][..], "1.0"),
        // A request that does not wait on the scheduler waited 2 s more.
        (&["--timeout", "3", "set", "a", "b"][..], "3.0"),
    ] {
        let t0 = Instant::now();
        let (ok, _, err) = cli(port, args);
        let took = t0.elapsed();
        assert!(!ok);
        assert!(
            err.contains(&format!("no answer from the scheduler at tcp://127.0.0.1:{port} within {timeout} s: nothing accepted the connection")),
            "{err}"
        );
        let asked: f64 = timeout.parse().unwrap_or_default();
        assert!(
            took >= Duration::from_secs_f64(asked) && took < Duration::from_secs_f64(asked + 1.5),
            "{args:?} took {took:?}"
        );
    }
}

#[test]
fn pslite_store_watch_prints_every_change_in_order_with_a_token() {
    const TOKEN: &str = "store watch secret";
    let c = LocalCluster::start_with_token(1, 1, TOKEN);
    let port = c.scheduler.config().van.scheduler_port as u16;
    let w = store(&c.workers[0]);
    w.set("epoch", "0").unwrap();
    let mut cmd = cli_command(
        port,
        &["--timeout", "30", "watch", "epoch", "--count", "22"],
    );
    cmd.env("PS_AUTH_TOKEN", TOKEN);
    let watcher = spawn(cmd);
    watcher
        .wait_for_line("watching \"epoch\" (version 1)", Duration::from_secs(20))
        .expect("the CLI never started watching");
    for i in 1..=20 {
        w.set("epoch", i.to_string()).unwrap();
    }
    w.set("epoch", vec![0u8, 255]).unwrap();
    w.delete("epoch").unwrap();
    let r = watcher.wait(Duration::from_secs(40));
    assert!(r.ok(), "{}", r.output());
    let mut expected: Vec<String> = (1..=20).map(|i| format!("{} set {i}", i + 1)).collect();
    expected.push("22 set 0x00ff".into());
    expected.push("23 deleted".into());
    assert_eq!(
        r.stdout.lines().collect::<Vec<_>>(),
        expected,
        "{}",
        r.output()
    );
    // The CLI unwatched as it left.
    wait_until(&c.scheduler, 0, "watches", |po| {
        po.van().map_or(usize::MAX, |v| v.store_watches())
    });

    // Without the token, or with a wrong one, the scheduler refuses the
    // handshake: the error says so at once, naming the variable.
    for token in [None, Some("wrong")] {
        for args in [&["watch", "epoch"][..], &["keys"], &["set", "k", "v"]] {
            let mut cmd = cli_command(port, &[&["--timeout", "30"][..], args].concat());
            cmd.env_remove("PS_AUTH_TOKEN");
            if let Some(token) = token {
                cmd.env("PS_AUTH_TOKEN", token);
            }
            let r = run(cmd, Duration::from_secs(40));
            assert!(!r.ok(), "{}", r.output());
            assert!(
                r.stderr.contains("PS_AUTH_TOKEN"),
                "{token:?}: {}",
                r.output()
            );
            assert!(!r.stderr.contains("no answer"), "{}", r.output());
            assert!(r.elapsed < Duration::from_secs(20), "took {:?}", r.elapsed);
        }
    }

    // A count not reached by the timeout fails, saying so.
    let mut cmd = cli_command(
        port,
        &["--timeout", "0.5", "watch", "epoch", "--count", "1"],
    );
    cmd.env("PS_AUTH_TOKEN", TOKEN);
    let r = run(cmd, Duration::from_secs(20));
    assert!(!r.ok(), "{}", r.output());
    assert!(r.stderr.contains("saw 0 of 1 events"), "{}", r.output());
    c.finalize();
}

#[test]
fn configured_bounds_refuse_with_typed_errors() {
    // The scheduler's bounds are small; the workers' own value check is the
    // default, so the value bound is enforced by the scheduler.
    let c = LocalCluster::start_with(1, 1, |cfg| {
        if cfg.role() == pslite::Role::Scheduler {
            let l = &mut cfg.van.store_limits;
            l.max_value = 16;
            l.max_keys = 2;
            l.max_watches_per_node = 1;
        }
    });
    let w = store(&c.workers[0]);
    match w.set("k", vec![7u8; 17]) {
        Err(Error::TooLarge {
            which: StoreLimit::Value,
            size: 17,
            limit: 16,
        }) => {}
        other => panic!("expected the value bound, got {other:?}"),
    }
    w.set("a", "1").unwrap();
    w.multi_set([("b", "2"), ("b", "3")]).unwrap();
    assert_eq!(w.multi_get(&["a", "b"]).unwrap(), vec!["1", "3"]);
    let e = w.set("c", "1").unwrap_err();
    assert!(
        matches!(
            e,
            Error::TooLarge {
                which: StoreLimit::Keys,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("PS_STORE_MAX_KEYS"), "{e}");
    assert_eq!(w.append("a", "23").unwrap(), 3);
    assert_eq!(&w.get("a").unwrap()[..], b"123");
    let _watch = w.watch("a").unwrap();
    let e = w
        .watch("b")
        .err()
        .expect("a second watch is over the bound");
    assert!(e.to_string().contains("PS_STORE_MAX_WATCHES"), "{e}");
    c.finalize();
}

#[test]
fn a_watcher_killed_9_loses_its_watch_on_the_scheduler() {
    let port = pslite_tests::free_port();
    let env = [
        ("PS_HEARTBEAT_INTERVAL", "1"),
        ("PS_HEARTBEAT_TIMEOUT", "3"),
    ];
    let node = |role, verbose: &str| {
        let mut env = env.to_vec();
        env.push(("PS_VERBOSE", verbose));
        let mut cmd = node_command("store_watch", &node_env_with(role, 1, 1, port, &env));
        cmd.arg("k");
        spawn(cmd)
    };
    let scheduler = node("scheduler", "1");
    let server = node("server", "0");
    let worker = node("worker", "0");
    let limit = Duration::from_secs(60);
    server
        .wait_for_line("watching k", limit)
        .expect("the server never watched");
    let line = worker
        .wait_for_line("watching k", limit)
        .expect("the worker never watched");
    let id = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    worker.signal(libc::SIGKILL);
    let killed = worker.wait(limit);
    assert!(killed.code().is_none(), "not killed: {}", killed.output());
    let t0 = Instant::now();
    let dropped = scheduler.wait_for_line(
        &format!("node {id} is dead: the store dropped its 1 watches and 0 waiting requests"),
        Duration::from_secs(30),
    );
    assert!(
        dropped.is_some(),
        "the scheduler kept the dead node's watch"
    );
    eprintln!("watch dropped {:?} after the kill", t0.elapsed());
    // The live watcher's watch stays.
    let (ok, _, err) = cli(port, &["set", "k", "after"]);
    assert!(ok, "{err}");
    assert!(
        server
            .wait_for_line("event 1 after", Duration::from_secs(20))
            .is_some(),
        "the server's watch was lost"
    );
    for p in [server, scheduler] {
        p.signal(libc::SIGKILL);
        p.wait(limit);
    }
}
