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
            } => format!(
                "worker {rank}: {} samples, {} requests, pushed {}, pulled {}",
                group(*samples as u64),
                group(*requests),
                megabytes(*pushed),
                megabytes(*pulled)
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
            Report::Server {
                rank,
                keys,
                pushes,
                pulls,
            } => format!(
                "server {rank}: {} keys, {} pushes applied, {} pulls answered",
                group(*keys as u64),
                group(*pushes),
                group(*pulls)
            ),
        }
    }
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
    pub fn send(&mut self, report: Report) -> Result<(), Error> {
        match self {
            Reporter::Launcher(stream) => writeln!(stream, "{}", report.to_line())
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
            },
            Report::Server {
                rank: 0,
                keys: 301_913,
                pushes: 900,
                pulls: 906,
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
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000), "1 000");
        assert_eq!(group(1_234_567), "1 234 567");
        assert_eq!(megabytes(426_400_000), "426.4 MB");
    }
}
