//! A request's stages: what a [`KVWorker`](crate::KVWorker)'s push, pull
//! or push-pull goes through on its way out, and what its answers go
//! through on the way back, one function each. `KVWorker::send` runs the
//! outgoing ones in order; the worker's response handler the others.
//!
//! On the way out (an [`Outgoing`] request, then each of its
//! [`Outbound`] messages):
//! 1. [`checked`]: the pairs are valid (keys sorted and unique, values and
//!    lens that add up) and the compression (the request's, else the
//!    worker's) applies to the value type;
//! 2. [`sliced`]: the keys split over the servers by the worker's
//!    [`Slicer`], one message for each server that owns some;
//! 3. [`chunked`]: a large pull (no push, no compression) cut into chunks
//!    of keys for each pslite server it reaches over a network, round robin
//!    over the servers, the larger chunks asking for answers without keys;
//!
//!    then `send` registers the request with the servers of its messages
//!    (answers can come at once), and for each message:
//! 4. [`addressed`]: its meta (app, customer, request flags, command,
//!    priority, the request's timestamp or an alias of it, receiver, and
//!    `same_keys` with the keys kept to put back into the answer);
//! 5. [`encoded`]: its pairs as frames (a pull sends keys only),
//!    compressed for servers that read compression;
//! 6. the staleness stamp (`Clock::stamp`), then the wire.
//!
//! On the way back, [`answer`]: a compressed answer is expanded, an answer
//! without keys gets its message's keys back, and the pairs are read; the
//! handler then puts the values in place and keeps them for assembly.

use std::mem::size_of;

use pslite_postoffice::Failure;
use pslite_postoffice::{KeyRange, Postoffice};
use pslite_proto::{ids, lock, Message, NodeId, FEATURE_COMPRESSION};

use super::chunks::{pull_chunks, PULL_CHUNK_BYTES, PULL_FIRST_CHUNK_BYTES};
use super::{Inner, SentKeys, Slicer, SAME_KEYS_MIN_KEYS};
use crate::compression::Compression;
use crate::kv_pairs::{KVPairs, Key, Val};
use crate::sarray::SArray;
use crate::Error;

/// A request on its way out.
pub(super) struct Outgoing<V: Val> {
    pub(super) push: bool,
    pub(super) pull: bool,
    /// The whole request's pairs.
    pub(super) kvs: KVPairs<V>,
    /// What its values are compressed with.
    pub(super) compression: Option<Compression>,
    /// Its messages, in the order they go.
    pub(super) messages: Vec<Outbound<V>>,
}

/// One message of a request: the pairs for one server.
pub(super) struct Outbound<V: Val> {
    /// The server's rank.
    pub(super) rank: usize,
    pub(super) pairs: KVPairs<V>,
    /// Asks for its answer without keys (they are put back from `pairs`).
    pub(super) same_keys: bool,
}

impl<V: Val> Outbound<V> {
    /// The server's node id.
    pub(super) fn server(&self) -> NodeId {
        ids::server_rank_to_id(self.rank as i32)
    }
}

/// What every message of a request carries in its meta beyond its own
/// receiver and timestamp.
pub(super) struct Head {
    pub(super) app_id: i32,
    pub(super) customer_id: i32,
    /// The command the server's handle sees.
    pub(super) cmd: i32,
    pub(super) priority: i32,
}

/// Stage 1: `kvs` is a valid request (a push's values included) and
/// `compression` applies to its values.
pub(super) fn checked<V: Val>(
    push: bool,
    pull: bool,
    kvs: KVPairs<V>,
    compression: Option<Compression>,
) -> Result<Outgoing<V>, Error> {
    kvs.validate(push)?;
    if compression.is_some() && !crate::compression::applies_to::<V>() {
        return Err(Error::InvalidInput(format!(
            "gradient compression applies to f32 and f64 values, not {:?}",
            V::DATA_TYPE
        )));
    }
    Ok(Outgoing {
        push,
        pull,
        kvs,
        compression,
        messages: Vec::new(),
    })
}

/// Stage 2: one message for each server `slicer` gives keys of the
/// request.
pub(super) fn sliced<V: Val>(
    out: &mut Outgoing<V>,
    slicer: &Slicer<V>,
    ranges: &[KeyRange],
) -> Result<(), Error> {
    let slices = slicer(&out.kvs, ranges);
    if slices.len() != ranges.len() {
        return Err(Error::InvalidInput(format!(
            "the slicer returned {} slices for {} servers",
            slices.len(),
            ranges.len()
        )));
    }
    out.messages = slices
        .into_iter()
        .enumerate()
        .filter_map(|(rank, s)| {
            s.map(|pairs| Outbound {
                rank,
                pairs,
                same_keys: false,
            })
        })
        .collect();
    Ok(())
}

/// Stage 3: a large pull goes to each pslite server it reaches over a
/// network in chunks of keys, so the answers stream back while the later
/// keys still travel; round robin over the servers, so each starts
/// answering at once. A C++ server (or one not known yet), or one this
/// node shares memory with (no wire to wait for; its answer's values are
/// taken without a copy), gets one message.
pub(super) fn chunked<V: Val>(out: &mut Outgoing<V>, po: &Postoffice) {
    if !out.pull || out.push || out.compression.is_some() {
        return;
    }
    let key_bytes = size_of::<Key>();
    let mut per_server: Vec<std::vec::IntoIter<Outbound<V>>> = std::mem::take(&mut out.messages)
        .into_iter()
        .map(|m| {
            let id = m.server();
            if po.peer_features(id) == 0 || po.shares_memory_with(id) {
                return vec![m].into_iter();
            }
            let first = PULL_FIRST_CHUNK_BYTES / key_bytes;
            pull_chunks(&m.pairs.keys, first, PULL_CHUNK_BYTES / key_bytes)
                .into_iter()
                .map(|keys| Outbound {
                    rank: m.rank,
                    same_keys: keys.len() >= SAME_KEYS_MIN_KEYS,
                    pairs: KVPairs::new(keys, SArray::new()),
                })
                .collect::<Vec<_>>()
                .into_iter()
        })
        .collect();
    loop {
        let before = out.messages.len();
        out.messages
            .extend(per_server.iter_mut().filter_map(Iterator::next));
        if out.messages.len() == before {
            return;
        }
    }
}

/// Stage 4: message `m`'s meta, with `timestamp` (the request's, or an
/// alias of it for a further message). A message that asks for its answer
/// without keys leaves its keys in `sent_keys` first.
pub(super) fn addressed<V: Val>(
    out: &Outgoing<V>,
    m: &Outbound<V>,
    head: &Head,
    timestamp: i32,
    sent_keys: Option<&SentKeys>,
) -> Message {
    let mut msg = Message::default();
    let meta = &mut msg.meta;
    meta.app_id = head.app_id;
    meta.customer_id = head.customer_id;
    meta.request = true;
    meta.push = out.push;
    meta.pull = out.pull;
    meta.head = head.cmd;
    meta.priority = head.priority;
    meta.timestamp = timestamp;
    meta.recver = m.server();
    if let (true, Some(sent)) = (m.same_keys, sent_keys) {
        lock(sent).insert(timestamp, m.pairs.keys.clone());
        meta.same_keys = true;
    }
    msg
}

/// Stage 5: `pairs` as `msg`'s frames (keys only for a pull), compressed
/// if the request is and the receiver reads compressed values; a receiver
/// that does not (a C++ ps-lite server) gets them as they are, told once in
/// the log.
pub(super) fn encoded<V: Val>(
    inner: &Inner<V>,
    out: &Outgoing<V>,
    pairs: KVPairs<V>,
    msg: &mut Message,
) {
    let pairs = if out.push {
        pairs
    } else {
        KVPairs::new(pairs.keys, SArray::new())
    };
    let (mut frames, types) = pairs.to_frames();
    msg.meta.data_type = types;
    if let Some(c) = &out.compression {
        let server = msg.meta.recver;
        if inner.po.peer_features(server) & FEATURE_COMPRESSION != 0 {
            let (push, pull) = (out.push, out.pull);
            inner
                .compressed
                .prepare(c, push, pull, &pairs, &mut msg.meta, &mut frames);
        } else {
            // Momentum correction is the worker's alone.
            inner
                .compressed
                .prepare_plain(c, out.push, &pairs, &mut frames);
            lock(&inner.uncompressed).log(server, || {
                format!(
                    "server {server} does not read compressed values (a C++ ps-lite server): \
                     requests to it go uncompressed, compression {c} applies to pslite servers \
                     only"
                )
            });
        }
    }
    msg.data = frames;
}

/// The way back: the pairs of answer `msg` to a pull, expanded if it is
/// compressed, its keys put back if it left them out (`sent_keys`: those
/// its message carried).
pub(super) fn answer<V: Val>(
    msg: &Message,
    sent_keys: Option<&SentKeys>,
) -> Result<KVPairs<V>, Failure> {
    let sender = msg.meta.sender;
    let bad = |what: String| Failure::BadResponse { sender, what };
    let expanded;
    let msg = if msg.meta.compression.is_some() {
        let mut m = msg.clone();
        crate::compression::expand::<V>(&mut m).map_err(bad)?;
        expanded = m;
        &expanded
    } else {
        msg
    };
    if !msg.meta.same_keys {
        return KVPairs::from_message(msg).map_err(|e| bad(e.to_string()));
    }
    let keys = sent_keys.and_then(|sent| lock(sent).get(&msg.meta.timestamp).cloned());
    let Some(keys) = keys else {
        return Err(bad(format!(
            "an answer without keys to message {} of a request that did not ask for one",
            msg.meta.timestamp
        )));
    };
    KVPairs::from_answer_without_keys(msg, &keys).map_err(|e| bad(e.to_string()))
}
