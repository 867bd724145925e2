//! Every node starts with a barrier and finalizes with a barrier: the
//! equivalent of ps-lite's `tests/test_connection`.
//!
//! ```text
//! cargo build --release --examples --bins
//! target/release/pslite launch --servers 2 --workers 2 -- target/release/examples/connection
//! ```

use std::process::ExitCode;

use pslite::Postoffice;

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), pslite::Error> {
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let me = po.my_node()?;
    let rank = po.my_rank()?;
    println!(
        "{} rank {rank} (node {}) joined a cluster of {} servers and {} workers",
        me.role,
        me.id,
        po.num_servers(),
        po.num_workers()
    );
    po.finalize(0, true)?;
    println!("{} rank {rank} finalized", me.role);
    Ok(())
}
