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
//!   decides what to accept, hold back, park, send, deliver or give up,
//!   how to reach each peer ([`Route`]), and every deadline a caller
//!   waits under (barriers, store calls, the exit drain). Each effect is an
//!   [`Output`].
//!
//! The rest moves bytes: `transport.rs` (sockets, identities `ps<id>`,
//! zero-copy frames), `resolve.rs` (host names), and [`Van`], the driver:
//! it binds this node's ROUTER (`bind.rs`), runs the receive loop
//! (`van/receive.rs`, which never blocks), feeds the core and carries out
//! what it asks for, writing through `links.rs` (one DEALER per peer) and
//! handing data up through [`Dispatch`]. `harness.rs` (tests only) runs
//! whole clusters of cores in an in-memory network with virtual time.
//!
//! Beside them: [`shm`] (the shared-memory path between nodes of one
//! host), [`hold`] ([`HoldQueue`]: held until ready, within a byte
//! budget), [`LogOnce`] (one warning per peer and cause), [`auth`]
//! (`PS_AUTH_TOKEN`: ZeroMQ's PLAIN mechanism with a ZAP handler),
//! [`counters`] (traffic per peer, resends, drops, requests in flight,
//! handler time; lock-free) and [`admin`] (a client outside the cluster
//! asking the scheduler for its status table: `pslite status`).
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
mod bind;
pub mod checkpoint;
mod config;
pub mod context;
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
mod monitor;
mod registration;
pub mod rendezvous;
pub mod replica;
pub mod resender;
pub mod resolve;
pub mod scheduler;
pub mod shm;
pub mod staleness;
pub mod store;
pub mod transport;
mod van;

pub use crate::core::{Core, DrainOutcome, Output, Route, WaitingFor};
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
