//! The `server_threads` part: 8 workers push to and pull from 1 and 2
//! servers running the sum store (`DefaultHandle`) on `PS_SERVER_THREADS` =
//! 1, 2 and 4 engine threads. Each worker pushes `--threads-keys` keys
//! spread over the key space (its rank + 1 as every value), `--repeat`
//! times, waiting for each push; after a barrier it pulls them once and
//! checks every sum exactly (`repeat` x 1+2+..+8). Prints, per cluster and
//! thread count, the slowest worker's push and pull times and the keys per
//! second the servers took, then
//!
//! ```text
//! RESULT server_threads 1+8 threads=2 push_ms=.. pull_ms=.. push_speedup=.. exact=yes
//! ```
//!
//! (`push_speedup`: the push time with one thread over this one's, in the
//! same run.)

use std::time::Instant;

use pslite::{DefaultHandle, Error, KVOptions, KVServer, KVWorker, Postoffice, SArray};

use crate::driver::{field, launch_with, median};
use crate::node::spread_keys;
use crate::Args;

/// Workers of every cluster of this part.
const WORKERS: usize = 8;

/// Engine threads tried.
const THREADS: [usize; 3] = [1, 2, 4];

/// Node mode `--mode threads`.
pub(crate) fn node(args: &Args) -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let _server = if po.is_server() {
        let server = KVServer::<f32>::new(&po, 0)?;
        server.set_concurrent_handle(DefaultHandle::new());
        Some(server)
    } else {
        None
    };
    if po.is_worker() {
        let kv = KVWorker::<f32>::new(&po, 0, 0)?;
        let n = args.threads_keys;
        let rank = po.my_rank()?;
        let keys = spread_keys(n);
        let vals = SArray::from_vec(vec![(rank + 1) as f32; n]);
        po.barrier(0, pslite::WORKER_GROUP)?;
        let t = Instant::now();
        for _ in 0..args.repeat {
            kv.zpush(keys.clone(), vals.clone(), KVOptions::new())?
                .wait()?;
        }
        let push_ms = t.elapsed().as_secs_f64() * 1e3;
        po.barrier(0, pslite::WORKER_GROUP)?;
        let t = Instant::now();
        let got = kv.zpull(keys.clone(), KVOptions::new())?.take()?;
        let pull_ms = t.elapsed().as_secs_f64() * 1e3;
        let workers = po.num_workers() as f32;
        let want = args.repeat as f32 * workers * (workers + 1.0) / 2.0;
        let wrong = got.vals.iter().filter(|&&v| v != want).count();
        let exact = got.vals.len() == n && wrong == 0;
        if !exact {
            eprintln!(
                "worker {rank}: {wrong} of {} sums differ from {want} ({} values for {n} keys)",
                got.vals.len(),
                got.vals.len()
            );
        }
        println!(
            "BENCH threads push_ms={push_ms:.1} pull_ms={pull_ms:.1} exact={}",
            u8::from(exact)
        );
    }
    po.finalize(0, true)?;
    Ok(())
}

/// The `server_threads` part of the driver.
pub(crate) fn server_threads(args: &Args, results: &mut Vec<String>) -> Result<(), Error> {
    println!(
        "## Server engine threads: {WORKERS} workers, the sum store, {} keys per push, {} \
         pushes per worker, then one pull (slowest worker; {} launches each, medians)\n",
        args.threads_keys, args.repeat, args.threads_runs
    );
    println!(
        "| cluster | PS_SERVER_THREADS | push ms | pull ms | keys pushed per second | push, 1 thread / this | sums |"
    );
    println!("|---|---|---|---|---|---|---|");
    for servers in [1usize, 2] {
        let mut one_thread_push = f64::NAN;
        for threads in THREADS {
            let (mut push, mut pull, mut exact) = (Vec::new(), Vec::new(), true);
            for _ in 0..args.threads_runs.max(1) {
                let t = threads.to_string();
                let run = launch_with(
                    servers,
                    WORKERS,
                    "threads",
                    args,
                    &[("PS_SERVER_THREADS", &t)],
                )?;
                let lines: Vec<&String> = run
                    .lines
                    .iter()
                    .filter(|l| l.starts_with("threads"))
                    .collect();
                exact &=
                    lines.len() == WORKERS && lines.iter().all(|l| field(l, "exact") == Some("1"));
                let slowest = |f: &str| {
                    lines
                        .iter()
                        .filter_map(|l| field(l, f).and_then(|v| v.parse::<f64>().ok()))
                        .fold(0.0f64, f64::max)
                };
                push.push(slowest("push_ms"));
                pull.push(slowest("pull_ms"));
            }
            let (p, q) = (median(&mut push), median(&mut pull));
            if threads == 1 {
                one_thread_push = p;
            }
            let rate = (WORKERS * args.repeat * args.threads_keys) as f64 / (p / 1e3);
            let exact = if exact { "yes" } else { "NO" };
            println!(
                "| 1+{servers}+{WORKERS} | {threads} | {p:.1} | {q:.1} | {:.1} M | {:.2} | {exact} |",
                rate / 1e6,
                one_thread_push / p
            );
            results.push(format!(
                "RESULT server_threads {servers}+{WORKERS} threads={threads} push_ms={p:.1} \
                 pull_ms={q:.1} push_speedup={:.2} exact={exact}",
                one_thread_push / p
            ));
        }
    }
    println!();
    Ok(())
}
