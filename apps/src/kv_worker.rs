//! `KVWorker<V>`: pushes values to and pulls values from the servers.
//!
//! A request's keys are split over the servers by key range (or by a
//! custom [`Slicer`]); each server that owns some of the keys gets one
//! message, the others are not contacted and count as answered. Pulled
//! values come back in key order. Every call returns a [`KVRequest`]:
//! [`KVRequest::wait`] for it, [`KVRequest::take`] a pull's values; an
//! optional callback runs when the request completes. As in ps-lite, a
//! request can also be waited for by its timestamp ([`KVWorker::wait`],
//! [`KVWorker::take_pull`]), and the handle converts into it.
//!
//! The `z` variants take [`SArray`]s and send their buffers without copying
//! them; the plain variants copy the caller's slices once.
//!
//! A large pull (no push, no compression) goes to each pslite server it
//! reaches over a network in chunks of keys ([`PULL_FIRST_CHUNK_BYTES`],
//! doubling up to [`PULL_CHUNK_BYTES`]), each an ordinary pull with a
//! timestamp of its own, so the server's answers stream back while the
//! later keys still travel (instead of the keys up, then the values down);
//! the answers' values are copied into place as they arrive. The request
//! still completes once, with every value in key order. A server's handle
//! sees one pull per chunk; C++ servers and servers sharing memory with
//! this node get one request, as before. Each chunk asks its answer to
//! leave out the keys (`PBMeta.same_keys`): a pslite server whose answer
//! has exactly the chunk's keys sends the values only, and the worker puts
//! the chunk's keys back.
//!
//! Rules every request follows, as in ps-lite:
//! - **Keys are sorted in ascending order and unique** within a request;
//!   otherwise the call fails with [`Error::UnsortedKeys`] or
//!   [`Error::DuplicateKey`] (nothing is sent).
//! - `vals` holds the keys' values back to back: `keys.len() * k` values for
//!   `k` values per key, or as many as the lens add up to.
//! - A push is answered once the servers have handled it, not once every
//!   worker has pushed: to pull a value that includes every worker's push,
//!   have the workers [`Postoffice::barrier`] over [`WORKER_GROUP`] after
//!   their pushes complete and before pulling.
//!
//! [`Error::UnsortedKeys`]: crate::Error::UnsortedKeys
//! [`Error::DuplicateKey`]: crate::Error::DuplicateKey
//! [`Postoffice::barrier`]: crate::Postoffice::barrier
//! [`WORKER_GROUP`]: crate::WORKER_GROUP

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use log::warn;
use pslite_postoffice::Failure;
use pslite_postoffice::{KeyRange, Postoffice, Ready};
use pslite_proto::{Message, NodeId};

use crate::compression::{Compression, KeyState, WorkerState};
use crate::customer::{Customer, Handler, Request};
use crate::kv_pairs::{KVPairs, Key, Val};
use crate::sarray::SArray;
use crate::simple_app::SimpleData;
use crate::Error;

mod chunks;
mod options;
mod slicer;
mod stages;

#[cfg(test)]
use chunks::pull_chunks;
use chunks::Placed;
pub use chunks::{PULL_CHUNK_BYTES, PULL_FIRST_CHUNK_BYTES};
pub use options::{Callback, KVOptions};
pub use slicer::{default_slicer, Slicer};
use stages::Outbound;

/// What a KV request keeps in its record (see [`crate::request`]).
struct Pending<V: Val> {
    pull: bool,
    keys: SArray<Key>,
    /// Each server's answer, with its sender.
    parts: Vec<(NodeId, KVPairs<V>)>,
    error: Option<Failure>,
    callback: Option<Callback<V>>,
    /// A completed pull's values (or why it failed), until taken.
    pulled: Option<Result<KVPairs<V>, Error>>,
    /// A pull answered in several messages: their values, each copied to
    /// its place as it arrives (`None`: assembled at the end).
    placed: Option<Placed<V>>,
    /// The keys of each message that asked for its answer without keys
    /// (`same_keys`), by the message's timestamp (the request's or an
    /// alias); filled as the messages go, before their answers can come.
    sent_keys: Option<SentKeys>,
}

/// The keys a pull's messages carried, by timestamp (see `Pending`).
type SentKeys = Arc<Mutex<HashMap<i32, SArray<Key>>>>;

/// A pull's message asks for its answer without keys from this many keys
/// on (8 KiB of keys): below, what it saves is less than what it costs.
const SAME_KEYS_MIN_KEYS: usize = 1024;

impl<V: Val> Pending<V> {
    /// A request that carries no pairs (a SimpleApp command).
    fn command() -> Self {
        Pending {
            pull: false,
            keys: SArray::new(),
            parts: Vec::new(),
            error: None,
            callback: None,
            pulled: None,
            placed: None,
            sent_keys: None,
        }
    }
}

/// The worker's state; its customer's [`Handler`].
struct Inner<V: Val> {
    app_id: i32,
    customer_id: i32,
    po: Postoffice,
    slicer: RwLock<Slicer<V>>,
    /// What requests are compressed with unless their options say.
    compression: RwLock<Option<Compression>>,
    /// Error feedback and `randomk` seeds.
    compressed: WorkerState,
    /// Bounded staleness: the bound and this worker's clock.
    clock: crate::staleness::Clock,
    /// Servers told of once: compression asked, but they cannot read it.
    uncompressed: Mutex<pslite_postoffice::LogOnce<NodeId>>,
}

/// A push, pull or push-pull sent by a [`KVWorker`]: wait for it, and take
/// a pull's values.
///
/// ```no_run
/// # fn demo(kv: &pslite::KVWorker<f32>) -> Result<(), pslite::Error> {
/// use pslite::KVOptions;
/// let keys = [1, 3, 5];
/// kv.push(&keys, &[1.0, 2.0, 3.0], KVOptions::new())?.wait()?;
/// let pulled = kv.pull(&keys, KVOptions::new())?.take()?;
/// // ps-lite's way, by timestamp: a handle converts into its timestamp.
/// let ts: i32 = kv.pull(&keys, KVOptions::new())?.into();
/// let again = kv.take_pull(ts)?;
/// assert_eq!(pulled.vals[..], again.vals[..]);
/// # Ok(()) }
/// ```
///
/// Dropping it gives up on the request (see [`Request`]).
#[must_use = "a request handle that is dropped gives up on its request: wait() on it, or keep into_ts()"]
pub struct KVRequest<V: Val> {
    request: Request<Pending<V>>,
}

impl<V: Val> KVRequest<V> {
    /// The request's timestamp (for logs; [`KVRequest::into_ts`] to wait
    /// by it).
    pub fn ts(&self) -> i32 {
        self.request.ts()
    }

    /// Waits until the request has completed.
    pub fn wait(&self) -> Result<(), Error> {
        self.request.wait()
    }

    /// [`KVRequest::wait`] with a deadline: [`Error::Timeout`] when it
    /// passes, and the request goes on (wait again).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<(), Error> {
        self.request.wait_timeout(timeout)
    }

    /// Waits for a pull (or push-pull) and returns its pairs, in key order.
    /// The values can be taken once (not if the request had a callback).
    pub fn take(&self) -> Result<KVPairs<V>, Error> {
        take_pulled(self.ts(), self.request.take_payload(None))
    }

    /// [`KVRequest::take`] with a deadline.
    pub fn take_timeout(&self, timeout: Duration) -> Result<KVPairs<V>, Error> {
        take_pulled(self.ts(), self.request.take_payload(Some(timeout)))
    }

    /// How many servers have answered.
    pub fn num_responses(&self) -> usize {
        self.request.num_responses()
    }

    /// The request's timestamp, giving up the handle: the request stays
    /// until waited for by timestamp ([`KVWorker::wait`],
    /// [`KVWorker::take_pull`]), as in ps-lite.
    pub fn into_ts(self) -> i32 {
        self.request.into_ts()
    }
}

impl<V: Val> From<KVRequest<V>> for i32 {
    fn from(request: KVRequest<V>) -> i32 {
        request.into_ts()
    }
}

impl<V: Val> std::fmt::Debug for KVRequest<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KVRequest").field("ts", &self.ts()).finish()
    }
}

/// The values of collected pull `ts`.
fn take_pulled<V: Val>(
    ts: i32,
    collected: Result<Option<Pending<V>>, Error>,
) -> Result<KVPairs<V>, Error> {
    collected?
        .and_then(|mut pending| pending.pulled.take())
        .unwrap_or_else(|| {
            Err(Error::InvalidInput(format!(
                "request {ts} has no pulled values to take (not a pull, taken already, or \
                 given to a callback)"
            )))
        })
}

/// A worker's key-value app; cheap to clone (clones share the app).
pub struct KVWorker<V: Val> {
    customer: Arc<Customer<Inner<V>>>,
}

impl<V: Val> Clone for KVWorker<V> {
    fn clone(&self) -> Self {
        KVWorker {
            customer: Arc::clone(&self.customer),
        }
    }
}

impl<V: Val> KVWorker<V> {
    /// A worker app with id `app_id`, as customer `customer_id` of `po`.
    ///
    /// Use app 0, customer 0 unless you need several apps or several
    /// customers of one app in a process; servers answer the app id of the
    /// request, so a [`KVServer`](crate::KVServer) with the same app id must
    /// exist.
    pub fn new(po: &Postoffice, app_id: i32, customer_id: i32) -> Result<Self, Error> {
        let inner = Inner {
            app_id,
            customer_id,
            po: po.clone(),
            slicer: RwLock::new(Box::new(default_slicer::<V>)),
            compression: RwLock::new(None),
            compressed: WorkerState::default(),
            clock: crate::staleness::Clock::new(po.config().staleness),
            uncompressed: Mutex::new(pslite_postoffice::LogOnce::new(log::Level::Warn)),
        };
        Ok(KVWorker {
            customer: Customer::new(po, app_id, customer_id, inner, Ready::ALL)?,
        })
    }

    fn inner(&self) -> &Inner<V> {
        self.customer.handler()
    }

    /// The current round of workers (see [`Postoffice::membership`]).
    pub fn membership(&self) -> pslite_postoffice::Membership {
        self.inner().po.membership()
    }

    /// Replaces how requests are split over servers.
    pub fn set_slicer(
        &self,
        slicer: impl Fn(&KVPairs<V>, &[KeyRange]) -> Vec<Option<KVPairs<V>>> + Send + Sync + 'static,
    ) {
        *self
            .inner()
            .slicer
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Box::new(slicer);
    }

    /// Compresses the values of this worker's pushes (and, if `compression`
    /// says so, asks for compressed answers) with `compression`, or not
    /// (`None`, the default); see [`crate::compression`]. A request's
    /// [`KVOptions::compression`] overrides it. Servers that do not read
    /// compressed values (C++ ones) get them as they are. For `f32` and
    /// `f64` values only.
    pub fn set_compression(&self, compression: Option<Compression>) -> Result<(), Error> {
        if compression.is_some() && !crate::compression::applies_to::<V>() {
            return Err(Error::InvalidInput(format!(
                "gradient compression applies to f32 and f64 values, not {:?}",
                V::DATA_TYPE
            )));
        }
        *self
            .inner()
            .compression
            .write()
            .unwrap_or_else(|e| e.into_inner()) = compression;
        Ok(())
    }

    /// Bounded staleness: this worker's pulls are answered only once every
    /// worker's pushes of clocks up to `clock - s - 1` are applied at the
    /// server (`Some(s)`; `Some(0)` is synchronous), or at once (`None`,
    /// the default unless `PS_STALENESS` is set). Advance the clock with
    /// [`KVWorker::clock`] at the end of each iteration. Needs pslite
    /// servers (fails naming one that is not).
    pub fn set_staleness(&self, bound: Option<u64>) -> Result<(), Error> {
        if bound.is_some() {
            crate::staleness::servers(&self.inner().po)?;
        }
        self.inner().clock.set_bound(bound);
        Ok(())
    }

    /// The bound set by [`KVWorker::set_staleness`] or `PS_STALENESS`.
    pub fn staleness(&self) -> Option<u64> {
        self.inner().clock.bound()
    }

    /// This worker's clock: the iterations it ended with
    /// [`KVWorker::clock`].
    pub fn current_clock(&self) -> u64 {
        self.inner().clock.now()
    }

    /// Ends this worker's iteration: its clock advances and, with a bound
    /// ([`KVWorker::set_staleness`]), every server is told the new clock
    /// and how many pushes this worker sent it; returns the new clock.
    /// Call it after the iteration's pushes were sent (their answers need
    /// not have come). Without a bound it only counts.
    pub fn clock(&self) -> Result<u64, Error> {
        let inner = self.inner();
        let (clock, ticks) = inner.clock.advance(&inner.po)?;
        for meta in ticks {
            // A fresh timestamp (ticks are told apart from each other and
            // from requests); nothing answers a tick.
            let ts = self.customer.new_request(0, Pending::command()).ts();
            let mut msg = Message {
                meta,
                ..Message::default()
            };
            msg.meta.app_id = inner.app_id;
            msg.meta.customer_id = inner.customer_id;
            msg.meta.timestamp = ts;
            inner.po.send(msg)?;
        }
        Ok(clock)
    }

    /// What this worker's compression holds for key `key` (momentum
    /// correction's velocity, error feedback's residual), to save with a
    /// checkpoint.
    pub fn compression_state(&self, key: Key) -> KeyState {
        self.inner().compressed.key_state(key)
    }

    /// Replaces what this worker's compression holds for key `key` (from
    /// [`KVWorker::compression_state`] of a checkpoint): its next push adds
    /// the residual and carries on the velocity.
    pub fn set_compression_state(&self, key: Key, state: &KeyState) {
        self.inner().compressed.restore(key, state);
    }

    /// The compression requests use unless their options say otherwise.
    pub fn compression(&self) -> Option<Compression> {
        *self
            .inner()
            .compression
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Pushes `vals` for `keys` (copied once). Returns the request to wait
    /// on. `keys` must be sorted ascending and unique. The push is applied
    /// when it completes, but other workers' pushes may not be: see the
    /// module docs for the barrier before pulling.
    pub fn push(
        &self,
        keys: &[Key],
        vals: &[V],
        opts: KVOptions<V>,
    ) -> Result<KVRequest<V>, Error> {
        self.zpush(SArray::from_slice(keys), SArray::from_slice(vals), opts)
    }

    /// Pulls the values of `keys` (sorted ascending and unique); get them
    /// with [`KVRequest::take`], [`KVWorker::take_pull`] or a callback.
    pub fn pull(&self, keys: &[Key], opts: KVOptions<V>) -> Result<KVRequest<V>, Error> {
        self.zpull(SArray::from_slice(keys), opts)
    }

    /// Pushes and pulls in one request: the pull sees this push applied.
    /// `keys` must be sorted ascending and unique.
    pub fn push_pull(
        &self,
        keys: &[Key],
        vals: &[V],
        opts: KVOptions<V>,
    ) -> Result<KVRequest<V>, Error> {
        self.zpush_pull(SArray::from_slice(keys), SArray::from_slice(vals), opts)
    }

    /// [`KVWorker::push`] without copying the buffers.
    pub fn zpush(
        &self,
        keys: SArray<Key>,
        vals: SArray<V>,
        opts: KVOptions<V>,
    ) -> Result<KVRequest<V>, Error> {
        self.send(true, false, keys, vals, opts)
    }

    /// [`KVWorker::pull`] without copying the keys.
    pub fn zpull(&self, keys: SArray<Key>, opts: KVOptions<V>) -> Result<KVRequest<V>, Error> {
        self.send(false, true, keys, SArray::new(), opts)
    }

    /// [`KVWorker::push_pull`] without copying the buffers.
    pub fn zpush_pull(
        &self,
        keys: SArray<Key>,
        vals: SArray<V>,
        opts: KVOptions<V>,
    ) -> Result<KVRequest<V>, Error> {
        self.send(true, true, keys, vals, opts)
    }

    /// Sends a SimpleApp command (`head`, `body`) on this worker's customer
    /// to node or group `recv`, as a C++ `KVWorker` (a SimpleApp) can; e.g.
    /// MXNet's sync-mode (head 3) and stop-server (head 2) commands to the
    /// server group. Returns the request to wait on.
    pub fn request(&self, head: i32, body: &[u8], recv: i32) -> Result<KVRequest<V>, Error> {
        let request =
            crate::simple_app::send_request(&self.customer, Pending::command(), head, body, recv)?;
        Ok(KVRequest { request })
    }

    /// Waits until request `ts` (a timestamp, or a request handle) has
    /// completed.
    pub fn wait(&self, ts: impl Into<i32>) -> Result<(), Error> {
        self.customer.wait(ts.into())
    }

    /// [`KVWorker::wait`] with a deadline.
    pub fn wait_timeout(&self, ts: impl Into<i32>, timeout: Duration) -> Result<(), Error> {
        self.customer.wait_timeout(ts.into(), timeout)
    }

    /// Waits for pull (or push-pull) `ts` (a timestamp, or a request
    /// handle) and returns its pairs, in key order. Each pull's values can
    /// be taken once (not if it had a callback).
    pub fn take_pull(&self, ts: impl Into<i32>) -> Result<KVPairs<V>, Error> {
        let ts = ts.into();
        take_pulled(ts, self.customer.take(ts, None))
    }

    /// [`KVWorker::take_pull`] with a deadline.
    pub fn take_pull_timeout(
        &self,
        ts: impl Into<i32>,
        timeout: Duration,
    ) -> Result<KVPairs<V>, Error> {
        let ts = ts.into();
        take_pulled(ts, self.customer.take(ts, Some(timeout)))
    }

    /// How many servers have answered request `ts`.
    pub fn num_responses(&self, ts: i32) -> usize {
        self.customer.num_responses(ts)
    }

    /// Runs a request's stages (see `stages`): checked, sliced over the
    /// servers, chunked; registered; then each message addressed, encoded,
    /// stamped and sent.
    fn send(
        &self,
        push: bool,
        pull: bool,
        keys: SArray<Key>,
        vals: SArray<V>,
        opts: KVOptions<V>,
    ) -> Result<KVRequest<V>, Error> {
        let inner = self.inner();
        let lens = opts.lens.unwrap_or_default();
        let compression = opts.compression.unwrap_or_else(|| self.compression());
        let kvs = KVPairs { keys, vals, lens };
        let mut out = stages::checked(push, pull, kvs, compression)?;
        {
            let slicer = inner.slicer.read().unwrap_or_else(|e| e.into_inner());
            stages::sliced(&mut out, &slicer, &inner.po.server_key_ranges())?;
        }
        stages::chunked(&mut out, &inner.po);
        // Register before sending: responses can arrive at once. A server
        // sent several messages is named once per message.
        let servers: Vec<NodeId> = out.messages.iter().map(Outbound::server).collect();
        let sent_keys: Option<SentKeys> = out
            .messages
            .iter()
            .any(|m| m.same_keys)
            .then(|| Arc::new(Mutex::new(HashMap::new())));
        let pending = Pending {
            pull,
            keys: out.kvs.keys.clone(),
            parts: Vec::new(),
            error: None,
            callback: opts.callback,
            pulled: None,
            // Several answers: each put in place as it arrives.
            placed: (pull && servers.len() > 1).then(Placed::new),
            sent_keys: sent_keys.clone(),
        };
        let request = self.customer.new_request_to(&servers, pending);
        let ts = request.ts();
        let head = stages::Head {
            app_id: inner.app_id,
            customer_id: inner.customer_id,
            cmd: opts.cmd,
            priority: opts.priority,
        };
        for (i, m) in std::mem::take(&mut out.messages).into_iter().enumerate() {
            // The first message carries the request's timestamp, further
            // ones an alias of it (gone: the request is over already).
            let timestamp = match i {
                0 => ts,
                _ => match self.customer.alias(ts) {
                    Some(alias) => alias,
                    None => break,
                },
            };
            let mut msg = stages::addressed(&out, &m, &head, timestamp, sent_keys.as_ref());
            stages::encoded(inner, &out, m.pairs, &mut msg);
            inner.clock.stamp(&inner.po, msg.meta.recver, &mut msg.meta);
            let peer = msg.meta.recver;
            if let Err(e) = inner.po.send(msg) {
                let reason = e.to_string();
                self.customer
                    .fail_request(ts, Failure::SendFailed { peer, reason });
                return Err(e);
            }
        }
        Ok(KVRequest { request })
    }
}

impl<V: Val> Inner<V> {
    /// Assembles a finished request and hands it to its callback or keeps
    /// it for `take`.
    fn complete(&self, ts: i32, pending: &mut Pending<V>, failure: Option<Failure>) {
        let result = match failure.or(pending.error.take()) {
            Some(cause) => Err(Error::RequestFailed { ts, cause }),
            None if pending.pull => {
                let placed = pending
                    .placed
                    .as_mut()
                    .and_then(|p| p.take(pending.keys.len()));
                assemble(ts, &pending.keys, &mut pending.parts, placed)
            }
            None => Ok(KVPairs::default()),
        };
        pending.parts = Vec::new();
        match pending.callback.take() {
            Some(callback) => callback(result),
            None if pending.pull => pending.pulled = Some(result),
            // A push's failure is its wait's error.
            None => {}
        }
    }
}

/// Orders the servers' answers by key and joins them (their values are
/// `placed` already, if given); the keys must be the requested ones.
fn assemble<V: Val>(
    ts: i32,
    requested: &SArray<Key>,
    parts: &mut [(NodeId, KVPairs<V>)],
    placed: Option<SArray<V>>,
) -> Result<KVPairs<V>, Error> {
    parts.sort_by_key(|(_, p)| p.keys.first().copied().unwrap_or(u64::MAX));
    let senders: Vec<NodeId> = parts.iter().map(|(id, _)| *id).collect();
    let parts: Vec<&KVPairs<V>> = parts.iter().map(|(_, p)| p).collect();
    let any_lens = parts.iter().any(|p| !p.lens.is_empty());
    let lens: Vec<SArray<i32>> = parts
        .iter()
        .map(|p| {
            if p.lens.is_empty() && any_lens {
                let n = p.values_per_key();
                SArray::from_vec(n.into_iter().map(|x| x as i32).collect())
            } else {
                p.lens.clone()
            }
        })
        .collect();
    let vals = placed.unwrap_or_else(|| {
        let vals: Vec<SArray<V>> = parts.iter().map(|p| p.vals.clone()).collect();
        SArray::concat(&vals)
    });
    let answered: usize = parts.iter().map(|p| p.keys.len()).sum();
    // Checked below to be the requested keys: those are returned, no copy.
    let out = KVPairs {
        keys: requested.clone(),
        vals,
        lens: SArray::concat(&lens),
    };
    // Each part's keys are sorted and unique (checked on arrival); as in
    // C++ ps-lite, each must span exactly its share of the requested keys.
    let mut at = 0;
    for (part, &sender) in parts.iter().zip(&senders) {
        let (Some(&first), Some(&last)) = (part.keys.first(), part.keys.last()) else {
            continue;
        };
        let begin = at + requested[at..].partition_point(|&k| k < first);
        let end = begin + requested[begin..].partition_point(|&k| k <= last);
        if requested.get(begin) != Some(&first) || end - begin != part.keys.len() {
            return Err(Error::RequestFailed {
                ts,
                cause: Failure::BadResponse {
                    sender,
                    what: format!(
                        "keys {first}..={last} ({} keys) do not match the request",
                        part.keys.len()
                    ),
                },
            });
        }
        at = end;
    }
    if answered != requested.len() {
        return Err(Error::RequestFailed {
            ts,
            cause: Failure::BadResponse {
                sender: senders.first().copied().unwrap_or(pslite_proto::K_EMPTY),
                what: format!(
                    "the servers answered {answered} keys for {} requested",
                    requested.len()
                ),
            },
        });
    }
    Ok(out)
}

impl<V: Val> Handler for Inner<V> {
    type Payload = Pending<V>;

    fn on_request(&self, _customer: &Arc<Customer<Self>>, msg: Message) {
        if msg.meta.simple_app {
            // ps-lite's default SimpleApp handle: an empty answer.
            let req = SimpleData::of(&msg);
            if let Err(e) = crate::simple_app::send_response(&self.po, self.app_id, &req, b"") {
                warn!("cannot answer node {}: {e}", req.sender);
            }
            return;
        }
        let refusal = pslite_proto::refusal::Refusal::Other {
            app: self.app_id,
            reason: "a key-value request to a worker (workers serve none)".into(),
        };
        crate::refusal::refuse(&self.po, &msg.meta, refusal);
    }

    fn on_response(&self, msg: &Message, pending: &mut Pending<V>) -> bool {
        if msg.meta.simple_app || !pending.pull {
            return true; // a command's or a push's answer: counted
        }
        match stages::answer::<V>(msg, pending.sent_keys.as_ref()) {
            Ok(kvs) => {
                if let Some(placed) = pending.placed.as_mut() {
                    placed.place(&pending.keys, &kvs);
                }
                pending.parts.push((msg.meta.sender, kvs));
            }
            Err(failure) => {
                warn!("{failure}");
                pending.error.get_or_insert(failure);
            }
        }
        true
    }

    fn on_complete(&self, ts: i32, pending: &mut Pending<V>, failure: Option<Failure>) {
        self.complete(ts, pending, failure);
    }

    fn handles_inline(&self, msg: &Message, pending: Option<&Pending<V>>) -> bool {
        // KV responses of requests without a callback: decoding and counting
        // them is cheap and runs no user code.
        !msg.meta.request && !msg.meta.simple_app && pending.is_some_and(|p| p.callback.is_none())
    }

    fn holds_result(pending: &Pending<V>) -> bool {
        pending.pulled.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pslite_postoffice::key_ranges;

    #[test]
    fn default_slicer_splits_by_range_and_skips_empty_servers() {
        let ranges = key_ranges(3);
        let step = u64::MAX / 3;
        let keys = vec![1, 2, step * 2 + 5, u64::MAX];
        let kvs = KVPairs::with_lens(
            keys,
            vec![1.0f32, 2.0, 2.0, 3.0, 4.0, 4.0, 4.0],
            vec![1, 2, 1, 3],
        );
        let sliced = default_slicer(&kvs, &ranges);
        assert_eq!(sliced.len(), 3);
        let s0 = sliced[0].as_ref().unwrap();
        assert_eq!(&s0.keys[..], &[1, 2]);
        assert_eq!(&s0.vals[..], &[1.0, 2.0, 2.0]);
        assert_eq!(&s0.lens[..], &[1, 2]);
        assert!(sliced[1].is_none());
        let s2 = sliced[2].as_ref().unwrap();
        assert_eq!(&s2.keys[..], &[step * 2 + 5, u64::MAX]);
        assert_eq!(&s2.vals[..], &[3.0, 4.0, 4.0, 4.0]);
        // Slices share the request's buffers.
        assert_eq!(s2.vals.as_ptr(), kvs.vals[3..].as_ptr());
    }

    #[test]
    fn pull_chunks_grow_and_cover_the_keys_in_order_sharing_their_buffer() {
        let keys = SArray::from_vec((0..40u64).collect());
        let lens = |first, most| {
            pull_chunks(&keys, first, most)
                .iter()
                .map(|c| c.len())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            lens(2, 8),
            [2, 4, 8, 8, 8, 10],
            "a remainder under half joins the last"
        );
        assert_eq!(lens(4, 4), [4; 10]);
        assert_eq!(lens(3, 16), [3, 6, 12, 19]);
        assert_eq!(lens(40, 100), [40], "a small pull is one request");
        assert_eq!(lens(30, 100), [40]);
        assert_eq!(lens(0, 0), [1; 40]);
        let chunks = pull_chunks(&keys, 2, 8);
        assert_eq!(chunks[1].as_ptr(), keys[2..].as_ptr());
        let joined: Vec<u64> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(joined, (0..40).collect::<Vec<_>>());
        assert_eq!(pull_chunks(&SArray::new(), 4, 4).len(), 1);
    }

    #[test]
    fn answers_are_placed_as_they_arrive_or_joined_when_they_do_not_fit() {
        let req = SArray::from_vec(vec![1u64, 2, 5, 9]);
        let a = KVPairs::new(vec![5u64, 9], vec![5.0f32, 5.5, 9.0, 9.5]);
        let b = KVPairs::new(vec![1u64, 2], vec![1.0f32, 1.5, 2.0, 2.5]);
        let mut placed = Placed::new();
        placed.place(&req, &a);
        assert!(placed.take(4).is_none(), "not all placed yet");
        placed.place(&req, &b);
        let vals = placed.take(4).unwrap();
        assert_eq!(&vals[..], &[1.0, 1.5, 2.0, 2.5, 5.0, 5.5, 9.0, 9.5]);
        let out = assemble(0, &req, &mut [(8, a.clone()), (10, b.clone())], Some(vals)).unwrap();
        assert_eq!(out.vals.len(), 8);
        // Another number of values per key: joined at the end instead.
        let mut placed = Placed::new();
        placed.place(&req, &a);
        placed.place(&req, &KVPairs::new(vec![1u64, 2], vec![1.0f32, 2.0]));
        assert!(placed.take(4).is_none());
    }

    #[test]
    fn handles_can_move_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<KVRequest<f32>>();
        send_sync::<KVWorker<f32>>();
        send_sync::<crate::Request>();
    }

    #[test]
    fn assemble_orders_by_key() {
        let a = KVPairs::new(vec![10u64, 11], vec![1.0f32, 2.0]);
        let b = KVPairs::new(vec![1u64], vec![0.5f32]);
        let req = SArray::from_vec(vec![1u64, 10, 11]);
        let out = assemble(0, &req, &mut [(8, a.clone()), (10, b.clone())], None).unwrap();
        assert_eq!(&out.vals[..], &[0.5, 1.0, 2.0]);
        let err = assemble(
            0,
            &SArray::from_vec(vec![1u64]),
            &mut [(8, a), (10, b)],
            None,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            Error::RequestFailed {
                cause: Failure::BadResponse { sender: 8, .. },
                ..
            }
        ));
    }
}
