//! Answers to admin clients (`pslite status`, `pslite store`, `pslite
//! checkpoint`), which are not cluster members: each goes back on the
//! connection its request came on, through this node's ROUTER, within a
//! budget of answers ZeroMQ has not written yet (`PS_STORE_MAX_BYTES`), so
//! a client that reads nothing cannot pin the scheduler's memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use pslite_proto::store::StoreMsg;
use pslite_proto::Message;

use crate::effects::Output;

/// About how many bytes a store answer takes on the wire.
pub fn reply_size(store: &StoreMsg) -> usize {
    store.value.as_ref().map_or(0, |v| v.len())
        + store.expected.as_ref().map_or(0, |v| v.len())
        + store.values.iter().map(|v| v.len() + 4).sum::<usize>()
        + store.keys.iter().map(|k| k.len() + 4).sum::<usize>()
        + 64
}

/// The budget of unwritten answers, shared with the driver: it takes each
/// [`Output::Reply`]'s `reserved` bytes off once ZeroMQ has written or
/// dropped the answer.
#[derive(Clone, Debug)]
pub struct Replies {
    gauge: Arc<AtomicUsize>,
    budget: usize,
}

impl Replies {
    /// A budget of `budget` bytes, none in use.
    pub fn new(budget: usize) -> Replies {
        Replies {
            gauge: Arc::new(AtomicUsize::new(0)),
            budget,
        }
    }

    /// The bytes in use (see [`crate::Core::reply_gauge`]).
    pub fn gauge(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.gauge)
    }

    /// The answer `msg` on connection `route`, if the budget has room for
    /// it (its share taken); `None` if not (nothing is reserved).
    pub fn reply(&self, route: Bytes, msg: Message) -> Option<Output> {
        let size =
            msg.meta.store.as_deref().map_or(0, reply_size) + msg.meta.status.len() * 512 + 256;
        let queued = self.gauge.load(Ordering::Relaxed);
        if queued + size > self.budget {
            return None;
        }
        self.gauge.fetch_add(size, Ordering::Relaxed);
        Some(Output::Reply {
            route,
            msg,
            reserved: size,
        })
    }

    /// A small answer (a refusal) whatever the budget.
    pub fn unbudgeted(route: Bytes, msg: Message) -> Output {
        Output::Reply {
            route,
            msg,
            reserved: 0,
        }
    }
}
