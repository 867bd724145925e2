//! `pslite checkpoint`: asks a running cluster's scheduler for a checkpoint
//! (its `PS_CHECKPOINT_DIR`), waits until every server has written its key
//! ranges and the scheduler its manifest, and prints where it is. The
//! checkpoint is taken at the workers' next barrier where none has a request
//! in flight, so it is consistent across servers; `--timeout` bounds the
//! wait. Exits 0 once it is complete, 1 if it was refused or failed (the
//! scheduler says why: no `PS_CHECKPOINT_DIR`, a C++ server, a server that
//! died or could not write), 2 on a bad setting or a scheduler that does
//! not answer.

use std::process::ExitCode;
use std::time::Duration;

/// Options of `pslite checkpoint`.
#[derive(clap::Args, Debug)]
pub struct CheckpointArgs {
    /// Where the scheduler is.
    #[command(flatten)]
    pub scheduler: crate::status::SchedulerAddr,
    /// A label stored in the checkpoint's manifest (e.g. "epoch 3").
    #[arg(long, default_value = "pslite checkpoint")]
    pub label: String,
    /// Seconds to wait for the checkpoint to be complete (it waits for the
    /// workers' next barrier).
    #[arg(long, default_value_t = 600.0, value_parser = seconds)]
    pub timeout: f64,
}

fn seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0 && v.is_finite())
        .ok_or_else(|| format!("expected a positive number of seconds, got {s:?}"))
}

/// How long the scheduler has to accept the request.
const ACCEPT: Duration = Duration::from_secs(5);

/// Runs `pslite checkpoint`.
pub fn main(args: &CheckpointArgs) -> ExitCode {
    let (mut client, scheduler) = match crate::status::connect("checkpoint", &args.scheduler) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let timeout = Duration::from_secs_f64(args.timeout);
    match client.checkpoint(&args.label, ACCEPT, timeout) {
        Ok(result) if result.error.is_empty() => {
            println!(
                "checkpoint {} written to {} ({} files, {} bytes, {} ms after its barrier)",
                result.id,
                result.dir,
                result.files.len(),
                result.files.iter().map(|f| f.size).sum::<u64>(),
                result.elapsed_ms
            );
            ExitCode::SUCCESS
        }
        Ok(result) => {
            if result.id == 0 {
                eprintln!(
                    "pslite checkpoint: refused by {scheduler}: {}",
                    result.error
                );
            } else {
                eprintln!(
                    "pslite checkpoint: checkpoint {} failed: {}",
                    result.id, result.error
                );
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("pslite checkpoint: {e}");
            ExitCode::from(2)
        }
    }
}
