//! pslite: a parameter-server runtime, wire-compatible with C++ ps-lite.
//!
//! This is the crate programs depend on. A ps-lite program runs one process
//! per node; `DMLC_ROLE` and the other `DMLC_*` variables say which node it
//! is and where the scheduler listens (`pslite launch` sets them all):
//!
//! ```no_run
//! use pslite::Postoffice;
//!
//! fn main() -> std::process::ExitCode {
//!     pslite::init_logging();
//!     pslite::exit_code(run())
//! }
//!
//! fn run() -> Result<(), pslite::Error> {
//!     let po = Postoffice::from_env()?;
//!     po.start(0, true)?;
//!     // ... apps: SimpleApp, KVWorker, KVServer ...
//!     po.finalize(0, true)?;
//!     Ok(())
//! }
//! ```
//!
//! The crates underneath: `pslite-proto` (wire format), `pslite-van`
//! (ZeroMQ transport, scheduler state machine), `pslite-postoffice`
//! (configuration, node life cycle, barriers, routing to customers).

pub mod launcher;
mod logging;

use std::process::ExitCode;

pub use logging::init_logging;
pub use pslite_postoffice::{key_ranges, Config, ConfigError, Error, KeyRange, Postoffice};
pub use pslite_proto::ids::{self, NodeId, ALL_GROUP, SCHEDULER_GROUP, SERVER_GROUP, WORKER_GROUP};
pub use pslite_proto::{DataType, Message, Meta, Node, Role};

/// Exit code for configuration errors (the environment is wrong).
pub const EXIT_CONFIG: u8 = 2;

/// Turns a program's result into its exit code, printing the error on
/// stderr: 0 on success, [`EXIT_CONFIG`] for a bad configuration, 1 otherwise.
pub fn exit_code<E: Into<Error>>(result: Result<(), E>) -> ExitCode {
    match result.map_err(Into::into) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Error::Config(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
