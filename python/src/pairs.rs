//! `KVPairs` and `KVMeta` as Python sees them.
//!
//! A `KVPairs` made by pslite (pulled values, a server's request) keeps the
//! Rust arrays and makes each NumPy view on first access, so a handle that
//! never looks at the values pays nothing for them; one made in Python
//! (`KVPairs(keys, vals)`, a server's answer) keeps the Python objects and
//! is turned into `SArray`s when sent.

use std::sync::OnceLock;

use pslite::{KVMeta, KVPairs, SArray, Val};
use pyo3::prelude::*;

use crate::arrays::{any_to_numpy, from_numpy, AnyArray, Elem};

/// One field of a `KVPairs`: the Rust array, the Python object, or both.
struct Field {
    rust: Option<AnyArray>,
    py: OnceLock<Py<PyAny>>,
}

impl Field {
    fn rust(array: AnyArray) -> Field {
        Field {
            rust: Some(array),
            py: OnceLock::new(),
        }
    }

    fn py(obj: Py<PyAny>) -> Field {
        let py = OnceLock::new();
        let _ = py.set(obj);
        Field { rust: None, py }
    }

    /// The NumPy array (made on first access).
    fn get(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(obj) = self.py.get() {
            return Ok(obj.clone_ref(py));
        }
        let array = match &self.rust {
            Some(a) => a.clone(),
            None => return Ok(py.None()),
        };
        let made = any_to_numpy(py, array)?;
        Ok(self.py.get_or_init(|| made).clone_ref(py))
    }

    /// The field as an `SArray<T>`: the Rust array if it has that type,
    /// else the Python object converted (no copy for a matching array).
    fn sarray<T: Elem>(&self, py: Python<'_>, what: &str) -> PyResult<SArray<T>> {
        if let Some(a) = self.rust.as_ref().and_then(T::unwrap) {
            return Ok(a.clone());
        }
        match self.py.get() {
            Some(obj) if !obj.is_none(py) => from_numpy::<T>(obj.bind(py), what),
            _ => Ok(SArray::new()),
        }
    }
}

/// Keys with their values and, optionally, the number of values per key
/// (`lens`, empty when every key has the same number), as NumPy arrays.
///
/// `KVPairs(keys, vals, lens=None)` makes one to answer a pull with
/// (`KVServer.response`); pslite hands out read-only ones (pulled values,
/// requests) whose arrays are views of the received buffers.
#[pyclass(module = "pslite", frozen, name = "KVPairs")]
pub struct PyKVPairs {
    keys: Field,
    vals: Field,
    lens: Field,
}

impl PyKVPairs {
    /// Pairs received or assembled by pslite.
    pub fn from_rust<V: Val + Elem>(pairs: KVPairs<V>) -> PyKVPairs {
        PyKVPairs {
            keys: Field::rust(u64::wrap(pairs.keys)),
            vals: Field::rust(V::wrap(pairs.vals)),
            lens: Field::rust(i32::wrap(pairs.lens)),
        }
    }

    /// Pulled pairs whose values were placed in `vals` (an `out=`).
    pub fn from_parts(keys: SArray<u64>, lens: SArray<i32>, vals: Py<PyAny>) -> PyKVPairs {
        PyKVPairs {
            keys: Field::rust(u64::wrap(keys)),
            vals: Field::py(vals),
            lens: Field::rust(i32::wrap(lens)),
        }
    }

    /// The pairs as Rust arrays of value type `V` (no copies for arrays of
    /// the right dtypes).
    pub fn to_rust<V: Val + Elem>(&self, py: Python<'_>) -> PyResult<KVPairs<V>> {
        Ok(KVPairs {
            keys: self.keys.sarray::<u64>(py, "keys")?,
            vals: self.vals.sarray::<V>(py, "vals")?,
            lens: self.lens.sarray::<i32>(py, "lens")?,
        })
    }
}

#[pymethods]
impl PyKVPairs {
    #[new]
    #[pyo3(signature = (keys, vals, lens = None))]
    fn new(keys: Py<PyAny>, vals: Py<PyAny>, lens: Option<Py<PyAny>>) -> PyKVPairs {
        PyKVPairs {
            keys: Field::py(keys),
            vals: Field::py(vals),
            lens: match lens {
                Some(l) => Field::py(l),
                None => Field {
                    rust: Some(i32::wrap(SArray::new())),
                    py: OnceLock::new(),
                },
            },
        }
    }

    /// The keys (`numpy.uint64`, sorted ascending, unique).
    #[getter]
    fn keys(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.keys.get(py)
    }

    /// The values of every key, back to back.
    #[getter]
    fn vals(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.vals.get(py)
    }

    /// Values per key (`numpy.int32`); empty when every key has
    /// `len(vals) // len(keys)` values.
    #[getter]
    fn lens(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.lens.get(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "KVPairs(keys={}, vals={}, lens={})",
            self.keys.get(py)?.bind(py).repr()?,
            self.vals.get(py)?.bind(py).repr()?,
            self.lens.get(py)?.bind(py).repr()?
        ))
    }
}

/// What a server's request handle learns about a request besides its data.
#[pyclass(module = "pslite", frozen, name = "KVMeta")]
pub struct PyKVMeta {
    pub(crate) meta: KVMeta,
}

#[pymethods]
impl PyKVMeta {
    /// The worker's command (`cmd` of its request).
    #[getter]
    fn cmd(&self) -> i32 {
        self.meta.cmd
    }

    /// Whether the request pushes values.
    #[getter]
    fn push(&self) -> bool {
        self.meta.push
    }

    /// Whether the request pulls values.
    #[getter]
    fn pull(&self) -> bool {
        self.meta.pull
    }

    /// The requesting node's id.
    #[getter]
    fn sender(&self) -> i32 {
        self.meta.sender
    }

    /// The request's timestamp (echoed in the response).
    #[getter]
    fn timestamp(&self) -> i32 {
        self.meta.timestamp
    }

    /// The requesting customer (echoed in the response).
    #[getter]
    fn customer_id(&self) -> i32 {
        self.meta.customer_id
    }

    /// The app the request is for.
    #[getter]
    fn app_id(&self) -> i32 {
        self.meta.app_id
    }

    /// The request's priority.
    #[getter]
    fn priority(&self) -> i32 {
        self.meta.priority
    }

    fn __repr__(&self) -> String {
        let m = &self.meta;
        format!(
            "KVMeta(cmd={}, push={}, pull={}, sender={}, timestamp={}, customer_id={}, app_id={}, priority={})",
            m.cmd, py_bool(m.push), py_bool(m.pull), m.sender, m.timestamp, m.customer_id, m.app_id, m.priority
        )
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}
