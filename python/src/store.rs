//! `Store`: the job's key-value store on the scheduler, with the method
//! names of `torch.distributed.Store` (see `pslite::Store`).

use std::sync::Mutex;
use std::time::Duration;

use pslite::{Store, StoreEvent, Watch};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{invalid, to_py};
use crate::wait::{interruptible, seconds, sliced, Slice};

/// A key or value argument: `str` (as UTF-8) or bytes-like.
fn value_bytes(v: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = v.extract::<String>() {
        return Ok(s.into_bytes());
    }
    v.extract::<Vec<u8>>().map_err(|_| {
        invalid(format!(
            "a store value must be str or bytes, got {}",
            v.get_type()
        ))
    })
}

/// One change of a watched key: `key`, `value` (bytes; None when deleted)
/// and `version` (1 for the key's first set, +1 for every change after).
#[pyclass(module = "pslite", frozen, name = "StoreEvent")]
pub struct PyStoreEvent {
    event: StoreEvent,
}

#[pymethods]
impl PyStoreEvent {
    /// The key.
    #[getter]
    fn key(&self) -> &str {
        &self.event.key
    }

    /// Its new value, or None if it was deleted.
    #[getter]
    fn value<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.event.value.as_ref().map(|v| PyBytes::new(py, v))
    }

    /// The key's version after the change.
    #[getter]
    fn version(&self) -> u64 {
        self.event.version
    }

    fn __repr__(&self) -> String {
        match &self.event.value {
            Some(v) => format!(
                "StoreEvent(key={:?}, value=<{} bytes>, version={})",
                self.event.key,
                v.len(),
                self.event.version
            ),
            None => format!(
                "StoreEvent(key={:?}, value=None, version={})",
                self.event.key, self.event.version
            ),
        }
    }
}

/// The changes of one watched key, in order: iterate over it (each step
/// waits for the next change; Ctrl-C interrupts), or call `next_event`
/// with a timeout. The watch ends when this object is dropped.
#[pyclass(module = "pslite", frozen, name = "Watch")]
pub struct PyWatch {
    watch: Mutex<Watch>,
    version: u64,
}

impl PyWatch {
    fn next(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<Option<PyStoreEvent>> {
        let found = sliced(py, timeout, |slice| {
            match pslite::proto::lock(&self.watch).next_within(slice) {
                Ok(Some(event)) => Slice::Done(Some(event)),
                Ok(None) => Slice::Again,
                Err(_ended) => Slice::Done(None),
            }
        })?;
        Ok(found.flatten().map(|event| PyStoreEvent { event }))
    }
}

#[pymethods]
impl PyWatch {
    /// The key's version when the watch began (0: never set).
    #[getter]
    fn version(&self) -> u64 {
        self.version
    }

    /// The next change, waiting up to `timeout` seconds (None: no limit);
    /// None if none came in time or the node stopped.
    #[pyo3(signature = (timeout = None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyStoreEvent>> {
        self.next(py, seconds(timeout)?)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyStoreEvent>> {
        self.next(py, None)
    }
}

/// The job's key-value store, hosted by the scheduler (`Postoffice.store()`),
/// with `torch.distributed.Store`'s method names. Keys are str, values bytes
/// (str values are stored as UTF-8). Waiting calls release the GIL and give
/// up after the handle's timeout with `Timeout`.
#[pyclass(module = "pslite", name = "Store")]
pub struct PyStore {
    store: Store,
}

impl PyStore {
    /// A handle on `store`.
    pub fn new(store: Store) -> PyStore {
        PyStore { store }
    }

    /// Runs a store call on a helper thread, interruptible by Ctrl-C.
    fn call<T: Send + 'static>(
        &self,
        py: Python<'_>,
        what: &str,
        f: impl FnOnce(Store) -> Result<T, pslite::Error> + Send + 'static,
    ) -> PyResult<T> {
        let store = self.store.clone();
        interruptible(py, what, move || f(store))?.map_err(to_py)
    }
}

#[pymethods]
impl PyStore {
    /// Sets `key` to `value`.
    fn set(&self, py: Python<'_>, key: String, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_bytes(value)?;
        self.call(py, "store-set", move |s| s.set(&key, value))
    }

    /// The value of `key`, waiting until it is set (up to the timeout).
    fn get<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.call(py, "store-get", move |s| s.get(&key))?;
        Ok(PyBytes::new(py, &v))
    }

    /// Adds `amount` to the integer in `key` (absent: 0); returns the sum.
    fn add(&self, py: Python<'_>, key: String, amount: i64) -> PyResult<i64> {
        self.call(py, "store-add", move |s| s.add(&key, amount))
    }

    /// Sets `key` to `desired_value` if its value is `expected_value` (an
    /// empty `expected_value`: if the key does not exist, as in
    /// torch.distributed); returns the key's value now.
    fn compare_set<'py>(
        &self,
        py: Python<'py>,
        key: String,
        expected_value: &Bound<'_, PyAny>,
        desired_value: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let expected = value_bytes(expected_value)?;
        let desired = value_bytes(desired_value)?;
        let answer = self.call(py, "store-compare-set", move |s| {
            let expected = (!expected.is_empty()).then_some(expected);
            s.compare_set(&key, expected.as_deref(), desired)
        })?;
        Ok(PyBytes::new(py, answer.value.as_deref().unwrap_or(b"")))
    }

    /// Waits until every key of `keys` exists, up to `timeout` seconds
    /// (default: the handle's timeout).
    #[pyo3(signature = (keys, timeout = None))]
    fn wait(&self, py: Python<'_>, keys: Vec<String>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = seconds(timeout)?.unwrap_or(self.store.timeout());
        self.call(py, "store-wait", move |s| {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            s.wait_within(&keys, timeout)
        })
    }

    /// How many keys the store holds.
    fn num_keys(&self, py: Python<'_>) -> PyResult<usize> {
        self.call(py, "store-num-keys", |s| s.num_keys())
    }

    /// Deletes `key`; whether it existed.
    fn delete_key(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        self.call(py, "store-delete", move |s| s.delete(&key))
    }

    /// Whether every key of `keys` exists (no waiting).
    fn check(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<bool> {
        self.call(py, "store-check", move |s| {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            s.check(&keys)
        })
    }

    /// Appends `value` to `key`'s value (absent: sets it).
    fn append(&self, py: Python<'_>, key: String, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_bytes(value)?;
        self.call(py, "store-append", move |s| s.append(&key, value).map(drop))
    }

    /// The values of `keys`, read at one instant (waits until all are set).
    fn multi_get<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let values = self.call(py, "store-multi-get", move |s| {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            s.multi_get(&keys)
        })?;
        Ok(values.iter().map(|v| PyBytes::new(py, v)).collect())
    }

    /// Sets every key of `keys` to the value at the same index, in one request.
    fn multi_set(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if keys.len() != values.len() {
            return Err(invalid(format!(
                "{} keys and {} values: give one value per key",
                keys.len(),
                values.len()
            )));
        }
        let values = values
            .iter()
            .map(value_bytes)
            .collect::<PyResult<Vec<_>>>()?;
        self.call(py, "store-multi-set", move |s| {
            s.multi_set(keys.into_iter().zip(values))
        })
    }

    /// Every key, sorted.
    fn keys(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.call(py, "store-keys", |s| s.keys())
    }

    /// Every later change (set or delete) of `key`, in order, as a `Watch`
    /// to iterate over.
    fn watch(&self, py: Python<'_>, key: String) -> PyResult<PyWatch> {
        let watch = self.call(py, "store-watch", move |s| s.watch(&key))?;
        Ok(PyWatch {
            version: watch.version,
            watch: Mutex::new(watch),
        })
    }

    /// Sets the timeout of waiting calls, in seconds (None: no limit).
    fn set_timeout(&mut self, timeout: Option<f64>) -> PyResult<()> {
        let timeout = seconds(timeout)?.unwrap_or(Store::NO_TIMEOUT);
        self.store = self.store.clone().with_timeout(timeout);
        Ok(())
    }

    /// The timeout of waiting calls, in seconds (None: no limit).
    #[getter]
    fn timeout(&self) -> Option<f64> {
        let t = self.store.timeout();
        (!t.is_zero()).then_some(t.as_secs_f64())
    }
}
