//! How a node process ended ([`Ended`]), how a launch ended ([`Outcome`],
//! the launcher's exit code) and how that is told: the summary line and
//! the failure table.

use std::time::Duration;

/// How a node process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// Its status could not be read (the reason).
    Unknown(String),
}

impl Ended {
    /// Whether it exited 0.
    pub fn success(&self) -> bool {
        *self == Ended::Code(0)
    }

    /// What happened, to follow a node's name: `failed with exit code 3`,
    /// `was killed by signal 11 (SIGSEGV)`.
    pub fn describe(&self) -> String {
        match self {
            Ended::Code(0) => "exited 0".into(),
            Ended::Code(code) => format!("failed with exit code {code}"),
            Ended::Signal(sig) => format!("was killed by signal {sig} ({})", signal_name(*sig)),
            Ended::Unknown(why) => format!("ended with an unknown status ({why})"),
        }
    }

    /// What happened in a few words, for a table: `exit code 3`,
    /// `signal 11 (SIGSEGV)`.
    pub fn short(&self) -> String {
        match self {
            Ended::Code(code) => format!("exit code {code}"),
            Ended::Signal(sig) => format!("signal {sig} ({})", signal_name(*sig)),
            Ended::Unknown(why) => format!("unknown ({why})"),
        }
    }

    /// The launcher's exit code for it: the node's code, or 128 + the signal.
    pub fn exit_code(&self) -> i32 {
        match self {
            Ended::Code(code) => *code,
            Ended::Signal(sig) => 128 + sig,
            Ended::Unknown(_) => 1,
        }
    }
}

/// The usual name of signal `sig` (`SIGSEGV`), or `unknown signal`.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGSYS => "SIGSYS",
        _ => "unknown signal",
    }
}

/// How a launch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every node exited 0.
    Success,
    /// A node failed; the others were stopped.
    Failed {
        /// Its name (`worker 1`).
        node: String,
        /// How it ended.
        ended: Ended,
        /// Other nodes that failed on their own before being stopped,
        /// with how they ended.
        others: Vec<(String, Ended)>,
        /// The nodes stopped because of it.
        stopped: Vec<String>,
        /// The scheduler's last line on stderr, when it failed too: when a
        /// cluster does not form, its reason names who never registered.
        /// Filled in by the launcher, which sees the output.
        scheduler_said: Option<String>,
        /// The failure summary's rows (see [`failure_table`]); filled in
        /// by the launcher, which knows ranks and error lines.
        failures: Vec<FailureRow>,
    },
    /// The time limit passed.
    TimedOut {
        /// The limit.
        limit: Duration,
        /// Every node still running then (all stopped).
        running: Vec<String>,
    },
    /// A node exited 0 but the others kept running past the grace period.
    Stranded {
        /// The node that exited first.
        node: String,
        /// The grace period.
        grace: Duration,
        /// The nodes still running then (all stopped).
        running: Vec<String>,
    },
    /// The launcher got a signal.
    Interrupted {
        /// The signal.
        signal: i32,
        /// The nodes running then (all stopped).
        running: Vec<String>,
    },
}

impl Outcome {
    /// The launcher's exit code: 0, the failed node's, 124 on a timeout,
    /// 1 for a stranded job, 128 + the signal when interrupted.
    pub fn exit_code(&self) -> u8 {
        let code = match self {
            Outcome::Success => 0,
            Outcome::Failed { ended, .. } => ended.exit_code().clamp(1, 255),
            Outcome::TimedOut { .. } => 124,
            Outcome::Stranded { .. } => 1,
            Outcome::Interrupted { signal, .. } => 128 + signal,
        };
        code.clamp(0, 255) as u8
    }

    /// What to tell the user, the best diagnosis last: the summary, the
    /// failure table, then what the scheduler said when it failed.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![self.summary()];
        if let Outcome::Failed {
            scheduler_said,
            failures,
            ..
        } = self
        {
            if !failures.is_empty() {
                lines.push("failed nodes:".into());
                lines.extend(failure_table(failures));
            }
            if let Some(said) = scheduler_said {
                lines.push(format!("the scheduler said: {said}"));
            }
        }
        lines
    }

    /// One line saying how the job ended and what was stopped.
    pub fn summary(&self) -> String {
        match self {
            Outcome::Success => "every node exited 0".into(),
            Outcome::Failed {
                node,
                ended,
                others,
                stopped,
                ..
            } => {
                let mut line = format!("{node} {}", ended.describe());
                for (other, how) in others {
                    line += &format!("; {other} {}", how.describe());
                }
                line + &stopped_list(stopped)
            }
            Outcome::TimedOut { limit, running } => format!(
                "timed out after {} s (--timeout){}",
                seconds(*limit),
                stopped_list(running)
            ),
            Outcome::Stranded {
                node,
                grace,
                running,
            } => format!(
                "{node} exited 0 but {} kept running for {} s (--exit-grace){}",
                count(running.len()),
                seconds(*grace),
                stopped_list(running)
            ),
            Outcome::Interrupted { signal, running } => {
                format!("received {}{}", signal_name(*signal), stopped_list(running))
            }
        }
    }
}

fn stopped_list(nodes: &[String]) -> String {
    if nodes.is_empty() {
        String::new()
    } else {
        format!("; stopped {}", nodes.join(", "))
    }
}

/// `1 node`, `3 nodes`.
pub(super) fn count(nodes: usize) -> String {
    match nodes {
        1 => "1 node".into(),
        n => format!("{n} nodes"),
    }
}

/// `1.5` for 1.5 s, `30` for 30 s.
pub(super) fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}

/// One row of the failure summary: a node that failed on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureRow {
    /// The node's name, `worker 1 (node 11)`.
    pub node: String,
    /// Its rank, if known.
    pub rank: Option<String>,
    /// How it ended, `exit code 3`.
    pub exit: String,
    /// When, `1.2 s` after the start.
    pub time: String,
    /// The first error line it wrote on stderr, if any.
    pub first_error: Option<String>,
}

/// The failure summary, a table like torchrun's: one row per node that
/// failed on its own, in the order they ended; no lines when none did.
pub fn failure_table(rows: &[FailureRow]) -> Vec<String> {
    if rows.is_empty() {
        return Vec::new();
    }
    let header = ["node", "rank", "exit", "time", "first error line"];
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.node.clone(),
                r.rank.clone().unwrap_or_else(|| "-".into()),
                r.exit.clone(),
                r.time.clone(),
                r.first_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let width = |col: usize| {
        cells
            .iter()
            .map(|c| c[col].chars().count())
            .chain([header[col].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..4).map(width).collect();
    let line = |c: [&str; 5]| {
        format!(
            "  {:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        )
        .trim_end()
        .to_string()
    };
    let mut lines = vec![line(header)];
    lines.extend(
        cells
            .iter()
            .map(|c| line([&c[0], &c[1], &c[2], &c[3], &c[4]])),
    );
    lines
}
