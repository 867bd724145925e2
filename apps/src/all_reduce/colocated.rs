//! Colocated mode: a data-parallel job's server nodes live inside its
//! workers' processes, one per worker (`pslite launch --colocate`), so no
//! server process runs and the slice of the keys a worker serves never
//! crosses its host's link. Across hosts that moves what a ring all-reduce
//! moves, 2(W-1)/W of the gradients each way per worker, where servers on
//! hosts of their own move them once each way through each worker's link
//! but need hosts of their own.
//!
//! [`ColocatedServer::start`] reads the worker's configuration with the
//! role set to server and no `PORT` (a free one is bound), checks it at
//! once, and runs the node on a thread of its own: start, serve
//! [`serve_all_reduce`], finalize. The worker then starts its own node
//! (both wait for the whole cluster) and, after its own finalize,
//! [`ColocatedServer::join`]s it.

use std::thread::JoinHandle;

use pslite_postoffice::{Config, Postoffice};

use super::serve_all_reduce;
use crate::Error;

/// A server node running inside this process, on a thread of its own.
pub struct ColocatedServer {
    thread: JoinHandle<Result<(), Error>>,
}

impl ColocatedServer {
    /// Starts the server node that `lookup` (the worker's variables)
    /// describes once its role is server and its port a free one. A bad
    /// configuration is refused here, before anything starts.
    pub fn start(lookup: impl Fn(&str) -> Option<String>) -> Result<ColocatedServer, Error> {
        let config = Config::from_lookup(|name| match name {
            "DMLC_ROLE" => Some("server".into()),
            "PORT" => None,
            _ => lookup(name),
        })?;
        let po = Postoffice::new(config);
        let thread = std::thread::Builder::new()
            .name("pslite-colocated-server".into())
            .spawn(move || {
                po.start(0, true)?;
                serve_all_reduce(&po)
            })
            .map_err(|e| Error::InvalidInput(format!("cannot start a thread: {e}")))?;
        Ok(ColocatedServer { thread })
    }

    /// Whether the node has ended (served and finalized, or failed).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the node to end: it finalizes with every other node, so
    /// call this after the worker's own finalize.
    pub fn join(self) -> Result<(), Error> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(Error::InvalidInput("the colocated server panicked".into())))
    }
}
