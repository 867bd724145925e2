//! Calling Python from pslite's threads: request handles and callbacks.
//!
//! Such a call takes the GIL on the thread pslite runs it on (an app's
//! customer thread, never the receive thread). A Python exception is
//! printed with its traceback and then fails the request exactly as a
//! panicking Rust handle does: the panic carries the exception's text and
//! skips the panic hook's report (the traceback said it already).

use std::cell::Cell;

use pyo3::ffi;
use pyo3::prelude::*;

thread_local! {
    /// Whether this thread keeps a Python thread state (see [`keep_thread_state`]).
    static KEPT: Cell<bool> = const { Cell::new(false) };
}

/// Gives this thread a Python thread state that outlives each call: without
/// it, every call from a pslite thread would create and destroy one (a
/// quarter of a small request's round trip). The state is made once, with
/// the GIL released at once, and kept until the process ends.
fn keep_thread_state() {
    KEPT.with(|kept| {
        if kept.get() {
            return;
        }
        kept.set(true);
        // Only pslite's own threads (apps' customer threads and the like),
        // which never hold the GIL outside `call_python`.
        let ours = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("pslite-"));
        if !ours {
            return;
        }
        // SAFETY: Python loaded this module, so the interpreter runs; this
        // thread does not hold the GIL (above), so Ensure takes it (making
        // the thread state) and SaveThread gives it back, leaving the state
        // registered and the GIL free.
        unsafe {
            let _ = ffi::PyGILState_Ensure();
            let _ = ffi::PyEval_SaveThread();
        }
    });
}

/// Runs `f` with the GIL; an exception it raises becomes a panic.
pub fn call_python(f: impl FnOnce(Python<'_>) -> PyResult<()>) {
    keep_thread_state();
    let failed = Python::attach(|py| match f(py) {
        Ok(()) => None,
        Err(e) => {
            let message = e.to_string();
            e.print(py);
            Some(message)
        }
    });
    if let Some(message) = failed {
        std::panic::resume_unwind(Box::new(message));
    }
}

/// Drops `value` with the GIL released: an app's drop joins its customer
/// thread, which may be waiting for the GIL to run a Python handle.
pub fn drop_detached<T: Send>(value: T) {
    Python::attach(|py| py.detach(move || drop(value)));
}

/// An app a Python object owns: closed by `close()` or when the object
/// goes, and then dropped without the GIL ([`drop_detached`]).
pub struct Closable<T: Send> {
    app: Option<T>,
    what: &'static str,
}

impl<T: Send> Closable<T> {
    /// Owns `app` (`what` names it in errors).
    pub fn new(app: T, what: &'static str) -> Self {
        Closable {
            app: Some(app),
            what,
        }
    }

    /// The app, unless closed.
    pub fn get(&self) -> PyResult<&T> {
        self.app.as_ref().ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err(format!("the {} is closed", self.what))
        })
    }

    /// Drops the app now.
    pub fn close(&mut self) {
        if let Some(app) = self.app.take() {
            drop_detached(app);
        }
    }
}

impl<T: Send> Drop for Closable<T> {
    fn drop(&mut self) {
        self.close();
    }
}
