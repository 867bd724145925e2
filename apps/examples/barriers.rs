//! Every node runs barriers over every group it belongs to (1 scheduler,
//! 2 servers, 4 workers and their sums), several rounds. Every node visits
//! the groups in the same order, so each barrier completes.
//!
//! `BARRIER_ROUNDS` sets the number of rounds (default 5). With
//! `BARRIER_WAIT_STDIN=1` a worker prints "ready" once started and waits
//! for a line on standard input before its rounds (tests time the job's
//! last barrier with it).

use std::process::ExitCode;

use pslite::{env_or, ids, Postoffice};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), pslite::Error> {
    let rounds: u32 = env_or("BARRIER_ROUNDS", 5, "a whole number")?;
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    if po.is_worker() && env_or("BARRIER_WAIT_STDIN", 0u8, "0 or 1")? == 1 {
        println!("worker rank {} ready", po.my_rank()?);
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|e| pslite::Error::App(format!("cannot read stdin: {e}")))?;
    }
    let my_group = ids::role_group(po.role());
    let mut count = 0;
    for _ in 0..rounds {
        for group in 1..=ids::ALL_GROUP {
            if group & my_group != 0 {
                po.barrier(0, group)?;
                count += 1;
            }
        }
    }
    println!(
        "{} rank {}: {count} barriers passed",
        po.role(),
        po.my_rank()?
    );
    po.finalize(0, true)?;
    Ok(())
}
