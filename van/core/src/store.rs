//! The key-value store the scheduler hosts, as a state machine with no
//! sockets and no clock (PyTorch's TCPStore, on the pslite control plane).
//!
//! The core hands it every STORE request with who asked (a cluster member,
//! or an admin client outside the cluster) and the time; it returns the
//! answers and watch events to send. Requests are applied one at a time in
//! arrival order, so every key is linearizable. `GET` and `WAIT` on keys
//! that do not exist yet wait here until a `SET` (or `ADD`, `COMPARE_SET`)
//! creates them or their timeout passes ([`StoreHost::tick`]). Watchers get
//! one event per change of their key, in the order the changes happened.
//!
//! Sizes are bounded ([`StoreLimits`]): a request over a limit is refused
//! with a clear error, never stored.
//!
//! [`component::Store`] makes host and client one component of the core.

use std::collections::HashMap;

use log::debug;
use pslite_proto::store::{StoreMsg, StoreOp};

pub use crate::config::{StoreLimits, DEFAULT_MAX_VALUE};
pub use host::{Forgotten, Requester, StoreHost, StoreReply};

mod host;

/// The node side of the store: requests in flight with their deadlines and
/// answers, and this process's watchers. No sockets, no channels, no
/// clock: the core sends what it prepares, feeds it what the scheduler
/// answers and the time, and hands events to the driver as outputs.
#[derive(Default)]
pub struct StoreClient {
    next_id: u64,
    /// Requests sent, by id, and their answers once here (their deadline
    /// is the caller's wait).
    calls: HashMap<u64, Option<StoreMsg>>,
    next_watcher: u64,
    /// The watchers of each watched key.
    watches: HashMap<String, Vec<u64>>,
}

/// What a store message from the scheduler means here.
// Short-lived (matched at once by the core): boxing the event would cost an
// allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
pub enum ClientInput {
    /// The answer to a request a waiter waits for.
    Answer,
    /// An event of a watched key, for these watchers.
    Event {
        /// The watchers of its key.
        watchers: Vec<u64>,
        /// The event.
        event: StoreMsg,
    },
    /// An event of a key nothing here watches (a watch of an earlier
    /// process with this id, or one just dropped): UNWATCH it.
    Unwatched(String),
    /// Nothing to do (an answer nobody waits for any more).
    Nothing,
}

impl StoreClient {
    /// Gives `req` a fresh id and records it as in flight; returns the id.
    pub fn start(&mut self, req: &mut StoreMsg) -> u64 {
        let id = self.fresh_id(req);
        self.calls.insert(id, None);
        id
    }

    /// Gives `req` a fresh id without waiting for its answer (an UNWATCH).
    pub fn fresh_id(&mut self, req: &mut StoreMsg) -> u64 {
        self.next_id += 1;
        req.id = self.next_id;
        req.id
    }

    /// The answer to request `id` once here.
    pub fn answer(&self, id: u64) -> Option<&StoreMsg> {
        self.calls.get(&id).and_then(Option::as_ref)
    }

    /// Forgets request `id` (its caller returned).
    pub fn end(&mut self, id: u64) {
        self.calls.remove(&id);
    }

    /// A new watcher of `key`; its events come as [`ClientInput::Event`].
    pub fn watch(&mut self, key: &str) -> u64 {
        self.next_watcher += 1;
        let watcher = self.next_watcher;
        self.watches
            .entry(key.to_string())
            .or_default()
            .push(watcher);
        watcher
    }

    /// Watcher `watcher` is gone; returns its key if nobody here watches
    /// it any more (UNWATCH it).
    pub fn unwatch(&mut self, watcher: u64) -> Option<String> {
        let key = self
            .watches
            .iter_mut()
            .find(|(_, ws)| ws.contains(&watcher))
            .map(|(key, ws)| {
                ws.retain(|&w| w != watcher);
                key.clone()
            })?;
        if self.watches.get(&key).is_some_and(Vec::is_empty) {
            self.watches.remove(&key);
            return Some(key);
        }
        None
    }

    /// Whether this process watches any key.
    pub fn is_watching(&self) -> bool {
        !self.watches.is_empty()
    }

    /// Takes an answer or event from the scheduler.
    pub fn on_message(&mut self, msg: StoreMsg) -> ClientInput {
        if msg.op == StoreOp::Event {
            let key = msg.key().to_string();
            return match self.watches.get(&key) {
                Some(watchers) => ClientInput::Event {
                    watchers: watchers.clone(),
                    event: msg,
                },
                None => {
                    debug!("store: dropping an event of {key:?}: nothing here watches it");
                    ClientInput::Unwatched(key)
                }
            };
        }
        match self.calls.get_mut(&msg.id) {
            Some(answer) if answer.is_none() => {
                *answer = Some(msg);
                ClientInput::Answer
            }
            _ => {
                debug!(
                    "store: dropping an answer to request {}: nobody waits for it",
                    msg.id
                );
                ClientInput::Nothing
            }
        }
    }
}

pub mod component;

#[cfg(test)]
mod tests;
