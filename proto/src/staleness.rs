//! The pslite-only staleness part of a KV message (`PBMeta.staleness`,
//! field 140): a worker's clock on its pushes and pulls (a pull's bound
//! too), or alone on a tick. The gate that reads it lives in
//! `pslite-van-core` (`staleness.rs`); this is only the wire form.

use crate::pb::PbStaleness;

/// The staleness part of a message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StalenessMsg {
    /// The worker's clock (its iteration, from 0).
    pub clock: u64,
    /// On a pull: the bound `s`.
    pub bound: Option<u64>,
    /// On a tick: the pushes the worker has sent this server in all.
    pub pushes: Option<u64>,
}

impl StalenessMsg {
    /// Whether this is a tick (a worker reached `clock`).
    pub fn is_tick(&self) -> bool {
        self.pushes.is_some()
    }

    pub(crate) fn to_pb(self) -> PbStaleness {
        PbStaleness {
            clock: Some(self.clock),
            bound: self.bound,
            pushes: self.pushes,
        }
    }

    pub(crate) fn from_pb(pb: PbStaleness) -> StalenessMsg {
        StalenessMsg {
            clock: pb.clock.unwrap_or(0),
            bound: pb.bound,
            pushes: pb.pushes,
        }
    }
}
