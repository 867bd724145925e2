//! ps-lite's control plane as socket-free state machines with time passed
//! in: what a node decides, never how bytes move. This crate has no
//! ZeroMQ, no libc, no sockets and no files, and reads no clock (its
//! `clippy.toml` refuses `Instant::now` and `SystemTime::now`): the driver
//! (`pslite-van`'s `Van`) feeds it what arrives and the time, and carries
//! out what it asks for.
//!
//! - `scheduler.rs`: the scheduler's membership, barrier, heartbeat and
//!   recovery logic ([`Scheduler`]).
//! - `member.rs`: the node side: joining and node-table updates
//!   ([`NodeTable`]), heartbeats and scheduler loss ([`Liveness`]), barrier
//!   waits ([`Barriers`]).
//! - `resender.rs`: acknowledgements and resends under `PS_RESEND=1`
//!   ([`Resender`]).
//! - `store.rs`: the key-value store the scheduler hosts ([`store::StoreHost`])
//!   and the node side of it ([`store::StoreClient`]).
//! - `rendezvous.rs`: elastic worker rounds ([`rendezvous::Rendezvous`]).
//! - [`replica`]: replicated key ranges; [`checkpoint`]: checkpoints.
//! - [`partition`]: large data messages cut into parts for pslite peers
//!   and put back together ([`partition::Partitions`]).
//! - [`admin`]: a client outside the cluster asking the scheduler
//!   (`pslite status`, `pslite store`), on the same tickets as `core.rs`.
//! - `core.rs`: the parts composed behind one interface ([`Core`]); it
//!   decides what to accept, hold back, send, deliver or give up, and every
//!   deadline a caller waits under. Each effect for the driver is an
//!   [`Output`] (`effects.rs`).
//! - `harness.rs` (tests, or the `harness` feature): whole clusters of
//!   cores in an in-memory network with virtual time.
//!
//! Beside them: [`address`] (identities and endpoints as names),
//! [`hold`] ([`HoldQueue`]: held until ready, within a byte budget),
//! [`LogOnce`] (one warning per peer and cause), [`counters`] (traffic per
//! peer, resends, drops; lock-free), [`VanConfig`] and the errors.

// Tests take their time origin from the clock; the product code may not
// (see clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod address;
pub mod admin;
pub mod carry;
pub mod checkpoint;
pub mod component;
mod config;
mod core;
pub mod counters;
mod describe;
pub mod effects;
mod error;
#[cfg(any(test, feature = "harness"))]
pub mod harness;
pub mod hold;
mod leave;
mod log_once;
mod member;
pub mod partition;
mod registration;
pub mod rendezvous;
pub mod replica;
mod reply;
pub mod resender;
pub mod scheduler;
pub mod staleness;
pub mod store;
mod tickets;

pub use crate::core::{
    Call, Core, Done, DrainOutcome, IdentityRefused, Ticket, DRAIN_RESEND_TIMEOUTS, EXIT_FLUSH,
    LEAVE_LAST, MAX_DRAIN, REFUSAL_WAIT,
};
pub use config::{AuthToken, VanConfig, DEFAULT_PARTITION_BYTES};
pub use counters::Counters;
pub use describe::describe;
pub use effects::{LinkEvent, Output, Route, WaitingFor};
pub use error::{identity_hint, Cause, Failure, StartTimeout, VanError};
pub use hold::HoldQueue;
pub use log_once::LogOnce;
pub use member::{
    BarrierOutcome, Barriers, Liveness, NodeTable, LINK_GRACE, PAUSE_SLACK, WAIT_LOG_INTERVAL,
};
pub use registration::MAX_CHECKS;
pub use resender::Resender;
pub use scheduler::{Scheduler, SchedulerConfig};
