//! A customer: one app instance's mailbox and request tracker.
//!
//! Each customer (app id, customer id) registers with the Postoffice and
//! gets a queue of the data messages addressed to it, served by a thread of
//! its own that calls the app's [`Handler`]. Requests the app sends are
//! tracked by timestamp: how many responses are expected and how many have
//! arrived, so [`Customer::wait`] returns when the last one is in (after the
//! app has handled it), or fails on its deadline or when the node fails.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use log::warn;
use pslite_postoffice::{Counters, Delivery, Inline, Postoffice};
use pslite_proto::Message;

use crate::Error;

/// What an app does with the messages its customer receives. Runs on the
/// customer's thread, one message at a time.
pub trait Handler: Send + Sync + 'static {
    /// A request from another node.
    fn on_request(&self, msg: Message);
    /// A response to one of this customer's requests, before it is counted.
    fn on_response(&self, msg: Message);
    /// Every response of request `ts` has arrived (or it failed with
    /// `failure`); runs before `wait(ts)` returns.
    fn on_complete(&self, ts: i32, failure: Option<String>);

    /// Whether `msg` may be handled on the receive thread, skipping the
    /// customer's thread: for cheap work that never blocks (responses a
    /// worker only counts, or requests whose app asked for it). Default: no.
    fn handles_inline(&self, msg: &Message) -> bool {
        let _ = msg;
        false
    }
}

struct Request {
    expected: usize,
    received: usize,
    done: bool,
    failed: Option<String>,
}

#[derive(Default)]
struct Requests {
    next_ts: i32,
    open: HashMap<i32, Request>,
    failure: Option<String>,
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
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
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
    fn force_complete(&self, ts: i32, reason: &str) -> bool {
        match self.lock().open.get_mut(&ts) {
            Some(req) if !req.done && req.failed.is_none() => {
                req.expected = req.received;
                req.failed = Some(reason.to_string());
                true
            }
            _ => false,
        }
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
    pub fn fail(&self, reason: String) {
        self.lock().failure.get_or_insert(reason);
        self.changed.notify_all();
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
        let inline: Inline = Arc::new(move |msg: Message| {
            let Some(handler) = inline_handler.upgrade() else {
                return Some(msg);
            };
            if !handler.handles_inline(&msg) {
                return Some(msg);
            }
            if msg.meta.request {
                handler.on_request(msg);
                return None;
            }
            let ts = msg.meta.timestamp;
            handler.on_response(msg);
            if inline_tracker.add_response(ts) {
                handler.on_complete(ts, None);
                inline_tracker.finish(ts);
            }
            None
        });
        let queue = po.register_customer_inline(app_id, customer_id, inline)?;
        let thread_tracker = Arc::clone(&tracker);
        let spawned = std::thread::Builder::new()
            .name(format!("pslite-app{app_id}-customer{customer_id}"))
            .spawn(move || {
                for delivery in queue {
                    let Some(handler) = handler.upgrade() else {
                        break;
                    };
                    let msg = match delivery {
                        Delivery::Message(msg) => msg,
                        Delivery::Undeliverable { msg, reason } => {
                            if msg.meta.request {
                                let ts = msg.meta.timestamp;
                                if thread_tracker.force_complete(ts, &reason) {
                                    handler.on_complete(ts, Some(reason));
                                    thread_tracker.finish(ts);
                                }
                            } else {
                                warn!("{reason}");
                            }
                            continue;
                        }
                        Delivery::NodeFailed(reason) => {
                            thread_tracker.fail(reason);
                            continue;
                        }
                    };
                    if msg.meta.request {
                        handler.on_request(msg);
                        continue;
                    }
                    let ts = msg.meta.timestamp;
                    handler.on_response(msg);
                    if thread_tracker.add_response(ts) {
                        handler.on_complete(ts, None);
                        thread_tracker.finish(ts);
                    }
                }
            });
        let thread = match spawned {
            Ok(t) => t,
            Err(e) => {
                po.unregister_customer(app_id, customer_id);
                return Err(Error::Failed(format!(
                    "cannot start a customer thread: {e}"
                )));
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

    /// Starts tracking a new request that expects `expected` responses and
    /// returns its timestamp. A request expecting none is complete at once.
    pub fn new_request(&self, expected: usize) -> i32 {
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
            },
        );
        ts
    }

    /// Marks request `ts` as failed: it completes now, with `reason`.
    pub fn fail_request(&self, ts: i32, reason: String, handler: &dyn Handler) {
        if self.tracker.force_complete(ts, &reason) {
            handler.on_complete(ts, Some(reason));
            self.tracker.finish(ts);
        }
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
        self.wait_until(ts, Some((Instant::now() + timeout, timeout)))
    }

    fn wait_until(&self, ts: i32, deadline: Option<(Instant, Duration)>) -> Result<(), Error> {
        let mut r = self.tracker.lock();
        loop {
            match r.open.get(&ts) {
                None if ts >= 0 && ts < r.next_ts => return Ok(()), // waited before
                None => return Err(Error::UnknownTimestamp(ts)),
                Some(req) if req.done => {
                    let failed = r.open.remove(&ts).and_then(|req| req.failed);
                    return match failed {
                        Some(reason) => Err(Error::RequestFailed { ts, reason }),
                        None => Ok(()),
                    };
                }
                Some(_) => {}
            }
            if let Some(reason) = &r.failure {
                return Err(Error::RequestFailed {
                    ts,
                    reason: reason.clone(),
                });
            }
            r = match deadline {
                None => self
                    .tracker
                    .changed
                    .wait(r)
                    .unwrap_or_else(|e| e.into_inner()),
                Some((deadline, timeout)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::Timeout {
                            ts,
                            secs: timeout.as_secs_f64(),
                        });
                    }
                    self.tracker
                        .changed
                        .wait_timeout(r, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
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
        self.tracker.fail("the app was dropped".into());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((id, handle)) = thread {
            // Dropped from its own thread (the app's last handle went away
            // inside a handler): the thread ends by itself.
            if id != std::thread::current().id() && handle.join().is_err() {
                warn!("customer thread of app {} panicked", self.app_id);
            }
        }
    }
}
