//! A customer: one app instance's mailbox and request tracker.
//!
//! Each customer (app id, customer id) registers with the Postoffice and
//! gets a queue of the data messages addressed to it, served by a thread of
//! its own that calls the app's [`Handler`]. Requests the app sends are
//! tracked by timestamp: how many responses are expected and how many have
//! arrived, so [`Customer::wait`] returns when the last one is in (after the
//! app has handled it), or fails on its deadline or when the node fails.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use log::{error, warn};
use pslite_postoffice::{Counters, Delivery, Inline, Postoffice};
use pslite_proto::{lock, wait_timeout_while, wait_while, Message, NodeId, K_EMPTY};
use pslite_van::Failure;

use crate::Error;

/// What an app does with the messages its customer receives. Runs on the
/// customer's thread, one message at a time.
///
/// A panic in any of these fails the request concerned with
/// [`Failure::HandlerPanicked`]; the customer goes on.
pub trait Handler: Send + Sync + 'static {
    /// A request from another node.
    fn on_request(&self, msg: Message);
    /// A response to one of this customer's requests, from a node it was
    /// sent to, before it is counted. Returns false to drop it uncounted
    /// (it does not belong to the request).
    fn on_response(&self, msg: Message) -> bool;
    /// Every response of request `ts` has arrived (or it failed with
    /// `failure`); runs before `wait(ts)` returns.
    fn on_complete(&self, ts: i32, failure: Option<Failure>);

    /// Whether `msg` may be handled on the receive thread, skipping the
    /// customer's thread: for cheap work that never blocks (responses a
    /// worker only counts, or requests whose app asked for it). Default: no.
    fn handles_inline(&self, msg: &Message) -> bool {
        let _ = msg;
        false
    }
}

/// The message of a caught panic.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

struct Request {
    expected: usize,
    received: usize,
    done: bool,
    failed: Option<Failure>,
    /// The nodes that still owe a response (`None`: not tracked).
    waiting_on: Option<Vec<NodeId>>,
}

#[derive(Default)]
struct Requests {
    next_ts: i32,
    open: HashMap<i32, Request>,
    failure: Option<Failure>,
}

/// The request tracker, shared by the customer's thread and its users.
pub struct Tracker {
    requests: Mutex<Requests>,
    changed: Condvar,
    /// The node's counters: requests in flight.
    counters: Arc<Counters>,
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, Requests> {
        lock(&self.requests)
    }

    /// Whether a response from `sender` belongs to open request `ts` (sent
    /// to that node and not answered by it yet); records it if so.
    fn accept_response(&self, ts: i32, sender: NodeId) -> bool {
        let mut r = self.lock();
        let Some(req) = r.open.get_mut(&ts) else {
            return false;
        };
        if req.done || req.failed.is_some() {
            return false;
        }
        match &mut req.waiting_on {
            None => true,
            Some(owing) => match owing.iter().position(|&id| id == sender) {
                Some(i) => {
                    owing.swap_remove(i);
                    true
                }
                None => false,
            },
        }
    }

    /// Counts one response to `ts`; true if that completed it.
    fn add_response(&self, ts: i32) -> bool {
        let mut r = self.lock();
        match r.open.get_mut(&ts) {
            Some(req) if !req.done && req.failed.is_none() => {
                req.received += 1;
                req.received >= req.expected
            }
            _ => false,
        }
    }

    /// Ends request `ts` early because it failed; true if it was open.
    fn force_complete(&self, ts: i32, failure: &Failure) -> bool {
        match self.lock().open.get_mut(&ts) {
            Some(req) if !req.done && req.failed.is_none() => {
                req.expected = req.received;
                req.failed = Some(failure.clone());
                true
            }
            _ => false,
        }
    }

    /// Open requests that still wait for node `id`.
    fn waiting_on(&self, id: NodeId) -> Vec<i32> {
        self.lock()
            .open
            .iter()
            .filter(|(_, req)| !req.done && req.failed.is_none())
            .filter(|(_, req)| req.waiting_on.as_ref().is_some_and(|o| o.contains(&id)))
            .map(|(&ts, _)| ts)
            .collect()
    }

    fn finish(&self, ts: i32) {
        if let Some(req) = self.lock().open.get_mut(&ts) {
            if !req.done {
                self.counters.request_done();
            }
            req.done = true;
        }
        self.changed.notify_all();
    }

    /// Fails every open and future wait.
    pub fn fail(&self, failure: Failure) {
        self.lock().failure.get_or_insert(failure);
        self.changed.notify_all();
    }
}

/// Fails request `ts` with `failure` (if still open) and completes it.
fn fail_request(tracker: &Tracker, handler: &dyn Handler, ts: i32, failure: Failure) {
    if tracker.force_complete(ts, &failure) {
        let complete = catch_unwind(AssertUnwindSafe(|| {
            handler.on_complete(ts, Some(failure));
        }));
        if let Err(payload) = complete {
            error!(
                "the completion handler of request {ts} panicked: {}",
                panic_message(&*payload)
            );
        }
        tracker.finish(ts);
    }
}

/// Handles one response: checks that it belongs to its request, lets the
/// app see it and completes the request with its last response. A panic in
/// the app fails the request.
fn on_response(
    tracker: &Tracker,
    handler: &dyn Handler,
    msg: Message,
    me: impl FnOnce() -> NodeId,
) {
    let ts = msg.meta.timestamp;
    let sender = msg.meta.sender;
    if !tracker.accept_response(ts, sender) {
        warn!("dropping a response from node {sender} to request {ts}, which was not sent to it or is over");
        return;
    }
    if let Some(message) = msg.meta.handler_panic.clone() {
        let failure = Failure::HandlerPanicked {
            node: sender,
            message: message.into(),
        };
        fail_request(tracker, handler, ts, failure);
        return;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if handler.on_response(msg) && tracker.add_response(ts) {
            handler.on_complete(ts, None);
            tracker.finish(ts);
        }
    }));
    if let Err(payload) = outcome {
        let message = panic_message(&*payload);
        error!("a handler of request {ts} panicked: {message}");
        let failure = Failure::HandlerPanicked {
            node: me(),
            message,
        };
        if !tracker.force_complete(ts, &failure) {
            // It panicked completing: the request is over, and failed.
            if let Some(req) = tracker.lock().open.get_mut(&ts) {
                req.failed = Some(failure);
            }
        }
        tracker.finish(ts);
    }
}

/// Handles one request; a panic is logged and the customer goes on (apps
/// that answer requests report the panic to the requester themselves).
fn on_request(handler: &dyn Handler, msg: Message) {
    let sender = msg.meta.sender;
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| handler.on_request(msg))) {
        error!(
            "the handler of a request from node {sender} panicked: {}",
            panic_message(&*payload)
        );
    }
}

/// One app instance's mailbox, thread and request tracker.
pub struct Customer {
    app_id: i32,
    customer_id: i32,
    po: Postoffice,
    tracker: Arc<Tracker>,
    thread: Mutex<Option<(ThreadId, JoinHandle<()>)>>,
}

impl Customer {
    /// Registers (app_id, customer_id) and starts its thread, which calls
    /// `handler` for every message until the customer is dropped.
    pub fn new(
        po: &Postoffice,
        app_id: i32,
        customer_id: i32,
        handler: Weak<dyn Handler>,
    ) -> Result<Customer, Error> {
        let tracker = Arc::new(Tracker {
            requests: Mutex::default(),
            changed: Condvar::new(),
            counters: Arc::clone(po.counters_handle()),
        });
        let inline_tracker = Arc::clone(&tracker);
        let inline_handler = handler.clone();
        // Responses the app can take on the receive thread save a thread
        // hop (and its wake-up latency) on every request.
        let inline_po = po.clone();
        let inline: Inline = Arc::new(move |msg: Message| {
            let Some(handler) = inline_handler.upgrade() else {
                return Some(msg);
            };
            if !handler.handles_inline(&msg) {
                return Some(msg);
            }
            if msg.meta.request {
                on_request(&*handler, msg);
            } else {
                let me = || inline_po.my_id().unwrap_or(K_EMPTY);
                on_response(&inline_tracker, &*handler, msg, me);
            }
            None
        });
        let queue = po.register_customer_inline(app_id, customer_id, inline)?;
        let thread_tracker = Arc::clone(&tracker);
        let thread_po = po.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("pslite-app{app_id}-customer{customer_id}"))
            .spawn(move || {
                for delivery in queue {
                    let Some(handler) = handler.upgrade() else {
                        break;
                    };
                    let tracker = &*thread_tracker;
                    match delivery {
                        Delivery::Message(msg) if msg.meta.request => on_request(&*handler, msg),
                        Delivery::Message(msg) => {
                            let me = || thread_po.my_id().unwrap_or(K_EMPTY);
                            on_response(tracker, &*handler, msg, me);
                        }
                        Delivery::Undeliverable { msg, failure } => {
                            if msg.meta.request {
                                fail_request(tracker, &*handler, msg.meta.timestamp, failure);
                            } else {
                                warn!("{failure}");
                            }
                        }
                        Delivery::PeerDead { id, failure } => {
                            for ts in tracker.waiting_on(id) {
                                fail_request(tracker, &*handler, ts, failure.clone());
                            }
                        }
                        Delivery::NodeFailed(failure) => tracker.fail(failure),
                    }
                }
            });
        let thread = match spawned {
            Ok(t) => t,
            Err(e) => {
                po.unregister_customer(app_id, customer_id);
                return Err(Error::App(format!("cannot start a customer thread: {e}")));
            }
        };
        Ok(Customer {
            app_id,
            customer_id,
            po: po.clone(),
            tracker,
            thread: Mutex::new(Some((thread.thread().id(), thread))),
        })
    }

    /// The app id.
    pub fn app_id(&self) -> i32 {
        self.app_id
    }

    /// The customer id.
    pub fn customer_id(&self) -> i32 {
        self.customer_id
    }

    /// The Postoffice it is registered with.
    pub fn postoffice(&self) -> &Postoffice {
        &self.po
    }

    /// Starts tracking a new request that expects `expected` responses, from
    /// any node, and returns its timestamp. A request expecting none is
    /// complete at once.
    pub fn new_request(&self, expected: usize) -> i32 {
        self.track(expected, None)
    }

    /// Starts tracking a new request sent to `recvers`, one response each:
    /// responses from other nodes are dropped, and the request fails if one
    /// of them dies unreplaced. Returns its timestamp.
    pub fn new_request_to(&self, recvers: &[NodeId]) -> i32 {
        self.track(recvers.len(), Some(recvers.to_vec()))
    }

    fn track(&self, expected: usize, waiting_on: Option<Vec<NodeId>>) -> i32 {
        let mut r = self.tracker.lock();
        let ts = r.next_ts;
        r.next_ts = r.next_ts.wrapping_add(1) & i32::MAX;
        if expected > 0 {
            self.tracker.counters.request_started();
        }
        r.open.insert(
            ts,
            Request {
                expected,
                received: 0,
                done: expected == 0,
                failed: None,
                waiting_on,
            },
        );
        ts
    }

    /// Marks request `ts` as failed: it completes now, with `failure`.
    pub fn fail_request(&self, ts: i32, failure: Failure, handler: &dyn Handler) {
        fail_request(&self.tracker, handler, ts, failure);
    }

    /// How many responses request `ts` has received.
    pub fn num_responses(&self, ts: i32) -> usize {
        self.tracker.lock().open.get(&ts).map_or(0, |r| r.received)
    }

    /// Waits until request `ts` has all its responses.
    pub fn wait(&self, ts: i32) -> Result<(), Error> {
        self.wait_until(ts, None)
    }

    /// Waits until request `ts` has all its responses, at most `timeout`.
    pub fn wait_timeout(&self, ts: i32, timeout: Duration) -> Result<(), Error> {
        self.wait_until(ts, Some(timeout))
    }

    fn wait_until(&self, ts: i32, timeout: Option<Duration>) -> Result<(), Error> {
        // Waiting ends once the request is over (or unknown) or the node failed.
        let waiting =
            |r: &mut Requests| r.failure.is_none() && r.open.get(&ts).is_some_and(|req| !req.done);
        let changed = &self.tracker.changed;
        let mut r = match timeout {
            None => wait_while(changed, self.tracker.lock(), waiting),
            Some(timeout) => {
                let (r, timed_out) =
                    wait_timeout_while(changed, self.tracker.lock(), timeout, waiting);
                if timed_out {
                    return Err(Error::Timeout {
                        ts,
                        secs: timeout.as_secs_f64(),
                    });
                }
                r
            }
        };
        match r.open.get(&ts) {
            None if ts >= 0 && ts < r.next_ts => Ok(()), // waited before
            None => Err(Error::UnknownTimestamp(ts)),
            Some(req) if req.done => match r.open.remove(&ts).and_then(|req| req.failed) {
                Some(cause) => Err(Error::RequestFailed { ts, cause }),
                None => Ok(()),
            },
            Some(_) => Err(Error::RequestFailed {
                ts,
                cause: r.failure.clone().unwrap_or(Failure::Stopped),
            }),
        }
    }

    /// The tracker (to fail waits from elsewhere).
    pub fn tracker(&self) -> &Arc<Tracker> {
        &self.tracker
    }
}

impl Drop for Customer {
    fn drop(&mut self) {
        self.po.unregister_customer(self.app_id, self.customer_id);
        self.tracker.fail(Failure::AppDropped);
        let thread = lock(&self.thread).take();
        if let Some((id, handle)) = thread {
            // Dropped from its own thread (the app's last handle went away
            // inside a handler): the thread ends by itself.
            if id != std::thread::current().id() && handle.join().is_err() {
                warn!("customer thread of app {} panicked", self.app_id);
            }
        }
    }
}
