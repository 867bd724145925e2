//! A customer's queue: what the receive thread hands to one customer's
//! thread, in order. It holds at most its limit of data messages
//! (`PS_QUEUE_LIMIT`); a full queue refuses the next one instead of making
//! the receive thread wait, and keeps the [`Room`] signal it was offered
//! with, which it gives once the customer has taken the queue down to half
//! its limit. Notices (a failed request, a dead peer, the node's failure)
//! are never refused: they are few, and a customer must not miss one.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use pslite_proto::{lock, Message};
use pslite_van::Room;

use crate::router::Delivery;

struct State {
    items: VecDeque<Delivery>,
    /// Data messages among `items`.
    messages: usize,
    /// The router dropped its end: no more will come.
    closed: bool,
    /// The customer dropped its end: nothing more is taken.
    gone: bool,
    /// Who to tell once there is room (a message was refused).
    room: Option<Room>,
}

struct Shared {
    state: Mutex<State>,
    ready: Condvar,
    limit: usize,
}

/// The customer's end of its queue. Iterating it waits for each delivery
/// and ends once the customer is unregistered and the queue is empty.
pub struct CustomerQueue {
    shared: Arc<Shared>,
}

/// The router's end of a customer's queue.
pub(crate) struct QueueSender {
    shared: Arc<Shared>,
}

/// A queue holding at most `limit` data messages (at least 1).
pub(crate) fn customer_queue(limit: usize) -> (QueueSender, CustomerQueue) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            messages: 0,
            closed: false,
            gone: false,
            room: None,
        }),
        ready: Condvar::new(),
        limit: limit.max(1),
    });
    (
        QueueSender {
            shared: Arc::clone(&shared),
        },
        CustomerQueue { shared },
    )
}

/// Why a message was not queued.
// A refused message is handed back as it came (boxing it would cost an
// allocation per refusal for nothing).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Refused {
    /// The queue is full: try again after `room` is notified.
    Full(Message),
    /// The customer has gone (the message is dropped).
    Gone,
}

impl QueueSender {
    /// Queues data message `msg` unless the queue is full (then `room` is
    /// kept and notified once it is half empty).
    #[allow(clippy::result_large_err)]
    pub(crate) fn offer(&self, msg: Message, room: &Room) -> Result<(), Refused> {
        let mut state = lock(&self.shared.state);
        if state.gone {
            return Err(Refused::Gone);
        }
        if state.messages >= self.shared.limit {
            state.room = Some(room.clone());
            return Err(Refused::Full(msg));
        }
        state.messages += 1;
        state.items.push_back(Delivery::Message(msg));
        drop(state);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Queues `delivery` whatever the limit (a notice, or what was held for
    /// the customer before it registered); false if the customer has gone.
    pub(crate) fn push(&self, delivery: Delivery) -> bool {
        let mut state = lock(&self.shared.state);
        if state.gone {
            return false;
        }
        if matches!(delivery, Delivery::Message(_)) {
            state.messages += 1;
        }
        state.items.push_back(delivery);
        drop(state);
        self.shared.ready.notify_one();
        true
    }
}

impl Drop for QueueSender {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.ready.notify_all();
    }
}

impl CustomerQueue {
    /// The next delivery, waiting for one; `None` once the queue is closed
    /// and empty.
    pub fn recv(&self) -> Option<Delivery> {
        let state = lock(&self.shared.state);
        let state = pslite_proto::wait_while(&self.shared.ready, state, |s| {
            s.items.is_empty() && !s.closed
        });
        self.pop(state)
    }

    /// The next delivery, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Delivery> {
        let state = lock(&self.shared.state);
        let (state, _) =
            pslite_proto::wait_timeout_while(&self.shared.ready, state, timeout, |s| {
                s.items.is_empty() && !s.closed
            });
        self.pop(state)
    }

    /// The next delivery if one is here.
    pub fn try_recv(&self) -> Option<Delivery> {
        self.pop(lock(&self.shared.state))
    }

    /// Every delivery here now, without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = Delivery> + '_ {
        std::iter::from_fn(|| self.try_recv())
    }

    /// Deliveries waiting.
    pub fn len(&self) -> usize {
        lock(&self.shared.state).items.len()
    }

    /// Whether no delivery waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn pop(&self, mut state: std::sync::MutexGuard<'_, State>) -> Option<Delivery> {
        let item = state.items.pop_front()?;
        if matches!(item, Delivery::Message(_)) {
            state.messages -= 1;
        }
        let room = if state.messages <= self.shared.limit / 2 {
            state.room.take()
        } else {
            None
        };
        drop(state);
        if let Some(room) = room {
            room.notify();
        }
        Some(item)
    }
}

impl Drop for CustomerQueue {
    fn drop(&mut self) {
        let mut state = lock(&self.shared.state);
        state.gone = true;
        state.items.clear();
        let room = state.room.take();
        drop(state);
        // Whatever the Van parked for this customer can be offered (and
        // dropped) now.
        if let Some(room) = room {
            room.notify();
        }
    }
}

impl IntoIterator for CustomerQueue {
    type Item = Delivery;
    type IntoIter = Deliveries;

    fn into_iter(self) -> Deliveries {
        Deliveries(self)
    }
}

/// The deliveries of a [`CustomerQueue`], waiting for each.
pub struct Deliveries(CustomerQueue);

impl Iterator for Deliveries {
    type Item = Delivery;

    fn next(&mut self) -> Option<Delivery> {
        self.0.recv()
    }
}
