//! The options of `pslite demo`, checked, and the arguments each node gets.
//!
//! To add an option: a field of [`DemoArgs`] (with its parser, if clap's
//! own is not strict enough), a rule in [`DemoArgs::check`] if it depends on
//! others, and a pair in [`DemoArgs::node_args`] if the nodes need it (the
//! launching process's own options, such as `--elastic` or `--plot`, stay
//! there).

use std::ffi::OsString;

use pslite::Error;

use super::data::DataSpec;
use super::model::Optimizer;
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
    /// kills the worker of rank --kill-worker with SIGKILL after epoch
    /// --kill-after (once the added worker trains). Workers re-shard the data at every new
    /// round, and the output says when each round began and with whom.
    #[arg(long)]
    pub elastic: bool,
    /// With --elastic: add a worker after this epoch (0: no worker is added).
    #[arg(long, default_value_t = 1, value_name = "EPOCH")]
    pub join_after: usize,
    /// With --elastic or --kill-server: kill after this epoch (0: none is
    /// killed).
    #[arg(long, default_value_t = 2, value_name = "EPOCH")]
    pub kill_after: usize,
    /// With --elastic: which worker to kill, by its rank in the round
    /// running then (the round lines show each rank's node id).
    #[arg(long, default_value_t = 1, value_name = "RANK")]
    pub kill_worker: usize,
    /// Copies of each key range, on that many servers (PS_REPLICAS): with
    /// 2 or more, a server's death loses no update and the job goes on
    /// with the others. 1 is ps-lite's way: one copy.
    #[arg(long, default_value_t = 1, value_parser = positive, value_name = "K")]
    pub replicas: usize,
    /// Kill the server of this rank with SIGKILL after epoch --kill-after
    /// (needs --replicas 2 or more); the output shows the failover: which
    /// key ranges moved where, and when.
    #[arg(long, value_name = "RANK")]
    pub kill_server: Option<usize>,
    /// Write a checkpoint of the model to DIR after every epoch
    /// (PS_CHECKPOINT_DIR); a run with --resume starts from the last one.
    /// Without --resume, DIR must hold no checkpoint.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// With --checkpoint-dir: restore the newest checkpoint in DIR and train
    /// the epochs after it.
    #[arg(long)]
    pub resume: bool,
    /// The epoch the restored checkpoint was written after (set by `pslite
    /// demo --resume` itself).
    #[arg(long, hide = true, default_value_t = 0)]
    pub resume_epoch: usize,
    /// Compress the workers' gradients: onebit, topk[:K], randomk[:K] or
    /// 2bit[:THRESHOLD] (K a fraction below 1 or a count; error feedback
    /// on). The output then says how many bytes crossed the wire.
    #[arg(long, value_name = "NAME", value_parser = compression)]
    pub compression: Option<pslite::Compression>,
    /// Bounded staleness: no worker runs more than S iterations ahead of
    /// the slowest (PS_STALENESS; 0 is synchronous), or `none`
    /// (asynchronous). With it or --slow-worker, workers train without
    /// barriers between epochs, worker 0 evaluates every quarter epoch, and
    /// the output ends with the time to --threshold (`RESULT staleness`).
    #[arg(long, value_name = "S", value_parser = bound)]
    pub staleness: Option<Bound>,
    /// Slow the worker of this rank by --slow-ms per iteration (a
    /// straggler).
    #[arg(long, value_name = "RANK")]
    pub slow_worker: Option<usize>,
    /// With --slow-worker: milliseconds it sleeps per iteration.
    #[arg(long, default_value_t = 20, value_name = "MS")]
    pub slow_ms: u64,
    /// Every worker sleeps a random time per iteration, exponentially
    /// distributed with this mean in milliseconds (jitter, as on shared
    /// machines; 0: none). Implies the --staleness way of training.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub jitter_ms: u64,
    /// Run as one node of the cluster (set by `pslite demo` itself).
    #[arg(long, hide = true)]
    pub node: bool,
    /// Where a node sends its reports (host:port of the launching process).
    #[arg(long, hide = true, value_name = "ADDR")]
    pub report: Option<String>,
}

/// `--staleness`: a bound, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound(pub Option<u64>);

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(s) => write!(f, "{s}"),
            None => f.write_str("none"),
        }
    }
}

fn bound(s: &str) -> Result<Bound, String> {
    match s.trim() {
        "none" | "inf" | "unbounded" => Ok(Bound(None)),
        n => n
            .parse::<u64>()
            .map(|s| Bound(Some(s)))
            .map_err(|_| "expected a whole number of at least 0, or none".into()),
    }
}

fn compression(s: &str) -> Result<pslite::Compression, String> {
    s.parse().map_err(|e: Error| e.to_string())
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

    /// Whether workers train as `--staleness`/`--slow-worker` say (no
    /// barriers between epochs, the time to the threshold measured).
    pub fn staleness_mode(&self) -> bool {
        self.staleness.is_some() || self.slow_worker.is_some() || self.jitter_ms > 0
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
        // The cluster's shape is the launching process's to check: a node
        // learns it from its environment.
        if !self.node {
            self.check_cluster()?;
        }
        if self.nnz as u64 > self.features {
            return Err(Error::InvalidInput(format!(
                "--nnz {} is more than the {} features",
                self.nnz, self.features
            )));
        }
        Ok(())
    }

    /// The rules on `--servers`, `--workers` and what is killed.
    fn check_cluster(&self) -> Result<(), Error> {
        if let Some(rank) = self.slow_worker.filter(|&r| r >= self.workers) {
            return Err(Error::InvalidInput(format!(
                "--slow-worker {rank} is not a rank of the {} workers (0 to {})",
                self.workers,
                self.workers - 1
            )));
        }
        if self.staleness_mode()
            && (self.elastic || self.checkpoint_dir.is_some() || self.replicas > 1)
        {
            return Err(Error::InvalidInput(
                "--staleness and --slow-worker do not go with --elastic, --checkpoint-dir or \
                 --replicas in the demo"
                    .into(),
            ));
        }
        if self.resume && self.checkpoint_dir.is_none() {
            return Err(Error::InvalidInput(
                "--resume needs --checkpoint-dir DIR (where the checkpoints are)".into(),
            ));
        }
        if self.checkpoint_dir.is_some() && self.elastic {
            return Err(Error::InvalidInput(
                "--checkpoint-dir does not go with --elastic in the demo".into(),
            ));
        }
        if self.elastic && self.kill_after > 0 && self.kill_worker >= self.workers {
            return Err(Error::InvalidInput(format!(
                "--kill-worker {} is not a rank of the {} workers started (0 to {})",
                self.kill_worker,
                self.workers,
                self.workers - 1
            )));
        }
        if self.replicas > self.servers {
            return Err(Error::InvalidInput(format!(
                "--replicas {} is more than the {} servers: each copy of a key range is on \
                 another server (use --servers {} or more)",
                self.replicas, self.servers, self.replicas
            )));
        }
        if let Some(rank) = self.kill_server {
            if self.replicas < 2 {
                return Err(Error::InvalidInput(format!(
                    "--kill-server {rank} needs --replicas 2 or more: with one copy, the killed \
                     server's key ranges are lost and the job fails"
                )));
            }
            if rank >= self.servers {
                return Err(Error::InvalidInput(format!(
                    "--kill-server {rank} is not a rank of the {} servers (0 to {})",
                    self.servers,
                    self.servers - 1
                )));
            }
            if self.kill_after == 0 || self.kill_after >= self.epochs {
                return Err(Error::InvalidInput(format!(
                    "--kill-server needs --kill-after between 1 and {} (the epochs before the \
                     last), got {}",
                    self.epochs.saturating_sub(1),
                    self.kill_after
                )));
            }
        }
        Ok(())
    }

    /// The arguments of every node: these options, resolved, with `--node`
    /// and the report address.
    pub fn node_args(&self, report: &str) -> Vec<OsString> {
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
            ("--replicas", self.replicas.to_string()),
        ] {
            args.extend([name.to_string(), value]);
        }
        if let Some(c) = &self.compression {
            args.extend(["--compression".into(), c.to_string()]);
        }
        if let Some(s) = &self.staleness {
            args.extend(["--staleness".into(), s.to_string()]);
        }
        if self.jitter_ms > 0 {
            args.extend(["--jitter-ms".into(), self.jitter_ms.to_string()]);
        }
        if let Some(r) = self.slow_worker {
            args.extend(["--slow-worker".into(), r.to_string()]);
            args.extend(["--slow-ms".into(), self.slow_ms.to_string()]);
        }
        if let Some(dir) = &self.checkpoint_dir {
            args.extend(["--checkpoint-dir".into(), dir.display().to_string()]);
            args.extend(["--resume-epoch".into(), self.resume_epoch.to_string()]);
        }

        args.into_iter().map(OsString::from).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    /// `pslite demo ARGS`, parsed.
    pub(crate) fn parse(args: &[&str]) -> Result<DemoArgs, clap::Error> {
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

        let args = parse(&[
            "--optimizer",
            "adagrad",
            "--seed",
            "7",
            "-e",
            "3",
            "--compression",
            "topk:0.1",
            "--staleness",
            "2",
            "--slow-worker",
            "1",
            "--slow-ms",
            "7",
        ])
        .unwrap();
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
        assert_eq!(node.compression, args.compression);
        assert_eq!(
            (node.staleness, node.slow_worker, node.slow_ms),
            (Some(Bound(Some(2))), Some(1), 7)
        );
        assert!(node.staleness_mode());
        assert_eq!(
            node.compression.map(|c| c.to_string()).as_deref(),
            Some("topk:0.1")
        );
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
            &["--compression", "zip"],
            &["--compression", "topk:0"],
            &["--staleness", "-1"],
            &["--staleness", "x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        let tiny = parse(&["--samples", "3", "--test-fraction", "0.1"]).unwrap();
        assert!(tiny.check().is_err());
        let dense = parse(&["--features", "10", "--nnz", "11"]).unwrap();
        assert!(dense.check().is_err());
        for bad in [
            &["--replicas", "3"][..],
            &["--kill-server", "0"],
            &["--replicas", "2", "--kill-server", "2"],
            &["--replicas", "2", "--kill-server", "0", "--kill-after", "0"],
            &["--replicas", "2", "--kill-server", "0", "--kill-after", "5"],
            &["--slow-worker", "2"],
            &["--staleness", "2", "--elastic"],
        ] {
            let args = parse(bad).unwrap();
            assert!(args.check().is_err(), "{bad:?} accepted");
        }
        let ok = parse(&[
            "--servers",
            "3",
            "--replicas",
            "3",
            "--kill-server",
            "1",
            "--kill-after",
            "2",
        ])
        .unwrap();
        ok.check().unwrap();
        // A node gets the options without the cluster's shape, and passes.
        let node_args: Vec<String> = ok
            .node_args("127.0.0.1:9")
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let refs: Vec<&str> = node_args[1..].iter().map(String::as_str).collect();
        let node = parse(&refs).unwrap();
        assert_eq!(node.replicas, 3);
        node.check().unwrap();
    }
}
