//! ps-lite's `test_kv_app_multi_workers`: each worker process hosts several
//! workers (customers 0, 1, ...; `PSLITE_WORKERS_PER_PROCESS`, default 2),
//! each in its own thread with its own `KVWorker`, doing `kv_app`'s pushes,
//! pull and push-pulls (`shared/kv_workload.rs`), and really checking every
//! push-pull result (the C++ test never accumulates that check).
//!
//! Run it with as many worker processes as `DMLC_NUM_WORKER` / workers per
//! process, e.g. `pslite launch --servers 2 --workers 2 --worker-procs 1`.

use std::process::ExitCode;

use pslite::{env_or, Error, KVWorker, Postoffice};

#[path = "shared/kv_workload.rs"]
mod kv_workload;

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
        let _server = kv_workload::serve_if_server(&po)?;
        po.finalize(0, true)?;
        return Ok(());
    }
    let per_process: i32 = env_or("PSLITE_WORKERS_PER_PROCESS", 2, "a positive integer")?;
    if per_process < 1 {
        return Err(pslite::ConfigError::Invalid {
            var: "PSLITE_WORKERS_PER_PROCESS",
            value: per_process.to_string(),
            expected: "a positive integer",
        }
        .into());
    }
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
            .unwrap_or_else(|_| Err(Error::App("a worker thread panicked".into())));
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
    kv_workload::run(&kv, index, NUM, REPEAT)?;
    println!("worker index {index} (customer {customer}): push, pull and every push_pull exact");
    po.finalize(customer, true)?;
    Ok(())
}
