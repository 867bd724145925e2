//! `pslite launch --add-worker`: one more worker for a running elastic
//! cluster on this machine.
//!
//! Before starting anything it asks the scheduler (with the admin client of
//! `pslite status`) for its node table, so an unreachable scheduler is one
//! clear line, and reads the cluster's shape (servers, `MIN:MAX`) from the
//! record `pslite launch --workers MIN:MAX` left in the scheduler's store
//! ([`LAUNCH_KEY`]): a cluster without it is not an elastic one started by
//! the launcher, and is refused unless `--workers MIN:MAX` says otherwise.
//! Then the worker runs under the launcher's usual supervision (prefixed
//! output, signals, `--timeout`), and its exit code is the command's. It
//! advertises the address this machine reaches the scheduler from, so the
//! scheduler may run on another machine.

use std::process::ExitCode;
use std::time::Duration;

use pslite::proto::store::{StoreMsg, StoreOp, StoreStatus};
use pslite::settings::{DMLC_PS_ROOT_PORT, DMLC_PS_ROOT_URI};
use pslite::Role;

use crate::launcher::{admin_client, parse_launch_record, LaunchOptions, LAUNCH_KEY};
use crate::WorkerCount;

/// How long the scheduler gets to answer each question.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs `pslite launch --add-worker` with the launch options `opts` (the
/// program and its environment) and the options as given.
pub fn run(
    opts: &mut LaunchOptions,
    host: Option<String>,
    servers: Option<usize>,
    workers: Option<WorkerCount>,
) -> ExitCode {
    match prepare(opts, host, servers, workers) {
        Ok(()) => crate::run_launch(opts),
        Err(e) => {
            eprintln!("pslite launch --add-worker: {e}");
            ExitCode::from(2)
        }
    }
}

/// Finds the scheduler, checks it answers and is elastic, and fills in
/// `opts` for one worker of its cluster.
fn prepare(
    opts: &mut LaunchOptions,
    host: Option<String>,
    servers: Option<usize>,
    workers: Option<WorkerCount>,
) -> Result<(), String> {
    let host = host
        .or_else(|| DMLC_PS_ROOT_URI.get().ok())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = match opts.port {
        Some(p) => p,
        None => match DMLC_PS_ROOT_PORT.get() {
            Ok(p) => p as u16,
            Err(e @ pslite::ConfigError::OutOfRange { .. }) => return Err(e.to_string()),
            Err(_) => {
                return Err(
                    "which cluster? pass --port (and --host) of its scheduler, or set \
                     DMLC_PS_ROOT_PORT (and DMLC_PS_ROOT_URI)"
                        .into(),
                )
            }
        },
    };
    let (local, token) = crate::launcher::admin_settings(&[]);
    let mut client = admin_client(&host, port, local, token.as_deref(), None)?;
    let table = client
        .status(ASK_TIMEOUT)
        .map_err(|e| format!("cannot reach the cluster's scheduler: {e}"))?;
    let (servers, min, max) = match workers {
        Some(WorkerCount::Elastic(min, max)) => {
            let counted = table.iter().filter(|r| r.node.role == Role::Server).count();
            (servers.unwrap_or(counted.max(1)), min, max)
        }
        Some(WorkerCount::Fixed(_)) => {
            return Err("--workers must be the cluster's MIN:MAX".into());
        }
        None => read_record(&mut client, &host, port)?,
    };
    // The worker advertises the address this machine reaches the
    // scheduler from (127.0.0.1 for a local one).
    let reply = client.local_address();
    opts.node_host = reply
        .rsplit_once(':')
        .map(|(h, _)| h.trim_matches(['[', ']']).to_string())
        .filter(|h| !h.is_empty() && *h != host);
    opts.host = host;
    opts.port = Some(port);
    opts.servers = servers;
    opts.workers = 1;
    opts.elastic = Some((min, max));
    opts.join = true;
    Ok(())
}

/// The cluster's shape from its launch record.
fn read_record(
    client: &mut pslite::admin::AdminClient,
    host: &str,
    port: u16,
) -> Result<(usize, usize, usize), String> {
    let req = StoreMsg {
        // The launcher records it as soon as the scheduler listens.
        timeout: Some(Duration::from_secs(1)),
        ..StoreMsg::request(StoreOp::Get, vec![LAUNCH_KEY.into()])
    };
    let answer = client
        .store(req, ASK_TIMEOUT)
        .map_err(|e| format!("cannot ask the scheduler at {host}:{port}: {e}"))?;
    match answer.status {
        StoreStatus::Ok => {}
        StoreStatus::Timeout => {
            return Err(format!(
                "the cluster at {host}:{port} does not take more workers: it was not started \
                 with elastic workers by `pslite launch --workers MIN:MAX` (its scheduler's \
                 store has no {LAUNCH_KEY} record); if it is elastic all the same, give its \
                 --workers MIN:MAX and --servers"
            ))
        }
        StoreStatus::Invalid => {
            return Err(format!(
                "the scheduler at {host}:{port} refused to read {LAUNCH_KEY}: {}",
                answer.error.as_deref().unwrap_or("no reason given")
            ))
        }
    }
    let value = answer.value.unwrap_or_default();
    let text = String::from_utf8_lossy(&value);
    parse_launch_record(&text).ok_or_else(|| {
        format!("the cluster's {LAUNCH_KEY} record {text:?} is not servers=S workers=MIN:MAX")
    })
}
