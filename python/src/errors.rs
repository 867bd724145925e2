//! pslite's errors as Python exceptions.
//!
//! The exception classes live in `pslite/errors.py` (so that they can also
//! be built-in exceptions: `Timeout` is a `TimeoutError`, `InvalidInput` a
//! `ValueError`); this module picks the class of each variant of
//! `pslite::Error`, one to one, and raises it with the error's message,
//! unchanged. A remote failure is raised as the class named after its
//! [`Failure`] kind (`PeerDead`, `SchedulerLost`, ...), all under
//! `pslite.Failure` and `pslite.Error`.

use pslite::{Error, Failure, Refusal};
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

/// The Python class of `e`: one per variant (no two share one), a failure
/// raised as the class of its kind. No wildcard: a new variant does not
/// compile until it has its class in `pslite/errors.py`.
pub fn class_name(e: &Error) -> &'static str {
    match e {
        Error::Config(_) => "ConfigError",
        Error::Listen { .. } => "CannotListen",
        Error::BindHost { .. } => "UnresolvedHost",
        Error::Transport(_) => "TransportError",
        Error::Internal(_) => "InternalError",
        Error::NotStarted => "NotStarted",
        Error::NotJoined => "NotJoined",
        Error::StartTimeout(_) => "StartTimeout",
        Error::BarrierTimeout { .. } => "BarrierTimeout",
        Error::InvalidGroup(_) => "InvalidGroup",
        Error::UnknownPeer(_) => "UnknownPeer",
        Error::DuplicateCustomer { .. } => "DuplicateCustomer",
        Error::StoreUnsupported => "StoreUnsupported",
        Error::StoreNoAnswer { .. } => "StoreNoAnswer",
        Error::StoreTimeout { .. } => "StoreTimeout",
        Error::TooLarge { .. } => "TooLarge",
        Error::StoreRefused(_) => "Refused",
        Error::UnsortedKeys { .. } => "UnsortedKeys",
        Error::DuplicateKey { .. } => "DuplicateKey",
        Error::LensMismatch { .. } => "LensMismatch",
        Error::ValsMismatch { .. } => "ValsMismatch",
        Error::InvalidInput(_) => "InvalidInput",
        Error::Malformed { .. } => "Malformed",
        Error::Timeout { .. } => "Timeout",
        Error::UnknownTimestamp(_) => "UnknownTimestamp",
        Error::Failed(f) | Error::RequestFailed { cause: f, .. } => failure_kind(f),
        Error::App(_) => "AppError",
    }
}

/// The node `e` names, if any (`node` of the exception).
fn node(e: &Error) -> Option<i32> {
    match e {
        Error::UnknownPeer(id) | Error::Malformed { sender: id, .. } => Some(*id),
        _ => e.failure().and_then(failure_node),
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
        let ts = match &e {
            Error::RequestFailed { ts, .. } | Error::Timeout { ts, .. } => Some(*ts),
            _ => None,
        };
        raise(py, class_name(&e), e.to_string(), node(&e), ts)
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use pslite::{ConfigError, StartTimeout, StoreLimit};
    use std::collections::HashSet;
    use std::time::Duration;

    /// One error of every variant.
    fn one_of_each() -> Vec<Error> {
        let start = StartTimeout {
            waited: Duration::from_secs(1),
            missing_servers: None,
            missing_workers: None,
            num_servers: 1,
            num_workers: 1,
            scheduler: "127.0.0.1:9000".into(),
            advertised: "127.0.0.1:9001".into(),
            identity_conflicts: Vec::new(),
            refused_registrations: Box::new([]),
        };
        let s = || "x".to_string();
        vec![
            Error::Config(ConfigError::Missing {
                var: "V",
                hint: "h",
            }),
            Error::Listen {
                endpoint: s(),
                reason: s(),
                var: "PORT",
                value: s(),
            },
            Error::BindHost { host: s() },
            Error::Transport(s()),
            Error::Internal(s()),
            Error::NotStarted,
            Error::NotJoined,
            Error::StartTimeout(Box::new(start)),
            Error::BarrierTimeout {
                group: 7,
                secs: 1,
                identity_conflicts: Vec::new(),
            },
            Error::InvalidGroup(0),
            Error::UnknownPeer(9),
            Error::DuplicateCustomer {
                app_id: 0,
                customer_id: 0,
            },
            Error::StoreUnsupported,
            Error::StoreNoAnswer { secs: 1.0 },
            Error::StoreTimeout {
                keys: vec![s()],
                secs: 1.0,
            },
            Error::TooLarge {
                which: StoreLimit::Value,
                size: 2,
                limit: 1,
            },
            Error::StoreRefused(s()),
            Error::UnsortedKeys { index: 1 },
            Error::DuplicateKey { key: 1 },
            Error::LensMismatch { keys: 1, lens: 2 },
            Error::ValsMismatch {
                vals: 1,
                expected: s(),
            },
            Error::InvalidInput(s()),
            Error::Malformed {
                sender: 9,
                what: s(),
            },
            Error::Timeout { ts: 1, secs: 1.0 },
            Error::UnknownTimestamp(1),
            Error::Failed(Failure::Stopped),
            Error::RequestFailed {
                ts: 1,
                cause: Failure::PeerDead { id: 9, secs: 1 },
            },
            Error::App(s()),
        ]
    }

    #[test]
    fn every_variant_raises_its_own_class_of_pslite_errors() {
        let errors = one_of_each();
        let variants: HashSet<String> = errors
            .iter()
            .map(|e| {
                format!("{e:?}")
                    .split([' ', '(', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        let classes: HashSet<&str> = errors.iter().map(class_name).collect();
        assert_eq!(variants.len(), errors.len(), "one sample per variant");
        assert_eq!(
            classes.len(),
            errors.len(),
            "two variants share a class: {classes:?}"
        );
        // Each class exists (`class` would fall back to `pslite.Error`).
        let module = include_str!("../pslite/errors.py");
        for name in classes {
            assert!(
                module.contains(&format!("\nclass {name}(")),
                "no class {name} in errors.py"
            );
            assert!(
                module.contains(&format!("\"{name}\"")),
                "{name} not in __all__"
            );
        }
    }
}
