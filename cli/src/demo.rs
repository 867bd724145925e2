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
//!   TCP connection (`--report`, one JSON line per [`Report`](report::Report)); it prints
//!   one line per epoch, then the final accuracy, the wall time and the
//!   bytes moved, and exits 1 if the accuracy is below `--threshold`.
//!
//! "Bytes moved" counts the keys (8 bytes) and values (4 bytes) in the data
//! frames of every request and response of the workers, training and
//! evaluation: a push sends keys and gradients, a pull sends keys and gets
//! keys and weights back. Message headers are not counted.
//!
//! The parts: [`args`] (the options), [`node`] (the nodes' code),
//! [`report`] (what nodes tell the launching process), [`cluster`] (the
//! launching process; `churn.rs` the workers it adds and kills and the
//! server it kills), [`progress`] (the bar), [`data`], [`model`] and
//! [`plot`].
//!
//! A node run without `--report` (for example by
//! `pslite launch -s 2 -w 2 -- pslite demo --node`) prints its reports
//! itself, and worker 0 fails if the accuracy is below the threshold.

pub mod args;
mod churn;
pub mod cluster;
pub mod data;
pub mod model;
pub mod node;
pub mod plot;
pub mod progress;
pub mod report;
pub mod ssp;

use std::process::ExitCode;

pub use args::DemoArgs;

/// Runs `pslite demo`: the whole cluster, or with `--node` one node of it.
pub fn main(args: &DemoArgs) -> ExitCode {
    if args.node {
        return pslite::exit_code(node::run_node(args));
    }
    if let Err(e) = args.check() {
        eprintln!("pslite demo: {e}");
        return ExitCode::from(pslite::EXIT_CONFIG);
    }
    match cluster::run_cluster(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pslite demo: {e}");
            ExitCode::FAILURE
        }
    }
}
