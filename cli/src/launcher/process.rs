//! The launched processes: starting them, following their output and exits,
//! signalling them.
//!
//! Each process is a [`NodeProc`]: what to run, its process id once
//! started, its output and the port reserved for it. Every process leads a
//! process group of its own (Ctrl-C reaches only the launcher, which stops
//! the nodes and says why; a signal to a node reaches its children too).

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use pslite_proto::{NodeId, Role};

use super::naming::{names, Named, Unnamed};
use super::output::{forward, NodeOutput};
use super::plan::NodeSpec;
use super::ports::PortReservation;
use super::watchdog::Watchdog;
use super::LaunchError;
use crate::supervisor::Ended;

/// How long a started server's or worker's output is held for its name
/// (its node id, once the cluster formed; see [`NodeOutput`]).
const NAME_HOLD: Duration = Duration::from_secs(3);

/// One launched process.
pub struct NodeProc {
    /// What it runs.
    pub spec: NodeSpec,
    /// Its name for people (see [`names`]).
    pub name: String,
    /// Its process id; 0 before it started.
    pub pid: u32,
    /// Its output, prefixed with its name.
    pub output: Arc<NodeOutput>,
    /// Its node ids, once the scheduler's table showed them.
    pub ids: Vec<NodeId>,
    /// Its ranks, once known (`1`, or `0, 2` for several workers).
    pub rank: Option<String>,
    /// The port it was given (`PORT`), held until it exits.
    reservation: Option<PortReservation>,
}

impl NodeProc {
    /// A process not started yet.
    fn new(spec: NodeSpec, log_dir: Option<PathBuf>) -> NodeProc {
        let (name, stem) = names(&spec, 0, None, false);
        NodeProc {
            output: Arc::new(NodeOutput::new(&name, &stem, log_dir)),
            name,
            spec,
            pid: 0,
            ids: Vec::new(),
            rank: None,
            reservation: None,
        }
    }
}

/// The running processes of a launch.
pub struct Cluster {
    /// Every process started (or to start), in launch order.
    pub nodes: Vec<NodeProc>,
    /// The host nodes advertise: their ports are reserved there.
    host: String,
    /// Started, but their output and exit not yet watched (see
    /// [`Cluster::watch`]).
    unwatched: Vec<(usize, Child)>,
    outputs: Vec<JoinHandle<()>>,
    /// Where started servers and workers go to have their node id found.
    namer: Option<Sender<Unnamed>>,
    exits: Sender<(usize, Ended)>,
    /// Elastic workers (names by node id).
    elastic: bool,
    /// `--log-dir`.
    log_dir: Option<PathBuf>,
    /// Kills every node's group if the launcher dies.
    watchdog: Option<Watchdog>,
}

impl Cluster {
    /// The processes of `specs`, none started; exits are sent to `exits`,
    /// started servers and workers to `namer`. Nodes are named as elastic
    /// ones with `elastic`, and write their output to `log_dir` too.
    pub fn new(
        specs: Vec<NodeSpec>,
        host: &str,
        namer: Option<Sender<Unnamed>>,
        exits: Sender<(usize, Ended)>,
        elastic: bool,
        log_dir: Option<PathBuf>,
    ) -> Result<Cluster, LaunchError> {
        let watchdog = Watchdog::start().map_err(|e| {
            LaunchError::Invalid(format!(
                "cannot start the watchdog that stops the nodes with the launcher: {e}"
            ))
        })?;
        Ok(Cluster {
            nodes: specs
                .into_iter()
                .map(|spec| NodeProc::new(spec, log_dir.clone()))
                .collect(),
            host: host.to_string(),
            unwatched: Vec::new(),
            outputs: Vec::new(),
            namer,
            exits,
            elastic,
            log_dir,
            watchdog: Some(watchdog),
        })
    }

    /// Reserves a port for every process that gets one, in increasing order
    /// of launch index within each role: the scheduler orders nodes by
    /// (host, port) when it assigns ids, so ranks follow launch order.
    pub fn reserve_ports(&mut self) -> Result<(), LaunchError> {
        for role in [Role::Server, Role::Worker] {
            let indices: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].spec.role == role && self.nodes[i].spec.own_port)
                .collect();
            let mut held = indices
                .iter()
                .map(|_| self.reserve())
                .collect::<Result<Vec<_>, _>>()?;
            held.sort_by_key(PortReservation::port);
            for (index, reservation) in indices.into_iter().zip(held) {
                let node = &mut self.nodes[index];
                node.spec.set_port(reservation.port());
                node.reservation = Some(reservation);
            }
        }
        Ok(())
    }

    fn reserve(&self) -> Result<PortReservation, LaunchError> {
        PortReservation::new(&self.host).map_err(|source| LaunchError::Port {
            host: self.host.clone(),
            source,
        })
    }

    /// Adds a process (not started) and returns its index.
    pub fn add(&mut self, spec: NodeSpec) -> usize {
        self.nodes.push(NodeProc::new(spec, self.log_dir.clone()));
        self.nodes.len() - 1
    }

    /// Starts process `index` (again, after a restart: with a new port);
    /// [`Cluster::watch`] then forwards its output and reports its exit.
    /// Call it from a thread that lives as long as the job (see
    /// [`watchdog`](super::watchdog)).
    pub fn spawn(&mut self, index: usize) -> Result<(), LaunchError> {
        if !self.watchdog.as_ref().is_some_and(Watchdog::has_room) {
            return Err(LaunchError::Invalid(format!(
                "more than {} nodes at once",
                super::watchdog::CAPACITY
            )));
        }
        if self.nodes[index].spec.own_port && self.nodes[index].reservation.is_none() {
            let reservation = self.reserve()?;
            let node = &mut self.nodes[index];
            node.spec.set_port(reservation.port());
            node.reservation = Some(reservation);
        }
        let node = &mut self.nodes[index];
        let spec = &node.spec;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: Ctrl-C reaches the launcher, which stops the
            // nodes and says why, rather than every node dying at once.
            .process_group(0);
        let launcher = std::process::id();
        // SAFETY: prctl, getppid and _exit are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // Die with the launcher rather than outlive it (the
                // watchdog also stops the node's children); if the launcher
                // died before this, do not start at all.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if u32::try_from(libc::getppid()).ok() != Some(launcher) {
                    libc::_exit(137);
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            program: spec.program.clone(),
            node: spec.name.clone(),
            source,
        })?;
        node.pid = child.id();
        if let Some(watchdog) = &mut self.watchdog {
            watchdog.watch(node.pid);
        }
        node.ids.clear();
        node.rank = spec.expected_rank.map(|r| r.to_string());
        let (name, stem) = names(spec, node.pid, None, self.elastic);
        node.name = name;
        let naming = self.namer.is_some() && spec.role != Role::Scheduler;
        let hold = naming.then(|| Instant::now() + NAME_HOLD);
        node.output.started(&node.name, &stem, hold);
        if let (Some(namer), Role::Server | Role::Worker) = (&self.namer, spec.role) {
            let _ = namer.send(Unnamed {
                index,
                pid: node.pid,
                role: spec.role,
                port: spec.port().filter(|_| spec.own_port),
            });
        }
        self.unwatched.push((index, child));
        Ok(())
    }

    /// Starts the threads that forward the output of the processes started
    /// since the last call and report their exits. Starting them only after
    /// all nodes are up keeps the launcher small while it forks: fork copies
    /// the page tables of every thread's stack, which made starting 201
    /// nodes with three threads each take about 0.7 s of the launcher's own
    /// CPU time.
    pub fn watch(&mut self) {
        for (index, mut child) in std::mem::take(&mut self.unwatched) {
            let output = &self.nodes[index].output;
            if let Some(out) = child.stdout.take() {
                self.outputs
                    .extend(forward(out, Arc::clone(output), false).ok());
            }
            if let Some(err) = child.stderr.take() {
                self.outputs
                    .extend(forward(err, Arc::clone(output), true).ok());
            }
            let exits = self.exits.clone();
            std::thread::spawn(move || {
                let _ = exits.send((index, ended(child.wait())));
            });
        }
    }

    /// Process `index` ended: what it left running in its group is killed,
    /// its port is free again.
    pub fn exited(&mut self, index: usize) {
        self.signal(index, libc::SIGKILL);
        let Some(node) = self.nodes.get_mut(index) else {
            return;
        };
        node.reservation = None;
        if let Some(watchdog) = &mut self.watchdog {
            watchdog.forget(node.pid);
        }
    }

    /// The namer found which nodes a process is: returns its index and new
    /// name; `None` if that process has ended or been replaced since.
    pub fn named(&mut self, found: Named) -> Option<(usize, String)> {
        let node = self.nodes.get_mut(found.index)?;
        if node.pid != found.pid {
            return None;
        }
        let (name, stem) = names(&node.spec, node.pid, Some(&found), self.elastic);
        let ranks: Option<Vec<String>> = found
            .ranks
            .iter()
            .map(|r| r.map(|r| r.to_string()))
            .collect();
        node.rank = ranks.map(|r| r.join(", "));
        node.ids = found.ids;
        node.output.rename(&name, &stem);
        node.name = name;
        Some((found.index, node.name.clone()))
    }

    /// The process that hosts node `id`.
    pub fn index_of(&self, id: NodeId) -> Option<usize> {
        self.nodes.iter().position(|n| n.ids.contains(&id))
    }

    /// Releases the output held past its hold; returns the next hold's end.
    pub fn release_held(&self, now: Instant) -> Option<Instant> {
        self.nodes
            .iter()
            .filter_map(|n| n.output.release_due(now))
            .min()
    }

    /// Sends `signal` to process `index`'s group (the process and its
    /// children).
    pub fn signal(&self, index: usize, signal: i32) {
        if let Some(pid) = self
            .nodes
            .get(index)
            .and_then(|n| libc::pid_t::try_from(n.pid).ok())
            .filter(|&pid| pid > 0)
        {
            // SAFETY: kill(2) on a process group we created and have not reaped.
            unsafe {
                libc::kill(-pid, signal);
            }
        }
    }

    /// `scheduler (pid 10), server 0 (pid 11), ...`
    pub fn pids_line(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("{} (pid {})", node.name, node.pid))
            .collect();
        nodes.join(", ")
    }

    /// The last line on stderr of the first process of `role`.
    pub fn last_stderr(&self, role: Role) -> Option<String> {
        let node = self.nodes.iter().find(|n| n.spec.role == role)?;
        node.output.last_stderr()
    }

    /// Stops naming and the watchdog, and waits until every line of output
    /// is forwarded.
    pub fn finish(&mut self) {
        self.namer = None;
        for out in self.outputs.drain(..) {
            let _ = out.join();
        }
        self.watchdog = None;
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
