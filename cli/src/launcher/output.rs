//! A node's output: its lines, forwarded with the node's name as prefix.
//!
//! Each node's stdout and stderr are read by a thread of their own and
//! written to the launcher's stdout and stderr, every line prefixed with the
//! node's label (`[worker 1]`). The label may change while the node runs,
//! once the launcher learns its node id ([`naming`](super::naming)). The
//! last line the node wrote on stderr is kept for the failure summary.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pslite_proto::lock;

/// What the launcher keeps of one node's output.
#[derive(Debug, Default)]
pub struct NodeOutput {
    /// The prefix of its lines, `[worker 1]`.
    label: Mutex<String>,
    /// Its last non-blank line on stderr.
    last_stderr: Mutex<Option<String>>,
}

impl NodeOutput {
    /// An output whose lines are prefixed with `[name]`.
    pub fn new(name: &str) -> NodeOutput {
        NodeOutput {
            label: Mutex::new(format!("[{name}]")),
            last_stderr: Mutex::default(),
        }
    }

    /// Prefix its lines with `[name]` from now on.
    pub fn rename(&self, name: &str) {
        *lock(&self.label) = format!("[{name}]");
    }

    /// The last non-blank line it wrote on stderr.
    pub fn last_stderr(&self) -> Option<String> {
        lock(&self.last_stderr).clone()
    }

    /// One line from the node, on its stderr or its stdout.
    fn line(&self, text: &str, stderr: bool) {
        let label = lock(&self.label).clone();
        if stderr {
            let _ = writeln!(std::io::stderr().lock(), "{label} {text}");
            if !text.trim().is_empty() {
                *lock(&self.last_stderr) = Some(text.to_string());
            }
        } else {
            let _ = writeln!(std::io::stdout().lock(), "{label} {text}");
        }
    }
}

/// Forwards `reader`'s lines to `output` (as stderr lines with `stderr`)
/// until it ends, from a thread.
pub fn forward(
    reader: impl Read + Send + 'static,
    output: Arc<NodeOutput>,
    stderr: bool,
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
                        output.line(text.trim_end_matches(['\n', '\r']), stderr);
                    }
                }
            }
        })
}
