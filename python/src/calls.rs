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
