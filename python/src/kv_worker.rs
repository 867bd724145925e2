//! `KVWorker`: pushes to and pulls from the servers (see `pslite::KVWorker`).

use std::sync::Arc;

use pslite::{Error, KVOptions, KVRequest, KVWorker, KeyState, SArray, Val};
use pyo3::prelude::*;

use crate::arrays::{from_numpy, from_numpy_cast, to_numpy, Elem, OutArray};
use crate::calls::{call_python, Closable};
use crate::compression::{self, PyCompression};
use crate::dtype::{dispatch, make, per_dtype, Dtype};
use crate::errors::{invalid, to_py, IntoPy};
use crate::pairs::PyKVPairs;
use crate::postoffice::{PyMembership, PyPostoffice};
use crate::request::{Handle, KvHandle, PyRequest, Target};
use crate::wait::wait_request;

per_dtype!(
    /// A worker app of any value type.
    Worker,
    KVWorker
);

/// A NumPy array, or `None`.
type MaybeArray = Option<Py<PyAny>>;

/// What a request sends.
struct Request<'a, 'py> {
    keys: &'a Bound<'py, PyAny>,
    vals: Option<&'a Bound<'py, PyAny>>,
    lens: Option<&'a Bound<'py, PyAny>>,
    cmd: i32,
    priority: i32,
    callback: Option<Py<PyAny>>,
    pull: bool,
    /// `out=`: where the pulled values go.
    out: Option<&'a Bound<'py, PyAny>>,
    /// `cast=`: convert values of another dtype even when inexactly.
    cast: bool,
    /// `compression=`: this request's, instead of the worker's.
    compression: Option<&'a Bound<'py, PyAny>>,
}

impl Request<'_, '_> {
    /// What `repr` of the request calls it.
    fn kind(&self) -> &'static str {
        match (self.vals.is_some(), self.pull) {
            (true, false) => "push",
            (true, true) => "push_pull",
            (false, _) => "pull",
        }
    }
}

impl<'a, 'py> Request<'a, 'py> {
    /// A push (or push-pull) request.
    #[allow(clippy::too_many_arguments)]
    fn with_vals(
        keys: &'a Bound<'py, PyAny>,
        vals: &'a Bound<'py, PyAny>,
        lens: Option<&'a Bound<'py, PyAny>>,
        cmd: i32,
        priority: i32,
        callback: Option<Py<PyAny>>,
        pull: bool,
        cast: bool,
    ) -> Self {
        Request {
            keys,
            vals: Some(vals),
            lens,
            cmd,
            priority,
            callback,
            pull,
            out: None,
            cast,
            compression: None,
        }
    }
}

/// Builds and sends a request (GIL released while sending).
fn send<V: Val + Elem>(
    py: Python<'_>,
    kv: &KVWorker<V>,
    req: Request<'_, '_>,
) -> PyResult<PyRequest>
where
    KvHandle: From<KVRequest<V>>,
{
    let kind = req.kind();
    let out = match req.out.filter(|o| !o.is_none()) {
        Some(_) if req.callback.is_some() => {
            return Err(invalid(
                "out= and callback= do not go together: the callback gets the pulled values",
            ))
        }
        Some(o) => Some(Arc::new(OutArray::of::<V>(o)?)),
        None => None,
    };
    let keys = from_numpy::<u64>(req.keys, "keys")?;
    let vals = match req.vals {
        Some(v) => Some(from_numpy_cast::<V>(v, "vals", req.cast)?),
        None => None,
    };
    let mut opts = KVOptions::<V>::new().cmd(req.cmd).priority(req.priority);
    if let Some(lens) = req.lens.filter(|l| !l.is_none()) {
        opts = opts.zlens(from_numpy::<i32>(lens, "lens")?);
    }
    if let Some(c) = req.compression {
        opts = opts.compression(compression::parse(c)?);
    }
    if let Some(out) = &out {
        // The values go into `out` as the request completes, on pslite's
        // thread, while the caller goes on (e.g. with its backward pass).
        let out = Arc::clone(out);
        opts = opts.callback(move |result| {
            if let Ok(pairs) = result {
                out.place(pairs);
            }
        });
    }
    if let Some(callback) = req.callback {
        opts = opts.callback(move |result| {
            call_python(|py| {
                let arg: Py<PyAny> = match result {
                    Ok(pairs) => Py::new(py, PyKVPairs::from_rust(pairs))?.into_any(),
                    Err(e) => to_py(e).into_value(py).into_any(),
                };
                callback.call1(py, (arg,))?;
                Ok(())
            })
        });
    }
    let pull = req.pull;
    let request = py
        .detach(move || match (vals, pull) {
            (Some(vals), false) => kv.zpush(keys, vals, opts),
            (Some(vals), true) => kv.zpush_pull(keys, vals, opts),
            (None, _) => kv.zpull(keys, opts),
        })
        .py()?;
    Ok(PyRequest::new(Handle::Kv(request.into()), kind).with_out(out))
}

/// Waits for request `ts` in slices (Ctrl-C raises `KeyboardInterrupt`).
fn wait<V: Val>(py: Python<'_>, kv: &KVWorker<V>, ts: i32, timeout: Option<f64>) -> PyResult<()> {
    wait_request(py, ts, timeout, |slice| kv.wait_timeout(ts, slice))
}

/// Waits for pull `ts` in slices and hands over its pairs.
fn take_pull<V: Val + Elem>(
    py: Python<'_>,
    kv: &KVWorker<V>,
    ts: i32,
    timeout: Option<f64>,
) -> PyResult<PyKVPairs> {
    let pairs = wait_request(py, ts, timeout, |slice| kv.take_pull_timeout(ts, slice))?;
    Ok(PyKVPairs::from_rust(pairs))
}

/// A worker's key-value app: pushes values to and pulls values from the
/// servers.
///
/// Keys are a `numpy.uint64` array, sorted ascending and unique; values a
/// NumPy array of the worker's `dtype`, `len(keys) * k` of them (k values
/// per key) or as many as `lens` adds up to. Every call returns a
/// `Request`: `req.wait()`, and `req.take()` the pulled `KVPairs`. As in
/// ps-lite, the request also is its timestamp: `kv.wait(ts)` and
/// `kv.take_pull(ts)` take either (see `Request` for how long a request
/// waited for by timestamp is kept). Arrays of the right dtype are sent
/// without a copy: do not change them until the request completes. Pulled
/// values are read-only views of the received buffers.
#[pyclass(module = "pslite", name = "KVWorker")]
pub struct PyKVWorker {
    worker: Closable<Worker>,
}

#[pymethods]
impl PyKVWorker {
    /// A worker app `app_id`, customer `customer_id` of `po`, carrying
    /// values of `dtype` (float32, float64, int32, int64, or "raw" bytes
    /// typed as C++ `KVWorker<char>` types them).
    /// With `compression` (a `Compression`, or its spec string such as
    /// `"topk:0.01"`), the values of its pushes are compressed (float32
    /// and float64 workers only).
    #[new]
    #[pyo3(signature = (po, app_id = 0, customer_id = 0, dtype = None, compression = None))]
    fn new(
        py: Python<'_>,
        po: &PyPostoffice,
        app_id: i32,
        customer_id: i32,
        dtype: Option<&Bound<'_, PyAny>>,
        compression: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyKVWorker> {
        let dtype = Dtype::parse(dtype)?;
        let compression = match compression {
            Some(c) => compression::parse(c)?,
            None => None,
        };
        let po = po.po.clone();
        let worker = py.detach(|| -> Result<Worker, Error> {
            Ok(make!(Worker, dtype, T => {
                let kv = KVWorker::<T>::new(&po, app_id, customer_id)?;
                kv.set_compression(compression)?;
                kv
            }))
        });
        Ok(PyKVWorker {
            worker: Closable::new(worker.py()?, "KVWorker"),
        })
    }

    /// How the values of this worker's pushes are compressed (a
    /// `Compression`), or `None`; a request's `compression=` overrides it.
    /// Set it to a `Compression`, a spec string or `None`.
    #[getter]
    fn get_compression(&self, py: Python<'_>) -> PyResult<Option<Py<PyCompression>>> {
        let c = dispatch!(Worker, self.worker.get()?, kv => kv.compression());
        compression::to_py(py, c)
    }

    #[setter]
    fn set_compression(&self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let c = match value {
            Some(v) => compression::parse(v)?,
            None => None,
        };
        dispatch!(Worker, self.worker.get()?, kv => kv.set_compression(c)).py()
    }

    /// What this worker's compression holds for `key`, to save with a
    /// checkpoint: `(velocity, residual)`, each a float32 array or `None`
    /// (momentum correction's velocity; error feedback's residual, what
    /// compression has held back).
    fn compression_state(&self, py: Python<'_>, key: u64) -> PyResult<(MaybeArray, MaybeArray)> {
        let state = dispatch!(Worker, self.worker.get()?, kv => kv.compression_state(key));
        let array = |v: Option<Vec<f32>>| v.map(|v| to_numpy(py, SArray::from_vec(v))).transpose();
        Ok((array(state.velocity)?, array(state.residual)?))
    }

    /// Replaces what this worker's compression holds for `key` (as
    /// `compression_state` gave it; `None`: nothing): its next push adds
    /// the residual and carries on the velocity.
    #[pyo3(signature = (key, velocity = None, residual = None))]
    fn set_compression_state(
        &self,
        key: u64,
        velocity: Option<&Bound<'_, PyAny>>,
        residual: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let array = |v: Option<&Bound<'_, PyAny>>| {
            v.map(|v| from_numpy_cast::<f32>(v, "vals", true).map(|a| a.to_vec()))
                .transpose()
        };
        let state = KeyState {
            velocity: array(velocity)?,
            residual: array(residual)?,
        };
        dispatch!(Worker, self.worker.get()?, kv => kv.set_compression_state(key, &state));
        Ok(())
    }

    /// Bounded staleness: `s` (an int >= 0; 0 is synchronous) or `None`
    /// (asynchronous; the default unless `PS_STALENESS` is set). A pull
    /// is answered only once every worker's pushes of clocks up to
    /// `clock - s - 1` are applied; end each iteration with `clock()`.
    #[getter]
    fn get_staleness(&self) -> PyResult<Option<u64>> {
        Ok(dispatch!(Worker, self.worker.get()?, kv => kv.staleness()))
    }

    #[setter]
    fn set_staleness(&self, py: Python<'_>, value: Option<u64>) -> PyResult<()> {
        let worker = self.worker.get()?;
        py.detach(|| dispatch!(Worker, worker, kv => kv.set_staleness(value)))
            .py()
    }

    /// Ends this worker's iteration: its clock advances and, with a
    /// staleness bound, every server is told; returns the new clock.
    fn clock(&self, py: Python<'_>) -> PyResult<u64> {
        let worker = self.worker.get()?;
        py.detach(|| dispatch!(Worker, worker, kv => kv.clock()))
            .py()
    }

    /// The iterations this worker ended with `clock()`.
    #[getter]
    fn current_clock(&self) -> PyResult<u64> {
        Ok(dispatch!(Worker, self.worker.get()?, kv => kv.current_clock()))
    }

    /// The value type: "float32", "float64", "int32", "int64" or "raw".
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        Ok(self.worker.get()?.dtype().name())
    }

    /// Pushes `vals` for `keys`; returns the `Request` to wait on. With
    /// `callback`, calls `callback(result)` when the request completes
    /// (`result` is an empty `KVPairs`, or the `pslite.Error`), on the
    /// app's thread. Keys must be integers >= 0; values of another dtype
    /// than the worker's are converted only when exactly (else
    /// `InvalidInput`), or in any case with `cast=True`. `priority`:
    /// what this node sends to a server goes higher priority first.
    /// `compression`: this push's (a `Compression`, a spec string, or
    /// `"none"`) instead of the worker's.
    #[pyo3(signature = (keys, vals, lens = None, cmd = 0, priority = 0, callback = None, cast = false, compression = None))]
    #[allow(clippy::too_many_arguments)] // ps-lite's Push arguments, as Python keywords
    fn push(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        vals: &Bound<'_, PyAny>,
        lens: Option<&Bound<'_, PyAny>>,
        cmd: i32,
        priority: i32,
        callback: Option<Py<PyAny>>,
        cast: bool,
        compression: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRequest> {
        let mut req = Request::with_vals(keys, vals, lens, cmd, priority, callback, false, cast);
        req.compression = compression;
        dispatch!(Worker, self.worker.get()?, kv => send(py, kv, req))
    }

    /// Pulls the values of `keys`; returns the `Request` whose `take()`
    /// (or `kv.take_pull(req)`) gives the `KVPairs`. With `callback`,
    /// `callback(result)` gets the `KVPairs` (or the error) instead. With
    /// `out` (a writable C-contiguous array, or CPU tensor, of the worker's
    /// dtype and of as many elements as the pull returns), waiting on the
    /// request copies the values there once, without the GIL, and `take()`
    /// returns `out` as the values. `compression`: with
    /// `compress_answers`, the answer comes compressed (instead of as the
    /// worker's compression says).
    #[pyo3(signature = (keys, cmd = 0, priority = 0, callback = None, out = None, compression = None))]
    #[allow(clippy::too_many_arguments)]
    fn pull(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        cmd: i32,
        priority: i32,
        callback: Option<Py<PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        compression: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRequest> {
        let req = Request {
            keys,
            vals: None,
            lens: None,
            cmd,
            priority,
            callback,
            pull: true,
            out,
            cast: false,
            compression,
        };
        dispatch!(Worker, self.worker.get()?, kv => send(py, kv, req))
    }

    /// Pushes and pulls in one request: the pulled values include this
    /// push. Returns the `Request` to `take()` them from. `out` and `cast`
    /// as for `pull` and `push` (`out` may be `vals` itself: the values go
    /// out before the answer comes back). `compression` as for `push`.
    #[pyo3(signature = (keys, vals, lens = None, cmd = 0, priority = 0, callback = None, out = None, cast = false, compression = None))]
    #[allow(clippy::too_many_arguments)] // ps-lite's PushPull arguments, as Python keywords
    fn push_pull(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        vals: &Bound<'_, PyAny>,
        lens: Option<&Bound<'_, PyAny>>,
        cmd: i32,
        priority: i32,
        callback: Option<Py<PyAny>>,
        out: Option<&Bound<'_, PyAny>>,
        cast: bool,
        compression: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRequest> {
        let mut req = Request::with_vals(keys, vals, lens, cmd, priority, callback, true, cast);
        req.out = out;
        req.compression = compression;
        dispatch!(Worker, self.worker.get()?, kv => send(py, kv, req))
    }

    /// Waits until request `ts` (a `Request`, or its int timestamp) has
    /// completed; raises the failure's exception if it failed, `Timeout`
    /// after `timeout` seconds.
    #[pyo3(signature = (ts, timeout = None))]
    fn wait(&self, py: Python<'_>, ts: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        match Target::of(ts)? {
            Target::Request(r) => r.get().wait_for(py, timeout),
            Target::Ts(ts) => {
                dispatch!(Worker, self.worker.get()?, kv => wait(py, kv, ts, timeout))
            }
        }
    }

    /// Waits for pull (or push-pull) `ts` (a `Request`, or its int
    /// timestamp) and returns its `KVPairs`, in key order (each pull's
    /// values can be taken once).
    #[pyo3(signature = (ts, timeout = None))]
    fn take_pull(
        &self,
        py: Python<'_>,
        ts: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyKVPairs>> {
        match Target::of(ts)? {
            Target::Request(r) => r.get().take_pairs(py, timeout),
            Target::Ts(ts) => Py::new(
                py,
                dispatch!(Worker, self.worker.get()?, kv => take_pull(py, kv, ts, timeout))?,
            ),
        }
    }

    /// Sends a SimpleApp command (`head`, `body`) on this worker's customer
    /// to node or group `recv` (MXNet's server commands go this way);
    /// returns the `Request` to wait on.
    #[pyo3(signature = (head, body = b"".as_slice(), recv = pslite::SERVER_GROUP))]
    fn request(&self, py: Python<'_>, head: i32, body: &[u8], recv: i32) -> PyResult<PyRequest> {
        let worker = self.worker.get()?;
        let handle = py
            .detach(|| {
                dispatch!(Worker, worker, kv => kv.request(head, body, recv).map(KvHandle::from))
            })
            .py()?;
        Ok(PyRequest::new(Handle::Kv(handle), "request"))
    }

    /// The current round of workers.
    fn membership(&self) -> PyResult<PyMembership> {
        Ok(dispatch!(Worker, self.worker.get()?, kv => kv.membership()).into())
    }

    /// Closes the app now (otherwise when it is garbage-collected).
    fn close(&mut self) {
        self.worker.close();
    }
}
