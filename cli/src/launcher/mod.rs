//! `pslite launch`: runs a whole cluster of ps-lite programs on this machine.
//!
//! It starts one scheduler, the servers and the workers (by default all the
//! same `PROGRAM`; each role may have its own), each a process with the
//! `DMLC_*` variables ps-lite programs read, prefixes every line they print
//! with the node's name, and succeeds only if every node exits 0. What to do
//! when a node ends, a signal arrives or a time limit passes is decided by
//! the [`Supervisor`](crate::supervisor::Supervisor); this module only starts
//! processes, forwards their output and carries out its decisions.
//!
//! - [`plan`]: which processes to start, with their environments;
//! - [`process`]: the processes ([`NodeProc`](process::NodeProc)), their
//!   output ([`output`]) and exits;
//! - [`ports`]: the ports held for the scheduler and the nodes until they
//!   bind them;
//! - [`naming`]: which node id each process got, from the scheduler's table;
//! - [`signals`]: SIGINT, SIGTERM and SIGHUP to the launcher;
//! - [`watchdog`]: the nodes die with the launcher, even killed with SIGKILL.
//!
//! Before any node starts, the launcher prints where the scheduler listens
//! and the `pslite status` command that shows the job. When the job fails,
//! it prints what failed, a table of the nodes that failed (rank, exit, time,
//! first error line) and what the scheduler said.
//!
//! With elastic workers (`--workers MIN:MAX`) every node gets
//! `DMLC_NUM_WORKER=MIN:MAX`, and the launcher records the cluster's shape in
//! the scheduler's key-value store ([`LAUNCH_KEY`]) so that
//! `pslite launch --add-worker` ([`LaunchOptions::join`]) can start one more
//! worker against it. A running launch also takes [`Control`] requests (the
//! demo adds and kills workers with them).

pub mod naming;
pub mod output;
pub mod plan;
pub mod ports;
pub mod process;
pub mod signals;
pub mod watchdog;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, unbounded, Receiver};
use pslite_proto::Role;

use crate::supervisor::{Action, FailureRow, Policy, Supervisor};
pub use crate::supervisor::{Ended, Outcome};
use plan::{connections_logged, plan};
pub use ports::PortReservation;
use process::Cluster;
use signals::StopSignals;

/// How long stopped nodes get between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(3);

/// After a node fails, how long to wait for the scheduler to end on its own
/// (and say why) before stopping the others.
const SETTLE: Duration = Duration::from_secs(2);

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
    /// The host the nodes advertise, when not `host`: a worker added to a
    /// cluster whose scheduler runs on another machine advertises this one.
    pub node_host: Option<String>,
    /// The scheduler's port; default: a free one.
    pub port: Option<u16>,
    /// Stop everything after this long.
    pub timeout: Option<Duration>,
    /// The program every node runs, unless its role has its own.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The scheduler's own program and arguments, instead of `program`.
    pub scheduler_program: Option<Vec<OsString>>,
    /// The servers' own program and arguments, instead of `program`.
    pub server_program: Option<Vec<OsString>>,
    /// The workers' own program and arguments, instead of `program`.
    pub worker_program: Option<Vec<OsString>>,
    /// Extra environment variables for every node.
    pub env: Vec<(String, String)>,
    /// After a node exits 0, how long the others may keep running before
    /// the job is stopped as a failure.
    pub exit_grace: Duration,
    /// Restart failed nodes of this role (same program, same environment).
    pub restart_role: Option<Role>,
    /// At most this many restarts in all.
    pub max_restarts: u32,
    /// Elastic workers, `(MIN, MAX)`: every node gets
    /// `DMLC_NUM_WORKER=MIN:MAX` and `workers` is how many to start (at most
    /// MAX); a worker that fails or leaves does not end the job.
    pub elastic: Option<(usize, usize)>,
    /// Start only one worker, for the running cluster whose scheduler is at
    /// `host`:`port` (`pslite launch --add-worker`): no scheduler, no
    /// servers; `servers` and `elastic` describe the cluster.
    pub join: bool,
    /// Write each node's output to a file of its own in this directory too
    /// (`--log-dir`): `scheduler.log`, `server-0.log`, `worker-1.log`
    /// (elastic workers `worker-node-13.log`).
    pub log_dir: Option<PathBuf>,
    /// Print the scheduler's address and the status command before the
    /// nodes start (the demo says it in its own words).
    pub announce: bool,
    /// The Python interpreter the launcher runs in (`pslite` from pip):
    /// its directory goes first on every node's PATH (a venv's `bin/`) and
    /// a `.py` program runs under it. Without it, a `.py` program runs
    /// under `python3` from the PATH.
    pub python: Option<PathBuf>,
    /// The servers live inside the workers' processes (`--colocate`): no
    /// server process starts; each worker gets `PSLITE_COLOCATE=1`.
    pub colocate: bool,
}

impl Default for LaunchOptions {
    /// 1 server, 1 worker on 127.0.0.1, no program yet, no time limit,
    /// 30 s of exit grace, no restarts.
    fn default() -> Self {
        LaunchOptions {
            servers: 1,
            workers: 1,
            worker_procs: None,
            host: "127.0.0.1".into(),
            node_host: None,
            port: None,
            timeout: None,
            program: OsString::new(),
            args: Vec::new(),
            scheduler_program: None,
            server_program: None,
            worker_program: None,
            env: Vec::new(),
            exit_grace: Duration::from_secs(30),
            restart_role: None,
            max_restarts: 3,
            elastic: None,
            join: false,
            log_dir: None,
            announce: true,
            python: None,
            colocate: false,
        }
    }
}

/// The store key where `pslite launch --workers MIN:MAX` records its
/// cluster's shape (`servers=S workers=MIN:MAX`) for `--add-worker`.
pub const LAUNCH_KEY: &str = "pslite.launch";

/// `PS_REPLICAS` as the nodes get it (the options' environment, else this
/// process's); 1 if unset. A bad value is the nodes' to report.
fn replicas(env: &[(String, String)]) -> u32 {
    let setting = &pslite::settings::PS_REPLICAS;
    setting
        .read(&pslite::settings::overlay(env))
        .unwrap_or(setting.kind.default) as u32
}

/// The value of [`LAUNCH_KEY`] for a cluster of `servers` servers and
/// `min`:`max` elastic workers.
pub fn launch_record(servers: usize, min: usize, max: usize) -> String {
    format!("servers={servers} workers={min}:{max}")
}

/// Reads a [`LAUNCH_KEY`] value: `(servers, min, max)`.
pub fn parse_launch_record(value: &str) -> Option<(usize, usize, usize)> {
    let mut servers = None;
    let mut workers = None;
    for word in value.split_whitespace() {
        match word.split_once('=') {
            Some(("servers", v)) => servers = v.parse::<usize>().ok(),
            Some(("workers", v)) => workers = parse_bounds(v),
            _ => {}
        }
    }
    let (min, max) = workers?;
    Some((servers?, min, max))
}

/// `MIN:MAX` with 1 <= MIN <= MAX.
pub fn parse_bounds(s: &str) -> Option<(usize, usize)> {
    let (min, max) = s.trim().split_once(':')?;
    let min = min.trim().parse::<usize>().ok()?;
    let max = max.trim().parse::<usize>().ok()?;
    (min >= 1 && min <= max).then_some((min, max))
}

/// A request to a running launch (see [`launch_with`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Start one more worker (same program and environment as the others).
    AddWorker,
    /// Send `signal` to the process of node `id` (and its group).
    SignalNode {
        /// The node id.
        id: pslite_proto::NodeId,
        /// The signal.
        signal: i32,
    },
}

/// Why the cluster could not be started at all.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The options do not describe a cluster.
    #[error("{0}")]
    Invalid(String),
    /// The environment the nodes would get is not a valid ps-lite
    /// configuration (checked once here rather than failing every node).
    #[error("{0}")]
    Config(#[from] pslite::ConfigError),
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

/// Raises this process's soft descriptor limit for a job of `nodes`
/// processes: each costs the launcher two output pipes and a reserved port
/// until it starts (a thousand nodes need more than the usual 1 024). The
/// nodes inherit it (and raise their own as their job needs, see
/// the Van's `context`).
fn fit_descriptors(nodes: usize) {
    let need = 4 * nodes as u64 + 64;
    match pslite::fit_descriptor_limit(need) {
        pslite::DescriptorFit::Enough => {}
        pslite::DescriptorFit::Raised { from, to } => log::info!(
            "pslite launch: raised the file descriptor limit (ulimit -n) from {from} to {to} for \
             {nodes} nodes"
        ),
        pslite::DescriptorFit::Short { limit, .. } => eprintln!(
            "pslite launch: warning: {nodes} nodes need about {need} file descriptors and this \
             process may open {limit} (raise the hard limit: ulimit -Hn)"
        ),
    }
}

/// Runs the cluster to completion.
pub fn launch(opts: &LaunchOptions) -> Result<Outcome, LaunchError> {
    launch_with(opts, &crossbeam_channel::never())
}

/// [`launch`], carrying out the [`Control`] requests that arrive on
/// `control` while the job runs. Every process is started from the calling
/// thread, which must live as long as the job (a child's parent-death
/// signal fires when the thread that forked it ends).
pub fn launch_with(
    opts: &LaunchOptions,
    control: &Receiver<Control>,
) -> Result<Outcome, LaunchError> {
    // Held until the job ends (see PortReservation).
    let mut reservation = None;
    let port = match opts.port {
        Some(p) => p,
        None if opts.join => {
            return Err(LaunchError::Invalid(
                "--add-worker needs the scheduler's port (--port or DMLC_PS_ROOT_PORT)".into(),
            ))
        }
        None => {
            let held = PortReservation::new(&opts.host).map_err(|source| LaunchError::Port {
                host: opts.host.clone(),
                source,
            })?;
            let port = held.port();
            reservation = Some(held);
            port
        }
    };
    let mut specs = plan(opts, port)?;
    fit_descriptors(specs.len());
    // The namer asks the scheduler it starts only once it showed it is
    // pslite's (see naming::SchedulerMark); an --add-worker launch found a
    // pslite scheduler already (its launch record).
    let mark = (!opts.join).then(|| naming::SchedulerMark::new(port));
    if let Some(mark) = &mark {
        for spec in specs.iter_mut().filter(|s| s.role == Role::Scheduler) {
            spec.env.push((
                pslite::launched::MARK_VAR.into(),
                mark.path().display().to_string(),
            ));
        }
    }
    let worker_template = specs.iter().find(|n| n.role == Role::Worker).cloned();
    if let Some(dir) = &opts.log_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| LaunchError::Invalid(format!("--log-dir {}: {e}", dir.display())))?;
    }
    if opts.announce && !opts.join {
        eprintln!(
            "pslite launch: scheduler at {}:{port}; see the job with: {}",
            opts.host,
            status_command(&opts.host, port, &opts.env)
        );
        if let Some(dir) = &opts.log_dir {
            eprintln!(
                "pslite launch: each node's output also goes to {}/NODE.log",
                dir.display()
            );
        }
    }
    let (exits, exited) = unbounded();
    // `found` lives as long as the loop, so `named` never disconnects.
    let (found, named) = unbounded();
    let namer = {
        let (tx, rx) = unbounded();
        let host = opts.host.clone();
        let env = opts.env.clone();
        let found = found.clone();
        let mark = mark.as_ref().map(|m| m.path().to_path_buf());
        std::thread::Builder::new()
            .name("node names".into())
            .spawn(move || naming::name_nodes(&host, port, &env, mark.as_deref(), &rx, &found))
            .ok()
            .map(|_| tx)
    };
    let mut cluster = Cluster::new(
        specs,
        &opts.host,
        namer,
        exits,
        opts.elastic.is_some(),
        opts.log_dir.clone(),
    )?;
    cluster.reserve_ports()?;
    let signals = StopSignals::catch().map_err(|e| {
        LaunchError::Invalid(format!("cannot catch SIGINT, SIGTERM and SIGHUP: {e}"))
    })?;
    for index in 0..cluster.nodes.len() {
        if let Err(e) = cluster.spawn(index) {
            for started in 0..index {
                cluster.signal(started, libc::SIGKILL);
            }
            return Err(e);
        }
    }
    cluster.watch();
    let verbose = connections_logged(opts);
    if verbose {
        eprintln!("pslite launch: started {}", cluster.pids_line());
    }
    if let (Some((min, max)), false) = (opts.elastic, opts.join) {
        publish_launch_record(
            &opts.host,
            port,
            launch_record(opts.servers, min, max),
            &opts.env,
        );
    }
    let mut supervisor = Supervisor::new(
        Policy {
            timeout: opts.timeout,
            exit_grace: opts.exit_grace,
            settle: SETTLE,
            kill_grace: KILL_GRACE,
            restart_role: opts.restart_role,
            max_restarts: opts.max_restarts,
            elastic: opts.elastic.is_some() && !opts.join,
            replicas: replicas(&opts.env),
        },
        cluster
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.spec.role))
            .collect(),
        Instant::now(),
    );
    let mut workers_started = cluster
        .nodes
        .iter()
        .filter(|n| n.spec.role == Role::Worker)
        .count();
    let mut outcome = loop {
        if let Some(outcome) = supervisor.outcome() {
            break outcome;
        }
        let held = cluster.release_held(Instant::now());
        let timer = match (supervisor.deadline(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map_or_else(crossbeam_channel::never, crossbeam_channel::at);
        let mut actions = select! {
            recv(exited) -> exit => match exit {
                Ok((index, ended)) => {
                    cluster.exited(index);
                    supervisor.on_exit(index, ended, Instant::now())
                }
                Err(_) => Vec::new(),
            },
            recv(named) -> found => {
                if let Some((index, name)) = found.ok().and_then(|f| cluster.named(f)) {
                    supervisor.rename(index, name);
                }
                Vec::new()
            },
            recv(signals.received()) -> sig => match sig {
                Ok(sig) => supervisor.on_signal(sig, Instant::now()),
                Err(_) => Vec::new(),
            },
            recv(control) -> request => match (request, &worker_template) {
                (Ok(Control::AddWorker), Some(template)) => {
                    let name = format!("worker {workers_started}");
                    match supervisor.add_node(name.clone(), Role::Worker, Instant::now()) {
                        Some(index) => {
                            workers_started += 1;
                            let added = cluster.add(plan::NodeSpec {
                                name,
                                ..template.clone()
                            });
                            debug_assert_eq!(added, index);
                            vec![Action::Restart(index)]
                        }
                        None => Vec::new(),
                    }
                }
                (Ok(Control::SignalNode { id, signal }), _) => match cluster.index_of(id) {
                    Some(index) => vec![Action::Signal { nodes: vec![index], signal }],
                    None => vec![Action::Say(format!("no process known as node {id} to signal"))],
                },
                _ => Vec::new(),
            },
            recv(timer) -> _ => supervisor.on_tick(Instant::now()),
        };
        while !actions.is_empty() {
            let mut more = Vec::new();
            for action in actions {
                match action {
                    Action::Say(line) => eprintln!("pslite launch: {line}"),
                    Action::Signal { nodes, signal } => {
                        for index in nodes {
                            cluster.signal(index, signal);
                        }
                    }
                    Action::Restart(index) => {
                        match cluster.spawn(index).map(|()| cluster.watch()) {
                            Ok(()) => {
                                let node = &cluster.nodes[index];
                                supervisor.rename(index, node.name.clone());
                                if verbose {
                                    eprintln!(
                                        "pslite launch: started {} (pid {})",
                                        node.name, node.pid
                                    );
                                }
                            }
                            Err(e) => {
                                eprintln!("pslite launch: {e}");
                                more.extend(supervisor.on_exit(
                                    index,
                                    Ended::Unknown(e.to_string()),
                                    Instant::now(),
                                ));
                            }
                        }
                    }
                }
            }
            actions = more;
        }
    };
    drop((reservation, signals, found));
    cluster.finish();
    drop(mark);
    if let Outcome::Failed {
        node,
        others,
        scheduler_said,
        failures,
        ..
    } = &mut outcome
    {
        let scheduler_failed =
            node == "scheduler" || others.iter().any(|(name, _)| name == "scheduler");
        if scheduler_failed {
            *scheduler_said = cluster.last_stderr(Role::Scheduler);
        }
        *failures = supervisor
            .failures()
            .into_iter()
            .map(|end| {
                let proc = &cluster.nodes[end.index];
                FailureRow {
                    node: end.name.clone(),
                    rank: proc.rank.clone(),
                    exit: end.ended.short(),
                    time: format!("{:.1} s", end.after.as_secs_f64()),
                    first_error: proc.output.first_error(),
                }
            })
            .collect();
    }
    Ok(outcome)
}

/// Records the cluster's shape in its scheduler's store ([`LAUNCH_KEY`]),
/// from a thread: the request waits (up to a minute) for the scheduler to
/// listen. Only `--add-worker` reads it, so a failure is a warning.
fn publish_launch_record(host: &str, port: u16, record: String, env: &[(String, String)]) {
    let (local, token) = admin_settings(env);
    let host = host.to_string();
    let _ = std::thread::Builder::new()
        .name("launch record".into())
        .spawn(move || {
            let published =
                admin_client(&host, port, local, token.as_deref(), None).and_then(|mut c| {
                    let req = pslite::proto::store::StoreMsg {
                        value: Some(record.into()),
                        ..pslite::proto::store::StoreMsg::request(
                            pslite::proto::store::StoreOp::Set,
                            vec![LAUNCH_KEY.into()],
                        )
                    };
                    c.store(req, Duration::from_secs(60))
                        .map(drop)
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = published {
                log::warn!(
                    "pslite launch: cannot record the cluster in the scheduler's store \
                     ({LAUNCH_KEY}; `pslite launch --add-worker` needs it): {e}"
                );
            }
        });
}

/// The command that shows the job whose scheduler is at `host`:`port`, as
/// it can be pasted into the shell the launcher runs in: `pslite` if that is
/// this program on the PATH, else this program's path (relative to the
/// working directory when under it, `target/release/pslite`), with
/// `DMLC_LOCAL=1` for a local cluster and `--host` unless it is 127.0.0.1.
pub fn status_command(host: &str, port: u16, env: &[(String, String)]) -> String {
    let (local, _) = admin_settings(env);
    let mut command = String::new();
    if local {
        command += "DMLC_LOCAL=1 ";
    }
    command += &self_command();
    command += &format!(" status --port {port}");
    if host != "127.0.0.1" {
        command += &format!(" --host {}", shell_word(host));
    }
    command
}

/// How to run this program from the current directory's shell (quoted).
fn self_command() -> String {
    let invocation = crate::invocation();
    if let Some(python) = &invocation.python {
        // From pip: the `pslite` script beside the interpreter (bare if the
        // PATH finds it there), else `python -m pslite`.
        if let Some(bin) = python.parent() {
            let script = bin.join("pslite");
            if script.is_file() {
                let first_on_path = pslite::settings::foreign("PATH").and_then(|path| {
                    std::env::split_paths(&path).find(|d| d.join("pslite").is_file())
                });
                return if first_on_path.is_some_and(|d| d == bin) {
                    "pslite".into()
                } else {
                    shell_word(&script.display().to_string())
                };
            }
        }
        return invocation
            .program
            .iter()
            .map(|w| shell_word(&w.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
    }
    shell_word(&native_command())
}

/// How to run this executable from the current directory's shell.
fn native_command() -> String {
    let Ok(me) = std::env::current_exe().and_then(|p| p.canonicalize()) else {
        return "pslite".into();
    };
    let on_path = pslite::settings::foreign("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            dir.join("pslite")
                .canonicalize()
                .is_ok_and(|found| found == me)
        })
    });
    if on_path {
        return "pslite".into();
    }
    let relative = std::env::current_dir()
        .ok()
        .and_then(|cwd| cwd.canonicalize().ok())
        .and_then(|cwd| me.strip_prefix(cwd).ok().map(std::path::Path::to_path_buf));
    match relative {
        // A word with a slash is run from there, not looked up on the PATH.
        Some(rel) if rel.components().count() > 1 => rel.display().to_string(),
        Some(rel) => format!("./{}", rel.display()),
        None => me.display().to_string(),
    }
}

/// `word`, quoted for a POSIX shell if it needs it.
fn shell_word(word: &str) -> String {
    let plain = word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-=+:@%,".contains(c));
    if plain && !word.is_empty() {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// What an admin client of this job's scheduler needs from the nodes'
/// environment (the launch's own variables first, then the launcher's):
/// whether the cluster is local (`DMLC_LOCAL`: IPC) and its `PS_AUTH_TOKEN`.
pub(crate) fn admin_settings(env: &[(String, String)]) -> (bool, Option<String>) {
    use pslite::settings::{overlay, DMLC_LOCAL, PS_AUTH_TOKEN};
    let env = overlay(env);
    // The token as set: admin_client says what is wrong with it.
    (
        DMLC_LOCAL.read(&env).unwrap_or(false),
        env(PS_AUTH_TOKEN.name),
    )
}

/// An admin client of the scheduler at `host`:`port` (over IPC with
/// `local`, presenting `token`; answers to `reply_host`, default the
/// address on the route to the scheduler).
pub fn admin_client(
    host: &str,
    port: u16,
    local: bool,
    token: Option<&str>,
    reply_host: Option<&str>,
) -> Result<pslite::admin::AdminClient, String> {
    use pslite::admin::{AdminClient, AuthToken, Transport};
    let token = match token {
        Some(t) => Some(AuthToken::new(t).ok_or_else(|| {
            format!(
                "PS_AUTH_TOKEN must be a secret of 1 to 255 bytes, got <{} bytes>",
                t.len()
            )
        })?),
        None => None,
    };
    let transport = if local {
        Transport::Ipc
    } else {
        Transport::Tcp
    };
    AdminClient::connect_via(transport, host, i32::from(port), reply_host, token.as_ref())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_records_and_bounds_read_back() {
        assert_eq!(parse_bounds("2:4"), Some((2, 4)));
        assert_eq!(parse_bounds(" 3 : 3 "), Some((3, 3)));
        for bad in ["4:2", "0:3", "a:b", "2", ":4", "2:"] {
            assert_eq!(parse_bounds(bad), None, "{bad:?}");
        }
        let record = launch_record(2, 2, 4);
        assert_eq!(record, "servers=2 workers=2:4");
        assert_eq!(parse_launch_record(&record), Some((2, 2, 4)));
        assert_eq!(parse_launch_record("servers=2"), None);
        assert_eq!(parse_launch_record("workers=2:4"), None);
    }
}
