//! What an app is to its customer: the [`Handler`] the customer's thread
//! calls for each message (requests, responses, completions, key-range
//! copies), and the message of a handler's panic.

use std::sync::Arc;

use log::error;
use pslite_postoffice::Failure;
use pslite_proto::Message;

use super::Customer;

/// What an app does with the messages its customer receives, and what it
/// keeps per request it sends. Runs on the customer's thread, one message
/// at a time (or on the receive thread, for messages it takes inline).
///
/// A panic in any of these fails the request concerned with
/// [`Failure::HandlerPanicked`]; the customer goes on.
pub trait Handler: Send + Sync + Sized + 'static {
    /// What the app keeps in each request's record: e.g. the parts each
    /// server answered, a callback and the pulled values.
    type Payload: Send + 'static;

    /// A request from another node.
    fn on_request(&self, customer: &Arc<Customer<Self>>, msg: Message);

    /// A response to one of this customer's requests, from a node that owes
    /// one, before it is counted: records what it carries in the request's
    /// `payload`. Returns false to leave it uncounted (it does not belong
    /// to the request). Runs under the request table's lock: quick work
    /// only, no user code, never a call back into the customer.
    fn on_response(&self, msg: &Message, payload: &mut Self::Payload) -> bool;

    /// A counted response, outside the lock, before the request completes:
    /// where user code that sees responses runs. Default: nothing.
    fn after_response(&self, customer: &Arc<Customer<Self>>, msg: Message) {
        let _ = (customer, msg);
    }

    /// Every response of request `ts` has arrived (or it failed with
    /// `failure`); runs once per request, before waits for it return.
    fn on_complete(&self, ts: i32, payload: &mut Self::Payload, failure: Option<Failure>);

    /// Replicated key ranges: copy the app's state of keys `[begin, end)`
    /// for a joining server and hand it to the node (`Van::snapshot_taken`
    /// with `token`). Default: the app cannot (logged; the copy waits).
    fn on_snapshot(&self, customer: &Arc<Customer<Self>>, token: u64, begin: u64, end: u64) {
        let _ = (customer, token, begin, end);
        error!("this app cannot copy its state to a joining server");
    }

    /// Replicated key ranges: replace the app's state of keys `[begin, end)`
    /// by a peer's copy, then tell the node (`Van::restored` with `token`).
    fn on_restore(
        &self,
        customer: &Arc<Customer<Self>>,
        token: u64,
        begin: u64,
        end: u64,
        data: bytes::Bytes,
    ) {
        let _ = (customer, token, begin, end, data);
        error!("this app cannot restore a copy of its state");
    }

    /// Whether `msg` may be handled on the receive thread, skipping the
    /// customer's thread: for cheap work that never blocks (responses a
    /// worker only counts, or requests whose app asked for it). `payload`
    /// is the open request a response belongs to (`None` for a request);
    /// for a response it runs under the request table's lock, as
    /// [`Handler::on_response`] does. Default: no.
    fn handles_inline(&self, msg: &Message, payload: Option<&Self::Payload>) -> bool {
        let _ = (msg, payload);
        false
    }

    /// Whether a completed request's payload holds a result still to be
    /// taken (pulled values): waiting for it then keeps its record for
    /// [`Customer::take`]. Default: no.
    fn holds_result(payload: &Self::Payload) -> bool {
        let _ = payload;
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
