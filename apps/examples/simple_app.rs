//! ps-lite's `test_simple_app`: the scheduler sends 100 requests (head 1,
//! body "test") to every node, itself included; every node checks and counts
//! them and exits non-zero unless it received exactly 100.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pslite::{Error, Postoffice, SimpleApp, ALL_GROUP};

const REQUESTS: usize = 100;

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let app = SimpleApp::new(&po, 0, 0)?;
    let count = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(AtomicUsize::new(0));
    let (c, b) = (Arc::clone(&count), Arc::clone(&bad));
    app.set_request_handle(move |req, app| {
        if req.head != 1 || &req.body[..] != b"test" {
            b.fetch_add(1, Ordering::SeqCst);
        }
        c.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = app.response(req, b"") {
            eprintln!("cannot answer: {e}");
            b.fetch_add(1, Ordering::SeqCst);
        }
    });
    if po.is_scheduler() {
        let requests = (0..REQUESTS)
            .map(|_| app.request(1, b"test", ALL_GROUP))
            .collect::<Result<Vec<_>, _>>()?;
        for request in requests {
            request.wait()?;
        }
    }
    po.finalize(0, true)?;
    let (n, wrong) = (count.load(Ordering::SeqCst), bad.load(Ordering::SeqCst));
    println!("{}: {n} requests received, {wrong} wrong", po.role());
    if n != REQUESTS || wrong != 0 {
        return Err(Error::App(format!(
            "expected {REQUESTS} good requests, got {n} ({wrong} wrong)"
        )));
    }
    Ok(())
}
