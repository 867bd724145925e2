//! pslite: a parameter-server runtime, wire-compatible with C++ ps-lite.
//!
//! This is the crate programs depend on. A ps-lite program runs one process
//! per node; `DMLC_ROLE` and the other `DMLC_*` variables say which node it
//! is and where the scheduler listens (`pslite launch` sets them all):
//!
//! ```no_run
//! use pslite::{DefaultHandle, KVOptions, KVServer, KVWorker, Postoffice};
//!
//! fn main() -> std::process::ExitCode {
//!     pslite::init_logging();
//!     pslite::exit_code(run())
//! }
//!
//! fn run() -> Result<(), pslite::Error> {
//!     let po = Postoffice::from_env()?;
//!     po.start(0, true)?;
//!     if po.is_server() {
//!         let server = KVServer::<f32>::new(&po, 0)?;
//!         server.set_request_handle(DefaultHandle::new().into_handle());
//!         po.finalize(0, true)?; // serves until every node finalizes
//!     } else if po.is_worker() {
//!         let kv = KVWorker::<f32>::new(&po, 0, 0)?;
//!         let keys = [1, 3, 5];
//!         kv.push(&keys, &[1.0, 2.0, 3.0], KVOptions::new())?.wait()?;
//!         let pulled = kv.pull(&keys, KVOptions::new())?.take()?;
//!         println!("{:?}", &pulled.vals[..]);
//!         po.finalize(0, true)?;
//!     } else {
//!         po.finalize(0, true)?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! To use it from your own crate, depend on it by path or git (it is not on
//! crates.io):
//!
//! ```toml
//! [dependencies]
//! pslite = { git = "<this repository>" }   # or { path = "<clone>/apps" }
//! ```
//!
//! and run the program under `pslite launch` (`cargo install --path cli` in
//! a clone installs the `pslite` command).
//!
//! Each request returns a handle ([`KVRequest`], [`Request`]) to wait on
//! and, for a pull, to take the values from; as in ps-lite, a request can
//! also be waited for by its timestamp (the handle converts into it:
//! `kv.wait(kv.push(..)?)`). A request with no answer after
//! `PS_REQUEST_WARN` seconds is logged, naming the nodes that owe it.
//!
//! Use app 0, customer 0 unless you need several. Keys of a request are
//! sorted ascending and unique. A push completes when the servers have it,
//! not when every worker has pushed: to pull every worker's pushes, call
//! [`Postoffice::barrier`] over [`WORKER_GROUP`] between the pushes and the
//! pull.
//!
//! The crates underneath: `pslite-proto` (wire format), `pslite-van`
//! (ZeroMQ transport, scheduler state machine), `pslite-postoffice`
//! (configuration, node life cycle, barriers, routing to customers).

mod all_reduce;
pub mod compression;
mod customer;
pub mod embedding;
mod engine;
mod kv_pairs;
mod kv_server;
mod kv_worker;
mod logging;
mod refusal;
mod request;
mod sarray;
mod simple_app;
mod staleness;

use std::process::ExitCode;

pub use all_reduce::{
    serve_all_reduce, AllReduceApps, AllReduceHandle, ColocatedServer, Mean, ALL_REDUCE_APPS,
    AVERAGE, FINISHED, JOIN,
};
pub use compression::{parse_compression, Compression, CompressionKind, KeyState};
pub use customer::{Customer, Handler, Request};
/// Which engine thread owns a key (`PS_SERVER_THREADS`).
pub use engine::shard_of;
pub use kv_pairs::{KVMeta, KVPairs, Key, RawByte, Val};
pub use kv_server::{ConcurrentHandle, DefaultHandle, KVServer, ReplicatedHandle};
pub use kv_worker::{
    default_slicer, Callback, KVOptions, KVRequest, KVWorker, Slicer, PULL_CHUNK_BYTES,
    PULL_FIRST_CHUNK_BYTES,
};
pub use logging::init_logging;
/// Talking to a running cluster's scheduler from outside it (`pslite status`).
pub use pslite_postoffice::admin;
/// Checkpoints of the servers' key ranges (`PS_CHECKPOINT_DIR`): the file format
/// and the directory scans.
pub use pslite_postoffice::checkpoint;
/// A node's configuration, read from the variables of [`settings`].
pub use pslite_postoffice::config;
pub use pslite_postoffice::launched;
/// Every environment variable pslite reads, declared once (the README's
/// table comes from it).
pub use pslite_postoffice::settings;
pub use pslite_postoffice::store::{CompareSet, Store, StoreEvent, StoreLimit, Watch};
/// The process's file descriptor limit, raised for a large job (see
/// the Van's `context`).
pub use pslite_postoffice::{fit_descriptor_limit, DescriptorFit};
pub use pslite_postoffice::{key_ranges, Config, ConfigError, KeyRange, Membership, Postoffice};
/// A blocking call of the runtime (joining, a barrier, a store request, a
/// checkpoint, a server's leave), given to `Van::call`, and how it ended.
pub use pslite_postoffice::{Call, Done};
/// The one error of pslite (configuration, start-up, the transport, the
/// store, the apps' arguments, remote failures) and the typed cause of a
/// failure inside it.
pub use pslite_postoffice::{Error, Failure, StartTimeout};
/// The wire format crate: protobuf structs, codec, golden frames.
pub use pslite_proto as proto;
pub use pslite_proto::ids::{self, NodeId, ALL_GROUP, SCHEDULER_GROUP, SERVER_GROUP, WORKER_GROUP};
pub use pslite_proto::refusal::Refusal;
pub use pslite_proto::stats::{NodeCounters, NodeStatus, PeerCounters};
pub use pslite_proto::{Command, Control, DataType, Message, Meta, Node, Role};
pub use sarray::{misaligned_copies, FrameLengthError, SArray};
pub use simple_app::{SimpleApp, SimpleData};

/// Reads environment variable `var` as a `T`, or `default` when it is unset
/// or blank; a value that does not parse is a configuration error naming
/// the variable and what it must be (`expected`).
///
/// ```
/// let rounds: u32 = pslite::env_or("MY_APP_ROUNDS", 5, "a whole number")?;
/// # Ok::<(), pslite::Error>(())
/// ```
pub fn env_or<T: std::str::FromStr>(
    var: &'static str,
    default: T,
    expected: &'static str,
) -> Result<T, Error> {
    match pslite_postoffice::settings::foreign(var).map(|v| v.to_string_lossy().into_owned()) {
        Some(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| {
            ConfigError::Invalid {
                var,
                value: v,
                expected,
            }
            .into()
        }),
        _ => Ok(default),
    }
}

/// Exit code for configuration errors (the environment is wrong).
pub const EXIT_CONFIG: u8 = 2;

/// Turns a program's result into its exit code, printing the error on
/// stderr: 0 on success, [`EXIT_CONFIG`] for a bad configuration, 1 otherwise.
pub fn exit_code<E: Into<Error>>(result: Result<(), E>) -> ExitCode {
    match result.map_err(Into::into) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            if e.is_config() {
                ExitCode::from(EXIT_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
