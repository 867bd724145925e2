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

/// Where the scheduler of a running cluster is: the options `pslite
/// status`, `pslite store` and `pslite checkpoint` share.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SchedulerAddr {
    /// The scheduler's host [default: DMLC_PS_ROOT_URI, else 127.0.0.1].
    #[arg(long, global = true)]
    pub host: Option<String>,
    /// The scheduler's port [default: DMLC_PS_ROOT_PORT].
    #[arg(long, global = true)]
    pub port: Option<u16>,
    /// The address of this machine the scheduler answers to [default: the
    /// one on the route to the scheduler].
    #[arg(long, global = true)]
    pub reply_host: Option<String>,
}

/// Options of `pslite status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Where the scheduler is.
    #[command(flatten)]
    pub scheduler: crate::status::SchedulerAddr,
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
pub fn connect(command: &str, at: &SchedulerAddr) -> Result<(AdminClient, String), ExitCode> {
    let (port, reply_host) = (at.port, at.reply_host.as_deref());
    use pslite::settings::{DMLC_PS_ROOT_PORT, DMLC_PS_ROOT_URI};
    let host = at
        .host
        .clone()
        .or_else(|| DMLC_PS_ROOT_URI.get().ok())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = match port {
        Some(p) => p,
        None => match DMLC_PS_ROOT_PORT.get() {
            Ok(p) => p as u16,
            Err(pslite::ConfigError::Missing { .. }) => {
                eprintln!(
                    "pslite {command}: which scheduler? pass --port (and --host), or set \
                     DMLC_PS_ROOT_PORT (and DMLC_PS_ROOT_URI)"
                );
                return Err(ExitCode::from(2));
            }
            Err(e) => {
                eprintln!("pslite {command}: {e}; or pass --port");
                return Err(ExitCode::from(2));
            }
        },
    };
    // A DMLC_LOCAL=1 cluster's scheduler listens on ipc:///tmp/<port>; a
    // cluster with PS_AUTH_TOKEN answers only clients that present it.
    let (local, token) = crate::launcher::admin_settings(&[]);
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
    let (mut client, scheduler) = match connect("status", &args.scheduler) {
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

/// `pslite status --json`: one object, the scheduler's address and a row per
/// node. Times are whole milliseconds; `null` where a value is not known.
#[derive(Debug, serde::Serialize)]
pub struct StatusJson<'a> {
    /// The scheduler asked, `host:port`.
    pub scheduler: &'a str,
    /// The node table, in the scheduler's order.
    pub nodes: Vec<NodeJson<'a>>,
}

/// One node of [`StatusJson`].
#[derive(Debug, serde::Serialize)]
pub struct NodeJson<'a> {
    /// Its id; `null` before the cluster formed.
    pub id: Option<i32>,
    /// `scheduler`, `server` or `worker`.
    pub role: &'static str,
    /// Its rank (in the current round, for elastic workers); `null` for the
    /// scheduler and nodes without an id.
    pub rank: Option<i32>,
    /// The host it advertises.
    pub host: &'a str,
    /// The port it listens on.
    pub port: i32,
    /// Since the scheduler last heard from it.
    pub last_seen_ms: Option<u128>,
    /// Declared dead (no heartbeats).
    pub dead: bool,
    /// An elastic worker waiting for the next round.
    pub waiting: bool,
    /// It replaced a dead node.
    pub recovered: bool,
    /// Its counters are no older than `--stale` (always true for the scheduler).
    pub answering: bool,
    /// Age of its counters.
    pub counters_age_ms: Option<u128>,
    /// Its counters, once it has sent any.
    pub counters: Option<CountersJson>,
}

/// A node's counters in [`NodeJson`].
#[derive(Debug, serde::Serialize)]
pub struct CountersJson {
    /// Messages sent, resends included.
    pub messages_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Messages received.
    pub messages_received: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Requests sent and not yet answered.
    pub requests_in_flight: i64,
    /// Messages sent again for want of an acknowledgement.
    pub resends: u64,
    /// Messages dropped, by reason.
    pub dropped: DroppedJson,
    /// Calls of the request and response handlers.
    pub handler_calls: u64,
    /// Time spent in them.
    pub handler_ns: u64,
    /// Since the node started.
    pub uptime_ms: u128,
    /// Traffic per peer.
    pub peers: Vec<PeerJson>,
}

/// Dropped messages by reason, in [`CountersJson`].
#[derive(Debug, serde::Serialize)]
pub struct DroppedJson {
    /// Frames that could not be decoded.
    pub malformed: u64,
    /// From a sender not in the node table.
    pub unknown_peer: u64,
    /// By `PS_DROP_MSG`.
    pub injected: u64,
    /// Resent copies already delivered.
    pub duplicate: u64,
    /// Parts beyond their sender's bound on incomplete messages
    /// (`PS_HOLD_LIMIT / 4`).
    pub hold_limit: u64,
}

/// Traffic with one peer, in [`CountersJson`].
#[derive(Debug, serde::Serialize)]
pub struct PeerJson {
    /// The peer's node id.
    pub peer: i32,
    /// Messages sent to it.
    pub messages_sent: u64,
    /// Bytes sent to it.
    pub bytes_sent: u64,
    /// Messages received from it.
    pub messages_received: u64,
    /// Bytes received from it.
    pub bytes_received: u64,
}

impl<'a> StatusJson<'a> {
    /// The JSON form of a status answer.
    pub fn new(scheduler: &'a str, rows: &'a [NodeStatus], stale: Duration) -> StatusJson<'a> {
        let nodes = rows
            .iter()
            .map(|r| {
                let n = &r.node;
                NodeJson {
                    id: (n.id != K_EMPTY).then_some(n.id),
                    role: n.role.as_str(),
                    rank: r
                        .round_rank
                        .and_then(|rank| i32::try_from(rank).ok())
                        .or_else(|| {
                            matches!(ids::role_of_id(n.id), Some(Role::Server | Role::Worker))
                                .then(|| ids::id_to_rank(n.id))
                        }),
                    host: &n.hostname,
                    port: n.port,
                    last_seen_ms: r.last_seen.map(|d| d.as_millis()),
                    dead: r.dead,
                    waiting: r.waiting,
                    recovered: n.is_recovery,
                    answering: n.id == ids::SCHEDULER || r.counters_age.is_some_and(|a| a <= stale),
                    counters_age_ms: r.counters_age.map(|d| d.as_millis()),
                    counters: r.counters.as_ref().map(|c| CountersJson {
                        messages_sent: c.messages_sent(),
                        bytes_sent: c.bytes_sent(),
                        messages_received: c.messages_received(),
                        bytes_received: c.bytes_received(),
                        requests_in_flight: c.requests_in_flight,
                        resends: c.resends,
                        dropped: DroppedJson {
                            malformed: c.dropped_malformed,
                            unknown_peer: c.dropped_unknown_peer,
                            injected: c.dropped_injected,
                            duplicate: c.dropped_duplicate,
                            hold_limit: c.dropped_hold_limit,
                        },
                        handler_calls: c.handler_calls,
                        handler_ns: c.handler_nanos,
                        uptime_ms: c.uptime.as_millis(),
                        peers: c
                            .peers
                            .iter()
                            .map(|p| PeerJson {
                                peer: p.peer,
                                messages_sent: p.messages_sent,
                                bytes_sent: p.bytes_sent,
                                messages_received: p.messages_received,
                                bytes_received: p.bytes_received,
                            })
                            .collect(),
                    }),
                }
            })
            .collect();
        StatusJson { scheduler, nodes }
    }
}

fn to_json(scheduler: &str, rows: &[NodeStatus], stale: Duration) -> String {
    // Serializing plain structs of numbers and strings cannot fail.
    serde_json::to_string(&StatusJson::new(scheduler, rows, stale)).unwrap_or_default() + "\n"
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pslite::proto::stats::{NodeCounters, PeerCounters};
    use pslite::proto::Node;

    /// A status row of a live node of `role` with `id` on 127.0.0.1:`port`,
    /// heard from 250 ms ago.
    pub(crate) fn row(role: Role, id: i32, port: i32) -> NodeStatus {
        let mut node = Node::new(role, "127.0.0.1", port);
        node.id = id;
        NodeStatus {
            node,
            last_seen: Some(Duration::from_millis(250)),
            dead: false,
            counters: None,
            counters_age: None,
            waiting: false,
            round_rank: None,
        }
    }

    /// The same bytes the hand-written writer gave before serde, so scripts
    /// reading `--json` see no change.
    #[test]
    fn json_keeps_its_fields_and_order() {
        let scheduler = row(Role::Scheduler, ids::SCHEDULER, 9000);
        let mut worker = row(Role::Worker, 11, 9002);
        worker.node.is_recovery = true;
        worker.counters_age = Some(Duration::from_millis(1500));
        worker.counters = Some(NodeCounters {
            peers: vec![PeerCounters {
                peer: 8,
                messages_sent: 3,
                bytes_sent: 300,
                messages_received: 4,
                bytes_received: 400,
            }],
            resends: 1,
            dropped_malformed: 2,
            dropped_unknown_peer: 3,
            dropped_injected: 4,
            dropped_duplicate: 5,
            dropped_hold_limit: 9,
            requests_in_flight: -1,
            handler_calls: 6,
            handler_nanos: 7,
            uptime: Duration::from_millis(8000),
        });
        let mut waiting = row(Role::Worker, K_EMPTY, 9003);
        waiting.node.hostname = "a\"b\\c\u{1}".into();
        waiting.last_seen = None;
        waiting.waiting = true;
        let rows = [scheduler, worker, waiting];
        let json = render("127.0.0.1:9000", &rows, Duration::from_secs(1), true);
        assert_eq!(
            json,
            concat!(
                r#"{"scheduler":"127.0.0.1:9000","nodes":["#,
                r#"{"id":1,"role":"scheduler","rank":null,"host":"127.0.0.1","port":9000,"#,
                r#""last_seen_ms":250,"dead":false,"waiting":false,"recovered":false,"#,
                r#""answering":true,"counters_age_ms":null,"counters":null},"#,
                r#"{"id":11,"role":"worker","rank":1,"host":"127.0.0.1","port":9002,"#,
                r#""last_seen_ms":250,"dead":false,"waiting":false,"recovered":true,"#,
                r#""answering":false,"counters_age_ms":1500,"counters":{"messages_sent":3,"#,
                r#""bytes_sent":300,"messages_received":4,"bytes_received":400,"#,
                r#""requests_in_flight":-1,"resends":1,"dropped":{"malformed":2,"#,
                r#""unknown_peer":3,"injected":4,"duplicate":5,"hold_limit":9},"handler_calls":6,"#,
                r#""handler_ns":7,"uptime_ms":8000,"peers":[{"peer":8,"messages_sent":3,"#,
                r#""bytes_sent":300,"messages_received":4,"bytes_received":400}]}},"#,
                r#"{"id":null,"role":"worker","rank":null,"host":"a\"b\\c\u0001","port":9003,"#,
                r#""last_seen_ms":null,"dead":false,"waiting":true,"recovered":false,"#,
                r#""answering":false,"counters_age_ms":null,"counters":null}]}"#,
                "\n"
            )
        );
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["nodes"][1]["counters"]["dropped"]["duplicate"], 5);
    }
}
