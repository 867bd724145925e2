//! `Compression`: gradient compression of a worker's pushes (see
//! `pslite::compression`), and how a `compression=` argument is read.

use pslite::{Compression, CompressionKind};
use pyo3::prelude::*;

use crate::errors::{invalid, IntoPy};

/// Gradient compression of a `KVWorker`'s pushes: `spec` is `"onebit"`,
/// `"topk[:K]"`, `"randomk[:K]"`, `"2bit[:THRESHOLD]"` (K a fraction of
/// the values below 1, default 0.01, or a whole number of them; THRESHOLD
/// default 0.5), `"fp16"` or `"bf16"` (each value cast to a 16-bit float:
/// float16 or bfloat16 values cross exactly). With `error_feedback`
/// (default: on, off for the casts `fp16` and `bf16`) the worker adds what
/// compression left out of a key's values to the key's next ones. With
/// `compress_answers` the servers compress their answers to pulls and
/// push-pulls the same way (for answers that are gradients, e.g. a sum of
/// the workers' pushes; never for model weights), and with
/// `answer_feedback` they keep error feedback on those answers (per worker
/// and key; off by default). `randomk` draws its
/// positions from `seed` (the same on every worker; default pslite's).
/// With `momentum` (0 to below 1; default 0, off) the worker applies
/// momentum correction (Deep Gradient Compression): it keeps each key's
/// velocity `u = momentum * u + g` and pushes that (with `nesterov`,
/// `g + momentum * u`), so error feedback accumulates velocities; with
/// `momentum_masking` (off by default) `topk` and `randomk` clear the
/// velocity where a value went (DGC's momentum factor masking). Whoever applies the
/// answers then steps without momentum (`pslite.torch.DistributedOptimizer`
/// does this for SGD with momentum).
/// float32 and float64 values only; servers that do not read compressed
/// values (C++ ones) get them as they are.
#[pyclass(module = "pslite", name = "Compression", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyCompression {
    pub(crate) inner: Compression,
}

#[pymethods]
impl PyCompression {
    #[new]
    #[pyo3(signature = (spec, error_feedback = None, compress_answers = false, seed = None, answer_feedback = false, momentum = 0.0, nesterov = false, momentum_masking = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        spec: &str,
        error_feedback: Option<bool>,
        compress_answers: bool,
        seed: Option<u64>,
        answer_feedback: bool,
        momentum: f32,
        nesterov: bool,
        momentum_masking: bool,
    ) -> PyResult<PyCompression> {
        let mut c: Compression = spec.parse().py()?;
        if let Some(on) = error_feedback {
            c = c.error_feedback(on);
        }
        c = c
            .compress_answers(compress_answers)
            .answer_feedback(answer_feedback)
            .momentum(momentum)
            .py()?
            .nesterov(nesterov)
            .momentum_masking(momentum_masking);
        if let Some(seed) = seed {
            c = c.seed(seed);
        }
        Ok(PyCompression { inner: c })
    }

    /// The compressor: "onebit", "topk", "randomk", "2bit", "fp16" or "bf16".
    #[getter]
    fn kind(&self) -> &'static str {
        match self.inner.kind() {
            CompressionKind::OneBit => "onebit",
            CompressionKind::TopK => "topk",
            CompressionKind::RandomK => "randomk",
            CompressionKind::TwoBit => "2bit",
            CompressionKind::Fp16 => "fp16",
            CompressionKind::Bf16 => "bf16",
        }
    }

    /// Whether error feedback is on.
    #[getter]
    fn error_feedback(&self) -> bool {
        self.inner.has_error_feedback()
    }

    /// Whether the servers compress their answers.
    #[getter]
    fn compress_answers(&self) -> bool {
        self.inner.answers()
    }

    /// Whether the servers keep error feedback on their compressed answers.
    #[getter]
    fn answer_feedback(&self) -> bool {
        self.inner.has_answer_feedback()
    }

    /// The momentum of momentum correction (0.0: off).
    #[getter]
    fn momentum(&self) -> f32 {
        self.inner.momentum_factor()
    }

    /// Whether momentum correction uses Nesterov's momentum.
    #[getter]
    fn nesterov(&self) -> bool {
        self.inner.is_nesterov()
    }

    /// Whether momentum factor masking is on (`topk`, `randomk`).
    #[getter]
    fn momentum_masking(&self) -> bool {
        self.inner.has_momentum_masking()
    }

    /// This compression with momentum correction at `momentum` (0.0: off),
    /// Nesterov's if `nesterov`; everything else the same.
    #[pyo3(signature = (momentum, nesterov = false))]
    fn with_momentum(&self, momentum: f32, nesterov: bool) -> PyResult<PyCompression> {
        let inner = self.inner.momentum(momentum).py()?.nesterov(nesterov);
        Ok(PyCompression { inner })
    }

    /// The compressor and its parameter, as `spec` takes it.
    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        let py_bool = |b: bool| if b { "True" } else { "False" };
        let momentum = if self.inner.momentum_factor() > 0.0 {
            format!(
                ", momentum={}, nesterov={}, momentum_masking={}",
                self.inner.momentum_factor(),
                py_bool(self.inner.is_nesterov()),
                py_bool(self.inner.has_momentum_masking())
            )
        } else {
            String::new()
        };
        format!(
            "pslite.Compression({:?}, error_feedback={}, compress_answers={}, answer_feedback={}{})",
            self.inner.to_string(),
            py_bool(self.inner.has_error_feedback()),
            py_bool(self.inner.answers()),
            py_bool(self.inner.has_answer_feedback()),
            momentum
        )
    }
}

/// A `compression=` argument: a `Compression`, a spec string (`"none"` or
/// `""`: off), `None` or `False` (off).
pub(crate) fn parse(arg: &Bound<'_, PyAny>) -> PyResult<Option<Compression>> {
    if arg.is_none() {
        return Ok(None);
    }
    if let Ok(c) = arg.cast::<PyCompression>() {
        return Ok(Some(c.get().inner));
    }
    if let Ok(false) = arg.extract::<bool>() {
        return Ok(None);
    }
    if let Ok(spec) = arg.extract::<String>() {
        return pslite::parse_compression(&spec).py();
    }
    Err(invalid(format!(
        "compression must be a pslite.Compression, a string such as \"topk:0.01\" or None, \
         not {}",
        arg.get_type().name()?
    )))
}

/// The Python object for `c`.
pub(crate) fn to_py(py: Python<'_>, c: Option<Compression>) -> PyResult<Option<Py<PyCompression>>> {
    c.map(|inner| Py::new(py, PyCompression { inner }))
        .transpose()
}
