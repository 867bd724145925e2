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
//! With elastic workers (`--workers MIN:MAX`) every node gets
//! `DMLC_NUM_WORKER=MIN:MAX`, and the launcher records the cluster's shape in
//! the scheduler's key-value store ([`LAUNCH_KEY`]) so that
//! `pslite launch --add-worker` ([`LaunchOptions::join`]) can start one more
//! worker against it. A running launch also takes [`Control`] requests (the
//! demo adds and kills workers with them).
//!
//! The scheduler's port, when the launcher picks it, stays reserved by the
//! launcher until the job ends ([`PortReservation`]): a port found free and
//! released was sometimes taken by another process's `bind(0)` (a node of a
//! concurrent job binding its own port) before the scheduler bound it, and
//! the job failed with "Address already in use".

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, unbounded, Receiver, RecvTimeoutError, Sender};
use pslite_proto::Role;

use crate::supervisor::{Action, Policy, Supervisor};
pub use crate::supervisor::{Ended, Outcome};

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
        }
    }
}

/// The store key where `pslite launch --workers MIN:MAX` records its
/// cluster's shape (`servers=S workers=MIN:MAX`) for `--add-worker`.
pub const LAUNCH_KEY: &str = "pslite.launch";

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
    /// Send `signal` to worker `worker` (by launch index, as in its prefix).
    SignalWorker {
        /// The worker's launch index.
        worker: usize,
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

/// A TCP port on a host held for the scheduler: a socket bound to it with
/// `SO_REUSEADDR` but not listening. While it is held, the kernel gives the
/// port to no other `bind(0)` or outgoing connection, and a plain `bind` to
/// it fails; the scheduler's ZeroMQ socket, which sets `SO_REUSEADDR` too,
/// binds and listens on it all the same. Released when dropped.
pub struct PortReservation {
    fd: libc::c_int,
    port: u16,
}

impl PortReservation {
    /// Reserves a free port on `host` (an IP address or a name).
    pub fn new(host: &str) -> std::io::Result<PortReservation> {
        use std::net::ToSocketAddrs;
        let addr = (host, 0).to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{host} does not resolve"),
            )
        })?;
        let (family, storage, len) = sockaddr(&addr);
        // SAFETY: socket(2) returns a descriptor we own (or -1).
        let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut reservation = PortReservation { fd, port: 0 };
        let one: libc::c_int = 1;
        // SAFETY: setsockopt and bind on our descriptor with valid pointers
        // and lengths; getsockname fills `bound` up to `bound_len`.
        unsafe {
            if libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ) != 0
                || libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let mut bound: libc::sockaddr_storage = std::mem::zeroed();
            let mut bound_len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            if libc::getsockname(
                fd,
                (&mut bound as *mut libc::sockaddr_storage).cast(),
                &mut bound_len,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // sin_port and sin6_port sit at the same offset, in network order.
            reservation.port = u16::from_be(
                (*(&bound as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()).sin_port,
            );
            Ok(reservation)
        }
    }

    /// The reserved port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortReservation {
    fn drop(&mut self) {
        // SAFETY: closing the descriptor we own, once.
        unsafe {
            libc::close(self.fd);
        }
    }
}

/// `addr` as a C socket address: family, storage, length.
fn sockaddr(addr: &std::net::SocketAddr) -> (libc::c_int, libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid; we fill in one of the
    // address structs it is large enough to hold.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        match addr {
            std::net::SocketAddr::V4(v4) => {
                let sin = (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                (*sin).sin_family = libc::AF_INET as libc::sa_family_t;
                (*sin).sin_port = v4.port().to_be();
                (*sin).sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
                (
                    libc::AF_INET,
                    storage,
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
            std::net::SocketAddr::V6(v6) => {
                let sin6 =
                    (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                (*sin6).sin6_family = libc::AF_INET6 as libc::sa_family_t;
                (*sin6).sin6_port = v6.port().to_be();
                (*sin6).sin6_addr.s6_addr = v6.ip().octets();
                (
                    libc::AF_INET6,
                    storage,
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    }
}

fn ended(status: std::io::Result<ExitStatus>) -> Ended {
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Code(code),
            (None, Some(sig)) => Ended::Signal(sig),
            _ => Ended::Unknown(format!("{status:?}")),
        },
        Err(e) => Ended::Unknown(e.to_string()),
    }
}

/// Forwards `reader`'s lines with `prefix`; keeps the last non-blank one in
/// `last` (when given).
fn forward(
    reader: impl Read + Send + 'static,
    prefix: Prefix,
    to_stderr: bool,
    last: Option<Arc<Mutex<Option<String>>>>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("node output".into())
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
                        let prefix = prefix.lock().map(|p| p.clone()).unwrap_or_default();
                        if to_stderr {
                            let _ = writeln!(std::io::stderr().lock(), "{prefix} {text}");
                        } else {
                            let _ = writeln!(std::io::stdout().lock(), "{prefix} {text}");
                        }
                        if let Some(last) = &last {
                            if !text.trim().is_empty() {
                                if let Ok(mut last) = last.lock() {
                                    *last = Some(text.to_string());
                                }
                            }
                        }
                    }
                }
            }
        })
}

/// Sends `sig` to the process group of node process `pid` (each node leads
/// its own group, so a node's children are stopped with it).
fn signal_group(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process group we created and have not reaped.
    unsafe {
        libc::kill(-(pid as libc::pid_t), sig);
    }
}

// Signals to the launcher reach the launch loop through a pipe: the handler
// only write(2)s the signal number, a thread turns it into a channel message.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);
const STOP_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_stop_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let byte = sig as u8;
        // SAFETY: write(2) is async-signal-safe; one byte from the stack.
        unsafe {
            libc::write(fd, (&byte as *const u8).cast(), 1);
        }
    }
}

/// The signals the launcher receives (SIGINT, SIGTERM, SIGHUP) while a
/// [`SignalGuard`] is held.
fn stop_signals() -> &'static Receiver<i32> {
    static SIGNALS: OnceLock<Receiver<i32>> = OnceLock::new();
    SIGNALS.get_or_init(|| {
        let (tx, rx) = unbounded();
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
            SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
            let read_fd = fds[0];
            let _ = std::thread::Builder::new()
                .name("launcher signals".into())
                .spawn(move || loop {
                    let mut byte = 0u8;
                    // SAFETY: read(2) into one byte on the stack.
                    let n = unsafe { libc::read(read_fd, (&mut byte as *mut u8).cast(), 1) };
                    if n == 1 {
                        if tx.send(i32::from(byte)).is_err() {
                            break;
                        }
                    } else if n == 0
                        || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                    {
                        break;
                    }
                });
        }
        rx
    })
}

/// Catches the stop signals for the launch loop; default handling returns
/// when it is dropped.
struct SignalGuard;

impl SignalGuard {
    fn install() -> SignalGuard {
        let signals = stop_signals();
        while signals.try_recv().is_ok() {}
        for sig in STOP_SIGNALS {
            set_handler(sig, on_stop_signal as *const () as usize);
        }
        SignalGuard
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for sig in STOP_SIGNALS {
            set_handler(sig, libc::SIG_DFL);
        }
    }
}

fn set_handler(sig: i32, handler: libc::sighandler_t) {
    // SAFETY: a zeroed sigaction with a handler that only calls write(2).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(sig, &action, std::ptr::null_mut());
    }
}

/// One node to run.
#[derive(Clone)]
struct NodeSpec {
    name: String,
    role: Role,
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
}

/// The running cluster: processes, output forwarders, exits.
struct Cluster {
    nodes: Vec<NodeSpec>,
    pids: Vec<u32>,
    /// Started, but their output and exit not yet watched (see
    /// [`Cluster::watch`]).
    unwatched: Vec<(usize, Child)>,
    outputs: Vec<JoinHandle<()>>,
    last_stderr: Vec<Arc<Mutex<Option<String>>>>,
    /// Each node's output prefix, `[worker 1]`, later maybe with its node
    /// id (see [`name_nodes`]).
    prefixes: Vec<Prefix>,
    /// Where started servers and workers go to have their node id found
    /// (elastic jobs).
    namer: Option<Sender<Unnamed>>,
    exits: Sender<(usize, Ended)>,
}

impl Cluster {
    /// Starts node `index`; [`Cluster::watch`] then forwards its output and
    /// reports its exit.
    fn spawn(&mut self, index: usize) -> Result<(), LaunchError> {
        let node = &self.nodes[index];
        let mut cmd = Command::new(&node.program);
        cmd.args(&node.args)
            .envs(node.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: Ctrl-C reaches the launcher, which stops the
            // nodes and says why, rather than every node dying at once.
            .process_group(0);
        // SAFETY: prctl only sets a flag of the child; async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // Die with the launcher rather than outlive it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            program: node.program.clone(),
            node: node.name.clone(),
            source,
        })?;
        self.pids[index] = child.id();
        let base = format!("[{}]", node.name);
        if let Ok(mut prefix) = self.prefixes[index].lock() {
            prefix.clone_from(&base);
        }
        if let (Some(namer), Role::Server | Role::Worker) = (&self.namer, node.role) {
            let _ = namer.send(Unnamed {
                pid: child.id(),
                role: node.role,
                name: node.name.clone(),
                prefix: self.prefixes[index].clone(),
            });
        }
        self.unwatched.push((index, child));
        Ok(())
    }

    /// Starts the threads that forward the output of the nodes started
    /// since the last call and report their exits. Starting them only after
    /// all nodes are up keeps the launcher small while it forks: fork copies
    /// the page tables of every thread's stack, which made starting 201
    /// nodes with three threads each take about 0.7 s of the launcher's own
    /// CPU time.
    fn watch(&mut self) {
        for (index, mut child) in std::mem::take(&mut self.unwatched) {
            let prefix = self.prefixes[index].clone();
            if let Some(out) = child.stdout.take() {
                self.outputs
                    .extend(forward(out, prefix.clone(), false, None).ok());
            }
            if let Some(err) = child.stderr.take() {
                let last = self.last_stderr[index].clone();
                self.outputs
                    .extend(forward(err, prefix, true, Some(last)).ok());
            }
            let exits = self.exits.clone();
            std::thread::spawn(move || {
                let _ = exits.send((index, ended(child.wait())));
            });
        }
    }

    /// `scheduler (pid 10), server 0 (pid 11), ...`
    fn pids_line(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .zip(&self.pids)
            .map(|(node, pid)| format!("{} (pid {pid})", node.name))
            .collect();
        nodes.join(", ")
    }

    fn last_stderr(&self, role: Role) -> Option<String> {
        let index = self.nodes.iter().position(|n| n.role == role)?;
        self.last_stderr[index].lock().ok()?.clone()
    }
}

/// The name (and output prefix) of the worker `--add-worker` starts.
pub const ADDED_WORKER: &str = "added worker";

/// Which nodes to start, with their programs and environments.
fn plan(opts: &LaunchOptions, port: u16) -> Result<Vec<NodeSpec>, LaunchError> {
    if opts.servers == 0 || opts.workers == 0 {
        return Err(LaunchError::Invalid(
            "--servers and --workers must be at least 1".into(),
        ));
    }
    if let Some((min, max)) = opts.elastic {
        if min == 0 || min > max {
            return Err(LaunchError::Invalid(format!(
                "--workers {min}:{max}: MIN:MAX needs 1 <= MIN <= MAX"
            )));
        }
        if opts.workers > max {
            return Err(LaunchError::Invalid(format!(
                "--start-workers {} is more than MAX in --workers {min}:{max}",
                opts.workers
            )));
        }
        if opts.worker_procs.is_some() {
            return Err(LaunchError::Invalid(
                "--worker-procs does not go with elastic workers (--workers MIN:MAX): \
                 each elastic worker is a process of its own"
                    .into(),
            ));
        }
    } else if opts.join {
        return Err(LaunchError::Invalid(
            "--add-worker needs the cluster's elastic bounds (--workers MIN:MAX)".into(),
        ));
    }
    let worker_procs = opts.worker_procs.unwrap_or(opts.workers);
    if worker_procs == 0 || opts.workers % worker_procs != 0 {
        return Err(LaunchError::Invalid(format!(
            "--worker-procs {worker_procs} must divide --workers {}",
            opts.workers
        )));
    }
    let advertised = opts.node_host.as_deref().unwrap_or(&opts.host);
    // The launcher sets DMLC_NODE_HOST, which a node prefers to
    // DMLC_INTERFACE: refuse rather than silently override.
    if let Some(interface) = std::env::var_os("DMLC_INTERFACE").filter(|v| !v.is_empty()) {
        return Err(LaunchError::Invalid(format!(
            "DMLC_INTERFACE is set ({}), but pslite launch gives every node DMLC_NODE_HOST={} \
             (--host), which takes precedence: unset DMLC_INTERFACE, or pass that \
             interface's address as --host",
            interface.to_string_lossy(),
            advertised
        )));
    }
    if let Ok(node_host) = std::env::var("DMLC_NODE_HOST") {
        if !node_host.is_empty() && node_host != advertised {
            return Err(LaunchError::Invalid(format!(
                "DMLC_NODE_HOST is set ({node_host}), but pslite launch gives every node \
                 DMLC_NODE_HOST={advertised} (--host): unset it, or pass --host {node_host}"
            )));
        }
    }
    // Nodes can measure their start-up from this instant.
    let launched_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let num_worker = match opts.elastic {
        Some((min, max)) => format!("{min}:{max}"),
        None => opts.workers.to_string(),
    };
    let common = |role: Role| {
        let mut env = vec![
            ("DMLC_ROLE".to_string(), role.as_str().to_string()),
            ("DMLC_NUM_SERVER".into(), opts.servers.to_string()),
            ("DMLC_NUM_WORKER".into(), num_worker.clone()),
            ("DMLC_PS_ROOT_URI".into(), opts.host.clone()),
            ("DMLC_PS_ROOT_PORT".into(), port.to_string()),
            ("DMLC_NODE_HOST".into(), advertised.to_string()),
            ("PSLITE_LAUNCH_UNIX_NS".into(), launched_ns.to_string()),
        ];
        env.extend(opts.env.iter().cloned());
        if std::env::var_os("GLIBC_TUNABLES").is_none() {
            env.push(("GLIBC_TUNABLES".into(), MALLOC_TUNABLES.into()));
        }
        if role == Role::Worker && opts.worker_procs.is_some() {
            env.push((
                "PSLITE_WORKERS_PER_PROCESS".into(),
                (opts.workers / worker_procs).to_string(),
            ));
        }
        env
    };
    // Check once what every node would check, so a bad value is one line,
    // not one per node.
    let env = common(Role::Worker);
    pslite::Config::from_lookup(|name| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
    })?;
    let command = |own: &Option<Vec<OsString>>| match own.as_deref() {
        Some([program, args @ ..]) => (program.clone(), args.to_vec()),
        _ => (opts.program.clone(), opts.args.clone()),
    };
    let mut nodes = Vec::new();
    let mut add = |name: String, role: Role, own: &Option<Vec<OsString>>| {
        let (program, args) = command(own);
        if program.is_empty() {
            return Err(LaunchError::Invalid(format!(
                "no program for the {name}: give PROGRAM after --, or --{}-program",
                role.as_str()
            )));
        }
        nodes.push(NodeSpec {
            name,
            role,
            program,
            args,
            env: common(role),
        });
        Ok(())
    };
    if opts.join {
        add(ADDED_WORKER.into(), Role::Worker, &opts.worker_program)?;
        return Ok(nodes);
    }
    add("scheduler".into(), Role::Scheduler, &opts.scheduler_program)?;
    for i in 0..opts.servers {
        add(format!("server {i}"), Role::Server, &opts.server_program)?;
    }
    for i in 0..worker_procs {
        add(format!("worker {i}"), Role::Worker, &opts.worker_program)?;
    }
    Ok(nodes)
}

/// Whether the nodes log connections (`PS_VERBOSE` 1 or more, in the
/// launcher's environment or `opts.env`): then the launcher says which
/// process is which node, too.
fn connections_logged(opts: &LaunchOptions) -> bool {
    let verbose = opts
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PS_VERBOSE")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("PS_VERBOSE").ok());
    verbose.is_some_and(|v| v.trim().parse::<u32>().is_ok_and(|v| v >= 1))
}

/// Runs the cluster to completion.
pub fn launch(opts: &LaunchOptions) -> Result<Outcome, LaunchError> {
    launch_with(opts, &crossbeam_channel::never())
}

/// [`launch`], carrying out the [`Control`] requests that arrive on
/// `control` while the job runs.
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
    let nodes = plan(opts, port)?;
    let count = nodes.len();
    let worker_template = nodes.iter().find(|n| n.role == Role::Worker).cloned();
    let (exits, exited) = unbounded();
    // Elastic clusters are pslite-only, so their scheduler answers the
    // admin requests that find node ids (a C++ scheduler may not).
    let namer = opts.elastic.map(|_| {
        let (tx, rx) = unbounded();
        let host = opts.host.clone();
        let env = opts.env.clone();
        let _ = std::thread::Builder::new()
            .name("node names".into())
            .spawn(move || name_nodes(&host, port, &env, &rx));
        tx
    });
    let mut cluster = Cluster {
        pids: vec![0; count],
        unwatched: Vec::new(),
        last_stderr: (0..count).map(|_| Arc::default()).collect(),
        prefixes: (0..count).map(|_| Arc::default()).collect(),
        namer,
        outputs: Vec::new(),
        exits,
        nodes,
    };
    let _signals = SignalGuard::install();
    let signals = stop_signals();
    for index in 0..count {
        if let Err(e) = cluster.spawn(index) {
            for &pid in &cluster.pids[..index] {
                signal_group(pid, libc::SIGKILL);
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
        },
        cluster
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.role))
            .collect(),
        Instant::now(),
    );
    let mut workers_started = cluster
        .nodes
        .iter()
        .filter(|n| n.role == Role::Worker)
        .count();
    let mut outcome = loop {
        if let Some(outcome) = supervisor.outcome() {
            break outcome;
        }
        let timer = supervisor
            .deadline()
            .map_or_else(crossbeam_channel::never, crossbeam_channel::at);
        let mut actions = select! {
            recv(exited) -> exit => match exit {
                Ok((index, ended)) => supervisor.on_exit(index, ended, Instant::now()),
                Err(_) => Vec::new(),
            },
            recv(signals) -> sig => match sig {
                Ok(sig) => supervisor.on_signal(sig, Instant::now()),
                Err(_) => Vec::new(),
            },
            recv(control) -> request => match (request, &worker_template) {
                (Ok(Control::AddWorker), Some(template)) => {
                    let name = format!("worker {workers_started}");
                    match supervisor.add_node(name.clone(), Role::Worker, Instant::now()) {
                        Some(index) => {
                            workers_started += 1;
                            cluster.nodes.push(NodeSpec {
                                name,
                                ..template.clone()
                            });
                            cluster.pids.push(0);
                            cluster.last_stderr.push(Arc::default());
                            cluster.prefixes.push(Arc::default());
                            vec![Action::Restart(index)]
                        }
                        None => Vec::new(),
                    }
                }
                (Ok(Control::SignalWorker { worker, signal }), _) => {
                    let name = format!("worker {worker}");
                    if let Some(index) = cluster.nodes.iter().position(|n| n.name == name) {
                        vec![Action::Signal { nodes: vec![index], signal }]
                    } else {
                        vec![Action::Say(format!("no {name} to signal"))]
                    }
                }
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
                            signal_group(cluster.pids[index], signal);
                        }
                    }
                    Action::Restart(index) => {
                        match cluster.spawn(index).map(|()| cluster.watch()) {
                            Ok(()) if verbose => eprintln!(
                                "pslite launch: started {} (pid {})",
                                cluster.nodes[index].name, cluster.pids[index]
                            ),
                            Ok(()) => {}
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
    drop(reservation);
    cluster.namer = None;
    for out in cluster.outputs.drain(..) {
        let _ = out.join();
    }
    if let Outcome::Failed {
        node,
        others,
        scheduler_said,
        ..
    } = &mut outcome
    {
        let scheduler_failed =
            node == "scheduler" || others.iter().any(|(name, _)| name == "scheduler");
        if scheduler_failed {
            *scheduler_said = cluster.last_stderr(Role::Scheduler);
        }
    }
    Ok(outcome)
}

/// A node's output prefix, shared with the threads that forward its output.
type Prefix = Arc<Mutex<String>>;

/// A started server or worker whose node id is not known yet.
struct Unnamed {
    pid: u32,
    role: Role,
    name: String,
    prefix: Prefix,
}

/// How often [`name_nodes`] asks the scheduler while nodes are unnamed.
const NAMING_PERIOD: Duration = Duration::from_millis(200);

/// Finds the node id of each server and worker started (sent on `started`)
/// and adds it to its output prefix: `[worker 1 (node 9)]`. Elastic workers
/// get ids in the order they register, not in launch order, and their ranks
/// change with every round, so the id is what links a process's output to
/// the rounds. The scheduler's status table gives each node's address; the
/// node whose process listens on that port (in `/proc/PID/fd` and
/// `/proc/PID/net/tcp`) is the one. Ends when `started` is closed.
fn name_nodes(host: &str, port: u16, env: &[(String, String)], started: &Receiver<Unnamed>) {
    let (local, token) = admin_settings(env);
    let mut client = None;
    let mut unnamed: Vec<Unnamed> = Vec::new();
    loop {
        let next = if unnamed.is_empty() {
            started.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            started.recv_timeout(NAMING_PERIOD)
        };
        match next {
            Ok(node) => {
                unnamed.retain(|u| !Arc::ptr_eq(&u.prefix, &node.prefix));
                unnamed.push(node);
                while let Ok(node) = started.try_recv() {
                    unnamed.retain(|u| !Arc::ptr_eq(&u.prefix, &node.prefix));
                    unnamed.push(node);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        if client.is_none() {
            client = admin_client(host, port, local, token.as_deref(), None).ok();
        }
        let Some(c) = client.as_mut() else { continue };
        let Ok(table) = c.status(NAMING_PERIOD) else {
            continue;
        };
        unnamed.retain(|node| {
            let ports = listening_ports(node.pid);
            let found = table.iter().find(|row| {
                row.node.role == node.role
                    && u16::try_from(row.node.port).is_ok_and(|p| ports.contains(&p))
            });
            match found {
                Some(row) => {
                    if let Ok(mut prefix) = node.prefix.lock() {
                        *prefix = format!("[{} (node {})]", node.name, row.node.id);
                    }
                    false
                }
                None => true,
            }
        });
    }
}

/// The TCP ports process `pid` listens on (none if it cannot be read).
fn listening_ports(pid: u32) -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = link
                .to_str()
                .and_then(|l| l.strip_prefix("socket:["))
                .and_then(|l| l.strip_suffix(']'))
                .and_then(|l| l.parse::<u64>().ok());
            inodes.extend(inode);
        }
    }
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is field 1 (HEXIP:HEXPORT), st 3 (0A: listening), inode 9.
            let (Some(local), Some(&"0A"), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let port = local
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if let (Some(port), Ok(inode)) = (port, inode.parse::<u64>()) {
                if inodes.contains(&inode) {
                    ports.push(port);
                }
            }
        }
    }
    ports
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

/// What an admin client of this job's scheduler needs from the nodes'
/// environment (the launch's own variables first, then the launcher's):
/// whether the cluster is local (`DMLC_LOCAL`: IPC) and its `PS_AUTH_TOKEN`.
fn admin_settings(env: &[(String, String)]) -> (bool, Option<String>) {
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
    };
    let local = matches!(
        var("DMLC_LOCAL").as_deref().map(str::trim),
        Some("1" | "true")
    );
    (local, var("PS_AUTH_TOKEN"))
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

    /// The race `PortReservation` closes: a port found free and released is
    /// handed to the next `bind(0)` that lands on it (after a few thousand
    /// binds on this machine). Held, it never is, and the scheduler (whose
    /// ZeroMQ socket sets SO_REUSEADDR, as std's listener does) still binds
    /// and listens on it.
    #[test]
    fn a_reserved_port_goes_to_no_other_bind_but_the_scheduler_can_listen_on_it() {
        let held = PortReservation::new("127.0.0.1").unwrap();
        let port = held.port();
        assert_ne!(port, 0);
        // 20 000 binds of port 0 (more than the odd ports bind(0) picks
        // from): none gets it.
        for _ in 0..20_000 {
            let other = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
            assert_ne!(other.local_addr().unwrap().port(), port);
        }
        let scheduler = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, _) = scheduler.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), client.local_addr().unwrap());
        drop(held);
    }

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

    fn opts() -> LaunchOptions {
        LaunchOptions {
            program: "true".into(),
            ..LaunchOptions::default()
        }
    }

    #[test]
    fn elastic_plans_give_every_node_min_max_and_start_the_asked_workers() {
        let plan_of = |o: &LaunchOptions| {
            plan(o, 9000).map(|nodes| {
                nodes
                    .iter()
                    .map(|n| {
                        let w = n.env.iter().find(|(k, _)| k == "DMLC_NUM_WORKER");
                        (
                            n.name.clone(),
                            w.map(|(_, v)| v.clone()).unwrap_or_default(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
        };
        let mut o = opts();
        o.elastic = Some((2, 4));
        o.workers = 3;
        let nodes = plan_of(&o).unwrap();
        assert_eq!(
            nodes.iter().map(|n| n.0.as_str()).collect::<Vec<_>>(),
            ["scheduler", "server 0", "worker 0", "worker 1", "worker 2"]
        );
        assert!(nodes.iter().all(|n| n.1 == "2:4"), "{nodes:?}");
        // One worker only, for a running cluster.
        o.join = true;
        o.workers = 1;
        let nodes = plan_of(&o).unwrap();
        assert_eq!(nodes, [(ADDED_WORKER.to_string(), "2:4".to_string())]);
        // More than MAX, or per-process workers: refused.
        let mut o = opts();
        o.elastic = Some((2, 4));
        o.workers = 5;
        assert!(plan_of(&o).is_err());
        o.workers = 2;
        o.worker_procs = Some(1);
        assert!(plan_of(&o).is_err());
        // Plain mode is unchanged.
        let mut o = opts();
        o.workers = 3;
        assert!(plan_of(&o).unwrap().iter().all(|n| n.1 == "3"));
    }
}
