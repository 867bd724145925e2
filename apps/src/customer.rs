//! A customer: one app instance's mailbox, thread and requests.
//!
//! Each customer (app id, customer id) registers with the Postoffice and
//! gets a queue of the data messages addressed to it, served by a thread of
//! its own that calls the app's [`Handler`]. The requests the app sends are
//! records of its [`RequestTable`](crate::request): one per request, holding
//! the app's own part of it (the handler's [`Handler::Payload`]). Sending
//! one returns a [`Request`] handle to wait on; [`Customer::wait`] by
//! timestamp does the same, as in ps-lite. A wait returns when the last
//! response is in (after the app has handled it), or fails on its deadline
//! or when the node fails.
//!
//! The customer's thread is also the table's clock: it wakes at the table's
//! next deadline and logs the requests that have waited too long for an
//! answer (`PS_REQUEST_WARN`), naming the nodes that owe it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use log::{error, warn};
use pslite_postoffice::Failure;
use pslite_postoffice::{Counters, CustomerQueue, Delivery, Inline, Postoffice, Ready};
use pslite_proto::{ids, lock, Message, NodeId, K_EMPTY};

use crate::request::{Answer, Completion, Outcome, Overdue, RequestTable};
use crate::Error;

mod handler;
pub use handler::{panic_message, Handler};

/// The request table and what waits on it, shared by a customer, its
/// thread and the handles of its requests.
struct Shared<P> {
    table: Mutex<RequestTable<P>>,
    changed: Condvar,
    holds_result: fn(&P) -> bool,
}

impl<P> Shared<P> {
    fn table(&self) -> MutexGuard<'_, RequestTable<P>> {
        lock(&self.table)
    }

    /// Waits (at most `timeout`) until request `ts` is over and collects
    /// it (see [`RequestTable::collect`]).
    fn collect(
        &self,
        ts: i32,
        timeout: Option<Duration>,
        take: bool,
    ) -> Result<Option<Outcome<P>>, Error> {
        let table = self.table();
        let pending = |t: &mut RequestTable<P>| !t.is_settled(ts);
        let mut table = match timeout {
            None => self
                .changed
                .wait_while(table, pending)
                .unwrap_or_else(PoisonError::into_inner),
            Some(timeout) => {
                self.changed
                    .wait_timeout_while(table, timeout, pending)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
        };
        table
            .collect(ts, take, self.holds_result)
            .unwrap_or_else(|| {
                Err(Error::Timeout {
                    ts,
                    secs: timeout.unwrap_or_default().as_secs_f64(),
                })
            })
    }

    /// Waits for request `ts`: its failure is the error.
    fn wait(&self, ts: i32, timeout: Option<Duration>) -> Result<(), Error> {
        let outcome = self.collect(ts, timeout, false)?;
        match outcome.and_then(|o| o.failure) {
            Some(cause) => Err(Error::RequestFailed { ts, cause }),
            None => Ok(()),
        }
    }

    /// Waits for request `ts` and hands over its payload (`None`:
    /// collected before); its failure is the error.
    fn take(&self, ts: i32, timeout: Option<Duration>) -> Result<Option<P>, Error> {
        match self.collect(ts, timeout, true)? {
            Some(Outcome {
                failure: Some(cause),
                ..
            }) => Err(Error::RequestFailed { ts, cause }),
            outcome => Ok(outcome.and_then(|o| o.payload)),
        }
    }
}

/// What a handle keeps of its request once a wait collected the record.
struct Collected {
    failure: Option<Failure>,
    responses: usize,
}

/// A request a customer sent: its timestamp, and the means to wait for it.
///
/// Wait on it as often as needed. Dropping it gives up on the request: its
/// record goes once the request completes (a failure nobody waited for is
/// logged), and a later wait by its timestamp returns at once. To wait by
/// timestamp, as in ps-lite, turn the handle into it
/// ([`Request::into_ts`], or pass the handle where a timestamp goes:
/// `app.wait(app.request(..)?)`).
#[must_use = "a request handle that is dropped gives up on its request: wait() on it, or keep into_ts()"]
pub struct Request<P = ()> {
    ts: i32,
    shared: Arc<Shared<P>>,
    /// The outcome, once a wait collected the record (the record is gone).
    collected: OnceLock<Collected>,
    /// Whether dropping the handle gives up on the request.
    detach: bool,
}

impl<P> Request<P> {
    fn new(ts: i32, shared: Arc<Shared<P>>) -> Self {
        Request {
            ts,
            shared,
            collected: OnceLock::new(),
            detach: true,
        }
    }

    /// The request's timestamp (for logs; see [`Request::into_ts`] to
    /// wait by it).
    pub fn ts(&self) -> i32 {
        self.ts
    }

    /// Waits until the request has completed.
    pub fn wait(&self) -> Result<(), Error> {
        self.wait_until(None)
    }

    /// [`Request::wait`] with a deadline: [`Error::Timeout`] when it
    /// passes, and the request goes on (wait again).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<(), Error> {
        self.wait_until(Some(timeout))
    }

    fn wait_until(&self, timeout: Option<Duration>) -> Result<(), Error> {
        if self.collected.get().is_none() {
            match self.shared.collect(self.ts, timeout, false)? {
                // The record went: keep what a later wait returns.
                Some(Outcome {
                    failure,
                    responses,
                    payload: Some(_),
                }) => {
                    let _ = self.collected.set(Collected { failure, responses });
                }
                Some(Outcome { failure, .. }) => {
                    return failure.map_or(Ok(()), |cause| {
                        Err(Error::RequestFailed { ts: self.ts, cause })
                    })
                }
                None => return Ok(()), // collected by timestamp before
            }
        }
        match self.collected.get().and_then(|c| c.failure.clone()) {
            Some(cause) => Err(Error::RequestFailed { ts: self.ts, cause }),
            None => Ok(()),
        }
    }

    /// How many responses the request has received.
    pub fn num_responses(&self) -> usize {
        match self.collected.get() {
            Some(c) => c.responses,
            None => self.shared.table().num_responses(self.ts),
        }
    }

    /// The request's timestamp, giving up the handle: the request stays
    /// until waited for by timestamp (ps-lite's way).
    pub fn into_ts(mut self) -> i32 {
        self.detach = false;
        self.ts
    }

    /// Waits and hands over the request's payload (`None`: collected
    /// before).
    pub(crate) fn take_payload(&self, timeout: Option<Duration>) -> Result<Option<P>, Error> {
        if let Some(c) = self.collected.get() {
            return match &c.failure {
                Some(cause) => Err(Error::RequestFailed {
                    ts: self.ts,
                    cause: cause.clone(),
                }),
                None => Ok(None),
            };
        }
        self.shared.take(self.ts, timeout)
    }
}

impl<P> From<Request<P>> for i32 {
    fn from(request: Request<P>) -> i32 {
        request.into_ts()
    }
}

impl<P> Drop for Request<P> {
    fn drop(&mut self) {
        if self.detach && self.collected.get().is_none() {
            self.shared.table().detach(self.ts);
        }
    }
}

impl<P> std::fmt::Debug for Request<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("ts", &self.ts).finish()
    }
}

/// One app instance's mailbox, thread and requests; the app's [`Handler`]
/// lives inside it.
pub struct Customer<H: Handler> {
    app_id: i32,
    customer_id: i32,
    po: Postoffice,
    handler: H,
    shared: Arc<Shared<H::Payload>>,
    /// The node's counters: requests in flight.
    counters: Arc<Counters>,
    /// `PS_REQUEST_WARN`.
    warn_after: Duration,
    /// Set once the customer is registered and its thread runs.
    thread: Mutex<Option<(ThreadId, JoinHandle<()>)>>,
}

impl<H: Handler> Customer<H> {
    /// Registers (app_id, customer_id) with `po` and starts its thread,
    /// which calls `handler` for every message until the customer is
    /// dropped. What `ready` does not take yet waits in the Postoffice
    /// until [`Customer::set_ready`].
    pub fn new(
        po: &Postoffice,
        app_id: i32,
        customer_id: i32,
        handler: H,
        ready: Ready,
    ) -> Result<Arc<Customer<H>>, Error> {
        let warn_after = po.config().request_warn;
        let customer = Arc::new(Customer {
            app_id,
            customer_id,
            po: po.clone(),
            handler,
            shared: Arc::new(Shared {
                table: Mutex::new(RequestTable::new(warn_after)),
                changed: Condvar::new(),
                holds_result: H::holds_result,
            }),
            counters: Arc::clone(po.counters_handle()),
            warn_after,
            thread: Mutex::new(None),
        });
        // Responses the app can take on the receive thread save a thread
        // hop (and its wake-up latency) on every request.
        let weak = Arc::downgrade(&customer);
        let inline: Inline = Arc::new(move |msg: Message| match weak.upgrade() {
            Some(customer) => customer.inline(msg),
            None => Some(msg),
        });
        let queue = po.register_customer_inline(app_id, customer_id, inline, ready)?;
        let weak = Arc::downgrade(&customer);
        let spawned = std::thread::Builder::new()
            .name(format!("pslite-app{app_id}-customer{customer_id}"))
            .spawn(move || serve(weak, queue, warn_after));
        match spawned {
            Ok(thread) => *lock(&customer.thread) = Some((thread.thread().id(), thread)),
            Err(e) => {
                po.unregister_customer(app_id, customer_id);
                return Err(Error::App(format!("cannot start a customer thread: {e}")));
            }
        }
        Ok(customer)
    }

    /// The customer now takes what `ready` says (the app set a handle):
    /// what waited for it in the Postoffice comes, in order.
    pub fn set_ready(&self, ready: Ready) {
        self.po.customer_ready(self.app_id, self.customer_id, ready);
    }

    /// How many messages wait in the Postoffice for this customer.
    pub fn waiting(&self) -> usize {
        self.po.held_for(self.app_id, self.customer_id)
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

    /// The app's handler.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// Starts a request that expects `expected` responses, from any node,
    /// keeping `payload` in its record. A request expecting none is
    /// complete at once.
    pub fn new_request(&self, expected: usize, payload: H::Payload) -> Request<H::Payload> {
        self.open(None, expected, payload)
    }

    /// Starts a request sent to `recvers`, one response each, keeping
    /// `payload` in its record: responses from other nodes are dropped, and
    /// the request fails if one of them dies unreplaced. Register it before
    /// sending: responses can arrive at once.
    pub fn new_request_to(&self, recvers: &[NodeId], payload: H::Payload) -> Request<H::Payload> {
        self.open(Some(recvers), 0, payload)
    }

    fn open(
        &self,
        recvers: Option<&[NodeId]>,
        expected: usize,
        payload: H::Payload,
    ) -> Request<H::Payload> {
        let in_flight = recvers.map_or(expected, <[NodeId]>::len) > 0;
        if in_flight {
            self.counters.request_started();
        }
        let (ts, completion) = self
            .shared
            .table()
            .open(recvers, expected, payload, Instant::now());
        if let Some(completion) = completion {
            self.complete(completion);
        }
        Request::new(ts, Arc::clone(&self.shared))
    }

    /// A further timestamp for open request `ts`, for one more message of
    /// it to a node its receivers name once per message: responses and
    /// failures under it count for `ts`; `None` if `ts` is not open. Take it
    /// before sending that message.
    pub fn alias(&self, ts: i32) -> Option<i32> {
        self.shared.table().alias(ts)
    }

    /// Fails request `ts` with `failure`, if it is still open: it completes
    /// now.
    pub fn fail_request(&self, ts: i32, failure: Failure) {
        let completion = self.shared.table().fail(ts, failure);
        if let Some(completion) = completion {
            self.complete(completion);
        }
    }

    /// How many responses request `ts` has received.
    pub fn num_responses(&self, ts: i32) -> usize {
        self.shared.table().num_responses(ts)
    }

    /// Waits until request `ts` has all its responses.
    pub fn wait(&self, ts: i32) -> Result<(), Error> {
        self.shared.wait(ts, None)
    }

    /// Waits until request `ts` has all its responses, at most `timeout`.
    pub fn wait_timeout(&self, ts: i32, timeout: Duration) -> Result<(), Error> {
        self.shared.wait(ts, Some(timeout))
    }

    /// Waits (at most `timeout`, if given) until request `ts` is over and
    /// hands over its payload; `None` if it was collected before.
    pub fn take(&self, ts: i32, timeout: Option<Duration>) -> Result<Option<H::Payload>, Error> {
        self.shared.take(ts, timeout)
    }

    /// Fails every open and future wait.
    pub fn fail_all(&self, failure: Failure) {
        self.shared.table().fail_node(failure);
        self.shared.changed.notify_all();
    }

    fn my_id(&self) -> NodeId {
        self.po.my_id().unwrap_or(K_EMPTY)
    }

    /// A message on the receive thread: handled here if the app takes it
    /// inline, else given back to be queued.
    fn inline(self: &Arc<Self>, msg: Message) -> Option<Message> {
        if !msg.meta.request {
            return self.on_response(msg, true);
        }
        if !self.handler.handles_inline(&msg, None) {
            return Some(msg);
        }
        self.on_request(msg);
        None
    }

    /// One delivery from the customer's queue.
    fn deliver(self: &Arc<Self>, delivery: Delivery) {
        match delivery {
            Delivery::Message(msg) if msg.meta.request => self.on_request(msg),
            Delivery::Message(msg) => {
                // Off the receive thread, every response is taken.
                let _ = self.on_response(msg, false);
            }
            Delivery::Undeliverable { msg, failure } => {
                if msg.meta.request {
                    self.fail_request(msg.meta.timestamp, failure);
                } else {
                    warn!("{failure}");
                }
            }
            Delivery::PeerDead { id, failure } => {
                let waiting = self.shared.table().waiting_on(id);
                for ts in waiting {
                    self.fail_request(ts, failure.clone());
                }
            }
            Delivery::NodeFailed(failure) => self.fail_all(failure),
            Delivery::Snapshot { token, begin, end } => {
                self.handler.on_snapshot(self, token, begin, end)
            }
            Delivery::Restore {
                token,
                begin,
                end,
                data,
            } => self.handler.on_restore(self, token, begin, end, data),
        }
    }

    /// Handles one request; a panic is logged and the customer goes on
    /// (apps that answer requests report the panic to the requester
    /// themselves).
    fn on_request(self: &Arc<Self>, msg: Message) {
        let sender = msg.meta.sender;
        let handled = catch_unwind(AssertUnwindSafe(|| self.handler.on_request(self, msg)));
        if let Err(payload) = handled {
            error!(
                "the handler of a request from node {sender} panicked: {}",
                panic_message(&*payload)
            );
        }
    }

    /// Handles one response: checks that it belongs to its request, lets
    /// the app record it, and completes the request with its last response.
    /// With `inline`, only if the app takes it on the receive thread (else
    /// it is given back; a stray is dropped there and then). A panic in the
    /// app fails the request.
    fn on_response(self: &Arc<Self>, msg: Message, inline: bool) -> Option<Message> {
        let ts = msg.meta.timestamp;
        let sender = msg.meta.sender;
        let answer = {
            let mut table = self.shared.table();
            let recorded = catch_unwind(AssertUnwindSafe(|| {
                table.respond(ts, sender, |payload| {
                    if inline && !self.handler.handles_inline(&msg, Some(payload)) {
                        return None;
                    }
                    Some(match (&msg.meta.handler_panic, &msg.meta.refusal) {
                        (Some(message), _) => Err(Failure::HandlerPanicked {
                            node: sender,
                            message: message.to_string(),
                        }),
                        (None, Some(refusal)) => Err(Failure::Refused {
                            node: sender,
                            refusal: (**refusal).clone(),
                        }),
                        (None, None) => Ok(self.handler.on_response(&msg, payload)),
                    })
                })
            }));
            match recorded {
                Ok(answer) => answer,
                Err(payload) => {
                    let failure = self.handler_panicked(ts, &*payload);
                    match table.fail(ts, failure) {
                        Some(completion) => Answer::Completed(completion),
                        None => Answer::Declined,
                    }
                }
            }
        };
        let completion = match answer {
            Answer::Stray => {
                warn!(
                    "dropping a response from node {sender} to request {ts}, which was not sent \
                     to it or is over"
                );
                return None;
            }
            Answer::Deferred => return Some(msg),
            Answer::Declined => return None,
            Answer::Counted => None,
            Answer::Completed(completion) if completion.failure.is_some() => {
                // Failed (a remote handler panicked, or the request was
                // refused): the app sees no data.
                self.complete(completion);
                return None;
            }
            Answer::Completed(completion) => Some(completion),
        };
        let seen = catch_unwind(AssertUnwindSafe(|| self.handler.after_response(self, msg)));
        let failure = seen
            .err()
            .map(|payload| self.handler_panicked(ts, &*payload));
        let completion = match (completion, failure) {
            (Some(mut completion), Some(failure)) => {
                completion.failure.get_or_insert(failure);
                Some(completion)
            }
            (None, Some(failure)) => self.shared.table().fail(ts, failure),
            (completion, None) => completion,
        };
        if let Some(completion) = completion {
            self.complete(completion);
        }
        None
    }

    /// Logs a panic of the app's handling of request `ts`; the failure it
    /// fails the request with.
    fn handler_panicked(&self, ts: i32, payload: &(dyn std::any::Any + Send)) -> Failure {
        let message = panic_message(payload);
        error!("a handler of request {ts} panicked: {message}");
        Failure::HandlerPanicked {
            node: self.my_id(),
            message,
        }
    }

    /// Runs a request's completion (the app's, outside the lock) and makes
    /// it done: its waiters return.
    fn complete(&self, mut completion: Completion<H::Payload>) {
        let ts = completion.ts;
        let failure = completion.failure.clone();
        let payload = &mut completion.payload;
        let ran = catch_unwind(AssertUnwindSafe(|| {
            self.handler.on_complete(ts, payload, failure)
        }));
        if let Err(payload) = ran {
            let panicked = self.handler_panicked(ts, &*payload);
            completion.failure.get_or_insert(panicked);
        }
        let finished = {
            let mut table = self.shared.table();
            let finished = table.finish(completion);
            // Counted before any waiter can see the request done.
            if finished.was_in_flight {
                self.counters.request_done();
            }
            finished
        };
        self.shared.changed.notify_all();
        if let Some(failure) = finished.unwatched_failure {
            warn!(
                "app {} customer {}: request {ts} failed, and nothing waits for it (its handle \
                 was dropped): {failure}",
                self.app_id, self.customer_id
            );
        }
        if let Some(n) = finished.unclaimed {
            warn!(
                "app {} customer {}: {n} completed requests are still kept: their records stay \
                 in memory until they are waited for by timestamp (wait, take_pull) or their \
                 handles are dropped",
                self.app_id, self.customer_id
            );
        }
    }

    /// The table's clock: reports the requests overdue at `now`; returns
    /// when to call it again.
    fn tick(&self, now: Instant) -> Instant {
        let (overdue, next) = {
            let mut table = self.shared.table();
            let overdue = table.tick(now);
            (overdue, table.poll_timeout())
        };
        for o in &overdue {
            warn!("{}", self.describe_overdue(o));
        }
        // A request opened from now on is due no earlier than now + W.
        let latest = now + self.warn_after;
        next.map_or(latest, |next| next.min(latest))
    }

    fn describe_overdue(&self, o: &Overdue) -> String {
        let waited = o.waited.as_secs_f64();
        let from = if o.owing.is_empty() {
            format!("{} of its responses are missing", o.missing)
        } else {
            format!("no answer yet from {}", describe_nodes(&o.owing))
        };
        format!(
            "app {} customer {}: request {} has waited {waited:.0} s: {from}; still waiting \
             (PS_REQUEST_WARN={} s; logged again each time the wait doubles)",
            self.app_id,
            self.customer_id,
            o.ts,
            self.warn_after.as_secs_f64(),
        )
    }
}

/// `server 8, server 10`: nodes by role and id.
fn describe_nodes(nodes: &[NodeId]) -> String {
    let named: Vec<String> = nodes
        .iter()
        .map(|&id| match ids::role_of_id(id) {
            Some(role) => format!("{role} {id}"),
            None => format!("node {id}"),
        })
        .collect();
    named.join(", ")
}

/// The customer's thread: delivers its queue to the app until the customer
/// is dropped, and runs the request table's clock at its deadlines.
fn serve<H: Handler>(customer: Weak<Customer<H>>, queue: CustomerQueue, warn_after: Duration) {
    let mut next_tick = Instant::now() + warn_after;
    loop {
        // Checked first so a busy queue cannot starve the clock.
        let delivery = if Instant::now() >= next_tick {
            None
        } else {
            match queue.recv_deadline(next_tick) {
                Ok(delivery) => Some(delivery),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        let Some(customer) = customer.upgrade() else {
            break;
        };
        match delivery {
            Some(delivery) => customer.deliver(delivery),
            None => next_tick = customer.tick(Instant::now()),
        }
    }
}

impl<H: Handler> Drop for Customer<H> {
    fn drop(&mut self) {
        let Some((id, handle)) = lock(&self.thread).take() else {
            return; // never registered
        };
        self.po.unregister_customer(self.app_id, self.customer_id);
        self.fail_all(Failure::AppDropped);
        // Dropped from its own thread (the app's last handle went away
        // inside a handler): the thread ends by itself.
        if id != std::thread::current().id() && handle.join().is_err() {
            warn!("customer thread of app {} panicked", self.app_id);
        }
    }
}
