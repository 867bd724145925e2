//! What `pslite launch` decides while a cluster runs, without processes.
//!
//! [`Supervisor`] is a state machine in the style of the scheduler and the
//! resender: the launcher feeds it what happened (a node ended, a signal
//! arrived, a deadline passed) with the time, and carries out the
//! [`Action`]s it returns (signal nodes, restart one, print a line). The
//! rules:
//!
//! - A node that fails (non-zero exit or a signal) fails the job. Its role
//!   may be restarted instead (`--restart-on-failure`), a bounded number of
//!   times. Before stopping the others, the supervisor waits a moment
//!   ([`Policy::settle`]) for the scheduler to end on its own: when a cluster
//!   does not form, every node fails at about the same time, and the
//!   scheduler's reason (who never registered) is the one worth reading.
//! - A node that exits 0 while others keep running (a server that forgot to
//!   finalize) is named after a few seconds, and the job is stopped with a
//!   failure if the others still run after [`Policy::exit_grace`].
//! - With elastic workers (`DMLC_NUM_WORKER=MIN:MAX`, [`Policy::elastic`]),
//!   a worker that fails or is killed is not a job failure by itself: the
//!   scheduler ends its round and the survivors go on. Its end is said, and
//!   the job's result comes from the scheduler, the servers and the other
//!   workers (below MIN for too long, the scheduler fails the job). A
//!   worker that exits 0 while other workers still run has left; only the
//!   last one to exit 0 starts the early-exit grace.
//! - With replicated key ranges (`PS_REPLICAS=k`, k >= 2,
//!   [`Policy::replicas`]), a server that fails or is killed is not a job
//!   failure by itself either: the other replicas of its ranges serve them.
//!   If every replica of a range dies, the workers fail, and so does the job.
//! - Nodes may be added while the job runs ([`Supervisor::add_node`]).
//! - `--timeout` stops every node still running; so does SIGINT, SIGTERM or
//!   SIGHUP to the launcher (a second one kills at once).
//! - Stopping is SIGTERM, then SIGKILL after [`Policy::kill_grace`].

mod outcome;

use std::time::{Duration, Instant};

use pslite_proto::Role;

#[cfg(test)]
use outcome::failure_table;
use outcome::{count, seconds};
pub use outcome::{signal_name, Ended, FailureRow, Outcome};

/// What the launcher must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Print this line (the launcher prefixes `pslite launch: `).
    Say(String),
    /// Send `signal` to these nodes (by index).
    Signal {
        /// The nodes.
        nodes: Vec<usize>,
        /// The signal.
        signal: i32,
    },
    /// Start node `index` again, with the same program and environment.
    Restart(usize),
}

/// The supervisor's rules, in time.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Stop everything this long after the start (`--timeout`).
    pub timeout: Option<Duration>,
    /// After a node exits 0, how long the others may keep running.
    pub exit_grace: Duration,
    /// After a node fails, how long to wait for the scheduler to end on
    /// its own before stopping the others.
    pub settle: Duration,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Restart failed nodes of this role.
    pub restart_role: Option<Role>,
    /// At most this many restarts in all.
    pub max_restarts: u32,
    /// Elastic workers: a worker's failure or early exit does not end the job.
    pub elastic: bool,
    /// `PS_REPLICAS`: with 2 or more, a server's failure does not end the job.
    pub replicas: u32,
}

/// How long after an early exit 0 the launcher names the node (at most
/// the grace period). Nodes of a healthy job end within moments of each
/// other; a scheduler with heartbeats may take a second more.
const EXIT_NOTICE: Duration = Duration::from_secs(3);

struct NodeState {
    name: String,
    role: Role,
    running: bool,
}

/// A node process that ended, for the failure summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct End {
    /// The node's index.
    pub index: usize,
    /// Its name when it ended.
    pub name: String,
    /// How it ended.
    pub ended: Ended,
    /// When, counted from the start of the job.
    pub after: Duration,
    /// The supervisor had told it to stop (a consequence, not a cause).
    pub stopped: bool,
}

enum State {
    Running,
    /// A node failed; waiting until `stop_at` for the scheduler.
    Settling {
        outcome: Outcome,
        stop_at: Instant,
    },
    /// The others were told to stop; SIGKILL at `kill_at`.
    Stopping {
        outcome: Outcome,
        kill_at: Option<Instant>,
    },
}

/// A node exited 0 while others ran.
struct EarlyExit {
    node: usize,
    notice_at: Option<Instant>,
    give_up_at: Instant,
}

/// The launcher's decisions for one cluster (see the module docs).
pub struct Supervisor {
    policy: Policy,
    nodes: Vec<NodeState>,
    started: Instant,
    state: State,
    early_exit: Option<EarlyExit>,
    restarts: u32,
    /// Every node end, in order.
    ends: Vec<End>,
}

impl Supervisor {
    /// A supervisor for these nodes (name and role), all started at `now`.
    pub fn new(policy: Policy, nodes: Vec<(String, Role)>, now: Instant) -> Supervisor {
        Supervisor {
            policy,
            nodes: nodes
                .into_iter()
                .map(|(name, role)| NodeState {
                    name,
                    role,
                    running: true,
                })
                .collect(),
            started: now,
            state: State::Running,
            early_exit: None,
            restarts: 0,
            ends: Vec::new(),
        }
    }

    /// Node `index` is called `name` from now on (the launcher learned its
    /// rank or node id).
    pub fn rename(&mut self, index: usize, name: String) {
        if let Some(node) = self.nodes.get_mut(index) {
            node.name = name;
        }
    }

    /// The nodes that failed on their own (not stopped by the supervisor),
    /// in the order they ended: the rows of the failure summary.
    pub fn failures(&self) -> Vec<&End> {
        self.ends
            .iter()
            .filter(|e| !e.ended.success() && !e.stopped)
            .collect()
    }

    fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].running)
            .collect()
    }

    fn running_names(&self) -> Vec<String> {
        self.running()
            .into_iter()
            .map(|i| self.nodes[i].name.clone())
            .collect()
    }

    /// Whether node `index` is the scheduler.
    fn is_scheduler(&self, index: usize) -> bool {
        self.nodes[index].role == Role::Scheduler
    }

    /// Whether a worker other than `index` still runs.
    fn other_worker_running(&self, index: usize) -> bool {
        self.nodes
            .iter()
            .enumerate()
            .any(|(i, n)| i != index && n.role == Role::Worker && n.running)
    }

    /// Adds a node of `role` called `name`, started at `now`, and returns
    /// its index; `None` once the job is being stopped (do not start it).
    pub fn add_node(&mut self, name: String, role: Role, _now: Instant) -> Option<usize> {
        if !matches!(self.state, State::Running) {
            return None;
        }
        self.nodes.push(NodeState {
            name,
            role,
            running: true,
        });
        Some(self.nodes.len() - 1)
    }

    fn scheduler_running(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| n.role == Role::Scheduler && n.running)
    }

    /// Stop every running node (SIGTERM now, SIGKILL later) for `outcome`.
    fn stop(&mut self, outcome: Outcome, now: Instant) -> Vec<Action> {
        let running = self.running();
        self.state = State::Stopping {
            outcome,
            kill_at: Some(now + self.policy.kill_grace),
        };
        if running.is_empty() {
            Vec::new()
        } else {
            vec![Action::Signal {
                nodes: running,
                signal: libc::SIGTERM,
            }]
        }
    }

    /// Node `index` ended at `now`.
    pub fn on_exit(&mut self, index: usize, ended: Ended, now: Instant) -> Vec<Action> {
        let Some(node) = self.nodes.get_mut(index) else {
            return Vec::new();
        };
        node.running = false;
        let name = node.name.clone();
        let role = node.role;
        self.ends.push(End {
            index,
            name: name.clone(),
            ended: ended.clone(),
            after: now.saturating_duration_since(self.started),
            stopped: matches!(self.state, State::Stopping { .. }),
        });
        match &mut self.state {
            State::Stopping { .. } => Vec::new(),
            State::Settling { outcome, .. } => {
                if let Outcome::Failed { others, .. } = outcome {
                    if !ended.success() {
                        others.push((name, ended));
                    }
                }
                if self.scheduler_running() {
                    return Vec::new();
                }
                // The scheduler has spoken (or exited): stop the rest now.
                if let State::Settling { stop_at, .. } = &mut self.state {
                    *stop_at = now;
                }
                self.on_tick(now)
            }
            State::Running if ended.success() => {
                // An elastic worker that exits 0 while other workers train
                // has left the job: not a reason to stop it.
                let left =
                    self.policy.elastic && role == Role::Worker && self.other_worker_running(index);
                if !left && self.early_exit.is_none() && !self.running().is_empty() {
                    self.early_exit = Some(EarlyExit {
                        node: index,
                        notice_at: Some(now + EXIT_NOTICE.min(self.policy.exit_grace)),
                        give_up_at: now + self.policy.exit_grace,
                    });
                }
                Vec::new()
            }
            State::Running => {
                if self.policy.restart_role == Some(role)
                    && self.restarts < self.policy.max_restarts
                {
                    self.restarts += 1;
                    self.nodes[index].running = true;
                    return vec![
                        Action::Say(format!(
                            "{name} {}; restarting it (restart {} of {}, --restart-on-failure)",
                            ended.describe(),
                            self.restarts,
                            self.policy.max_restarts
                        )),
                        Action::Restart(index),
                    ];
                }
                if self.policy.replicas >= 2 && role == Role::Server {
                    return vec![Action::Say(format!(
                        "{name} {}; the job goes on without it (PS_REPLICAS={}: other servers \
                         hold copies of its key ranges)",
                        ended.describe(),
                        self.policy.replicas
                    ))];
                }
                if self.policy.elastic && role == Role::Worker {
                    return vec![Action::Say(format!(
                        "{name} {}; the job goes on without it (elastic workers: the scheduler \
                         starts a new round with the others)",
                        ended.describe()
                    ))];
                }
                let outcome = Outcome::Failed {
                    node: name,
                    ended,
                    others: Vec::new(),
                    stopped: Vec::new(),
                    scheduler_said: None,
                    failures: Vec::new(),
                };
                if self.is_scheduler(index) || !self.scheduler_running() {
                    let outcome = self.with_stopped(outcome);
                    self.stop(outcome, now)
                } else {
                    self.state = State::Settling {
                        outcome,
                        stop_at: now + self.policy.settle,
                    };
                    Vec::new()
                }
            }
        }
    }

    /// `outcome` with the list of nodes about to be stopped filled in.
    fn with_stopped(&self, mut outcome: Outcome) -> Outcome {
        if let Outcome::Failed { stopped, .. } = &mut outcome {
            *stopped = self.running_names();
        }
        outcome
    }

    /// The launcher got signal `signal`.
    pub fn on_signal(&mut self, signal: i32, now: Instant) -> Vec<Action> {
        match &self.state {
            State::Stopping { .. } => {
                // A second request: no more waiting.
                let running = self.running();
                if let State::Stopping { kill_at, .. } = &mut self.state {
                    *kill_at = None;
                }
                if running.is_empty() {
                    return Vec::new();
                }
                vec![
                    Action::Say(format!(
                        "received {} again; killing {}",
                        signal_name(signal),
                        self.running_names().join(", ")
                    )),
                    Action::Signal {
                        nodes: running,
                        signal: libc::SIGKILL,
                    },
                ]
            }
            _ => {
                let running = self.running_names();
                let mut actions = vec![Action::Say(format!(
                    "received {}: stopping the job ({}){}",
                    signal_name(signal),
                    running.join(", "),
                    if running.is_empty() {
                        ""
                    } else {
                        "; send it again to kill them at once"
                    }
                ))];
                actions.extend(self.stop(Outcome::Interrupted { signal, running }, now));
                actions
            }
        }
    }

    /// When the launcher must call [`Supervisor::on_tick`] next, if at all.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.state {
            State::Stopping { kill_at, .. } => *kill_at,
            State::Settling { stop_at, .. } => Some(*stop_at),
            State::Running => {
                let timeout = self.policy.timeout.map(|t| self.started + t);
                let early = self
                    .early_exit
                    .as_ref()
                    .map(|e| e.notice_at.unwrap_or(e.give_up_at));
                match (timeout, early) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            }
        }
    }

    /// Time has passed: act on every deadline up to `now`.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        match &mut self.state {
            State::Stopping { kill_at, .. } => match *kill_at {
                Some(at) if at <= now => {
                    *kill_at = None;
                    let running = self.running();
                    if running.is_empty() {
                        Vec::new()
                    } else {
                        vec![Action::Signal {
                            nodes: running,
                            signal: libc::SIGKILL,
                        }]
                    }
                }
                _ => Vec::new(),
            },
            State::Settling { outcome, stop_at } => {
                if *stop_at > now {
                    return Vec::new();
                }
                let outcome = outcome.clone();
                let outcome = self.with_stopped(outcome);
                self.stop(outcome, now)
            }
            State::Running => {
                if let Some(limit) = self.policy.timeout {
                    if self.started + limit <= now {
                        let running = self.running_names();
                        return self.stop(Outcome::TimedOut { limit, running }, now);
                    }
                }
                let mut actions = Vec::new();
                let Some(early) = &mut self.early_exit else {
                    return actions;
                };
                if early.notice_at.is_some_and(|at| at <= now) {
                    early.notice_at = None;
                    let node = early.node;
                    let before_grace = early.give_up_at > now;
                    let running = self.running_names();
                    // Past the grace already: the summary will say it.
                    if !running.is_empty() && before_grace {
                        actions.push(Action::Say(format!(
                            "{} exited 0 while {} kept running ({}); stopping them in {} s unless they finish (--exit-grace)",
                            self.nodes[node].name,
                            count(running.len()),
                            running.join(", "),
                            seconds(
                                self.policy
                                    .exit_grace
                                    .saturating_sub(EXIT_NOTICE.min(self.policy.exit_grace))
                            )
                        )));
                    }
                }
                if let Some(early) = &self.early_exit {
                    if early.give_up_at <= now && early.notice_at.is_none() {
                        let outcome = Outcome::Stranded {
                            node: self.nodes[early.node].name.clone(),
                            grace: self.policy.exit_grace,
                            running: self.running_names(),
                        };
                        actions.extend(self.stop(outcome, now));
                    }
                }
                actions
            }
        }
    }

    /// How the job ended, once no node runs; `None` while any does.
    pub fn outcome(&self) -> Option<Outcome> {
        if !self.running().is_empty() {
            return None;
        }
        Some(match &self.state {
            State::Running => Outcome::Success,
            State::Settling { outcome, .. } | State::Stopping { outcome, .. } => outcome.clone(),
        })
    }
}

#[cfg(test)]
mod tests;
