//! The value types a Python `KVWorker` or `KVServer` carries.

use pyo3::prelude::*;

use crate::errors::invalid;

/// A value type: `dtype=` of `KVWorker` and `KVServer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// `numpy.float32` (the default).
    F32,
    /// `numpy.float64`.
    F64,
    /// `numpy.int32`.
    I32,
    /// `numpy.int64`.
    I64,
    /// `"raw"`: bytes (`numpy.uint8`) typed OTHER on the wire, as C++
    /// ps-lite's `KVWorker<char>` (MXNet's KVStore) sends them.
    Raw,
}

impl Dtype {
    /// The NumPy name (`"raw"` for raw bytes).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::Raw => "raw",
        }
    }

    /// Reads `dtype=`: a NumPy dtype (or anything `numpy.dtype` takes) of
    /// float32, float64, int32 or int64, or `"raw"`; `None` is float32.
    pub fn parse(dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Dtype> {
        let Some(dtype) = dtype.filter(|d| !d.is_none()) else {
            return Ok(Dtype::F32);
        };
        if dtype.extract::<String>().is_ok_and(|s| s == "raw") {
            return Ok(Dtype::Raw);
        }
        let numpy = crate::arrays::numpy(dtype.py())?;
        let name: String = numpy
            .call_method1("dtype", (dtype,))
            .and_then(|d| d.getattr("name"))
            .and_then(|n| n.extract())
            .map_err(|e| invalid(format!("dtype {dtype}: {e}")))?;
        match name.as_str() {
            "float32" => Ok(Dtype::F32),
            "float64" => Ok(Dtype::F64),
            "int32" => Ok(Dtype::I32),
            "int64" => Ok(Dtype::I64),
            other => Err(invalid(format!(
                "dtype {other} is not supported: use float32, float64, int32, int64 or \"raw\""
            ))),
        }
    }
}

/// Declares `$name` as an enum with one variant per [`Dtype`], each holding
/// `$app<value type>` (and made from one with `From`); [`dispatch!`] runs
/// code on whichever it holds.
macro_rules! per_dtype {
    (@from $name:ident, $app:ident, $($t:ty => $variant:ident),*) => {
        $(impl From<$app<$t>> for $name {
            fn from(app: $app<$t>) -> $name {
                $name::$variant(app)
            }
        })*
    };
    ($(#[$doc:meta])* $name:ident, $app:ident) => {
        $(#[$doc])*
        pub enum $name {
            /// float32 values.
            F32($app<f32>),
            /// float64 values.
            F64($app<f64>),
            /// int32 values.
            I32($app<i32>),
            /// int64 values.
            I64($app<i64>),
            /// Raw bytes.
            Raw($app<$crate::arrays::RawByte>),
        }

        per_dtype!(@from $name, $app, f32 => F32, f64 => F64, i32 => I32, i64 => I64,
                   $crate::arrays::RawByte => Raw);

        impl $name {
            /// The value type.
            #[allow(dead_code)]
            pub fn dtype(&self) -> $crate::dtype::Dtype {
                use $crate::dtype::Dtype;
                match self {
                    $name::F32(_) => Dtype::F32,
                    $name::F64(_) => Dtype::F64,
                    $name::I32(_) => Dtype::I32,
                    $name::I64(_) => Dtype::I64,
                    $name::Raw(_) => Dtype::Raw,
                }
            }
        }
    };
}

/// `dispatch!(Enum, value, x => body)`: runs `body` with `x` bound to the
/// app inside whichever variant of a [`per_dtype!`] enum `value` is.
macro_rules! dispatch {
    ($name:ident, $value:expr, $x:ident => $body:expr) => {
        match $value {
            $name::F32($x) => $body,
            $name::F64($x) => $body,
            $name::I32($x) => $body,
            $name::I64($x) => $body,
            $name::Raw($x) => $body,
        }
    };
}

/// `make!(Enum, dtype, T => expression of type App<T>)`: the variant of
/// `dtype`, built by the expression with `T` the value type.
macro_rules! make {
    ($name:ident, $dtype:expr, $t:ident => $body:expr) => {{
        use $crate::dtype::Dtype;
        match $dtype {
            Dtype::F32 => {
                type $t = f32;
                $name::F32($body)
            }
            Dtype::F64 => {
                type $t = f64;
                $name::F64($body)
            }
            Dtype::I32 => {
                type $t = i32;
                $name::I32($body)
            }
            Dtype::I64 => {
                type $t = i64;
                $name::I64($body)
            }
            Dtype::Raw => {
                type $t = $crate::arrays::RawByte;
                $name::Raw($body)
            }
        }
    }};
}

pub(crate) use {dispatch, make, per_dtype};
