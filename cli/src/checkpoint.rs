//! `pslite checkpoint`: asks a running cluster's scheduler for a checkpoint
//! (its `PS_CHECKPOINT_DIR`), waits until every server has written its key
//! ranges and the scheduler its manifest, and prints where it is. The
//! checkpoint is taken at the workers' next barrier where none has a request
//! in flight, so it is consistent across servers; `--timeout` bounds the
//! wait. Exits 0 once it is complete, 1 if it was refused or failed (the
//! scheduler says why: no `PS_CHECKPOINT_DIR`, a C++ server, a server that
//! died or could not write), 2 on a bad setting or a scheduler that does
//! not answer.
//!
//! `pslite checkpoint export DIR --out OUT` reads a complete checkpoint of
//! a `pslite.torch` job instead and writes its embedding tables as NumPy
//! files for serving (`checkpoint/export.rs`).

use std::process::ExitCode;
use std::time::Duration;

mod export;

/// Options of `pslite checkpoint`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CheckpointArgs {
    /// Instead of taking a checkpoint, export one.
    #[command(subcommand)]
    pub action: Option<CheckpointCommand>,
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

/// What `pslite checkpoint` does besides taking one.
#[derive(clap::Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Write a pslite.torch job's embedding tables from a complete
    /// checkpoint as NumPy files one process loads for inference
    /// (pslite.torch.load_tables): per table NAME.ids.npy (int64) and
    /// NAME.rows.npy (float32), and tables.json with each table's settings.
    /// Dense weights are not in checkpoints: save them with torch.save.
    ///
    /// Reads the files only (no running job needed). Exits 1 if the
    /// checkpoint is missing, damaged or holds no table.
    Export(export::ExportArgs),
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
    if let Some(CheckpointCommand::Export(export)) = &args.action {
        return match export::run(export) {
            Ok(said) => {
                println!("{said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pslite checkpoint export: {e}");
                ExitCode::FAILURE
            }
        };
    }
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
