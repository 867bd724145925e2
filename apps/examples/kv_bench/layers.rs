//! The `layers` mode: a layer-wise training step, as P3 and ByteScheduler
//! measure priority scheduling. A model of [`LAYERS`] layers (one key
//! each, `--keys` values in all, split evenly) has its gradients pushed
//! back to front, as back-propagation makes them, each with a push-pull
//! whose answer is the layer's new value (the server echoes what it got, as
//! a server that sums one worker's gradient would); the next step's forward
//! pass needs them front to back. Each step is timed twice, one after the
//! other in one cluster: every request at priority 0 (first come, first
//! served: the first layer's answer comes last) and with P3's priorities
//! (layer `l` at `-l`: the first layer highest). The worker prints, per
//! step and order, when the first layer's answer arrived and when the last
//! did:
//!
//! ```text
//! BENCH layers order=fifo first_ms=.. step_ms=..
//! BENCH layers order=priority first_ms=.. step_ms=..
//! ```

use std::time::Instant;

use pslite::{Error, KVMeta, KVOptions, KVPairs, KVServer, KVWorker, Postoffice, SArray};

use crate::node::{millis, spread_keys};
use crate::Args;

/// Layers of the model.
pub(crate) const LAYERS: usize = 10;

/// A server that answers a push-pull with the values it got (no copy).
pub(crate) fn echo_server(po: &Postoffice) -> Result<KVServer<f32>, Error> {
    let server = KVServer::<f32>::new(po, 0)?;
    server.set_request_handle(|meta: &KVMeta, req: KVPairs<f32>, server: &KVServer<f32>| {
        let res = if meta.pull { req } else { KVPairs::default() };
        if let Err(e) = server.response(meta, res) {
            eprintln!("cannot answer: {e}");
        }
    });
    Ok(server)
}

/// `--repeat` steps, each once first come first served and once with
/// priorities (alternating which goes first).
pub(crate) fn layers(po: &Postoffice, kv: &KVWorker<f32>, args: &Args) -> Result<(), Error> {
    let per_layer = (args.keys / LAYERS).max(1);
    // One key per layer, spread over the key space (layers over servers).
    let keys: Vec<SArray<u64>> = spread_keys(LAYERS)
        .iter()
        .map(|&k| SArray::from_vec(vec![k]))
        .collect();
    // A warm-up step: connections up, buffers touched.
    step(kv, &keys, per_layer, false, 0)?;
    po.barrier(0, pslite::WORKER_GROUP)?;
    for round in 0..args.repeat {
        let orders = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for prioritised in orders {
            po.barrier(0, pslite::WORKER_GROUP)?;
            let (first, all) = step(kv, &keys, per_layer, prioritised, round + 1)?;
            println!(
                "BENCH layers order={} first_ms={first:.3} step_ms={all:.3}",
                if prioritised { "priority" } else { "fifo" }
            );
        }
    }
    Ok(())
}

/// One step: every layer's push-pull, last layer first; returns when the
/// first layer's answer and the last answer arrived (ms).
fn step(
    kv: &KVWorker<f32>,
    keys: &[SArray<u64>],
    per_layer: usize,
    prioritised: bool,
    round: usize,
) -> Result<(f64, f64), Error> {
    // Gradients made before the clock starts (fresh values every step).
    let grads: Vec<SArray<f32>> = (0..keys.len())
        .map(|l| SArray::from_vec(vec![(round * 100 + l) as f32; per_layer]))
        .collect();
    let t = Instant::now();
    let mut requests = Vec::with_capacity(keys.len());
    for l in (0..keys.len()).rev() {
        let priority = if prioritised { -(l as i32) } else { 0 };
        requests.push((
            l,
            kv.zpush_pull(
                keys[l].clone(),
                grads[l].clone(),
                KVOptions::new().priority(priority),
            )?,
        ));
    }
    // The forward pass: layer 0 first.
    requests.reverse();
    let mut first = 0.0;
    for (l, request) in requests {
        let got = request.take()?;
        if got.vals.len() != per_layer || got.vals.first() != grads[l].first() {
            return Err(Error::App(format!(
                "layer {l}: got {} values, expected {per_layer} of {:?}",
                got.vals.len(),
                grads[l].first()
            )));
        }
        if l == 0 {
            first = millis(t.elapsed());
        }
    }
    Ok((first, millis(t.elapsed())))
}
