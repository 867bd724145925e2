//! ps-lite's `test_kv_app`: servers run the default sum store; each worker
//! pushes the values of its own 10 000 keys 50 times (10 requests in
//! flight), pulls them and checks they are exactly 50 times the pushed
//! values, then runs 50 serialized push-pulls and checks each returns
//! exactly the running total (see `shared/kv_workload.rs`).
//!
//! `KV_APP_KEYS` and `KV_APP_REPEAT` change the sizes; with
//! `KV_APP_WAIT_STDIN=1` a worker prints "ready" and waits for a line on
//! standard input before it starts; with `KV_APP_SAME_KEYS=1` a worker
//! pushes one key array with fresh values each time instead
//! (`kv_workload::run_same_keys`); with `KV_APP_SERVER_SLEEP_MS` the
//! servers' request handle sleeps that long on its first request (a slow
//! handler, for back-pressure tests).

use std::process::ExitCode;

use pslite::{env_or, Error, KVWorker, Postoffice};

#[path = "shared/kv_workload.rs"]
mod kv_workload;

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let num = env_or("KV_APP_KEYS", 10_000usize, "a positive whole number")?;
    let repeat = env_or("KV_APP_REPEAT", 50usize, "a whole number")?;
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let _server = kv_workload::serve_if_server(&po)?;
    if po.is_worker() {
        let kv = KVWorker::<f32>::new(&po, 0, 0)?;
        let rank = po.my_rank()?;
        if env_or("KV_APP_WAIT_STDIN", 0u8, "0 or 1")? == 1 {
            // Tests start the work when they are ready (one line on stdin).
            println!("worker rank {rank} ready");
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| Error::App(format!("cannot read stdin: {e}")))?;
        }
        if env_or("KV_APP_SAME_KEYS", 0u8, "0 or 1")? == 1 {
            kv_workload::run_same_keys(&kv, rank as u64, num.max(1), repeat)?;
            println!("worker rank {rank}: same keys, fresh values: sums exact");
        } else {
            kv_workload::run(&kv, rank as u64, num.max(1), repeat)?;
            println!("worker rank {rank}: push, pull and push_pull sums exact");
        }
    }
    po.finalize(0, true)?;
    Ok(())
}
