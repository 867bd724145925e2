//! `pslite status`: asks a running cluster's scheduler for its node table
//! and every node's counters, and prints them (or JSON for scripts).
//!
//! Nodes send their counters with their heartbeats, so the counters are as
//! fresh as `PS_HEARTBEAT_INTERVAL`; a node whose last report is older than
//! `--stale` seconds is shown as not answering. The request itself has a
//! deadline (`--timeout`): a scheduler that is gone never blocks the command,
//! and `--watch` stops (exit 1) once the scheduler has not answered for
//! `--stale` seconds (the job ended). A scheduler that refuses the client's
//! `PS_AUTH_TOKEN` (or its lack of one) is named at once.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pslite::admin::{AdminClient, AdminError};
use pslite::proto::K_EMPTY;
use pslite::{ids, NodeStatus, Role};

/// Options of `pslite status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The scheduler's host [default: DMLC_PS_ROOT_URI, else 127.0.0.1].
    #[arg(long)]
    pub host: Option<String>,
    /// The scheduler's port [default: DMLC_PS_ROOT_PORT].
    #[arg(long)]
    pub port: Option<u16>,
    /// The address of this machine the scheduler answers to [default: the
    /// one on the route to the scheduler].
    #[arg(long)]
    pub reply_host: Option<String>,
    /// Seconds to wait for the scheduler's answer. (With DMLC_LOCAL=1 the
    /// scheduler is reached over ipc:///tmp/PORT.)
    #[arg(long, default_value_t = 2.0, value_parser = seconds)]
    pub timeout: f64,
    /// Counters older than this many seconds mark a node as not answering;
    /// with --watch, a scheduler silent this long ends the command (exit 1).
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    pub stale: f64,
    /// Print JSON (one object) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECS seconds until interrupted, or until the scheduler
    /// has not answered for --stale seconds (exit 1).
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2", value_parser = seconds)]
    pub watch: Option<f64>,
}

fn seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0 && v.is_finite())
        .ok_or_else(|| format!("expected a positive number of seconds, got {s:?}"))
}

/// An admin client of the scheduler at `host`/`port` (defaults:
/// DMLC_PS_ROOT_URI, else 127.0.0.1, and DMLC_PS_ROOT_PORT; over IPC for a
/// `DMLC_LOCAL=1` cluster), and the scheduler's address for messages. On a
/// bad setting, says so as `pslite <command>` and gives the exit code.
pub fn connect(
    command: &str,
    host: Option<&str>,
    port: Option<u16>,
    reply_host: Option<&str>,
) -> Result<(AdminClient, String), ExitCode> {
    let host = host
        .map(str::to_string)
        .or_else(|| std::env::var("DMLC_PS_ROOT_URI").ok())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = match port {
        Some(p) => p,
        None => match std::env::var("DMLC_PS_ROOT_PORT")
            .map(|v| pslite::config::parse_numeric("DMLC_PS_ROOT_PORT", &v))
        {
            Ok(Ok(p)) => p as u16,
            Ok(Err(e)) => {
                eprintln!("pslite {command}: {e}; or pass --port");
                return Err(ExitCode::from(2));
            }
            Err(_) => {
                eprintln!(
                    "pslite {command}: which scheduler? pass --port (and --host), or set \
                     DMLC_PS_ROOT_PORT (and DMLC_PS_ROOT_URI)"
                );
                return Err(ExitCode::from(2));
            }
        },
    };
    // A DMLC_LOCAL=1 cluster's scheduler listens on ipc:///tmp/<port>; a
    // cluster with PS_AUTH_TOKEN answers only clients that present it.
    let local = matches!(
        std::env::var("DMLC_LOCAL").ok().as_deref().map(str::trim),
        Some("1" | "true")
    );
    let token = std::env::var("PS_AUTH_TOKEN").ok();
    match crate::launcher::admin_client(&host, port, local, token.as_deref(), reply_host) {
        Ok(c) => Ok((c, format!("{host}:{port}"))),
        Err(e) => {
            eprintln!("pslite {command}: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// Runs `pslite status`.
pub fn main(args: &StatusArgs) -> ExitCode {
    let (mut client, scheduler) = match connect(
        "status",
        args.host.as_deref(),
        args.port,
        args.reply_host.as_deref(),
    ) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let timeout = Duration::from_secs_f64(args.timeout);
    let stale = Duration::from_secs_f64(args.stale);
    let Some(interval) = args.watch else {
        return match client.status(timeout) {
            Ok(rows) => {
                print!("{}", render(&scheduler, &rows, stale, args.json));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pslite status: {e}");
                ExitCode::FAILURE
            }
        };
    };
    let clear = std::io::stdout().is_terminal() && !args.json;
    // When the scheduler last answered (or the watch began).
    let mut last_answer = Instant::now();
    loop {
        // Never wait past the moment the scheduler counts as gone.
        let left = stale.saturating_sub(last_answer.elapsed());
        let text = match client.status(timeout.min(left).max(MIN_ASK)) {
            Ok(rows) => {
                last_answer = Instant::now();
                render(&scheduler, &rows, stale, args.json)
            }
            Err(e @ AdminError::Refused { .. }) => {
                eprintln!("pslite status: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) if last_answer.elapsed() >= stale => {
                eprintln!(
                    "pslite status: {e}\npslite status: the scheduler at {scheduler} has not \
                     answered for {:.1} s (--stale {}): the job has ended or the scheduler is \
                     gone; stopping",
                    last_answer.elapsed().as_secs_f64(),
                    args.stale
                );
                return ExitCode::FAILURE;
            }
            Err(e) => format!("pslite status: {e}\n"),
        };
        let mut out = std::io::stdout().lock();
        if clear {
            let _ = write!(out, "\x1b[2J\x1b[H");
        }
        let _ = write!(out, "{text}");
        let _ = out.flush();
        drop(out);
        // A refresh period, not synchronisation.
        let left = stale.saturating_sub(last_answer.elapsed());
        std::thread::sleep(Duration::from_secs_f64(interval).min(left));
    }
}

/// The shortest wait for an answer in `--watch` (the last one before
/// `--stale` runs out still asks).
const MIN_ASK: Duration = Duration::from_millis(100);

/// The status as tables for people, or as JSON.
pub fn render(scheduler: &str, rows: &[NodeStatus], stale: Duration, json: bool) -> String {
    if json {
        return to_json(scheduler, rows, stale);
    }
    let count = |role| {
        rows.iter()
            .filter(|r| r.node.role == role && !r.waiting)
            .count()
    };
    let waiting = rows.iter().filter(|r| r.waiting).count();
    let mut out = format!(
        "cluster at {scheduler}: {} server{}, {} worker{}\n\n",
        count(Role::Server),
        if count(Role::Server) == 1 { "" } else { "s" },
        count(Role::Worker),
        if count(Role::Worker) == 1 { "" } else { "s" },
    );
    if waiting > 0 {
        out.insert_str(
            out.len() - 2,
            &format!(" ({waiting} waiting for the next round)"),
        );
    }
    let _ = writeln!(
        out,
        "{:>4}  {:<9}  {:>4}  {:<21}  {:>10}  state",
        "id", "role", "rank", "address", "last heard"
    );
    for r in rows {
        let n = &r.node;
        let heard = r.last_seen.map_or("-".into(), ago);
        let _ = writeln!(
            out,
            "{:>4}  {:<9}  {:>4}  {:<21}  {:>10}  {}",
            id(n.id),
            n.role.as_str(),
            r.round_rank
                .map_or_else(|| rank(n.id), |rank| rank.to_string()),
            n.address(),
            heard,
            state(r, stale)
        );
    }
    let _ = writeln!(
        out,
        "\n{:>4}  {:>9}  {:>10}  {:>9}  {:>10}  {:>9}  {:>7}  {:>5}  {:>12}  counters",
        "id",
        "msgs sent",
        "bytes sent",
        "msgs recv",
        "bytes recv",
        "in flight",
        "resends",
        "drops",
        "handler time"
    );
    for r in rows {
        let Some(c) = &r.counters else {
            let _ = writeln!(
                out,
                "{:>4}  (none yet: nodes send counters with their heartbeats, PS_HEARTBEAT_INTERVAL)",
                id(r.node.id)
            );
            continue;
        };
        let age = r.counters_age.unwrap_or_default();
        let fresh = if r.node.id == ids::SCHEDULER {
            "now".to_string()
        } else if age > stale {
            format!("NO ANSWER for {}", secs(age))
        } else {
            format!("{} old", secs(age))
        };
        let _ = writeln!(
            out,
            "{:>4}  {:>9}  {:>10}  {:>9}  {:>10}  {:>9}  {:>7}  {:>5}  {:>12}  {fresh}",
            id(r.node.id),
            c.messages_sent(),
            bytes(c.bytes_sent()),
            c.messages_received(),
            bytes(c.bytes_received()),
            c.requests_in_flight,
            c.resends,
            c.dropped(),
            secs(Duration::from_nanos(c.handler_nanos)),
        );
    }
    out
}

fn id(id: i32) -> String {
    if id == K_EMPTY {
        "-".into()
    } else {
        id.to_string()
    }
}

fn rank(id: i32) -> String {
    match ids::role_of_id(id) {
        Some(Role::Server) | Some(Role::Worker) => ids::id_to_rank(id).to_string(),
        _ => "-".into(),
    }
}

fn state(r: &NodeStatus, stale: Duration) -> String {
    let mut s = if r.node.id == K_EMPTY {
        "registered (cluster not formed yet)".to_string()
    } else if r.waiting {
        "waiting for the next round".to_string()
    } else if r.dead {
        "DEAD".to_string()
    } else {
        "alive".to_string()
    };
    if r.node.is_recovery {
        s += ", recovered";
    }
    if r.node.id != ids::SCHEDULER && r.counters_age.is_some_and(|a| a > stale) {
        s += ", not answering";
    }
    s
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn ago(d: Duration) -> String {
    format!("{} ago", secs(d))
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} GB", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} MB", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} kB", n as f64 / 1e3),
        n => format!("{n} B"),
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            c if (c as u32) < 0x20 => out += &format!("\\u{:04x}", c as u32),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn opt_ms(d: Option<Duration>) -> String {
    d.map_or("null".into(), |d| d.as_millis().to_string())
}

fn to_json(scheduler: &str, rows: &[NodeStatus], stale: Duration) -> String {
    let nodes: Vec<String> = rows
        .iter()
        .map(|r| {
            let n = &r.node;
            let counters = match &r.counters {
                None => "null".to_string(),
                Some(c) => {
                    let peers: Vec<String> = c
                        .peers
                        .iter()
                        .map(|p| {
                            format!(
                                "{{\"peer\":{},\"messages_sent\":{},\"bytes_sent\":{},\
                                 \"messages_received\":{},\"bytes_received\":{}}}",
                                p.peer,
                                p.messages_sent,
                                p.bytes_sent,
                                p.messages_received,
                                p.bytes_received
                            )
                        })
                        .collect();
                    format!(
                        "{{\"messages_sent\":{},\"bytes_sent\":{},\"messages_received\":{},\
                         \"bytes_received\":{},\"requests_in_flight\":{},\"resends\":{},\
                         \"dropped\":{{\"malformed\":{},\"unknown_peer\":{},\"injected\":{},\
                         \"duplicate\":{}}},\"handler_calls\":{},\"handler_ns\":{},\
                         \"uptime_ms\":{},\"peers\":[{}]}}",
                        c.messages_sent(),
                        c.bytes_sent(),
                        c.messages_received(),
                        c.bytes_received(),
                        c.requests_in_flight,
                        c.resends,
                        c.dropped_malformed,
                        c.dropped_unknown_peer,
                        c.dropped_injected,
                        c.dropped_duplicate,
                        c.handler_calls,
                        c.handler_nanos,
                        c.uptime.as_millis(),
                        peers.join(",")
                    )
                }
            };
            let answering = n.id == ids::SCHEDULER || r.counters_age.is_some_and(|a| a <= stale);
            format!(
                "{{\"id\":{},\"role\":\"{}\",\"rank\":{},\"host\":{},\"port\":{},\
                 \"last_seen_ms\":{},\"dead\":{},\"waiting\":{},\"recovered\":{},\"answering\":{answering},\
                 \"counters_age_ms\":{},\"counters\":{counters}}}",
                if n.id == K_EMPTY {
                    "null".into()
                } else {
                    n.id.to_string()
                },
                n.role,
                match (r.round_rank, rank(n.id).parse::<i32>()) {
                    (Some(rank), _) => rank.to_string(),
                    (None, Ok(rank)) => rank.to_string(),
                    (None, Err(_)) => "null".into(),
                },
                json_string(&n.hostname),
                n.port,
                opt_ms(r.last_seen),
                r.dead,
                r.waiting,
                n.is_recovery,
                opt_ms(r.counters_age),
            )
        })
        .collect();
    format!(
        "{{\"scheduler\":{},\"nodes\":[{}]}}\n",
        json_string(scheduler),
        nodes.join(",")
    )
}
