//! Links cut (`ip link set ... down`, then up): a network partition of
//! one node. Nothing is lost and no connection closes (TCP keeps what it
//! sent and retransmits it); what goes over the node's link while it is
//! down arrives at TCP's first retransmission after it comes back: the
//! connection's oldest waiting packet is sent again 200 ms after it was
//! first sent, then after twice as long each time (Linux's minimum
//! retransmission timeout and its backoff), so a cut of d seconds can
//! delay a packet by up to about 2d.

use std::time::{Duration, Instant};

use super::Network;

/// Linux's least retransmission timeout (`TCP_RTO_MIN`).
const RTO_MIN: Duration = Duration::from_millis(200);

impl Network {
    /// Cuts node `i`'s link for `length` from now: its packets, sent or
    /// received, wait (see the module's comment).
    pub fn cut_link(&mut self, i: usize, length: Duration) {
        self.cuts.insert(i, self.now + length);
    }

    /// When a packet from `from` to `to`, due at `at` on an intact link,
    /// arrives given the cuts.
    pub(super) fn through_cuts(&mut self, from: usize, to: usize, at: Instant) -> Instant {
        let now = self.now;
        let down_until = [from, to]
            .iter()
            .filter_map(|n| self.cuts.get(n).copied())
            .filter(|&until| until > now)
            .max();
        let key = (from, to);
        if let Some(until) = down_until {
            // The first packet the cut holds on this connection sets when
            // they all go: later ones queue behind it.
            let arrive = *self
                .stalls
                .entry(key)
                .or_insert_with(|| first_retransmission_after(now, until));
            return at.max(arrive);
        }
        match self.stalls.get(&key) {
            Some(&arrive) if arrive > now => at.max(arrive),
            Some(_) => {
                self.stalls.remove(&key);
                at
            }
            None => at,
        }
    }
}

/// When TCP sends a packet first sent at `sent` again, first at or after
/// `up` (the link is back).
fn first_retransmission_after(sent: Instant, up: Instant) -> Instant {
    let mut rto = RTO_MIN;
    let mut at = sent + rto;
    while at < up {
        rto *= 2;
        at += rto;
    }
    at
}
