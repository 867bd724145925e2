//! `pslite._pslite`: pslite for Python, the native part of the `pslite`
//! package (its Python part, `pslite/`, re-exports this module, adds the
//! exception classes and the optional `pslite.torch` helper).
//!
//! The Rust crate's API with Python names: `Postoffice`, `KVWorker`,
//! `KVServer` (with `DefaultHandle`, ps-lite's sum store, run in Rust),
//! `SimpleApp` (their requests are `Request` objects, `request.rs`), `Store` (with `torch.distributed.Store`'s method names) and
//! the group constants. Values travel as NumPy arrays without copies on
//! either side (`arrays.rs`); every call that waits releases the GIL and
//! answers Ctrl-C (`wait.rs`); handles and callbacks written in Python run on
//! the apps' threads with the GIL (`calls.rs`); errors are raised as the
//! exception named after their kind (`errors.rs`).
//!
//! Lock order, so that no thread waits for the GIL while holding a lock
//! another thread needs to give the GIL back: a thread holding the GIL never
//! waits on a lock of the Rust crate (every such call runs inside
//! `Python::detach`), and a pslite thread takes the GIL only to run Python
//! code, never while the GIL holder could be waiting on it.

mod arrays;
mod calls;
mod cli;
mod compression;
mod dtype;
mod errors;
mod kv_server;
mod kv_worker;
mod pairs;
mod postoffice;
mod request;
mod simple_app;
mod store;
mod wait;

use pyo3::prelude::*;

use crate::dtype::Dtype;

/// A read-only copy of `array` that pslite owns, as a NumPy array of
/// `dtype` (default: the array's own; keys: `numpy.uint64`). Pushing it
/// again and again sends it without a copy between processes of one host,
/// and, as keys, it is checked for order once; an ordinary NumPy array is
/// copied into shared memory at every push (pslite cannot know it did not
/// change).
#[pyfunction]
#[pyo3(signature = (array, dtype = None))]
fn frozen(
    py: Python<'_>,
    array: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let numpy = arrays::numpy(py)?;
    let name: String = match dtype {
        Some(d) if !d.is_none() => numpy
            .call_method1("dtype", (d,))?
            .getattr("name")?
            .extract()?,
        _ => numpy
            .call_method1("asarray", (array,))?
            .getattr("dtype")?
            .getattr("name")?
            .extract()?,
    };
    match name.as_str() {
        // uint64 arrays are keys: integers >= 0, nothing else converted.
        "uint64" => arrays::frozen::<u64>(array, "keys"),
        "int32" => arrays::frozen::<i32>(array, "array"),
        "int64" => arrays::frozen::<i64>(array, "array"),
        "float32" => arrays::frozen::<f32>(array, "array"),
        "float64" => arrays::frozen::<f64>(array, "array"),
        "uint8" => arrays::frozen::<arrays::RawByte>(array, "array"),
        other => Err(errors::invalid(format!(
            "frozen arrays of {other} are not supported: use uint64 (keys), int32 (lens), \
             float32, float64, int32, int64 or uint8"
        ))),
    }
}

/// How many received frames had to be copied because they were not
/// aligned for their element type (process-wide).
#[pyfunction]
fn misaligned_copies() -> u64 {
    pslite::misaligned_copies()
}

/// The native module.
#[pymodule]
fn _pslite(m: &Bound<'_, PyModule>) -> PyResult<()> {
    pslite::init_logging();
    m.add_class::<postoffice::PyPostoffice>()?;
    m.add_class::<postoffice::PyMembership>()?;
    m.add_class::<kv_worker::PyKVWorker>()?;
    m.add_class::<compression::PyCompression>()?;
    m.add_class::<kv_server::PyKVServer>()?;
    m.add_class::<kv_server::PyDefaultHandle>()?;
    m.add_class::<kv_server::PyAllReduceHandle>()?;
    m.add_class::<kv_server::PyColocatedServer>()?;
    m.add_class::<pairs::PyKVPairs>()?;
    m.add_class::<pairs::PyKVMeta>()?;
    m.add_class::<request::PyRequest>()?;
    m.add_class::<simple_app::PySimpleApp>()?;
    m.add_class::<simple_app::PySimpleData>()?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<store::PyStoreEvent>()?;
    m.add_class::<store::PyWatch>()?;
    m.add_class::<arrays::ArrayView>()?;
    m.add_function(wrap_pyfunction!(frozen, m)?)?;
    m.add_function(wrap_pyfunction!(misaligned_copies, m)?)?;
    m.add_function(wrap_pyfunction!(cli::_cli, m)?)?;
    m.add_function(wrap_pyfunction!(kv_server::serve_all_reduce, m)?)?;
    m.add_function(wrap_pyfunction!(kv_server::embedding_initial_rows, m)?)?;
    m.add("ALL_REDUCE_APPS", kv_server::all_reduce_apps(m.py())?)?;
    m.add("EMBEDDING_CMDS", kv_server::embedding_cmds(m.py())?)?;
    m.add("SCHEDULER_GROUP", pslite::SCHEDULER_GROUP)?;
    m.add("SERVER_GROUP", pslite::SERVER_GROUP)?;
    m.add("WORKER_GROUP", pslite::WORKER_GROUP)?;
    m.add("ALL_GROUP", pslite::ALL_GROUP)?;
    m.add(
        "DTYPES",
        [Dtype::F32, Dtype::F64, Dtype::I32, Dtype::I64, Dtype::Raw].map(Dtype::name),
    )?;
    Ok(())
}
