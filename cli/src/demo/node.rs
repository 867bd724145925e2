//! The nodes of the demo's cluster: `pslite demo --node`.
//!
//! Workers pull the weights of each minibatch's keys, push gradients and
//! (rank 0) evaluate the held-out split after each epoch between two
//! barriers; servers apply pushes to their [`Store`] in the request handle.
//! With elastic workers the same epochs are counted in barriers, and every
//! round re-shards the data (see [`train_elastic`]). Each node sends its
//! [`Report`]s to the launching process, or prints them.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use log::{info, warn};
use pslite::{
    Call, Done, Error, KVMeta, KVOptions, KVPairs, KVServer, KVWorker, Postoffice, SArray,
};
use pslite_proto::{lock, Role};

use super::args::DemoArgs;
use super::data::{unique_keys, Sample};
use super::model::{evaluate, gradient, Metrics, Store};
use super::report::{Report, Reporter};

/// Pushes a worker may have in flight before it waits for the oldest.
pub(super) const MAX_PUSHES_IN_FLIGHT: usize = 8;

pub fn run_node(args: &DemoArgs) -> Result<(), Error> {
    args.check()?;
    let mut reporter = match &args.report {
        Some(addr) => Reporter::Launcher(
            TcpStream::connect(addr.as_str())
                .map_err(|e| Error::App(format!("cannot reach `pslite demo` at {addr}: {e}")))?,
        ),
        None => Reporter::Print {
            epochs: args.epochs,
        },
    };
    let po = Postoffice::from_env()?;
    let last = run_node_on(&po, args, &mut reporter)?;
    // Without a launching process to judge, worker 0 does.
    if let (Reporter::Print { .. }, Some(m)) = (&reporter, last) {
        if m.accuracy < args.threshold {
            return Err(Error::App(format!(
                "test accuracy {:.4} is below the threshold {}",
                m.accuracy, args.threshold
            )));
        }
    }
    Ok(())
}

/// Runs this node's part until the cluster finalizes. Worker 0 returns its
/// last evaluation.
fn run_node_on(
    po: &Postoffice,
    args: &DemoArgs,
    reporter: &mut Reporter,
) -> Result<Option<Metrics>, Error> {
    po.start(0, true)?;
    match po.role() {
        Role::Server => {
            serve(po, args, reporter)?;
            Ok(None)
        }
        Role::Worker => {
            let watch = (args.replicas >= 2 && !po.is_elastic() && po.my_rank()? == 0)
                .then(|| RangeWatch::start(po, "worker 0", reporter))
                .transpose()?;
            let last = if po.is_elastic() {
                train_elastic(po, args, reporter)?
            } else if args.staleness_mode() {
                super::ssp::train(po, args, reporter)?
            } else {
                train(po, args, reporter)?
            };
            po.finalize(0, true)?;
            drop(watch);
            Ok(last)
        }
        Role::Scheduler => {
            let watch = (args.replicas >= 2)
                .then(|| RangeWatch::start(po, "scheduler", reporter))
                .transpose()?;
            po.finalize(0, true)?;
            drop(watch);
            Ok(None)
        }
    }
}

/// Reports each change of the range map (`--replicas`) this node sees, from
/// a thread that looks every [`RangeWatch::EVERY`], until dropped.
struct RangeWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RangeWatch {
    const EVERY: Duration = Duration::from_millis(2);

    fn start(po: &Postoffice, seen_by: &str, reporter: &Reporter) -> Result<RangeWatch, Error> {
        let van = po.van()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut reporter = reporter.for_thread();
        let seen_by = seen_by.to_string();
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut version = 0;
            while !stopped.load(Ordering::Relaxed) {
                if let Some(map) = van.range_map().filter(|m| m.version > version) {
                    version = map.version;
                    let at_ms = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let report = Report::Ranges {
                        seen_by: seen_by.clone(),
                        version,
                        at_ms,
                        replicas: map.ranges.iter().map(|r| r.replicas.clone()).collect(),
                    };
                    if let Some(reporter) = &mut reporter {
                        if reporter.send(report).is_err() {
                            return;
                        }
                    }
                }
                std::thread::sleep(Self::EVERY);
            }
        });
        Ok(RangeWatch {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for RangeWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a server's handle counts.
#[derive(Default)]
struct ServerCounts {
    pushes: u64,
    pulls: u64,
}

/// Answers one request with `store`: applies a push, reads a pull.
fn answer(store: &mut Store, meta: &KVMeta, req: &KVPairs<f32>) -> Result<KVPairs<f32>, String> {
    if meta.push {
        if req.vals.len() != req.keys.len() {
            return Err(format!(
                "a push of {} values for {} keys (expected one gradient per key)",
                req.vals.len(),
                req.keys.len()
            ));
        }
        store.push(&req.keys, &req.vals);
    }
    if meta.pull {
        Ok(KVPairs::new(req.keys.clone(), store.pull(&req.keys)))
    } else {
        Ok(KVPairs::default())
    }
}

/// A server: applies pushes to its store and answers pulls until the
/// cluster finalizes, then reports.
fn serve(po: &Postoffice, args: &DemoArgs, reporter: &mut Reporter) -> Result<(), Error> {
    let rank = po.my_rank()? as usize;
    let store = Arc::new(Mutex::new(Store::new(args.optimizer, args.learning_rate())));
    let counts = Arc::new(Mutex::new(ServerCounts::default()));
    let server = KVServer::<f32>::new(po, 0)?;
    {
        let copied = Arc::clone(&store);
        let counts = Arc::clone(&counts);
        let handle = move |meta: &KVMeta, req: KVPairs<f32>, server: &KVServer<f32>| {
            let res = match answer(&mut lock(&copied), meta, &req) {
                Ok(res) => res,
                Err(e) => {
                    warn!("node {}: {e}", meta.sender);
                    KVPairs::default()
                }
            };
            {
                let mut c = lock(&counts);
                c.pushes += u64::from(meta.push);
                c.pulls += u64::from(meta.pull);
            }
            if let Err(e) = server.response(meta, res) {
                warn!("cannot answer node {}: {e}", meta.sender);
            }
        };
        if args.checkpoint_dir.is_some() {
            // Checkpoints copy the store by key range.
            server.set_replicated_handle(Copyable {
                store: Arc::clone(&store),
                handle,
            });
        } else {
            server.set_request_handle(handle);
        }
    }
    po.finalize(0, true)?;
    drop(server);
    let keys = lock(&store).len();
    let c = lock(&counts);
    let (stale_held, stale_max_gap) = po.counters_handle().staleness();
    reporter.send(Report::Server {
        rank,
        keys,
        pushes: c.pushes,
        pulls: c.pulls,
        stale_held,
        stale_max_gap,
    })
}

/// How long worker 0 waits for a checkpoint to be accepted, and written.
const CHECKPOINT_WAIT: Duration = Duration::from_secs(60);

/// The label of the checkpoint written after epoch `epoch` (`pslite demo
/// --resume` reads the epoch back with [`label_epoch`]).
pub fn epoch_label(epoch: usize) -> String {
    format!("demo epoch {epoch}")
}

/// The epoch of a checkpoint labelled by [`epoch_label`].
pub fn label_epoch(label: &str) -> Option<usize> {
    label.strip_prefix("demo epoch ")?.parse().ok()
}

/// A server's request handle whose store can be copied by key range
/// (written to checkpoints, restored from them).
struct Copyable<F> {
    store: Arc<Mutex<Store>>,
    handle: F,
}

impl<F> pslite::ReplicatedHandle<f32> for Copyable<F>
where
    F: FnMut(&KVMeta, KVPairs<f32>, &KVServer<f32>) + Send + 'static,
{
    fn handle(&mut self, meta: &KVMeta, req: KVPairs<f32>, server: &KVServer<f32>) {
        (self.handle)(meta, req, server)
    }

    fn snapshot(&self, begin: u64, end: u64) -> Vec<u8> {
        lock(&self.store).snapshot(begin, end)
    }

    fn restore(&mut self, begin: u64, end: u64, data: &[u8]) -> Result<(), String> {
        lock(&self.store).restore(begin, end, data)
    }
}

/// Bytes of keys and values a worker moved.
#[derive(Default)]
pub(super) struct Traffic {
    pub(super) requests: u64,
    pub(super) pushed: u64,
    pub(super) pulled: u64,
}

impl Traffic {
    /// This worker's closing report: what it trained on and moved.
    pub(super) fn report(&self, po: &Postoffice, rank: usize, samples: usize) -> Report {
        Report::Worker {
            rank,
            samples,
            requests: self.requests,
            pushed: self.pushed,
            pulled: self.pulled,
            wire: wire_bytes(po),
        }
    }

    pub(super) fn push(&mut self, keys: usize, vals: usize) {
        self.requests += 1;
        self.pushed += (keys * 8 + vals * 4) as u64;
    }

    fn pull(&mut self, keys: usize, got: &KVPairs<f32>) {
        self.requests += 1;
        self.pulled += (keys * 8 + got.keys.len() * 8 + got.vals.len() * 4) as u64;
    }
}

/// Bytes this worker sent to and received from servers on the wire.
fn wire_bytes(po: &Postoffice) -> u64 {
    po.counters()
        .peers
        .iter()
        .filter(|p| p.peer >= 8 && p.peer % 2 == 0)
        .map(|p| p.bytes_sent + p.bytes_received)
        .sum()
}

/// A worker's KV app, compressing its gradients as `--compression` says.
/// What a worker trains with: its rank, its shard of the training data,
/// the test set (worker 0 only, which evaluates) and its KV worker.
pub(super) struct Trainee {
    pub rank: usize,
    pub shard: Vec<Sample>,
    pub test: Option<TestSet>,
    pub kv: KVWorker<f32>,
}

impl Trainee {
    pub(super) fn new(po: &Postoffice, args: &DemoArgs) -> Result<Trainee, Error> {
        let rank = po.my_rank()? as usize;
        let workers = po.num_workers().max(1) as usize;
        let spec = args.data_spec();
        Ok(Trainee {
            rank,
            shard: spec.shard(rank, workers),
            test: (rank == 0).then(|| TestSet::new(spec.test_set())),
            kv: kv_worker(po, args)?,
        })
    }
}

fn kv_worker(po: &Postoffice, args: &DemoArgs) -> Result<KVWorker<f32>, Error> {
    let kv = KVWorker::<f32>::new(po, 0, 0)?;
    kv.set_compression(args.compression)?;
    Ok(kv)
}

/// Pulls the weights of `keys`, one per key.
pub(super) fn pull_weights(
    kv: &KVWorker<f32>,
    keys: &SArray<u64>,
    traffic: &mut Traffic,
) -> Result<SArray<f32>, Error> {
    let pulled = kv.take_pull(kv.zpull(keys.clone(), KVOptions::new())?)?;
    traffic.pull(keys.len(), &pulled);
    if pulled.vals.len() != keys.len() {
        return Err(Error::App(format!(
            "pulled {} weights for {} keys",
            pulled.vals.len(),
            keys.len()
        )));
    }
    Ok(pulled.vals)
}

/// Worker 0's held-out split and its keys.
pub(super) struct TestSet {
    samples: Vec<Sample>,
    keys: SArray<u64>,
}

impl TestSet {
    pub(super) fn new(samples: Vec<Sample>) -> TestSet {
        let keys = SArray::from_vec(unique_keys(&samples));
        TestSet { samples, keys }
    }

    /// Pulls the current weights of the test keys and evaluates them.
    pub(super) fn evaluate(
        &self,
        kv: &KVWorker<f32>,
        traffic: &mut Traffic,
    ) -> Result<Metrics, Error> {
        let weights = pull_weights(kv, &self.keys, traffic)?;
        Ok(evaluate(&self.samples, &self.keys, &weights))
    }
}

/// A worker: trains on its shard for every epoch; worker 0 evaluates after
/// each. Returns worker 0's last evaluation.
fn train(
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
    let mut traffic = Traffic::default();
    let mut last = None;
    // A resumed run (--resume) starts after the restored checkpoint's epoch.
    let first = args.resume_epoch.min(args.epochs);
    if let Some(test) = &test {
        let m = test.evaluate(&kv, &mut traffic)?;
        reporter.send(Report::Epoch {
            epoch: first,
            loss: m.loss,
            accuracy: m.accuracy,
            secs: 0.0,
        })?;
        last = Some(m);
    }
    po.barrier(0, pslite::WORKER_GROUP)?;
    for epoch in first + 1..=args.epochs {
        let started = Instant::now();
        let progress = test.is_some();
        train_epoch(&kv, &shard, args, epoch, progress, reporter, &mut traffic)?;
        // Every worker's pushes are applied: evaluate this epoch's model.
        po.barrier(0, pslite::WORKER_GROUP)?;
        if let Some(test) = &test {
            let m = test.evaluate(&kv, &mut traffic)?;
            reporter.send(Report::Epoch {
                epoch,
                loss: m.loss,
                accuracy: m.accuracy,
                secs: started.elapsed().as_secs_f64(),
            })?;
            last = Some(m);
        }
        // With --checkpoint-dir, worker 0 asks for a checkpoint; it is taken
        // at this barrier (every push of the epoch applied, none in flight)
        // and complete when the barrier is released.
        // A checkpoint that fails (a server died while writing, say, with
        // --kill-server) is said and training goes on: the next epoch's is
        // tried. Any other error ends the worker.
        let checkpoint_failed =
            |e: &Error| matches!(e.failure(), Some(pslite::Failure::Checkpoint { .. }));
        let ticket = match (&args.checkpoint_dir, rank) {
            (Some(_), 0) => match po
                .van()?
                .call(
                    Call::Checkpoint {
                        label: epoch_label(epoch),
                    },
                    Some(CHECKPOINT_WAIT),
                )
                .and_then(Done::checkpoint)
                .map_err(Error::from)
            {
                Ok((request, _)) => Some(request),
                Err(e) if checkpoint_failed(&e) => {
                    warn!("no checkpoint after epoch {epoch}: {e}; training goes on");
                    None
                }
                Err(e) => return Err(e),
            },
            _ => None,
        };
        po.barrier(0, pslite::WORKER_GROUP)?;
        if let Some(request) = ticket {
            match po
                .van()?
                .call(Call::CheckpointResult { request }, Some(CHECKPOINT_WAIT))
                .and_then(Done::checkpoint)
                .map_err(Error::from)
            {
                Ok((_, done)) => info!(
                    "checkpoint {} (epoch {epoch}) written to {}",
                    done.id, done.dir
                ),
                Err(e) if checkpoint_failed(&e) => {
                    warn!("no checkpoint after epoch {epoch}: {e}; training goes on")
                }
                Err(e) => return Err(e),
            }
        }
    }
    reporter.send(traffic.report(po, rank, shard.len()))?;
    Ok(last)
}

/// One epoch over `shard`: pull, gradient, push per minibatch, with at most
/// [`MAX_PUSHES_IN_FLIGHT`] pushes unanswered; returns when every push is
/// applied. With `progress`, reports about 20 times.
fn train_epoch(
    kv: &KVWorker<f32>,
    shard: &[Sample],
    args: &DemoArgs,
    epoch: usize,
    progress: bool,
    reporter: &mut Reporter,
    traffic: &mut Traffic,
) -> Result<(), Error> {
    let mut pushes = VecDeque::new();
    let total = shard.len().div_ceil(args.batch.max(1));
    let every = (total / 20).max(1);
    for (i, batch) in shard.chunks(args.batch.max(1)).enumerate() {
        if progress && i % every == 0 {
            reporter.send(Report::Progress {
                epoch,
                done: i,
                total,
            })?;
        }
        let keys = SArray::from_vec(unique_keys(batch));
        let weights = pull_weights(kv, &keys, traffic)?;
        let (grad, _loss) = gradient(batch, &keys, &weights);
        traffic.push(keys.len(), grad.len());
        pushes.push_back(kv.zpush(keys, SArray::from_vec(grad), KVOptions::new())?);
        if pushes.len() > MAX_PUSHES_IN_FLIGHT {
            if let Some(ts) = pushes.pop_front() {
                kv.wait(ts)?;
            }
        }
    }
    for ts in pushes {
        kv.wait(ts)?;
    }
    Ok(())
}

/// The store key where rank 0 of elastic round `round` records how many
/// of the demo's worker barriers had passed when the round began.
fn round_key(round: u64) -> String {
    format!("pslite.demo.round.{round}")
}

/// How long a worker admitted to a running job waits for the round's
/// rank 0 to say where the job stands.
const JOIN_WAIT: Duration = Duration::from_secs(60);

/// A worker of an elastic job. The same epochs and barriers as [`train`],
/// counted: barrier 1 follows the evaluation before training, then epoch
/// `e` ends with barrier `2e` (trained) and `2e + 1` (evaluated). Rounds
/// change at barriers: after each, the worker looks at the membership, and
/// the new round's rank 0 reports it and records the barrier count in the
/// store ([`round_key`]), where a worker admitted at that barrier reads
/// where to go on. Every epoch, each worker trains on shard (rank, round
/// size); the round's rank 0 evaluates.
fn train_elastic(
    po: &Postoffice,
    args: &DemoArgs,
    reporter: &mut Reporter,
) -> Result<Option<Metrics>, Error> {
    let me = po.my_id()?;
    let store = po.store()?;
    let spec = args.data_spec();
    let kv = kv_worker(po, args)?;
    let mut traffic = Traffic::default();
    let mut last = None;
    let mut test: Option<TestSet> = None;
    let mut view = po.membership();
    // Barriers passed: 0 for the first round; a worker admitted later
    // learns it from the round's rank 0.
    let mut passed: u64 = if view.round == 0 {
        0
    } else {
        let value = store.get_within(&round_key(view.round), JOIN_WAIT)?;
        String::from_utf8_lossy(&value)
            .trim()
            .parse()
            .map_err(|_| Error::App(format!("bad {} in the store", round_key(view.round))))?
    };
    let rank_of = |view: &pslite::Membership| view.workers.iter().position(|&w| w == me);
    if view.round == 0 && rank_of(&view) == Some(0) {
        report_round(reporter, &view, 0)?;
    }
    let mut epoch_started = Instant::now();
    let mut samples = 0;
    loop {
        let Some(rank) = rank_of(&view) else {
            return Err(Error::App(format!(
                "node {me} is not among the workers of round {} ({:?})",
                view.round, view.workers
            )));
        };
        if passed % 2 == 0 {
            // Epoch passed / 2 is trained: rank 0 evaluates it.
            let epoch = (passed / 2) as usize;
            if rank == 0 {
                let test = test.get_or_insert_with(|| TestSet::new(spec.test_set()));
                let m = test.evaluate(&kv, &mut traffic)?;
                reporter.send(Report::Epoch {
                    epoch,
                    loss: m.loss,
                    accuracy: m.accuracy,
                    secs: if epoch == 0 {
                        0.0
                    } else {
                        epoch_started.elapsed().as_secs_f64()
                    },
                })?;
                last = Some(m);
            }
            if epoch == args.epochs {
                break;
            }
        } else {
            let epoch = (passed as usize).div_ceil(2);
            epoch_started = Instant::now();
            let shard = spec.shard(rank, view.workers.len().max(1));
            samples = shard.len();
            train_epoch(&kv, &shard, args, epoch, rank == 0, reporter, &mut traffic)?;
        }
        po.barrier(0, pslite::WORKER_GROUP)?;
        passed += 1;
        let now = po.membership();
        if now.round != view.round && rank_of(&now) == Some(0) {
            store.set(&round_key(now.round), passed.to_string())?;
            report_round(reporter, &now, (passed / 2) as usize)?;
        }
        view = now;
    }
    reporter.send(traffic.report(po, rank_of(&view).unwrap_or(0), samples))?;
    Ok(last)
}

fn report_round(
    reporter: &mut Reporter,
    view: &pslite::Membership,
    after_epoch: usize,
) -> Result<(), Error> {
    reporter.send(Report::Round {
        round: view.round,
        after_epoch,
        workers: view.workers.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::args::tests::parse;

    /// The nodes' code end to end, every node a thread of this process on
    /// 127.0.0.1: 1 scheduler, 2 servers, 2 workers, a small data set.
    #[test]
    fn an_in_process_cluster_trains_and_reports() {
        let args = parse(&[
            "--node",
            "--samples",
            "6000",
            "--features",
            "5000",
            "--nnz",
            "10",
            "--batch",
            "200",
            "--epochs",
            "3",
        ])
        .unwrap();
        let reserved = crate::launcher::PortReservation::new("127.0.0.1").unwrap();
        let port = reserved.port();
        let roles = [
            Role::Scheduler,
            Role::Server,
            Role::Server,
            Role::Worker,
            Role::Worker,
        ];
        let nodes: Vec<_> = roles
            .into_iter()
            .map(|role| {
                let mut config = pslite::Config::new(role, 2, 2, "127.0.0.1", i32::from(port));
                config.van.start_timeout = Duration::from_secs(60);
                let po = Postoffice::new(config);
                let args = args.clone();
                std::thread::spawn(move || {
                    let mut reporter = Reporter::Collect(Vec::new());
                    let last = run_node_on(&po, &args, &mut reporter);
                    match reporter {
                        Reporter::Collect(reports) => (last.map_err(|e| e.to_string()), reports),
                        _ => unreachable!(),
                    }
                })
            })
            .collect();
        let mut reports = Vec::new();
        let mut last = None;
        for node in nodes {
            let (result, node_reports) = node.join().unwrap();
            last = last.or(result.unwrap());
            reports.extend(node_reports);
        }
        let epochs: Vec<(usize, f64, f64)> = reports
            .iter()
            .filter_map(|r| match r {
                Report::Epoch {
                    epoch,
                    loss,
                    accuracy,
                    ..
                } => Some((*epoch, *loss, *accuracy)),
                _ => None,
            })
            .collect();
        assert_eq!(
            epochs.iter().map(|e| e.0).collect::<Vec<_>>(),
            [0, 1, 2, 3],
            "{reports:?}"
        );
        assert!((epochs[0].1 - 2f64.ln()).abs() < 1e-9, "untrained loss");
        assert!(epochs[3].1 < epochs[0].1 - 0.1, "{epochs:?}");
        assert!(epochs[3].2 > 0.75, "{epochs:?}");
        assert_eq!(last.map(|m| m.accuracy), Some(epochs[3].2));

        let spec = args.data_spec();
        let train = spec.train_len();
        let mut shard_total = 0;
        let mut pushes_sent = 0;
        for r in &reports {
            if let Report::Worker {
                samples, requests, ..
            } = r
            {
                shard_total += samples;
                // One pull and one push per batch and epoch (+ evaluations).
                let batches = samples.div_ceil(args.batch) as u64;
                assert!(*requests >= batches * 2 * args.epochs as u64);
                pushes_sent += batches * args.epochs as u64;
            }
        }
        assert_eq!(shard_total, train);
        let (keys, pushes): (usize, u64) = reports
            .iter()
            .filter_map(|r| match r {
                Report::Server { keys, pushes, .. } => Some((*keys, *pushes)),
                _ => None,
            })
            .fold((0, 0), |(k, p), (k2, p2)| (k + k2, p + p2));
        assert_eq!(keys, unique_keys(&spec.shard(0, 1)).len());
        // Each push reaches every server that owns some of its keys.
        assert!(pushes >= pushes_sent && pushes <= 2 * pushes_sent);
    }
}
