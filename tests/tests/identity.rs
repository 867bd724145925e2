//! Strangers that use members' ZeroMQ identities (issue 24), against real
//! `kv_app` clusters of 2 servers and 2 workers without `PS_AUTH_TOKEN`:
//! a raw DEALER that connects as `ps1` to the scheduler before the cluster
//! forms, as a worker's identity to a server and as a server's identity to
//! a worker mid-job, and as the scheduler's identity to every node, once
//! and repeatedly; and a stranger sending fuzzed frames with member
//! identities while jobs run. In each the job finishes exact, within the
//! time the same job takes without the stranger plus a few seconds.
//!
//! Between pslite nodes an identity carries the key of its process
//! (`ps<id>/<key>`, see docs/PROTOCOL.md), so a stranger's `ps9` is not
//! worker 9's identity: ZeroMQ never hands it worker 9's connection, and
//! the node ignores what comes with it (logged once, with the address).
//!
//! The soak runs for `PSLITE_SOAK_SECS` seconds (default 40); the issue's
//! 5-minute soak is `PSLITE_SOAK_SECS=300 cargo test --release -p
//! pslite-tests --test identity soak`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pslite_tests::hostile::{
    assert_exact, connect_and_close, connect_hold_close, fuzz_rng, hostile_message, Attacker,
    ClusterSpec,
};
use pslite_tests::Run;

/// A stranger running in a thread until stopped.
struct Stranger {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Stranger {
    /// Runs `attack` (one attempt) again and again, 20 ms apart.
    fn repeat(attack: impl Fn(usize) + Send + 'static) -> Stranger {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let (s, d) = (Arc::clone(&stop), Arc::clone(&done));
        let thread = std::thread::spawn(move || {
            let mut i = 0;
            while !s.load(Ordering::SeqCst) {
                attack(i);
                i += 1;
                d.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Stranger {
            stop,
            done,
            thread: Some(thread),
        }
    }

    /// Stops it; returns how many attempts it made.
    fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("the stranger panicked");
        }
        self.done.load(Ordering::SeqCst)
    }
}

/// When the stranger acts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    /// Once, before the other servers and the workers start.
    OnceBefore,
    /// Repeatedly from before they start until the job ends.
    Repeatedly,
    /// Repeatedly from the workers' "go" until the job ends.
    MidJob,
}

/// The ports the stranger targets and the identities it presents.
type Targets = Vec<(u16, &'static str)>;

/// Runs a 2 + 2 kv_app job (300 rounds of 20 000 keys) with a stranger that connects to
/// each of `targets(ports)` with its identity and closes, sending nothing;
/// returns the runs and the time from "go" to the last exit.
fn job(when: Option<When>, targets: fn(&Ports) -> Targets) -> (Vec<Run>, Duration, usize) {
    let spec = ClusterSpec::new()
        .env("KV_APP_REPEAT", "300")
        .env("KV_APP_KEYS", "20000");
    let mut stranger = None;
    let mut cluster = spec.start(|port, servers, workers| {
        let ports = Ports {
            scheduler: port,
            servers,
            workers,
        };
        let list = targets(&ports);
        match when {
            Some(When::OnceBefore) => {
                for &(port, identity) in &list {
                    connect_and_close(identity, port);
                }
            }
            Some(When::Repeatedly) => {
                stranger = Some(Stranger::repeat(move |i| {
                    let (port, identity) = list[i % list.len()];
                    connect_and_close(identity, port);
                }));
            }
            _ => {}
        }
    });
    if when == Some(When::MidJob) {
        let list = targets(&Ports {
            scheduler: cluster.port,
            servers: cluster.server_ports,
            workers: cluster.worker_ports,
        });
        // Each connection stays 100 ms: long enough for the member to
        // reconnect and take the identity back in between, were it a
        // takeover.
        stranger = Some(Stranger::repeat(move |i| {
            let (port, identity) = list[i % list.len()];
            connect_hold_close(identity, port, Duration::from_millis(100));
        }));
    }
    let go = Instant::now();
    cluster.go();
    let runs = cluster.wait(Duration::from_secs(120));
    let took = go.elapsed();
    let attempts = stranger.map_or(usize::from(when.is_some()), Stranger::stop);
    (runs, took, attempts)
}

/// The ports of a cluster.
struct Ports {
    scheduler: u16,
    servers: (u16, u16),
    workers: (u16, u16),
}

/// The job with the stranger is exact and within the time of the job
/// without it plus a few seconds.
fn survives(when: When, targets: fn(&Ports) -> Targets) {
    let (base_runs, base, _) = job(None, targets);
    assert_exact(&base_runs);
    let (runs, took, attempts) = job(Some(when), targets);
    eprintln!("without the stranger {base:?}, with it {took:?} ({attempts} connections)");
    assert_exact(&runs);
    assert!(attempts >= 1);
    assert!(
        took < base + Duration::from_secs(10),
        "took {took:?}, {base:?} without the stranger"
    );
}

fn scheduler_only(p: &Ports) -> Targets {
    vec![(p.scheduler, "ps1")]
}

fn workers_to_servers(p: &Ports) -> Targets {
    vec![(p.servers.0, "ps9"), (p.servers.1, "ps11")]
}

fn servers_to_workers(p: &Ports) -> Targets {
    vec![(p.workers.0, "ps8"), (p.workers.1, "ps10")]
}

fn scheduler_to_everyone(p: &Ports) -> Targets {
    vec![
        (p.scheduler, "ps1"),
        (p.servers.0, "ps1"),
        (p.servers.1, "ps1"),
        (p.workers.0, "ps1"),
        (p.workers.1, "ps1"),
    ]
}

#[test]
fn the_schedulers_identity_on_its_own_port_before_forming_once() {
    survives(When::OnceBefore, scheduler_only);
}

#[test]
fn the_schedulers_identity_on_its_own_port_repeatedly() {
    survives(When::Repeatedly, scheduler_only);
}

#[test]
fn a_workers_identity_to_the_servers_mid_job() {
    survives(When::MidJob, workers_to_servers);
}

#[test]
fn a_servers_identity_to_the_workers_mid_job() {
    survives(When::MidJob, servers_to_workers);
}

#[test]
fn the_schedulers_identity_to_every_node_once() {
    survives(When::OnceBefore, scheduler_to_everyone);
}

#[test]
fn the_schedulers_identity_to_every_node_repeatedly() {
    survives(When::Repeatedly, scheduler_to_everyone);
}

/// Jobs back to back for `PSLITE_SOAK_SECS` (default 40) while a stranger
/// sends every node 100 fuzzed frames a second, presenting member
/// identities (ps1, ps8, ps9, ps10, ps11) from formation to exit: every
/// job must be exact.
#[test]
fn soak_a_stranger_sending_frames_with_member_identities() {
    let secs: u64 = std::env::var("PSLITE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let end = Instant::now() + Duration::from_secs(secs);
    let identities = ["ps1", "ps8", "ps9", "ps10", "ps11"];
    // The first job's fuzzing seed (`PSLITE_SOAK_FIRST`, default 0), to run
    // a failed job's frames again.
    let first: usize = std::env::var("PSLITE_SOAK_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut jobs = first;
    let mut frames = 0;
    while jobs == first || Instant::now() < end {
        let mut stranger = None;
        let spec = ClusterSpec::new().env("KV_APP_REPEAT", "1000");
        let cluster = spec.start(|port, servers, workers| {
            let targets = [port, servers.0, servers.1, workers.0, workers.1];
            let seed = jobs as u64;
            let attackers = std::sync::Mutex::new(Vec::<Attacker>::new());
            stranger = Some(Stranger::repeat(move |i| {
                let mut attackers = attackers.lock().unwrap_or_else(|e| e.into_inner());
                if attackers.is_empty() {
                    for &port in &targets {
                        for identity in identities {
                            attackers.push(Attacker::new(Some(identity), port));
                        }
                    }
                }
                // 2 frames per 20 ms tick: 100 a second, to every node
                // under every member identity in turn.
                let mut rng = fuzz_rng(seed * 1_000_000 + i as u64);
                for j in 0..2 {
                    let k = 2 * i + j;
                    attackers[k % attackers.len()]
                        .try_send_frames(hostile_message(&mut rng, k + 1));
                }
            }));
        });
        let go = Instant::now();
        let runs = cluster.finish(Duration::from_secs(120));
        let took = go.elapsed();
        let ticks = stranger.map_or(0, Stranger::stop);
        frames += 2 * ticks;
        eprintln!("job {jobs}: {took:?} from go to exit");
        assert_exact(&runs);
        jobs += 1;
    }
    let jobs = jobs - first;
    eprintln!("{jobs} jobs exact in {secs} s with {frames} frames from member identities");
}
