//! The Postoffice's error: configuration, start-up, or the transport.

use pslite_van::VanError;

use crate::ConfigError;

/// A Postoffice error: configuration, start-up, or the transport.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The environment does not describe a usable node.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// This node cannot listen where it is configured to (port in use,
    /// address not of this machine).
    #[error(
        "cannot listen on {endpoint} ({reason}): {var} {value} is taken or the host is not an \
         address of this machine; choose a free port, or set PS_BIND_HOST (e.g. 0.0.0.0) to \
         bind another address"
    )]
    Listen {
        /// The endpoint tried.
        endpoint: String,
        /// ZeroMQ's reason.
        reason: String,
        /// The variable that chose the port.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The host to bind does not resolve.
    #[error(
        "cannot bind: host {host:?} does not resolve; set PS_BIND_HOST to an IP of this machine"
    )]
    BindHost {
        /// The host.
        host: String,
    },
    /// The transport or control plane failed.
    #[error(transparent)]
    Van(#[from] VanError),
    /// The customer is registered already.
    #[error("app {app_id} customer {customer_id} is already registered in this process")]
    DuplicateCustomer {
        /// Its app id.
        app_id: i32,
        /// Its customer id.
        customer_id: i32,
    },
    /// A key-value store call failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Used before `start`.
    #[error("the postoffice has not started: call start() first")]
    NotStarted,
}
