//! A ps-lite node: its [`Config`] (from `DMLC_*` / `PS_*` variables or code)
//! and its [`Postoffice`], which owns the Van, node groups, barriers and the
//! routes to this process's customers.
//!
//! The life cycle is ps-lite's:
//!
//! ```no_run
//! use pslite_postoffice::Postoffice;
//!
//! let po = Postoffice::from_env()?;  // DMLC_ROLE, DMLC_NUM_SERVER, ...
//! po.start(0, true)?;                 // join, then a barrier over everyone
//! println!("I am {:?} rank {}", po.role(), po.my_rank()?);
//! po.finalize(0, true)?;              // a barrier over everyone, then stop
//! # Ok::<(), pslite_postoffice::Error>(())
//! ```

pub mod config;
mod error;
mod key_range;
pub mod launched;
pub mod metrics;
mod postoffice;
mod queue;
mod router;
pub mod settings;
pub mod store;

pub use config::{Config, ConfigError};
pub use error::Error;
pub use key_range::{key_ranges, KeyRange};
pub use postoffice::{Membership, Postoffice};
pub use pslite_van::Counters;
// The driver's names the layers above use: the apps (`pslite`) and the
// Python package reach the Van only through these and the Postoffice
// (`tests/structure/run.sh` checks that apps/src names no `pslite_van`).
/// Talking to a running cluster's scheduler from outside it (`pslite status`).
pub use pslite_van::admin;
/// Checkpoints of the servers' key ranges (`PS_CHECKPOINT_DIR`): the file
/// format and the directory scans.
pub use pslite_van::checkpoint;
/// The process's file descriptor limit, raised for a large job.
pub use pslite_van::context::{fit_descriptor_limit, DescriptorFit};
/// Message buffers whose bytes may travel through shared memory.
pub use pslite_van::shm::Tracked;
/// A worker's clock under bounded staleness (`PS_STALENESS`).
pub use pslite_van::staleness::WorkerClock;
/// Why a request, a barrier or the node failed; one log line per peer and
/// cause.
pub use pslite_van::{Call, Done, Failure, LogOnce, StartTimeout};
pub use queue::{CustomerQueue, Deliveries};
pub use router::{CustomerKey, CustomerRouter, Delivery, Inline, Ready};
pub use store::{Store, StoreEvent, Watch};
