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
//! (`kv_workload::run_same_keys`). With `KV_APP_UNANSWERED=N` a server
//! never answers the Nth request it gets: the worker waits for it, and
//! logs which server owes the answer after `PS_REQUEST_WARN` seconds (the
//! test of that warning uses it). With `KV_APP_SERVER_SLEEP_MS` the
//! servers' request handle sleeps that long on its first request (a slow
//! handler, for back-pressure tests). With `KV_APP_COMPRESSION=SPEC` (e.g.
//! `onebit`) workers ask for compressed pushes: against pslite servers the
//! sums are then no longer exact; against C++ servers, which cannot read
//! compressed values, they are (the worker logs that it sends them as
//! they are). With `KV_APP_PRIORITY` the workers' requests carry that
//! priority (non-zero: large ones go in parts).

use std::process::ExitCode;

use pslite::{env_or, DefaultHandle, Error, KVServer, KVWorker, Postoffice};

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
    let unanswered = env_or("KV_APP_UNANSWERED", 0usize, "a whole number")?;
    let _server = if po.is_server() && unanswered > 0 {
        Some(serve_leaving_unanswered(&po, unanswered)?)
    } else {
        kv_workload::serve_if_server(&po)?
    };
    if po.is_worker() {
        let kv = KVWorker::<f32>::new(&po, 0, 0)?;
        if let Ok(spec) = std::env::var("KV_APP_COMPRESSION") {
            let compression = pslite::parse_compression(&spec)
                .map_err(|e| Error::App(format!("KV_APP_COMPRESSION: {e}")))?;
            kv.set_compression(compression)?;
        }
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

/// The default store, except that request number `unanswered` (from 1)
/// gets no answer at all.
fn serve_leaving_unanswered(po: &Postoffice, unanswered: usize) -> Result<KVServer<f32>, Error> {
    let server = KVServer::<f32>::new(po, 0)?;
    let store = DefaultHandle::new();
    let mut seen = 0;
    server.set_request_handle(move |meta, req, server| {
        seen += 1;
        if seen == unanswered {
            println!(
                "server: leaving request {} of node {} unanswered",
                meta.timestamp, meta.sender
            );
            return;
        }
        let res = store.apply(meta, &req);
        if let Err(e) = server.answer(meta, res) {
            eprintln!("cannot answer node {}: {e}", meta.sender);
        }
    });
    Ok(server)
}
