//! The error type of everything a ps-lite program calls.

pub use pslite_postoffice::Failure;
use pslite_proto::NodeId;

/// An error of pslite: configuration, the node's life cycle, the transport,
/// or an app (bad input, a request that failed or timed out).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Configuration, start-up or transport (see [`pslite_postoffice::Error`]).
    #[error(transparent)]
    Postoffice(#[from] pslite_postoffice::Error),
    /// Keys must be ascending.
    #[error("keys must be sorted in ascending order: key at index {index} is smaller than the one before")]
    UnsortedKeys {
        /// The first out-of-order position.
        index: usize,
    },
    /// Keys must be unique.
    #[error("key {key} appears twice: keys must be unique")]
    DuplicateKey {
        /// The repeated key.
        key: u64,
    },
    /// `lens` needs one entry per key.
    #[error("{lens} lens for {keys} keys: give exactly one length per key")]
    LensMismatch {
        /// Number of keys.
        keys: usize,
        /// Number of lens.
        lens: usize,
    },
    /// The values do not match the keys (or lens).
    #[error("{vals} values do not fit the keys: expected {expected}")]
    ValsMismatch {
        /// Number of values given.
        vals: usize,
        /// What was expected.
        expected: String,
    },
    /// Some other unusable argument.
    #[error("{0}")]
    InvalidInput(String),
    /// A peer sent something that cannot be read; the message was dropped.
    #[error("malformed message from node {sender}: {what}")]
    Malformed {
        /// The sender.
        sender: NodeId,
        /// What is wrong.
        what: String,
    },
    /// A wait passed its deadline.
    #[error("request {ts} did not complete within {secs:.1} s")]
    Timeout {
        /// The request's timestamp.
        ts: i32,
        /// The deadline.
        secs: f64,
    },
    /// No such request.
    #[error("this customer sent no request with timestamp {0}")]
    UnknownTimestamp(i32),
    /// The request could not complete.
    #[error("request {ts} failed: {cause}")]
    RequestFailed {
        /// The request's timestamp.
        ts: i32,
        /// Why, as a typed cause (peer dead, not acknowledged, handler
        /// panicked, node failed...).
        cause: Failure,
    },
    /// A failure of the user's program itself, for programs that return
    /// `pslite::Error` (e.g. "checks failed").
    #[error("{0}")]
    App(String),
}

impl From<pslite_postoffice::ConfigError> for Error {
    fn from(e: pslite_postoffice::ConfigError) -> Self {
        Error::Postoffice(e.into())
    }
}

impl From<pslite_postoffice::VanError> for Error {
    fn from(e: pslite_postoffice::VanError) -> Self {
        Error::Postoffice(e.into())
    }
}

impl Error {
    /// Whether this is a configuration error (exit code 2).
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Postoffice(pslite_postoffice::Error::Config(_)))
    }

    /// The typed cause of a failed request, barrier or node, if this is one.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::RequestFailed { cause, .. } => Some(cause),
            Error::Postoffice(pslite_postoffice::Error::Van(e)) => e.failure(),
            _ => None,
        }
    }
}

impl From<pslite_postoffice::StoreError> for Error {
    fn from(e: pslite_postoffice::StoreError) -> Error {
        Error::Postoffice(e.into())
    }
}
