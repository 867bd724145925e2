//! A store watcher, for tests and for trying the store by hand: every
//! server and worker watches KEY (first argument), prints
//! `node ID watching KEY` once the watch is in place, then one line per
//! change: `event VERSION VALUE` or `event VERSION deleted`. With COUNT
//! (second argument) a node finalizes after COUNT events; without, it runs
//! until it is killed. The scheduler only hosts the store.
//!
//! `pslite launch -s 1 -w 2 -- store_watch epoch 3`, then
//! `pslite store --port PORT set epoch 1` three times.

use std::process::ExitCode;

use pslite::{Error, Postoffice};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let key = args
        .next()
        .ok_or_else(|| Error::App("usage: store_watch KEY [COUNT]".into()))?;
    let count: Option<u64> = match args.next() {
        None => None,
        Some(a) => Some(
            a.parse()
                .map_err(|_| Error::App(format!("COUNT must be an integer, got {a:?}")))?,
        ),
    };
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    if !po.is_scheduler() {
        let watch = po.store()?.watch(&key)?;
        println!("node {} watching {key}", po.my_node()?.id);
        let mut seen = 0;
        for event in watch {
            match event.value {
                Some(v) => println!("event {} {}", event.version, String::from_utf8_lossy(&v)),
                None => println!("event {} deleted", event.version),
            }
            seen += 1;
            if count == Some(seen) {
                break;
            }
        }
    } else if count.is_none() {
        // Host the store until killed.
        loop {
            std::thread::park();
        }
    }
    po.finalize(0, true)?;
    Ok(())
}
