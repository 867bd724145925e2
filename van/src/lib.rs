//! The Van: ps-lite's ZeroMQ transport and control plane.
//!
//! - [`transport`]: sockets, identities (`ps<id>`), zero-copy frames.
//! - [`auth`]: `PS_AUTH_TOKEN`, ZeroMQ's PLAIN mechanism with a ZAP handler.
//! - [`scheduler`]: the scheduler's membership, barrier, heartbeat and
//!   recovery logic as a state machine without I/O.
//! - [`counters`]: what a node counts (traffic per peer, resends, drops,
//!   requests in flight, handler time), lock-free.
//! - [`admin`]: a client outside the cluster asking the scheduler for its
//!   status table (`pslite status`).
//! - [`Van`]: the driver. It binds this node's ROUTER, runs the receive
//!   thread, joins the cluster (or, on the scheduler, forms it), runs
//!   barriers and hands data messages to a [`Dispatch`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use pslite_proto::{Message, Role};
//! use pslite_van::{Dispatch, Van, VanConfig};
//!
//! struct Print;
//! impl Dispatch for Print {
//!     fn deliver(&self, msg: Message) {
//!         println!("data from node {}", msg.meta.sender);
//!     }
//! }
//!
//! let van = Van::start(VanConfig::local(Role::Worker, 1, 1, 9091), Arc::new(Print))?;
//! van.register(0)?; // joins the cluster
//! van.barrier(0, 7, None)?; // everyone
//! # Ok::<(), pslite_van::VanError>(())
//! ```

pub mod admin;
pub mod auth;
pub mod counters;
mod error;
pub mod resender;
pub mod scheduler;
pub mod transport;
mod van;

pub use auth::AuthToken;
pub use counters::Counters;
pub use error::VanError;
pub use transport::Transport;
pub use van::{describe, Dispatch, Van, VanConfig};
