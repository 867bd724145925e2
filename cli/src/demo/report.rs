//! What the nodes tell the launching process: one line of JSON per
//! [`Report`] (serde) over a loopback TCP connection (`--report ADDR`), and
//! the same reports as lines for people.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};

use crossbeam_channel::Sender;
use log::warn;
use pslite::Error;

/// What a node reports, one line of JSON each on the wire.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "report", rename_all = "snake_case")]
pub enum Report {
    /// Worker 0 is `done` minibatches into epoch `epoch` of `total`.
    Progress {
        /// The epoch, from 1.
        epoch: usize,
        /// Minibatches done.
        done: usize,
        /// Minibatches in the epoch.
        total: usize,
    },
    /// Worker 0's evaluation on the held-out split after an epoch (epoch 0:
    /// before training).
    Epoch {
        /// The epoch, from 1; 0 before training.
        epoch: usize,
        /// Mean log loss on the held-out split.
        loss: f64,
        /// Accuracy on the held-out split.
        accuracy: f64,
        /// Seconds the epoch took, training and evaluation.
        secs: f64,
    },
    /// A worker's traffic, when it is done.
    Worker {
        /// Its rank.
        rank: usize,
        /// Training samples in its shard.
        samples: usize,
        /// Push and pull calls it made.
        requests: u64,
        /// Bytes of keys and values it pushed.
        pushed: u64,
        /// Bytes of keys it sent in pulls and of keys and values it got back.
        pulled: u64,
        /// Bytes it sent to and received from the servers on the wire
        /// (metas and compressed values included).
        #[serde(default)]
        wire: u64,
    },
    /// The rank 0 of a new elastic round saw it begin (the launching
    /// process prints each round once).
    Round {
        /// The round number.
        round: u64,
        /// Epochs done when it began (trained, maybe not yet evaluated).
        after_epoch: usize,
        /// Its workers' node ids, in rank order.
        workers: Vec<i32>,
    },
    /// The range map of replicated key ranges (`--replicas`), when it
    /// changed, as the scheduler (which makes it) or worker 0 (which routes
    /// by it) saw it.
    Ranges {
        /// `scheduler` or `worker 0`.
        seen_by: String,
        /// The map's version.
        version: u64,
        /// When it was seen, in ms since the Unix epoch (the launching
        /// process compares it with when it killed a server).
        at_ms: u64,
        /// Each range's replicas (node ids), primary first.
        replicas: Vec<Vec<i32>>,
    },
    /// A server's state, when it is done.
    Server {
        /// Its rank.
        rank: usize,
        /// Keys it holds a weight for.
        keys: usize,
        /// Pushes it applied.
        pushes: u64,
        /// Pulls it answered.
        pulls: u64,
        /// Bounded staleness: pulls it held back.
        #[serde(default)]
        stale_held: u64,
        /// Bounded staleness: the largest clock gap (a worker's clock
        /// less the slowest's) a pull was answered with.
        #[serde(default)]
        stale_max_gap: u64,
    },
    /// `--staleness`/`--slow-worker`: worker 0's seconds from the start of
    /// training to its first evaluation at or above the threshold.
    Staleness {
        /// `None`: never reached.
        time_to_threshold_s: Option<f64>,
    },
}

impl Report {
    /// The wire form: one line of JSON, `{"report":"epoch","epoch":1,...}`.
    pub fn to_line(&self) -> String {
        // A report is numbers and a tag: it serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the wire form; `None` if the line is not a report.
    pub fn from_line(line: &str) -> Option<Report> {
        serde_json::from_str(line).ok()
    }

    /// The report as a line for people; `epochs` is the number of epochs.
    pub fn human(&self, epochs: usize) -> String {
        match self {
            // On a terminal the demo draws a bar instead (see super::progress).
            Report::Progress { epoch, done, total } => format!(
                "epoch {epoch:>w$}/{epochs}  {done}/{total} minibatches",
                w = digits(epochs)
            ),
            Report::Epoch {
                epoch: 0,
                loss,
                accuracy,
                ..
            } => format!(
                "epoch {:>w$}/{epochs}  test loss {loss:.4}  accuracy {accuracy:.4}  (before training)",
                0,
                w = digits(epochs)
            ),
            Report::Epoch {
                epoch,
                loss,
                accuracy,
                secs,
            } => format!(
                "epoch {epoch:>w$}/{epochs}  test loss {loss:.4}  accuracy {accuracy:.4}  {secs:5.2} s",
                w = digits(epochs)
            ),
            Report::Worker {
                rank,
                samples,
                requests,
                pushed,
                pulled,
                wire,
            } => format!(
                "worker {rank}: {} samples, {} requests, pushed {}, pulled {}, {} on the wire",
                group(*samples as u64),
                group(*requests),
                megabytes(*pushed),
                megabytes(*pulled),
                megabytes(*wire)
            ),
            Report::Round {
                round,
                after_epoch,
                workers,
            } => {
                let when = match after_epoch {
                    0 => "before training".to_string(),
                    e => format!("after epoch {e}"),
                };
                let members: Vec<String> = workers
                    .iter()
                    .enumerate()
                    .map(|(rank, id)| format!("worker {rank} (node {id})"))
                    .collect();
                format!("round {round} began {when}: {}", members.join(", "))
            }
            Report::Ranges {
                seen_by,
                version,
                replicas,
                ..
            } => format!(
                "key ranges (map version {version}, as {seen_by} sees it): {}",
                describe_ranges(replicas)
            ),
            Report::Server {
                rank,
                keys,
                pushes,
                pulls,
                ..
            } => format!(
                "server {rank}: {} keys, {} pushes applied, {} pulls answered",
                group(*keys as u64),
                group(*pushes),
                group(*pulls)
            ),
            Report::Staleness {
                time_to_threshold_s,
            } => match time_to_threshold_s {
                Some(t) => format!("worker 0 reached the threshold after {t:.2} s"),
                None => "worker 0 never reached the threshold".into(),
            },
        }
    }
}

/// `range 0 on nodes 8 (primary), 10; range 1 on ...`.
pub fn describe_ranges(replicas: &[Vec<i32>]) -> String {
    let ranges: Vec<String> = replicas
        .iter()
        .enumerate()
        .map(|(r, nodes)| match nodes.split_first() {
            None => format!("range {r} lost"),
            Some((primary, [])) => format!("range {r} on node {primary} alone"),
            Some((primary, backups)) => {
                let backups: Vec<String> = backups.iter().map(i32::to_string).collect();
                format!(
                    "range {r} on node {primary} (primary), {}",
                    backups.join(", ")
                )
            }
        })
        .collect();
    ranges.join("; ")
}

/// What changed from `before` to `after` (each range's replicas, primary
/// first): `range 0: primary node 8 -> node 10`, `range 1: node 8 dropped`.
pub fn describe_moves(before: &[Vec<i32>], after: &[Vec<i32>]) -> Vec<String> {
    let mut moves = Vec::new();
    for (r, now) in after.iter().enumerate() {
        let was: &[i32] = before.get(r).map_or(&[], Vec::as_slice);
        if was == now.as_slice() {
            continue;
        }
        if now.is_empty() {
            let nodes: Vec<String> = was.iter().map(i32::to_string).collect();
            moves.push(format!(
                "range {r}: lost with its last replica (node {})",
                nodes.join(", ")
            ));
            continue;
        }
        let mut changes = Vec::new();
        if let (Some(a), Some(b)) = (was.first(), now.first()) {
            if a != b {
                changes.push(format!("primary node {a} -> node {b}"));
            }
        }
        let gone: Vec<String> = was
            .iter()
            .filter(|n| !now.contains(n))
            .map(|n| format!("node {n}"))
            .collect();
        if !gone.is_empty() {
            changes.push(format!("{} dropped", gone.join(", ")));
        }
        let added: Vec<String> = now
            .iter()
            .filter(|n| !was.contains(n))
            .map(|n| format!("node {n}"))
            .collect();
        if !added.is_empty() {
            changes.push(format!("{} added", added.join(", ")));
        }
        moves.push(format!("range {r}: {}", changes.join(", ")));
    }
    moves
}

pub fn digits(n: usize) -> usize {
    n.to_string().len()
}

/// `1234567` as `1 234 567`.
pub fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

pub fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Where a node sends its reports.
pub enum Reporter {
    /// To the launching process, as wire lines.
    Launcher(TcpStream),
    /// To stdout, for people.
    Print {
        /// Epochs in the run.
        epochs: usize,
    },
    /// Into a list (tests).
    #[cfg(test)]
    Collect(Vec<Report>),
}

impl Reporter {
    /// A second reporter to the same place, for another thread (none in
    /// tests that collect).
    pub fn for_thread(&self) -> Option<Reporter> {
        match self {
            Reporter::Launcher(stream) => stream.try_clone().ok().map(Reporter::Launcher),
            Reporter::Print { epochs } => Some(Reporter::Print { epochs: *epochs }),
            #[cfg(test)]
            Reporter::Collect(_) => None,
        }
    }

    pub fn send(&mut self, report: Report) -> Result<(), Error> {
        match self {
            // One write per line: two threads may report on clones of
            // the stream.
            Reporter::Launcher(stream) => stream
                .write_all(format!("{}\n", report.to_line()).as_bytes())
                .and_then(|()| stream.flush())
                .map_err(|e| Error::App(format!("cannot report to `pslite demo`: {e}"))),
            Reporter::Print { epochs } => {
                if !matches!(report, Report::Progress { .. }) {
                    println!("{}", report.human(*epochs));
                }
                Ok(())
            }
            #[cfg(test)]
            Reporter::Collect(reports) => {
                reports.push(report);
                Ok(())
            }
        }
    }
}

/// Accepts the nodes' report connections on `listener` and sends their
/// reports to `tx`, from a thread per connection; a line that is no report
/// is logged and skipped. Returns when `listener` fails.
pub fn collect<T: From<Report> + Send + 'static>(listener: TcpListener, tx: Sender<T>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                match Report::from_line(&line) {
                    Some(report) => {
                        if tx.send(T::from(report)).is_err() {
                            break;
                        }
                    }
                    None => warn!("pslite demo: ignoring report line {line:?}"),
                }
            }
        });
    }
}

/// `s` for plural counts.
pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_through_their_wire_form() {
        let reports = [
            Report::Progress {
                epoch: 2,
                done: 7,
                total: 90,
            },
            Report::Epoch {
                epoch: 3,
                loss: 0.123_456_789,
                accuracy: 0.9,
                secs: 1.5,
            },
            Report::Worker {
                rank: 1,
                samples: 90_000,
                requests: 905,
                pushed: 76_000_000,
                pulled: 140_000_000,
                wire: 150_000_000,
            },
            Report::Server {
                rank: 0,
                keys: 301_913,
                pushes: 900,
                pulls: 906,
                stale_held: 3,
                stale_max_gap: 2,
            },
            Report::Staleness {
                time_to_threshold_s: Some(1.5),
            },
            Report::Ranges {
                seen_by: "scheduler".into(),
                version: 3,
                at_ms: 1_790_000_000_123,
                replicas: vec![vec![10], vec![10]],
            },
        ];
        for r in reports {
            assert_eq!(Report::from_line(&r.to_line()), Some(r));
        }
        assert_eq!(
            Report::Round {
                round: 2,
                after_epoch: 3,
                workers: vec![9, 13]
            }
            .to_line(),
            r#"{"report":"round","round":2,"after_epoch":3,"workers":[9,13]}"#
        );
        for junk in [
            "",
            "epoch 1 2 3 4",
            r#"{"report":"epoch","epoch":1}"#,
            r#"{"report":"epoch","epoch":"x","loss":1,"accuracy":1,"secs":1}"#,
            r#"{"report":"hello"}"#,
            "hello",
        ] {
            assert_eq!(Report::from_line(junk), None, "{junk:?}");
        }
        let line = Report::Epoch {
            epoch: 2,
            loss: 0.34921,
            accuracy: 0.89504,
            secs: 0.5,
        }
        .human(5);
        assert_eq!(
            line,
            "epoch 2/5  test loss 0.3492  accuracy 0.8950   0.50 s"
        );
    }

    #[test]
    fn range_maps_and_their_changes_are_described() {
        let before = vec![vec![8, 10], vec![10, 8]];
        assert_eq!(
            describe_ranges(&before),
            "range 0 on node 8 (primary), 10; range 1 on node 10 (primary), 8"
        );
        let after = vec![vec![10], vec![10]];
        assert_eq!(
            describe_ranges(&after),
            "range 0 on node 10 alone; range 1 on node 10 alone"
        );
        assert_eq!(
            describe_moves(&before, &after),
            [
                "range 0: primary node 8 -> node 10, node 8 dropped",
                "range 1: node 8 dropped"
            ]
        );
        assert_eq!(
            describe_moves(&after, &[vec![10, 12], vec![]]),
            [
                "range 0: node 12 added",
                "range 1: lost with its last replica (node 10)"
            ]
        );
        assert!(describe_moves(&after, &after).is_empty());
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000), "1 000");
        assert_eq!(group(1_234_567), "1 234 567");
        assert_eq!(megabytes(426_400_000), "426.4 MB");
    }
}
