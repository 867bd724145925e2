//! ps-lite's `test_kv_app`: servers run the default sum store; each worker
//! pushes the values of its own 10 000 keys 50 times (10 requests in flight),
//! pulls them and checks they are exactly 50 times the pushed values, then
//! runs 50 serialized push-pulls and checks the last one returns exactly 100
//! times. Keys are spread over the whole key space and offset by the worker's
//! rank, so the sums are exact for any number of workers and servers.
//!
//! `KV_APP_KEYS` and `KV_APP_REPEAT` change the sizes; with
//! `KV_APP_WAIT_STDIN=1` a worker prints "ready" and waits for a line on
//! standard input before it starts.

use std::process::ExitCode;

use pslite::{DefaultHandle, Error, KVOptions, KVServer, KVWorker, Key, Postoffice};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn env_usize(var: &'static str, default: usize) -> Result<usize, Error> {
    match std::env::var(var) {
        Ok(v) => v.trim().parse().map_err(|_| {
            pslite::ConfigError::Invalid {
                var,
                value: v,
                expected: "a positive whole number",
            }
            .into()
        }),
        Err(_) => Ok(default),
    }
}

fn run() -> Result<(), Error> {
    let num = env_usize("KV_APP_KEYS", 10_000)?;
    let repeat = env_usize("KV_APP_REPEAT", 50)?;
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let _server = if po.is_server() {
        let server = KVServer::<f32>::new(&po, 0)?;
        server.set_request_handle(DefaultHandle::new().into_handle());
        Some(server)
    } else {
        None
    };
    if po.is_worker() {
        let kv = KVWorker::<f32>::new(&po, 0, 0)?;
        let rank = po.my_rank()?;
        if std::env::var("KV_APP_WAIT_STDIN").is_ok_and(|v| v == "1") {
            // Tests start the work when they are ready (one line on stdin).
            println!("worker rank {rank} ready");
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(|e| Error::Failed(format!("cannot read stdin: {e}")))?;
        }
        check_worker(&kv, rank as u64, num, repeat)?;
        println!("worker rank {rank}: push, pull and push_pull sums exact");
    }
    po.finalize(0, true)?;
    Ok(())
}

/// Deterministic integer-valued floats in 0..1000, so sums stay exact.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 1000) as f32
        })
        .collect()
}

fn check_worker(kv: &KVWorker<f32>, index: u64, num: usize, repeat: usize) -> Result<(), Error> {
    let keys: Vec<Key> = (0..num as u64)
        .map(|i| u64::MAX / num as u64 * i + index)
        .collect();
    let vals = values(index + 7, num);
    // Push `repeat` times with at most 10 requests outstanding.
    let mut ts = Vec::new();
    for i in 0..repeat {
        ts.push(kv.push(&keys, &vals, KVOptions::new())?);
        if i >= 10 {
            kv.wait(ts[i - 10])?;
        }
    }
    for t in ts {
        kv.wait(t)?;
    }
    let pulled = kv.take_pull(kv.pull(&keys, KVOptions::new())?)?;
    compare("pull", &pulled.vals, &vals, repeat as f32)?;
    let mut last = None;
    for _ in 0..repeat {
        last = Some(kv.take_pull(kv.push_pull(&keys, &vals, KVOptions::new())?)?);
    }
    if let Some(last) = last {
        compare("push_pull", &last.vals, &vals, 2.0 * repeat as f32)?;
    }
    Ok(())
}

fn compare(what: &str, got: &[f32], pushed: &[f32], times: f32) -> Result<(), Error> {
    if got.len() != pushed.len() {
        return Err(Error::Failed(format!(
            "{what}: {} values for {} keys",
            got.len(),
            pushed.len()
        )));
    }
    let wrong = got
        .iter()
        .zip(pushed)
        .filter(|&(&g, &p)| g != p * times)
        .count();
    if wrong > 0 {
        let (i, (g, p)) = got
            .iter()
            .zip(pushed)
            .enumerate()
            .find(|(_, (&g, &p))| g != p * times)
            .unwrap_or((0, (&0.0, &0.0)));
        return Err(Error::Failed(format!(
            "{what}: {wrong} of {} values wrong; first at key index {i}: {g} != {p} x {times}",
            got.len()
        )));
    }
    Ok(())
}
