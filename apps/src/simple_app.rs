//! `SimpleApp`: request/response messages with an integer head and a byte
//! body, as in ps-lite. A request goes to one node or to every node of a
//! group; each receiver's request handle answers with [`SimpleApp::response`].
//! [`SimpleApp::request`] returns a [`Request`] to wait on (or its
//! timestamp, for [`SimpleApp::wait`] as in ps-lite).
//!
//! Requests that arrive before a request handle is set wait for it, in the
//! Postoffice's hold (`PS_HOLD_LIMIT`; C++ ps-lite answers them with an
//! empty default reply instead, so a handle set a moment too late misses
//! them).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use log::{error, warn};
use pslite_postoffice::{Postoffice, Ready};
use pslite_proto::{lock, Message, NodeId};

use crate::customer::{panic_message, Customer, Handler, Request};
use crate::Error;

/// A SimpleApp message as its handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimpleData {
    /// The app-defined command.
    pub head: i32,
    /// The payload.
    pub body: Bytes,
    /// The sending node.
    pub sender: NodeId,
    /// The request's timestamp (echoed in the response).
    pub timestamp: i32,
    /// The sending customer (echoed in the response).
    pub customer_id: i32,
}

/// Sends a SimpleApp request from `customer` to node or group `recv`,
/// keeping `payload` in its record (shared by SimpleApp, KVWorker and
/// KVServer, which all speak SimpleApp as in ps-lite).
pub(crate) fn send_request<H: Handler>(
    customer: &Customer<H>,
    payload: H::Payload,
    head: i32,
    body: &[u8],
    recv: i32,
) -> Result<Request<H::Payload>, Error> {
    let po = customer.postoffice();
    let recvers = po.node_ids(recv);
    if recvers.is_empty() {
        return Err(Error::InvalidInput(format!(
            "{recv} names no node: use a node id or a group 1..7"
        )));
    }
    let request = customer.new_request_to(&recvers, payload);
    let body = Bytes::copy_from_slice(body);
    for id in recvers {
        let mut msg = Message::default();
        msg.meta.app_id = customer.app_id();
        msg.meta.customer_id = customer.customer_id();
        msg.meta.simple_app = true;
        msg.meta.request = true;
        msg.meta.head = head;
        msg.meta.body = body.clone();
        msg.meta.timestamp = request.ts();
        msg.meta.recver = id;
        if let Err(e) = po.send(msg) {
            let failure = pslite_postoffice::Failure::SendFailed {
                peer: id,
                reason: e.to_string(),
            };
            customer.fail_request(request.ts(), failure);
            return Err(e);
        }
    }
    Ok(request)
}

/// Answers SimpleApp request `req` of app `app_id` with `body`.
pub(crate) fn send_response(
    po: &Postoffice,
    app_id: i32,
    req: &SimpleData,
    body: &[u8],
) -> Result<(), Error> {
    po.send(response_message(app_id, req, body))?;
    Ok(())
}

/// Runs a request handle; if it panics, tells the requester (a pslite
/// node) that its request failed, instead of leaving it waiting.
pub(crate) fn contain_panic(
    po: &Postoffice,
    response: impl FnOnce() -> Message,
    handle: impl FnOnce(),
) {
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(handle));
    po.counters_handle().handled(started.elapsed());
    let Err(payload) = outcome else {
        return;
    };
    let message = panic_message(&*payload);
    let mut msg = response();
    let requester = msg.meta.recver;
    error!("the request handle panicked on a request from node {requester}: {message}");
    if !po.is_pslite(requester) {
        warn!("node {requester} is not a pslite node: it cannot be told that its request failed");
        return;
    }
    msg.meta.handler_panic = Some(message.into());
    if let Err(e) = po.send(msg) {
        warn!("cannot tell node {requester} that its request failed: {e}");
    }
}

/// The response of app `app_id` to SimpleApp request `req`, with `body`.
pub(crate) fn response_message(app_id: i32, req: &SimpleData, body: &[u8]) -> Message {
    let mut msg = Message::default();
    msg.meta.app_id = app_id;
    msg.meta.customer_id = req.customer_id;
    msg.meta.simple_app = true;
    msg.meta.request = false;
    msg.meta.head = req.head;
    msg.meta.body = Bytes::copy_from_slice(body);
    msg.meta.timestamp = req.timestamp;
    msg.meta.recver = req.sender;
    msg
}

impl SimpleData {
    /// The SimpleApp view of a message.
    pub fn of(msg: &Message) -> SimpleData {
        SimpleData {
            head: msg.meta.head,
            body: msg.meta.body.clone(),
            sender: msg.meta.sender,
            timestamp: msg.meta.timestamp,
            customer_id: msg.meta.customer_id,
        }
    }
}

type Handle = Box<dyn FnMut(&SimpleData, &SimpleApp) + Send>;

/// The app's state; its customer's [`Handler`].
struct Inner {
    app_id: i32,
    customer_id: i32,
    po: Postoffice,
    request_handle: Mutex<Option<Handle>>,
    response_handle: Mutex<Option<Handle>>,
}

/// What a SimpleApp takes before its request handle is set: key-value
/// requests (refused at once) and copies, not its commands.
const NO_HANDLE: Ready = Ready {
    simple: false,
    ..Ready::ALL
};

/// A request/response app; cheap to clone (clones share the app).
#[derive(Clone)]
pub struct SimpleApp {
    customer: Arc<Customer<Inner>>,
}

impl SimpleApp {
    /// A SimpleApp with app id `app_id` as customer `customer_id` of `po`.
    ///
    /// Use app 0, customer 0 unless you need several apps or several
    /// customers of one app in a process.
    pub fn new(po: &Postoffice, app_id: i32, customer_id: i32) -> Result<SimpleApp, Error> {
        let inner = Inner {
            app_id,
            customer_id,
            po: po.clone(),
            request_handle: Mutex::new(None),
            response_handle: Mutex::new(None),
        };
        Ok(SimpleApp {
            customer: Customer::new(po, app_id, customer_id, inner, NO_HANDLE)?,
        })
    }

    fn inner(&self) -> &Inner {
        self.customer.handler()
    }

    /// Sends request `head`/`body` to node or group `recv`; it completes
    /// when every receiver has answered. Returns the request to wait on.
    pub fn request(&self, head: i32, body: &[u8], recv: i32) -> Result<Request, Error> {
        send_request(&self.customer, (), head, body, recv)
    }

    /// Answers request `req` with `body`.
    pub fn response(&self, req: &SimpleData, body: &[u8]) -> Result<(), Error> {
        send_response(&self.inner().po, self.inner().app_id, req, body)
    }

    /// Waits until every receiver of request `ts` (a timestamp, or a
    /// request handle) has answered.
    pub fn wait(&self, ts: impl Into<i32>) -> Result<(), Error> {
        self.customer.wait(ts.into())
    }

    /// [`SimpleApp::wait`] with a deadline.
    pub fn wait_timeout(&self, ts: impl Into<i32>, timeout: Duration) -> Result<(), Error> {
        self.customer.wait_timeout(ts.into(), timeout)
    }

    /// How many receivers of request `ts` have answered.
    pub fn num_responses(&self, ts: i32) -> usize {
        self.customer.num_responses(ts)
    }

    /// Sets what to do with each request; requests that arrived before are
    /// handled next, in order.
    pub fn set_request_handle(&self, handle: impl FnMut(&SimpleData, &SimpleApp) + Send + 'static) {
        *lock(&self.inner().request_handle) = Some(Box::new(handle));
        self.customer.set_ready(Ready::ALL);
    }

    /// Sets what to do with each response (they are counted either way).
    pub fn set_response_handle(
        &self,
        handle: impl FnMut(&SimpleData, &SimpleApp) + Send + 'static,
    ) {
        *lock(&self.inner().response_handle) = Some(Box::new(handle));
    }

    /// A request handle that answers every request with an empty body, as
    /// C++ ps-lite's default does.
    pub fn reply_empty(req: &SimpleData, app: &SimpleApp) {
        if let Err(e) = app.response(req, b"") {
            warn!(
                "cannot answer request {} from node {}: {e}",
                req.timestamp, req.sender
            );
        }
    }

    /// The app id.
    pub fn app_id(&self) -> i32 {
        self.inner().app_id
    }

    /// The customer id.
    pub fn customer_id(&self) -> i32 {
        self.inner().customer_id
    }
}

impl Inner {
    /// Runs the request handle on `req`; a panic fails that request.
    fn run(&self, handle: &mut Handle, req: &SimpleData, app: &SimpleApp) {
        contain_panic(
            &self.po,
            || response_message(self.app_id, req, b""),
            || handle(req, app),
        );
    }
}

impl Handler for Inner {
    type Payload = ();

    fn on_request(&self, customer: &Arc<Customer<Self>>, msg: Message) {
        if !msg.meta.simple_app {
            let refusal = pslite_proto::refusal::Refusal::Other {
                app: self.app_id,
                reason: "a key-value request to a SimpleApp (no KVServer has this app id)".into(),
            };
            crate::refusal::refuse(&self.po, &msg.meta, refusal);
            return;
        }
        let app = SimpleApp {
            customer: Arc::clone(customer),
        };
        let req = SimpleData::of(&msg);
        // The Postoffice holds requests until the handle is set.
        match lock(&self.request_handle).as_mut() {
            Some(handle) => self.run(handle, &req, &app),
            None => error!("SimpleApp {}: a request before its handle", self.app_id),
        }
    }

    fn on_response(&self, _msg: &Message, _payload: &mut ()) -> bool {
        true
    }

    fn after_response(&self, customer: &Arc<Customer<Self>>, msg: Message) {
        let app = SimpleApp {
            customer: Arc::clone(customer),
        };
        if let Some(handle) = lock(&self.response_handle).as_mut() {
            handle(&SimpleData::of(&msg), &app);
        }
    }

    fn on_complete(
        &self,
        _ts: i32,
        _payload: &mut (),
        _failure: Option<pslite_postoffice::Failure>,
    ) {
    }
}
