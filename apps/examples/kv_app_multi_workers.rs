//! ps-lite's `test_kv_app_multi_workers`: each worker process hosts several
//! workers (customers 0, 1, ...; `PSLITE_WORKERS_PER_PROCESS`, default 2),
//! each in its own thread with its own `KVWorker`, doing `kv_app`'s pushes,
//! pull and push-pulls, and really checking the push-pull results.
//!
//! Run it with as many worker processes as `DMLC_NUM_WORKER` / workers per
//! process, e.g. `pslite launch --servers 2 --workers 2 --worker-procs 1`.

use std::process::ExitCode;

use pslite::{DefaultHandle, Error, KVOptions, KVServer, KVWorker, Key, Postoffice};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

const NUM: usize = 10_000;
const REPEAT: usize = 50;

fn run() -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    if !po.is_worker() {
        po.start(0, true)?;
        let _server = if po.is_server() {
            let server = KVServer::<f32>::new(&po, 0)?;
            server.set_request_handle(DefaultHandle::new().into_handle());
            Some(server)
        } else {
            None
        };
        po.finalize(0, true)?;
        return Ok(());
    }
    let per_process: i32 = match std::env::var("PSLITE_WORKERS_PER_PROCESS") {
        Ok(v) => v.trim().parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::from(pslite::ConfigError::Invalid {
                var: "PSLITE_WORKERS_PER_PROCESS",
                value: v.clone(),
                expected: "a positive integer",
            })
        })?,
        Err(_) => 2,
    };
    let threads: Vec<_> = (0..per_process)
        .map(|customer| {
            let po = po.clone();
            std::thread::spawn(move || run_worker(&po, customer))
        })
        .collect();
    let mut result = Ok(());
    for t in threads {
        let r = t
            .join()
            .unwrap_or_else(|_| Err(Error::Failed("a worker thread panicked".into())));
        if result.is_ok() {
            result = r;
        }
    }
    result
}

fn run_worker(po: &Postoffice, customer: i32) -> Result<(), Error> {
    po.start(customer, true)?;
    let kv = KVWorker::<f32>::new(po, 0, customer)?;
    // Customers of one process share its id; rank + customer is unique.
    let index = (po.my_rank()? + customer) as u64;
    let keys: Vec<Key> = (0..NUM as u64)
        .map(|i| u64::MAX / NUM as u64 * i + index)
        .collect();
    let vals: Vec<f32> = (0..NUM)
        .map(|i| ((i as u64 * 7 + index * 13) % 1000) as f32)
        .collect();
    let mut ts = Vec::new();
    for i in 0..REPEAT {
        ts.push(kv.push(&keys, &vals, KVOptions::new())?);
        if i >= 10 {
            kv.wait(ts[i - 10])?;
        }
    }
    for t in ts {
        kv.wait(t)?;
    }
    let pulled = kv.take_pull(kv.pull(&keys, KVOptions::new())?)?;
    check("pull", &pulled.vals, &vals, REPEAT as f32)?;
    for round in 1..=REPEAT {
        let out = kv.take_pull(kv.push_pull(&keys, &vals, KVOptions::new())?)?;
        check("push_pull", &out.vals, &vals, (REPEAT + round) as f32)?;
    }
    println!("worker index {index} (customer {customer}): push, pull and every push_pull exact");
    po.finalize(customer, true)?;
    Ok(())
}

fn check(what: &str, got: &[f32], pushed: &[f32], times: f32) -> Result<(), Error> {
    let wrong = got
        .iter()
        .zip(pushed)
        .filter(|&(&g, &p)| g != p * times)
        .count();
    if wrong > 0 || got.len() != pushed.len() {
        return Err(Error::Failed(format!(
            "{what}: {wrong} of {} values differ from {times} x pushed",
            pushed.len()
        )));
    }
    Ok(())
}
