//! Calling Python from pslite's threads: request handles and callbacks.
//!
//! Such a call takes the GIL on the thread pslite runs it on (an app's
//! customer thread, never the receive thread). A Python exception is
//! printed with its traceback and then fails the request exactly as a
//! panicking Rust handle does: the panic carries the exception's text and
//! skips the panic hook's report (the traceback said it already).

use pyo3::prelude::*;

/// Runs `f` with the GIL; an exception it raises becomes a panic.
pub fn call_python(f: impl FnOnce(Python<'_>) -> PyResult<()>) {
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
