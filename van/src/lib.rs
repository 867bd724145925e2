//! The Van: ps-lite's ZeroMQ transport, the driver of the control plane.
//!
//! The protocol lives in [`pslite_van_core`] (re-exported here): socket-free
//! state machines with time passed in, composed behind one interface
//! ([`Core`]). This crate moves bytes and wakes waiters: [`Van`] binds this
//! node's ROUTER (`bind.rs`), runs the receive loop (`van/receive.rs`,
//! which never blocks), feeds the core and carries out what it asks for,
//! writing through `links.rs` (one DEALER per peer) and handing data up
//! through [`Dispatch`]. `transport.rs` holds the sockets and zero-copy
//! frames, `resolve.rs` host names.
//!
//! Beside them: [`shm`] (the shared-memory path between nodes of one
//! host), [`auth`] (`PS_AUTH_TOKEN`: ZeroMQ's PLAIN mechanism with a ZAP
//! handler), `monitor.rs` (the socket monitors that report a connection
//! up, closed or refused), [`checkpoint::disk`] (the checkpoint files) and
//! [`admin`] (a client outside the cluster asking the scheduler for its
//! status table: `pslite status`) and [`heap`] (large message buffers kept
//! in the heap instead of fresh pages each time: `PS_MALLOC_TUNE`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use pslite_proto::{Message, Role};
//! use pslite_van::{Call, Dispatch, Van, VanConfig};
//!
//! struct Print;
//! impl Dispatch for Print {
//!     fn deliver(&self, msg: Message) {
//!         println!("data from node {}", msg.meta.sender);
//!     }
//! }
//!
//! let van = Van::start(VanConfig::local(Role::Worker, 1, 1, 9091), Arc::new(Print))?;
//! van.call(Call::Join { customer: 0 }, None)?; // joins the cluster
//! van.call(Call::Barrier { customer: 0, group: 7 }, None)?; // everyone
//! # Ok::<(), pslite_van::VanError>(())
//! ```

pub mod admin;
pub mod auth;
mod bind;
pub mod checkpoint;
pub mod context;
mod dispatch;
pub mod heap;
mod links;
mod monitor;
pub mod resolve;
pub mod schedule;
pub mod shm;
pub mod transport;
mod van;

pub use dispatch::{Delivered, Dispatch, Room};
// What the layers above use of the core (the Postoffice's router, settings
// and metrics; the apps reach these through pslite_postoffice).
pub use pslite_van_core::{
    counters, hold, identity_hint, partition, rendezvous, staleness, store, AuthToken, Call,
    Counters, Done, Failure, HoldQueue, LogOnce, StartTimeout, VanConfig, VanError,
    DEFAULT_PARTITION_BYTES,
};
// The core's components and outputs: the driver's own business, not
// re-exported (issue 42: components private to the core).
pub(crate) use pslite_van_core::{describe, Core, LinkEvent, Output, Route, WaitingFor};
pub use transport::Transport;
pub use van::Van;
