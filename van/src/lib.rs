//! The Van: ps-lite's ZeroMQ transport and control plane.
//!
//! The protocol lives in socket-free state machines, with time passed in:
//! - `scheduler.rs`: the scheduler's membership, barrier, heartbeat and
//!   recovery logic ([`Scheduler`]).
//! - `member.rs`: the node side: joining, node-table updates, barrier
//!   waits, heartbeats, scheduler loss ([`Member`]).
//! - `resender.rs`: acknowledgements and resends under `PS_RESEND=1`
//!   ([`Resender`]).
//! - `store.rs`: the key-value store the scheduler hosts ([`store::StoreHost`])
//!   and the node side of it ([`store::StoreClient`]).
//! - `rendezvous.rs`: elastic worker rounds ([`rendezvous::Rendezvous`]:
//!   min:max workers, last call, wait list, re-ranking), driven by the
//!   scheduler in elastic mode.
//! - `core.rs`: the three composed behind one interface ([`Core`]); it
//!   decides what to accept, hold back, send, deliver or give up.
//!
//! The rest moves bytes: `transport.rs` (sockets, identities `ps<id>`,
//! zero-copy frames), `resolve.rs` (host names), and [`Van`], the driver:
//! it binds this node's ROUTER, runs the receive thread, feeds the core and
//! carries out what it asks for. `harness.rs` (tests only) runs whole
//! clusters of cores in an in-memory network with virtual time.
//!
//! Beside them: [`auth`] (`PS_AUTH_TOKEN`: ZeroMQ's PLAIN mechanism with a
//! ZAP handler), [`counters`] (traffic per peer, resends, drops, requests in
//! flight, handler time; lock-free) and [`admin`] (a client outside the
//! cluster asking the scheduler for its status table: `pslite status`).
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
mod admin_dealers;
pub mod auth;
mod bind;
mod config;
mod core;
pub mod counters;
mod dispatch;
mod error;
#[cfg(test)]
mod harness;
pub mod hold;
mod links;
mod log_once;
mod member;
pub mod rendezvous;
pub mod resender;
pub mod resolve;
pub mod scheduler;
pub mod shm;
pub mod store;
pub mod transport;
mod van;

pub use crate::core::{Core, DrainOutcome, Output, Route};
pub use auth::AuthToken;
pub use config::VanConfig;
pub use counters::Counters;
pub use dispatch::{describe, Delivered, Dispatch, Room};
pub use error::{Failure, StartTimeout, VanError};
pub use hold::HoldQueue;
pub use log_once::LogOnce;
pub use member::{BarrierOutcome, Member, MemberAction, MemberConfig, WAIT_LOG_INTERVAL};
pub use resender::Resender;
pub use scheduler::{Action, Scheduler, SchedulerConfig};
pub use transport::Transport;
pub use van::Van;
