//! A worker's side of bounded staleness (`PS_STALENESS`,
//! [`KVWorker::set_staleness`](crate::KVWorker::set_staleness),
//! [`KVWorker::clock`](crate::KVWorker::clock)): its clock, the clock and
//! bound its requests carry, and the ticks it sends its servers. The
//! servers' gate is in the core (the Van's `staleness`).

use std::sync::Mutex;

use pslite_postoffice::Postoffice;
use pslite_postoffice::WorkerClock;
use pslite_proto::staleness::StalenessMsg;
use pslite_proto::{ids, Meta, NodeId, FEATURE_STALENESS};

use crate::Error;

/// A worker's bound and clock.
#[derive(Debug, Default)]
pub(crate) struct Clock {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    bound: Option<u64>,
    clock: WorkerClock,
}

impl Clock {
    /// A worker clock at 0 with bound `bound` (`None`: asynchronous).
    pub(crate) fn new(bound: Option<u64>) -> Clock {
        Clock {
            state: Mutex::new(State {
                bound,
                clock: WorkerClock::default(),
            }),
        }
    }

    pub(crate) fn bound(&self) -> Option<u64> {
        pslite_proto::lock(&self.state).bound
    }

    pub(crate) fn set_bound(&self, bound: Option<u64>) {
        pslite_proto::lock(&self.state).bound = bound;
    }

    pub(crate) fn now(&self) -> u64 {
        pslite_proto::lock(&self.state).clock.clock()
    }

    /// Marks a request to `server` (a push, a pull, or both): the part it
    /// carries, if a bound is set and the server reads it. Pushes are
    /// counted for the next tick.
    pub(crate) fn stamp(&self, po: &Postoffice, server: NodeId, meta: &mut Meta) {
        let mut state = pslite_proto::lock(&self.state);
        let Some(bound) = state.bound else {
            return;
        };
        if po.peer_features(server) & FEATURE_STALENESS == 0 {
            return;
        }
        if meta.push {
            state.clock.pushed(server);
        }
        meta.staleness = Some(Box::new(StalenessMsg {
            clock: state.clock.clock(),
            // A push-pull is a push: never held.
            bound: (meta.pull && !meta.push).then_some(bound),
            pushes: None,
        }));
    }

    /// Ends the iteration: the new clock, and the ticks to send (none
    /// without a bound). Fails, advancing nothing, if a server cannot read
    /// them.
    pub(crate) fn advance(&self, po: &Postoffice) -> Result<(u64, Vec<Meta>), Error> {
        let mut state = pslite_proto::lock(&self.state);
        if state.bound.is_none() {
            state.clock.advance(&[]);
            return Ok((state.clock.clock(), Vec::new()));
        }
        let servers = servers(po)?;
        let ticks = state.clock.advance(&servers);
        let metas = ticks
            .into_iter()
            .map(|(server, clock, pushes)| Meta {
                request: true,
                recver: server,
                head: 0,
                staleness: Some(Box::new(StalenessMsg {
                    clock,
                    bound: None,
                    pushes: Some(pushes),
                })),
                ..Meta::default()
            })
            .collect();
        Ok((state.clock.clock(), metas))
    }
}

/// The job's servers, all of which must read a worker's clock.
pub(crate) fn servers(po: &Postoffice) -> Result<Vec<NodeId>, Error> {
    let servers: Vec<NodeId> = (0..po.num_servers()).map(ids::server_rank_to_id).collect();
    if let Some(&old) = servers
        .iter()
        .find(|&&s| po.peer_features(s) & FEATURE_STALENESS == 0)
    {
        return Err(Error::InvalidInput(format!(
            "bounded staleness (PS_STALENESS) needs pslite servers of this version under a pslite \
             scheduler: server {old} does not read a worker's clock (a C++ ps-lite or older pslite \
             server); unset PS_STALENESS"
        )));
    }
    Ok(servers)
}
