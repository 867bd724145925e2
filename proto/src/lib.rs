//! ps-lite's wire format, in Rust types.
//!
//! Every ps-lite message is one ZeroMQ multipart message: a *meta* frame (the
//! protobuf `PBMeta` of `proto/meta.proto`) followed by zero or more *data*
//! frames. This crate owns that schema and the domain types the rest of the
//! runtime works with:
//!
//! - [`Role`], [`Node`] and the node-id / group arithmetic of [`ids`];
//! - [`Command`], [`Control`], [`Meta`] and [`DataType`];
//! - [`Message`]: a meta plus data frames held as [`bytes::Bytes`], so frames
//!   move between threads and sockets without copies;
//! - [`Meta::encode`] / [`Meta::decode`], which write exactly the bytes C++
//!   ps-lite writes and read whatever it sends (including the uninitialised
//!   values it leaves in some fields) without ever panicking.
//!
//! ```
//! use pslite_proto::{Command, Control, Meta};
//!
//! let mut meta = Meta::default();
//! meta.control = Control::new(Command::Terminate);
//! meta.customer_id = 0;
//! let bytes = meta.encode();
//! assert_eq!(Meta::decode(&bytes).unwrap().control.cmd, Command::Terminate);
//! ```

pub mod checkpoint;
mod codec;
pub mod compression;
pub mod golden;
pub mod ids;
mod message;
mod meta;
mod node;
pub mod partition;
pub mod refusal;
pub mod replica;
pub mod shm;
pub mod staleness;
pub mod stats;
pub mod store;

/// The prost structs generated from `proto/meta.proto`. Prefer [`Meta`]; these
/// exist for code that needs the raw protobuf view (fuzzers, captures).
pub mod pb {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/ps.rs"));
}

pub use codec::DecodeError;
pub use ids::{NodeId, K_EMPTY};
pub use message::Message;
pub use meta::{Command, Control, DataType, Meta, SharedNodes};
pub use node::{
    Node, ParseRoleError, Role, FEATURE_COMPRESSION, FEATURE_PARTITION, FEATURE_STALENESS,
};

/// Locks `mutex`, recovering the data if a thread panicked while holding
/// it: every lock in pslite guards state that stays consistent between
/// statements, so a panic elsewhere (a user's handler) must not poison the
/// node. The one lock helper of the workspace.
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `condvar` with `guard` while `condition` holds, recovering from
/// poisoning as [`lock`].
pub fn wait_while<'a, T>(
    condvar: &std::sync::Condvar,
    guard: std::sync::MutexGuard<'a, T>,
    condition: impl FnMut(&mut T) -> bool,
) -> std::sync::MutexGuard<'a, T> {
    condvar
        .wait_while(guard, condition)
        .unwrap_or_else(|e| e.into_inner())
}

/// Waits on `condvar` with `guard` while `condition` holds, for at most
/// `timeout`, recovering from poisoning as [`lock`]. The flag is true if it
/// timed out with the condition still holding.
pub fn wait_timeout_while<'a, T>(
    condvar: &std::sync::Condvar,
    guard: std::sync::MutexGuard<'a, T>,
    timeout: std::time::Duration,
    condition: impl FnMut(&mut T) -> bool,
) -> (std::sync::MutexGuard<'a, T>, bool) {
    let (guard, result) = condvar
        .wait_timeout_while(guard, timeout, condition)
        .unwrap_or_else(|e| e.into_inner());
    (guard, result.timed_out())
}
