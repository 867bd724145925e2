//! NumPy arrays to and from [`SArray`]s, without copies.
//!
//! **Sending.** A C-contiguous NumPy array of the right dtype becomes an
//! `SArray` over the array's own memory ([`SArray::from_owner`]): the
//! `SArray` holds a reference to the array until the last frame made of it
//! is sent, and nothing is copied on the caller's side. The caller must not
//! change the array until the request completes (as with ps-lite's
//! `ZPush`). Anything else (a list, another dtype, a strided view) is
//! converted once with `numpy.ascontiguousarray`. Arrays pslite handed out
//! (pulled values, a request's data, `pslite.frozen` copies) are read-only
//! views of an `SArray`: sent again, they are that `SArray` (or a slice of
//! it) again, so the shared-memory path may send them without a copy and a
//! key array is checked for order once.
//!
//! **Receiving.** Received data is handed out as read-only NumPy arrays over
//! the received buffer (a ZeroMQ frame or a shared-memory segment): the
//! array's `base` is an [`ArrayView`] that holds the `SArray`, and NumPy
//! reads the memory in place through `__array_interface__` (the stable ABI
//! of Python 3.9 has no buffer protocol).
//!
//! Python references are dropped by whichever thread drops the last frame,
//! usually without the GIL: PyO3 then defers the decrement to the next
//! thread that holds the GIL, so no pslite thread ever waits for the GIL to
//! free memory.

use std::sync::Mutex;

use bytemuck::Pod;
use pslite::SArray;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::invalid;

/// One byte of raw data (typed OTHER on the wire): `pslite::RawByte`.
pub use pslite::RawByte;

/// An element type that crosses between NumPy and pslite.
pub trait Elem: Pod + Send + Sync + 'static {
    /// NumPy's `typestr` of the element (little-endian).
    const TYPESTR: &'static str;
    /// The NumPy dtype name, for messages and conversions.
    const DTYPE: &'static str;
    /// The array as an [`AnyArray`].
    fn wrap(array: SArray<Self>) -> AnyArray;
    /// The array of this element type inside `any`, if it is one.
    fn unwrap(any: &AnyArray) -> Option<&SArray<Self>>;
}

macro_rules! elems {
    ($($t:ty => $variant:ident, $typestr:literal, $dtype:literal;)*) => {
        /// An `SArray` of any element type that crosses to Python.
        #[derive(Clone)]
        pub enum AnyArray {
            $(
                #[doc = concat!("Elements of NumPy dtype ", $dtype, ".")]
                $variant(SArray<$t>),
            )*
        }

        impl AnyArray {
            /// Address of the first element.
            pub fn address(&self) -> usize {
                match self {
                    $(AnyArray::$variant(a) => a.bytes().as_ptr() as usize,)*
                }
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                match self {
                    $(AnyArray::$variant(a) => a.len(),)*
                }
            }

            /// NumPy's `typestr`.
            pub fn typestr(&self) -> &'static str {
                match self {
                    $(AnyArray::$variant(_) => <$t as Elem>::TYPESTR,)*
                }
            }
        }

        $(impl Elem for $t {
            const TYPESTR: &'static str = $typestr;
            const DTYPE: &'static str = $dtype;
            fn wrap(array: SArray<Self>) -> AnyArray {
                AnyArray::$variant(array)
            }
            fn unwrap(any: &AnyArray) -> Option<&SArray<Self>> {
                match any {
                    AnyArray::$variant(a) => Some(a),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        })*
    };
}

elems! {
    u64 => U64, "<u8", "uint64";
    i32 => I32, "<i4", "int32";
    i64 => I64, "<i8", "int64";
    f32 => F32, "<f4", "float32";
    f64 => F64, "<f8", "float64";
    RawByte => Raw, "|u1", "uint8";
}

/// A read-only view of an `SArray` that NumPy reads in place: the `base`
/// of every array pslite hands out.
#[pyclass(module = "pslite", frozen, name = "ArrayView")]
pub struct ArrayView {
    array: AnyArray,
}

#[pymethods]
impl ArrayView {
    /// NumPy's array interface (version 3): the memory, read-only.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.array.len(),))?;
        d.set_item("typestr", self.array.typestr())?;
        d.set_item("data", (self.array.address(), true))?;
        Ok(d)
    }

    /// Address of the first element (for checking that no copy was made).
    #[getter]
    fn address(&self) -> usize {
        self.array.address()
    }

    /// Number of elements.
    fn __len__(&self) -> usize {
        self.array.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<pslite.ArrayView of {} elements ({}) at {:#x}>",
            self.array.len(),
            self.array.typestr(),
            self.array.address()
        )
    }
}

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The `numpy` module.
pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

/// A read-only NumPy array over `array`'s memory (no copy).
pub fn to_numpy<T: Elem>(py: Python<'_>, array: SArray<T>) -> PyResult<Py<PyAny>> {
    any_to_numpy(py, T::wrap(array))
}

/// [`to_numpy`] of an [`AnyArray`].
pub fn any_to_numpy(py: Python<'_>, array: AnyArray) -> PyResult<Py<PyAny>> {
    let view = Bound::new(py, ArrayView { array })?;
    Ok(numpy(py)?.call_method1("asarray", (view,))?.unbind())
}

/// A NumPy array's memory, held while an `SArray` made of it lives.
struct Held {
    /// Keeps the array (and so its memory) alive; dropped without the GIL,
    /// PyO3 defers the decrement.
    _array: Py<PyAny>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the memory is owned by the NumPy array `_array` keeps alive, and
// only read (`as_ref`) from any thread; `Py` itself is Send.
unsafe impl Send for Held {}
// SAFETY: as above; shared reads only.
unsafe impl Sync for Held {}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr+len` is the array's data, alive while `_array`
        // is held (the caller may not resize it: NumPy refuses to resize an
        // array that others reference).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// What `__array_interface__` says of a contiguous array.
struct Interface {
    ptr: usize,
    elems: usize,
    typestr: String,
    contiguous: bool,
}

fn interface(obj: &Bound<'_, PyAny>) -> PyResult<Option<Interface>> {
    let Ok(iface) = obj.getattr("__array_interface__") else {
        return Ok(None);
    };
    let Ok(iface) = iface.cast_into::<PyDict>() else {
        return Ok(None);
    };
    let get = |key: &str| iface.get_item(key).ok().flatten();
    let Some(data) = get("data").filter(|d| !d.is_none()) else {
        return Ok(None); // exports a buffer instead of a pointer
    };
    let data = data.cast_into::<PyTuple>()?;
    let ptr: usize = data.get_item(0)?.extract()?;
    let typestr: String = match get("typestr") {
        Some(t) => t.extract()?,
        None => return Ok(None),
    };
    let shape: Vec<usize> = match get("shape") {
        Some(s) => s.extract()?,
        None => return Ok(None),
    };
    let elems = shape.iter().product();
    // C-contiguous: no strides given, or strides equal to the C ones.
    let contiguous = match get("strides").filter(|s| !s.is_none()) {
        None => true,
        Some(strides) => {
            let strides: Vec<isize> = strides.extract()?;
            let itemsize = typestr
                .get(2..)
                .and_then(|n| n.parse::<isize>().ok())
                .unwrap_or(0);
            let mut want = itemsize;
            let mut ok = true;
            for (dim, stride) in shape.iter().zip(&strides).rev() {
                if *dim > 1 && *stride != want {
                    ok = false;
                }
                want *= *dim as isize;
            }
            ok
        }
    };
    Ok(Some(Interface {
        ptr,
        elems,
        typestr,
        contiguous,
    }))
}

/// How far down `base`s to look for an [`ArrayView`] (a slice of a slice
/// of a pulled array is two down).
const MAX_BASES: usize = 8;

/// The `SArray` inside a view pslite handed out, sliced to the part `obj`
/// shows, if `obj` is such an array: its `base` an [`ArrayView`] of `T`, or
/// an array whose base is one (NumPy gives a slice of an array that does
/// not own its memory that array as its base), and so on. The memory `obj`
/// shows must lie inside the `SArray` (checked by address).
fn handed_out<T: Elem + Pod>(obj: &Bound<'_, PyAny>, iface: &Interface) -> Option<SArray<T>> {
    let mut base = obj.getattr("base").ok()?;
    let mut depth = 1;
    let view = loop {
        if let Ok(view) = base.cast::<ArrayView>() {
            break view.clone();
        }
        if base.is_none() || depth == MAX_BASES {
            return None;
        }
        base = base.getattr("base").ok()?;
        depth += 1;
    };
    let array = T::unwrap(&view.get().array)?;
    let start = array.bytes().as_ptr() as usize;
    let size = std::mem::size_of::<T>();
    let offset = iface.ptr.checked_sub(start)?;
    if offset % size != 0 {
        return None;
    }
    let first = offset / size;
    let end = first.checked_add(iface.elems)?;
    (end <= array.len()).then(|| {
        if first == 0 && end == array.len() {
            array.clone()
        } else {
            array.slice(first..end)
        }
    })
}

/// `obj` (a NumPy array, or anything `numpy.ascontiguousarray` takes) as
/// an `SArray<T>`: without a copy when it is a C-contiguous array of dtype
/// `T`; `what` names the argument in errors and picks the rule of
/// conversion for anything else (`pslite/_convert.py`: keys, lens, or
/// values converted only when exact).
pub fn from_numpy<T: Elem>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<SArray<T>> {
    from_numpy_cast(obj, what, false)
}

/// [`from_numpy`]; with `cast`, values of another dtype are converted even
/// when inexactly (as `numpy.ndarray.astype`).
pub fn from_numpy_cast<T: Elem>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    cast: bool,
) -> PyResult<SArray<T>> {
    let py = obj.py();
    if let Some(iface) = interface(obj)? {
        if iface.typestr == T::TYPESTR && iface.contiguous {
            if let Some(array) = handed_out::<T>(obj, &iface) {
                return Ok(array);
            }
            let held = Held {
                _array: obj.clone().unbind(),
                ptr: iface.ptr as *const u8,
                len: iface.elems * std::mem::size_of::<T>(),
            };
            return SArray::from_owner(held).map_err(|e| invalid(format!("{what}: {e}")));
        }
    }
    // One conversion, by the rule for `what`.
    let convert = converter(py)?;
    let converted = match what {
        "keys" => convert.call_method1("keys", (obj,))?,
        "lens" => convert.call_method1("lens", (obj,))?,
        _ => convert.call_method1("values", (obj, T::DTYPE, cast, what))?,
    };
    let iface = interface(&converted)?
        .filter(|i| i.typestr == T::TYPESTR && i.contiguous)
        .ok_or_else(|| invalid(format!("{what}: numpy gave no contiguous {}", T::DTYPE)))?;
    let held = Held {
        _array: converted.unbind(),
        ptr: iface.ptr as *const u8,
        len: iface.elems * std::mem::size_of::<T>(),
    };
    SArray::from_owner(held).map_err(|e| invalid(format!("{what}: {e}")))
}

static CONVERT: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The `pslite._convert` module.
fn converter(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(CONVERT
        .get_or_try_init(py, || py.import("pslite._convert").map(Bound::unbind))?
        .bind(py))
}

/// What a completed pull left of itself beside the values it placed in
/// an [`OutArray`]: its keys and lens, or why the values did not fit.
pub type Placed = Result<(SArray<u64>, SArray<i32>), String>;

/// A caller's writable array (or CPU tensor) that a pull fills: its memory,
/// held while the request lives.
pub struct OutArray {
    /// The caller's object (returned as the pulled values).
    pub obj: Py<PyAny>,
    /// Keeps the memory alive (a torch tensor's NumPy view, or `obj`).
    _view: Py<PyAny>,
    ptr: usize,
    /// Elements.
    pub len: usize,
    /// Once the pull completed: its keys and lens (the values are in the
    /// array), or why they could not be placed there.
    placed: Mutex<Option<Placed>>,
}

impl OutArray {
    /// `obj` as the target of a pull of `T` values: a writable C-contiguous
    /// NumPy array of dtype `T`, or a CPU `torch.Tensor` of that dtype.
    pub fn of<T: Elem>(obj: &Bound<'_, PyAny>) -> PyResult<OutArray> {
        let is_tensor = obj.hasattr("detach")?
            && obj.hasattr("numpy")?
            && !obj.hasattr("__array_interface__")?;
        let view = if is_tensor {
            let device: String = obj.getattr("device")?.getattr("type")?.extract()?;
            if device != "cpu" {
                return Err(invalid(format!(
                    "out= must be in host memory: this tensor is on {device} (pull into a \
                     pinned CPU tensor, then copy it over)"
                )));
            }
            obj.call_method0("detach")?.call_method0("numpy")?
        } else {
            obj.clone()
        };
        let data = view
            .getattr("__array_interface__")
            .ok()
            .and_then(|i| i.cast_into::<PyDict>().ok())
            .and_then(|i| i.get_item("data").ok().flatten());
        let readonly = data
            .as_ref()
            .and_then(|d| d.cast::<PyTuple>().ok().and_then(|t| t.get_item(1).ok()))
            .and_then(|r| r.extract::<bool>().ok())
            .unwrap_or(true);
        let Some(iface) = interface(&view)? else {
            return Err(invalid(format!(
                "out= must be a NumPy array or a CPU torch.Tensor, got {}",
                obj.get_type().name()?
            )));
        };
        if iface.typestr != T::TYPESTR {
            return Err(invalid(format!(
                "out= must be of dtype {} (the worker's), got {}",
                T::DTYPE,
                view.getattr("dtype")?
            )));
        }
        if !iface.contiguous {
            return Err(invalid("out= must be C-contiguous"));
        }
        if readonly {
            return Err(invalid("out= must be writable (this array is read-only)"));
        }
        Ok(OutArray {
            obj: obj.clone().unbind(),
            _view: view.unbind(),
            ptr: iface.ptr,
            len: iface.elems,
            placed: Mutex::new(None),
        })
    }

    /// Places a completed pull's values in the array (on pslite's thread,
    /// as the request completes: no GIL needed) and keeps its keys and lens.
    pub fn place<T: Elem + pslite::Val>(&self, pairs: pslite::KVPairs<T>) {
        let placed = self
            .fill(&pairs.vals[..])
            .map(|()| (pairs.keys, pairs.lens));
        *pslite::proto::lock(&self.placed) = Some(placed);
    }

    /// What [`OutArray::place`] kept (`None`: the pull has not completed, or
    /// failed).
    pub fn placed(&self) -> Option<Placed> {
        pslite::proto::lock(&self.placed).clone()
    }

    /// Copies `vals` in (their number checked against the array's).
    pub fn fill<T: Elem>(&self, vals: &[T]) -> Result<(), String> {
        if vals.len() != self.len {
            return Err(format!(
                "out= has {} elements and the pull returned {} values",
                self.len,
                vals.len()
            ));
        }
        if !vals.is_empty() {
            // SAFETY: `ptr..ptr + len * size_of::<T>()` is the writable,
            // contiguous memory of an array of T that `_view` keeps alive
            // (checked in `of`); `vals` is a received buffer, another
            // allocation, so the two do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(vals.as_ptr(), self.ptr as *mut T, vals.len());
            }
        }
        Ok(())
    }
}

/// A read-only copy of `array` that pslite owns (see `pslite.frozen`).
pub fn frozen<T: Elem>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Py<PyAny>> {
    let source = from_numpy::<T>(obj, what)?;
    let copy = SArray::from_vec(source.to_vec());
    to_numpy(obj.py(), copy)
}
