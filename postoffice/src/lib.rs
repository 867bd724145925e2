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
pub mod launched;
pub mod metrics;
mod postoffice;
mod queue;
mod router;
pub mod settings;
pub mod store;

pub use config::{Config, ConfigError};
pub use postoffice::{key_ranges, Error, KeyRange, Membership, Postoffice};
pub use pslite_van::Counters;
pub use queue::{CustomerQueue, Deliveries};
pub use router::{CustomerKey, CustomerRouter, Delivery, Inline, Ready};
pub use store::{Store, StoreError, StoreEvent, Watch};
