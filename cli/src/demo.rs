//! `pslite demo`: the main job. A local cluster of this very program trains
//! a sparse logistic-regression model by data-parallel SGD (or AdaGrad).
//!
//! `pslite demo` starts 1 scheduler, `--servers` servers and `--workers`
//! workers with the [launcher](crate::launcher): each node is this binary
//! again, run as `pslite demo --node` with the `DMLC_*` environment.
//!
//! - **Data** ([`data`]): a synthetic data set generated from hidden true
//!   weights (by default 200 000 samples over 1 000 000 features, 20
//!   non-zeros each, 5% of the labels flipped). Every sample is a function
//!   of the seed and its index, so each worker generates its own contiguous
//!   shard of the training split by rank, and worker 0 the held-out split
//!   (the last 10%); no files are needed.
//! - **Workers**: for each minibatch of their shard, pull the weights of its
//!   keys (sorted unique feature keys), compute the gradient of the mean
//!   log loss ([`model::gradient`]) and push it. After each epoch all
//!   workers meet at a barrier, worker 0 pulls the weights of the test keys
//!   and evaluates log loss and accuracy on the held-out split, and a
//!   second barrier keeps the others from training on meanwhile, so every
//!   evaluation sees exactly the model after that epoch.
//! - **Servers**: each holds the weights (and AdaGrad state) of the keys in
//!   its key range in a [`model::Store`] and applies every pushed gradient
//!   at once, in its request handle: asynchronous data-parallel SGD, as in
//!   ps-lite's linear models. Every request is answered.
//! - **Progress**: nodes report to the launching process over a loopback
//!   TCP connection (`--report`, one text line per [`Report`]); it prints
//!   one line per epoch, then the final accuracy, the wall time and the
//!   bytes moved, and exits 1 if the accuracy is below `--threshold`.
//!
//! "Bytes moved" counts the keys (8 bytes) and values (4 bytes) in the data
//! frames of every request and response of the workers, training and
//! evaluation: a push sends keys and gradients, a pull sends keys and gets
//! keys and weights back. Message headers are not counted.
//!
//! A node run without `--report` (for example by
//! `pslite launch -s 2 -w 2 -- pslite demo --node`) prints its reports
//! itself, and worker 0 fails if the accuracy is below the threshold.

pub mod data;
pub mod model;
pub mod plot;

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, RecvTimeoutError};
use log::warn;
use pslite_proto::{lock, Role};

use crate::launcher::{launch_with, Control, LaunchError, LaunchOptions, Outcome};
use data::{unique_keys, DataSpec, Sample};
use model::{evaluate, gradient, Metrics, Optimizer, Store};
use pslite::{Error, KVMeta, KVOptions, KVPairs, KVServer, KVWorker, Postoffice, SArray};

/// Pushes a worker may have in flight before it waits for the oldest.
const MAX_PUSHES_IN_FLIGHT: usize = 8;

/// Options of `pslite demo`.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Number of servers.
    #[arg(long, short = 's', default_value_t = 2, value_parser = positive)]
    pub servers: usize,
    /// Number of workers.
    #[arg(long, short = 'w', default_value_t = 2, value_parser = positive)]
    pub workers: usize,
    /// Passes over the training split.
    #[arg(long, short = 'e', default_value_t = 5, value_parser = positive)]
    pub epochs: usize,
    /// Samples in the data set, training and held-out.
    #[arg(long, default_value_t = 200_000, value_parser = positive)]
    pub samples: usize,
    /// Number of feature ids (the model's size).
    #[arg(long, default_value_t = 1_000_000, value_parser = positive_u64)]
    pub features: u64,
    /// Non-zero features per sample.
    #[arg(long, default_value_t = 20, value_parser = positive)]
    pub nnz: usize,
    /// Samples per minibatch, on each worker.
    #[arg(long, default_value_t = 1000, value_parser = positive)]
    pub batch: usize,
    /// How the servers apply gradients.
    #[arg(long, value_enum, default_value_t = Optimizer::Sgd)]
    pub optimizer: Optimizer,
    /// Learning rate [default: 20 for sgd, 0.03 for adagrad].
    #[arg(long, value_parser = positive_f32)]
    pub learning_rate: Option<f32>,
    /// Probability that a label is flipped.
    #[arg(long, default_value_t = 0.05, value_parser = label_noise)]
    pub label_noise: f64,
    /// Fraction of the samples held out for testing.
    #[arg(long, default_value_t = 0.1, value_parser = open_fraction)]
    pub test_fraction: f64,
    /// Seed of the data set.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Exit 1 if the final test accuracy is below this.
    #[arg(long, default_value_t = 0.8, value_parser = accuracy)]
    pub threshold: f64,
    /// Stop the cluster after this many seconds.
    #[arg(long, default_value_t = 120.0, value_parser = seconds)]
    pub timeout: f64,
    /// The scheduler's port [default: a free one]; `pslite status --port PORT`
    /// then shows the running job (nodes report counters with their heartbeats, every second by default).
    #[arg(long)]
    pub port: Option<u16>,
    /// Write the held-out loss and accuracy per epoch as an SVG chart.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
    /// Elastic workers: DMLC_NUM_WORKER=W:W+2 for --workers W. Training
    /// starts with W workers; the demo adds one after epoch --join-after and
    /// kills worker --kill-worker with SIGKILL after epoch --kill-after (once
    /// the added worker trains). Workers re-shard the data at every new
    /// round, and the output says when each round began and with whom.
    #[arg(long)]
    pub elastic: bool,
    /// With --elastic: add a worker after this epoch (0: no worker is added).
    #[arg(long, default_value_t = 1, value_name = "EPOCH")]
    pub join_after: usize,
    /// With --elastic: kill a worker after this epoch (0: none is killed).
    #[arg(long, default_value_t = 2, value_name = "EPOCH")]
    pub kill_after: usize,
    /// With --elastic: which worker to kill (its launch index, as in its
    /// output prefix).
    #[arg(long, default_value_t = 1, value_name = "INDEX")]
    pub kill_worker: usize,
    /// Run as one node of the cluster (set by `pslite demo` itself).
    #[arg(long, hide = true)]
    pub node: bool,
    /// Where a node sends its reports (host:port of the launching process).
    #[arg(long, hide = true, value_name = "ADDR")]
    pub report: Option<String>,
}

fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

fn positive_u64(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

fn positive_f32(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
        _ => Err("expected a positive number".into()),
    }
}

fn number_in(s: &str, ok: impl Fn(f64) -> bool, expected: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if ok(x) => Ok(x),
        _ => Err(format!("expected {expected}")),
    }
}

fn label_noise(s: &str) -> Result<f64, String> {
    number_in(s, |x| (0.0..0.5).contains(&x), "a probability in [0, 0.5)")
}

fn open_fraction(s: &str) -> Result<f64, String> {
    number_in(s, |x| x > 0.0 && x < 1.0, "a fraction in (0, 1)")
}

fn accuracy(s: &str) -> Result<f64, String> {
    number_in(s, |x| (0.0..=1.0).contains(&x), "an accuracy in [0, 1]")
}

fn seconds(s: &str) -> Result<f64, String> {
    number_in(
        s,
        |x| x > 0.0 && x.is_finite(),
        "a positive number of seconds",
    )
}

impl DemoArgs {
    /// The learning rate: the given one or the optimizer's default.
    pub fn learning_rate(&self) -> f32 {
        self.learning_rate
            .unwrap_or_else(|| self.optimizer.default_learning_rate())
    }

    /// The data set these options describe.
    pub fn data_spec(&self) -> DataSpec {
        DataSpec {
            samples: self.samples,
            features: self.features,
            nnz: self.nnz,
            label_noise: self.label_noise,
            test_fraction: self.test_fraction,
            seed: self.seed,
        }
    }

    /// Checks what the options' parsers cannot check one by one.
    pub fn check(&self) -> Result<(), Error> {
        let spec = self.data_spec();
        let train = spec.train_len();
        if train == 0 || train == spec.samples {
            return Err(Error::InvalidInput(format!(
                "--samples {} with --test-fraction {} leaves no training or no test samples",
                self.samples, self.test_fraction
            )));
        }
        if self.elastic && self.kill_after > 0 && self.kill_worker >= self.workers {
            return Err(Error::InvalidInput(format!(
                "--kill-worker {} is not one of the {} workers started (0 to {})",
                self.kill_worker,
                self.workers,
                self.workers - 1
            )));
        }
        if self.nnz as u64 > self.features {
            return Err(Error::InvalidInput(format!(
                "--nnz {} is more than the {} features",
                self.nnz, self.features
            )));
        }
        Ok(())
    }

    /// The arguments of every node: these options, resolved, with `--node`
    /// and the report address.
    fn node_args(&self, report: &str) -> Vec<OsString> {
        let mut args: Vec<String> = vec!["demo".into(), "--node".into()];
        args.extend(["--report".into(), report.into()]);
        for (name, value) in [
            ("--epochs", self.epochs.to_string()),
            ("--samples", self.samples.to_string()),
            ("--features", self.features.to_string()),
            ("--nnz", self.nnz.to_string()),
            ("--batch", self.batch.to_string()),
            ("--optimizer", self.optimizer.name().to_string()),
            ("--learning-rate", self.learning_rate().to_string()),
            ("--label-noise", self.label_noise.to_string()),
            ("--test-fraction", self.test_fraction.to_string()),
            ("--seed", self.seed.to_string()),
            ("--threshold", self.threshold.to_string()),
        ] {
            args.extend([name.to_string(), value]);
        }

        args.into_iter().map(OsString::from).collect()
    }
}

/// Runs `pslite demo`: the whole cluster, or with `--node` one node of it.
pub fn main(args: &DemoArgs) -> ExitCode {
    if args.node {
        return pslite::exit_code(run_node(args));
    }
    if let Err(e) = args.check() {
        eprintln!("pslite demo: {e}");
        return ExitCode::from(pslite::EXIT_CONFIG);
    }
    match run_cluster(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pslite demo: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// Reports: what nodes tell the launching process.

/// What a node reports, one text line each on the wire.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// Worker 0 is `done` minibatches into epoch `epoch` of `total`.
    Progress {
        /// The epoch, from 1.
        epoch: usize,
        /// Minibatches done.
        done: usize,
        /// Minibatches in the epoch.
        total: usize,
    },
    /// Worker 0's evaluation on the held-out split after an epoch (epoch 0:
    /// before training).
    Epoch {
        /// The epoch, from 1; 0 before training.
        epoch: usize,
        /// Mean log loss on the held-out split.
        loss: f64,
        /// Accuracy on the held-out split.
        accuracy: f64,
        /// Seconds the epoch took, training and evaluation.
        secs: f64,
    },
    /// A worker's traffic, when it is done.
    Worker {
        /// Its rank.
        rank: usize,
        /// Training samples in its shard.
        samples: usize,
        /// Push and pull calls it made.
        requests: u64,
        /// Bytes of keys and values it pushed.
        pushed: u64,
        /// Bytes of keys it sent in pulls and of keys and values it got back.
        pulled: u64,
    },
    /// The rank 0 of a new elastic round saw it begin (the launching
    /// process prints each round once).
    Round {
        /// The round number.
        round: u64,
        /// Epochs done when it began (trained, maybe not yet evaluated).
        after_epoch: usize,
        /// Its workers' node ids, in rank order.
        workers: Vec<i32>,
    },
    /// A server's state, when it is done.
    Server {
        /// Its rank.
        rank: usize,
        /// Keys it holds a weight for.
        keys: usize,
        /// Pushes it applied.
        pushes: u64,
        /// Pulls it answered.
        pulls: u64,
    },
}

impl fmt::Display for Report {
    /// The wire form: a word and numbers, separated by spaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::Epoch {
                epoch,
                loss,
                accuracy,
                secs,
            } => write!(f, "epoch {epoch} {loss} {accuracy} {secs}"),
            Report::Progress { epoch, done, total } => {
                write!(f, "progress {epoch} {done} {total}")
            }
            Report::Worker {
                rank,
                samples,
                requests,
                pushed,
                pulled,
            } => write!(f, "worker {rank} {samples} {requests} {pushed} {pulled}"),
            Report::Server {
                rank,
                keys,
                pushes,
                pulls,
            } => write!(f, "server {rank} {keys} {pushes} {pulls}"),
            Report::Round {
                round,
                after_epoch,
                workers,
            } => {
                write!(f, "round {round} {after_epoch}")?;
                for w in workers {
                    write!(f, " {w}")?;
                }
                Ok(())
            }
        }
    }
}

impl Report {
    /// Reads the wire form; `None` if it is not a report.
    pub fn parse(line: &str) -> Option<Report> {
        let mut words = line.split_whitespace();
        let kind = words.next()?;
        let nums: Vec<&str> = words.collect();
        let int = |i: usize| nums.get(i).and_then(|s| s.parse::<u64>().ok());
        let float = |i: usize| nums.get(i).and_then(|s| s.parse::<f64>().ok());
        if kind == "round" && nums.len() >= 3 {
            let workers: Option<Vec<i32>> = nums[2..].iter().map(|w| w.parse().ok()).collect();
            return Some(Report::Round {
                round: int(0)?,
                after_epoch: int(1)? as usize,
                workers: workers?,
            });
        }
        let report = match (kind, nums.len()) {
            ("epoch", 4) => Report::Epoch {
                epoch: int(0)? as usize,
                loss: float(1)?,
                accuracy: float(2)?,
                secs: float(3)?,
            },
            ("progress", 3) => Report::Progress {
                epoch: int(0)? as usize,
                done: int(1)? as usize,
                total: int(2)? as usize,
            },
            ("worker", 5) => Report::Worker {
                rank: int(0)? as usize,
                samples: int(1)? as usize,
                requests: int(2)?,
                pushed: int(3)?,
                pulled: int(4)?,
            },
            ("server", 4) => Report::Server {
                rank: int(0)? as usize,
                keys: int(1)? as usize,
                pushes: int(2)?,
                pulls: int(3)?,
            },
            _ => return None,
        };
        Some(report)
    }

    /// The report as a line for people; `epochs` is the number of epochs.
    pub fn human(&self, epochs: usize) -> String {
        match self {
            Report::Progress { epoch, done, total } => {
                const WIDTH: usize = 30;
                let filled = (done * WIDTH).checked_div(*total).unwrap_or(0).min(WIDTH);
                format!(
                    "epoch {epoch:>w$}/{epochs}  [{}{}] {done}/{total} minibatches",
                    "#".repeat(filled),
                    ".".repeat(WIDTH - filled),
                    w = digits(epochs)
                )
            }
            Report::Epoch {
                epoch: 0,
                loss,
                accuracy,
                ..
            } => format!(
                "epoch {:>w$}/{epochs}  test loss {loss:.4}  accuracy {accuracy:.4}  (before training)",
                0,
                w = digits(epochs)
            ),
            Report::Epoch {
                epoch,
                loss,
                accuracy,
                secs,
            } => format!(
                "epoch {epoch:>w$}/{epochs}  test loss {loss:.4}  accuracy {accuracy:.4}  {secs:5.2} s",
                w = digits(epochs)
            ),
            Report::Worker {
                rank,
                samples,
                requests,
                pushed,
                pulled,
            } => format!(
                "worker {rank}: {} samples, {} requests, pushed {}, pulled {}",
                group(*samples as u64),
                group(*requests),
                megabytes(*pushed),
                megabytes(*pulled)
            ),
            Report::Round {
                round,
                after_epoch,
                workers,
            } => {
                let ids: Vec<String> = workers.iter().map(i32::to_string).collect();
                let ranks = match workers.len() {
                    0 => "no ranks".to_string(),
                    1 => "rank 0".to_string(),
                    n => format!("ranks 0-{}", n - 1),
                };
                let when = match after_epoch {
                    0 => "before training".to_string(),
                    e => format!("after epoch {e}"),
                };
                format!(
                    "round {round} began with worker{} {} ({ranks}), {when}",
                    plural(workers.len()),
                    ids.join(", ")
                )
            }
            Report::Server {
                rank,
                keys,
                pushes,
                pulls,
            } => format!(
                "server {rank}: {} keys, {} pushes applied, {} pulls answered",
                group(*keys as u64),
                group(*pushes),
                group(*pulls)
            ),
        }
    }
}

fn digits(n: usize) -> usize {
    n.to_string().len()
}

/// `1234567` as `1 234 567`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Where a node sends its reports.
enum Reporter {
    /// To the launching process, as wire lines.
    Launcher(TcpStream),
    /// To stdout, for people.
    Print {
        /// Epochs in the run.
        epochs: usize,
    },
    /// Into a list (tests).
    #[cfg(test)]
    Collect(Vec<Report>),
}

impl Reporter {
    fn send(&mut self, report: Report) -> Result<(), Error> {
        match self {
            Reporter::Launcher(stream) => writeln!(stream, "{report}")
                .and_then(|()| stream.flush())
                .map_err(|e| Error::App(format!("cannot report to `pslite demo`: {e}"))),
            Reporter::Print { epochs } => {
                if !matches!(report, Report::Progress { .. }) {
                    println!("{}", report.human(*epochs));
                }
                Ok(())
            }
            #[cfg(test)]
            Reporter::Collect(reports) => {
                reports.push(report);
                Ok(())
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The nodes.

fn run_node(args: &DemoArgs) -> Result<(), Error> {
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
            let last = if po.is_elastic() {
                train_elastic(po, args, reporter)?
            } else {
                train(po, args, reporter)?
            };
            po.finalize(0, true)?;
            Ok(last)
        }
        Role::Scheduler => {
            po.finalize(0, true)?;
            Ok(None)
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
        let store = Arc::clone(&store);
        let counts = Arc::clone(&counts);
        server.set_request_handle(move |meta, req, server| {
            let res = match answer(&mut lock(&store), meta, &req) {
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
        });
    }
    po.finalize(0, true)?;
    drop(server);
    let keys = lock(&store).len();
    let c = lock(&counts);
    reporter.send(Report::Server {
        rank,
        keys,
        pushes: c.pushes,
        pulls: c.pulls,
    })
}

/// Bytes of keys and values a worker moved.
#[derive(Default)]
struct Traffic {
    requests: u64,
    pushed: u64,
    pulled: u64,
}

impl Traffic {
    fn push(&mut self, keys: usize, vals: usize) {
        self.requests += 1;
        self.pushed += (keys * 8 + vals * 4) as u64;
    }

    fn pull(&mut self, keys: usize, got: &KVPairs<f32>) {
        self.requests += 1;
        self.pulled += (keys * 8 + got.keys.len() * 8 + got.vals.len() * 4) as u64;
    }
}

/// Pulls the weights of `keys`, one per key.
fn pull_weights(
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
struct TestSet {
    samples: Vec<Sample>,
    keys: SArray<u64>,
}

impl TestSet {
    fn new(samples: Vec<Sample>) -> TestSet {
        let keys = SArray::from_vec(unique_keys(&samples));
        TestSet { samples, keys }
    }

    /// Pulls the current weights of the test keys and evaluates them.
    fn evaluate(&self, kv: &KVWorker<f32>, traffic: &mut Traffic) -> Result<Metrics, Error> {
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
    let rank = po.my_rank()? as usize;
    let workers = po.num_workers().max(1) as usize;
    let spec = args.data_spec();
    let shard = spec.shard(rank, workers);
    let test = (rank == 0).then(|| TestSet::new(spec.test_set()));
    let kv = KVWorker::<f32>::new(po, 0, 0)?;
    let mut traffic = Traffic::default();
    let mut last = None;
    if let Some(test) = &test {
        let m = test.evaluate(&kv, &mut traffic)?;
        reporter.send(Report::Epoch {
            epoch: 0,
            loss: m.loss,
            accuracy: m.accuracy,
            secs: 0.0,
        })?;
        last = Some(m);
    }
    po.barrier(0, pslite::WORKER_GROUP)?;
    for epoch in 1..=args.epochs {
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
        po.barrier(0, pslite::WORKER_GROUP)?;
    }
    reporter.send(Report::Worker {
        rank,
        samples: shard.len(),
        requests: traffic.requests,
        pushed: traffic.pushed,
        pulled: traffic.pulled,
    })?;
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
    let kv = KVWorker::<f32>::new(po, 0, 0)?;
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
    reporter.send(Report::Worker {
        rank: rank_of(&view).unwrap_or(0),
        samples,
        requests: traffic.requests,
        pushed: traffic.pushed,
        pulled: traffic.pulled,
    })?;
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

// ---------------------------------------------------------------------------
// The launching process.

/// What the launching process hears while the cluster runs.
enum Event {
    Report(Report),
    Done(Result<Outcome, LaunchError>),
}

/// Accepts the nodes' report connections and forwards their reports.
fn collect_reports(listener: TcpListener, tx: crossbeam_channel::Sender<Event>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                match Report::parse(&line) {
                    Some(report) => {
                        if tx.send(Event::Report(report)).is_err() {
                            break;
                        }
                    }
                    None => warn!("pslite demo: ignoring report line {line:?}"),
                }
            }
        });
    }
}

/// The launching process's part in `--elastic`: when to add a worker and
/// when to kill one, and the rounds seen.
struct Elastic {
    on: bool,
    started: usize,
    join_after: usize,
    kill_after: usize,
    kill_worker: usize,
    /// The last epoch evaluated.
    epoch: usize,
    joined: bool,
    /// A round had more workers than were started (the added one trains).
    grown: bool,
    killed: bool,
    /// The last round printed.
    round: Option<u64>,
    /// Every round printed, for the chart.
    rounds: Vec<plot::RoundMark>,
    pending: Vec<Control>,
}

impl Elastic {
    fn new(args: &DemoArgs) -> Elastic {
        Elastic {
            on: args.elastic,
            started: args.workers,
            join_after: args.join_after,
            kill_after: args.kill_after,
            kill_worker: args.kill_worker,
            epoch: 0,
            joined: false,
            grown: false,
            killed: false,
            round: None,
            rounds: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Epoch `epoch` was evaluated.
    fn epoch_done(&mut self, epoch: usize) {
        self.epoch = epoch;
        self.decide();
    }

    /// Round `round` began with `workers` workers after `after_epoch`
    /// epochs; whether it is new.
    fn round_began(&mut self, round: u64, after_epoch: usize, workers: usize) -> bool {
        if self.round.is_some_and(|r| r >= round) {
            return false;
        }
        self.round = Some(round);
        self.rounds.push(plot::RoundMark {
            round,
            after_epoch,
            workers,
        });
        self.grown |= workers > self.started;
        self.decide();
        true
    }

    fn decide(&mut self) {
        if !self.on {
            return;
        }
        if self.join_after > 0 && !self.joined && self.epoch >= self.join_after {
            self.joined = true;
            self.pending.push(Control::AddWorker);
        }
        // Kill only once the added worker is in a round, so that the
        // kill ends a round of its own.
        let ready = self.grown || self.join_after == 0;
        if self.kill_after > 0 && !self.killed && self.epoch >= self.kill_after && ready {
            self.killed = true;
            self.pending.push(Control::SignalWorker {
                worker: self.kill_worker,
                signal: libc::SIGKILL,
            });
        }
    }

    /// What to ask of the launcher now.
    fn requests(&mut self) -> Vec<Control> {
        std::mem::take(&mut self.pending)
    }

    /// Workers that should report at the end.
    fn workers_expected(&self) -> usize {
        self.started + usize::from(self.joined) - usize::from(self.killed)
    }
}

/// Runs the cluster, prints its progress and summary; the exit code says
/// whether training reached the threshold.
fn run_cluster(args: &DemoArgs) -> Result<ExitCode, Error> {
    let program = std::env::current_exe()
        .map_err(|e| Error::App(format!("cannot find this program to launch it: {e}")))?;
    let host = "127.0.0.1";
    let listener = TcpListener::bind((host, 0))
        .map_err(|e| Error::App(format!("cannot listen for reports on {host}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::App(format!("cannot listen for reports on {host}: {e}")))?;
    let mut env = Vec::new();
    if args.elastic {
        // A killed worker is noticed by its missing heartbeats: soon.
        for (var, value) in [
            ("PS_HEARTBEAT_INTERVAL", "1"),
            ("PS_HEARTBEAT_TIMEOUT", "3"),
        ] {
            if std::env::var_os(var).is_none() {
                env.push((var.to_string(), value.to_string()));
            }
        }
    }
    let opts = LaunchOptions {
        servers: args.servers,
        workers: args.workers,
        elastic: args.elastic.then_some((args.workers, args.workers + 2)),
        env,
        worker_procs: None,
        host: host.into(),
        port: args.port,
        timeout: Some(Duration::from_secs_f64(args.timeout)),
        program: program.into_os_string(),
        args: args.node_args(&addr.to_string()),
        ..LaunchOptions::default()
    };
    print_header(args);

    let (tx, rx) = unbounded();
    {
        let tx = tx.clone();
        std::thread::spawn(move || collect_reports(listener, tx));
    }
    let started = Instant::now();
    let (control, requests) = unbounded();
    std::thread::spawn(move || {
        let _ = tx.send(Event::Done(launch_with(&opts, &requests)));
    });
    let mut elastic = Elastic::new(args);

    let mut epochs: Vec<(usize, f64, f64, f64)> = Vec::new();
    // A progress bar redrawn in place on a terminal; plain lines otherwise.
    let bar = std::io::stdout().is_terminal();
    let mut bar_shown = false;
    let mut workers: Vec<(u64, u64, u64)> = Vec::new();
    let mut servers: Vec<(usize, usize)> = Vec::new();
    let mut outcome = None;
    let mut linger = None;
    loop {
        // After the cluster is done, wait briefly for the last reports.
        let event = match linger {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(deadline) => rx.recv_deadline(deadline),
        };
        let event = match event {
            Ok(event) => event,
            Err(_) => break,
        };
        match event {
            Event::Report(report) => {
                match &report {
                    Report::Epoch {
                        epoch,
                        loss,
                        accuracy,
                        secs,
                    } => {
                        if bar_shown {
                            print!("\r\x1b[2K");
                            bar_shown = false;
                        }
                        println!("{}", report.human(args.epochs));
                        epochs.push((*epoch, *loss, *accuracy, *secs));
                        elastic.epoch_done(*epoch);
                    }
                    Report::Round {
                        round,
                        after_epoch,
                        workers,
                    } => {
                        if elastic.round_began(*round, *after_epoch, workers.len()) {
                            if bar_shown {
                                print!("\r\x1b[2K");
                                bar_shown = false;
                            }
                            println!("{}", report.human(args.epochs));
                        }
                    }
                    Report::Progress { .. } => {
                        if bar {
                            print!("\r\x1b[2K{}", report.human(args.epochs));
                            let _ = std::io::stdout().flush();
                            bar_shown = true;
                        }
                    }
                    Report::Worker {
                        requests,
                        pushed,
                        pulled,
                        ..
                    } => workers.push((*requests, *pushed, *pulled)),
                    Report::Server { rank, keys, .. } => servers.push((*rank, *keys)),
                }
                for request in elastic.requests() {
                    if bar_shown {
                        print!("\r\x1b[2K");
                        bar_shown = false;
                    }
                    match request {
                        Control::AddWorker => println!(
                            "adding worker {} (it waits for the next round)",
                            args.workers
                        ),
                        Control::SignalWorker { worker, .. } => {
                            println!("killing worker {worker} with SIGKILL")
                        }
                    }
                    let _ = control.send(request);
                }
                if linger.is_some()
                    && workers.len() == elastic.workers_expected()
                    && servers.len() == args.servers
                {
                    break;
                }
            }
            Event::Done(result) => {
                let wall = started.elapsed();
                let complete =
                    workers.len() == elastic.workers_expected() && servers.len() == args.servers;
                let failed = !matches!(result, Ok(Outcome::Success));
                outcome = Some((result, wall));
                if complete || failed {
                    break;
                }
                linger = Some(Instant::now() + Duration::from_secs(2));
            }
        }
    }
    let Some((result, wall)) = outcome else {
        return Err(Error::App("the launcher stopped without a result".into()));
    };
    match result {
        Ok(Outcome::Success) => {}
        Ok(outcome) => {
            for line in outcome.lines() {
                eprintln!("pslite demo: {line}");
            }
            return Ok(ExitCode::from(outcome.exit_code()));
        }
        Err(e) => {
            eprintln!("pslite demo: {e}");
            return Ok(ExitCode::from(pslite::EXIT_CONFIG));
        }
    }

    if bar_shown {
        print!("\r\x1b[2K");
    }
    if let Some(path) = &args.plot {
        let points: Vec<plot::Point> = epochs
            .iter()
            .map(|&(epoch, loss, accuracy, _)| plot::Point {
                epoch,
                loss,
                accuracy,
            })
            .collect();
        let title = format!(
            "pslite demo: {} servers, {} workers{}, {} (learning rate {})",
            args.servers,
            args.workers,
            if args.elastic { " (elastic)" } else { "" },
            args.optimizer.title(),
            args.learning_rate()
        );
        match plot::write_chart(path, &title, &points, &elastic.rounds) {
            Ok(()) => println!("chart of loss and accuracy per epoch: {}", path.display()),
            Err(e) => {
                eprintln!("pslite demo: {e}");
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    servers.sort_unstable();
    let keys: Vec<String> = servers.iter().map(|&(_, k)| group(k as u64)).collect();
    let (requests, pushed, pulled) = workers.iter().fold((0, 0, 0), |(r, a, b), &(r2, a2, b2)| {
        (r + r2, a + a2, b + b2)
    });
    let training: f64 = epochs.iter().map(|e| e.3).sum();
    println!(
        "model: {} keys with a weight, held by {} server{} ({})",
        group(servers.iter().map(|&(_, k)| k as u64).sum()),
        args.servers,
        plural(args.servers),
        keys.join(" + ")
    );
    println!(
        "moved {} of keys and values: pushes {}, pulls {} ({} requests from {} worker{}{})",
        megabytes(pushed + pulled),
        megabytes(pushed),
        megabytes(pulled),
        group(requests),
        workers.len(),
        plural(workers.len()),
        if elastic.killed {
            ", not counting the killed one"
        } else {
            ""
        }
    );
    println!(
        "wall time {:.1} s (training and evaluation {training:.1} s)",
        wall.as_secs_f64()
    );
    let Some(&(epoch, _, final_accuracy, _)) = epochs.last() else {
        eprintln!("pslite demo: worker 0 reported no accuracy");
        return Ok(ExitCode::FAILURE);
    };
    if epoch != args.epochs {
        eprintln!(
            "pslite demo: worker 0 reported epoch {epoch} last, not {}",
            args.epochs
        );
        return Ok(ExitCode::FAILURE);
    }
    if final_accuracy < args.threshold {
        println!(
            "FAILED: final test accuracy {final_accuracy:.4} is below the threshold {} (random guessing gets about 0.5)",
            args.threshold
        );
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "final test accuracy {final_accuracy:.4} (threshold {}): ok",
        args.threshold
    );
    Ok(ExitCode::SUCCESS)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn print_header(args: &DemoArgs) {
    let spec = args.data_spec();
    let train = spec.train_len();
    println!(
        "pslite demo: sparse logistic regression by data-parallel {} (learning rate {})",
        args.optimizer.title(),
        args.learning_rate()
    );
    println!(
        "data: {} samples ({} to train, {} held out), {} features, {} non-zeros each, \
         {}% of labels flipped, seed {}",
        group(spec.samples as u64),
        group(train as u64),
        group((spec.samples - train) as u64),
        group(spec.features),
        spec.nnz,
        spec.label_noise * 100.0,
        spec.seed
    );
    let elastic = if args.elastic {
        format!(" (elastic, {}:{})", args.workers, args.workers + 2)
    } else {
        String::new()
    };
    println!(
        "cluster: 1 scheduler, {} server{}, {} worker{}{elastic} on this machine; \
         minibatches of {} samples per worker, {} epoch{}",
        args.servers,
        plural(args.servers),
        args.workers,
        plural(args.workers),
        group(args.batch as u64),
        args.epochs,
        plural(args.epochs)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    fn parse(args: &[&str]) -> Result<DemoArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("demo").chain(args.iter().copied())).map(|c| c.demo)
    }

    #[test]
    fn defaults_and_node_args_round_trip() {
        let args = parse(&[]).unwrap();
        assert_eq!((args.servers, args.workers, args.epochs), (2, 2, 5));
        assert_eq!(
            (args.samples, args.features, args.nnz),
            (200_000, 1_000_000, 20)
        );
        assert_eq!(args.optimizer, Optimizer::Sgd);
        assert_eq!(args.learning_rate(), 20.0);
        assert!(!args.node);
        args.check().unwrap();

        let args = parse(&["--optimizer", "adagrad", "--seed", "7", "-e", "3"]).unwrap();
        assert_eq!(args.learning_rate(), 0.03);
        let node_args: Vec<String> = args
            .node_args("127.0.0.1:9")
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            &node_args[..4],
            ["demo", "--node", "--report", "127.0.0.1:9"]
        );
        let refs: Vec<&str> = node_args[1..].iter().map(String::as_str).collect();
        let node = parse(&refs).unwrap();
        assert!(node.node);
        assert_eq!(node.report.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(node.data_spec(), args.data_spec());
        assert_eq!(
            (
                node.optimizer,
                node.learning_rate(),
                node.epochs,
                node.batch
            ),
            (
                args.optimizer,
                args.learning_rate(),
                args.epochs,
                args.batch
            )
        );
    }

    #[test]
    fn bad_options_are_refused() {
        for bad in [
            &["--workers", "0"][..],
            &["--epochs", "-1"],
            &["--learning-rate", "0"],
            &["--learning-rate", "nan"],
            &["--label-noise", "0.5"],
            &["--test-fraction", "1"],
            &["--threshold", "1.5"],
            &["--optimizer", "adam"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        let tiny = parse(&["--samples", "3", "--test-fraction", "0.1"]).unwrap();
        assert!(tiny.check().is_err());
        let dense = parse(&["--features", "10", "--nnz", "11"]).unwrap();
        assert!(dense.check().is_err());
    }

    #[test]
    fn reports_round_trip_through_their_wire_form() {
        let reports = [
            Report::Progress {
                epoch: 2,
                done: 7,
                total: 90,
            },
            Report::Epoch {
                epoch: 3,
                loss: 0.123_456_789,
                accuracy: 0.9,
                secs: 1.5,
            },
            Report::Worker {
                rank: 1,
                samples: 90_000,
                requests: 905,
                pushed: 76_000_000,
                pulled: 140_000_000,
            },
            Report::Server {
                rank: 0,
                keys: 301_913,
                pushes: 900,
                pulls: 906,
            },
        ];
        for r in reports {
            assert_eq!(Report::parse(&r.to_string()), Some(r));
        }
        for junk in [
            "",
            "epoch",
            "epoch 1 2 3",
            "epoch x 1 2 3",
            "server 1 2 3 4 5",
            "hello",
        ] {
            assert_eq!(Report::parse(junk), None, "{junk:?}");
        }
        let line = Report::Epoch {
            epoch: 2,
            loss: 0.34921,
            accuracy: 0.89504,
            secs: 0.5,
        }
        .human(5);
        assert_eq!(
            line,
            "epoch 2/5  test loss 0.3492  accuracy 0.8950   0.50 s"
        );
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000), "1 000");
        assert_eq!(group(1_234_567), "1 234 567");
        assert_eq!(megabytes(426_400_000), "426.4 MB");
    }

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
