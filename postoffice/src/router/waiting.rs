//! What waits in the router for a customer that is not ready ([`Ready`]),
//! and the hold that keeps it, counted per customer so that a delivery
//! asks "does anything wait for my customer?" without a scan.

use std::collections::HashMap;
use std::time::Instant;

use pslite_proto::{Message, NodeId};
use pslite_van::hold::Refused;
use pslite_van::HoldQueue;

use super::{CustomerKey, Delivery};

/// Which deliveries a registered customer takes now; the others wait in
/// the router, in order (see the module's doc). Responses and notices
/// (failures, dead peers) are always taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// Key-value requests (every request that is not a SimpleApp command).
    pub kv: bool,
    /// SimpleApp requests (commands).
    pub simple: bool,
    /// Replicated key ranges: copy and restore requests for the app.
    pub copies: bool,
}

impl Ready {
    /// Takes everything (a worker's customer, an app whose handles are set).
    pub const ALL: Ready = Ready {
        kv: true,
        simple: true,
        copies: true,
    };

    /// Takes no request yet (only responses and notices).
    pub const NONE: Ready = Ready {
        kv: false,
        simple: false,
        copies: false,
    };

    /// Whether the customer takes `msg` now.
    pub fn takes_message(self, msg: &Message) -> bool {
        match (msg.meta.request, msg.meta.simple_app) {
            (false, _) => true,
            (true, true) => self.simple,
            (true, false) => self.kv,
        }
    }

    /// Whether the customer takes `delivery` now.
    pub fn takes(self, delivery: &Delivery) -> bool {
        match delivery {
            Delivery::Message(msg) => self.takes_message(msg),
            Delivery::Snapshot { .. } | Delivery::Restore { .. } => self.copies,
            Delivery::Undeliverable { .. }
            | Delivery::PeerDead { .. }
            | Delivery::NodeFailed(_) => true,
        }
    }
}

/// What waits for a customer: for whom, what, since when.
pub(super) type Held = (CustomerKey, Delivery, Instant);

/// The router's hold (`PS_HOLD_LIMIT`), in arrival order, with how many
/// items wait for each customer.
pub(super) struct Waiting {
    queue: HoldQueue<Held>,
    per_customer: HashMap<CustomerKey, usize>,
}

impl Waiting {
    pub(super) fn new(limit: usize) -> Waiting {
        Waiting {
            queue: HoldQueue::new(limit),
            per_customer: HashMap::new(),
        }
    }

    /// Holds `item` from `sender` (`payload` bytes), if it fits; else gives
    /// it back (as [`HoldQueue::push`] does: the caller answers it; moved,
    /// not boxed, as it is only on the refusal path).
    #[allow(clippy::result_large_err)]
    pub(super) fn push(
        &mut self,
        sender: NodeId,
        payload: usize,
        item: Held,
    ) -> Result<(), Refused<Held>> {
        let key = item.0;
        self.queue.push(sender, payload, item)?;
        *self.per_customer.entry(key).or_default() += 1;
        Ok(())
    }

    /// Takes the items `wanted` picks, in order.
    pub(super) fn take_if(&mut self, wanted: impl FnMut(&Held) -> bool) -> Vec<Held> {
        let taken = self.queue.take_if(wanted);
        for (key, _, _) in &taken {
            if let Some(n) = self.per_customer.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    self.per_customer.remove(key);
                }
            }
        }
        taken
    }

    /// Takes what is held for `key` that `ready` lets through: in order, up
    /// to the first delivery it does not take.
    pub(super) fn take_ready(&mut self, key: CustomerKey, ready: Ready) -> Vec<Delivery> {
        if self.count_for(key) == 0 {
            return Vec::new();
        }
        let mut blocked = false;
        let taken = self.take_if(|(k, delivery, _)| {
            if *k != key || blocked {
                return false;
            }
            blocked = !ready.takes(delivery);
            !blocked
        });
        taken.into_iter().map(|(_, delivery, _)| delivery).collect()
    }

    /// How many items wait for customer `key`.
    pub(super) fn count_for(&self, key: CustomerKey) -> usize {
        self.per_customer.get(&key).copied().unwrap_or(0)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Held> {
        self.queue.iter()
    }

    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(super) fn bytes(&self) -> usize {
        self.queue.bytes()
    }

    pub(super) fn limit(&self) -> usize {
        self.queue.limit()
    }
}
