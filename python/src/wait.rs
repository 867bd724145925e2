//! Blocking without holding the GIL, and without deafness to Ctrl-C.
//!
//! Every call that may wait (a request, a barrier, start and finalize, the
//! store, a watch) releases the GIL, so other Python threads and pslite's
//! own threads (which take the GIL to run Python handles and callbacks) go
//! on. It waits in slices of [`SLICE`]: between two slices it takes the GIL
//! back and runs Python's signal handlers, so Ctrl-C raises
//! `KeyboardInterrupt` within a slice. Calls that the Rust crate can only
//! make whole (a barrier) run on a helper thread while the caller waits for
//! its answer in slices; if the caller is interrupted the helper finishes
//! alone and its answer is dropped.

use std::time::{Duration, Instant};

use pslite::Error;
use pyo3::prelude::*;

use crate::errors::{to_py, IntoPy};

/// The longest stretch without a look at Python's signals.
pub const SLICE: Duration = Duration::from_millis(50);

/// Runs `f` on a helper thread and waits for it with the GIL released,
/// checking signals between slices.
pub fn interruptible<T, F>(py: Python<'_>, what: &str, f: F) -> PyResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name(format!("pslite-py-{what}"))
        .spawn(move || {
            // The caller may be gone (interrupted): nothing to tell then.
            let _ = tx.send(f());
        })
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start a thread: {e}"))
        })?;
    loop {
        match py.detach(|| rx.recv_timeout(SLICE)) {
            Ok(value) => return Ok(value),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "pslite: the thread running {what} ended without an answer (it panicked)"
                )))
            }
        }
    }
}

/// What one slice of a sliced wait found.
pub enum Slice<T> {
    /// The wait is over, with this result.
    Done(T),
    /// Nothing yet: wait another slice.
    Again,
}

/// Calls `step(slice)` with the GIL released until it is done, checking
/// signals in between; with `timeout`, gives up after it and returns
/// `Ok(None)`.
pub fn sliced<T, F>(py: Python<'_>, timeout: Option<Duration>, mut step: F) -> PyResult<Option<T>>
where
    T: Send,
    F: FnMut(Duration) -> Slice<T> + Send,
{
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let slice = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                left.min(SLICE)
            }
            None => SLICE,
        };
        match py.detach(|| step(slice)) {
            Slice::Done(value) => return Ok(Some(value)),
            Slice::Again => py.check_signals()?,
        }
    }
}

/// A timeout argument in seconds (`None`: no deadline), checked.
pub fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(crate::errors::invalid(format!(
            "timeout must be a number of seconds >= 0 or None, got {t}"
        ))),
    }
}

/// Waits for request `ts` in slices: `step(slice)` is one bounded wait of
/// the Rust crate (a `wait_timeout` or `take_timeout`), whose
/// [`Error::Timeout`] means "not yet"; with `timeout` (seconds), raises
/// `Timeout` once it has passed (the request goes on).
pub fn wait_request<T: Send>(
    py: Python<'_>,
    ts: i32,
    timeout: Option<f64>,
    step: impl Fn(Duration) -> Result<T, Error> + Send + Sync,
) -> PyResult<T> {
    let limit = seconds(timeout)?;
    let done = sliced(py, limit, |slice| match step(slice) {
        Err(Error::Timeout { .. }) => Slice::Again,
        other => Slice::Done(other),
    })?;
    match done {
        Some(result) => result.py(),
        None => Err(to_py(Error::Timeout {
            ts,
            secs: limit.map_or(0.0, |l| l.as_secs_f64()),
        })),
    }
}
