//! The store under contention: every worker adds 1 to one key ADDS times
//! (first argument, default 500), announces it is done, waits until every
//! worker is, and checks that the key holds exactly workers x ADDS.
//!
//! `pslite launch -s 1 -w 8 -- store_counter 500`

use std::process::ExitCode;
use std::time::Duration;

use pslite::{Error, Postoffice};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let adds: i64 = match std::env::args().nth(1) {
        None => 500,
        Some(a) => a
            .parse()
            .map_err(|_| Error::App(format!("ADDS must be an integer, got {a:?}")))?,
    };
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    if po.is_worker() {
        let store = po.store()?.with_timeout(Duration::from_secs(60));
        let rank = po.my_rank()?;
        let workers = po.config().van.num_workers;
        let mut last = 0;
        for _ in 0..adds {
            let now = store.add("count", 1)?;
            if now <= last {
                return Err(Error::App(format!("add went from {last} to {now}")));
            }
            last = now;
        }
        store.set(&format!("done/{rank}"), "1")?;
        let keys: Vec<String> = (0..workers).map(|r| format!("done/{r}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        store.wait(&keys)?;
        let total = store.get("count")?;
        let expected = adds * workers as i64;
        println!(
            "worker {rank}: count = {} (expected {expected})",
            String::from_utf8_lossy(&total)
        );
        if total != expected.to_string().as_bytes() {
            return Err(Error::App(format!(
                "count is {:?}, expected {expected}",
                String::from_utf8_lossy(&total)
            )));
        }
    }
    po.finalize(0, true)?;
    Ok(())
}
