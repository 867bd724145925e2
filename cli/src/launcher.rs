//! `pslite launch`: runs a whole cluster of one program on this machine.
//!
//! It starts one scheduler, the servers and the workers of `PROGRAM`, each a
//! process with the `DMLC_*` variables ps-lite programs read, prefixes every
//! line they print with the node's name, and succeeds only if every node
//! exits 0. When one fails, or the time limit passes, it stops the others
//! and says which node failed and how.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, RecvTimeoutError};
use pslite_proto::Role;

/// How long stopped nodes get between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(3);

/// glibc tuning given to nodes unless `GLIBC_TUNABLES` is set: back large
/// `malloc`s (ZeroMQ's receive buffers for big frames) with transparent huge
/// pages. Receiving a 120 MB push otherwise spends much of its time in page
/// faults; kv_bench measured pushes and pulls about 1.5 times as fast with it.
pub const MALLOC_TUNABLES: &str = "glibc.malloc.hugetlb=1";

/// What to launch.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Number of servers.
    pub servers: usize,
    /// Number of workers (`DMLC_NUM_WORKER`).
    pub workers: usize,
    /// Number of worker processes; each hosts `workers / worker_procs`
    /// workers (told through `PSLITE_WORKERS_PER_PROCESS`). Default: one
    /// process per worker.
    pub worker_procs: Option<usize>,
    /// The host every node advertises and the scheduler listens on.
    pub host: String,
    /// The scheduler's port; default: a free one.
    pub port: Option<u16>,
    /// Stop everything after this long.
    pub timeout: Option<Duration>,
    /// The program every node runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables for every node.
    pub env: Vec<(String, String)>,
}

/// How a launch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every node exited 0.
    Success,
    /// A node failed first; the others were stopped.
    Failed {
        /// Its name (`worker 1`).
        node: String,
        /// How it ended (`exit code 3`, `killed by signal 9`).
        how: String,
        /// The launcher's exit code: the node's, or 128 + its signal.
        code: i32,
    },
    /// The time limit passed; these nodes were still running.
    TimedOut {
        /// The nodes stopped at the deadline.
        running: Vec<String>,
    },
}

/// Why the cluster could not be started at all.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The options do not describe a cluster.
    #[error("{0}")]
    Invalid(String),
    /// A process could not be started.
    #[error("cannot start {program:?} for the {node}: {source}")]
    Spawn {
        /// The program.
        program: OsString,
        /// Which node.
        node: String,
        /// Why.
        source: std::io::Error,
    },
    /// No free port for the scheduler.
    #[error("cannot find a free port on {host}: {source}")]
    Port {
        /// The host.
        host: String,
        /// Why.
        source: std::io::Error,
    },
}

struct NodeProcess {
    name: String,
    pid: u32,
    running: bool,
}

/// A free TCP port on `host` (bound and released; the scheduler takes it
/// right after).
pub fn free_port(host: &str) -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((host, 0))?.local_addr()?.port())
}

fn describe(status: ExitStatus) -> (String, i32) {
    match (status.code(), status.signal()) {
        (Some(code), _) => (format!("exit code {code}"), code),
        (None, Some(sig)) => (format!("killed by signal {sig}"), 128 + sig),
        _ => ("an unknown status".into(), 1),
    }
}

fn forward(
    reader: impl Read + Send + 'static,
    prefix: String,
    to_stderr: bool,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("output {prefix}"))
        .spawn(move || {
            let mut reader = BufReader::new(reader);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        let text = text.trim_end_matches(['\n', '\r']);
                        if to_stderr {
                            let _ = writeln!(std::io::stderr().lock(), "{prefix} {text}");
                        } else {
                            let _ = writeln!(std::io::stdout().lock(), "{prefix} {text}");
                        }
                    }
                }
            }
        })
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned and have not yet seen exit.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Runs the cluster to completion.
pub fn launch(opts: &LaunchOptions) -> Result<Outcome, LaunchError> {
    if opts.servers == 0 || opts.workers == 0 {
        return Err(LaunchError::Invalid(
            "--servers and --workers must be at least 1".into(),
        ));
    }
    let worker_procs = opts.worker_procs.unwrap_or(opts.workers);
    if worker_procs == 0 || opts.workers % worker_procs != 0 {
        return Err(LaunchError::Invalid(format!(
            "--worker-procs {worker_procs} must divide --workers {}",
            opts.workers
        )));
    }
    let port = match opts.port {
        Some(p) => p,
        None => free_port(&opts.host).map_err(|source| LaunchError::Port {
            host: opts.host.clone(),
            source,
        })?,
    };
    let mut nodes = vec![("scheduler".to_string(), Role::Scheduler)];
    nodes.extend((0..opts.servers).map(|i| (format!("server {i}"), Role::Server)));
    nodes.extend((0..worker_procs).map(|i| (format!("worker {i}"), Role::Worker)));

    // Nodes can measure their start-up from this instant.
    let launched_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let (tx, rx) = unbounded::<(usize, std::io::Result<ExitStatus>)>();
    let mut procs: Vec<NodeProcess> = Vec::new();
    let mut outputs = Vec::new();
    let started = Instant::now();
    for (index, (name, role)) in nodes.into_iter().enumerate() {
        let mut cmd = Command::new(&opts.program);
        cmd.args(&opts.args)
            .env("DMLC_ROLE", role.as_str())
            .env("DMLC_NUM_SERVER", opts.servers.to_string())
            .env("DMLC_NUM_WORKER", opts.workers.to_string())
            .env("DMLC_PS_ROOT_URI", &opts.host)
            .env("DMLC_PS_ROOT_PORT", port.to_string())
            .env("DMLC_NODE_HOST", &opts.host)
            .env("PSLITE_LAUNCH_UNIX_NS", launched_ns.to_string())
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if std::env::var_os("GLIBC_TUNABLES").is_none() {
            cmd.env("GLIBC_TUNABLES", MALLOC_TUNABLES);
        }
        if role == Role::Worker && opts.worker_procs.is_some() {
            cmd.env(
                "PSLITE_WORKERS_PER_PROCESS",
                (opts.workers / worker_procs).to_string(),
            );
        }
        // SAFETY: prctl only sets a flag of the child; async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // Die with the launcher rather than outlive it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(source) => {
                for p in &procs {
                    signal(p.pid, libc::SIGKILL);
                }
                return Err(LaunchError::Spawn {
                    program: opts.program.clone(),
                    node: name,
                    source,
                });
            }
        };
        let prefix = format!("[{name}]");
        if let Some(out) = child.stdout.take() {
            outputs.extend(forward(out, prefix.clone(), false).ok());
        }
        if let Some(err) = child.stderr.take() {
            outputs.extend(forward(err, prefix, true).ok());
        }
        procs.push(NodeProcess {
            name,
            pid: child.id(),
            running: true,
        });
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((index, child.wait()));
        });
    }
    drop(tx);

    let mut outcome = None;
    let mut kill_at: Option<Instant> = None;
    let mut left = procs.len();
    while left > 0 {
        let deadline = match (kill_at, opts.timeout) {
            (Some(k), _) => Some(k),
            (None, Some(t)) => Some(started + t),
            (None, None) => None,
        };
        let event = match deadline {
            Some(d) => rx.recv_deadline(d),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match event {
            Ok((index, status)) => {
                left -= 1;
                procs[index].running = false;
                let failed = match status {
                    Ok(status) if status.success() => None,
                    Ok(status) => Some(describe(status)),
                    Err(e) => Some((format!("an unknown status ({e})"), 1)),
                };
                if let (Some((how, code)), None) = (failed, &outcome) {
                    outcome = Some(Outcome::Failed {
                        node: procs[index].name.clone(),
                        how,
                        code,
                    });
                    stop_all(&procs, libc::SIGTERM);
                    kill_at = Some(Instant::now() + GRACE);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if kill_at.is_some() {
                    stop_all(&procs, libc::SIGKILL);
                    kill_at = Some(Instant::now() + Duration::from_secs(3600));
                } else {
                    outcome = Some(Outcome::TimedOut {
                        running: procs
                            .iter()
                            .filter(|p| p.running)
                            .map(|p| p.name.clone())
                            .collect(),
                    });
                    stop_all(&procs, libc::SIGTERM);
                    kill_at = Some(Instant::now() + GRACE);
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    for out in outputs {
        let _ = out.join();
    }
    Ok(outcome.unwrap_or(Outcome::Success))
}

fn stop_all(procs: &[NodeProcess], sig: i32) {
    for p in procs.iter().filter(|p| p.running) {
        signal(p.pid, sig);
    }
}
