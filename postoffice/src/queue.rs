//! A customer's queue: what the receive thread hands to one customer's
//! thread, in order. It holds at most its limit of data messages
//! (`PS_QUEUE_LIMIT`); a full queue refuses the next one instead of making
//! the receive thread wait, and keeps the [`Room`] signal it was offered
//! with, which it gives once the customer has taken the queue down to half
//! its limit. Notices (a failed request, a dead peer, the node's failure)
//! are never refused: they are few, and a customer must not miss one.
//!
//! The deliveries travel on an unbounded crossbeam channel; a counter of
//! the data messages in it is the gate.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, RecvError, RecvTimeoutError, Sender, TryRecvError};
use pslite_proto::{lock, Message};
use pslite_van::Room;

use crate::router::Delivery;

/// The count of data messages queued, and who to tell once there is room.
struct Gate {
    messages: AtomicUsize,
    limit: usize,
    /// Whether `room` holds a signal (read without the lock).
    waiting: AtomicBool,
    room: Mutex<Option<Room>>,
    /// The customer dropped its end: nothing more is taken.
    gone: AtomicBool,
}

impl Gate {
    /// Gives the room signal, if one waits.
    fn open(&self) {
        if !self.waiting.load(Ordering::SeqCst) {
            return;
        }
        let room = lock(&self.room).take();
        self.waiting.store(false, Ordering::SeqCst);
        if let Some(room) = room {
            room.notify();
        }
    }
}

/// The customer's end of its queue (a crossbeam receiver's calls).
/// Iterating it waits for each delivery and ends once the customer is
/// unregistered and the queue is empty.
pub struct CustomerQueue {
    rx: Receiver<Delivery>,
    gate: Arc<Gate>,
}

/// The router's end of a customer's queue.
pub(crate) struct QueueSender {
    tx: Sender<Delivery>,
    gate: Arc<Gate>,
}

/// A queue holding at most `limit` data messages (at least 1).
pub(crate) fn customer_queue(limit: usize) -> (QueueSender, CustomerQueue) {
    let (tx, rx) = unbounded();
    let gate = Arc::new(Gate {
        messages: AtomicUsize::new(0),
        limit: limit.max(1),
        waiting: AtomicBool::new(false),
        room: Mutex::new(None),
        gone: AtomicBool::new(false),
    });
    (
        QueueSender {
            tx,
            gate: Arc::clone(&gate),
        },
        CustomerQueue { rx, gate },
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
        let gate = &self.gate;
        let full = || {
            gate.messages.load(Ordering::SeqCst) >= gate.limit && !gate.gone.load(Ordering::SeqCst)
        };
        if full() {
            *lock(&gate.room) = Some(room.clone());
            gate.waiting.store(true, Ordering::SeqCst);
            // The customer may have drained (or gone) meanwhile, before it
            // could see the signal: then the message goes on after all.
            if full() {
                return Err(Refused::Full(msg));
            }
            lock(&gate.room).take();
            gate.waiting.store(false, Ordering::SeqCst);
        }
        gate.messages.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(Delivery::Message(msg)).is_err() {
            gate.messages.fetch_sub(1, Ordering::SeqCst);
            return Err(Refused::Gone);
        }
        Ok(())
    }

    /// Queues `delivery` whatever the limit (a notice, or what was held for
    /// the customer before it registered); false if the customer has gone.
    pub(crate) fn push(&self, delivery: Delivery) -> bool {
        let message = matches!(delivery, Delivery::Message(_));
        if message {
            self.gate.messages.fetch_add(1, Ordering::SeqCst);
        }
        let sent = self.tx.send(delivery).is_ok();
        if !sent && message {
            self.gate.messages.fetch_sub(1, Ordering::SeqCst);
        }
        sent
    }
}

impl CustomerQueue {
    /// The next delivery, waiting for one; an error once the customer is
    /// unregistered and the queue is empty.
    pub fn recv(&self) -> Result<Delivery, RecvError> {
        self.taken(self.rx.recv())
    }

    /// The next delivery, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Delivery, RecvTimeoutError> {
        self.taken(self.rx.recv_timeout(timeout))
    }

    /// The next delivery, waiting until `deadline`.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<Delivery, RecvTimeoutError> {
        self.taken(self.rx.recv_deadline(deadline))
    }

    /// The next delivery if one is here.
    pub fn try_recv(&self) -> Result<Delivery, TryRecvError> {
        self.taken(self.rx.try_recv())
    }

    /// Every delivery here now, without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = Delivery> + '_ {
        std::iter::from_fn(|| self.try_recv().ok())
    }

    /// Deliveries waiting.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no delivery waits.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// Counts a data message out, and gives the room signal once the queue
    /// is half empty.
    fn taken<E>(&self, delivery: Result<Delivery, E>) -> Result<Delivery, E> {
        if let Ok(Delivery::Message(_)) = &delivery {
            let left = self.gate.messages.fetch_sub(1, Ordering::SeqCst) - 1;
            if left <= self.gate.limit / 2 {
                self.gate.open();
            }
        }
        delivery
    }
}

impl Drop for CustomerQueue {
    fn drop(&mut self) {
        // Whatever the Van parked for this customer can be offered (and
        // dropped) now.
        self.gate.gone.store(true, Ordering::SeqCst);
        self.gate.open();
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
        self.0.recv().ok()
    }
}
