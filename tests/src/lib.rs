//! Fixtures for the integration tests: the release binaries (built once per
//! test run), and bounded runs of `pslite launch` or of single nodes.
//!
//! Every run has a deadline: a process still running at its deadline is
//! killed and the run reports `timed_out`, so a hang fails a test instead of
//! blocking CI.

pub mod hostile;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn release_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        workspace().join(target)
    };
    target.join("release")
}

/// Builds the `pslite` binary and the examples in release mode, once per
/// test process, and returns the release directory.
pub fn release_bins() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace())
            .args([
                "build",
                "--release",
                "-p",
                "pslite",
                "-p",
                "pslite-cli",
                "--bins",
                "--examples",
            ])
            .status()
            .expect("cannot run cargo build for the release binaries");
        assert!(status.success(), "cargo build --release failed");
        release_dir()
    })
}

/// The `pslite` binary.
pub fn pslite_bin() -> PathBuf {
    release_bins().join("pslite")
}

/// A built example program.
pub fn example(name: &str) -> PathBuf {
    release_bins().join("examples").join(name)
}

/// What a bounded run produced.
#[derive(Debug)]
pub struct Run {
    /// Exit status (None if killed at the deadline).
    pub status: Option<ExitStatus>,
    /// Whether the deadline passed.
    pub timed_out: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

impl Run {
    /// The exit code (None if killed by a signal or at the deadline).
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// Whether it exited 0.
    pub fn ok(&self) -> bool {
        self.code() == Some(0)
    }

    /// Both outputs, for assertion messages.
    pub fn output(&self) -> String {
        format!(
            "status {:?} (timed out: {})\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.timed_out, self.stdout, self.stderr
        )
    }

    /// Panics with the output unless the run exited 0.
    pub fn assert_ok(&self) -> &Self {
        assert!(self.ok(), "run failed:\n{}", self.output());
        self
    }
}

/// Panics, showing every run's output, unless all runs exited 0.
pub fn assert_all_ok(runs: &[Run]) {
    if runs.iter().all(Run::ok) {
        return;
    }
    let all: Vec<String> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| format!("===== process {i}\n{}", r.output()))
        .collect();
    panic!("a process failed:\n{}", all.join("\n"));
}

/// Reads lines from `r`, forwards each on `lines`, and returns them all.
fn drain(
    r: impl Read + Send + 'static,
    lines: crossbeam_channel::Sender<String>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut all = String::new();
        let mut reader = std::io::BufReader::new(r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match std::io::BufRead::read_until(&mut reader, b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line).into_owned();
                    all.push_str(&text);
                    let _ = lines.send(text.trim_end().to_string());
                }
            }
        }
        all
    })
}

/// A started process whose output is being collected (and streamed).
pub struct Spawned {
    child: Child,
    out: Option<std::thread::JoinHandle<String>>,
    err: Option<std::thread::JoinHandle<String>>,
    lines: crossbeam_channel::Receiver<String>,
    stdin: Option<std::process::ChildStdin>,
    started: Instant,
}

/// Starts `cmd` with piped output, in its own process group.
pub fn spawn(cmd: Command) -> Spawned {
    spawn_inner(cmd, false)
}

/// Like [`spawn`], with a pipe to the process's standard input.
pub fn spawn_with_stdin(cmd: Command) -> Spawned {
    spawn_inner(cmd, true)
}

fn spawn_inner(mut cmd: Command, stdin: bool) -> Spawned {
    use std::os::unix::process::CommandExt;
    cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().expect("cannot spawn a test process");
    let (tx, lines) = crossbeam_channel::unbounded();
    let out = child.stdout.take().map(|o| drain(o, tx.clone()));
    let err = child.stderr.take().map(|e| drain(e, tx));
    let stdin = child.stdin.take();
    Spawned {
        child,
        out,
        err,
        lines,
        stdin,
        started: Instant::now(),
    }
}

impl Spawned {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to the whole process group.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the group we created.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), sig);
        }
    }

    /// Waits (up to `limit`) for an output line containing `needle`, and
    /// returns it; `None` if the deadline passed or the output ended.
    pub fn wait_for_line(&self, needle: &str, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            match self.lines.recv_deadline(deadline) {
                Ok(line) if line.contains(needle) => return Some(line),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Writes `text` to the process's standard input.
    pub fn write_stdin(&mut self, text: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("spawned without stdin");
        stdin
            .write_all(text.as_bytes())
            .expect("cannot write to stdin");
        stdin.flush().expect("cannot flush stdin");
    }

    /// Waits up to `limit`, killing the process group if it is still running.
    pub fn wait(mut self, limit: Duration) -> Run {
        drop(self.stdin.take());
        let deadline = self.started + limit;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let pid = self.child.id();
        let mut child = self.child;
        let waiter = std::thread::spawn(move || {
            let status = child.wait();
            let _ = tx.send(());
            status
        });
        let timed_out = rx.recv_deadline(deadline).is_err();
        if timed_out {
            // SAFETY: kill(2) on the group we created.
            unsafe {
                libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
            }
        }
        let status = waiter.join().ok().and_then(Result::ok);
        Run {
            status: if timed_out { None } else { status },
            timed_out,
            stdout: self
                .out
                .take()
                .and_then(|h| h.join().ok())
                .unwrap_or_default(),
            stderr: self
                .err
                .take()
                .and_then(|h| h.join().ok())
                .unwrap_or_default(),
            elapsed: self.started.elapsed(),
        }
    }
}

/// Runs `cmd` to completion within `limit`.
pub fn run(cmd: Command, limit: Duration) -> Run {
    spawn(cmd).wait(limit)
}

/// A `pslite launch` of an example program, bounded in time.
#[derive(Clone, Debug)]
pub struct Launch {
    /// `--servers`.
    pub servers: usize,
    /// `--workers`.
    pub workers: usize,
    /// Extra launcher arguments (before `--`).
    pub launcher_args: Vec<String>,
    /// The program (a path) and its arguments.
    pub program: Vec<String>,
    /// Extra environment.
    pub env: HashMap<String, String>,
    /// The launcher's `--timeout`; the test kills it 15 s later.
    pub timeout: Duration,
}

impl Launch {
    /// `servers` + `workers` nodes of example `name`.
    pub fn example(name: &str, servers: usize, workers: usize) -> Launch {
        Launch {
            servers,
            workers,
            launcher_args: Vec::new(),
            program: vec![example(name).to_string_lossy().into_owned()],
            env: HashMap::new(),
            timeout: Duration::from_secs(120),
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Launch {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Adds launcher arguments.
    pub fn arg(mut self, arg: &str) -> Launch {
        self.launcher_args.push(arg.into());
        self
    }

    /// Adds program arguments.
    pub fn program_arg(mut self, arg: &str) -> Launch {
        self.program.push(arg.into());
        self
    }

    /// Sets the time limit.
    pub fn timeout(mut self, t: Duration) -> Launch {
        self.timeout = t;
        self
    }

    /// The launcher command.
    pub fn command(&self) -> Command {
        let mut cmd = pslite_command("launch");
        cmd.arg("--servers")
            .arg(self.servers.to_string())
            .arg("--workers")
            .arg(self.workers.to_string())
            .arg("--timeout")
            .arg(self.timeout.as_secs_f64().to_string())
            .args(&self.launcher_args)
            .arg("--")
            .args(&self.program)
            .envs(&self.env);
        cmd
    }

    /// Runs it to completion.
    pub fn run(&self) -> Run {
        run(self.command(), self.timeout + Duration::from_secs(15))
    }
}

/// The environment of one node of a cluster around a scheduler at
/// 127.0.0.1:`port`.
pub fn node_env(role: &str, servers: usize, workers: usize, port: u16) -> Vec<(String, String)> {
    [
        ("DMLC_ROLE", role.to_string()),
        ("DMLC_NUM_SERVER", servers.to_string()),
        ("DMLC_NUM_WORKER", workers.to_string()),
        ("DMLC_PS_ROOT_URI", "127.0.0.1".to_string()),
        ("DMLC_PS_ROOT_PORT", port.to_string()),
        ("DMLC_NODE_HOST", "127.0.0.1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// [`node_env`] plus `extra` variables.
pub fn node_env_with(
    role: &str,
    servers: usize,
    workers: usize,
    port: u16,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut env = node_env(role, servers, workers, port);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// Removes the ps-lite variables of the test's own environment (`DMLC_*`,
/// `PS_*`, `PORT`, `RUST_LOG`) from `cmd`, so it sees only what the test sets.
fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("DMLC_") || k.starts_with("PS_") || k == "PORT" || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
}

/// A command running example `name` as one node, with a clean ps-lite
/// environment plus `env`.
pub fn node_command(name: &str, env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(example(name));
    clean_env(&mut cmd);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd
}

/// Starts example `name` as a `role` node of a cluster of `servers` and
/// `workers` around 127.0.0.1:`port`, with `extra` variables.
pub fn spawn_node(
    name: &str,
    role: &str,
    servers: usize,
    workers: usize,
    port: u16,
    extra: &[(&str, &str)],
) -> Spawned {
    let env = node_env_with(role, servers, workers, port, extra);
    spawn(node_command(name, &env))
}

/// `pslite SUBCOMMAND` with a clean ps-lite environment (the test adds
/// what it needs).
pub fn pslite_command(subcommand: &str) -> Command {
    let mut cmd = Command::new(pslite_bin());
    cmd.arg(subcommand);
    clean_env(&mut cmd);
    cmd
}

/// Waits for every process, in order, each up to `limit` from its start;
/// panics, showing every output, unless all exited 0.
pub fn wait_all_ok(procs: impl IntoIterator<Item = Spawned>, limit: Duration) -> Vec<Run> {
    let runs: Vec<Run> = procs.into_iter().map(|p| p.wait(limit)).collect();
    assert_all_ok(&runs);
    runs
}

/// The message a KVWorker (app 0, customer 0) sends for a push of `u64`
/// keys and `f32` values at `timestamp`, for tests that speak ZeroMQ
/// themselves (forged or raw peers).
pub fn kv_push(timestamp: i32, keys: Vec<u8>, vals: Vec<u8>) -> pslite::Message {
    pslite::Message {
        meta: pslite::Meta {
            app_id: 0,
            customer_id: 0,
            request: true,
            push: true,
            head: 0,
            timestamp,
            data_type: vec![pslite::DataType::UInt64, pslite::DataType::Float],
            ..pslite::Meta::default()
        },
        data: vec![keys.into(), vals.into()],
    }
}

/// Polls `cond` every 20 ms until it holds (true) or `limit` passes
/// (false): for state that has no event to wait on, such as `/proc`.
pub fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free TCP port on 127.0.0.1 for a scheduler a test starts.
///
/// Taken below the kernel's ephemeral range (32768-60999), from a counter
/// that starts at a random place per test process: a port from `bind(0)`
/// is released before the scheduler binds it, and in between any outgoing
/// connection of a test running alongside (ZeroMQ's DEALERs, nodes binding
/// `:*`) could be given it. Ports below that range are never handed out by
/// the kernel, and the counter keeps this process's tests apart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    static NEXT: OnceLock<AtomicU16> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU16::new(rand::random_range(0..SPAN)));
    for _ in 0..SPAN {
        let port = LOW + next.fetch_add(1, Ordering::Relaxed) % SPAN;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {LOW}..{}", LOW + SPAN)
}

/// A whole cluster inside this test process: one `Postoffice` per node, on
/// real ZeroMQ sockets over 127.0.0.1 (Postoffices are values, not globals,
/// so several live in one process).
pub struct LocalCluster {
    /// The scheduler.
    pub scheduler: pslite::Postoffice,
    /// The servers, by rank.
    pub servers: Vec<pslite::Postoffice>,
    /// The workers, by rank.
    pub workers: Vec<pslite::Postoffice>,
}

impl LocalCluster {
    /// Starts `servers` + `workers` nodes and a scheduler; returns once every
    /// node has passed the start barrier (or panics after 60 s).
    pub fn start(servers: usize, workers: usize) -> LocalCluster {
        LocalCluster::start_with(servers, workers, |_| {})
    }

    /// Like [`LocalCluster::start`], with every node's configuration
    /// adjusted by `adjust` (heartbeats, resend...).
    pub fn start_with(
        servers: usize,
        workers: usize,
        adjust: impl Fn(&mut pslite::Config),
    ) -> LocalCluster {
        use pslite::{Config, Postoffice, Role};
        let port = free_port();
        let config = |role| {
            let mut c = Config::new(
                role,
                servers as i32,
                workers as i32,
                "127.0.0.1",
                port as i32,
            );
            c.van.start_timeout = Duration::from_secs(60);
            adjust(&mut c);
            c
        };
        let mut nodes = vec![Postoffice::new(config(Role::Scheduler))];
        nodes.extend((0..servers).map(|_| Postoffice::new(config(Role::Server))));
        nodes.extend((0..workers).map(|_| Postoffice::new(config(Role::Worker))));
        let joins: Vec<_> = nodes
            .iter()
            .cloned()
            .map(|po| std::thread::spawn(move || po.start(0, true)))
            .collect();
        for j in joins {
            j.join()
                .expect("start panicked")
                .expect("a node failed to start");
        }
        let scheduler = nodes.remove(0);
        let mut servers_v: Vec<_> = nodes.drain(..servers).collect();
        let mut workers_v = nodes;
        let rank = |po: &pslite::Postoffice| po.my_rank().unwrap_or(0);
        servers_v.sort_by_key(rank);
        workers_v.sort_by_key(rank);
        LocalCluster {
            scheduler,
            servers: servers_v,
            workers: workers_v,
        }
    }

    /// Like [`LocalCluster::start`], every node with `PS_AUTH_TOKEN` set
    /// to `token`.
    pub fn start_with_token(servers: usize, workers: usize, token: &str) -> LocalCluster {
        LocalCluster::start_with(servers, workers, |cfg| {
            cfg.van.auth_token = pslite::admin::AuthToken::new(token);
        })
    }

    /// Every node finalizes with a barrier (in parallel).
    pub fn finalize(self) {
        let all: Vec<_> = std::iter::once(self.scheduler)
            .chain(self.servers)
            .chain(self.workers)
            .collect();
        let joins: Vec<_> = all
            .into_iter()
            .map(|po| std::thread::spawn(move || po.finalize(0, true)))
            .collect();
        for j in joins {
            j.join()
                .expect("finalize panicked")
                .expect("a node failed to finalize");
        }
    }
}

/// A launcher output prefix, `[worker 1 (node 11)]`: role, rank, node id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePrefix {
    /// `scheduler`, `server` or `worker`.
    pub role: String,
    /// The rank, when the name has one.
    pub rank: Option<u32>,
    /// The node id, once the launcher knew it.
    pub id: Option<i32>,
}

/// The node prefix `line` starts with, if any: `[scheduler]`, `[server 0]`,
/// `[worker 1 (node 11)]`, `[worker (node 13)]`.
pub fn node_prefix(line: &str) -> Option<NodePrefix> {
    let inner = line.strip_prefix('[')?.split_once(']')?.0;
    let (name, id) = match inner.split_once(" (node ") {
        Some((name, id)) => (name, Some(id.strip_suffix(')')?.parse().ok()?)),
        None => (inner, None),
    };
    let mut words = name.split(' ');
    let role = words.next()?.to_string();
    let rank = match words.next() {
        Some(rank) => Some(rank.parse().ok()?),
        None => None,
    };
    matches!(role.as_str(), "scheduler" | "server" | "worker").then_some(NodePrefix {
        role,
        rank,
        id,
    })
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

/// A directory under the system's temporary directory, unique to this
/// process and call, deleted (with everything in it) when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<tmp>/pslite-<what>-<pid>-<n>`.
    pub fn new(what: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("pslite-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("cannot create a temporary directory");
        TempDir(path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
