//! Requests a server cannot take are refused at once, never dropped: a
//! worker sends the servers (float32 sum stores, app 0) a push of float64
//! values, a push of 1 value per key for keys that hold 2, and a pull for
//! app 1, which no server has; each wait fails within about a round trip
//! (the app, after `PS_APP_WAIT`) with the refusal, and the store is
//! unchanged. Run it with `pslite launch -s 2 -w 1 -- refusals` (the
//! process test sets `PS_APP_WAIT=300`).

use std::time::{Duration, Instant};

use pslite::{
    env_or, DefaultHandle, Error, Failure, KVOptions, KVServer, KVWorker, Postoffice, Refusal,
};

fn main() -> std::process::ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

/// The refusal a request failed with, and how long its wait took.
fn refusal_of(result: Result<(), Error>, started: Instant) -> Result<(Refusal, Duration), Error> {
    match result {
        Err(Error::RequestFailed {
            cause: Failure::Refused { refusal, .. },
            ..
        }) => Ok((refusal, started.elapsed())),
        Err(e) => Err(Error::App(format!("expected a refusal, got: {e}"))),
        Ok(()) => Err(Error::App(
            "expected a refusal, the request succeeded".into(),
        )),
    }
}

fn run() -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let limit = Duration::from_secs(env_or("REFUSALS_LIMIT_SECS", 30, "seconds")?);
    if po.is_server() {
        let server = KVServer::<f32>::new(&po, 0)?;
        server.set_request_handle(DefaultHandle::new().into_handle());
        po.finalize(0, true)?;
        return Ok(());
    }
    if !po.is_worker() {
        po.finalize(0, true)?;
        return Ok(());
    }
    // Keys on both servers, 2 values each.
    let keys = [1u64, u64::MAX - 1];
    let f32s = KVWorker::<f32>::new(&po, 0, 0)?;
    f32s.push(&keys, &[1.0, 2.0, 3.0, 4.0], KVOptions::new())?
        .wait_timeout(limit)?;

    let f64s = KVWorker::<f64>::new(&po, 0, 1)?;
    let t = Instant::now();
    let push = f64s.push(&keys, &[1.0; 4], KVOptions::new())?;
    let (refusal, took) = refusal_of(push.wait_timeout(limit), t)?;
    println!("float64 push: refused in {took:?}: {refusal}");
    if !matches!(
        refusal,
        Refusal::DataType {
            held: pslite::DataType::Float,
            sent: pslite::DataType::Double,
            ..
        }
    ) {
        return Err(Error::App(format!("wrong refusal: {refusal:?}")));
    }

    let t = Instant::now();
    let push = f32s.push(&keys, &[5.0, 6.0], KVOptions::new())?;
    let (refusal, took) = refusal_of(push.wait_timeout(limit), t)?;
    println!("1 value per key for keys of 2: refused in {took:?}: {refusal}");
    if !matches!(
        refusal,
        Refusal::Lengths {
            held: 2,
            sent: 1,
            ..
        }
    ) {
        return Err(Error::App(format!("wrong refusal: {refusal:?}")));
    }

    let other_app = KVWorker::<f32>::new(&po, 1, 2)?;
    let t = Instant::now();
    let pull = other_app.pull(&keys, KVOptions::new())?;
    let (refusal, took) = refusal_of(pull.wait_timeout(limit), t)?;
    println!("pull for app 1: refused in {took:?}: {refusal}");
    if !matches!(refusal, Refusal::NoApp { app: 1, .. }) {
        return Err(Error::App(format!("wrong refusal: {refusal:?}")));
    }

    // Nothing of the refused pushes was applied.
    let pulled = f32s.pull(&keys, KVOptions::new())?.take_timeout(limit)?;
    if pulled.vals[..] != [1.0, 2.0, 3.0, 4.0] {
        return Err(Error::App(format!(
            "the store changed: {:?}",
            &pulled.vals[..]
        )));
    }
    println!("PASS refusals");
    po.finalize(0, true)?;
    Ok(())
}
