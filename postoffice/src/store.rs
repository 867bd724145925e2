//! The [`Store`] handle: a small key-value store every node of a job shares,
//! hosted by the scheduler (PyTorch's TCPStore, on pslite's control plane).
//!
//! Every call is one request to the scheduler, which applies requests one at
//! a time: each key is linearizable. [`Store::get`] and [`Store::wait`] wait
//! until their keys exist, up to the handle's timeout ([`Store::with_timeout`],
//! 300 s by default); every call fails with a typed [`Error`] at its
//! deadline, when the scheduler is lost, or when a value is over the limit.
//! Values are bytes; [`Store::add`] keeps a decimal integer.
//!
//! ```no_run
//! use pslite_postoffice::Postoffice;
//!
//! let po = Postoffice::from_env()?;
//! po.start(0, true)?;
//! let store = po.store()?;
//! if po.my_rank()? == 0 {
//!     store.set("lr", "0.01")?;
//! }
//! let lr = store.get("lr")?; // waits until rank 0 set it
//! let arrived = store.add("arrived", 1)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The scheduler must be pslite: with a C++ ps-lite scheduler every call
//! fails with [`Error::StoreUnsupported`].

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use pslite_proto::store::{StoreMsg, StoreOp, StoreStatus};
use pslite_van::{Call, Van};

use crate::Error;

/// Which bound of the store a request went over (see [`Error::TooLarge`]).
pub use pslite_proto::store::StoreLimit;

/// Bytes, as the store holds them.
pub type Bytes = pslite_proto::store::Bytes;

/// The error of a refused answer: typed for a bound, else the reason.
fn refused(answer: StoreMsg) -> Error {
    match answer.limit {
        Some(o) => Error::TooLarge {
            which: o.which,
            size: o.size.min(usize::MAX as u64) as usize,
            limit: o.limit.min(usize::MAX as u64) as usize,
        },
        None => Error::StoreRefused(answer.error.unwrap_or_else(|| "no reason given".into())),
    }
}

/// What a waiting request asks the scheduler for: `None` (its bound)
/// for [`Store::NO_TIMEOUT`].
fn deadline(timeout: Duration) -> Option<Duration> {
    (!timeout.is_zero()).then_some(timeout)
}

/// How long a call may wait beyond the timeout it gave the scheduler before
/// the scheduler counts as unresponsive.
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// What [`Store::compare_set`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompareSet {
    /// Whether the value was the expected one and is now the new one.
    pub swapped: bool,
    /// The key's value now (`None`: it does not exist).
    pub value: Option<Bytes>,
}

/// One change of a watched key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreEvent {
    /// The key.
    pub key: String,
    /// Its new value; `None` if it was deleted.
    pub value: Option<Bytes>,
    /// The key's version after the change: 1 for its first set, +1 for
    /// every set or delete after (consecutive events differ by 1).
    pub version: u64,
}

impl StoreEvent {
    fn from_msg(msg: StoreMsg) -> StoreEvent {
        StoreEvent {
            key: msg.keys.into_iter().next().unwrap_or_default(),
            value: if msg.found {
                msg.value.or_else(|| Some(Bytes::new()))
            } else {
                None
            },
            version: msg.version,
        }
    }
}

/// A [`Watch`] whose node stopped: no more changes will come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the watch ended: the node stopped")]
pub struct WatchEnded;

/// The changes of one watched key, in the order they happened. Dropping it
/// ends the watch.
pub struct Watch {
    events: mpsc::Receiver<StoreMsg>,
    /// The key's version when the watch began (0: never set).
    pub version: u64,
}

impl Watch {
    /// The next change, waiting up to `timeout`; `None` if none came (or the
    /// node stopped).
    pub fn recv_timeout(&self, timeout: Duration) -> Option<StoreEvent> {
        self.events
            .recv_timeout(timeout)
            .ok()
            .map(StoreEvent::from_msg)
    }

    /// The next change, waiting up to `timeout`: `Ok(None)` if none came in
    /// time, [`WatchEnded`] once the node stopped (none will come).
    pub fn next_within(&self, timeout: Duration) -> Result<Option<StoreEvent>, WatchEnded> {
        match self.events.recv_timeout(timeout) {
            Ok(msg) => Ok(Some(StoreEvent::from_msg(msg))),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(WatchEnded),
        }
    }

    /// The next change if one is here.
    pub fn try_recv(&self) -> Option<StoreEvent> {
        self.events.try_recv().ok().map(StoreEvent::from_msg)
    }
}

impl Iterator for Watch {
    type Item = StoreEvent;

    /// Waits for the next change; `None` once the node stopped.
    fn next(&mut self) -> Option<StoreEvent> {
        self.events.recv().ok().map(StoreEvent::from_msg)
    }
}

/// A handle on the job's key-value store (see the module docs). Cheap to
/// clone; every clone talks to the same store.
#[derive(Clone)]
pub struct Store {
    van: Arc<Van>,
    timeout: Duration,
}

impl Store {
    /// A timeout that waits without a deadline (TCPStore's `kNoTimeout`):
    /// up to the scheduler's bound on waits, 24 h.
    pub const NO_TIMEOUT: Duration = Duration::ZERO;

    /// A handle on the store of the cluster `van` belongs to.
    pub fn new(van: Arc<Van>) -> Store {
        Store {
            van,
            timeout: Duration::from_secs(300),
        }
    }

    /// This handle with `timeout` for waiting calls and for the scheduler's
    /// answers ([`Store::NO_TIMEOUT`]: waiting calls have no deadline).
    pub fn with_timeout(mut self, timeout: Duration) -> Store {
        self.timeout = timeout;
        self
    }

    /// The timeout of this handle's calls.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn call(&self, req: StoreMsg) -> Result<StoreMsg, Error> {
        // Refused here rather than sent: a 2 GB value never leaves.
        let max = self.van.config().store_limits.max_value;
        let values = req.value.iter().chain(&req.values);
        if let Some(v) = values.into_iter().find(|v| v.len() > max) {
            return Err(Error::TooLarge {
                which: StoreLimit::Value,
                size: v.len(),
                limit: max,
            });
        }
        let waits = match req.op {
            StoreOp::Get | StoreOp::Wait | StoreOp::MultiGet => req
                .timeout
                .unwrap_or(self.van.config().store_limits.max_timeout),
            _ => Duration::ZERO,
        };
        let limit = self.timeout.max(waits) + ANSWER_GRACE;
        let answer = self.van.call(Call::Store(req), Some(limit))?.store()?;
        match answer.status {
            StoreStatus::Ok => Ok(answer),
            StoreStatus::Timeout => Err(Error::StoreTimeout {
                keys: answer.keys,
                secs: waits.as_secs_f64(),
            }),
            StoreStatus::Invalid => Err(refused(answer)),
        }
    }

    fn one(op: StoreOp, key: &str) -> StoreMsg {
        StoreMsg::request(op, vec![key.to_string()])
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: impl Into<Bytes>) -> Result<(), Error> {
        let mut req = Store::one(StoreOp::Set, key);
        req.value = Some(value.into());
        self.call(req).map(drop)
    }

    /// The value of `key`, waiting until it is set (up to the handle's timeout).
    pub fn get(&self, key: &str) -> Result<Bytes, Error> {
        self.get_within(key, self.timeout)
    }

    /// [`Store::get`], waiting up to `timeout` ([`Store::NO_TIMEOUT`]:
    /// without a deadline).
    pub fn get_within(&self, key: &str, timeout: Duration) -> Result<Bytes, Error> {
        let mut req = Store::one(StoreOp::Get, key);
        req.timeout = deadline(timeout);
        Ok(self.call(req)?.value.unwrap_or_default())
    }

    /// The values of `keys`, in order, read at one instant, waiting until
    /// every key is set (up to the handle's timeout).
    pub fn multi_get(&self, keys: &[&str]) -> Result<Vec<Bytes>, Error> {
        self.multi_get_within(keys, self.timeout)
    }

    /// [`Store::multi_get`], waiting up to `timeout`.
    pub fn multi_get_within(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Bytes>, Error> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        let mut req = StoreMsg::request(StoreOp::MultiGet, keys);
        req.timeout = deadline(timeout);
        Ok(self.call(req)?.values)
    }

    /// Sets every key to its value in one request: no other request sees
    /// some set and others not (a key named twice ends with its last value).
    pub fn multi_set<K: AsRef<str>, V: Into<Bytes>>(
        &self,
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<(), Error> {
        let (keys, values): (Vec<String>, Vec<Bytes>) = pairs
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.into()))
            .unzip();
        let mut req = StoreMsg::request(StoreOp::MultiSet, keys);
        req.values = values;
        self.call(req).map(drop)
    }

    /// Appends `value` to `key`'s value (absent: sets it); returns the new
    /// length in bytes.
    pub fn append(&self, key: &str, value: impl Into<Bytes>) -> Result<usize, Error> {
        let mut req = Store::one(StoreOp::Append, key);
        req.value = Some(value.into());
        Ok(self.call(req)?.number.max(0) as usize)
    }

    /// Adds `delta` to the integer in `key` (absent: 0) and returns the sum.
    /// The value is decimal text, so [`Store::get`] reads e.g. `b"42"`.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, Error> {
        let mut req = Store::one(StoreOp::Add, key);
        req.number = delta;
        Ok(self.call(req)?.number)
    }

    /// Sets `key` to `desired` if its value is `expected` (`None`: if it
    /// does not exist). Returns whether it did and the value now.
    pub fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: impl Into<Bytes>,
    ) -> Result<CompareSet, Error> {
        let mut req = Store::one(StoreOp::CompareSet, key);
        req.expected = expected.map(Bytes::copy_from_slice);
        req.value = Some(desired.into());
        let answer = self.call(req)?;
        Ok(CompareSet {
            swapped: answer.found,
            value: answer.value,
        })
    }

    /// Deletes `key`; whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool, Error> {
        Ok(self.call(Store::one(StoreOp::Delete, key))?.found)
    }

    /// Whether every key of `keys` exists (no waiting).
    pub fn check(&self, keys: &[&str]) -> Result<bool, Error> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        Ok(self.call(StoreMsg::request(StoreOp::Check, keys))?.found)
    }

    /// How many keys the store holds.
    pub fn num_keys(&self) -> Result<usize, Error> {
        let n = self
            .call(StoreMsg::request(StoreOp::NumKeys, Vec::new()))?
            .number;
        Ok(n.max(0) as usize)
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .call(StoreMsg::request(StoreOp::Keys, Vec::new()))?
            .keys)
    }

    /// Waits until every key of `keys` exists (up to the handle's timeout).
    pub fn wait(&self, keys: &[&str]) -> Result<(), Error> {
        self.wait_within(keys, self.timeout)
    }

    /// [`Store::wait`], waiting up to `timeout` ([`Store::NO_TIMEOUT`]:
    /// without a deadline).
    pub fn wait_within(&self, keys: &[&str], timeout: Duration) -> Result<(), Error> {
        let keys = keys.iter().map(|k| k.to_string()).collect();
        let mut req = StoreMsg::request(StoreOp::Wait, keys);
        req.timeout = deadline(timeout);
        self.call(req).map(drop)
    }

    /// Every later change of `key` (set or delete), in order, until the
    /// returned [`Watch`] is dropped.
    pub fn watch(&self, key: &str) -> Result<Watch, Error> {
        let (tx, rx) = mpsc::channel();
        let answer = self.van.store_watch(key, tx, self.timeout + ANSWER_GRACE)?;
        match answer.status {
            StoreStatus::Ok => Ok(Watch {
                events: rx,
                version: answer.version,
            }),
            _ => Err(refused(answer)),
        }
    }

    /// Calls `callback` for every later change of `key`, in order, on a
    /// thread of its own, until the node stops.
    pub fn watch_with(
        &self,
        key: &str,
        mut callback: impl FnMut(StoreEvent) + Send + 'static,
    ) -> Result<(), Error> {
        let watch = self.watch(key)?;
        std::thread::Builder::new()
            .name(format!("pslite-watch-{key}"))
            .spawn(move || {
                for event in watch {
                    callback(event);
                }
            })
            .map_err(|e| Error::Transport(format!("cannot start a watch thread: {e}")))?;
        Ok(())
    }
}
