//! Replicated key ranges (`PS_REPLICAS=k`, pslite-only): each key range is
//! held by a primary and `k-1` backups, survives up to `k-1` failures, and
//! moves to servers that replace dead ones. Socket-free state machines with
//! no clock, a component of the core together ([`replication::Replication`]):
//! - [`master::RangeMaster`] (scheduler): the versioned range map, failover
//!   (promote the next replica), copies toward each range's target servers.
//! - [`server::ReplicaServer`] (server): sequencing, the log sent to backups,
//!   answers held until every replica applied a push, at-most-once by
//!   request id, the sync of a new primary, state copies to joiners.
//! - [`client::RangeClient`] (worker): routing by the map, request ids,
//!   requests in flight sent again to a new primary.
//!
//! The replicated log is of requests: servers whose request handles are
//! deterministic (the sum handle, SGD, AdaGrad) hold identical replicas.
//! docs/PROTOCOL.md states the protocol and what it promises.

pub mod client;
pub mod master;
pub mod replication;
pub mod server;

/// The key ranges of `n` servers, `[begin, end)` as ps-lite computes them
/// (division first), the last one stretched to `u64::MAX`.
pub fn key_ranges(n: usize) -> Vec<(u64, u64)> {
    let n = n.max(1) as u64;
    let step = u64::MAX / n;
    (0..n)
        .map(|r| (step * r, if r + 1 == n { u64::MAX } else { step * (r + 1) }))
        .collect()
}
