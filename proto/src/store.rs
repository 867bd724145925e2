//! pslite-only messages of the key-value store the scheduler hosts (a
//! [`StoreMsg`] in `PBMeta` field 103, on a `STORE` control message). C++
//! ps-lite never sees them: nodes send store requests only to a pslite
//! scheduler, which answers only the pslite node or admin client that asked.

use std::time::Duration;

/// Bytes, as store values travel.
pub use bytes::Bytes;

use crate::pb::PbStore;

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
        })
    }
}
