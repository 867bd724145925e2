//! Workers push and pull in a loop while servers may be killed and
//! restarted: the fault-tolerance test program.
//!
//! - A server serves the default sum store and says which node it is (and
//!   whether it replaced a dead one).
//! - A worker loops over rounds: each round pushes 1 to a fresh key on every
//!   server and pulls it back. A round whose pull is not exactly 1 is counted
//!   as lost (its server died with the value). Once the worker sees a server
//!   replaced (`is_recovery` in the node table), it finishes after
//!   `KV_RECOVERY_ROUNDS` (default 50) exact rounds in a row. It gives up
//!   with an error after `KV_RECOVERY_MAX_ROUNDS` rounds (default: never).
//!
//! Run it with `PS_RESEND=1` so that requests caught by a server's death are
//! resent to its replacement, and heartbeats so the scheduler notices deaths;
//! under `pslite launch`, `--restart-on-failure server` starts the
//! replacement (see the README):
//!
//! ```sh
//! PS_HEARTBEAT_INTERVAL=1 PS_HEARTBEAT_TIMEOUT=3 PS_RESEND=1 PS_RESEND_TIMEOUT=300 \
//!   pslite launch -s 2 -w 2 --restart-on-failure server -- target/release/examples/kv_recovery
//! ```
//!
//! then `kill -9` one of the servers.

use std::process::ExitCode;

use pslite::{env_or, DefaultHandle, Error, KVOptions, KVServer, KVWorker, Postoffice};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let after = env_or("KV_RECOVERY_ROUNDS", 50u64, "a whole number")?;
    let max_rounds = env_or("KV_RECOVERY_MAX_ROUNDS", u64::MAX, "a whole number")?;
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let _server = if po.is_server() {
        let server = KVServer::<f32>::new(&po, 0)?;
        server.set_request_handle(DefaultHandle::new().into_handle());
        let me = po.my_node()?;
        println!(
            "server node {} serving{}",
            me.id,
            if me.is_recovery { " (recovered)" } else { "" }
        );
        Some(server)
    } else {
        None
    };
    if po.is_worker() {
        worker(&po, after, max_rounds)?;
    }
    po.finalize(0, true)?;
    Ok(())
}

fn worker(po: &Postoffice, after: u64, max_rounds: u64) -> Result<(), Error> {
    let kv = KVWorker::<f32>::new(po, 0, 0)?;
    let rank = po.my_rank()? as u64;
    let workers = po.num_workers() as u64;
    let ranges = po.server_key_ranges();
    let van = po.van()?;
    let mut exact_since_recovery: Option<u64> = None;
    let mut lost = 0;
    for round in 0..max_rounds {
        let keys: Vec<u64> = ranges
            .iter()
            .map(|r| r.begin + round * workers + rank)
            .collect();
        let ones = vec![1.0f32; keys.len()];
        kv.push(&keys, &ones, KVOptions::new())?.wait()?;
        let pulled = kv.pull(&keys, KVOptions::new())?.take()?;
        let exact = pulled.vals[..] == ones[..];
        if !exact {
            lost += 1;
        }
        if round % 200 == 0 {
            println!("worker {rank} round {round}");
        }
        match &mut exact_since_recovery {
            None => {
                let recovered: Vec<_> = van
                    .nodes()
                    .into_iter()
                    .filter(|n| n.is_recovery)
                    .map(|n| n.id)
                    .collect();
                if !recovered.is_empty() {
                    println!("worker {rank} saw node(s) {recovered:?} recover at round {round}");
                    exact_since_recovery = Some(0);
                }
            }
            Some(n) if exact => {
                *n += 1;
                if *n >= after {
                    println!(
                        "worker {rank}: {after} exact rounds after recovery \
                         ({round} rounds, {lost} lost to the restart)"
                    );
                    return Ok(());
                }
            }
            Some(n) => *n = 0,
        }
    }
    Err(Error::App(format!(
        "worker {rank}: no recovery seen in {max_rounds} rounds"
    )))
}
