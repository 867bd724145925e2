//! The workload of ps-lite's `test_kv_app`, shared by `kv_app` and
//! `kv_app_multi_workers`; included by them, not an example.
//!
//! A worker with a unique `index` pushes the values of its own keys
//! `repeat` times (at most 10 requests in flight), pulls them and checks
//! they are exactly `repeat` times the pushed values, then runs `repeat`
//! serialized push-pulls and checks each returns exactly the running total.
//! Keys are spread over the whole key space and offset by the index, so
//! workers never share a key and the sums are exact for any cluster size;
//! values are small integers, which `f32` adds exactly.

use std::collections::VecDeque;

use pslite::{DefaultHandle, Error, KVOptions, KVServer, KVWorker, Key, Postoffice, SArray};

/// On a server, the default sum store (app 0), on `PS_SERVER_THREADS`
/// engine threads; elsewhere nothing. Keep the result alive until finalize.
/// With `KV_APP_SERVER_SLEEP_MS`, the handle sleeps that long on its first
/// request (a slow handler, on one thread: requests pile up behind it).
pub fn serve_if_server(po: &Postoffice) -> Result<Option<KVServer<f32>>, Error> {
    if !po.is_server() {
        return Ok(None);
    }
    let server = KVServer::<f32>::new(po, 0)?;
    let sleep_ms = pslite::env_or("KV_APP_SERVER_SLEEP_MS", 0u64, "a whole number")?;
    if sleep_ms == 0 {
        server.set_concurrent_handle(DefaultHandle::new());
        return Ok(Some(server));
    }
    let handle = DefaultHandle::new().into_handle();
    let mut slept = false;
    server.set_request_handle(move |meta, req, server| {
        if !std::mem::replace(&mut slept, true) {
            println!("server: the request handle sleeps {sleep_ms} ms");
            std::thread::sleep(std::time::Duration::from_millis(sleep_ms));
        }
        handle(meta, req, server)
    });
    Ok(Some(server))
}

/// Runs the workload as worker `index` with `num` keys.
pub fn run(kv: &KVWorker<f32>, index: u64, num: usize, repeat: usize) -> Result<(), Error> {
    let keys: Vec<Key> = (0..num as u64)
        .map(|i| u64::MAX / num as u64 * i + index)
        .collect();
    let vals = values(index + 7, num);
    // With KV_APP_PRIORITY (non-zero), requests carry that priority, so
    // that large ones go in parts (PS_PARTITION_BYTES).
    let priority = pslite::env_or("KV_APP_PRIORITY", 0i32, "a whole number")?;
    let opts = || KVOptions::new().priority(priority);
    let mut in_flight = VecDeque::new();
    for _ in 0..repeat {
        in_flight.push_back(kv.push(&keys, &vals, opts())?);
        if in_flight.len() > 10 {
            if let Some(oldest) = in_flight.pop_front() {
                oldest.wait()?;
            }
        }
    }
    for push in in_flight {
        push.wait()?;
    }
    let pulled = kv.pull(&keys, opts())?.take()?;
    compare("pull", &pulled.vals, &vals, repeat as f32)?;
    for round in 1..=repeat {
        let out = kv.push_pull(&keys, &vals, opts())?.take()?;
        compare("push_pull", &out.vals, &vals, (repeat + round) as f32)?;
    }
    Ok(())
}

/// As a training loop pushes: one key array (the same `SArray` every
/// time) with a fresh value array per push, `values * round` in round
/// 1..=`repeat` (at most 10 in flight), then a pull that must return
/// exactly `values * repeat (repeat + 1) / 2`. Sent through shared memory,
/// the keys are copied once and the values every time.
#[allow(dead_code)]
pub fn run_same_keys(
    kv: &KVWorker<f32>,
    index: u64,
    num: usize,
    repeat: usize,
) -> Result<(), Error> {
    let keys: SArray<Key> = SArray::from_vec(
        (0..num as u64)
            .map(|i| u64::MAX / num as u64 * i + index)
            .collect(),
    );
    let vals = values(index + 7, num);
    let mut in_flight = VecDeque::new();
    for round in 1..=repeat {
        let fresh = SArray::from_vec(vals.iter().map(|v| v * round as f32).collect());
        in_flight.push_back(kv.zpush(keys.clone(), fresh, KVOptions::new())?);
        if in_flight.len() > 10 {
            if let Some(oldest) = in_flight.pop_front() {
                oldest.wait()?;
            }
        }
    }
    for push in in_flight {
        push.wait()?;
    }
    let pulled = kv.zpull(keys.clone(), KVOptions::new())?.take()?;
    let times = (repeat * (repeat + 1) / 2) as f32;
    compare("pull of fresh values", &pulled.vals, &vals, times)
}

/// Deterministic integer-valued floats in 0..1000.
fn values(seed: u64, n: usize) -> Vec<f32> {
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

fn compare(what: &str, got: &[f32], pushed: &[f32], times: f32) -> Result<(), Error> {
    if got.len() != pushed.len() {
        return Err(Error::App(format!(
            "{what}: {} values for {} keys",
            got.len(),
            pushed.len()
        )));
    }
    let mut wrong = got
        .iter()
        .zip(pushed)
        .enumerate()
        .filter(|(_, (&g, &p))| g != p * times);
    if let Some((i, (g, p))) = wrong.next() {
        return Err(Error::App(format!(
            "{what}: {} of {} values wrong; first at key index {i}: {g} != {p} x {times}",
            wrong.count() + 1,
            got.len()
        )));
    }
    Ok(())
}
