//! `kv_bench`: how fast pslite moves keys and values, next to raw ZeroMQ.
//!
//! Run without `DMLC_ROLE` it is the driver: it launches clusters of itself
//! through `pslite launch` (found next to the examples directory), collects
//! what the workers measure, measures raw ZeroMQ at the same message sizes
//! in the same run, and prints markdown tables:
//!
//! ```text
//! cargo build --release --bins --examples
//! target/release/examples/kv_bench                 # everything below
//! target/release/examples/kv_bench --only cxx      # one part: cxx, sweep, rtt, startup, replicas
//! ```
//!
//! - `cxx`: C++ ps-lite's benchmark workload: 10 M `u64` keys with `f32`
//!   values (120 MB) pushed once then pulled once per round, empty server
//!   handler, at 1 server + 1 worker and 2 + 2; the same arrays every
//!   round (as C++ ps-lite's benchmark), then again with a fresh value
//!   array per push (`cxx_fresh`: gradients change every step, keys do not;
//!   the array is made before the timer starts), each pull answered with
//!   values never sent before (the server makes them before the timer
//!   starts, as a server whose values changed since the last pull). Shared
//!   memory sends an array it already holds without a copy, so only the
//!   fresh figures say what a training step's push and pull cost.
//! - `sweep`: keys per request 1 .. 10 M, median round trip of a push (of
//!   values never sent before, made before the timer starts) and a pull
//!   (µs) and GB/s (12 bytes per key), plus requests per second with a
//!   window of requests in flight. The workers start each phase together
//!   (a barrier), as the raw clients do.
//! - `rtt`: the 1-key push round trip at 1+1 and 2+2, pslite, raw ZeroMQ
//!   over TCP and raw ZeroMQ over ipc (abstract Unix sockets, the path
//!   same-host pslite nodes take unless `PS_IPC=0`) alternating, 5 times
//!   each (medians of 2000 round trips per run), and
//!   the Rust heap allocations per round trip on the worker and the server
//!   (a counting global allocator; ZeroMQ's own are not seen).
//! - `startup`: launch to every node past the start barrier, 1+2+2, 1+32+32
//!   and 1+100+100.
//! - `replicas`: push and pull medians at 1, 1 000 and 100 000 keys, 2+2,
//!   with `PS_REPLICAS=1` (ps-lite) and `2` (each push applied by the
//!   range's backup before it is answered), 3 launches of each, alternating.
//!
//! Run with `DMLC_ROLE` (as `pslite launch` does) it is one node of such a
//! cluster; the worker prints `BENCH ...` lines for the driver. The raw
//! baseline's servers and clients are processes too (this program with the
//! hidden `--raw-server` and `--raw-client` options), S + W of them as a
//! pslite cluster has; `--raw-layout threads` runs them as threads of the
//! driver instead.
//!
//! The driver ends with machine-readable lines, one per cluster (raw is raw
//! ZeroMQ over TCP loopback, the path C++ ps-lite takes):
//!
//! ```text
//! RESULT cxx 1+1 push_ms=.. pull_ms=.. raw_push_ms=.. raw_pull_ms=..
//! RESULT cxx_fresh 1+1 push_ms=.. pull_ms=.. raw_push_ms=.. raw_pull_ms=..
//! RESULT rtt 1+1 ours_us=.. raw_us=..
//! RESULT replicas 2+2 keys=1000 k1_push_us=.. k2_push_us=.. push_ratio=.. k1_pull_us=.. k2_pull_us=..
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use pslite::{Error, KVOptions, KVPairs, KVRequest, KVServer, KVWorker, Postoffice, SArray};

#[derive(Parser, Clone, Debug)]
#[command(about = "pslite benchmarks (see the module docs)")]
struct Args {
    /// Keys of the C++-equivalent workload (and the largest sweep size).
    #[arg(long, default_value_t = 10_000_000)]
    keys: usize,
    /// Rounds of the C++-equivalent workload.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Requests in flight for the pipelined measurement.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Run only one part: cxx, sweep, rtt, startup, replicas, raw.
    #[arg(long)]
    only: Option<String>,
    /// (node mode) what the worker measures: cxx, sweep, rtt, startup.
    #[arg(long, default_value = "cxx")]
    mode: String,
    /// Servers answer on the receive thread (KVServer::set_request_handle_inline)
    /// instead of the app's thread, as ps-lite does.
    #[arg(long)]
    inline_server: bool,
    /// (raw mode) serve as raw ZeroMQ server `RANK` for the clients whose
    /// ROUTERs listen at `--raw-clients`; prints its own endpoint first.
    #[arg(long, hide = true)]
    raw_server: Option<usize>,
    /// (raw mode) the clients' endpoints, comma-separated.
    #[arg(long, hide = true, default_value = "")]
    raw_clients: String,
    /// (raw mode) listen on an abstract Unix socket instead of TCP.
    #[arg(long, hide = true)]
    raw_ipc: bool,
    /// (raw mode) serve as raw ZeroMQ client `RANK`: prints its endpoint,
    /// then takes commands on stdin.
    #[arg(long, hide = true)]
    raw_client: Option<usize>,
    /// How the raw ZeroMQ baseline's servers and clients run: each a
    /// process of its own, as pslite's nodes (the default), or all threads
    /// of this program (the layout before 2026-11-23, to compare with).
    #[arg(long, value_enum, default_value = "processes")]
    raw_layout: RawLayout,
}

/// Counts the heap allocations of this process's Rust code (ZeroMQ's own,
/// made by C++, are not counted), to report allocations per round trip.
struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` or `realloc` above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as `dealloc` and `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

fn main() -> ExitCode {
    pslite::init_logging();
    let args = Args::parse();
    if let Some(rank) = args.raw_server {
        pslite::exit_code(raw_server_process(rank, &args.raw_clients, args.raw_ipc))
    } else if let Some(rank) = args.raw_client {
        pslite::exit_code(raw_client_process(rank, args.raw_ipc))
    } else if std::env::var_os("DMLC_ROLE").is_some() {
        pslite::exit_code(node(&args))
    } else {
        pslite::exit_code(driver(&args))
    }
}

// ---------------------------------------------------------------- node mode

fn node(args: &Args) -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    if args.mode == "startup" {
        let launched: u128 = std::env::var("PSLITE_LAUNCH_UNIX_NS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        println!("BENCH ready_us={}", now.saturating_sub(launched) / 1000);
    }
    let _server = if po.is_server() {
        Some(empty_server(&po, args.inline_server, args.repeat)?)
    } else {
        None
    };
    if po.is_worker() {
        let kv = KVWorker::<f32>::new(&po, 0, 0)?;
        match args.mode.as_str() {
            "cxx" => cxx_workload(&po, &kv, args)?,
            "sweep" => sweep(&po, &kv, args)?,
            "rtt" => sweep_size(&po, &kv, 1, args)?,
            "replicas" => {
                for n in REPLICA_SIZES {
                    sweep_size(&po, &kv, n, args)?;
                }
            }
            _ => {}
        }
    }
    if po.is_worker() && std::env::var_os("KV_BENCH_THREAD_CPU").is_some() {
        print_thread_cpu();
    }
    po.finalize(0, true)?;
    if po.is_server() {
        let (pushes, allocs) = {
            let c = lock_counts(&SERVER_ALLOCS);
            (c.pushes, c.allocs)
        };
        if pushes > 0 {
            println!(
                "BENCH server push_allocs={:.1}",
                allocs as f64 / pushes as f64
            );
        }
    }
    Ok(())
}

/// Prints the CPU time of each of this worker's threads so far
/// (`/proc/self/task/*/schedstat`), for `KV_BENCH_THREAD_CPU=1` runs (a
/// server cannot tell when the workers are done, so only workers print).
fn print_thread_cpu() {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        println!("BENCH cpu thread={} ms={:.1}", name.trim(), ns as f64 / 1e6);
    }
}

/// What a server counts: allocations between consecutive 1-key pushes
/// (from the receive of one to the receive of the next, so a whole round
/// trip of the server's side).
struct ServerAllocs {
    last: Option<u64>,
    pushes: u64,
    allocs: u64,
}

static SERVER_ALLOCS: Mutex<ServerAllocs> = Mutex::new(ServerAllocs {
    last: None,
    pushes: 0,
    allocs: 0,
});

fn lock_counts<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The empty handler: pushes are answered at once; pulls get the requested
/// keys back with zero values (a slice of one cached buffer, no copy).
/// `cmd` of the push that asks each server to make its `cxx_fresh` answers.
const CMD_PREPARE_FRESH: i32 = 1;
/// `cmd` of a `cxx_fresh` pull: answered with values never sent before.
const CMD_FRESH: i32 = 2;

/// A server that keeps nothing: a pull is answered with the keys it asked
/// for and zeros (the same array every time, as a server whose values did
/// not change), or, for a [`CMD_FRESH`] pull, with one of `fresh` arrays
/// made beforehand ([`CMD_PREPARE_FRESH`], `fresh` per worker) and never sent before: as a
/// server whose values changed since the last pull, it pays for sending new
/// content, but not for computing it inside the timed pull.
fn empty_server(po: &Postoffice, inline: bool, fresh: usize) -> Result<KVServer<f32>, Error> {
    let server = KVServer::<f32>::new(po, 0)?;
    let mut zeros = SArray::<f32>::new();
    let mut prepared: Vec<SArray<f32>> = Vec::new();
    let handle = move |meta: &pslite::KVMeta, req: KVPairs<f32>, server: &KVServer<f32>| {
        if meta.push && req.keys.len() == 1 {
            let now = allocations();
            let mut c = lock_counts(&SERVER_ALLOCS);
            // Consecutive pushes only (a pull in between starts afresh).
            if let Some(last) = c.last.take() {
                c.pushes += 1;
                c.allocs += now - last;
            }
            c.last = Some(now);
        } else {
            lock_counts(&SERVER_ALLOCS).last = None;
        }
        if meta.push && meta.cmd == CMD_PREPARE_FRESH {
            // `fresh` answers for each worker that asks.
            prepared
                .extend((0..fresh).map(|i| SArray::from_vec(vec![i as f32 + 1.0; req.keys.len()])));
        }
        let res = if meta.pull && meta.cmd == CMD_FRESH {
            match prepared.pop() {
                Some(vals) if vals.len() == req.keys.len() => KVPairs::new(req.keys.clone(), vals),
                _ => {
                    eprintln!("kv_bench server: a fresh pull without a prepared answer");
                    KVPairs::new(
                        req.keys.clone(),
                        SArray::from_vec(vec![0.0; req.keys.len()]),
                    )
                }
            }
        } else if meta.pull {
            if zeros.len() < req.keys.len() {
                zeros = SArray::from_vec(vec![0.0; req.keys.len()]);
            }
            KVPairs::new(req.keys.clone(), zeros.slice(0..req.keys.len()))
        } else {
            KVPairs::default()
        };
        if let Err(e) = server.response(meta, res) {
            eprintln!("cannot answer: {e}");
        }
    };
    if inline {
        server.set_request_handle_inline(handle);
    } else {
        server.set_request_handle(handle);
    }
    Ok(server)
}

/// `n` keys spread over the whole key space (so every server gets a share).
fn spread_keys(n: usize) -> SArray<u64> {
    let step = u64::MAX / n.max(1) as u64;
    SArray::from_vec((0..n as u64).map(|i| i * step).collect())
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// C++ ps-lite's workload, then the same with a fresh value array per push
/// (gradients change every step; made before the timer starts), the keys
/// the same array every time: `BENCH cxx ...` and `BENCH cxx_fresh ...`.
fn cxx_workload(po: &Postoffice, kv: &KVWorker<f32>, args: &Args) -> Result<(), Error> {
    let keys = spread_keys(args.keys);
    let vals = SArray::from_vec(vec![1.0f32; args.keys]);
    for fresh in [false, true] {
        let (mut push, mut pull) = (Vec::new(), Vec::new());
        let pull_cmd = if fresh {
            // Every server makes its fresh answers now, outside the timer.
            let prepare = KVOptions::new().cmd(CMD_PREPARE_FRESH);
            kv.zpush(keys.clone(), vals.clone(), prepare)?.wait()?;
            po.barrier(0, pslite::WORKER_GROUP)?;
            CMD_FRESH
        } else {
            0
        };
        for round in 0..args.repeat {
            let vals = if fresh {
                SArray::from_vec(vec![round as f32 + 2.0; args.keys])
            } else {
                vals.clone()
            };
            let t = Instant::now();
            kv.zpush(keys.clone(), vals, KVOptions::new())?.wait()?;
            push.push(millis(t.elapsed()));
            let t = Instant::now();
            let got = kv
                .zpull(keys.clone(), KVOptions::new().cmd(pull_cmd))?
                .take()?;
            pull.push(millis(t.elapsed()));
            if got.vals.len() != args.keys {
                return Err(Error::App(format!("pulled {} values", got.vals.len())));
            }
        }
        println!(
            "BENCH {} keys={} push_ms={} pull_ms={} misaligned={}",
            if fresh { "cxx_fresh" } else { "cxx" },
            args.keys,
            join(&push),
            join(&pull),
            pslite::misaligned_copies()
        );
    }
    Ok(())
}

fn join(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Sizes of the sweep, capped at `max`.
fn sweep_sizes(max: usize) -> Vec<usize> {
    [1, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000]
        .into_iter()
        .filter(|&n| n <= max)
        .collect()
}

/// How many round trips to time at size `n`.
fn iterations(n: usize) -> usize {
    match n {
        0..=1_000 => 2_000,
        1_001..=10_000 => 500,
        10_001..=100_000 => 100,
        100_001..=1_000_000 => 15,
        _ => 4,
    }
}

fn sweep(po: &Postoffice, kv: &KVWorker<f32>, args: &Args) -> Result<(), Error> {
    for n in sweep_sizes(args.keys) {
        sweep_size(po, kv, n, args)?;
    }
    Ok(())
}

/// One size of the sweep: prints a `BENCH sweep keys=<n>` line.
///
/// The workers go through the phases together (a barrier before each), so
/// that, like the raw baseline, every worker pushes while the others push
/// and none is timed while another pulls or floods the servers with
/// pipelined pushes.
fn sweep_size(po: &Postoffice, kv: &KVWorker<f32>, n: usize, args: &Args) -> Result<(), Error> {
    let together = || po.barrier(0, pslite::WORKER_GROUP);
    let keys = spread_keys(n);
    let vals = SArray::from_vec(vec![1.0f32; n]);
    let iters = iterations(n);
    together()?;
    // Warm up connections and buffers.
    for _ in 0..iters.min(20) {
        kv.zpush(keys.clone(), vals.clone(), KVOptions::new())?
            .wait()?;
        kv.zpull(keys.clone(), KVOptions::new())?.take()?;
    }
    let mut push = Vec::with_capacity(iters);
    let mut pull = Vec::with_capacity(iters);
    // Each timed push sends values never sent before (gradients change
    // every step; shared memory sends an array it already holds without a
    // copy), made before the timer starts; the keys are the same array.
    let mut fresh: Vec<SArray<f32>> = (0..iters)
        .map(|i| SArray::from_vec(vec![i as f32 + 2.0; n]))
        .collect();
    together()?;
    let before = allocations();
    while let Some(vals) = fresh.pop() {
        let t = Instant::now();
        kv.zpush(keys.clone(), vals, KVOptions::new())?.wait()?;
        push.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let push_allocs = (allocations() - before) as f64 / iters as f64;
    together()?;
    for _ in 0..iters {
        let t = Instant::now();
        kv.zpull(keys.clone(), KVOptions::new())?.take()?;
        pull.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // Pipelined: `window` pushes in flight.
    let mut rps = 0.0;
    if n <= 10_000 && args.mode != "rtt" {
        together()?;
        let total = (iters * 5).max(args.window * 4);
        let t = Instant::now();
        let mut inflight: std::collections::VecDeque<KVRequest<f32>> = Default::default();
        for _ in 0..total {
            if inflight.len() >= args.window {
                if let Some(push) = inflight.pop_front() {
                    push.wait()?;
                }
            }
            inflight.push_back(kv.zpush(keys.clone(), vals.clone(), KVOptions::new())?);
        }
        for push in inflight {
            push.wait()?;
        }
        rps = total as f64 / t.elapsed().as_secs_f64();
    }
    println!(
        "BENCH sweep keys={n} push_us={:.1} pull_us={:.1} rps={rps:.0} push_allocs={push_allocs:.1}",
        median(&mut push),
        median(&mut pull)
    );
    Ok(())
}

/// Keys per request of the `replicas` part.
const REPLICA_SIZES: [usize; 3] = [1, 1_000, 100_000];

/// Launches of each cluster behind a `RESULT replicas` line, alternating
/// `PS_REPLICAS=1` and `2`.
const REPLICA_RUNS: usize = 3;

/// The `replicas` part: push and pull medians at 2 servers + 2 workers with
/// every range on one server (`PS_REPLICAS=1`, ps-lite) and on two (`2`: a
/// push is answered once the backup applied it too), launched alternately.
fn replicas(args: &Args, results: &mut Vec<String>) -> Result<(), Error> {
    println!("## Replicated key ranges: PS_REPLICAS=2 against 1 at 1+2+2 (medians)\n");
    println!(
        "| keys | push µs, k=1 | push µs, k=2 | k=1 / k=2, push | pull µs, k=1 | pull µs, k=2 |"
    );
    println!("|---|---|---|---|---|---|");
    // (k, keys) -> medians of each launch.
    let mut push: std::collections::BTreeMap<(usize, usize), Vec<f64>> = Default::default();
    let mut pull: std::collections::BTreeMap<(usize, usize), Vec<f64>> = Default::default();
    for _ in 0..REPLICA_RUNS {
        for k in [1usize, 2] {
            let k_str = k.to_string();
            let run = launch_with(2, 2, "replicas", args, &[("PS_REPLICAS", &k_str)])?;
            for line in run.lines.iter().filter(|l| l.starts_with("sweep")) {
                let Some(n) = field(line, "keys").and_then(|v| v.parse::<usize>().ok()) else {
                    continue;
                };
                let get = |f| field(line, f).and_then(|v| v.parse::<f64>().ok());
                if let (Some(p), Some(q)) = (get("push_us"), get("pull_us")) {
                    push.entry((k, n)).or_default().push(p);
                    pull.entry((k, n)).or_default().push(q);
                }
            }
        }
    }
    for n in REPLICA_SIZES.into_iter().filter(|&n| n <= args.keys) {
        let m = |map: &mut std::collections::BTreeMap<(usize, usize), Vec<f64>>, k| {
            median(map.entry((k, n)).or_default())
        };
        let (p1, p2, q1, q2) = (
            m(&mut push, 1),
            m(&mut push, 2),
            m(&mut pull, 1),
            m(&mut pull, 2),
        );
        println!(
            "| {n} | {p1:.1} | {p2:.1} | {:.2} | {q1:.1} | {q2:.1} |",
            p1 / p2
        );
        results.push(format!(
            "RESULT replicas 2+2 keys={n} k1_push_us={p1:.1} k2_push_us={p2:.1} \
             push_ratio={:.2} k1_pull_us={q1:.1} k2_pull_us={q2:.1}",
            p1 / p2
        ));
    }
    println!();
    Ok(())
}

/// Launches of each cluster (and raw runs) behind a `RESULT rtt` line.
const RTT_RUNS: usize = 5;

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

// ------------------------------------------------------------------ driver

struct Launched {
    lines: Vec<String>,
}

fn launch(servers: usize, workers: usize, mode: &str, args: &Args) -> Result<Launched, Error> {
    launch_with(servers, workers, mode, args, &[])
}

/// [`launch`] with extra environment variables for every node.
fn launch_with(
    servers: usize,
    workers: usize,
    mode: &str,
    args: &Args,
    env: &[(&str, &str)],
) -> Result<Launched, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::App(format!("cannot find this program: {e}")))?;
    let pslite = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("pslite"))
        .filter(|p| p.exists())
        .ok_or_else(|| {
            Error::App(
                "cannot find the pslite binary next to the examples directory; run \
                 `cargo build --release --bins --examples` first"
                    .into(),
            )
        })?;
    let output = Command::new(pslite)
        .envs(env.iter().copied())
        .args(["launch", "--timeout", "600"])
        .args(["--servers", &servers.to_string()])
        .args(["--workers", &workers.to_string()])
        .arg("--")
        .arg(&exe)
        .args(["--mode", mode])
        .args(["--keys", &args.keys.to_string()])
        .args(["--repeat", &args.repeat.to_string()])
        .args(["--window", &args.window.to_string()])
        .args(args.inline_server.then_some("--inline-server"))
        .output()
        .map_err(|e| Error::App(format!("cannot run pslite launch: {e}")))?;
    if !output.status.success() {
        return Err(Error::App(format!(
            "the {servers}+{workers} {mode} cluster failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_once("BENCH ").map(|(_, rest)| rest.to_string()))
        .collect();
    Ok(Launched { lines })
}

/// `key=value` fields of a BENCH line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

fn numbers(s: &str) -> Vec<f64> {
    s.split(',').filter_map(|x| x.parse().ok()).collect()
}

fn driver(args: &Args) -> Result<(), Error> {
    // The raw baseline runs in this process: give it the malloc tuning the
    // launcher gives the nodes, so both sides are measured alike.
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        let status = Command::new(
            std::env::current_exe()
                .map_err(|e| Error::App(format!("cannot find this program: {e}")))?,
        )
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
        .status()
        .map_err(|e| Error::App(format!("cannot re-run this program: {e}")))?;
        return if status.success() {
            Ok(())
        } else {
            Err(Error::App(format!("kv_bench failed: {status}")))
        };
    }
    let only = args.only.as_deref();
    let want = |part: &str| only.is_none_or(|o| o == part);
    println!("# pslite kv_bench\n");
    println!(
        "{} cores, keys {} (12 bytes each on a push), {} rounds, window {}, servers answer on {}, \
         GLIBC_TUNABLES={}\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.keys,
        args.repeat,
        args.window,
        if args.inline_server {
            "the receive thread"
        } else {
            "the app's thread"
        },
        std::env::var("GLIBC_TUNABLES").unwrap_or_default()
    );
    let mut raw = Raw::new(args.raw_layout);
    let mut raw_ipc = Raw::new(args.raw_layout);
    raw_ipc.ipc = true;
    let mut results = Vec::new();
    if want("cxx") {
        println!(
            "## C++ ps-lite's workload: {} keys, push then pull\n",
            args.keys
        );
        println!(
            "Raw ZeroMQ: the same bytes over the same sockets (a DEALER per peer to each node's \
             ROUTER, requests split over the servers, a pull answered with its keys echoed and \
             the values), as many workers and servers, {}.\n",
            match args.raw_layout {
                RawLayout::Processes => "each a process",
                RawLayout::Threads => "as threads of this process",
            }
        );
        println!("| cluster | push ms | pull ms | push GB/s | raw push ms | raw pull ms | ours / raw, push | ours / raw, pull | misaligned frames copied |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for (s, w) in [(1, 1), (2, 2)] {
            let run = launch(s, w, "cxx", args)?;
            let rounds = args.repeat.max(3);
            let raw_push = raw.round_trip_us(s, w, s, args.keys * 12, 16, rounds)? / 1e3;
            let raw_pull = raw.pull_us(s, w, s, args.keys * 8, args.keys * 4, rounds)? / 1e3;
            for (name, label) in [("cxx", ""), ("cxx_fresh", ", fresh values")] {
                let mut push = Vec::new();
                let mut pull = Vec::new();
                let mut misaligned = 0.0f64;
                let mine = run
                    .lines
                    .iter()
                    .filter(|l| l.split_whitespace().next() == Some(name));
                for line in mine {
                    push.extend(field(line, "push_ms").map(numbers).unwrap_or_default());
                    pull.extend(field(line, "pull_ms").map(numbers).unwrap_or_default());
                    misaligned += field(line, "misaligned")
                        .and_then(|m| m.parse::<f64>().ok())
                        .unwrap_or(0.0);
                }
                let (p, q) = (median(&mut push), median(&mut pull));
                println!(
                    "| 1+{s}+{w}{label} | {p:.1} | {q:.1} | {:.2} | {raw_push:.1} | {raw_pull:.1} | {:.2} | {:.2} | {misaligned} |",
                    (args.keys * 12) as f64 / (p / 1e3) / 1e9,
                    p / raw_push,
                    q / raw_pull,
                );
                results.push(format!(
                    "RESULT {name} {s}+{w} push_ms={p:.1} pull_ms={q:.1} raw_push_ms={raw_push:.1} \
                     raw_pull_ms={raw_pull:.1}"
                ));
            }
        }
        println!();
    }
    if want("sweep") {
        for (s, w) in [(1, 1), (2, 2)] {
            println!("## Sweep at 1+{s}+{w} (per worker, medians)\n");
            println!(
                "| keys | push µs | pull µs | push GB/s | raw push µs | ours / raw, push | pushes/s, {} in flight |",
                args.window
            );
            println!("|---|---|---|---|---|---|---|");
            let run = launch(s, w, "sweep", args)?;
            for n in sweep_sizes(args.keys) {
                let mut push = Vec::new();
                let mut pull = Vec::new();
                let mut rps = Vec::new();
                for line in run
                    .lines
                    .iter()
                    .filter(|l| l.starts_with("sweep") && field(l, "keys") == Some(&n.to_string()))
                {
                    push.extend(field(line, "push_us").and_then(|v| v.parse::<f64>().ok()));
                    pull.extend(field(line, "pull_us").and_then(|v| v.parse::<f64>().ok()));
                    rps.extend(field(line, "rps").and_then(|v| v.parse::<f64>().ok()));
                }
                let (p, q) = (median(&mut push), median(&mut pull));
                let raw_us = raw.round_trip_us(s, w, s.min(n), n * 12, 16, iterations(n))?;
                let rps = median(&mut rps);
                println!(
                    "| {n} | {p:.1} | {q:.1} | {:.3} | {raw_us:.1} | {:.2} | {} |",
                    (n * 12) as f64 / (p / 1e6) / 1e9,
                    p / raw_us,
                    if rps > 0.0 {
                        format!("{rps:.0}")
                    } else {
                        "-".into()
                    }
                );
            }
            println!();
        }
    }
    if want("rtt") {
        let ipc_off = ["PS_IPC", "PS_SHM"]
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|x| x.trim() == "0"));
        println!(
            "## 1-key push round trip (µs; pslite, raw ZeroMQ over TCP and raw ZeroMQ over \
             ipc alternating, {RTT_RUNS} runs each, medians of 2000 round trips per run; \
             pslite's nodes talk over {})\n",
            if ipc_off {
                "TCP (PS_IPC=0 or PS_SHM=0)"
            } else {
                "ipc (same host)"
            }
        );
        println!(
            "| cluster | pslite, runs | raw TCP, runs | raw ipc, runs | pslite median | raw TCP median | raw ipc median | ours / raw TCP | ours / raw ipc | Rust allocations per round trip, worker / server |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for (s, w) in [(1, 1), (2, 2)] {
            let (mut ours, mut raws, mut ipcs) = (Vec::new(), Vec::new(), Vec::new());
            let mut allocs = String::from("-");
            for _ in 0..RTT_RUNS {
                let run = launch(s, w, "rtt", args)?;
                let count = |prefix: &str| {
                    run.lines
                        .iter()
                        .filter(|l| l.starts_with(prefix))
                        .find_map(|l| field(l, "push_allocs"))
                        .unwrap_or("-")
                        .to_string()
                };
                allocs = format!("{} / {}", count("sweep"), count("server"));
                let mut push: Vec<f64> = run
                    .lines
                    .iter()
                    .filter(|l| l.starts_with("sweep"))
                    .filter_map(|l| field(l, "push_us").and_then(|v| v.parse().ok()))
                    .collect();
                ours.push(median(&mut push));
                raws.push(raw.round_trip_us(s, w, 1, 12, 16, iterations(1))?);
                ipcs.push(raw_ipc.round_trip_us(s, w, 1, 12, 16, iterations(1))?);
            }
            let show = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (o_runs, r_runs, i_runs) = (show(&ours), show(&raws), show(&ipcs));
            let (o, r, i) = (median(&mut ours), median(&mut raws), median(&mut ipcs));
            println!(
                "| 1+{s}+{w} | {o_runs} | {r_runs} | {i_runs} | {o:.1} | {r:.1} | {i:.1} | {:.2} | \
                 {:.2} | {allocs} |",
                o / r,
                o / i
            );
            results.push(format!("RESULT rtt {s}+{w} ours_us={o:.1} raw_us={r:.1}"));
        }
        println!();
    }
    if want("replicas") {
        replicas(args, &mut results)?;
    }
    if want("startup") {
        println!("## Start-up: launch to every node past the start barrier\n");
        println!("| cluster | median of 5 launches (ms) | slowest launch (ms) |");
        println!("|---|---|---|");
        for (s, w) in [(2, 2), (32, 32), (100, 100)] {
            let mut samples = Vec::new();
            for _ in 0..5 {
                let run = launch(s, w, "startup", args)?;
                let last = run
                    .lines
                    .iter()
                    .filter_map(|l| field(l, "ready_us").and_then(|v| v.parse::<f64>().ok()))
                    .fold(0.0f64, f64::max);
                samples.push(last / 1e3);
            }
            let slowest = samples.iter().copied().fold(0.0f64, f64::max);
            println!("| 1+{s}+{w} | {:.1} | {slowest:.1} |", median(&mut samples));
        }
        println!();
    }
    if !results.is_empty() {
        println!(
            "## Machine-readable\n\n```text\n{}\n```\n",
            results.join("\n")
        );
    }
    if only == Some("raw") {
        println!("## Raw ZeroMQ round trips (one pair)\n");
        println!("| bytes | µs |\n|---|---|");
        for n in sweep_sizes(args.keys) {
            println!(
                "| {} | {:.1} |",
                n * 12,
                raw.round_trip_us(1, 1, 1, n * 12, 16, iterations(n))?
            );
        }
    }
    Ok(())
}

/// How the raw baseline's nodes run (`--raw-layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RawLayout {
    /// Every server and every client a process of its own, as pslite runs
    /// each node: the same launch shape (S + W processes).
    Processes,
    /// Servers and clients as threads of the driver, each with its own
    /// ZeroMQ context (the layout before 2026-11-23), to compare with.
    Threads,
}

/// What one raw request asks of the servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RawRequest {
    /// Servers the request is split over (the first `fanout`).
    fanout: usize,
    /// Bytes sent in all (split evenly over the servers).
    size: usize,
    /// Whether each server sends its share of the request back (zero-copy,
    /// the received frame itself), as a pslite server answers a pull with
    /// the request's keys.
    echo: bool,
    /// Bytes each server's reply carries besides the echo, in all (split
    /// evenly): the values of a pull, a small ack for a push.
    extra: usize,
    /// Timed round trips (after up to 20 untimed ones).
    iters: usize,
}

impl RawRequest {
    /// A request of `size` bytes answered with `reply` bytes.
    fn push(fanout: usize, size: usize, reply: usize, iters: usize) -> RawRequest {
        RawRequest {
            fanout,
            size,
            echo: false,
            extra: reply,
            iters,
        }
    }

    /// The line a client process reads on stdin.
    fn line(&self) -> String {
        format!(
            "RUN {} {} {} {} {}\n",
            self.fanout,
            self.size,
            u8::from(self.echo),
            self.extra,
            self.iters
        )
    }

    fn parse(line: &str) -> Option<RawRequest> {
        let mut words = line.split_whitespace();
        if words.next() != Some("RUN") {
            return None;
        }
        let mut num = || words.next().and_then(|w| w.parse::<usize>().ok());
        let (fanout, size, echo, extra, iters) = (num()?, num()?, num()?, num()?, num()?);
        Some(RawRequest {
            fanout,
            size,
            echo: echo == 1,
            extra,
            iters,
        })
    }
}

/// Raw ZeroMQ clusters of `servers` x `workers`, started on first use.
struct Raw {
    layout: RawLayout,
    clusters: Vec<((usize, usize), RawCluster)>,
    /// Over abstract Unix sockets (`ipc://@`, the path same-host pslite
    /// nodes take) instead of TCP loopback.
    ipc: bool,
}

impl Raw {
    fn new(layout: RawLayout) -> Raw {
        Raw {
            layout,
            clusters: Vec::new(),
            ipc: false,
        }
    }

    /// Median (over workers, of each worker's median) round trip in µs of a
    /// request of `size` bytes answered with `reply` bytes, split over
    /// `fanout` servers like a pslite request (each worker at once).
    fn round_trip_us(
        &mut self,
        servers: usize,
        workers: usize,
        fanout: usize,
        size: usize,
        reply: usize,
        iters: usize,
    ) -> Result<f64, Error> {
        self.run(
            servers,
            workers,
            RawRequest::push(fanout, size, reply, iters),
        )
    }

    /// As `round_trip_us` for a pull: `keys` bytes out, the same keys
    /// (echoed) and `vals` bytes of values back, split over `fanout`
    /// servers.
    fn pull_us(
        &mut self,
        servers: usize,
        workers: usize,
        fanout: usize,
        keys: usize,
        vals: usize,
        iters: usize,
    ) -> Result<f64, Error> {
        let req = RawRequest {
            fanout,
            size: keys,
            echo: true,
            extra: vals,
            iters,
        };
        self.run(servers, workers, req)
    }

    fn run(&mut self, servers: usize, workers: usize, req: RawRequest) -> Result<f64, Error> {
        let key = (servers, workers);
        if !self.clusters.iter().any(|(k, _)| *k == key) {
            let cluster = RawCluster::start(servers, workers, self.layout, self.ipc)?;
            self.clusters.push((key, cluster));
        }
        let cluster = self
            .clusters
            .iter_mut()
            .find(|(k, _)| *k == key)
            .map(|(_, c)| c)
            .ok_or_else(|| Error::App("raw cluster vanished".into()))?;
        // Client processes start together: each is told before any answer
        // is read.
        for client in &mut cluster.clients {
            if let RawClientNode::Process(p) = client {
                p.say(&req.line())?;
            }
        }
        let medians: Vec<Result<f64, Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = cluster
                .clients
                .iter_mut()
                .map(|client| {
                    scope.spawn(move || match client {
                        RawClientNode::Local(c) => Ok(c.round_trip_us(&req)),
                        RawClientNode::Process(p) => {
                            let line = p.read_line()?;
                            line.strip_prefix("MEDIAN ")
                                .and_then(|v| v.trim().parse::<f64>().ok())
                                .ok_or_else(|| Error::App(format!("a raw client said {line:?}")))
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::App("a raw client panicked".into())))
                })
                .collect()
        });
        let mut medians = medians.into_iter().collect::<Result<Vec<f64>, Error>>()?;
        Ok(median(&mut medians))
    }
}

/// Raw ZeroMQ in ps-lite's topology: every node binds a ROUTER and sends
/// through its own DEALER per peer (identities `ps<id>`, servers
/// `ps<8+2s>`, clients `ps<9+2c>`); a client's request is split evenly over
/// the servers, each answers with its share. Frames move as pslite moves
/// them: sent by reference, received into ZeroMQ's buffers, no copies.
struct RawCluster {
    clients: Vec<RawClientNode>,
    servers: Vec<RawServerNode>,
    stop_endpoints: Vec<String>,
    ctx: zmq::Context,
}

enum RawClientNode {
    Local(RawClient),
    Process(RawProcess),
}

enum RawServerNode {
    Thread(std::thread::JoinHandle<()>),
    Process(RawProcess),
}

/// A raw node started as a process of this program: it prints
/// `ENDPOINT <endpoint>` first, then reads commands on its stdin and exits
/// when stdin closes (so also when this process is killed).
struct RawProcess {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    endpoint: String,
}

impl RawProcess {
    fn spawn(role: &[String]) -> Result<RawProcess, Error> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::App(format!("cannot find this program: {e}")))?;
        let mut child = Command::new(&exe)
            .args(role)
            .env_remove("DMLC_ROLE")
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::App(format!("cannot start a raw node: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::App("a raw node has no stdin or stdout".into()));
        };
        let mut p = RawProcess {
            child,
            stdin: Some(stdin),
            stdout: std::io::BufReader::new(stdout),
            endpoint: String::new(),
        };
        let line = p.read_line()?;
        match line.trim().strip_prefix("ENDPOINT ") {
            Some(endpoint) => p.endpoint = endpoint.to_string(),
            None => return Err(Error::App(format!("a raw node said {line:?}"))),
        }
        Ok(p)
    }

    fn say(&mut self, line: &str) -> Result<(), Error> {
        use std::io::Write;
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| Error::App("a raw node's stdin is closed".into()))?;
        stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| Error::App(format!("cannot talk to a raw node: {e}")))
    }

    fn read_line(&mut self) -> Result<String, Error> {
        use std::io::BufRead;
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err(Error::App("a raw node exited".into())),
            Ok(_) => Ok(line),
            Err(e) => Err(Error::App(format!("cannot read a raw node: {e}"))),
        }
    }

    /// Closes its stdin and waits for it to exit until `deadline`, then
    /// kills it.
    fn finish(mut self, deadline: Instant) {
        drop(self.stdin.take());
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw client: a DEALER to each server and its own ROUTER for replies.
struct RawClient {
    to_servers: Vec<zmq::Socket>,
    inbox: zmq::Socket,
    /// The request's bytes, kept between runs of the same size.
    payload: Bytes,
    _ctx: zmq::Context,
}

fn raw_err(e: zmq::Error) -> Error {
    Error::App(format!("raw ZeroMQ: {e}"))
}

/// A ROUTER bound to a free loopback port (or a fresh abstract Unix
/// socket), and its endpoint.
fn raw_router(ctx: &zmq::Context, ipc: bool) -> Result<(zmq::Socket, String), Error> {
    let router = ctx.socket(zmq::ROUTER).map_err(raw_err)?;
    if ipc {
        static ROUTERS: AtomicU64 = AtomicU64::new(0);
        let n = ROUTERS.fetch_add(1, Ordering::Relaxed);
        let endpoint = format!("ipc://@kv_bench-raw-{}-{n}", std::process::id());
        router.bind(&endpoint).map_err(raw_err)?;
        return Ok((router, endpoint));
    }
    router.bind("tcp://127.0.0.1:*").map_err(raw_err)?;
    let endpoint = router
        .get_last_endpoint()
        .map_err(raw_err)?
        .unwrap_or_default();
    Ok((router, endpoint))
}

fn raw_dealer(ctx: &zmq::Context, identity: &str, endpoint: &str) -> Result<zmq::Socket, Error> {
    let dealer = ctx.socket(zmq::DEALER).map_err(raw_err)?;
    dealer.set_identity(identity.as_bytes()).map_err(raw_err)?;
    dealer.connect(endpoint).map_err(raw_err)?;
    Ok(dealer)
}

/// DEALERs from node `id` (`ps<id>`: servers 8 + 2r, clients 9 + 2r, as
/// ps-lite numbers them) to each endpoint.
fn raw_dealers(
    ctx: &zmq::Context,
    id: usize,
    endpoints: &[String],
) -> Result<Vec<zmq::Socket>, Error> {
    let identity = format!("ps{id}");
    endpoints
        .iter()
        .map(|ep| raw_dealer(ctx, &identity, ep))
        .collect()
}

impl RawCluster {
    fn start(
        servers: usize,
        workers: usize,
        layout: RawLayout,
        ipc: bool,
    ) -> Result<RawCluster, Error> {
        let mut cluster = RawCluster {
            clients: Vec::new(),
            servers: Vec::new(),
            stop_endpoints: Vec::new(),
            ctx: zmq::Context::new(),
        };
        // Clients first (the servers connect to their ROUTERs), then the
        // servers, then the clients' DEALERs to the servers. One ZeroMQ
        // context (one I/O thread) per node in either layout.
        match layout {
            RawLayout::Processes => {
                let mut procs = Vec::new();
                let ipc_flag: Vec<String> =
                    ipc.then(|| "--raw-ipc".to_string()).into_iter().collect();
                for c in 0..workers {
                    let mut role = vec!["--raw-client".to_string(), c.to_string()];
                    role.extend(ipc_flag.iter().cloned());
                    procs.push(RawProcess::spawn(&role)?);
                }
                let client_eps: Vec<String> = procs.iter().map(|p| p.endpoint.clone()).collect();
                for s in 0..servers {
                    let mut role = vec![
                        "--raw-server".to_string(),
                        s.to_string(),
                        "--raw-clients".to_string(),
                        client_eps.join(","),
                    ];
                    role.extend(ipc_flag.iter().cloned());
                    let p = RawProcess::spawn(&role)?;
                    cluster.stop_endpoints.push(p.endpoint.clone());
                    cluster.servers.push(RawServerNode::Process(p));
                }
                let line = format!("CONNECT {}\n", cluster.stop_endpoints.join(","));
                for mut p in procs {
                    p.say(&line)?;
                    cluster.clients.push(RawClientNode::Process(p));
                }
            }
            RawLayout::Threads => {
                let mut locals = Vec::new();
                for _ in 0..workers {
                    let ctx = zmq::Context::new();
                    let (inbox, endpoint) = raw_router(&ctx, ipc)?;
                    locals.push((ctx, inbox, endpoint));
                }
                let client_eps: Vec<String> = locals.iter().map(|l| l.2.clone()).collect();
                for s in 0..servers {
                    let ctx = zmq::Context::new();
                    let (inbox, endpoint) = raw_router(&ctx, ipc)?;
                    let mut to_clients = raw_dealers(&ctx, 8 + 2 * s, &client_eps)?;
                    cluster.stop_endpoints.push(endpoint);
                    cluster
                        .servers
                        .push(RawServerNode::Thread(std::thread::spawn(move || {
                            let _ctx = ctx;
                            raw_serve(&inbox, &mut to_clients);
                        })));
                }
                for (c, (ctx, inbox, _)) in locals.into_iter().enumerate() {
                    cluster.clients.push(RawClientNode::Local(RawClient {
                        to_servers: raw_dealers(&ctx, 9 + 2 * c, &cluster.stop_endpoints)?,
                        inbox,
                        payload: Bytes::new(),
                        _ctx: ctx,
                    }));
                }
            }
        }
        Ok(cluster)
    }
}

/// A raw server's loop: answers every request as its meta asks, until a
/// `stop` message or a receive error.
fn raw_serve(inbox: &zmq::Socket, to_clients: &mut [zmq::Socket]) {
    // The values a reply carries: one buffer, sent again and again by
    // reference, as pslite's bench server keeps one zero array.
    let mut vals = Bytes::new();
    loop {
        // Received as pslite receives: frames stay in ZeroMQ's buffers.
        let Ok(raw) = pslite_van::transport::recv_message(inbox) else {
            return;
        };
        let Some(meta) = raw.meta else {
            return;
        };
        if &meta[..] == b"stop" {
            return;
        }
        // The meta: echo flag (1 byte), then the extra reply size (u64 LE).
        let echo = meta.first() == Some(&1);
        let extra = meta
            .get(1..9)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0) as usize;
        if extra != vals.len() {
            vals = Bytes::from(vec![0u8; extra]);
        }
        // The sender is ps<9+2c>.
        let Some(out) = usize::try_from((raw.sender - 9) / 2)
            .ok()
            .and_then(|c| to_clients.get_mut(c))
        else {
            continue;
        };
        let _ = match raw.data.first() {
            Some(request) if echo => {
                let frames = [request.clone(), vals.clone()];
                pslite_van::transport::send_message(out, b"reply", &frames)
            }
            _ => pslite_van::transport::send_message(out, b"reply", std::slice::from_ref(&vals)),
        };
    }
}

/// A raw ZeroMQ server process (`--raw-server`): binds a ROUTER, prints
/// `ENDPOINT <endpoint>`, connects a DEALER to each client and answers every
/// request as its meta asks, until told to stop or its stdin closes.
fn raw_server_process(rank: usize, clients: &str, ipc: bool) -> Result<(), Error> {
    let ctx = zmq::Context::new();
    let (inbox, endpoint) = raw_router(&ctx, ipc)?;
    let clients: Vec<String> = clients
        .split(',')
        .filter(|ep| !ep.is_empty())
        .map(str::to_string)
        .collect();
    let mut to_clients = raw_dealers(&ctx, 8 + 2 * rank, &clients)?;
    // Exit with the driver: its end of our stdin closes when it exits,
    // however it exits.
    std::thread::spawn(|| {
        use std::io::Read;
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        std::process::exit(0);
    });
    say_endpoint(&endpoint)?;
    raw_serve(&inbox, &mut to_clients);
    Ok(())
}

fn say_endpoint(endpoint: &str) -> Result<(), Error> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ENDPOINT {endpoint}")
        .and_then(|()| out.flush())
        .map_err(|e| Error::App(format!("cannot write to stdout: {e}")))
}

/// A raw ZeroMQ client process (`--raw-client`): binds a ROUTER, prints
/// `ENDPOINT <endpoint>`, then reads commands on stdin until it closes:
/// `CONNECT <server endpoints>` and `RUN ...` (see [`RawRequest::line`]),
/// answering each run with `MEDIAN <µs>`.
fn raw_client_process(rank: usize, ipc: bool) -> Result<(), Error> {
    use std::io::{BufRead, Write};
    let ctx = zmq::Context::new();
    let (inbox, endpoint) = raw_router(&ctx, ipc)?;
    say_endpoint(&endpoint)?;
    let read_err = |e: std::io::Error| Error::App(format!("cannot read stdin: {e}"));
    let mut lines = std::io::stdin().lock().lines();
    let Some(first) = lines.next() else {
        return Ok(());
    };
    let first = first.map_err(read_err)?;
    let servers: Vec<String> = first
        .strip_prefix("CONNECT ")
        .ok_or_else(|| Error::App(format!("a raw client was told {first:?}")))?
        .split(',')
        .map(str::to_string)
        .collect();
    let mut client = RawClient {
        to_servers: raw_dealers(&ctx, 9 + 2 * rank, &servers)?,
        inbox,
        payload: Bytes::new(),
        _ctx: ctx,
    };
    for line in lines {
        let line = line.map_err(read_err)?;
        let req = RawRequest::parse(&line)
            .ok_or_else(|| Error::App(format!("a raw client was told {line:?}")))?;
        let us = client.round_trip_us(&req);
        let mut out = std::io::stdout().lock();
        if writeln!(out, "MEDIAN {us}")
            .and_then(|()| out.flush())
            .is_err()
        {
            // The driver is gone.
            return Ok(());
        }
    }
    Ok(())
}

impl RawClient {
    /// Median round trip (µs) of `req`: its bytes out, split evenly over
    /// the first `fanout` servers (those a pslite request of that size
    /// reaches), and their replies back.
    fn round_trip_us(&mut self, req: &RawRequest) -> f64 {
        let n = req.fanout.clamp(1, self.to_servers.len().max(1));
        let share = req.size.div_ceil(n);
        if self.payload.len() != share {
            self.payload = Bytes::from(vec![1u8; share]);
        }
        let mut meta = vec![u8::from(req.echo)];
        meta.extend_from_slice(&(req.extra.div_ceil(n) as u64).to_le_bytes());
        meta.extend_from_slice(&[0u8; 12]);
        let warmup = req.iters.min(20);
        let mut samples = Vec::with_capacity(req.iters);
        for i in 0..req.iters + warmup {
            let t = Instant::now();
            for out in &mut self.to_servers[..n] {
                let sent = pslite_van::transport::send_message(
                    out,
                    &meta,
                    std::slice::from_ref(&self.payload),
                );
                if sent.is_err() {
                    return f64::NAN;
                }
            }
            for _ in 0..n {
                if pslite_van::transport::recv_message(&self.inbox).is_err() {
                    return f64::NAN;
                }
            }
            if i >= warmup {
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        median(&mut samples)
    }
}

impl Drop for RawCluster {
    fn drop(&mut self) {
        for endpoint in &self.stop_endpoints {
            if let Ok(s) = self.ctx.socket(zmq::DEALER) {
                let _ = s.set_linger(1000);
                if s.connect(endpoint).is_ok() {
                    let _ = s.send(&b"stop"[..], 0);
                }
            }
        }
        // Processes that miss the stop message (or clients, which get
        // none) exit when their stdin closes; any left at the deadline are
        // killed.
        let deadline = Instant::now() + Duration::from_secs(10);
        for client in self.clients.drain(..) {
            if let RawClientNode::Process(p) = client {
                p.finish(deadline);
            }
        }
        for server in self.servers.drain(..) {
            match server {
                RawServerNode::Process(p) => p.finish(deadline),
                RawServerNode::Thread(t) => {
                    // A thread that missed its stop message is left behind.
                    while !t.is_finished() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if t.is_finished() {
                        let _ = t.join();
                    }
                }
            }
        }
    }
}
