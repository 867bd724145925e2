//! The demo's workers under bounded staleness (`--staleness`,
//! `--slow-worker`): no barriers between epochs; each worker pulls, pushes
//! and ends its iteration with `KVWorker::clock`, the worker of rank
//! `--slow-worker` sleeping `--slow-ms` per iteration; worker 0 evaluates
//! every quarter of its epoch until the threshold is reached, and reports
//! how long that took. The servers hold pulls so that no worker runs more
//! than `--staleness` iterations ahead of the slowest.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pslite::{Error, KVOptions, Postoffice, SArray};
use rand::{Rng, SeedableRng};

use super::args::DemoArgs;
use super::data::unique_keys;
use super::model::{gradient, Metrics};
use super::node::{pull_weights, Traffic, Trainee, MAX_PUSHES_IN_FLIGHT};
use super::report::{Report, Reporter};

/// Trains this worker's shard for `--epochs` passes; worker 0 returns its
/// final evaluation (after every worker's pushes are applied).
pub fn train(
    po: &Postoffice,
    args: &DemoArgs,
    reporter: &mut Reporter,
) -> Result<Option<Metrics>, Error> {
    let Trainee {
        rank,
        shard,
        test,
        kv,
    } = Trainee::new(po, args)?;
    if let Some(bound) = args.staleness {
        kv.set_staleness(bound.0)?;
    }
    let slow = (args.slow_worker == Some(rank)).then(|| Duration::from_millis(args.slow_ms));
    // --jitter-ms: a seeded draw per worker (runs at each s see the same).
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed ^ ((rank as u64 + 1) * 0x9E37));
    let mut traffic = Traffic::default();
    let batches: Vec<_> = shard.chunks(args.batch.max(1)).collect();
    let per_epoch = batches.len().max(1);
    let eval_every = (per_epoch / 4).max(1);
    po.barrier(0, pslite::WORKER_GROUP)?;
    let started = Instant::now();
    let mut epoch_started = started;
    let mut reached: Option<f64> = None;
    let mut pushes = VecDeque::new();
    for it in 0..per_epoch * args.epochs {
        let batch = batches[it % per_epoch];
        let epoch = it / per_epoch + 1;
        if test.is_some() && it % (per_epoch / 20).max(1) == 0 {
            reporter.send(Report::Progress {
                epoch,
                done: it % per_epoch,
                total: per_epoch,
            })?;
        }
        let keys = SArray::from_vec(unique_keys(batch));
        let weights = pull_weights(&kv, &keys, &mut traffic)?;
        let (grad, _loss) = gradient(batch, &keys, &weights);
        traffic.push(keys.len(), grad.len());
        pushes.push_back(kv.zpush(keys, SArray::from_vec(grad), KVOptions::new())?);
        if pushes.len() > MAX_PUSHES_IN_FLIGHT {
            if let Some(ts) = pushes.pop_front() {
                kv.wait(ts)?;
            }
        }
        if let Some(d) = slow {
            // The straggler (simulated: the time a slow machine would take).
            std::thread::sleep(d);
        }
        if args.jitter_ms > 0 {
            // Exponential with mean --jitter-ms (inverse transform).
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            std::thread::sleep(Duration::from_secs_f64(
                -u.ln() * args.jitter_ms as f64 / 1000.0,
            ));
        }
        kv.clock()?;
        let Some(test) = &test else { continue };
        let done = it + 1;
        let epoch_end = done % per_epoch == 0 && epoch < args.epochs;
        if (reached.is_none() && done % eval_every == 0) || epoch_end {
            let m = test.evaluate(&kv, &mut traffic)?;
            if reached.is_none() && m.accuracy >= args.threshold {
                reached = Some(started.elapsed().as_secs_f64());
            }
            if epoch_end {
                reporter.send(Report::Epoch {
                    epoch,
                    loss: m.loss,
                    accuracy: m.accuracy,
                    secs: epoch_started.elapsed().as_secs_f64(),
                })?;
                epoch_started = Instant::now();
            }
        }
    }
    for ts in pushes {
        kv.wait(ts)?;
    }
    // Every worker's pushes applied: the final model.
    po.barrier(0, pslite::WORKER_GROUP)?;
    let mut last = None;
    if let Some(test) = &test {
        let m = test.evaluate(&kv, &mut traffic)?;
        if reached.is_none() && m.accuracy >= args.threshold {
            reached = Some(started.elapsed().as_secs_f64());
        }
        reporter.send(Report::Epoch {
            epoch: args.epochs,
            loss: m.loss,
            accuracy: m.accuracy,
            secs: epoch_started.elapsed().as_secs_f64(),
        })?;
        reporter.send(Report::Staleness {
            time_to_threshold_s: reached,
        })?;
        last = Some(m);
    }
    reporter.send(traffic.report(po, rank, shard.len()))?;
    Ok(last)
}
