//! Checkpoints end to end: the test program of `PS_CHECKPOINT_DIR`.
//!
//! - A server serves the sum store as a replicated handle (its state can be
//!   copied into a checkpoint and restored from one) and says which node it
//!   is once serving.
//! - A worker first pulls every key (`KV_KEYS` keys of every key range,
//!   default 4): each must hold exactly `KV_START` (default 0: a fresh job;
//!   a resumed job restored the checkpointed sums), or the program fails. It
//!   prints `worker R resumed at X`. After a barrier it pushes 1 to every key for
//!   `KV_ROUNDS` rounds (default 50), waiting for each push, and the workers
//!   meet at a barrier and pull again: every key must hold exactly
//!   `KV_START + rounds x workers`; it prints `worker R exact: ... hold X`.
//! - With `KV_IDLE=1` the workers then meet at barriers over the workers
//!   every 20 ms, with nothing in flight, until killed: a checkpoint asked
//!   for with `pslite checkpoint` (or `PS_CHECKPOINT_INTERVAL`) is taken at
//!   one of them. Otherwise the job finishes.
//!
//! ```sh
//! PS_CHECKPOINT_DIR=/tmp/ck KV_IDLE=1 pslite launch -s 2 -w 2 -- target/release/examples/kv_checkpoint &
//! pslite checkpoint --port 9091; kill %1
//! PS_CHECKPOINT_DIR=/tmp/ck KV_START=100 pslite launch -s 2 -w 2 -- target/release/examples/kv_checkpoint
//! ```

use std::process::ExitCode;
use std::time::Duration;

use pslite::{
    env_or, DefaultHandle, Error, KVOptions, KVServer, KVWorker, Postoffice, WORKER_GROUP,
};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let start = env_or("KV_START", 0u64, "a whole number")?;
    let rounds = env_or("KV_ROUNDS", 50u64, "a whole number")?;
    let per_range = env_or("KV_KEYS", 4u64, "a whole number")?;
    let idle = env_or("KV_IDLE", 0u64, "0 or 1")? == 1;
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let _server = if po.is_server() {
        let server = KVServer::<f32>::new(&po, 0)?;
        server.set_replicated_handle(DefaultHandle::new());
        println!("server node {} serving", po.my_node()?.id);
        Some(server)
    } else {
        None
    };
    if po.is_worker() {
        let kv = KVWorker::<f32>::new(&po, 0, 0)?;
        let rank = po.my_rank()?;
        let keys: Vec<u64> = po
            .server_key_ranges()
            .iter()
            .flat_map(|r| (0..per_range).map(move |i| r.begin + i))
            .collect();
        let check = |want: f64| -> Result<(), Error> {
            let pulled = kv.take_pull(kv.pull(&keys, KVOptions::new())?)?;
            if pulled.vals.len() != keys.len() {
                return Err(Error::App(format!(
                    "pulled {} values for {} keys",
                    pulled.vals.len(),
                    keys.len()
                )));
            }
            match keys
                .iter()
                .zip(pulled.vals.iter())
                .find(|(_, &v)| v as f64 != want)
            {
                Some((key, got)) => Err(Error::App(format!(
                    "key {key} holds {got}, not {want}: a push was lost or applied twice, or \
                     the checkpoint was not restored exactly"
                ))),
                None => Ok(()),
            }
        };
        check(start as f64)?;
        println!("worker {rank} resumed at {start}");
        // Nobody pushes before everyone has read the starting values.
        po.barrier(0, WORKER_GROUP)?;
        let ones = vec![1.0f32; keys.len()];
        for _ in 0..rounds {
            kv.wait(kv.push(&keys, &ones, KVOptions::new())?)?;
        }
        po.barrier(0, WORKER_GROUP)?;
        let want = start + rounds * po.num_workers() as u64;
        check(want as f64)?;
        println!("worker {rank} exact: {} keys hold {want}", keys.len());
        po.barrier(0, WORKER_GROUP)?;
        if idle {
            println!("worker {rank} idle");
            loop {
                po.barrier(0, WORKER_GROUP)?;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    po.finalize(0, true)?;
    Ok(())
}
