//! What `pslite demo` does to its running cluster, and what it reads of
//! the changes: `--elastic` adds a worker and kills one ([`Elastic`]),
//! `--kill-server` kills a server and prints the failover of its key
//! ranges ([`Failover`]). Both turn the nodes' reports into the
//! launcher's [`Control`] requests.

use super::args::DemoArgs;
use super::plot;
use super::report;
use crate::launcher::Control;

/// The launching process's part in `--elastic`: when to add a worker and
/// when to kill one, and the rounds seen.
pub(super) struct Elastic {
    on: bool,
    started: usize,
    join_after: usize,
    kill_after: usize,
    kill_worker: usize,
    /// The last epoch evaluated.
    epoch: usize,
    joined: bool,
    /// A round had more workers than were started (the added one trains).
    grown: bool,
    pub(super) killed: bool,
    /// The last round printed.
    round: Option<u64>,
    /// Its workers' node ids, in rank order.
    pub(super) members: Vec<i32>,
    /// Every round printed, for the chart.
    pub(super) rounds: Vec<plot::RoundMark>,
    pending: Vec<Control>,
}

impl Elastic {
    pub(super) fn new(args: &DemoArgs) -> Elastic {
        Elastic {
            on: args.elastic,
            started: args.workers,
            join_after: args.join_after,
            kill_after: args.kill_after,
            kill_worker: args.kill_worker,
            epoch: 0,
            joined: false,
            grown: false,
            killed: false,
            round: None,
            members: Vec::new(),
            rounds: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Epoch `epoch` was evaluated.
    pub(super) fn epoch_done(&mut self, epoch: usize) {
        self.epoch = epoch;
        self.decide();
    }

    /// Round `round` began with `workers` workers after `after_epoch`
    /// epochs; whether it is new.
    pub(super) fn round_began(&mut self, round: u64, after_epoch: usize, members: &[i32]) -> bool {
        if self.round.is_some_and(|r| r >= round) {
            return false;
        }
        let workers = members.len();
        self.round = Some(round);
        self.members = members.to_vec();
        self.rounds.push(plot::RoundMark {
            round,
            after_epoch,
            workers,
        });
        self.grown |= workers > self.started;
        self.decide();
        true
    }

    fn decide(&mut self) {
        if !self.on {
            return;
        }
        if self.join_after > 0 && !self.joined && self.epoch >= self.join_after {
            self.joined = true;
            self.pending.push(Control::AddWorker);
        }
        // Kill only once the added worker is in a round, so that the
        // kill ends a round of its own.
        let ready = self.grown || self.join_after == 0;
        // The rank is the current round's: the launcher knows nodes by id.
        let victim = self.members.get(self.kill_worker).copied();
        if let (true, Some(id)) = (
            self.kill_after > 0 && !self.killed && self.epoch >= self.kill_after && ready,
            victim,
        ) {
            self.killed = true;
            self.pending.push(Control::SignalNode {
                id,
                signal: libc::SIGKILL,
            });
        }
    }

    /// What to ask of the launcher now.
    pub(super) fn requests(&mut self) -> Vec<Control> {
        std::mem::take(&mut self.pending)
    }

    /// Workers that should report at the end.
    pub(super) fn workers_expected(&self) -> usize {
        self.started + usize::from(self.joined) - usize::from(self.killed)
    }
}

/// The launching process's part in `--replicas` and `--kill-server`: when to
/// kill a server, and the range maps seen, to print the failover.
pub(super) struct Failover {
    /// Server rank to kill, after epoch `kill_after`.
    kill: Option<usize>,
    kill_after: usize,
    /// When the server was killed (ms since the Unix epoch).
    killed_at_ms: Option<u64>,
    /// The scheduler's last map: version, when made, replicas per range.
    map: Option<(u64, u64, Vec<Vec<i32>>)>,
    /// Maps worker 0 reported (version, when), not yet printed.
    worker_seen: Vec<(u64, u64)>,
    pending: Vec<Control>,
}

impl Failover {
    pub(super) fn new(args: &DemoArgs) -> Failover {
        Failover {
            kill: args.kill_server,
            kill_after: args.kill_after,
            killed_at_ms: None,
            map: None,
            worker_seen: Vec::new(),
            pending: Vec::new(),
        }
    }

    pub(super) fn killed(&self) -> usize {
        usize::from(self.killed_at_ms.is_some())
    }

    /// Epoch `epoch` was evaluated: maybe kill the server.
    pub(super) fn epoch_done(&mut self, epoch: usize) -> Option<String> {
        let rank = self.kill?;
        if self.killed_at_ms.is_some() || epoch < self.kill_after {
            return None;
        }
        self.killed_at_ms = Some(unix_ms());
        let id = 8 + 2 * rank as i32;
        self.pending.push(Control::SignalNode {
            id,
            signal: libc::SIGKILL,
        });
        Some(format!(
            "killing server {rank} (node {id}) with SIGKILL after epoch {epoch}"
        ))
    }

    /// A range map report: the lines to print.
    pub(super) fn ranges(
        &mut self,
        seen_by: &str,
        version: u64,
        at_ms: u64,
        replicas: &[Vec<i32>],
    ) -> Vec<String> {
        if seen_by != "scheduler" {
            // Worker 0 routes by the map the scheduler made; its report may
            // arrive first (another connection).
            self.worker_seen.push((version, at_ms));
            return self.worker_lines();
        }
        let mut lines = match &self.map {
            None => vec![format!(
                "key ranges, {} copies each: {}",
                replicas.iter().map(Vec::len).max().unwrap_or(0),
                report::describe_ranges(replicas)
            )],
            Some((_, _, before)) => {
                let when = match self.killed_at_ms {
                    Some(killed) => format!(
                        ", {:.3} s after the kill (the scheduler promotes the next replicas as it \
                         declares the death)",
                        at_ms.saturating_sub(killed) as f64 / 1e3
                    ),
                    None => String::new(),
                };
                let mut lines = vec![format!("failover: range map version {version}{when}")];
                lines.extend(
                    report::describe_moves(before, replicas)
                        .into_iter()
                        .map(|m| format!("  {m}")),
                );
                lines
            }
        };
        self.map = Some((version, at_ms, replicas.to_vec()));
        lines.extend(self.worker_lines());
        lines
    }

    /// Worker 0's use of the scheduler's maps after a kill, once both are
    /// known.
    fn worker_lines(&mut self) -> Vec<String> {
        let Some((made, made_ms, _)) = &self.map else {
            return Vec::new();
        };
        let (made, made_ms) = (*made, *made_ms);
        let killed = self.killed_at_ms.is_some();
        let mut lines = Vec::new();
        self.worker_seen.retain(|&(version, at_ms)| {
            if version > made {
                return true;
            }
            if version == made && killed && version > 1 {
                lines.push(format!(
                    "  worker 0 routes by map version {version} {} ms after the scheduler made it",
                    at_ms.saturating_sub(made_ms)
                ));
            }
            false
        });
        lines
    }

    /// What to ask of the launcher now.
    pub(super) fn requests(&mut self) -> Vec<Control> {
        std::mem::take(&mut self.pending)
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
