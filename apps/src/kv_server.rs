//! `KVServer<V>`: answers the pushes and pulls of the workers.
//!
//! Its request handle gets each request's [`KVMeta`] and [`KVPairs`] and
//! answers with [`KVServer::response`], at once or later, from any thread
//! (the handle gets a `KVServer` it may clone). Requests that arrive before
//! a handle is set wait for it, in the Postoffice's hold (`PS_HOLD_LIMIT`).
//! SimpleApp commands to the app (a C++
//! `KVServer` is also a SimpleApp) go to [`KVServer::set_simple_request_handle`]. [`DefaultHandle`] is ps-lite's
//! `KVServerDefaultHandle`: a store that sums pushes and answers pulls, here
//! also for several (and variable numbers of) values per key.
//!
//! A handle that may run on several threads at once
//! ([`KVServer::set_concurrent_request_handle`], `DefaultHandle` among them)
//! runs on `PS_SERVER_THREADS` engine threads ([`KVServer::set_threads`]):
//! requests on disjoint keys in parallel, on the same key in arrival order,
//! responses unchanged (see `engine.rs`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use log::{error, warn};
use pslite_postoffice::{Postoffice, Ready};
use pslite_proto::refusal::Refusal;
use pslite_proto::{lock, Message, Meta};

use crate::compression::AnswerFeedback;
use crate::customer::{Customer, Handler};
use crate::engine::{Collected, Engine};
use crate::kv_pairs::{accepts, KVMeta, KVPairs, Key, Val};
use crate::simple_app::SimpleData;
use crate::Error;

type Handle<V> = Box<dyn FnMut(&KVMeta, KVPairs<V>, &KVServer<V>) + Send>;
type SimpleHandle<V> = Box<dyn FnMut(&SimpleData, &KVServer<V>) + Send>;

/// What a handle runs: a request, or a key-range copy to make or restore.
enum Work<V: Val> {
    Kv(KVMeta, KVPairs<V>),
    Simple(SimpleData),
    /// Replicated key ranges: a copy of keys `[begin, end)` to make.
    Snapshot {
        token: u64,
        begin: Key,
        end: Key,
    },
    /// Replicated key ranges: a copy to restore.
    Restore {
        token: u64,
        begin: Key,
        end: Key,
        data: bytes::Bytes,
    },
}

/// The handles, behind one lock.
struct Handles<V: Val> {
    kv: Option<Handle<V>>,
    simple: Option<SimpleHandle<V>>,
    /// The replicated handle's state, which copies and restores key ranges.
    ranges: Option<Box<dyn RangeCopy>>,
}

impl<V: Val> Handles<V> {
    /// What the server takes with these handles; the Postoffice holds the
    /// rest, in order, until a handle is set.
    fn ready(&self) -> Ready {
        let kv = self.kv.is_some();
        Ready {
            kv,
            // Without a simple handle, the KV handle's presence means
            // "answer empty" (ps-lite's default).
            simple: self.simple.is_some() || kv,
            // A plain KV handle's presence means "cannot copy" (the request
            // fails instead of holding every later one).
            copies: self.ranges.is_some() || kv,
        }
    }

    /// Whether `work` can be handled now.
    fn ready_for(&self, work: &Work<V>) -> bool {
        let ready = self.ready();
        match work {
            Work::Kv(..) => ready.kv,
            Work::Simple(_) => ready.simple,
            Work::Snapshot { .. } | Work::Restore { .. } => ready.copies,
        }
    }
}

/// A request handle whose state can be copied and restored by key range:
/// what replicated key ranges (`PS_REPLICAS >= 2`) need to bring a server
/// that joins or replaces a dead one up to date. The replicated log is of
/// requests, so `handle` must be deterministic (the same requests in the
/// same order give the same state) and apply each request before it
/// returns (answering later is fine): [`DefaultHandle`] is.
pub trait ReplicatedHandle<V: Val>: Send + 'static {
    /// Handles one request, as a plain request handle does.
    fn handle(&mut self, meta: &KVMeta, req: KVPairs<V>, server: &KVServer<V>);
    /// The state of keys `[begin, end)` (`end == u64::MAX`: every key from
    /// `begin` on), in a form [`ReplicatedHandle::restore`] reads.
    fn snapshot(&self, begin: Key, end: Key) -> Vec<u8>;
    /// Replaces the state of keys `[begin, end)` by `data` (from
    /// [`ReplicatedHandle::snapshot`] on a peer); on an error, nothing changes.
    fn restore(&mut self, begin: Key, end: Key, data: &[u8]) -> Result<(), String>;
}

/// Why app `app`'s state cannot be `what` (copied, restored): its handle
/// is a plain one.
fn not_copyable(app: i32, what: &str) -> String {
    format!(
        "KVServer app {app} has a request handle whose state cannot be {what} (set one with \
         set_replicated_handle, e.g. DefaultHandle)"
    )
}

/// A replicated handle's state seen without its value type.
trait RangeCopy: Send {
    fn snapshot(&self, begin: Key, end: Key) -> Vec<u8>;
    fn restore(&self, begin: Key, end: Key, data: &[u8]) -> Result<(), String>;
}

impl<V: Val, H: ReplicatedHandle<V>> RangeCopy for (Arc<Mutex<H>>, std::marker::PhantomData<V>) {
    fn snapshot(&self, begin: Key, end: Key) -> Vec<u8> {
        lock(&self.0).snapshot(begin, end)
    }
    fn restore(&self, begin: Key, end: Key, data: &[u8]) -> Result<(), String> {
        lock(&self.0).restore(begin, end, data)
    }
}

/// The server's state; its customer's [`Handler`].
struct Inner<V: Val> {
    app_id: i32,
    po: Postoffice,
    handles: Mutex<Handles<V>>,
    /// KV requests run on the Van's receive thread (see
    /// [`KVServer::set_request_handle_inline`]).
    inline: AtomicBool,
    /// Engine threads of a concurrent handle (`PS_SERVER_THREADS`).
    threads: AtomicUsize,
    /// The engine running the concurrent handle, once one is set.
    engine: OnceLock<Arc<Engine<V>>>,
    /// Error feedback on compressed answers, per worker and key.
    answer_feedback: AnswerFeedback,
    /// Said once: a handle without a check refused part of a cut push.
    partial_refusal: AtomicBool,
}

/// A server's key-value app; cheap to clone (clones share the app).
pub struct KVServer<V: Val> {
    customer: Arc<Customer<Inner<V>>>,
}

impl<V: Val> Clone for KVServer<V> {
    fn clone(&self) -> Self {
        KVServer {
            customer: Arc::clone(&self.customer),
        }
    }
}

impl<V: Val> KVServer<V> {
    /// A server app with id `app_id` (its customer id too, as in ps-lite).
    ///
    /// Use app 0 unless you need several apps; workers reach this server
    /// through a [`KVWorker`](crate::KVWorker) of the same app id. Keys of a
    /// request arrive sorted ascending and unique.
    pub fn new(po: &Postoffice, app_id: i32) -> Result<Self, Error> {
        let inner = Inner {
            app_id,
            po: po.clone(),
            handles: Mutex::new(Handles {
                kv: None,
                simple: None,
                ranges: None,
            }),
            inline: AtomicBool::new(false),
            threads: AtomicUsize::new(po.config().server_threads.max(1)),
            engine: OnceLock::new(),
            answer_feedback: AnswerFeedback::default(),
            partial_refusal: AtomicBool::new(false),
        };
        Ok(KVServer {
            customer: Customer::new(po, app_id, app_id, inner, Ready::NONE)?,
        })
    }

    fn inner(&self) -> &Inner<V> {
        self.customer.handler()
    }

    /// Sets the request handle; requests that arrived before it are handled
    /// now, in order.
    pub fn set_request_handle(
        &self,
        handle: impl FnMut(&KVMeta, KVPairs<V>, &KVServer<V>) + Send + 'static,
    ) {
        let mut handles = lock(&self.inner().handles);
        handles.kv = Some(Box::new(handle));
        self.opened(handles);
    }

    /// Sets a request handle whose state can be copied by key range (see
    /// [`ReplicatedHandle`]): with replicated key ranges (`PS_REPLICAS >= 2`)
    /// a server that joins the job, or replaces a dead one, receives copies
    /// of its ranges from it while requests go on. Without replication it is
    /// a plain request handle.
    pub fn set_replicated_handle(&self, handle: impl ReplicatedHandle<V>) {
        let shared = Arc::new(Mutex::new(handle));
        let copy = (Arc::clone(&shared), std::marker::PhantomData::<V>);
        let mut handles = lock(&self.inner().handles);
        handles.ranges = Some(Box::new(copy));
        handles.kv = Some(Box::new(move |meta, req, server| {
            lock(&shared).handle(meta, req, server)
        }));
        self.opened(handles);
    }

    /// Like [`KVServer::set_request_handle`], but the handle runs on the
    /// node's receive thread instead of the app's own thread: one thread
    /// hand-off less per request (lower latency, more requests per second).
    /// For handles that are quick and never block: while it runs, the node
    /// receives nothing else (other apps, barriers, heartbeats). Set it
    /// before requests arrive.
    pub fn set_request_handle_inline(
        &self,
        handle: impl FnMut(&KVMeta, KVPairs<V>, &KVServer<V>) + Send + 'static,
    ) {
        self.inner().inline.store(true, Ordering::SeqCst);
        self.set_request_handle(handle);
    }

    /// Threads a concurrent request handle runs on (default
    /// `PS_SERVER_THREADS`, else 1); set before
    /// [`KVServer::set_concurrent_request_handle`].
    pub fn set_threads(&self, threads: usize) {
        let threads = threads.clamp(
            1,
            pslite_postoffice::settings::PS_SERVER_THREADS
                .kind
                .range
                .max as usize,
        );
        self.inner().threads.store(threads, Ordering::SeqCst);
    }

    /// The threads this server's request handle runs on (1 unless a
    /// concurrent handle runs on an engine).
    pub fn threads(&self) -> usize {
        self.inner().engine.get().map_or(1, |e| e.threads())
    }

    /// Sets a request handle that may run on several threads at once: with
    /// [`KVServer::set_threads`] (or `PS_SERVER_THREADS`) above 1 it runs on
    /// that many engine threads, each owning the keys that hash to it. A
    /// request is cut by thread and the handle sees each part as a request
    /// of its own (the keys of one thread, in order, with their values),
    /// answering it with [`KVServer::response`]; the server sends the
    /// worker one response, in the request's key order, as one thread
    /// would. Requests on one key are handled in arrival order, on disjoint
    /// keys in parallel. So the handle must treat keys independently (a sum
    /// store, SGD, AdaGrad do). With one thread it is
    /// [`KVServer::set_request_handle`]. Set it once.
    ///
    /// A closure has no check: if it refuses one part of a push cut over
    /// threads, the other parts may already be applied. A handle that may
    /// refuse a push gives [`KVServer::set_concurrent_handle`] a
    /// [`ConcurrentHandle`] with a check, as [`DefaultHandle`] is.
    pub fn set_concurrent_request_handle(
        &self,
        handle: impl Fn(&KVMeta, KVPairs<V>, &KVServer<V>) + Send + Sync + 'static,
    ) {
        self.set_concurrent_handle(Unchecked(handle));
    }

    /// Sets a concurrent request handle with a check (see
    /// [`KVServer::set_concurrent_request_handle`] for the threads): a push
    /// cut over threads is checked part by part before any part is applied,
    /// and if a part is refused, nothing of the push is applied and the
    /// worker is told once. E.g. `server.set_concurrent_handle(DefaultHandle::new())`.
    pub fn set_concurrent_handle(&self, handle: impl ConcurrentHandle<V>) {
        let threads = self.inner().threads.load(Ordering::SeqCst);
        if threads <= 1 || self.inner().engine.get().is_some() {
            self.set_request_handle(move |meta, req, server| handle.handle(meta, req, server));
            return;
        }
        let runs = OnEngine {
            customer: Arc::downgrade(&self.customer),
            handle,
        };
        let app_id = self.inner().app_id;
        let engine = match Engine::start(threads, app_id, Arc::new(runs)) {
            Ok(engine) => engine,
            Err(e) => {
                warn!("KVServer app {app_id}: cannot start {threads} engine threads ({e}): one");
                return;
            }
        };
        let _ = self.inner().engine.set(Arc::clone(&engine));
        self.set_request_handle(move |meta, kvs, _| engine.submit(meta, kvs));
    }

    /// Sets the handle of SimpleApp commands sent to this app (a C++
    /// `KVServer` is a SimpleApp; MXNet sends its commands this way). Until
    /// it is set, commands wait; once the KV handle is set without it, they
    /// get an empty answer, ps-lite's default.
    pub fn set_simple_request_handle(
        &self,
        handle: impl FnMut(&SimpleData, &KVServer<V>) + Send + 'static,
    ) {
        let mut handles = lock(&self.inner().handles);
        handles.simple = Some(Box::new(handle));
        self.opened(handles);
    }

    /// How many requests wait for a handle (in the Postoffice).
    pub fn queued_requests(&self) -> usize {
        self.customer.waiting()
    }

    /// Answers SimpleApp command `req` with `body`.
    pub fn simple_response(&self, req: &SimpleData, body: &[u8]) -> Result<(), Error> {
        crate::simple_app::send_response(&self.inner().po, self.inner().app_id, req, body)
    }

    /// A handle was set: the Postoffice hands over what waited for it.
    fn opened(&self, handles: std::sync::MutexGuard<'_, Handles<V>>) {
        let ready = handles.ready();
        drop(handles);
        self.customer.set_ready(ready);
    }

    /// Runs one request's handle (see [`Handles::ready_for`]).
    fn dispatch(&self, handles: &mut Handles<V>, req: Work<V>) {
        let po = &self.inner().po;
        match req {
            Work::Kv(meta, kvs) => {
                if let Some(handle) = handles.kv.as_mut() {
                    crate::simple_app::contain_panic(
                        po,
                        || self.response_message(&meta, KVPairs::default()),
                        || handle(&meta, kvs, self),
                    );
                }
            }
            Work::Simple(data) => match handles.simple.as_mut() {
                Some(handle) => crate::simple_app::contain_panic(
                    po,
                    || crate::simple_app::response_message(self.inner().app_id, &data, b""),
                    || handle(&data, self),
                ),
                None => {
                    if let Err(e) = self.simple_response(&data, b"") {
                        warn!("cannot answer node {}: {e}", data.sender);
                    }
                }
            },
            Work::Snapshot { token, begin, end } => {
                let Ok(van) = po.van() else { return };
                match &handles.ranges {
                    Some(ranges) => {
                        let copy = ranges.snapshot(begin, end);
                        van.snapshot_taken(token, self.inner().app_id, copy.into());
                    }
                    None => {
                        let app = self.inner().app_id;
                        van.snapshot_failed(token, app, &not_copyable(app, "copied"))
                    }
                }
            }
            Work::Restore {
                token,
                begin,
                end,
                data,
            } => {
                let Some(ranges) = &handles.ranges else {
                    if let Ok(van) = po.van() {
                        let app = self.inner().app_id;
                        van.restore_failed(token, app, &not_copyable(app, "restored"));
                    }
                    return;
                };
                {
                    match ranges.restore(begin, end, &data) {
                        Ok(()) => {
                            if let Ok(van) = po.van() {
                                van.restored(token, self.inner().app_id);
                            }
                        }
                        Err(e) => {
                            error!(
                                "KVServer app {}: refusing a copy of keys {begin}..{end}: {e}",
                                self.inner().app_id
                            );
                            if let Ok(van) = po.van() {
                                van.restore_failed(token, self.inner().app_id, &e);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Answers request `req`: `res` holds the pulled pairs (empty for a push).
    /// On engine threads, the answer to a part of a request is kept until
    /// every part has one (see [`KVServer::set_concurrent_request_handle`]).
    pub fn response(&self, req: &KVMeta, res: KVPairs<V>) -> Result<(), Error> {
        let res = match self.inner().engine.get() {
            Some(engine) => match engine.collect(req, res) {
                Collected::Whole(res) | Collected::Complete(res) => res,
                Collected::Kept => return Ok(()),
            },
            None => res,
        };
        self.inner().po.send(self.response_message(req, res))?;
        Ok(())
    }

    /// Refuses request `req`: the worker's wait fails at once with
    /// [`Failure::Refused`](crate::Failure::Refused) carrying `refusal`
    /// (for a request the handle cannot take: values it cannot use, a
    /// command it does not know). Apply nothing of a request you refuse.
    /// A C++ worker cannot be told: the refusal is logged instead.
    pub fn refuse(&self, req: &KVMeta, refusal: Refusal) {
        // On engine threads, a part of a request refused refuses the
        // request once; its other parts' answers are dropped. A handle
        // with a check never gets here for a push it checked; one without
        // may have applied the other parts already: said once.
        if let Some(engine) = self.inner().engine.get() {
            if req.push
                && engine.is_cut(req)
                && !self.inner().partial_refusal.swap(true, Ordering::Relaxed)
            {
                error!(
                    "KVServer app {}: the request handle refused part of a push cut over engine \
                     threads; its other parts may have been applied (give the handle a check: \
                     set_concurrent_handle with a ConcurrentHandle)",
                    self.inner().app_id
                );
            }
            if !engine.part_failed(req) {
                return;
            }
        }
        crate::refusal::refuse(&self.inner().po, &request_meta(req), refusal);
    }

    /// Answers request `req` with `result`: [`KVServer::response`] with the
    /// pairs, or [`KVServer::refuse`] (e.g. with [`DefaultHandle::apply`]'s
    /// result).
    pub fn answer(&self, req: &KVMeta, result: Result<KVPairs<V>, Refusal>) -> Result<(), Error> {
        match result {
            Ok(res) => self.response(req, res),
            Err(refusal) => {
                self.refuse(req, refusal);
                Ok(())
            }
        }
    }

    /// The response to `req` carrying `res`.
    fn response_message(&self, req: &KVMeta, res: KVPairs<V>) -> Message {
        let mut msg = Message::default();
        msg.meta.app_id = self.inner().app_id;
        msg.meta.customer_id = req.customer_id;
        msg.meta.request = false;
        msg.meta.push = req.push;
        msg.meta.pull = req.pull;
        msg.meta.head = req.cmd;
        msg.meta.priority = req.priority;
        msg.meta.timestamp = req.timestamp;
        msg.meta.recver = req.sender;
        if !res.keys.is_empty() || !res.vals.is_empty() {
            let (mut frames, types) = res.to_frames();
            // A pslite worker's pull that knows its keys: the answer
            // leaves them out when they are the request's (a third of a
            // pull's bytes, or half of the answer's for f32 values).
            let same = req.compression.is_none()
                && req.same_keys.as_ref().is_some_and(|k| {
                    (k.0.as_ptr() == res.keys.as_ptr() && k.0.len() == res.keys.len())
                        || k.0 == res.keys
                });
            if same {
                frames[0] = bytes::Bytes::new();
                msg.meta.same_keys = true;
            }
            msg.data = frames;
            msg.meta.data_type = types;
            // The worker asked for its answer compressed (it reads them).
            if let Some(c) = &req.compression {
                self.inner()
                    .answer_feedback
                    .compress::<V>(c, req.sender, &mut msg, &res.keys, &res.lens);
            }
        }
        msg
    }

    /// The app id.
    pub fn app_id(&self) -> i32 {
        self.inner().app_id
    }
}

impl<V: Val> Inner<V> {
    /// Runs `work`'s handle. The Postoffice delivers nothing before its
    /// handle is set ([`Handles::ready`]); should it, a request is refused.
    fn run(&self, customer: &Arc<Customer<Self>>, work: Work<V>) {
        let server = KVServer {
            customer: Arc::clone(customer),
        };
        let mut handles = lock(&self.handles);
        if handles.ready_for(&work) {
            server.dispatch(&mut handles, work);
            return;
        }
        drop(handles);
        let reason = format!("KVServer app {} has no handle for it yet", self.app_id);
        error!("{reason}");
        let meta = match &work {
            Work::Kv(meta, _) => request_meta(meta),
            Work::Simple(data) => simple_meta(self.app_id, data),
            Work::Snapshot { .. } | Work::Restore { .. } => return,
        };
        let refusal = Refusal::Other {
            app: self.app_id,
            reason,
        };
        crate::refusal::refuse(&self.po, &meta, refusal);
    }
}

/// The meta of the request message `req` was read from (as much of it as
/// an answer echoes).
fn request_meta(req: &KVMeta) -> Meta {
    Meta {
        app_id: req.app_id,
        customer_id: req.customer_id,
        request: true,
        push: req.push,
        pull: req.pull,
        head: req.cmd,
        priority: req.priority,
        timestamp: req.timestamp,
        sender: req.sender,
        ..Meta::default()
    }
}

/// The meta of SimpleApp request `req` to app `app_id`.
fn simple_meta(app_id: i32, req: &SimpleData) -> Meta {
    Meta {
        app_id,
        customer_id: req.customer_id,
        request: true,
        simple_app: true,
        head: req.head,
        timestamp: req.timestamp,
        sender: req.sender,
        ..Meta::default()
    }
}

impl<V: Val> Handler for Inner<V> {
    type Payload = ();

    fn on_request(&self, customer: &Arc<Customer<Self>>, mut msg: Message) {
        // Compressed values (a pslite worker that knows this server reads
        // them): the handle sees them decompressed.
        let expanded = crate::compression::expand::<V>(&mut msg);
        let refuse = |refusal| crate::refusal::refuse(&self.po, &msg.meta, refusal);
        if let Err(e) = expanded {
            refuse(Refusal::Other {
                app: self.app_id,
                reason: format!("its compressed values cannot be read: {e}"),
            });
            return;
        }
        let req = if msg.meta.simple_app {
            Work::Simple(SimpleData::of(&msg))
        } else {
            // The values frame's type (a pull sends an empty one, typed too).
            if let Some(&sent) = msg.meta.data_type.get(1).filter(|&&t| !accepts::<V>(t)) {
                refuse(Refusal::DataType {
                    app: self.app_id,
                    held: V::DATA_TYPE,
                    sent,
                });
                return;
            }
            match KVPairs::<V>::from_message(&msg) {
                Ok(kvs) if msg.meta.push && kvs.vals.is_empty() && !kvs.keys.is_empty() => {
                    refuse(Refusal::Other {
                        app: self.app_id,
                        reason: "a push without values".into(),
                    });
                    return;
                }
                Ok(kvs) => Work::Kv(KVMeta::with_keys(&msg, Some(&kvs.keys)), kvs),
                Err(e) => {
                    refuse(Refusal::Other {
                        app: self.app_id,
                        reason: e.to_string(),
                    });
                    return;
                }
            }
        };
        self.run(customer, req);
    }

    fn on_response(&self, msg: &Message, _payload: &mut ()) -> bool {
        if msg.meta.simple_app {
            return true; // the answer to a command this server sent
        }
        warn!(
            "KVServer app {} dropping a KV response from node {}: servers send no KV requests",
            self.app_id, msg.meta.sender
        );
        false
    }

    fn on_complete(
        &self,
        _ts: i32,
        _payload: &mut (),
        _failure: Option<pslite_postoffice::Failure>,
    ) {
    }

    fn on_snapshot(&self, customer: &Arc<Customer<Self>>, token: u64, begin: u64, end: u64) {
        self.run(customer, Work::Snapshot { token, begin, end });
    }

    fn on_restore(
        &self,
        customer: &Arc<Customer<Self>>,
        token: u64,
        begin: u64,
        end: u64,
        data: bytes::Bytes,
    ) {
        self.run(
            customer,
            Work::Restore {
                token,
                begin,
                end,
                data,
            },
        );
    }

    fn handles_inline(&self, msg: &Message, _payload: Option<&()>) -> bool {
        msg.meta.request && !msg.meta.simple_app && self.inline.load(Ordering::Relaxed)
    }
}

mod concurrent;
pub use concurrent::ConcurrentHandle;
use concurrent::{OnEngine, Unchecked};

mod default_handle;
pub use default_handle::DefaultHandle;
