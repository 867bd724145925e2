//! `pslite store get|set|add|wait|keys|delete|watch`: the job's key-value
//! store (hosted by a running cluster's scheduler) from a shell, for scripts
//! and debugging. Every command has a deadline; values are printed as they
//! are stored (bytes, then a newline if they lack one), except by `watch`,
//! which prints one line per event (text, or hex for other bytes).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pslite::proto::store::{Bytes, StoreMsg, StoreOp, StoreStatus};

/// Options of `pslite store`.
#[derive(clap::Args, Debug)]
pub struct StoreArgs {
    /// Where the scheduler is.
    #[command(flatten)]
    pub scheduler: crate::status::SchedulerAddr,
    /// Seconds to wait: for keys to be set (get, wait), and for the answer.
    #[arg(long, global = true, default_value_t = 10.0, value_parser = seconds)]
    pub timeout: f64,
    /// What to do.
    #[command(subcommand)]
    pub op: StoreCommand,
}

/// One store operation.
#[derive(clap::Subcommand, Debug)]
pub enum StoreCommand {
    /// Print KEY's value, waiting until it is set.
    Get {
        /// The key.
        key: String,
    },
    /// Set KEY to VALUE.
    Set {
        /// The key.
        key: String,
        /// The value (text).
        value: String,
    },
    /// Add DELTA to the integer in KEY (absent: 0); print the sum.
    Add {
        /// The key.
        key: String,
        /// What to add (may be negative).
        #[arg(allow_hyphen_values = true)]
        delta: i64,
    },
    /// Wait until every KEY is set.
    Wait {
        /// The keys.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Print every key, one a line.
    Keys,
    /// Delete KEY (exit 1 if it did not exist).
    Delete {
        /// The key.
        key: String,
    },
    /// Print every later set and delete of KEY, in order, one a line
    /// ("VERSION set VALUE" or "VERSION deleted"; VALUE as text, or 0x and
    /// hex if it is not printable text), until COUNT events or the timeout.
    Watch {
        /// The key.
        key: String,
        /// Stop after this many events (exit 1 if the timeout comes first);
        /// without it, watch until the timeout and exit 0.
        #[arg(long)]
        count: Option<u64>,
    },
}

fn seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0 && v.is_finite())
        .ok_or_else(|| format!("expected a positive number of seconds, got {s:?}"))
}

/// Runs `pslite store`.
pub fn main(args: &StoreArgs) -> ExitCode {
    let (mut client, scheduler) = match crate::status::connect("store", &args.scheduler) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let timeout = Duration::from_secs_f64(args.timeout);
    if let StoreCommand::Watch { key, count } = &args.op {
        return watch(&mut client, key, *count, timeout);
    }
    let one = |op, key: &String| StoreMsg::request(op, vec![key.clone()]);
    let req = match &args.op {
        StoreCommand::Get { key } => StoreMsg {
            timeout: Some(timeout),
            ..one(StoreOp::Get, key)
        },
        StoreCommand::Set { key, value } => StoreMsg {
            value: Some(Bytes::from(value.clone())),
            ..one(StoreOp::Set, key)
        },
        StoreCommand::Add { key, delta } => StoreMsg {
            number: *delta,
            ..one(StoreOp::Add, key)
        },
        StoreCommand::Wait { keys } => StoreMsg {
            timeout: Some(timeout),
            ..StoreMsg::request(StoreOp::Wait, keys.clone())
        },
        StoreCommand::Keys => StoreMsg::request(StoreOp::Keys, Vec::new()),
        StoreCommand::Delete { key } => one(StoreOp::Delete, key),
        StoreCommand::Watch { .. } => return ExitCode::FAILURE,
    };
    // A waiting request is answered at its timeout: the client allows for
    // that once the scheduler accepted the connection (a dead port fails at
    // the timeout).
    let answer = match client.store(req, timeout) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pslite store: {e}");
            return ExitCode::FAILURE;
        }
    };
    report(&args.op, answer, &scheduler, args.timeout)
}

fn report(op: &StoreCommand, answer: StoreMsg, scheduler: &str, secs: f64) -> ExitCode {
    match answer.status {
        StoreStatus::Ok => {}
        StoreStatus::Timeout => {
            let keys: Vec<String> = answer.keys.iter().map(|k| format!("{k:?}")).collect();
            eprintln!(
                "pslite store: {} not set within {secs} s (scheduler {scheduler})",
                keys.join(", ")
            );
            return ExitCode::FAILURE;
        }
        StoreStatus::Invalid => {
            eprintln!(
                "pslite store: the scheduler refused: {}",
                answer.error.as_deref().unwrap_or("no reason given")
            );
            return ExitCode::FAILURE;
        }
    }
    let mut out = std::io::stdout().lock();
    let written = match op {
        StoreCommand::Get { .. } => {
            let value = answer.value.unwrap_or_default();
            out.write_all(&value).and_then(|()| {
                if value.ends_with(b"\n") {
                    Ok(())
                } else {
                    out.write_all(b"\n")
                }
            })
        }
        StoreCommand::Add { .. } => writeln!(out, "{}", answer.number),
        StoreCommand::Keys => answer.keys.iter().try_for_each(|k| writeln!(out, "{k}")),
        StoreCommand::Delete { key } if !answer.found => {
            eprintln!("pslite store: key {key:?} does not exist");
            return ExitCode::FAILURE;
        }
        StoreCommand::Set { .. }
        | StoreCommand::Wait { .. }
        | StoreCommand::Delete { .. }
        | StoreCommand::Watch { .. } => Ok(()),
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pslite store: cannot write the answer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `pslite store watch`: watches `key` for up to `timeout` (the scheduler
/// ends the watch then too, so a client that vanished holds nothing) and
/// prints its events in version order.
fn watch(
    client: &mut pslite::admin::AdminClient,
    key: &str,
    count: Option<u64>,
    timeout: Duration,
) -> ExitCode {
    let deadline = Instant::now() + timeout;
    let mut req = StoreMsg::request(StoreOp::Watch, vec![key.to_string()]);
    req.timeout = Some(timeout);
    let answer = match client.store(req, timeout.min(Duration::from_secs(10))) {
        Ok(a) if a.status == StoreStatus::Ok => a,
        Ok(a) => {
            eprintln!(
                "pslite store: the scheduler refused: {}",
                a.error.as_deref().unwrap_or("no reason given")
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("pslite store: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "pslite store: watching {key:?} (version {})",
        answer.version
    );
    // Each event comes on a connection of its own: put them back in order.
    let mut next = answer.version + 1;
    let mut early: BTreeMap<u64, StoreMsg> = BTreeMap::new();
    let mut printed = 0;
    let mut out = std::io::stdout().lock();
    let mut code = ExitCode::SUCCESS;
    while count.is_none_or(|n| printed < n) {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = match client.store_event(left) {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(e) => {
                eprintln!("pslite store: {e}");
                code = ExitCode::FAILURE;
                break;
            }
        };
        if event.key() != key || event.version < next {
            continue;
        }
        early.insert(event.version, event);
        while let Some(e) = early.remove(&next) {
            let line = match (e.found, e.value) {
                (true, v) => format!("{} set {}", e.version, printable(&v.unwrap_or_default())),
                (false, _) => format!("{} deleted", e.version),
            };
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return ExitCode::FAILURE;
            }
            next += 1;
            printed += 1;
        }
    }
    drop(out);
    // Best effort: the scheduler ends the watch at the timeout anyway.
    let _ = client.store(
        StoreMsg::request(StoreOp::Unwatch, vec![key.to_string()]),
        Duration::from_secs(2),
    );
    if let Some(n) = count.filter(|&n| printed < n) {
        eprintln!(
            "pslite store: saw {printed} of {n} events of {key:?} within {} s",
            timeout.as_secs_f64()
        );
        return ExitCode::FAILURE;
    }
    code
}

/// `value` as text if it is printable UTF-8, else `0x` and hex.
fn printable(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => {
            let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}")
        }
    }
}
