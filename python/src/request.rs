//! `Request`: a request a `KVWorker` or `SimpleApp` sent, as Python holds
//! it (the Rust crate's `KVRequest` and `Request` handles).
//!
//! A handle of the Rust crate gives up its request when it is dropped (the
//! record goes once the request is done, and a later wait by timestamp
//! returns at once, failed or not), or keeps it for waits by timestamp once
//! turned into its timestamp. A Python object cannot tell which of the two
//! its user wants when it goes, so it decides by what the user took from
//! it: once its timestamp has left it (`int(req)`, `req.ts`, the object
//! used where an int goes), the request is kept until waited for by that
//! timestamp, as in ps-lite; otherwise nobody can wait for it any more and
//! it is given up. Passing the object itself to `KVWorker.wait` or
//! `take_pull` waits on the handle and lets nothing out.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pslite::{Error, KVRequest, Val};
use pyo3::prelude::*;
use pyo3::types::PyInt;

use crate::arrays::{Elem, OutArray};
use crate::calls::drop_detached;
use crate::dtype::{dispatch, per_dtype};
use crate::errors::invalid;
use crate::pairs::PyKVPairs;
use crate::wait::wait_request;

per_dtype!(
    /// A KV request handle of any value type.
    KvHandle,
    KVRequest
);

/// The Rust handle inside a Python `Request`.
pub enum Handle {
    /// A push, pull, push-pull or command of a `KVWorker`.
    Kv(KvHandle),
    /// A `SimpleApp` request.
    Simple(pslite::Request),
}

impl Handle {
    fn ts(&self) -> i32 {
        match self {
            Handle::Kv(h) => dispatch!(KvHandle, h, r => r.ts()),
            Handle::Simple(r) => r.ts(),
        }
    }

    fn wait_timeout(&self, timeout: Duration) -> Result<(), Error> {
        match self {
            Handle::Kv(h) => dispatch!(KvHandle, h, r => r.wait_timeout(timeout)),
            Handle::Simple(r) => r.wait_timeout(timeout),
        }
    }

    fn num_responses(&self) -> usize {
        match self {
            Handle::Kv(h) => dispatch!(KvHandle, h, r => r.num_responses()),
            Handle::Simple(r) => r.num_responses(),
        }
    }

    fn into_ts(self) -> i32 {
        match self {
            Handle::Kv(h) => dispatch!(KvHandle, h, r => r.into_ts()),
            Handle::Simple(r) => r.into_ts(),
        }
    }
}

/// Waits for pull `r` in slices and hands over its pairs.
fn take<V: Val + Elem>(
    py: Python<'_>,
    r: &KVRequest<V>,
    timeout: Option<f64>,
) -> PyResult<PyKVPairs> {
    let pairs = wait_request(py, r.ts(), timeout, |slice| r.take_timeout(slice))?;
    Ok(PyKVPairs::from_rust(pairs))
}

/// A request sent by `KVWorker.push`, `pull`, `push_pull` or `request`, or
/// by `SimpleApp.request`: `wait()` for it, `take()` a pull's values.
///
/// It also is the request's timestamp, as ps-lite returns it: it converts
/// to an `int` (`int(req)`, `req.ts`, `operator.index(req)`), and
/// `kv.wait(req)`, `kv.take_pull(req)` accept it as they accept the int.
///
/// Lifetime: while the object lives, the request's outcome (and a pull's
/// values) can be collected through it. When it goes, the request is kept
/// for a wait by timestamp if its timestamp was taken out of it (an int
/// made of it, or `ts` read): `kv.wait(ts)` then reports its failure, and
/// a pull's values stay until `kv.take_pull(ts)`, as in ps-lite (so wait
/// for every timestamp you take). Otherwise nothing can wait for it any
/// more: it is given up (a failure is logged, pulled values are freed).
/// Wait through the object or by the timestamp, not both: whichever
/// collects the request first gets its failure, the other sees it done.
#[pyclass(module = "pslite", frozen, name = "Request")]
pub struct PyRequest {
    /// The Rust handle; taken out only by `drop`.
    handle: ManuallyDrop<Handle>,
    ts: i32,
    /// "push", "pull", "push_pull" or "request".
    kind: &'static str,
    /// The timestamp has left the object: keep the request when it goes.
    escaped: AtomicBool,
    /// `out=`: the caller's array the pulled values are placed in (by the
    /// request's completion).
    out: Option<Arc<OutArray>>,
    /// With `out=`: the pairs once the values are in `out`.
    filled: OnceLock<Py<PyKVPairs>>,
}

impl PyRequest {
    /// A Python request around `handle`; `kind` names it in `repr`.
    pub fn new(handle: Handle, kind: &'static str) -> PyRequest {
        PyRequest {
            ts: handle.ts(),
            handle: ManuallyDrop::new(handle),
            kind,
            escaped: AtomicBool::new(false),
            out: None,
            filled: OnceLock::new(),
        }
    }

    /// The request fills `out` with its pulled values when waited on.
    pub fn with_out(mut self, out: Option<Arc<OutArray>>) -> PyRequest {
        self.out = out;
        self
    }

    /// The timestamp, which leaves the object (see the class docs).
    fn escape(&self) -> i32 {
        self.escaped.store(true, Ordering::Relaxed);
        self.ts
    }

    /// Waits (GIL released, in slices) until the request has completed
    /// (and, with `out=`, its values are there).
    pub fn wait_for(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        if self.out.is_some() {
            return self.fill(py, timeout).map(drop);
        }
        let handle = &*self.handle;
        wait_request(py, self.ts, timeout, |slice| handle.wait_timeout(slice))
    }

    /// With `out=`: waits for the values and copies them there, once; the
    /// pairs (whose values are `out`).
    fn fill(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyKVPairs>> {
        if let Some(pairs) = self.filled.get() {
            return Ok(pairs.clone_ref(py));
        }
        let Some(out) = self.out.as_ref() else {
            return Err(invalid("this request has no out="));
        };
        let handle = &*self.handle;
        wait_request(py, self.ts, timeout, |slice| handle.wait_timeout(slice))?;
        let (keys, lens) = match out.placed() {
            Some(Ok(placed)) => placed,
            Some(Err(why)) => return Err(invalid(why)),
            None => {
                return Err(invalid(format!(
                    "request {} has no values for out=",
                    self.ts
                )))
            }
        };
        let pairs = PyKVPairs::from_parts(keys, lens, out.obj.clone_ref(py));
        let pairs = Py::new(py, pairs)?;
        Ok(self.filled.get_or_init(|| pairs).clone_ref(py))
    }

    /// Waits for a pull and hands over its pairs.
    pub fn take_pairs(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyKVPairs>> {
        if self.out.is_some() {
            return self.fill(py, timeout);
        }
        match &*self.handle {
            Handle::Kv(h) => Py::new(py, dispatch!(KvHandle, h, r => take(py, r, timeout))?),
            Handle::Simple(_) => Err(invalid(format!(
                "request {} is a SimpleApp request: it has no pulled values to take",
                self.ts
            ))),
        }
    }
}

#[pymethods]
impl PyRequest {
    /// Waits until the request has completed; raises its failure's
    /// exception if it failed (every time it is waited on), `Timeout` after
    /// `timeout` seconds (the request goes on: wait again). Releases the GIL;
    /// Ctrl-C raises `KeyboardInterrupt`.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.wait_for(py, timeout)
    }

    /// Waits for a pull (or push-pull) and returns its `KVPairs`, in key
    /// order: `vals` is a read-only NumPy array over the received buffer
    /// (with `out=`, the `out` array or tensor, filled). The values can be
    /// taken once (not if the request had a callback; with `out=`, again
    /// and again).
    #[pyo3(signature = (timeout = None))]
    fn take(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyKVPairs>> {
        self.take_pairs(py, timeout)
    }

    /// Whether the request has completed (or failed): `wait()` returns at
    /// once.
    #[getter]
    fn done(&self, py: Python<'_>) -> bool {
        let handle = &*self.handle;
        let waited = py.detach(|| handle.wait_timeout(Duration::ZERO));
        !matches!(waited, Err(Error::Timeout { .. }))
    }

    /// How many of its receivers have answered so far.
    #[getter]
    fn num_responses(&self, py: Python<'_>) -> usize {
        let handle = &*self.handle;
        py.detach(|| handle.num_responses())
    }

    /// The request's timestamp (reading it keeps the request for a wait by
    /// timestamp once this object goes).
    #[getter]
    fn ts(&self) -> i32 {
        self.escape()
    }

    /// The timestamp, where an integer is needed (keeps the request for a
    /// wait by timestamp once this object goes).
    fn __index__(&self) -> i32 {
        self.escape()
    }

    /// The timestamp as an int (keeps the request for a wait by timestamp
    /// once this object goes).
    fn __int__(&self) -> i32 {
        self.escape()
    }

    fn __repr__(&self) -> String {
        format!("<pslite.Request {} ts={}>", self.kind, self.ts)
    }
}

impl Drop for PyRequest {
    fn drop(&mut self) {
        // SAFETY: the handle is taken once, here, and never used again.
        let handle = unsafe { ManuallyDrop::take(&mut self.handle) };
        if *self.escaped.get_mut() {
            // Kept until waited for by timestamp (ps-lite's way).
            let _ = handle.into_ts();
        } else {
            // Given up; the table's lock is taken without the GIL.
            drop_detached(handle);
        }
    }
}

/// What `wait` and `take_pull` accept: a `Request` or an int timestamp.
pub enum Target<'py> {
    /// The request object itself: waits on its handle.
    Request(Bound<'py, PyRequest>),
    /// A timestamp: waits by it, as ps-lite does.
    Ts(i32),
}

impl<'py> Target<'py> {
    /// Reads a `ts` argument.
    pub fn of(obj: &Bound<'py, PyAny>) -> PyResult<Target<'py>> {
        if let Ok(request) = obj.cast::<PyRequest>() {
            return Ok(Target::Request(request.clone()));
        }
        match obj.extract::<i32>() {
            Ok(ts) => Ok(Target::Ts(ts)),
            // An int out of range: Python's own OverflowError says so.
            Err(e) if obj.is_instance_of::<PyInt>() => Err(e),
            Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "expected a pslite.Request or an int timestamp, got {}",
                obj.get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))),
        }
    }
}
