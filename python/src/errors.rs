//! pslite's errors as Python exceptions.
//!
//! The exception classes live in `pslite/errors.py` (so that they can also
//! be built-in exceptions: `Timeout` is a `TimeoutError`, `InvalidInput` a
//! `ValueError`); this module picks the class for each Rust error and raises
//! it with the Rust error's message, unchanged. A remote failure is raised
//! as the class named after its [`Failure`] kind (`PeerDead`,
//! `SchedulerLost`, ...), all under `pslite.Failure` and `pslite.Error`.

use pslite::{Error, Failure, Refusal, StoreError};
use pslite_postoffice::Error as PoError;
use pslite_postoffice::VanError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The Python class name of a failure kind: the variant's name.
pub fn failure_kind(failure: &Failure) -> &'static str {
    match failure {
        Failure::SchedulerLost { .. } | Failure::SchedulerClosed { .. } => "SchedulerLost",
        Failure::Replaced { .. } => "Replaced",
        Failure::NotAcknowledged { .. } => "NotAcknowledged",
        Failure::PeerDead { .. } => "PeerDead",
        Failure::PeerRestarted { .. } => "PeerRestarted",
        Failure::Stopped => "Stopped",
        Failure::HandlerPanicked { .. } => "HandlerPanicked",
        Failure::ReceiveThreadDied { .. } => "ReceiveThreadDied",
        Failure::SendFailed { .. } | Failure::Resources { .. } => "SendFailed",
        Failure::BadResponse { .. } => "BadResponse",
        Failure::AuthRefused { .. } => "AuthRefused",
        Failure::RendezvousFailed { .. } => "RendezvousFailed",
        Failure::LeftRound { .. } => "LeftRound",
        Failure::AppDropped => "AppDropped",
        Failure::RangeLost { .. } => "RangeLost",
        Failure::JobStopped { .. } => "JobStopped",
        Failure::Checkpoint { .. } => "CheckpointFailed",
        Failure::Refused { refusal, .. } => match refusal {
            Refusal::DataType { .. } => "DtypeMismatch",
            Refusal::Lengths { .. } => "LengthMismatch",
            Refusal::NoApp { .. } => "UnknownApp",
            Refusal::Other { .. } => "RequestRefused",
        },
    }
}

/// The node a failure names, if any (`node` of the exception).
fn failure_node(failure: &Failure) -> Option<i32> {
    match failure {
        Failure::NotAcknowledged { peer, .. } | Failure::SendFailed { peer, .. } => Some(*peer),
        Failure::PeerDead { id, .. }
        | Failure::PeerRestarted { id }
        | Failure::LeftRound { id, .. }
        | Failure::Replaced { id, .. } => Some(*id),
        Failure::HandlerPanicked { node, .. } | Failure::Refused { node, .. } => Some(*node),
        Failure::BadResponse { sender, .. } => Some(*sender),
        _ => None,
    }
}

/// The class of a store error.
fn store_class(e: &StoreError) -> &'static str {
    match e {
        StoreError::Timeout { .. } => "Timeout",
        StoreError::TooLarge { .. } => "TooLarge",
        StoreError::Refused(_) => "Refused",
        StoreError::Van(v) => van_class(v),
    }
}

fn van_class(e: &VanError) -> &'static str {
    match e {
        VanError::Failed(f) => failure_kind(f),
        VanError::StartTimeout(_)
        | VanError::BarrierTimeout { .. }
        | VanError::StoreNoAnswer { .. } => "Timeout",
        VanError::StoreUnsupported => "StoreUnsupported",
        VanError::InvalidGroup(_) => "InvalidInput",
        VanError::NotReady => "NotStarted",
        _ => "Error",
    }
}

/// The class name, and the node concerned, for `e`.
fn classify(e: &Error) -> (&'static str, Option<i32>) {
    match e {
        Error::Postoffice(p) => match p {
            PoError::Config(_) => ("ConfigError", None),
            PoError::Van(v) => (van_class(v), v.failure().and_then(failure_node)),
            PoError::DuplicateCustomer { .. } => ("InvalidInput", None),
            PoError::Store(s) => (store_class(s), None),
            PoError::NotStarted => ("NotStarted", None),
            _ => ("Error", None),
        },
        Error::UnsortedKeys { .. }
        | Error::DuplicateKey { .. }
        | Error::LensMismatch { .. }
        | Error::ValsMismatch { .. }
        | Error::InvalidInput(_)
        | Error::UnknownTimestamp(_) => ("InvalidInput", None),
        Error::Timeout { .. } => ("Timeout", None),
        Error::RequestFailed { cause, .. } => (failure_kind(cause), failure_node(cause)),
        Error::Malformed { sender, .. } => ("Error", Some(*sender)),
        Error::App(_) => ("Error", None),
    }
}

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The class `name` of `pslite.errors` (falls back to `pslite.Error`, then
/// to `RuntimeError` if the package is broken).
pub fn class<'py>(py: Python<'py>, name: &str) -> Bound<'py, PyType> {
    let module = ERRORS.get_or_try_init(py, || py.import("pslite.errors").map(|m| m.unbind()));
    let found = module.ok().and_then(|m| {
        let m = m.bind(py);
        m.getattr(name)
            .or_else(|_| m.getattr("Error"))
            .ok()
            .and_then(|c| c.cast_into::<PyType>().ok())
    });
    found.unwrap_or_else(|| py.get_type::<pyo3::exceptions::PyRuntimeError>())
}

/// A Python exception of class `name` with `message`, and `node` and
/// `timestamp` attributes when known.
pub fn raise(
    py: Python<'_>,
    name: &str,
    message: String,
    node: Option<i32>,
    timestamp: Option<i32>,
) -> PyErr {
    let cls = class(py, name);
    match cls.call1((message.clone(),)) {
        Ok(exc) => {
            let _ = exc.setattr("node", node);
            let _ = exc.setattr("timestamp", timestamp);
            PyErr::from_value(exc)
        }
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(message),
    }
}

/// `e` as the Python exception of its kind, with the same message.
pub fn to_py(e: Error) -> PyErr {
    Python::attach(|py| {
        let (name, node) = classify(&e);
        let ts = match &e {
            Error::RequestFailed { ts, .. } | Error::Timeout { ts, .. } => Some(*ts),
            _ => None,
        };
        raise(py, name, e.to_string(), node, ts)
    })
}

/// A store error as a Python exception.
pub fn store_to_py(e: StoreError) -> PyErr {
    to_py(Error::from(e))
}

/// An `InvalidInput` exception (a `ValueError`) with `message`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    Python::attach(|py| raise(py, "InvalidInput", message.into(), None, None))
}

/// Converts results of the Rust crate.
pub trait IntoPy<T> {
    /// The result with a Python exception for the error.
    fn py(self) -> PyResult<T>;
}

impl<T, E: Into<Error>> IntoPy<T> for Result<T, E> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| to_py(e.into()))
    }
}
