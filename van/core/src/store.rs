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

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use bytes::Bytes;
use log::debug;
use pslite_proto::store::{OverLimit, StoreLimit, StoreMsg, StoreOp, StoreStatus};
use pslite_proto::NodeId;

pub use crate::config::{StoreLimits, DEFAULT_MAX_VALUE};

/// Who sent a store request, so its answer can go back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Requester {
    /// A cluster member (or the scheduler itself), by id.
    Member(NodeId),
    /// An admin client outside the cluster, by its connection (the routing
    /// id ZeroMQ generated for it, never one the client chose).
    Admin(Bytes),
}

/// One answer or event to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreReply {
    /// Where it goes.
    pub to: Requester,
    /// What it says.
    pub msg: StoreMsg,
}

/// What [`StoreHost::forget`] dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// Waiting requests (GET, WAIT, MULTI_GET).
    pub waits: usize,
    /// Watches.
    pub watches: usize,
}

struct Entry {
    value: Bytes,
    version: u64,
}

struct Waiter {
    from: Requester,
    request: StoreMsg,
    deadline: Instant,
}

/// One watch of a key. A member's lasts until it unwatches, leaves or
/// dies; an admin client's (which sends no heartbeats) until `until`.
struct Watcher {
    who: Requester,
    until: Option<Instant>,
}

/// Why a request is refused.
enum Refusal {
    Limit(OverLimit),
    Other(String),
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal::Other(why)
    }
}

impl From<&str> for Refusal {
    fn from(why: &str) -> Refusal {
        Refusal::Other(why.to_string())
    }
}

fn over(which: StoreLimit, size: usize, limit: usize) -> Refusal {
    Refusal::Limit(OverLimit {
        which,
        size: size as u64,
        limit: limit as u64,
    })
}

fn refuse(req: &StoreMsg, why: Refusal) -> StoreMsg {
    match why {
        Refusal::Limit(o) => req.over_limit(o),
        Refusal::Other(why) => req.invalid(why),
    }
}

/// The store's contents, waiting requests and watches.
pub struct StoreHost {
    limits: StoreLimits,
    data: BTreeMap<String, Entry>,
    /// Versions of deleted keys, so a key set again keeps counting up.
    deleted_versions: HashMap<String, u64>,
    total: usize,
    waiting: Vec<Waiter>,
    /// Watched keys and who watches them, in the order they began.
    watches: BTreeMap<String, Vec<Watcher>>,
}

impl StoreHost {
    /// An empty store with these limits.
    pub fn new(limits: StoreLimits) -> StoreHost {
        StoreHost {
            limits,
            data: BTreeMap::new(),
            deleted_versions: HashMap::new(),
            total: 0,
            waiting: Vec::new(),
            watches: BTreeMap::new(),
        }
    }

    /// How many keys the store holds.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// How many GET and WAIT requests are waiting for keys.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Bytes the waiting requests hold (their keys).
    pub fn waiting_bytes(&self) -> usize {
        self.waiting.iter().map(|w| waiting_size(&w.request)).sum()
    }

    /// How many watches there are, over all keys and requesters.
    pub fn watch_count(&self) -> usize {
        self.watches.values().map(Vec::len).sum()
    }

    /// How many requests of `who` wait, and how many watches it has.
    pub fn held_by(&self, who: &Requester) -> Forgotten {
        Forgotten {
            waits: self.waiting.iter().filter(|w| &w.from == who).count(),
            watches: self
                .watches
                .values()
                .flatten()
                .filter(|w| &w.who == who)
                .count(),
        }
    }

    /// The value of `key`, if set.
    pub fn value(&self, key: &str) -> Option<&Bytes> {
        self.data.get(key).map(|e| &e.value)
    }

    /// When [`StoreHost::tick`] has work next: the earliest waiting deadline
    /// or end of an admin client's watch.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let waits = self.waiting.iter().map(|w| w.deadline);
        let watches = self.watches.values().flatten().filter_map(|w| w.until);
        waits.chain(watches).min()
    }

    /// Answers the waiting requests whose deadline passed with
    /// [`StoreStatus::Timeout`], and ends admin clients' watches whose time
    /// is up.
    pub fn tick(&mut self, now: Instant) -> Vec<StoreReply> {
        let mut out = Vec::new();
        self.waiting.retain(|w| {
            if w.deadline > now {
                return true;
            }
            let mut msg = w.request.answer();
            msg.status = StoreStatus::Timeout;
            msg.keys = missing(&self.data, &w.request.keys);
            out.push(StoreReply {
                to: w.from.clone(),
                msg,
            });
            false
        });
        for list in self.watches.values_mut() {
            list.retain(|w| w.until.is_none_or(|until| until > now));
        }
        self.watches.retain(|_, list| !list.is_empty());
        out
    }

    /// Forgets what `from` waits for and watches (it died, was replaced by
    /// a restarted process, or left); returns what it dropped. No answer
    /// goes out: nobody is there to read it.
    pub fn forget(&mut self, from: &Requester) -> Forgotten {
        let before = (self.waiting.len(), self.watch_count());
        self.waiting.retain(|w| &w.from != from);
        for list in self.watches.values_mut() {
            list.retain(|w| &w.who != from);
        }
        self.watches.retain(|_, list| !list.is_empty());
        Forgotten {
            waits: before.0 - self.waiting.len(),
            watches: before.1 - self.watch_count(),
        }
    }

    /// Applies one request from `from` at `now`; returns its answer (unless
    /// it waits) and the events and released waiters it caused.
    pub fn handle(&mut self, from: Requester, req: StoreMsg, now: Instant) -> Vec<StoreReply> {
        let mut out = Vec::new();
        if let Err(why) = self.check(&req) {
            debug!("store: refusing {:?} from {from:?}", req.op);
            out.push(StoreReply {
                to: from,
                msg: refuse(&req, why),
            });
            return out;
        }
        let mut answer = req.answer();
        match req.op {
            StoreOp::Set => {
                let value = req.value.clone().unwrap_or_default();
                if let Err(why) = self.put_all(&[(req.key(), value)], &mut out) {
                    answer = refuse(&req, why);
                }
            }
            StoreOp::MultiSet => {
                let pairs: Vec<(&str, Bytes)> = req
                    .keys
                    .iter()
                    .map(String::as_str)
                    .zip(req.values.iter().cloned())
                    .collect();
                if let Err(why) = self.put_all(&pairs, &mut out) {
                    answer = refuse(&req, why);
                }
            }
            StoreOp::Append => {
                let mut value = self
                    .data
                    .get(req.key())
                    .map(|e| e.value.to_vec())
                    .unwrap_or_default();
                value.extend_from_slice(req.value.as_deref().unwrap_or_default());
                let len = value.len();
                let result = if len > self.limits.max_value {
                    Err(over(StoreLimit::Value, len, self.limits.max_value))
                } else {
                    self.put_all(&[(req.key(), Bytes::from(value))], &mut out)
                };
                match result {
                    Ok(()) => answer.number = len as i64,
                    Err(why) => answer = refuse(&req, why),
                }
            }
            StoreOp::Get | StoreOp::Wait | StoreOp::MultiGet => {
                if missing(&self.data, &req.keys).is_empty() {
                    out.push(StoreReply {
                        to: from,
                        msg: self.ready_answer(&req),
                    });
                    return out;
                }
                let l = &self.limits;
                let mine = self.waiting.iter().filter(|w| w.from == from).count();
                // A waiting request holds its keys: they count against
                // PS_STORE_MAX_BYTES with the keys and values stored.
                let held = self.total + self.waiting_bytes() + waiting_size(&req);
                let refusal = if mine >= l.max_waits_per_node {
                    Some(over(StoreLimit::Waits, mine + 1, l.max_waits_per_node))
                } else if self.waiting.len() >= l.max_waiting {
                    Some(over(
                        StoreLimit::AllWaits,
                        self.waiting.len() + 1,
                        l.max_waiting,
                    ))
                } else if held > l.max_total {
                    Some(over(StoreLimit::Bytes, held, l.max_total))
                } else {
                    None
                };
                if let Some(why) = refusal {
                    out.push(StoreReply {
                        to: from,
                        msg: refuse(&req, why),
                    });
                    return out;
                }
                let timeout = req.timeout.unwrap_or(l.max_timeout);
                let deadline = now + timeout.min(l.max_timeout);
                self.waiting.push(Waiter {
                    from,
                    request: req,
                    deadline,
                });
                return out;
            }
            StoreOp::Add => {
                let current = match self.data.get(req.key()) {
                    None => Ok(0),
                    Some(e) => parse_i64(&e.value).ok_or_else(|| {
                        format!(
                            "key {:?} holds {} bytes that are not a decimal integer; ADD needs one",
                            req.key(),
                            e.value.len()
                        )
                    }),
                };
                match current.and_then(|c| {
                    c.checked_add(req.number).ok_or_else(|| {
                        format!("adding {} to {c} overflows a 64-bit integer", req.number)
                    })
                }) {
                    Ok(sum) => {
                        match self.put_all(&[(req.key(), Bytes::from(sum.to_string()))], &mut out) {
                            Ok(()) => answer.number = sum,
                            Err(why) => answer = refuse(&req, why),
                        }
                    }
                    Err(why) => answer = req.invalid(why),
                }
            }
            StoreOp::CompareSet => {
                let current = self.data.get(req.key()).map(|e| e.value.clone());
                if current == req.expected {
                    let value = req.value.clone().unwrap_or_default();
                    match self.put_all(&[(req.key(), value.clone())], &mut out) {
                        Ok(()) => {
                            answer.found = true;
                            answer.value = Some(value);
                        }
                        Err(why) => answer = refuse(&req, why),
                    }
                } else {
                    answer.value = current;
                }
            }
            StoreOp::Delete => answer.found = self.remove(req.key(), &mut out),
            StoreOp::Check => answer.found = missing(&self.data, &req.keys).is_empty(),
            StoreOp::NumKeys => answer.number = self.data.len() as i64,
            StoreOp::Keys => answer.keys = self.data.keys().cloned().collect(),
            StoreOp::Watch => match self.watch(&from, &req, now) {
                Ok(()) => answer.version = self.version(req.key()),
                Err(why) => answer = refuse(&req, why),
            },
            StoreOp::Unwatch => {
                // No key: every watch of the requester (it is leaving).
                let all = req.keys.is_empty();
                for (key, list) in self.watches.iter_mut() {
                    if all || key == req.key() {
                        list.retain(|w| w.who != from);
                    }
                }
                self.watches.retain(|_, list| !list.is_empty());
            }
            StoreOp::Event => answer = req.invalid("EVENT is sent by the scheduler, not to it"),
        }
        // The answer first: a requester that watches its own key sees its
        // call return before the event of its change.
        out.insert(
            0,
            StoreReply {
                to: from,
                msg: answer,
            },
        );
        out
    }

    /// Starts (or, for an admin client, extends) `from`'s watch of the key.
    fn watch(&mut self, from: &Requester, req: &StoreMsg, now: Instant) -> Result<(), Refusal> {
        let l = self.limits;
        let until = match from {
            Requester::Member(_) => None,
            // An admin client sends no heartbeats: its watch lasts as long
            // as it asked, so a client that vanished holds nothing for long.
            Requester::Admin(_) => match req.timeout {
                Some(t) if !t.is_zero() => Some(now + t.min(l.max_timeout)),
                _ => return Err("an admin client's WATCH needs a timeout".into()),
            },
        };
        if let Some(w) = self
            .watches
            .get_mut(req.key())
            .and_then(|list| list.iter_mut().find(|w| &w.who == from))
        {
            w.until = until;
            return Ok(());
        }
        let mine = self.held_by(from).watches;
        let all = self.watch_count();
        if mine >= l.max_watches_per_node {
            return Err(over(StoreLimit::Watches, mine + 1, l.max_watches_per_node));
        }
        if all >= l.max_watches {
            return Err(over(StoreLimit::AllWatches, all + 1, l.max_watches));
        }
        self.watches
            .entry(req.key().to_string())
            .or_default()
            .push(Watcher {
                who: from.clone(),
                until,
            });
        Ok(())
    }

    /// Why `req` is refused, if it is.
    fn check(&self, req: &StoreMsg) -> Result<(), Refusal> {
        let l = &self.limits;
        let keys = req.keys.len();
        let ok = match req.op {
            StoreOp::Check | StoreOp::Wait | StoreOp::MultiGet => keys >= 1,
            StoreOp::NumKeys | StoreOp::Keys => true,
            StoreOp::Unwatch => keys <= 1,
            StoreOp::MultiSet => keys >= 1 && req.values.len() == keys,
            _ => keys == 1,
        };
        if !ok {
            return Err(format!(
                "{:?} got {keys} keys and {} values: wrong number",
                req.op,
                req.values.len()
            )
            .into());
        }
        if keys > l.max_keys_per_request {
            return Err(over(
                StoreLimit::KeysPerRequest,
                keys,
                l.max_keys_per_request,
            ));
        }
        if let Some(k) = req.keys.iter().find(|k| k.len() > l.max_key) {
            return Err(over(StoreLimit::Key, k.len(), l.max_key));
        }
        let values = req.value.iter().chain(&req.values).chain(&req.expected);
        if let Some(v) = values.into_iter().find(|v| v.len() > l.max_value) {
            return Err(over(StoreLimit::Value, v.len(), l.max_value));
        }
        Ok(())
    }

    fn version(&self, key: &str) -> u64 {
        match self.data.get(key) {
            Some(e) => e.version,
            None => self.deleted_versions.get(key).copied().unwrap_or(0),
        }
    }

    /// Sets every key of `pairs` (in order; all or none, within the
    /// bounds), wakes the requests waiting for them, tells their watchers.
    fn put_all(
        &mut self,
        pairs: &[(&str, Bytes)],
        out: &mut Vec<StoreReply>,
    ) -> Result<(), Refusal> {
        // What the store would hold after the request (the last value of
        // a key named twice counts).
        let mut sizes: HashMap<&str, usize> = HashMap::new();
        for (key, value) in pairs {
            sizes.insert(key, key.len() + value.len());
        }
        let (mut total, mut keys) = (self.total, self.data.len());
        for (key, new) in sizes {
            match self.data.get(key) {
                Some(e) => total = total - (key.len() + e.value.len()) + new,
                None => {
                    total += new;
                    keys += 1;
                }
            }
        }
        if total > self.limits.max_total {
            return Err(over(StoreLimit::Bytes, total, self.limits.max_total));
        }
        if keys > self.limits.max_keys {
            return Err(over(StoreLimit::Keys, keys, self.limits.max_keys));
        }
        self.total = total;
        for (key, value) in pairs {
            self.put(key, value.clone(), out);
        }
        Ok(())
    }

    /// Sets `key` (within the bounds: see [`StoreHost::put_all`]).
    fn put(&mut self, key: &str, value: Bytes, out: &mut Vec<StoreReply>) {
        let version = self.version(key) + 1;
        self.deleted_versions.remove(key);
        self.data.insert(
            key.to_string(),
            Entry {
                value: value.clone(),
                version,
            },
        );
        self.notify(key, Some(value), version, out);
        let waiting = std::mem::take(&mut self.waiting);
        for w in waiting {
            if w.request.keys.iter().any(|k| k == key)
                && missing(&self.data, &w.request.keys).is_empty()
            {
                out.push(StoreReply {
                    to: w.from.clone(),
                    msg: self.ready_answer(&w.request),
                });
            } else {
                self.waiting.push(w);
            }
        }
    }

    /// Deletes `key`; whether it existed.
    fn remove(&mut self, key: &str, out: &mut Vec<StoreReply>) -> bool {
        let Some(entry) = self.data.remove(key) else {
            return false;
        };
        self.total -= key.len() + entry.value.len();
        let version = entry.version + 1;
        self.deleted_versions.insert(key.to_string(), version);
        self.notify(key, None, version, out);
        true
    }

    fn notify(&self, key: &str, value: Option<Bytes>, version: u64, out: &mut Vec<StoreReply>) {
        let Some(watchers) = self.watches.get(key) else {
            return;
        };
        for w in watchers {
            out.push(StoreReply {
                to: w.who.clone(),
                msg: StoreMsg {
                    op: StoreOp::Event,
                    keys: vec![key.to_string()],
                    found: value.is_some(),
                    value: value.clone(),
                    version,
                    ..StoreMsg::default()
                },
            });
        }
    }

    /// The answer to a GET, WAIT or MULTI_GET whose keys all exist.
    fn ready_answer(&self, req: &StoreMsg) -> StoreMsg {
        let mut msg = req.answer();
        let value = |k: &String| self.data.get(k).map(|e| e.value.clone());
        match req.op {
            StoreOp::Get => msg.value = req.keys.first().and_then(value),
            StoreOp::MultiGet => msg.values = req.keys.iter().filter_map(value).collect(),
            _ => {}
        }
        msg
    }
}

/// The keys of `keys` that `data` lacks.
/// What a waiting request holds: its keys, and a little for itself.
fn waiting_size(req: &StoreMsg) -> usize {
    req.keys.iter().map(String::len).sum::<usize>() + 64
}

fn missing(data: &BTreeMap<String, Entry>, keys: &[String]) -> Vec<String> {
    keys.iter()
        .filter(|k| !data.contains_key(*k))
        .cloned()
        .collect()
}

fn parse_i64(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

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
