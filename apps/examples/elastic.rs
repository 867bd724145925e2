//! Elastic workers (`DMLC_NUM_WORKER=MIN:MAX`): workers join and leave
//! between rounds while the servers keep their sums.
//!
//! - A server serves the default sum store.
//! - A worker runs `ELASTIC_EPOCHS` epochs (default 40). Each epoch it
//!   pushes 1 to the key named after the current round number, waits for
//!   the acknowledgement and prints `acked round R epoch E`, then waits at a
//!   barrier of the workers (where waiting workers are admitted) and pauses
//!   `ELASTIC_EPOCH_MS` (default 50). So the server's value of key R is
//!   exactly the number of `acked round R` lines of all workers.
//! - A worker admitted after the first round starts at the epoch the
//!   others are at: after each barrier, the rank-0 worker publishes the next
//!   epoch of every new round in the job's store (`elastic/epoch@R`), and
//!   the newcomer reads the one of the round it joined.
//! - With `ELASTIC_PARK_AFTER=N` a worker stops after its N-th acknowledged
//!   push and says `parked` (for a test to kill it: its pushes are known).
//! - At the end the rank-0 worker pulls every round's key and prints
//!   `round R total T`. Every worker prints each round it sees begin.
//!
//! ```sh
//! PS_HEARTBEAT_INTERVAL=1 PS_HEARTBEAT_TIMEOUT=3 \
//!   pslite launch -s 1 -w 2:4 -- target/release/examples/elastic
//! ```

use std::process::ExitCode;
use std::time::Duration;

use pslite::{
    env_or, DefaultHandle, Error, KVOptions, KVServer, KVWorker, Membership, Postoffice,
    WORKER_GROUP,
};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    po.on_membership_change(|m: &Membership| {
        println!("round {} began with workers {:?}", m.round, m.workers);
    });
    po.start(0, true)?;
    let _server = if po.is_server() {
        let server = KVServer::<f64>::new(&po, 0)?;
        server.set_request_handle(DefaultHandle::new().into_handle());
        println!("server node {} serving", po.my_id()?);
        Some(server)
    } else {
        None
    };
    if po.is_worker() {
        worker(&po)?;
    }
    po.finalize(0, true)?;
    Ok(())
}

fn worker(po: &Postoffice) -> Result<(), Error> {
    let epochs = env_or("ELASTIC_EPOCHS", 40u64, "a whole number")?;
    let pause = Duration::from_millis(env_or("ELASTIC_EPOCH_MS", 50u64, "milliseconds")?);
    let park_after = env_or("ELASTIC_PARK_AFTER", u64::MAX, "a whole number")?;
    let kv = KVWorker::<f64>::new(po, 0, 0)?;
    let store = po.store()?;
    let me = po.my_id()?;
    let joined = po.joined_round().unwrap_or(0);
    let mut epoch = 0;
    if joined > 0 {
        let key = format!("elastic/epoch@{joined}");
        let value = store.get_within(&key, Duration::from_secs(120))?;
        epoch = std::str::from_utf8(&value)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::App(format!("{key} is not an epoch number: {value:?}")))?;
    }
    println!(
        "worker {me} starts at epoch {epoch} in round {joined} as rank {}",
        po.my_rank()?
    );
    // The rank-0 worker tells the newcomers of every round which epoch the
    // others are at (here: after start, and after each barrier).
    let mut published = joined;
    let mut publish = |epoch: u64| -> Result<(), Error> {
        let m = po.membership();
        if m.round > published && m.workers.first() == Some(&me) {
            for r in published + 1..=m.round {
                store.set(&format!("elastic/epoch@{r}"), epoch.to_string())?;
            }
        }
        published = published.max(m.round);
        Ok(())
    };
    publish(epoch)?;
    let mut acked = 0;
    while epoch < epochs {
        let round = po.membership().round;
        kv.push(&[round], &[1.0], KVOptions::new())?.wait()?;
        acked += 1;
        println!("worker {me} acked round {round} epoch {epoch}");
        if acked == park_after {
            println!("worker {me} parked after {acked} acked pushes");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        po.barrier(0, WORKER_GROUP)?;
        epoch += 1;
        publish(epoch)?;
        std::thread::sleep(pause);
    }
    // Every member's pushes are acknowledged (the last barrier): the sums
    // are final.
    let m = po.membership();
    if m.workers.first() == Some(&me) {
        let keys: Vec<u64> = (0..=m.round).collect();
        let totals = kv.pull(&keys, KVOptions::new())?.take()?;
        for (key, total) in totals.keys.iter().zip(totals.vals.iter()) {
            println!("round {key} total {total}");
        }
    }
    println!("worker {me} finished {epochs} epochs ({acked} pushes)");
    Ok(())
}
