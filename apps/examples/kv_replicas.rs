//! Workers push to every key range while servers die: the exactness test
//! program of replicated key ranges (`PS_REPLICAS=k`).
//!
//! - A server serves the sum store as a replicated handle (its ranges can be
//!   copied to a server that replaces a dead one) and says which node it is.
//! - A worker pushes 1 to `KV_KEYS` keys of every range (default 4) for
//!   `KV_ROUNDS` rounds (default 200), waiting for each push, pausing
//!   `KV_ROUND_MS` between rounds (default 10), and says `round N` every 20
//!   rounds, then how long the rounds took (`pushed N rounds in S s,
//!   longest round M ms`: `kv_loss` reads it). Then the workers meet at a barrier and each pulls every key: it
//!   must read exactly rounds x workers, or the program fails.
//!
//! ```sh
//! PS_REPLICAS=2 PS_HEARTBEAT_INTERVAL=1 PS_HEARTBEAT_TIMEOUT=2 \
//!   pslite launch -s 3 -w 2 -- target/release/examples/kv_replicas
//! ```
//!
//! then `kill -9` one of the servers: the job finishes, exact.
//!
//! With `DMLC_NUM_SERVER=MIN:MAX` servers join and leave the running job:
//! a server started later takes the ranges the map gives it, with their
//! state, and SIGTERM makes a server leave (its ranges move to the others
//! first, then it exits 0; the scheduler refuses below MIN).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pslite::{
    env_or, DefaultHandle, Error, KVOptions, KVServer, KVWorker, Postoffice, WORKER_GROUP,
};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let rounds = env_or("KV_ROUNDS", 200u64, "a whole number")?;
    let per_range = env_or("KV_KEYS", 4u64, "a whole number")?;
    let pause = env_or("KV_ROUND_MS", 10u64, "a whole number of milliseconds")?;
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let _server = if po.is_server() {
        let server = KVServer::<f32>::new(&po, 0)?;
        server.set_replicated_handle(DefaultHandle::new());
        let me = po.my_node()?;
        println!(
            "server node {} serving{}",
            me.id,
            if me.is_recovery { " (replacement)" } else { "" }
        );
        let leaving = if po.config().van.min_servers.is_some() {
            Some(leave_on_sigterm(&po, me.id)?)
        } else {
            None
        };
        Some((server, leaving))
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
        let ones = vec![1.0f32; keys.len()];
        let start = Instant::now();
        let mut longest = Duration::ZERO;
        for round in 1..=rounds {
            let began = Instant::now();
            kv.wait(kv.push(&keys, &ones, KVOptions::new())?)?;
            longest = longest.max(began.elapsed());
            if round % 20 == 0 {
                println!("worker {rank} round {round}");
            }
            std::thread::sleep(Duration::from_millis(pause));
        }
        println!(
            "worker {rank} pushed {rounds} rounds in {:.3} s, longest round {} ms",
            start.elapsed().as_secs_f64(),
            longest.as_millis()
        );
        po.barrier(0, WORKER_GROUP)?;
        let pulled = kv.take_pull(kv.pull(&keys, KVOptions::new())?)?;
        let want = (rounds * po.num_workers() as u64) as f32;
        if let Some((key, got)) = keys
            .iter()
            .zip(pulled.vals.iter())
            .find(|(_, &v)| v != want)
        {
            return Err(Error::App(format!(
                "key {key} holds {got}, not {want}: a push was lost or applied twice"
            )));
        }
        println!("worker {rank} exact: {} keys hold {want}", keys.len());
    }
    po.finalize(0, true)?;
    // A server that left: the leave let `finalize` return; its thread says
    // so before the process exits.
    if let Some((_, Some(leaving))) = &_server {
        if leaving.started.load(Ordering::SeqCst) {
            let _ = leaving.done.recv_timeout(Duration::from_secs(60));
        }
    }
    Ok(())
}

/// A leave on SIGTERM: whether it started, and a message once it is done.
struct Leaving {
    started: Arc<AtomicBool>,
    done: mpsc::Receiver<()>,
}

/// SIGTERM makes this server leave the job: the scheduler moves its ranges
/// to the other servers, then lets it go; the barrier `main` waits on ends
/// and the process exits 0. A refused leave (fewer than MIN would stay)
/// exits 1.
fn leave_on_sigterm(po: &Postoffice, id: i32) -> Result<Leaving, Error> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM])
        .map_err(|e| Error::App(format!("cannot handle SIGTERM: {e}")))?;
    let po = po.clone();
    let started = Arc::new(AtomicBool::new(false));
    let (tx, done) = mpsc::channel();
    let flag = Arc::clone(&started);
    std::thread::spawn(move || {
        if signals.forever().next().is_none() {
            return;
        }
        flag.store(true, Ordering::SeqCst);
        println!("server node {id} leaving the job");
        if let Err(e) = po.leave_job(Duration::from_secs(60)) {
            eprintln!("server node {id} cannot leave the job: {e}");
            std::process::exit(1);
        }
        println!("server node {id} left the job");
        let _ = tx.send(());
    });
    Ok(Leaving { started, done })
}
