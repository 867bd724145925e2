//! `kv_loss`: what lost messages cost a replicated job, measured side by
//! side with the same job without loss.
//!
//! It launches `kv_replicas` (3 servers, 2 workers, `PS_REPLICAS=2`,
//! `PS_RESEND=1`, `PS_HEARTBEAT_INTERVAL=1`, `PS_HEARTBEAT_TIMEOUT=2`)
//! through `pslite launch` (found next to the examples directory), once
//! without loss and once with `PS_DROP_MSG`, alternating, `--runs` times
//! each, and prints one line per launch and a summary:
//!
//! ```text
//! cargo build --release --bins --examples
//! target/release/examples/kv_loss --runs 20 --rounds 300
//! RESULT loss drop_pct=10 rounds=300 runs=20 exact_runs=20 loss_free_rounds_per_s=.. \
//!   lossy_rounds_per_s=.. ratio=.. false_deaths=0 longest_round_ms=..
//! ```
//!
//! A job's pace is its slower worker's rounds per second (the push loop
//! only: start-up and the final check are not counted); the summary gives
//! the medians over the runs. A run is exact when every worker read every
//! key back as rounds x workers and every process exited 0. A false death
//! is a node the scheduler declared dead (nobody is killed here), or a node
//! that stopped for a lost scheduler.

use clap::Parser;
use std::process::{Command, ExitCode, Stdio};

#[derive(Parser)]
#[command(about = "kv_replicas with and without message loss, side by side")]
struct Args {
    /// Launches of each kind.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Rounds each worker pushes (`KV_ROUNDS`).
    #[arg(long, default_value_t = 300)]
    rounds: u64,
    /// Pause between rounds in ms (`KV_ROUND_MS`).
    #[arg(long, default_value_t = 10)]
    round_ms: u64,
    /// Percentage of messages lost (`PS_DROP_MSG`).
    #[arg(long, default_value_t = 10)]
    drop_pct: u32,
    /// Each launch's time limit in seconds (`pslite launch --timeout`).
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

/// What one launch showed.
struct Launched {
    exact: bool,
    /// The slower worker's rounds per second.
    rounds_per_s: f64,
    false_deaths: usize,
    longest_round_ms: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kv_loss: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let examples = exe.parent().ok_or("this program has no directory")?;
    let pslite = examples
        .parent()
        .map(|dir| dir.join("pslite"))
        .filter(|p| p.exists())
        .ok_or("no pslite binary next to the examples directory: cargo build --release --bins")?;
    let program = examples.join("kv_replicas");
    let mut clean = Vec::new();
    let mut lossy = Vec::new();
    for i in 0..args.runs {
        for drop in [0, args.drop_pct] {
            let r = launch(args, &pslite, &program, drop)?;
            println!(
                "run {} drop_pct={drop} exact={} rounds_per_s={:.1} false_deaths={} \
                 longest_round_ms={}",
                i + 1,
                r.exact,
                r.rounds_per_s,
                r.false_deaths,
                r.longest_round_ms
            );
            if drop == 0 { &mut clean } else { &mut lossy }.push(r);
        }
    }
    let rate = |v: &[Launched]| median(v.iter().map(|r| r.rounds_per_s).collect());
    let (clean_rate, lossy_rate) = (rate(&clean), rate(&lossy));
    println!(
        "RESULT loss drop_pct={} rounds={} runs={} exact_runs={} loss_free_rounds_per_s={:.1} \
         lossy_rounds_per_s={:.1} ratio={:.2} false_deaths={} longest_round_ms={}",
        args.drop_pct,
        args.rounds,
        args.runs,
        lossy.iter().filter(|r| r.exact).count(),
        clean_rate,
        lossy_rate,
        if clean_rate > 0.0 {
            lossy_rate / clean_rate
        } else {
            0.0
        },
        lossy.iter().map(|r| r.false_deaths).sum::<usize>(),
        lossy.iter().map(|r| r.longest_round_ms).max().unwrap_or(0)
    );
    Ok(())
}

/// One `pslite launch` of the job with `drop` percent of messages lost.
fn launch(
    args: &Args,
    pslite: &std::path::Path,
    program: &std::path::Path,
    drop: u32,
) -> Result<Launched, String> {
    let workers = 2;
    let out = Command::new(pslite)
        .args(["launch", "--servers", "3", "--workers", "2", "--timeout"])
        .arg(args.timeout.to_string())
        .arg("--")
        .arg(program)
        .env("PS_REPLICAS", "2")
        .env("PS_RESEND", "1")
        .env("PS_DROP_MSG", drop.to_string())
        .env("PS_HEARTBEAT_INTERVAL", "1")
        .env("PS_HEARTBEAT_TIMEOUT", "2")
        .env("KV_ROUNDS", args.rounds.to_string())
        .env("KV_ROUND_MS", args.round_ms.to_string())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", pslite.display()))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let mut rates = Vec::new();
    let mut longest = 0;
    for line in text.lines() {
        let Some(rest) = line.split_once(" pushed ").map(|(_, r)| r) else {
            continue;
        };
        // "N rounds in S s, longest round M ms"
        let words: Vec<&str> = rest.split_whitespace().collect();
        let rounds = words.first().and_then(|w| w.parse::<f64>().ok());
        let secs = words.get(3).and_then(|w| w.parse::<f64>().ok());
        if let (Some(rounds), Some(secs)) = (rounds, secs) {
            rates.push(if secs > 0.0 { rounds / secs } else { 0.0 });
        }
        if let Some(ms) = words.get(7).and_then(|w| w.parse::<u64>().ok()) {
            longest = longest.max(ms);
        }
    }
    let false_deaths = text
        .lines()
        .filter(|l| l.contains(" is dead (") || l.contains("lost the scheduler"))
        .count();
    let exact = out.status.success() && text.matches(" exact: ").count() == workers;
    if !exact {
        eprintln!("a launch with drop_pct={drop} was not exact:\n{text}");
    }
    // A launch that did not finish counts at pace 0.
    let slower = rates.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(Launched {
        exact,
        rounds_per_s: if rates.len() == workers { slower } else { 0.0 },
        false_deaths,
        longest_round_ms: longest,
    })
}

/// The median of `v` (0 if empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
