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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use bytes::Bytes;
use log::debug;
use pslite_proto::store::{StoreMsg, StoreOp, StoreStatus};
use pslite_proto::{Node, NodeId};

/// Bounds on what the store holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// The longest key, in bytes.
    pub max_key: usize,
    /// The largest value, in bytes.
    pub max_value: usize,
    /// All keys and values together, in bytes.
    pub max_total: usize,
    /// Keys one request may name (CHECK, WAIT).
    pub max_keys_per_request: usize,
    /// Requests waiting at once (GET, WAIT), over all requesters.
    pub max_waiting: usize,
    /// Watches at once, over all requesters.
    pub max_watches: usize,
    /// The longest a request may wait.
    pub max_timeout: Duration,
}

impl Default for StoreLimits {
    fn default() -> StoreLimits {
        StoreLimits {
            max_key: 4096,
            max_value: DEFAULT_MAX_VALUE,
            max_total: 1 << 30,
            max_keys_per_request: 10_000,
            max_waiting: 100_000,
            max_watches: 100_000,
            max_timeout: Duration::from_secs(24 * 3600),
        }
    }
}

/// The default largest value: 64 MiB.
pub const DEFAULT_MAX_VALUE: usize = 64 << 20;

/// Who sent a store request, so its answer can go back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Requester {
    /// A cluster member (or the scheduler itself), by id.
    Member(NodeId),
    /// An admin client outside the cluster, listening at this address.
    Admin(Node),
}

/// One answer or event to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreReply {
    /// Where it goes.
    pub to: Requester,
    /// What it says.
    pub msg: StoreMsg,
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

/// The store's contents, waiting requests and watches.
pub struct StoreHost {
    limits: StoreLimits,
    data: BTreeMap<String, Entry>,
    /// Versions of deleted keys, so a key set again keeps counting up.
    deleted_versions: HashMap<String, u64>,
    total: usize,
    waiting: Vec<Waiter>,
    /// Watched keys and the members watching them.
    watches: BTreeMap<String, BTreeSet<NodeId>>,
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

    /// The value of `key`, if set.
    pub fn value(&self, key: &str) -> Option<&Bytes> {
        self.data.get(key).map(|e| &e.value)
    }

    /// When [`StoreHost::tick`] has work next: the earliest waiting deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.waiting.iter().map(|w| w.deadline).min()
    }

    /// Answers the waiting requests whose deadline passed with
    /// [`StoreStatus::Timeout`].
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
        out
    }

    /// Forgets what `from` waits for and watches (it died or left).
    pub fn forget(&mut self, from: &Requester) {
        self.waiting.retain(|w| &w.from != from);
        if let Requester::Member(id) = from {
            for set in self.watches.values_mut() {
                set.remove(id);
            }
        }
        self.watches.retain(|_, set| !set.is_empty());
    }

    /// Applies one request from `from` at `now`; returns its answer (unless
    /// it waits) and the events and released waiters it caused.
    pub fn handle(&mut self, from: Requester, req: StoreMsg, now: Instant) -> Vec<StoreReply> {
        let mut out = Vec::new();
        if let Err(why) = self.check(&req) {
            debug!("store: refusing {:?} from {from:?}: {why}", req.op);
            out.push(StoreReply {
                to: from,
                msg: req.invalid(why),
            });
            return out;
        }
        let mut answer = req.answer();
        match req.op {
            StoreOp::Set => {
                let value = req.value.clone().unwrap_or_default();
                if let Err(why) = self.put(req.key(), value, &mut out) {
                    answer = req.invalid(why);
                }
            }
            StoreOp::Get | StoreOp::Wait => {
                if missing(&self.data, &req.keys).is_empty() {
                    out.push(StoreReply {
                        to: from,
                        msg: self.ready_answer(&req),
                    });
                } else if self.waiting.len() >= self.limits.max_waiting {
                    out.push(StoreReply {
                        to: from,
                        msg: req.invalid(format!(
                            "the store has {} requests waiting already; try again later",
                            self.waiting.len()
                        )),
                    });
                } else {
                    let timeout = req.timeout.unwrap_or(self.limits.max_timeout);
                    let deadline = now + timeout.min(self.limits.max_timeout);
                    self.waiting.push(Waiter {
                        from,
                        request: req,
                        deadline,
                    });
                }
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
                    Ok(sum) => match self.put(req.key(), Bytes::from(sum.to_string()), &mut out) {
                        Ok(()) => answer.number = sum,
                        Err(why) => answer = req.invalid(why),
                    },
                    Err(why) => answer = req.invalid(why),
                }
            }
            StoreOp::CompareSet => {
                let current = self.data.get(req.key()).map(|e| e.value.clone());
                if current == req.expected {
                    let value = req.value.clone().unwrap_or_default();
                    match self.put(req.key(), value.clone(), &mut out) {
                        Ok(()) => {
                            answer.found = true;
                            answer.value = Some(value);
                        }
                        Err(why) => answer = req.invalid(why),
                    }
                } else {
                    answer.value = current;
                }
            }
            StoreOp::Delete => answer.found = self.remove(req.key(), &mut out),
            StoreOp::Check => answer.found = missing(&self.data, &req.keys).is_empty(),
            StoreOp::NumKeys => answer.number = self.data.len() as i64,
            StoreOp::Keys => answer.keys = self.data.keys().cloned().collect(),
            StoreOp::Watch => {
                let count: usize = self.watches.values().map(BTreeSet::len).sum();
                if let Requester::Admin(_) = from {
                    answer =
                        req.invalid("WATCH needs a cluster member: an admin client cannot watch");
                } else if count >= self.limits.max_watches {
                    answer = req.invalid(format!("the store has {count} watches already"));
                } else {
                    self.watches
                        .entry(req.key().to_string())
                        .or_default()
                        .extend(member_id(&from));
                    answer.version = self.version(req.key());
                }
            }
            StoreOp::Unwatch => {
                if let Some(set) = self.watches.get_mut(req.key()) {
                    if let Some(id) = member_id(&from) {
                        set.remove(&id);
                    }
                    if set.is_empty() {
                        self.watches.remove(req.key());
                    }
                }
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

    /// Why `req` is refused, if it is.
    fn check(&self, req: &StoreMsg) -> Result<(), String> {
        let l = &self.limits;
        let one_key = !matches!(
            req.op,
            StoreOp::Check | StoreOp::Wait | StoreOp::NumKeys | StoreOp::Keys
        );
        if one_key && req.keys.len() != 1 {
            return Err(format!(
                "{:?} takes one key, got {}",
                req.op,
                req.keys.len()
            ));
        }
        if req.keys.len() > l.max_keys_per_request {
            return Err(format!(
                "{} keys in one request; the limit is {}",
                req.keys.len(),
                l.max_keys_per_request
            ));
        }
        if let Some(k) = req.keys.iter().find(|k| k.len() > l.max_key) {
            return Err(format!(
                "a key of {} bytes; the limit is {} bytes",
                k.len(),
                l.max_key
            ));
        }
        if let Some(v) = req.value.as_ref().filter(|v| v.len() > l.max_value) {
            return Err(too_large(v.len(), l.max_value));
        }
        Ok(())
    }

    fn version(&self, key: &str) -> u64 {
        match self.data.get(key) {
            Some(e) => e.version,
            None => self.deleted_versions.get(key).copied().unwrap_or(0),
        }
    }

    /// Sets `key`, wakes the requests waiting for it, tells its watchers.
    fn put(&mut self, key: &str, value: Bytes, out: &mut Vec<StoreReply>) -> Result<(), String> {
        let old = self.data.get(key).map(|e| key.len() + e.value.len());
        let total = self.total - old.unwrap_or(0) + key.len() + value.len();
        if total > self.limits.max_total {
            return Err(format!(
                "the store would hold {total} bytes; the limit is {} bytes (delete keys first)",
                self.limits.max_total
            ));
        }
        self.total = total;
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
        Ok(())
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
                to: Requester::Member(*w),
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

    /// The answer to a GET or WAIT whose keys all exist.
    fn ready_answer(&self, req: &StoreMsg) -> StoreMsg {
        let mut msg = req.answer();
        if req.op == StoreOp::Get {
            msg.value = self.data.get(req.key()).map(|e| e.value.clone());
        }
        msg
    }
}

fn member_id(from: &Requester) -> Option<NodeId> {
    match from {
        Requester::Member(id) => Some(*id),
        Requester::Admin(_) => None,
    }
}

/// The keys of `keys` that `data` lacks.
fn missing(data: &BTreeMap<String, Entry>, keys: &[String]) -> Vec<String> {
    keys.iter()
        .filter(|k| !data.contains_key(*k))
        .cloned()
        .collect()
}

fn parse_i64(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// The error for a value over the limit (the one wording, for both sides).
pub fn too_large(size: usize, limit: usize) -> String {
    format!(
        "a value of {size} bytes is over the store's limit of {limit} bytes; the store is for \
         small shared state (configuration, counters, addresses), move bulk data with KVWorker"
    )
}

/// The node side of the store: requests in flight and their answers, and
/// the channels of this process's watches. No sockets: the core sends what
/// it prepares and feeds it what the scheduler answers.
#[derive(Default)]
pub struct StoreClient {
    next_id: u64,
    /// Requests sent, and their answers once here.
    calls: HashMap<u64, Option<StoreMsg>>,
    watches: HashMap<String, Vec<Sender<StoreMsg>>>,
}

impl StoreClient {
    /// Gives `req` a fresh id and records it as in flight; returns the id.
    pub fn start(&mut self, req: &mut StoreMsg) -> u64 {
        self.next_id += 1;
        req.id = self.next_id;
        self.calls.insert(req.id, None);
        req.id
    }

    /// The answer to request `id`, once here.
    pub fn answer(&self, id: u64) -> Option<&StoreMsg> {
        self.calls.get(&id).and_then(Option::as_ref)
    }

    /// Forgets request `id` (its caller returned).
    pub fn end(&mut self, id: u64) {
        self.calls.remove(&id);
    }

    /// Sends every later event of `key` to `events`.
    pub fn watch(&mut self, key: &str, events: Sender<StoreMsg>) {
        self.watches
            .entry(key.to_string())
            .or_default()
            .push(events);
    }

    /// Takes an answer or event from the scheduler. Returns whether a waiter
    /// may see something new, and the keys nobody in this process watches
    /// any more (their receivers were dropped: UNWATCH them).
    pub fn on_message(&mut self, msg: StoreMsg) -> (bool, Vec<String>) {
        if msg.op == StoreOp::Event {
            let key = msg.key().to_string();
            let Some(senders) = self.watches.get_mut(&key) else {
                debug!("store: dropping an event of {key:?}: nothing here watches it");
                return (false, Vec::new());
            };
            senders.retain(|s| s.send(msg.clone()).is_ok());
            if senders.is_empty() {
                self.watches.remove(&key);
                return (false, vec![key]);
            }
            return (false, Vec::new());
        }
        match self.calls.get_mut(&msg.id) {
            Some(slot @ None) => {
                *slot = Some(msg);
                (true, Vec::new())
            }
            _ => {
                debug!(
                    "store: dropping an answer to request {}: nobody waits for it",
                    msg.id
                );
                (false, Vec::new())
            }
        }
    }
}

#[cfg(test)]
mod tests;
