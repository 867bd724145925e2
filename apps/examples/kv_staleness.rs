//! Bounded staleness between processes (`PS_STALENESS=s`): servers run the
//! default sum store; each worker, for `STALENESS_ITERS` iterations
//! (default 30), pushes 1 to its own key, pulls every worker's key, checks
//! that every worker has at least `clock - s` pushes applied (no worker is
//! more than `s` iterations behind it: the bound held), and ends the
//! iteration with `KVWorker::clock()`. The worker of rank
//! `STALENESS_SLOW_RANK` sleeps `STALENESS_SLOW_MS` per iteration (a
//! straggler); `STALENESS_SKIP_RANK`'s key is not checked (a worker a test
//! kills). Each worker prints its clock as it goes and the largest gap it
//! saw; each server prints the pulls it held and the largest gap it let
//! through.

use std::process::ExitCode;

use pslite::{env_or, Error, KVOptions, KVWorker, Postoffice};

#[path = "shared/kv_workload.rs"]
#[allow(dead_code)]
mod kv_workload;

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let iters = env_or("STALENESS_ITERS", 30u64, "a whole number")?;
    let slow_rank = env_or("STALENESS_SLOW_RANK", -1i64, "a rank")?;
    let slow_ms = env_or("STALENESS_SLOW_MS", 0u64, "milliseconds")?;
    let skip_rank = env_or("STALENESS_SKIP_RANK", -1i64, "a rank")?;
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let server = kv_workload::serve_if_server(&po)?;
    if po.is_worker() {
        let kv = KVWorker::<f32>::new(&po, 0, 0)?;
        let s = kv.staleness();
        let rank = po.my_rank()? as i64;
        let workers = po.num_workers() as u64;
        // One key per worker, spread over the servers' ranges.
        let key = |w: u64| u64::MAX / workers * w + 3;
        let all: Vec<u64> = (0..workers).map(key).collect();
        let mut max_gap = 0;
        for clock in 0..iters {
            kv.push(&[key(rank as u64)], &[1.0], KVOptions::new())?
                .wait()?;
            let pulled = kv.pull(&all, KVOptions::new())?.take()?;
            for (w, &v) in pulled.vals.iter().enumerate() {
                if w as i64 == skip_rank || w as i64 == rank {
                    continue;
                }
                let gap = clock.saturating_sub(v as u64);
                max_gap = max_gap.max(gap);
                if s.is_some_and(|s| gap > s) {
                    return Err(Error::App(format!(
                        "worker rank {rank} at clock {clock} saw worker {w} with {v} pushes \
                         applied: {gap} iterations behind, more than the bound {s:?}"
                    )));
                }
            }
            if rank == slow_rank {
                // The straggler: a slow machine's extra time per iteration.
                std::thread::sleep(std::time::Duration::from_millis(slow_ms));
            }
            kv.clock()?;
            println!("worker rank {rank} clock {}", clock + 1);
        }
        println!(
            "worker rank {rank}: {iters} iterations, bound {}, largest gap seen {max_gap}",
            s.map_or_else(|| "none".into(), |s| s.to_string())
        );
    }
    po.finalize(0, true)?;
    if server.is_some() {
        let (held, gap) = po.counters_handle().staleness();
        println!("server: held {held} pulls, largest gap let through {gap}");
    }
    drop(server);
    Ok(())
}
