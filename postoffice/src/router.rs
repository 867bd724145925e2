//! Routing data messages to the customers (apps) of this process.
//!
//! A message names its app (`app_id`) and, on a worker, its customer
//! (`customer_id`; servers and the scheduler use the app id for both, as
//! ps-lite does).
//!
//! This is the one place where messages wait for an app that is not ready:
//! a customer that has not registered yet (a server may receive pushes
//! before its `KVServer` exists; C++ ps-lite aborts after 5 s there), or one
//! that registered but does not take that kind of delivery yet ([`Ready`]:
//! a `KVServer` or `SimpleApp` whose request handle is not set). What waits
//! is held in arrival order and handed over, in that order, once the
//! customer takes it ([`CustomerRouter::register_ready`],
//! [`CustomerRouter::set_ready`]); a delivery its customer could take waits
//! too while an earlier one for that customer waits. What is held is
//! bounded in bytes, in total and per sender (`PS_HOLD_LIMIT`), so strangers
//! cannot pin memory; a request that does not fit is refused, saying why
//! (logged once per sender, then at debug level). A request for a customer
//! that has not registered, held longer than `PS_APP_WAIT`, is refused: the
//! requester is answered with [`Refusal::NoApp`] and its wait fails, rather
//! than waiting for an app that may never exist
//! ([`CustomerRouter::expire_held`], driven by the Postoffice's clock
//! thread). A registered app's requests wait for its handle as long as it
//! takes.
//!
//! Each customer's queue holds at most `PS_QUEUE_LIMIT` data messages
//! ([`CustomerQueue`]): when a handler falls behind, the next message is
//! refused ([`Delivered::Full`]) and the Van keeps it and stops reading
//! until the queue is half empty (back-pressure on the senders), without
//! the receive thread ever waiting: heartbeats go on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use log::{debug, warn};
use pslite_proto::refusal::{self, Refusal};
use pslite_proto::{lock, Message, NodeId, Role, K_EMPTY};
use pslite_van::hold::message_bytes;
use pslite_van::{Delivered, Dispatch, Failure, LogOnce, Room};

use crate::queue::{customer_queue, CustomerQueue, QueueSender, Refused};
pub use waiting::Ready;
use waiting::Waiting;

mod waiting;

/// (app id, customer id).
pub type CustomerKey = (i32, i32);

/// What a customer's queue carries.
#[derive(Debug)]
pub enum Delivery {
    /// A data message for the customer.
    Message(Message),
    /// A message the customer sent was given up on (never acknowledged
    /// under `PS_RESEND`, or its receiver died): if it was a request, that
    /// request has failed.
    Undeliverable {
        /// The message.
        msg: Message,
        /// Why.
        failure: Failure,
    },
    /// Node `id` died and nothing replaced it: requests waiting for it fail.
    PeerDead {
        /// The dead node.
        id: NodeId,
        /// The failure to report.
        failure: Failure,
    },
    /// The node cannot go on; every wait should fail with this failure.
    NodeFailed(Failure),
    /// Replicated key ranges: copy the app's state of keys `[begin, end)`
    /// (after every request before this in the queue) and hand it to
    /// `Van::snapshot_taken` with `token`.
    Snapshot {
        /// Pairs the copy with the request.
        token: u64,
        /// First key.
        begin: u64,
        /// One past the last key (`u64::MAX`: every key from `begin` on).
        end: u64,
    },
    /// Replicated key ranges: replace the app's state of keys `[begin, end)`
    /// by `data` (a copy a peer made), then call `Van::restored`.
    Restore {
        /// Pairs the answer with the request.
        token: u64,
        /// First key.
        begin: u64,
        /// One past the last key.
        end: u64,
        /// The copy.
        data: pslite_proto::store::Bytes,
    },
}

/// Handles a message on the receive thread itself, or gives it back to be
/// queued. Apps use it for cheap work whose latency matters (a worker
/// counting responses); it must never block.
pub type Inline = Arc<dyn Fn(Message) -> Option<Message> + Send + Sync>;

struct Route {
    queue: Arc<QueueSender>,
    inline: Option<Inline>,
    ready: Ready,
}

struct Routes {
    customers: HashMap<CustomerKey, Route>,
    failure: Option<Failure>,
    /// What came for customers that are not ready for it (`PS_HOLD_LIMIT`),
    /// in arrival order: messages, and (replicated key ranges) copy and
    /// restore requests for server apps (a server that replaces a dead one
    /// gets its copies as soon as it joins, before its `KVServer` exists).
    held: Waiting,
    /// Senders whose requests were refused for want of room, warned about.
    refused: LogOnce<NodeId>,
    /// When each held request arrived, oldest first (a request delivered
    /// since leaves its instant behind: it only costs a wake-up).
    held_requests: VecDeque<Instant>,
    /// Refusals to send (requests that did not fit the hold).
    refusals: Vec<Message>,
    /// Counts requests held and refusals queued (wakes the clock thread).
    generation: u64,
}

/// The sender copy and restore requests are held under: this node's own
/// core (no peer). They count no payload: a restore carries a whole
/// range's state, which the per-sender budget would refuse, and there is
/// at most one per range and app at a time.
const OWN_CORE: NodeId = -1;

/// The [`Dispatch`] of a Postoffice: delivers each data message to its
/// customer's queue.
pub struct CustomerRouter {
    role: Role,
    queue_limit: usize,
    /// `PS_APP_WAIT`.
    app_wait: Duration,
    routes: Mutex<Routes>,
    /// Notified when a request is held or a refusal waits to be sent.
    held_changed: Condvar,
    /// Elastic mode: called when a round begins.
    membership_callbacks: Mutex<Vec<crate::postoffice::MembershipCallback>>,
}

/// The customer a message is for, on a node of `role`.
fn key_of(role: Role, msg: &Message) -> CustomerKey {
    let app_id = msg.meta.app_id;
    let customer_id = if role == Role::Worker {
        msg.meta.customer_id
    } else {
        app_id
    };
    (app_id, customer_id)
}

impl CustomerRouter {
    /// A router for a node of `role`, with queues of `queue_limit`
    /// messages, holding at most `hold_limit` bytes for customers that have
    /// not registered (a quarter of it per sender).
    pub fn new(role: Role, queue_limit: usize, hold_limit: usize) -> CustomerRouter {
        CustomerRouter {
            role,
            queue_limit: queue_limit.max(1),
            app_wait: Duration::from_millis(crate::settings::PS_APP_WAIT.kind.default),
            routes: Mutex::new(Routes {
                customers: HashMap::new(),
                failure: None,
                held: Waiting::new(hold_limit),
                refused: LogOnce::new(log::Level::Warn),
                held_requests: VecDeque::new(),
                refusals: Vec::new(),
                generation: 0,
            }),
            held_changed: Condvar::new(),
            membership_callbacks: Mutex::new(Vec::new()),
        }
    }

    /// Requests for a customer that does not exist are refused after
    /// `wait` (`PS_APP_WAIT`; 5 s by default).
    pub fn with_app_wait(mut self, wait: Duration) -> CustomerRouter {
        self.app_wait = wait;
        self
    }

    /// Takes the held requests that have waited `PS_APP_WAIT` by `now`,
    /// and returns their refusals (to send), with those of requests that
    /// did not fit the hold.
    pub fn expire_held(&self, now: Instant) -> Vec<Message> {
        let mut routes = self.routes();
        let wait = self.app_wait;
        let due = |since: &Instant| now.saturating_duration_since(*since) >= wait;
        let mut out = std::mem::take(&mut routes.refusals);
        if routes.held_requests.front().is_some_and(due) {
            while routes.held_requests.front().is_some_and(due) {
                routes.held_requests.pop_front();
            }
            // A registered customer's requests wait for its handle.
            let Routes {
                held, customers, ..
            } = &mut *routes;
            let expired = held.take_if(|(key, delivery, since)| {
                matches!(delivery, Delivery::Message(m) if m.meta.request)
                    && due(since)
                    && !customers.contains_key(key)
            });
            for ((app, customer), delivery, since) in expired {
                let Delivery::Message(msg) = delivery else {
                    continue;
                };
                let waited_ms = now.saturating_duration_since(since).as_millis() as u64;
                out.push(refusal::response(
                    &msg.meta,
                    Refusal::NoApp {
                        app,
                        customer,
                        waited_ms,
                    },
                ));
            }
        }
        out
    }

    /// When [`CustomerRouter::expire_held`] has something to do next (now,
    /// if refusals wait); `None` while nothing is held.
    pub fn next_expiry(&self) -> Option<Instant> {
        let routes = self.routes();
        if !routes.refusals.is_empty() {
            return Some(Instant::now());
        }
        routes
            .held_requests
            .front()
            .map(|since| *since + self.app_wait)
    }

    /// Waits until a request is held or a refusal queued after generation
    /// `seen` (0 at first), at most until `deadline`; returns the
    /// generation now (for the clock thread).
    pub fn wait_for_held(&self, seen: u64, deadline: Instant) -> u64 {
        let routes = self.routes();
        let left = deadline.saturating_duration_since(Instant::now());
        let (routes, _) = self
            .held_changed
            .wait_timeout_while(routes, left, |r| r.generation == seen)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        routes.generation
    }

    /// Wakes [`CustomerRouter::wait_for_held`] (to stop the clock thread):
    /// a new generation, so that the wait's condition changes (a bare
    /// notification left it waiting out its 1 s timeout, which every
    /// `finalize` paid) and a wake just before the wait is not lost.
    pub fn wake(&self) {
        self.routes().generation += 1;
        self.held_changed.notify_all();
    }

    /// Calls `f` each time an elastic round begins.
    pub(crate) fn on_membership(&self, f: crate::postoffice::MembershipCallback) {
        lock(&self.membership_callbacks).push(f);
    }

    /// The customer a message is for.
    pub fn key_of(&self, msg: &Message) -> CustomerKey {
        key_of(self.role, msg)
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        lock(&self.routes)
    }

    /// Registers a customer that takes everything; its queue starts with
    /// whatever was held for it. `None` if the customer is already
    /// registered.
    pub fn register(&self, key: CustomerKey) -> Option<CustomerQueue> {
        self.register_ready(key, None, Ready::ALL)
    }

    /// Registers a customer that takes what `ready` says, with an inline
    /// handler (see [`Inline`]) that sees its messages first, on the receive
    /// thread; the rest waits here until [`CustomerRouter::set_ready`]. Its queue
    /// starts with what was held for it that it takes (in order, up to the
    /// first it does not take). `None` if the customer is already
    /// registered.
    pub fn register_ready(
        &self,
        key: CustomerKey,
        inline: Option<Inline>,
        ready: Ready,
    ) -> Option<CustomerQueue> {
        let mut routes = self.routes();
        if routes.customers.contains_key(&key) {
            return None;
        }
        let held = routes.held.take_ready(key, ready);
        let (tx, rx) = customer_queue(self.queue_limit);
        if let Some(failure) = &routes.failure {
            tx.push(Delivery::NodeFailed(failure.clone()));
        }
        if !held.is_empty() {
            debug!(
                "app {} customer {}: delivering {} messages that arrived before it registered",
                key.0,
                key.1,
                held.len()
            );
        }
        // What was held goes in whatever the limit.
        for delivery in held {
            tx.push(delivery);
        }
        let queue = Arc::new(tx);
        routes.customers.insert(
            key,
            Route {
                queue,
                inline,
                ready,
            },
        );
        Some(rx)
    }

    /// Customer `key` now takes what `ready` says: what was held for it is
    /// handed over in order, up to the first it does not take.
    pub fn set_ready(&self, key: CustomerKey, ready: Ready) {
        let mut routes = self.routes();
        let held = routes.held.take_ready(key, ready);
        let Some(route) = routes.customers.get_mut(&key) else {
            return;
        };
        route.ready = ready;
        if !held.is_empty() {
            debug!(
                "app {} customer {}: delivering {} messages that waited for it",
                key.0,
                key.1,
                held.len()
            );
        }
        // What was held goes in whatever the limit.
        for delivery in held {
            route.queue.push(delivery);
        }
    }

    /// How many messages wait for customers that have not registered.
    pub fn held(&self) -> usize {
        let routes = self.routes();
        let registered = |key: &CustomerKey| routes.customers.contains_key(key);
        routes
            .held
            .iter()
            .filter(|(k, _, _)| !registered(k))
            .count()
    }

    /// How many messages wait for customer `key` (registered or not).
    pub fn held_for(&self, key: CustomerKey) -> usize {
        let routes = self.routes();
        routes.held.count_for(key)
    }

    /// Bytes held for customers that have not registered.
    pub fn held_bytes(&self) -> usize {
        self.routes().held.bytes()
    }

    /// Removes a customer; later messages for it are held again.
    pub fn unregister(&self, key: CustomerKey) {
        self.routes().customers.remove(&key);
    }
}

impl Routes {
    /// The route of customer `key` if it takes what `takes` says now:
    /// registered, and (unless `always`, a response or notice) ready for
    /// it with nothing held for it before it.
    fn open(
        &self,
        key: CustomerKey,
        always: bool,
        takes: impl Fn(Ready) -> bool,
    ) -> Option<&Route> {
        let route = self.customers.get(&key)?;
        if always {
            return Some(route);
        }
        let waits = self.held.count_for(key) > 0;
        (takes(route.ready) && !waits).then_some(route)
    }
}

impl CustomerRouter {
    /// Queues `what` for server app `app` (customer `app`, as ps-lite keys
    /// server apps), in order with its requests.
    fn to_app(&self, app: i32, what: Delivery) {
        let mut routes = self.routes();
        let open = routes.open((app, app), false, |ready| ready.takes(&what));
        let Some(queue) = open.map(|r| r.queue.clone()) else {
            match routes
                .held
                .push(OWN_CORE, 0, ((app, app), what, Instant::now()))
            {
                Ok(()) => debug!("holding a key-range copy request until app {app} registers"),
                Err(_) => warn!(
                    "dropping a key-range copy request: app {app} never registered and too \
                     many wait (PS_HOLD_LIMIT)"
                ),
            }
            return;
        };
        drop(routes);
        // Whatever the limit: it is one per range, and must not be lost.
        queue.push(what);
    }
}

impl Dispatch for CustomerRouter {
    /// [`Dispatch::offer`], queueing the message even when the queue is full.
    fn deliver(&self, msg: Message) {
        let room = Room::new(|| {});
        if let Delivered::Full(msg) = self.offer(msg, &room) {
            let key = self.key_of(&msg);
            if let Some(route) = self.routes().customers.get(&key) {
                route.queue.push(Delivery::Message(msg));
            }
        }
    }

    fn offer(&self, msg: Message, room: &Room) -> Delivered {
        if msg.meta.app_id == K_EMPTY {
            warn!(
                "dropping a data message from node {} without an app id",
                msg.meta.sender
            );
            return Delivered::Taken;
        }
        let key = self.key_of(&msg);
        let open = self
            .routes()
            .open(key, !msg.meta.request, |ready| ready.takes_message(&msg))
            .map(|r| r.inline.clone());
        let is_open = open.is_some();
        let msg = match open {
            // Not under the lock: the handler may take its time.
            Some(Some(inline)) => match inline(msg) {
                Some(msg) => msg,
                None => return Delivered::Taken,
            },
            _ => msg,
        };
        let mut routes = self.routes();
        if let Some(route) = routes.customers.get(&key).filter(|_| is_open) {
            match route.queue.offer(msg, room) {
                Ok(()) => return Delivered::Taken,
                Err(Refused::Full(msg)) => {
                    debug!(
                        "app {} customer {}: its queue is full, waiting for room",
                        key.0, key.1
                    );
                    return Delivered::Full(msg);
                }
                Err(Refused::Gone) => {
                    routes.customers.remove(&key);
                    warn!(
                        "app {} customer {} has gone: dropping a message for it",
                        key.0, key.1
                    );
                    return Delivered::Taken;
                }
            }
        }
        let sender = msg.meta.sender;
        let bytes = message_bytes(&msg);
        let request = msg.meta.request;
        let now = Instant::now();
        let registered = routes.customers.contains_key(&key);
        if request && self.app_wait.is_zero() && !registered {
            let refusal = Refusal::NoApp {
                app: key.0,
                customer: key.1,
                waited_ms: 0,
            };
            routes.refusals.push(refusal::response(&msg.meta, refusal));
            routes.generation += 1;
            drop(routes);
            self.held_changed.notify_all();
            return Delivered::Taken;
        }
        match routes
            .held
            .push(sender, bytes, (key, Delivery::Message(msg), now))
        {
            Ok(()) => {
                debug!(
                    "holding a message for app {} customer {} until it is ready",
                    key.0, key.1
                );
                if request {
                    routes.held_requests.push_back(now);
                    routes.generation += 1;
                    drop(routes);
                    self.held_changed.notify_all();
                }
            }
            Err(refused) => {
                let limit = routes.held.limit();
                let waiting = routes.held.len();
                let (app, customer) = key;
                let reason = if registered {
                    format!(
                        "app {app} customer {customer} has no request handle yet, and \
                         {waiting} messages already wait for apps that are not ready \
                         (PS_HOLD_LIMIT is {limit} bytes): set the handle sooner, or raise \
                         PS_HOLD_LIMIT"
                    )
                } else {
                    format!(
                        "there is no app {app} customer {customer} yet, and {waiting} messages \
                         already wait for apps that are not ready (PS_HOLD_LIMIT is {limit} \
                         bytes): create the app sooner, or raise PS_HOLD_LIMIT"
                    )
                };
                routes.refused.log(sender, || {
                    format!("refusing messages from node {sender}: {reason}")
                });
                let (_, delivery, _) = refused.item;
                if let Delivery::Message(msg) = delivery {
                    if msg.meta.request {
                        let refusal = Refusal::Other { app: key.0, reason };
                        routes.refusals.push(refusal::response(&msg.meta, refusal));
                        routes.generation += 1;
                        drop(routes);
                        self.held_changed.notify_all();
                    }
                }
            }
        }
        Delivered::Taken
    }

    fn undeliverable(&self, msg: Message, failure: Failure) {
        // The customer that sent it.
        let key = self.key_of(&msg);
        let queue = self
            .routes()
            .customers
            .get(&key)
            .map(|r| Arc::clone(&r.queue));
        let queued = queue.is_some_and(|q| {
            q.push(Delivery::Undeliverable {
                msg,
                failure: failure.clone(),
            })
        });
        if !queued {
            debug!("{failure} (its customer has gone)");
        }
    }

    fn snapshot(&self, app: i32, token: u64, begin: u64, end: u64) {
        self.to_app(app, Delivery::Snapshot { token, begin, end });
    }

    fn restore(
        &self,
        app: i32,
        token: u64,
        begin: u64,
        end: u64,
        data: pslite_proto::store::Bytes,
    ) {
        self.to_app(
            app,
            Delivery::Restore {
                token,
                begin,
                end,
                data,
            },
        );
    }

    fn membership(&self, round: u64, workers: &[NodeId]) {
        let membership = crate::Membership {
            round,
            workers: workers.to_vec(),
        };
        let callbacks = lock(&self.membership_callbacks).clone();
        for f in callbacks {
            let call = std::panic::AssertUnwindSafe(|| f(&membership));
            if std::panic::catch_unwind(call).is_err() {
                log::error!("a membership-change callback panicked (round {round})");
            }
        }
    }

    fn peer_dead(&self, id: NodeId, failure: &Failure) {
        let queues: Vec<_> = self
            .routes()
            .customers
            .values()
            .map(|r| Arc::clone(&r.queue))
            .collect();
        for queue in queues {
            queue.push(Delivery::PeerDead {
                id,
                failure: failure.clone(),
            });
        }
    }

    fn failed(&self, failure: &Failure) {
        let queues: Vec<_> = {
            let mut routes = self.routes();
            routes.failure.get_or_insert(failure.clone());
            routes
                .customers
                .values()
                .map(|r| Arc::clone(&r.queue))
                .collect()
        };
        for queue in queues {
            queue.push(Delivery::NodeFailed(failure.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(app_id: i32, customer_id: i32, ts: i32) -> Message {
        let mut m = Message::default();
        m.meta.app_id = app_id;
        m.meta.customer_id = customer_id;
        m.meta.timestamp = ts;
        m
    }

    fn ts(d: &Delivery) -> i32 {
        match d {
            Delivery::Message(m) => m.meta.timestamp,
            other => panic!("not a message: {other:?}"),
        }
    }

    #[test]
    fn failure_reaches_present_and_future_customers() {
        let r = CustomerRouter::new(Role::Worker, 10, 1 << 20);
        let rx = r.register((0, 0)).unwrap();
        r.failed(&Failure::Stopped);
        assert!(matches!(
            rx.try_recv(),
            Ok(Delivery::NodeFailed(Failure::Stopped))
        ));
        let later = r.register((0, 1)).unwrap();
        assert!(matches!(later.try_recv(), Ok(Delivery::NodeFailed(_))));
    }

    #[test]
    fn messages_before_registration_are_held_in_order() {
        let r = CustomerRouter::new(Role::Worker, 10, 1 << 20);
        r.deliver(msg(0, 1, 1));
        r.deliver(msg(0, 1, 2));
        r.deliver(msg(0, 0, 3));
        let rx = r.register((0, 1)).unwrap();
        r.deliver(msg(0, 1, 4));
        let got: Vec<_> = rx.try_iter().map(|d| ts(&d)).collect();
        assert_eq!(got, vec![1, 2, 4]);
        let rx0 = r.register((0, 0)).unwrap();
        assert_eq!(ts(&rx0.try_recv().unwrap()), 3);
        assert!(r.register((0, 0)).is_none());
    }

    #[test]
    fn requests_wait_for_a_registered_app_until_it_is_ready_in_order() {
        let r = CustomerRouter::new(Role::Server, 10, 1 << 20);
        let request = |ts, simple| {
            let mut m = msg(4, 4, ts);
            m.meta.request = true;
            m.meta.simple_app = simple;
            m
        };
        r.deliver(request(1, false));
        let rx = r.register_ready((4, 4), None, Ready::NONE).unwrap();
        r.deliver(request(2, true));
        r.deliver(msg(4, 4, 3)); // a response: always taken
        assert_eq!(ts(&rx.try_recv().unwrap()), 3);
        assert!(rx.try_recv().is_err());
        assert_eq!(
            (r.held(), r.held_for((4, 4))),
            (0, 2),
            "held for a registered app"
        );
        // Never refused for waiting: the app exists, its handle is late.
        let late = Instant::now() + Duration::from_secs(3600);
        assert!(r.expire_held(late).is_empty());
        // Commands only: the KV request first still waits, and the command
        // behind it.
        let commands = Ready {
            simple: true,
            ..Ready::NONE
        };
        r.set_ready((4, 4), commands);
        assert!(rx.try_recv().is_err());
        r.deliver(request(4, true));
        assert_eq!(r.held_for((4, 4)), 3, "behind what waits");
        r.set_ready((4, 4), Ready::ALL);
        let got: Vec<_> = rx.try_iter().map(|d| ts(&d)).collect();
        assert_eq!(got, vec![1, 2, 4]);
        r.deliver(request(5, false));
        assert_eq!(ts(&rx.try_recv().unwrap()), 5);
        assert_eq!(r.held_for((4, 4)), 0);
    }

    #[test]
    fn servers_route_by_app_id() {
        let r = CustomerRouter::new(Role::Server, 10, 1 << 20);
        let rx = r.register((3, 3)).unwrap();
        r.deliver(msg(3, 7, 1));
        assert_eq!(ts(&rx.try_recv().unwrap()), 1);
        r.deliver(msg(K_EMPTY, 0, 2));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn held_messages_are_bounded_in_bytes_per_sender_and_in_total() {
        let r = CustomerRouter::new(Role::Server, 10, 4000);
        let big = |sender: NodeId, ts| {
            let mut m = msg(5, 5, ts);
            m.meta.sender = sender;
            m.data = vec![vec![0u8; 436].into()];
            m
        };
        // 500 bytes each: two per sender fit in a quarter of 4000.
        for ts in 0..5 {
            r.deliver(big(9, ts));
        }
        assert_eq!(r.held(), 2);
        for sender in [11, 13, 15, 17] {
            for ts in 0..2 {
                r.deliver(big(sender, ts));
            }
        }
        assert_eq!(r.held(), 8, "the total caps at 4000 bytes");
        assert_eq!(r.held_bytes(), 4000);
        let rx = r.register((5, 5)).unwrap();
        assert_eq!(rx.try_iter().count(), 8);
        assert_eq!((r.held(), r.held_bytes()), (0, 0));
    }

    #[test]
    fn a_full_queue_refuses_and_signals_room_once_half_empty() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let r = CustomerRouter::new(Role::Worker, 4, 1 << 20);
        let rx = r.register((0, 0)).unwrap();
        let rooms = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&rooms);
        let room = Room::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        for t in 0..4 {
            assert!(matches!(r.offer(msg(0, 0, t), &room), Delivered::Taken));
        }
        let Delivered::Full(refused) = r.offer(msg(0, 0, 4), &room) else {
            panic!("a full queue takes no more");
        };
        assert_eq!(refused.meta.timestamp, 4, "the message comes back");
        // Notices always go in, and never count against the limit.
        r.peer_dead(9, &Failure::Stopped);
        assert_eq!(ts(&rx.recv().unwrap()), 0);
        assert_eq!(rooms.load(Ordering::SeqCst), 0, "3 of 4 left");
        assert_eq!(ts(&rx.recv().unwrap()), 1);
        assert_eq!(rooms.load(Ordering::SeqCst), 1, "half empty: room");
        assert!(matches!(r.offer(refused, &room), Delivered::Taken));
        let rest: Vec<_> = rx.try_iter().collect();
        assert_eq!(rest.len(), 4);
        assert!(matches!(rest[2], Delivery::PeerDead { id: 9, .. }));
        // A customer that has gone lets the parked messages through (dropped).
        let Delivered::Full(_) = (0..5).fold(Delivered::Taken, |_, t| r.offer(msg(0, 0, t), &room))
        else {
            panic!("full again");
        };
        drop(rx);
        assert_eq!(rooms.load(Ordering::SeqCst), 2);
        assert!(matches!(r.offer(msg(0, 0, 9), &room), Delivered::Taken));
    }

    #[test]
    fn wake_ends_a_wait_for_held_at_once() {
        // finalize stops the clock thread this way: before, the wait went
        // on to its deadline (1 s at each finalize; here 60 s).
        let r = Arc::new(CustomerRouter::new(Role::Worker, 10, 1 << 20));
        let (tx, rx) = crossbeam_channel::bounded(1);
        let waiter = Arc::clone(&r);
        let thread = std::thread::spawn(move || {
            let _ = tx.send(waiter.wait_for_held(0, Instant::now() + Duration::from_secs(60)));
        });
        r.wake();
        let seen = rx.recv_timeout(Duration::from_secs(30));
        assert!(seen.is_ok(), "wait_for_held still waits after wake()");
        thread.join().unwrap();
    }
}
