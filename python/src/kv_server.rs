//! `KVServer`: answers the workers' pushes and pulls (see `pslite::KVServer`).

use pslite::{AllReduceHandle, DefaultHandle, KVMeta, KVPairs, KVServer, SimpleData, Val};
use pyo3::prelude::*;

use crate::arrays::Elem;
use crate::calls::{call_python, Closable};
use crate::dtype::{dispatch, make, per_dtype, Dtype};
use crate::errors::{invalid, IntoPy};
use crate::pairs::{PyKVMeta, PyKVPairs};
use crate::postoffice::PyPostoffice;
use crate::simple_app::PySimpleData;
use crate::wait::interruptible;

per_dtype!(
    /// A server app of any value type.
    Server,
    KVServer
);

/// ps-lite's default server handle: pushes add into a store, pulls read it
/// (a key never pushed reads as one zero). It runs in Rust, on the app's
/// thread, without taking the GIL: `server.set_request_handle(DefaultHandle())`.
#[pyclass(module = "pslite", frozen, name = "DefaultHandle")]
pub struct PyDefaultHandle;

#[pymethods]
impl PyDefaultHandle {
    #[new]
    fn new() -> Self {
        PyDefaultHandle
    }

    fn __repr__(&self) -> &'static str {
        "DefaultHandle()"
    }
}

/// Sums each key's pushes over a round of every worker, then answers them
/// all with the sum (an all-reduce through the servers; the servers of
/// `pslite.torch` run it). Runs in Rust without the GIL:
/// `server.set_request_handle(AllReduceHandle(po.num_workers))`. Every
/// worker pushes (or push-pulls) the same keys once per round (requests
/// with `cmd=1` get the mean instead: float32 and float64); a pull
/// alone, or other keys or lengths under a round's first key, are refused.
/// A worker out of data sends `cmd=100` (join: until every worker has
/// joined, rounds complete without it, a mean still divides by every
/// worker; each join is answered with the last joiner's values), a worker
/// that ends `cmd=101` (rounds that wait for it are refused, naming its
/// rank): `pslite.torch.join()` and its shutdown.
#[pyclass(module = "pslite", frozen, name = "AllReduceHandle")]
pub struct PyAllReduceHandle {
    workers: usize,
}

#[pymethods]
impl PyAllReduceHandle {
    #[new]
    fn new(num_workers: usize) -> PyResult<Self> {
        if num_workers == 0 {
            return Err(invalid("num_workers must be at least 1"));
        }
        Ok(PyAllReduceHandle {
            workers: num_workers,
        })
    }

    /// Workers per round.
    #[getter]
    fn num_workers(&self) -> usize {
        self.workers
    }

    fn __repr__(&self) -> String {
        format!("AllReduceHandle({})", self.workers)
    }
}

/// The all-reduce handle of a value type: averaging (`cmd=1`) where the
/// type can be divided.
pub trait AllReduceOf: Val + Sized {
    /// The handle for rounds of `workers`.
    fn all_reduce(workers: usize) -> AllReduceHandle<Self>;
}

macro_rules! all_reduce_of {
    (mean: $($m:ty),*; sum: $($s:ty),*) => {
        $(impl AllReduceOf for $m {
            fn all_reduce(workers: usize) -> AllReduceHandle<Self> {
                AllReduceHandle::new(workers).averaging()
            }
        })*
        $(impl AllReduceOf for $s {
            fn all_reduce(workers: usize) -> AllReduceHandle<Self> {
                AllReduceHandle::new(workers)
            }
        })*
    };
}

all_reduce_of!(mean: f32, f64; sum: i32, i64, crate::arrays::RawByte);

/// A Python request handle: `handle(meta, pairs, server)` on the app's
/// thread, with the GIL.
fn python_handle<V: Val + Elem>(
    handle: Py<PyAny>,
) -> impl FnMut(&KVMeta, KVPairs<V>, &KVServer<V>) + Send + 'static
where
    Server: From<KVServer<V>>,
{
    move |meta, pairs, server| {
        call_python(|py| {
            let meta = PyKVMeta { meta: meta.clone() };
            let pairs = PyKVPairs::from_rust(pairs);
            let server = PyKVServer {
                server: Closable::new(Server::from(server.clone()), "KVServer"),
            };
            handle.call1(py, (meta, pairs, server))?;
            Ok(())
        })
    }
}

/// A Python handle of SimpleApp commands sent to a KV server.
fn python_simple_handle<V: Val + Elem>(
    handle: Py<PyAny>,
) -> impl FnMut(&SimpleData, &KVServer<V>) + Send + 'static
where
    Server: From<KVServer<V>>,
{
    move |data, server| {
        call_python(|py| {
            let data = PySimpleData { data: data.clone() };
            let server = PyKVServer {
                server: Closable::new(Server::from(server.clone()), "KVServer"),
            };
            handle.call1(py, (data, server))?;
            Ok(())
        })
    }
}

fn set_handle<V: Val + Elem + AllReduceOf>(
    py: Python<'_>,
    server: &KVServer<V>,
    handle: &Bound<'_, PyAny>,
    inline: bool,
) -> PyResult<()>
where
    Server: From<KVServer<V>>,
{
    if let Ok(all) = handle.cast::<PyAllReduceHandle>() {
        let rust = V::all_reduce(all.get().workers).into_handle();
        py.detach(|| {
            if inline {
                server.set_request_handle_inline(rust)
            } else {
                server.set_request_handle(rust)
            }
        });
        return Ok(());
    }
    if handle.cast::<PyDefaultHandle>().is_ok() {
        let rust = DefaultHandle::<V>::new().into_handle();
        py.detach(|| {
            if inline {
                server.set_request_handle_inline(rust)
            } else {
                server.set_request_handle(rust)
            }
        });
        return Ok(());
    }
    if !handle.is_callable() {
        return Err(invalid(
            "the request handle must be callable as handle(meta, pairs, server), or DefaultHandle()",
        ));
    }
    if inline {
        return Err(invalid(
            "inline=True is for DefaultHandle() and AllReduceHandle() only: a Python handle needs \
             the GIL, which the \
             node's receive thread must never wait for",
        ));
    }
    let handle = python_handle::<V>(handle.clone().unbind());
    py.detach(|| server.set_request_handle(handle));
    Ok(())
}

fn respond<V: Val + Elem>(
    py: Python<'_>,
    server: &KVServer<V>,
    meta: &PyKVMeta,
    pairs: Option<&PyKVPairs>,
) -> PyResult<()> {
    let res = match pairs {
        Some(p) => p.to_rust::<V>(py)?,
        None => KVPairs::default(),
    };
    py.detach(|| server.response(&meta.meta, res)).py()
}

/// A server's key-value app: answers the workers' pushes and pulls.
///
/// `set_request_handle(handle)` with `handle(meta, pairs, server)` (a
/// Python callable, run on the app's thread with the GIL) answers each
/// request with `server.response(meta, KVPairs(keys, vals))`, at once or
/// later, from any thread; `DefaultHandle()` is ps-lite's sum store, run in
/// Rust without the GIL. Requests that arrive before a handle is set wait
/// for it.
#[pyclass(module = "pslite", name = "KVServer")]
pub struct PyKVServer {
    server: Closable<Server>,
}

#[pymethods]
impl PyKVServer {
    /// A server app `app_id` of `po` carrying values of `dtype` (as the
    /// workers' `KVWorker`).
    #[new]
    #[pyo3(signature = (po, app_id = 0, dtype = None))]
    fn new(
        py: Python<'_>,
        po: &PyPostoffice,
        app_id: i32,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let dtype = Dtype::parse(dtype)?;
        let po = po.po.clone();
        let server = py.detach(|| -> Result<Server, pslite::Error> {
            Ok(make!(Server, dtype, T => KVServer::<T>::new(&po, app_id)?))
        });
        Ok(PyKVServer {
            server: Closable::new(server.py()?, "KVServer"),
        })
    }

    /// The value type: "float32", "float64", "int32", "int64" or "raw".
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        Ok(self.server.get()?.dtype().name())
    }

    /// Sets the request handle: `handle(meta, pairs, server)`, or
    /// `DefaultHandle()`. With `inline=True` (`DefaultHandle` only) it runs
    /// on the node's receive thread: one thread hand-off less per request.
    #[pyo3(signature = (handle, inline = false))]
    fn set_request_handle(
        &self,
        py: Python<'_>,
        handle: &Bound<'_, PyAny>,
        inline: bool,
    ) -> PyResult<()> {
        dispatch!(Server, self.server.get()?, s => set_handle(py, s, handle, inline))
    }

    /// Sets the handle of SimpleApp commands sent to this app:
    /// `handle(req, server)`, answering with `server.simple_response(req, body)`.
    fn set_simple_request_handle(&self, py: Python<'_>, handle: Py<PyAny>) -> PyResult<()> {
        let server = self.server.get()?;
        py.detach(|| {
            dispatch!(Server, server, s => s.set_simple_request_handle(python_simple_handle(handle)))
        });
        Ok(())
    }

    /// Answers request `meta`: `pairs` holds the pulled keys and values (a
    /// `KVPairs`; None for a push).
    #[pyo3(signature = (meta, pairs = None))]
    fn response(&self, py: Python<'_>, meta: &PyKVMeta, pairs: Option<&PyKVPairs>) -> PyResult<()> {
        dispatch!(Server, self.server.get()?, s => respond(py, s, meta, pairs))
    }

    /// Refuses request `meta` with `reason` (a request the handle cannot
    /// take: an unknown command, values it cannot use): the worker's wait
    /// raises `pslite.RequestRefused` with "app N: reason" at once. Apply
    /// nothing of a request you refuse.
    fn refuse(&self, py: Python<'_>, meta: &PyKVMeta, reason: String) -> PyResult<()> {
        let refusal = pslite::Refusal::Other {
            app: meta.meta.app_id,
            reason,
        };
        let server = self.server.get()?;
        py.detach(|| dispatch!(Server, server, s => s.refuse(&meta.meta, refusal)));
        Ok(())
    }

    /// Answers SimpleApp command `req` with `body`.
    #[pyo3(signature = (req, body = b"".as_slice()))]
    fn simple_response(&self, py: Python<'_>, req: &PySimpleData, body: &[u8]) -> PyResult<()> {
        let server = self.server.get()?;
        py.detach(|| dispatch!(Server, server, s => s.simple_response(&req.data, body)))
            .py()
    }

    /// How many requests wait for a handle.
    fn queued_requests(&self, py: Python<'_>) -> PyResult<usize> {
        let server = self.server.get()?;
        Ok(py.detach(|| dispatch!(Server, server, s => s.queued_requests())))
    }

    /// The app id.
    #[getter]
    fn app_id(&self) -> PyResult<i32> {
        Ok(dispatch!(Server, self.server.get()?, s => s.app_id()))
    }

    /// Closes the app now (otherwise when it is garbage-collected).
    fn close(&mut self) {
        self.server.close();
    }
}

/// Serves a data-parallel job (`pslite.torch`) as one of its servers until
/// every node has finalized: float32, raw and float64 all-reduce apps at
/// `ALL_REDUCE_APPS` (`pslite::serve_all_reduce`, which the native
/// `pslite torch-server` runs too). `po` must be a started server.
#[pyfunction]
pub fn serve_all_reduce(py: Python<'_>, po: &PyPostoffice) -> PyResult<()> {
    if !po.po.is_server() {
        return Err(invalid("serve_all_reduce runs on a server's Postoffice"));
    }
    let po = po.po.clone();
    interruptible(py, "serve", move || pslite::serve_all_reduce(&po))?.py()
}

/// `ALL_REDUCE_APPS`: the app id of each value type on a data-parallel
/// job's servers (`{"float32": 0, "raw": 1, "float64": 2}`).
pub fn all_reduce_apps(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let apps = pyo3::types::PyDict::new(py);
    let a = pslite::ALL_REDUCE_APPS;
    apps.set_item("float32", a.float32)?;
    apps.set_item("raw", a.raw)?;
    apps.set_item("float64", a.float64)?;
    Ok(apps)
}

/// `EMBEDDING_CMDS`: the `cmd` bits of embedding-table requests on the
/// float32 app (`pslite::embedding`): `{"embedding": .., "config": ..,
/// "table_mask": .., "stats_words": ..}`.
pub fn embedding_cmds(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use pslite::embedding as e;
    let cmds = pyo3::types::PyDict::new(py);
    cmds.set_item("embedding", e::EMBEDDING)?;
    cmds.set_item("config", e::CONFIG)?;
    cmds.set_item("table_mask", e::TABLE_MASK)?;
    cmds.set_item("stats_words", e::STATS_WORDS)?;
    Ok(cmds)
}

/// `embedding_initial_rows(config, keys)`: the rows the servers make on
/// first touch for `keys` in the table whose configuration record is
/// `config` (the words a `pslite.torch` module sends), one row after
/// another (`len(keys) * dim` values). The lookups of a served export
/// answer ids it does not hold with them.
#[pyfunction]
pub fn embedding_initial_rows(config: Vec<u32>, keys: Vec<u64>) -> PyResult<Vec<f32>> {
    use pslite::embedding as e;
    let config = e::TableConfig::from_words(&config).map_err(invalid)?;
    config.check().map_err(invalid)?;
    Ok(keys
        .iter()
        .flat_map(|&k| e::initial_row(&config, k))
        .collect())
}

/// A server node inside this worker's process (colocated mode,
/// `pslite launch --colocate`): `pslite::ColocatedServer`.
#[pyclass(module = "pslite", name = "ColocatedServer")]
pub struct PyColocatedServer {
    server: Option<pslite::ColocatedServer>,
}

#[pymethods]
impl PyColocatedServer {
    /// Starts the server node that `env` (the worker's variables) describes
    /// with the role server and a free port; raises `ConfigError` at once
    /// for a bad configuration.
    #[staticmethod]
    fn start(env: std::collections::HashMap<String, String>) -> PyResult<PyColocatedServer> {
        let server = pslite::ColocatedServer::start(|name| env.get(name).cloned()).py()?;
        Ok(PyColocatedServer {
            server: Some(server),
        })
    }

    /// Whether the node has ended (served and finalized, or failed).
    fn is_finished(&self) -> bool {
        self.server.as_ref().is_none_or(|s| s.is_finished())
    }

    /// Waits for the node to end (call it after the worker's finalize) and
    /// raises its error, if it failed. Later calls return at once.
    fn join(&mut self, py: Python<'_>) -> PyResult<()> {
        match self.server.take() {
            Some(server) => interruptible(py, "colocated", move || server.join())?.py(),
            None => Ok(()),
        }
    }
}
