//! The launched processes: starting them, following their output and exits,
//! signalling them.
//!
//! Each process is a [`NodeProc`]: what to run, its process id once
//! started, its output and the port reserved for it. Every process leads a
//! process group of its own (Ctrl-C reaches only the launcher, which stops
//! the nodes and says why; a signal to a node reaches its children too).

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use pslite_proto::{NodeId, Role};

use super::naming::{Named, Unnamed};
use super::output::{forward, NodeOutput};
use super::plan::NodeSpec;
use super::ports::PortReservation;
use super::LaunchError;
use crate::supervisor::Ended;

/// One launched process.
pub struct NodeProc {
    /// What it runs.
    pub spec: NodeSpec,
    /// Its process id; 0 before it started.
    pub pid: u32,
    /// Its output, prefixed with its name.
    pub output: Arc<NodeOutput>,
    /// Its node ids, once the scheduler's table showed them.
    pub ids: Vec<NodeId>,
    /// The port it was given (`PORT`), held until it exits.
    reservation: Option<PortReservation>,
}

impl NodeProc {
    /// A process not started yet.
    pub fn new(spec: NodeSpec) -> NodeProc {
        NodeProc {
            output: Arc::new(NodeOutput::new(&spec.name)),
            spec,
            pid: 0,
            ids: Vec::new(),
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
}

impl Cluster {
    /// The processes of `specs`, none started; exits are sent to `exits`,
    /// started servers and workers to `namer`.
    pub fn new(
        specs: Vec<NodeSpec>,
        host: &str,
        namer: Option<Sender<Unnamed>>,
        exits: Sender<(usize, Ended)>,
    ) -> Cluster {
        Cluster {
            nodes: specs.into_iter().map(NodeProc::new).collect(),
            host: host.to_string(),
            unwatched: Vec::new(),
            outputs: Vec::new(),
            namer,
            exits,
        }
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
        self.nodes.push(NodeProc::new(spec));
        self.nodes.len() - 1
    }

    /// Starts process `index` (again, after a restart: with a new port);
    /// [`Cluster::watch`] then forwards its output and reports its exit.
    pub fn spawn(&mut self, index: usize) -> Result<(), LaunchError> {
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
        // SAFETY: prctl only sets a flag of the child; async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // Die with the launcher rather than outlive it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            program: spec.program.clone(),
            node: spec.name.clone(),
            source,
        })?;
        node.pid = child.id();
        node.ids.clear();
        node.output.rename(&spec.name);
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

    /// Process `index` ended: its port is free again.
    pub fn exited(&mut self, index: usize) {
        if let Some(node) = self.nodes.get_mut(index) {
            node.reservation = None;
        }
    }

    /// The namer found which nodes a process is; `None` if that process
    /// has ended or been replaced since.
    pub fn named(&mut self, found: Named) -> Option<&NodeProc> {
        let node = self.nodes.get_mut(found.index)?;
        if node.pid != found.pid {
            return None;
        }
        node.ids = found.ids;
        let ids: Vec<String> = node.ids.iter().map(NodeId::to_string).collect();
        let label = match ids.as_slice() {
            [id] => format!("{} (node {id})", node.spec.name),
            ids => format!("{} (nodes {})", node.spec.name, ids.join(", ")),
        };
        node.output.rename(&label);
        Some(node)
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
            .map(|node| format!("{} (pid {})", node.spec.name, node.pid))
            .collect();
        nodes.join(", ")
    }

    /// The last line on stderr of the first process of `role`.
    pub fn last_stderr(&self, role: Role) -> Option<String> {
        let node = self.nodes.iter().find(|n| n.spec.role == role)?;
        node.output.last_stderr()
    }

    /// Stops naming and waits until every line of output is forwarded.
    pub fn finish(&mut self) {
        self.namer = None;
        for out in self.outputs.drain(..) {
            let _ = out.join();
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
