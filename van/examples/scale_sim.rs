//! The control plane's cost as the job grows (issue 33 item 2): whole
//! clusters of cores in the in-memory network with virtual time
//! (`pslite_van_core::harness`), N = 100, 1 000 and 10 000 nodes, taken
//! through formation, a server's death and its recovery, a barrier over
//! everyone, and an elastic worker's join and leave. For each event: the
//! messages and bytes the scheduler and the average other node put on the
//! network, the time spent inside the cores (the control plane's CPU: the
//! harness's own work, the codec included, is outside it), and the
//! virtual time the event took.
//!
//! ```text
//! cargo run --release --example scale_sim            # 100, 1000, 10000
//! cargo run --release --example scale_sim -- 100 300  # other sizes
//! ```
//!
//! Prints a table (markdown) and `RESULT scale_sim` lines.

use std::time::{Duration, Instant};

use pslite_proto::ids::WORKER_GROUP;
use pslite_proto::Role;
use pslite_van_core::harness::{Network, Traffic, SCHEDULER_PORT};
use pslite_van_core::rendezvous::RendezvousConfig;
use pslite_van_core::{Ticket, VanConfig};

const SECOND: Duration = Duration::from_secs(1);

/// The counters of every node at one moment, and the clocks.
struct Snapshot {
    traffic: Vec<Traffic>,
    core: Vec<Duration>,
    virtual_now: Instant,
    cpu: Duration,
}

fn snapshot(net: &Network) -> Snapshot {
    Snapshot {
        traffic: net.nodes.iter().map(|n| n.traffic).collect(),
        core: net.nodes.iter().map(|n| n.core_time).collect(),
        virtual_now: net.now,
        cpu: process_cpu(),
    }
}

/// This process's CPU time (user and system), from getrusage.
fn process_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we pass, nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// This process's peak resident memory so far (`VmHWM` in
/// /proc/self/status), in bytes; 0 where it cannot be read.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// What one event cost.
struct Row {
    n: usize,
    event: &'static str,
    sched_msgs: u64,
    sched_bytes: u64,
    node_msgs: f64,
    node_bytes: f64,
    total_bytes: u64,
    core: Duration,
    sched_core: Duration,
    cpu: Duration,
    virtual_time: Duration,
    /// The process's peak resident memory at the event's end.
    peak_rss: u64,
}

fn row(n: usize, event: &'static str, before: &Snapshot, net: &Network) -> Row {
    let after = snapshot(net);
    let diff = |i: usize| {
        let b = before.traffic.get(i).copied().unwrap_or_default();
        let a = after.traffic[i];
        (a.messages - b.messages, a.bytes - b.bytes)
    };
    let (sched_msgs, sched_bytes) = diff(0);
    let others = after.traffic.len() - 1;
    let (mut msgs, mut bytes) = (0u64, 0u64);
    for i in 1..after.traffic.len() {
        let (m, b) = diff(i);
        msgs += m;
        bytes += b;
    }
    let core = |s: &Snapshot, i: usize| s.core.get(i).copied().unwrap_or_default();
    let total_core: Duration = (0..after.core.len())
        .map(|i| core(&after, i) - core(before, i))
        .sum();
    Row {
        n,
        event,
        sched_msgs,
        sched_bytes,
        node_msgs: msgs as f64 / others as f64,
        node_bytes: bytes as f64 / others as f64,
        total_bytes: sched_bytes + bytes,
        core: total_core,
        sched_core: core(&after, 0) - core(before, 0),
        cpu: after.cpu - before.cpu,
        virtual_time: after.virtual_now - before.virtual_now,
        peak_rss: peak_rss(),
    }
}

/// Servers for a job of `n` nodes: one in ten.
fn servers_of(n: usize) -> usize {
    (n / 10).max(1)
}

fn simulate(n: usize, seed: u64) -> Vec<Row> {
    let servers = servers_of(n);
    // N nodes: the scheduler, the servers, and the workers of the first
    // round; one more worker may join.
    let workers = n - 1 - servers;
    let cfg = VanConfig {
        num_servers: servers as i32,
        num_workers: workers as i32 + 1,
        elastic: Some(RendezvousConfig {
            min: 1,
            max: workers + 1,
            last_call: SECOND,
            timeout: SECOND * 600,
        }),
        // Deaths are noticed by closed connections (1 s); heartbeats are
        // rare enough that few fall inside an event.
        heartbeat_interval: Some(SECOND * 60),
        heartbeat_timeout: Some(SECOND * 180),
        recovery_timeout: SECOND * 60,
        ..VanConfig::default()
    };
    let mut net = Network::new(cfg, seed);
    net.add(Role::Scheduler, SCHEDULER_PORT);
    for i in 0..servers {
        net.add(Role::Server, 10_000 + i as i32);
    }
    for i in 0..workers {
        net.add(Role::Worker, 30_000 + i as i32);
    }
    let mut rows = Vec::new();

    // Formation: everyone registers at once; the first round begins after
    // its last call.
    let before = snapshot(&net);
    assert!(net.form(SECOND * 600), "{n} nodes did not form");
    rows.push(row(n, "formation", &before, &net));
    net.run_for(SECOND);

    // A barrier over everyone.
    let before = snapshot(&net);
    assert!(net.barrier_over_all(SECOND * 60), "the barrier at {n}");
    rows.push(row(n, "barrier (all)", &before, &net));

    // A server dies: its connections close, the scheduler declares it dead
    // and tells every pslite node.
    let server = 1;
    let server_id = net.id(server);
    let before = snapshot(&net);
    net.kill(server);
    // Its connections close at once; the scheduler declares it dead after
    // LINK_GRACE (1 s) and tells every pslite node.
    net.run_for(SECOND * 2);
    rows.push(row(n, "death (server)", &before, &net));

    // It comes back at the same address and takes its id again: the new
    // process gets the table, everyone else its entry.
    let before = snapshot(&net);
    net.restart(server);
    net.register(server);
    assert!(
        net.run_until(SECOND * 30, |net| net.nodes[server].core.is_joined()),
        "server {server_id} did not recover at {n}"
    );
    net.run_for(SECOND / 2);
    assert_eq!(net.id(server), server_id, "it took its id again");
    rows.push(row(n, "recovery (server)", &before, &net));

    // An elastic worker joins: admitted at the next worker barrier, which
    // begins a round with it.
    let before = snapshot(&net);
    let joiner = net.add(Role::Worker, 30_000 + workers as i32);
    net.register(joiner);
    net.run_for(SECOND / 10);
    let waiters: Vec<(usize, Ticket)> = net
        .members(WORKER_GROUP)
        .into_iter()
        .map(|i| (i, net.barrier(i, WORKER_GROUP)))
        .collect();
    assert!(
        net.run_until(SECOND * 30, |net| net.nodes[joiner].core.is_joined()
            && waiters
                .iter()
                .all(|&(i, t)| matches!(net.outcome(i, t), Some(Ok(()))))),
        "the joiner was not admitted at {n}"
    );
    net.run_for(SECOND / 10);
    rows.push(row(n, "join (worker, at a barrier)", &before, &net));

    // An elastic worker leaves: the round goes on without it.
    let leaver = servers + 1;
    let leaver_id = net.id(leaver);
    let last = net.nodes.len() - 2;
    let before = snapshot(&net);
    net.leave(leaver);
    assert!(
        net.run_until(SECOND * 30, |net| net.nodes[last]
            .core
            .round()
            .is_some_and(|(_, members)| !members.contains(&leaver_id))),
        "worker {leaver_id}'s leaving was not noticed at {n}: the scheduler's round {:?}, \
         node {}'s {:?}",
        net.nodes[0].core.round(),
        net.id(last),
        net.nodes[last].core.round()
    );
    // Then its process exits.
    net.kill(leaver);
    net.run_for(SECOND * 2);
    rows.push(row(n, "leave (worker)", &before, &net));

    // A last barrier, over everyone left.
    let before = snapshot(&net);
    assert!(net.barrier_over_all(SECOND * 60), "the last barrier at {n}");
    rows.push(row(n, "barrier (all, again)", &before, &net));
    rows
}

fn main() {
    let sizes: Vec<usize> = {
        let args: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if args.is_empty() {
            vec![100, 1000, 10_000]
        } else {
            args
        }
    };
    println!(
        "| N | event | scheduler msgs | scheduler bytes | avg node msgs | avg node bytes | \
         total bytes | total / N | core CPU (all cores) | scheduler core | process CPU | virtual time | \
         peak memory |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut results = Vec::new();
    for &n in &sizes {
        if n < 20 {
            eprintln!("skipping N={n}: at least 20 nodes");
            continue;
        }
        for r in simulate(n, 33) {
            println!(
                "| {} | {} | {} | {} | {:.1} | {:.0} | {} | {:.0} | {:.2} s | {:.2} s | {:.2} s | {:.3} s \
                 | {:.2} GB |",
                r.n,
                r.event,
                r.sched_msgs,
                r.sched_bytes,
                r.node_msgs,
                r.node_bytes,
                r.total_bytes,
                r.total_bytes as f64 / r.n as f64,
                r.core.as_secs_f64(),
                r.sched_core.as_secs_f64(),
                r.cpu.as_secs_f64(),
                r.virtual_time.as_secs_f64(),
                r.peak_rss as f64 / 1e9,
            );
            results.push(r);
        }
    }
    for r in &results {
        println!(
            "RESULT scale_sim n={} event={:?} sched_msgs={} sched_bytes={} node_msgs={:.1} \
             node_bytes={:.0} total_bytes={} core_s={:.3} sched_core_s={:.3} cpu_s={:.3} \
             virtual_s={:.3} peak_rss_bytes={}",
            r.n,
            r.event,
            r.sched_msgs,
            r.sched_bytes,
            r.node_msgs,
            r.node_bytes,
            r.total_bytes,
            r.core.as_secs_f64(),
            r.sched_core.as_secs_f64(),
            r.cpu.as_secs_f64(),
            r.virtual_time.as_secs_f64(),
            r.peak_rss,
        );
    }
}
