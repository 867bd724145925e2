//! Routing data messages to the customers (apps) of this process.
//!
//! A message names its app (`app_id`) and, on a worker, its customer
//! (`customer_id`; servers and the scheduler use the app id for both, as
//! ps-lite does). Messages for a customer that has not registered yet are
//! held, in order, and handed over when it registers: a server may receive
//! pushes before its `KVServer` exists (C++ ps-lite aborts after 5 s there).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crossbeam_channel::{unbounded, Receiver, Sender};
use log::{debug, warn};
use pslite_proto::{Message, Role, K_EMPTY};
use pslite_van::{Dispatch, VanError};

/// At most this many messages wait for customers that have not registered;
/// beyond it (a misbehaving or hostile peer) new ones are dropped and logged.
const MAX_HELD: usize = 1_000_000;

/// (app id, customer id).
pub type CustomerKey = (i32, i32);

/// What a customer's queue carries.
#[derive(Debug)]
pub enum Delivery {
    /// A data message for the customer.
    Message(Message),
    /// A message the customer sent was never acknowledged (`PS_RESEND`):
    /// if it was a request, that request has failed.
    Undeliverable {
        /// The message.
        msg: Message,
        /// Why.
        reason: String,
    },
    /// The node cannot go on; every wait should fail with this reason.
    NodeFailed(String),
}

/// Handles a message on the receive thread itself, or gives it back to be
/// queued. Apps use it for cheap work whose latency matters (a worker
/// counting responses); it must never block.
pub type Inline = Arc<dyn Fn(Message) -> Option<Message> + Send + Sync>;

struct Route {
    queue: Sender<Delivery>,
    inline: Option<Inline>,
}

#[derive(Default)]
struct Routes {
    customers: HashMap<CustomerKey, Route>,
    failure: Option<String>,
    held: HashMap<CustomerKey, Vec<Message>>,
    held_total: usize,
}

/// The [`Dispatch`] of a Postoffice: delivers each data message to its
/// customer's queue.
pub struct CustomerRouter {
    role: Role,
    routes: Mutex<Routes>,
}

impl CustomerRouter {
    /// A router for a node of `role`.
    pub fn new(role: Role) -> CustomerRouter {
        CustomerRouter {
            role,
            routes: Mutex::new(Routes::default()),
        }
    }

    /// The customer a message is for.
    pub fn key_of(&self, msg: &Message) -> CustomerKey {
        let app_id = msg.meta.app_id;
        let customer_id = if self.role == Role::Worker {
            msg.meta.customer_id
        } else {
            app_id
        };
        (app_id, customer_id)
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a customer; its queue starts with whatever was held for it.
    /// `None` if the customer is already registered.
    pub fn register(&self, key: CustomerKey) -> Option<Receiver<Delivery>> {
        self.register_inline(key, None)
    }

    /// Registers a customer with an inline handler (see [`Inline`]), which
    /// sees its messages first, on the receive thread.
    pub fn register_inline(
        &self,
        key: CustomerKey,
        inline: Option<Inline>,
    ) -> Option<Receiver<Delivery>> {
        let mut routes = self.routes();
        if routes.customers.contains_key(&key) {
            return None;
        }
        let (tx, rx) = unbounded();
        if let Some(reason) = &routes.failure {
            let _ = tx.send(Delivery::NodeFailed(reason.clone()));
        }
        if let Some(held) = routes.held.remove(&key) {
            debug!(
                "app {} customer {}: delivering {} messages that arrived before it registered",
                key.0,
                key.1,
                held.len()
            );
            routes.held_total -= held.len();
            for msg in held {
                let _ = tx.send(Delivery::Message(msg));
            }
        }
        routes.customers.insert(key, Route { queue: tx, inline });
        Some(rx)
    }

    /// How many messages wait for customers that have not registered.
    pub fn held(&self) -> usize {
        self.routes().held_total
    }

    /// Removes a customer; later messages for it are held again.
    pub fn unregister(&self, key: CustomerKey) {
        self.routes().customers.remove(&key);
    }
}

impl Dispatch for CustomerRouter {
    fn deliver(&self, msg: Message) {
        if msg.meta.app_id == K_EMPTY {
            warn!(
                "dropping a data message from node {} without an app id",
                msg.meta.sender
            );
            return;
        }
        let key = self.key_of(&msg);
        let inline = self
            .routes()
            .customers
            .get(&key)
            .and_then(|r| r.inline.clone());
        let msg = match inline {
            // Not under the lock: the handler may take its time.
            Some(inline) => match inline(msg) {
                Some(msg) => msg,
                None => return,
            },
            None => msg,
        };
        let mut routes = self.routes();
        if let Some(route) = routes.customers.get(&key) {
            if route.queue.send(Delivery::Message(msg)).is_ok() {
                return;
            }
            routes.customers.remove(&key);
            warn!(
                "app {} customer {} has gone: dropping a message for it",
                key.0, key.1
            );
            return;
        }
        if routes.held_total >= MAX_HELD {
            warn!(
                "dropping a message from node {} for app {} customer {}: too many messages wait \
                 for customers that never registered",
                msg.meta.sender, key.0, key.1
            );
            return;
        }
        debug!(
            "holding a message for app {} customer {} until it registers",
            key.0, key.1
        );
        routes.held_total += 1;
        routes.held.entry(key).or_default().push(msg);
    }

    fn undeliverable(&self, msg: Message, reason: String) {
        // The customer that sent it.
        let key = self.key_of(&msg);
        match self.routes().customers.get(&key) {
            Some(route) => {
                let _ = route.queue.send(Delivery::Undeliverable { msg, reason });
            }
            None => debug!("{reason} (its customer has gone)"),
        }
    }

    fn failed(&self, err: &VanError) {
        let reason = err.to_string();
        let mut routes = self.routes();
        routes.failure.get_or_insert(reason.clone());
        for route in routes.customers.values() {
            let _ = route.queue.send(Delivery::NodeFailed(reason.clone()));
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
        let r = CustomerRouter::new(Role::Worker);
        let rx = r.register((0, 0)).unwrap();
        r.failed(&VanError::Failed("gone".into()));
        assert!(matches!(rx.try_recv(), Ok(Delivery::NodeFailed(m)) if m == "gone"));
        let later = r.register((0, 1)).unwrap();
        assert!(matches!(later.try_recv(), Ok(Delivery::NodeFailed(_))));
    }

    #[test]
    fn messages_before_registration_are_held_in_order() {
        let r = CustomerRouter::new(Role::Worker);
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
    fn servers_route_by_app_id() {
        let r = CustomerRouter::new(Role::Server);
        let rx = r.register((3, 3)).unwrap();
        r.deliver(msg(3, 7, 1));
        assert_eq!(ts(&rx.try_recv().unwrap()), 1);
        r.deliver(msg(K_EMPTY, 0, 2));
        assert!(rx.try_recv().is_err());
    }
}
