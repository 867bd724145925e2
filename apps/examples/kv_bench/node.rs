//! Node mode: one server or worker of a benchmark cluster, launched by the driver through
//! `pslite launch`; the worker prints `BENCH ...` lines for the driver.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pslite::{Error, KVOptions, KVPairs, KVRequest, KVServer, KVWorker, Postoffice, SArray};

use crate::alloc::allocations;
use crate::driver::{median, REPLICA_SIZES};
use crate::Args;

pub(crate) fn node(args: &Args) -> Result<(), Error> {
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
    let _server = match (po.is_server(), args.mode.as_str()) {
        (true, "layers") => Some(crate::layers::echo_server(&po)?),
        (true, _) => Some(empty_server(&po, args.inline_server, args.repeat)?),
        _ => None,
    };
    if po.is_worker() {
        let kv = KVWorker::<f32>::new(&po, 0, 0)?;
        match args.mode.as_str() {
            "cxx" => cxx_workload(&po, &kv, args, &[false, true])?,
            // Fresh values only (tests/bench/links.py: a slow link makes
            // the same-arrays pass cost as much and say nothing new).
            "cxx_fresh" => cxx_workload(&po, &kv, args, &[true])?,
            "layers" => crate::layers::layers(&po, &kv, args)?,
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
pub(crate) fn print_thread_cpu() {
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
pub(crate) struct ServerAllocs {
    last: Option<u64>,
    pushes: u64,
    allocs: u64,
}

pub(crate) static SERVER_ALLOCS: Mutex<ServerAllocs> = Mutex::new(ServerAllocs {
    last: None,
    pushes: 0,
    allocs: 0,
});

pub(crate) fn lock_counts<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The empty handler: pushes are answered at once; pulls get the requested
/// keys back with zero values (a slice of one cached buffer, no copy).
/// `cmd` of the push that asks each server to make its `cxx_fresh` answers.
pub(crate) const CMD_PREPARE_FRESH: i32 = 1;
/// `cmd` of a `cxx_fresh` pull: answered with values never sent before.
pub(crate) const CMD_FRESH: i32 = 2;

/// A server that keeps nothing: a pull is answered with the keys it asked
/// for and zeros (the same array every time, as a server whose values did
/// not change), or, for a [`CMD_FRESH`] pull, with one of `fresh` arrays
/// made beforehand ([`CMD_PREPARE_FRESH`], `fresh` per worker) and never sent before (a pull
/// in chunks gets consecutive slices of one): as a
/// server whose values changed since the last pull, it pays for sending new
/// content, but not for computing it inside the timed pull.
pub(crate) fn empty_server(
    po: &Postoffice,
    inline: bool,
    fresh: usize,
) -> Result<KVServer<f32>, Error> {
    let server = KVServer::<f32>::new(po, 0)?;
    let mut zeros = SArray::<f32>::new();
    let mut prepared: Vec<SArray<f32>> = Vec::new();
    // Each worker's fresh answer in use and how much of it went: a large
    // pull arrives in chunks (one request per chunk of keys, in order).
    let mut serving: std::collections::HashMap<i32, (SArray<f32>, usize)> = Default::default();
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
            let n = req.keys.len();
            let current = serving.entry(meta.sender).or_default();
            if current.0.len() - current.1 < n {
                *current = (prepared.pop().unwrap_or_default(), 0);
            }
            if current.0.len() - current.1 >= n {
                let vals = current.0.slice(current.1..current.1 + n);
                current.1 += n;
                KVPairs::new(req.keys.clone(), vals)
            } else {
                eprintln!("kv_bench server: a fresh pull without a prepared answer");
                KVPairs::new(req.keys.clone(), SArray::from_vec(vec![0.0; n]))
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
pub(crate) fn spread_keys(n: usize) -> SArray<u64> {
    let step = u64::MAX / n.max(1) as u64;
    SArray::from_vec((0..n as u64).map(|i| i * step).collect())
}

pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// C++ ps-lite's workload, then the same with a fresh value array per push
/// (gradients change every step; made before the timer starts), the keys
/// the same array every time: `BENCH cxx ...` and `BENCH cxx_fresh ...`.
pub(crate) fn cxx_workload(
    po: &Postoffice,
    kv: &KVWorker<f32>,
    args: &Args,
    passes: &[bool],
) -> Result<(), Error> {
    let keys = spread_keys(args.keys);
    let vals = SArray::from_vec(vec![1.0f32; args.keys]);
    for &fresh in passes {
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

pub(crate) fn join(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Sizes of the sweep, capped at `max`.
pub(crate) fn sweep_sizes(max: usize) -> Vec<usize> {
    [1, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000]
        .into_iter()
        .filter(|&n| n <= max)
        .collect()
}

/// How many round trips to time at size `n`.
pub(crate) fn iterations(n: usize) -> usize {
    match n {
        0..=1_000 => 2_000,
        1_001..=10_000 => 500,
        10_001..=100_000 => 100,
        100_001..=1_000_000 => 15,
        _ => 4,
    }
}

pub(crate) fn sweep(po: &Postoffice, kv: &KVWorker<f32>, args: &Args) -> Result<(), Error> {
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
pub(crate) fn sweep_size(
    po: &Postoffice,
    kv: &KVWorker<f32>,
    n: usize,
    args: &Args,
) -> Result<(), Error> {
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
