//! A node's output: its lines, forwarded with the node's name as prefix,
//! and with `--log-dir` written to a file of its own.
//!
//! Each node's stdout and stderr are read by a thread of their own and
//! written to the launcher's stdout and stderr, every line prefixed with the
//! node's name (`[worker 1 (node 11)]`). The name is final once the launcher
//! learned the node's id ([`naming`](super::naming)); until then (at most
//! the hold given at start) its lines are held, so that a node's lines carry
//! one name. The launcher also keeps, for the failure summary, the first
//! line on stderr that reads like an error and the last one, and for a
//! Python traceback its exception line (`ValueError: ...`): a node whose
//! errors begin or end with a traceback is summed up by that line, the
//! traceback itself staying in its output and log.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use pslite_proto::lock;

/// What the launcher keeps of one node's output.
#[derive(Debug)]
pub struct NodeOutput {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The prefix of its lines, `[worker 1]`.
    label: String,
    /// The name of its log file, `worker-1` (in `log_dir`).
    stem: String,
    /// Hold lines until this instant, unless named before.
    hold_until: Option<Instant>,
    /// Lines held, and whether each is from stderr.
    held: Vec<(bool, String)>,
    /// `--log-dir`.
    log_dir: Option<PathBuf>,
    /// The open log file and its stem.
    file: Option<(String, File)>,
    /// The stems opened so far: a file of an earlier job is replaced, one
    /// of this node's earlier run (a restart) goes on.
    opened: Vec<String>,
    /// The first line on stderr that reads like an error.
    first_error: Option<String>,
    /// The last non-blank line on stderr.
    last_stderr: Option<String>,
    /// Inside a Python traceback (after its `Traceback (most recent call
    /// last):` line, before its exception line).
    in_traceback: bool,
    /// The exception line of the last Python traceback.
    exception: Option<String>,
    /// Whether nothing that reads like an error came after that line.
    ends_in_traceback: bool,
}

/// The line that starts a Python traceback.
const TRACEBACK: &str = "Traceback (most recent call last):";

/// Whether a line reads like an error (`error: ...`, a Rust panic, a
/// Python traceback, a C++ `FATAL`).
fn is_error(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    ["error", "panicked", "fatal", "exception", "traceback"]
        .iter()
        .any(|word| lower.contains(word))
}

impl NodeOutput {
    /// The output of a node called `name` (log file `stem`), writing a log
    /// file in `log_dir` if given.
    pub fn new(name: &str, stem: &str, log_dir: Option<PathBuf>) -> NodeOutput {
        NodeOutput {
            state: Mutex::new(State {
                label: format!("[{name}]"),
                stem: stem.to_string(),
                hold_until: None,
                held: Vec::new(),
                log_dir,
                file: None,
                opened: Vec::new(),
                first_error: None,
                last_stderr: None,
                in_traceback: false,
                exception: None,
                ends_in_traceback: false,
            }),
        }
    }

    /// The node (re)started as `name`: hold its lines until `hold_until`
    /// unless it is named before; its error lines start afresh.
    pub fn started(&self, name: &str, stem: &str, hold_until: Option<Instant>) {
        let mut state = lock(&self.state);
        state.release();
        state.label = format!("[{name}]");
        state.stem = stem.to_string();
        state.hold_until = hold_until;
        state.first_error = None;
        state.last_stderr = None;
        state.in_traceback = false;
        state.exception = None;
        state.ends_in_traceback = false;
    }

    /// The node's final name: its lines (held ones first) carry it.
    pub fn rename(&self, name: &str, stem: &str) {
        let mut state = lock(&self.state);
        state.label = format!("[{name}]");
        state.stem = stem.to_string();
        state.release();
    }

    /// Releases the held lines if their hold ended by `now`; returns when
    /// it ends otherwise.
    pub fn release_due(&self, now: Instant) -> Option<Instant> {
        let mut state = lock(&self.state);
        match state.hold_until {
            Some(at) if at <= now => {
                state.release();
                None
            }
            at => at,
        }
    }

    /// The first line on stderr that reads like an error, else the last;
    /// a Python traceback's exception line instead when the node's errors
    /// begin or end with that traceback.
    pub fn first_error(&self) -> Option<String> {
        let state = lock(&self.state);
        let traceback_first = state.first_error.as_deref() == Some(TRACEBACK);
        if let Some(exception) = &state.exception {
            if traceback_first || state.ends_in_traceback {
                return Some(exception.clone());
            }
        }
        state
            .first_error
            .clone()
            .or_else(|| state.last_stderr.clone())
    }

    /// The last non-blank line it wrote on stderr.
    pub fn last_stderr(&self) -> Option<String> {
        lock(&self.state).last_stderr.clone()
    }

    /// One line from the node, on its stderr or its stdout.
    fn line(&self, text: &str, stderr: bool) {
        let mut state = lock(&self.state);
        if stderr && !text.trim().is_empty() {
            if state.first_error.is_none() && is_error(text) {
                state.first_error = Some(text.to_string());
            }
            state.last_stderr = Some(text.to_string());
            state.traceback_line(text);
        }
        if state.hold_until.is_some() {
            state.held.push((stderr, text.to_string()));
        } else {
            state.emit(text, stderr);
        }
    }

    /// One of the node's streams ended: nothing more to hold, and its log
    /// file exists even if it wrote nothing.
    fn ended(&self) {
        let mut state = lock(&self.state);
        state.release();
        state.open_log();
    }
}

impl State {
    /// Follows Python tracebacks in the node's stderr: frames are indented,
    /// the first line after them that is not is the exception.
    fn traceback_line(&mut self, text: &str) {
        if text.starts_with(TRACEBACK) {
            self.in_traceback = true;
        } else if self.in_traceback {
            if !text.starts_with(' ') && !text.starts_with('\t') {
                self.exception = Some(text.to_string());
                self.in_traceback = false;
                self.ends_in_traceback = true;
            }
        } else if is_error(text) {
            self.ends_in_traceback = false;
        }
    }

    /// Stops holding: writes the held lines.
    fn release(&mut self) {
        self.hold_until = None;
        for (stderr, text) in std::mem::take(&mut self.held) {
            self.emit(&text, stderr);
        }
    }

    fn emit(&mut self, text: &str, stderr: bool) {
        if stderr {
            let _ = writeln!(std::io::stderr().lock(), "{} {text}", self.label);
        } else {
            let _ = writeln!(std::io::stdout().lock(), "{} {text}", self.label);
        }
        if let Some(file) = self.open_log() {
            let _ = writeln!(file, "{text}");
        }
    }

    /// The log file of the node's current name, opened (or created) if
    /// needed; `None` without `--log-dir`.
    fn open_log(&mut self) -> Option<&mut File> {
        let dir = self.log_dir.as_ref()?;
        if self
            .file
            .as_ref()
            .is_none_or(|(stem, _)| *stem != self.stem)
        {
            let path = dir.join(format!("{}.log", self.stem));
            let again = self.opened.contains(&self.stem);
            let mut options = File::options();
            options.create(true);
            if again {
                options.append(true);
            } else {
                options.write(true).truncate(true);
            }
            match options.open(&path) {
                Ok(file) => {
                    self.file = Some((self.stem.clone(), file));
                    if !again {
                        self.opened.push(self.stem.clone());
                    }
                }
                Err(e) => {
                    eprintln!("pslite launch: cannot write {}: {e}", path.display());
                    self.log_dir = None;
                    return None;
                }
            }
        }
        self.file.as_mut().map(|(_, file)| file)
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
            output.ended();
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn held_lines_take_the_final_name_and_go_to_its_log_file() {
        let dir = std::env::temp_dir().join(format!("pslite-output-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = NodeOutput::new("worker 1", "worker-1", Some(dir.clone()));
        let t0 = Instant::now();
        out.started("worker 1", "worker-1", Some(t0 + Duration::from_secs(3)));
        out.line("starting", false);
        out.line("warning: slow disk", true);
        out.line("error: lost the server", true);
        out.line("error: again", true);
        assert_eq!(out.release_due(t0), Some(t0 + Duration::from_secs(3)));
        assert_eq!(lock(&out.state).held.len(), 4);
        out.rename("worker 1 (node 11)", "worker-1");
        assert!(lock(&out.state).held.is_empty());
        out.line("after", false);
        let log = std::fs::read_to_string(dir.join("worker-1.log")).unwrap();
        assert_eq!(
            log,
            "starting\nwarning: slow disk\nerror: lost the server\nerror: again\nafter\n"
        );
        assert_eq!(out.first_error().as_deref(), Some("error: lost the server"));
        assert_eq!(out.last_stderr().as_deref(), Some("error: again"));
        // A restart starts the error lines afresh; without error words the
        // last stderr line stands in.
        out.started("worker 1", "worker-1", None);
        out.line("bye", true);
        assert_eq!(out.first_error().as_deref(), Some("bye"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_python_traceback_is_summed_up_by_its_exception() {
        let out = NodeOutput::new("worker 0", "worker-0", None);
        for line in [
            "starting",
            "Traceback (most recent call last):",
            "  File \"train.py\", line 3, in <module>",
            "    main()",
            "  File \"train.py\", line 2, in main",
            "    raise ValueError(\"bad learning rate: -1\")",
            "ValueError: bad learning rate: -1",
        ] {
            out.line(line, true);
        }
        assert_eq!(
            out.first_error().as_deref(),
            Some("ValueError: bad learning rate: -1")
        );
        // Chained: the last exception is the one that ended the program.
        let out = NodeOutput::new("worker 0", "worker-0", None);
        for line in [
            "Traceback (most recent call last):",
            "  File \"a.py\", line 1, in <module>",
            "KeyError: 'lr'",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            "  File \"a.py\", line 3, in <module>",
            "pslite.errors.DtypeMismatch: node 8 refused the request: app 0 holds float32",
        ] {
            out.line(line, true);
        }
        assert_eq!(
            out.first_error().as_deref(),
            Some("pslite.errors.DtypeMismatch: node 8 refused the request: app 0 holds float32")
        );
        // An error before a traceback that did not end the output stays first.
        let out = NodeOutput::new("server 0", "server-0", None);
        for line in [
            "error: lost the scheduler",
            "Traceback (most recent call last):",
            "  File \"h.py\", line 1, in handle",
            "RuntimeError: handler",
            "error: the node failed",
        ] {
            out.line(line, true);
        }
        assert_eq!(
            out.first_error().as_deref(),
            Some("error: lost the scheduler")
        );
    }

    #[test]
    fn a_hold_ends_at_its_deadline() {
        let out = NodeOutput::new("server 0", "server-0", None);
        let t0 = Instant::now();
        out.started("server 0", "server-0", Some(t0 + Duration::from_secs(1)));
        out.line("x", false);
        assert_eq!(
            out.release_due(t0 + Duration::from_millis(999)),
            Some(t0 + Duration::from_secs(1))
        );
        assert_eq!(out.release_due(t0 + Duration::from_secs(1)), None);
        assert!(lock(&out.state).held.is_empty());
    }
}
