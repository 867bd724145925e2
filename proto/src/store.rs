//! pslite-only messages of the key-value store the scheduler hosts (a
//! [`StoreMsg`] in `PBMeta` field 103, on a `STORE` control message). C++
//! ps-lite never sees them: nodes send store requests only to a pslite
//! scheduler, which answers only the pslite node or admin client that asked.

use std::time::Duration;

/// Bytes, as store values travel.
pub use bytes::Bytes;

use crate::pb::{PbStore, PbStoreLimit};

/// What a store message asks for (requests), or [`StoreOp::Event`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// Sets a key to a value.
    #[default]
    Set = 1,
    /// Reads a key, waiting until it exists.
    Get = 2,
    /// Adds to a key's integer value (decimal text; absent counts as 0).
    Add = 3,
    /// Sets a key if its value is the expected one.
    CompareSet = 4,
    /// Deletes a key.
    Delete = 5,
    /// Whether every key exists (no waiting).
    Check = 6,
    /// How many keys there are.
    NumKeys = 7,
    /// Waits until every key exists.
    Wait = 8,
    /// Starts sending the requester an event for every change of a key.
    Watch = 9,
    /// Stops those events.
    Unwatch = 10,
    /// The keys (sorted).
    Keys = 11,
    /// Scheduler to watcher: a watched key was set or deleted.
    Event = 12,
    /// Appends bytes to a key's value (absent: sets it).
    Append = 13,
    /// Reads several keys, waiting until every one exists.
    MultiGet = 14,
    /// Sets several keys at once.
    MultiSet = 15,
}

impl StoreOp {
    /// The op with wire number `value`.
    pub fn from_i32(value: i32) -> Option<StoreOp> {
        Some(match value {
            1 => StoreOp::Set,
            2 => StoreOp::Get,
            3 => StoreOp::Add,
            4 => StoreOp::CompareSet,
            5 => StoreOp::Delete,
            6 => StoreOp::Check,
            7 => StoreOp::NumKeys,
            8 => StoreOp::Wait,
            9 => StoreOp::Watch,
            10 => StoreOp::Unwatch,
            11 => StoreOp::Keys,
            12 => StoreOp::Event,
            13 => StoreOp::Append,
            14 => StoreOp::MultiGet,
            15 => StoreOp::MultiSet,
            _ => return None,
        })
    }
}

/// How a store request ended (answers only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StoreStatus {
    /// Done; the answer's fields hold the result.
    #[default]
    Ok = 0,
    /// The keys did not appear before the request's timeout.
    Timeout = 1,
    /// The request was refused; [`StoreMsg::error`] says why.
    Invalid = 2,
}

/// A bound of the store (see [`OverLimit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreLimit {
    /// The longest key, in bytes (`PS_STORE_MAX_KEY`).
    Key = 1,
    /// The largest value, in bytes (`PS_STORE_MAX_VALUE`).
    Value = 2,
    /// All keys and values together, in bytes (`PS_STORE_MAX_BYTES`).
    Bytes = 3,
    /// Keys the store holds (`PS_STORE_MAX_KEYS`).
    Keys = 4,
    /// Keys one request names.
    KeysPerRequest = 5,
    /// Requests of one requester waiting at once (`PS_STORE_MAX_WAITS`).
    Waits = 6,
    /// Watches of one requester (`PS_STORE_MAX_WATCHES`).
    Watches = 7,
    /// Requests waiting at once, over all requesters.
    AllWaits = 8,
    /// Watches, over all requesters.
    AllWatches = 9,
}

impl StoreLimit {
    /// The bound with wire number `value`.
    pub fn from_i32(value: i32) -> Option<StoreLimit> {
        Some(match value {
            1 => StoreLimit::Key,
            2 => StoreLimit::Value,
            3 => StoreLimit::Bytes,
            4 => StoreLimit::Keys,
            5 => StoreLimit::KeysPerRequest,
            6 => StoreLimit::Waits,
            7 => StoreLimit::Watches,
            8 => StoreLimit::AllWaits,
            9 => StoreLimit::AllWatches,
            _ => return None,
        })
    }

    /// The scheduler's environment variable that sets this bound, if one does.
    pub fn env_var(self) -> Option<&'static str> {
        match self {
            StoreLimit::Key => Some("PS_STORE_MAX_KEY"),
            StoreLimit::Value => Some("PS_STORE_MAX_VALUE"),
            StoreLimit::Bytes => Some("PS_STORE_MAX_BYTES"),
            StoreLimit::Keys => Some("PS_STORE_MAX_KEYS"),
            StoreLimit::Waits => Some("PS_STORE_MAX_WAITS"),
            StoreLimit::Watches => Some("PS_STORE_MAX_WATCHES"),
            StoreLimit::KeysPerRequest | StoreLimit::AllWaits | StoreLimit::AllWatches => None,
        }
    }
}

/// A request refused because it went over a bound of the store: which one,
/// what the request asked for, and the bound. Its `Display` says how to
/// get under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OverLimit {
    /// The bound.
    pub which: StoreLimit,
    /// The size (bytes) or count the request asked for.
    pub size: u64,
    /// The bound's value.
    pub limit: u64,
}

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let OverLimit { which, size, limit } = *self;
        match which {
            StoreLimit::Key => write!(
                f,
                "a key of {size} bytes is over the limit of {limit} bytes"
            ),
            StoreLimit::Value => write!(
                f,
                "a value of {size} bytes is over the store's limit of {limit} bytes; the store \
                 is for small shared state (configuration, counters, addresses), move bulk \
                 data with KVWorker"
            ),
            StoreLimit::Bytes => write!(
                f,
                "the store would hold {size} bytes, over its limit of {limit} bytes (delete \
                 keys first)"
            ),
            StoreLimit::Keys => write!(
                f,
                "the store would hold {size} keys, over its limit of {limit} (delete keys first)"
            ),
            StoreLimit::KeysPerRequest => write!(
                f,
                "{size} keys in one request, over the limit of {limit}: split the request"
            ),
            StoreLimit::Waits => write!(
                f,
                "{size} requests of this node would wait at once, over the limit of {limit}"
            ),
            StoreLimit::Watches => write!(
                f,
                "{size} watches of this node, over the limit of {limit} (drop unused watches)"
            ),
            StoreLimit::AllWaits => write!(
                f,
                "{size} requests would wait at once over all nodes, over the limit of {limit}: \
                 try again later"
            ),
            StoreLimit::AllWatches => write!(
                f,
                "{size} watches over all nodes, over the limit of {limit}"
            ),
        }?;
        if let Some(var) = which.env_var() {
            write!(f, " (raise it with {var} on the scheduler)")?;
        }
        Ok(())
    }
}

/// One store request, answer or event. Which fields mean something depends
/// on [`StoreMsg::op`] (see `proto/meta.proto`, message `PBStore`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreMsg {
    /// Pairs an answer with its request.
    pub id: u64,
    /// What is asked (the answer repeats it).
    pub op: StoreOp,
    /// The key or keys.
    pub keys: Vec<String>,
    /// The value set, or read.
    pub value: Option<Bytes>,
    /// COMPARE_SET: the expected value; `None`: the key must not exist.
    pub expected: Option<Bytes>,
    /// ADD: the delta; answers: the new sum, or the number of keys.
    pub number: i64,
    /// GET / WAIT: how long the scheduler keeps the request waiting.
    pub timeout: Option<Duration>,
    /// Answers: how the request ended.
    pub status: StoreStatus,
    /// Answers with [`StoreStatus::Invalid`]: why.
    pub error: Option<String>,
    /// DELETE: it existed; COMPARE_SET: swapped; CHECK: all exist; EVENT:
    /// set (true) or deleted (false).
    pub found: bool,
    /// EVENT: the key's version after the change.
    pub version: u64,
    /// MULTI_SET: the values, one per key; MULTI_GET answers: the values.
    pub values: Vec<Bytes>,
    /// INVALID answers for a bound: which one, and by how much.
    pub limit: Option<OverLimit>,
}

impl StoreMsg {
    /// A request `op` on `keys`, everything else empty.
    pub fn request(op: StoreOp, keys: Vec<String>) -> StoreMsg {
        StoreMsg {
            op,
            keys,
            ..StoreMsg::default()
        }
    }

    /// The answer to `self` (same id and op), everything else empty.
    pub fn answer(&self) -> StoreMsg {
        StoreMsg {
            id: self.id,
            op: self.op,
            ..StoreMsg::default()
        }
    }

    /// The refusal of `self`, saying why.
    pub fn invalid(&self, why: impl Into<String>) -> StoreMsg {
        StoreMsg {
            status: StoreStatus::Invalid,
            error: Some(why.into()),
            ..self.answer()
        }
    }

    /// The refusal of `self` for going over a bound.
    pub fn over_limit(&self, over: OverLimit) -> StoreMsg {
        StoreMsg {
            limit: Some(over),
            ..self.invalid(over.to_string())
        }
    }

    /// The first key, or "" (requests on one key).
    pub fn key(&self) -> &str {
        self.keys.first().map(String::as_str).unwrap_or("")
    }

    /// The protobuf form.
    pub fn to_pb(&self) -> PbStore {
        PbStore {
            id: Some(self.id),
            op: Some(self.op as i32),
            key: self.keys.clone(),
            value: self.value.clone(),
            expected: self.expected.clone(),
            number: (self.number != 0).then_some(self.number),
            timeout_ms: self
                .timeout
                .map(|t| t.as_millis().min(u64::MAX as u128) as u64),
            status: (self.status != StoreStatus::Ok).then_some(self.status as i32),
            error: self.error.clone(),
            found: self.found.then_some(true),
            version: (self.version != 0).then_some(self.version),
            values: self.values.clone(),
            limit: self.limit.map(|l| PbStoreLimit {
                which: Some(l.which as i32),
                size: Some(l.size),
                limit: Some(l.limit),
            }),
        }
    }

    /// Reads the protobuf form; `None` if the op or status is unknown.
    pub fn from_pb(pb: PbStore) -> Option<StoreMsg> {
        let status = match pb.status.unwrap_or(0) {
            0 => StoreStatus::Ok,
            1 => StoreStatus::Timeout,
            2 => StoreStatus::Invalid,
            _ => return None,
        };
        Some(StoreMsg {
            id: pb.id.unwrap_or(0),
            op: StoreOp::from_i32(pb.op.unwrap_or(0))?,
            keys: pb.key,
            value: pb.value,
            expected: pb.expected,
            number: pb.number.unwrap_or(0),
            timeout: pb.timeout_ms.map(Duration::from_millis),
            status,
            error: pb.error,
            found: pb.found.unwrap_or(false),
            version: pb.version.unwrap_or(0),
            values: pb.values,
            // An unknown bound (a newer scheduler) still refuses, with its text.
            limit: pb.limit.and_then(|l| {
                Some(OverLimit {
                    which: StoreLimit::from_i32(l.which?)?,
                    size: l.size.unwrap_or(0),
                    limit: l.limit.unwrap_or(0),
                })
            }),
        })
    }
}
