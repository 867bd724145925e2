//! The waits of blocking callers, one table for every client of the
//! scheduler (the node's [`Core`](crate::Core), the [`admin`](crate::admin)
//! client): a call gets a [`Ticket`], and the deadline the caller gave sits
//! on its wait, nowhere else. What a wait is for (`W`) is its owner's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A call under way: ask its owner for the outcome, then end the wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

/// One wait: what for, and when it times out.
pub struct Waiting<W> {
    /// What it waits on.
    pub wait: W,
    /// When it times out, and how long it will have waited then (for the
    /// error).
    deadline: Option<(Instant, Duration)>,
    /// Its deadline passed.
    pub timed_out: bool,
}

impl<W> Waiting<W> {
    /// How long the wait lasts in all (zero without a deadline).
    pub fn limit(&self) -> Duration {
        self.deadline.map_or(Duration::ZERO, |d| d.1)
    }
}

/// The waits under way, by ticket.
pub struct Tickets<W> {
    waiting: BTreeMap<Ticket, Waiting<W>>,
    next: u64,
}

impl<W> Default for Tickets<W> {
    fn default() -> Self {
        Tickets {
            waiting: BTreeMap::new(),
            next: 0,
        }
    }
}

impl<W> Tickets<W> {
    /// Starts waiting on `wait`, for up to `limit` from `now` if given.
    pub fn start(&mut self, wait: W, limit: Option<Duration>, now: Instant) -> Ticket {
        let ticket = Ticket(self.next);
        self.next += 1;
        let deadline = limit.map(|l| (now + l, l));
        let waiting = Waiting {
            wait,
            deadline,
            timed_out: false,
        };
        self.waiting.insert(ticket, waiting);
        ticket
    }

    /// The wait of `ticket`, while it lasts.
    pub fn get(&self, ticket: Ticket) -> Option<&Waiting<W>> {
        self.waiting.get(&ticket)
    }

    /// Forgets the wait of `ticket` (its caller returned).
    pub fn end(&mut self, ticket: Ticket) -> Option<Waiting<W>> {
        self.waiting.remove(&ticket)
    }

    /// The waits under way.
    pub fn waits_mut(&mut self) -> impl Iterator<Item = &mut W> {
        self.waiting.values_mut().map(|w| &mut w.wait)
    }

    /// The earliest deadline of a wait not timed out yet.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.waiting
            .values()
            .filter(|w| !w.timed_out)
            .filter_map(|w| w.deadline.map(|d| d.0))
            .min()
    }

    /// Times out the waits whose deadline passed at `now`; whether any did.
    pub fn tick(&mut self, now: Instant) -> bool {
        self.tick_extending(now, |_| None)
    }

    /// [`Tickets::tick`], where `extend` may give a wait whose deadline
    /// passed more time instead (a grace it had, say).
    pub fn tick_extending(
        &mut self,
        now: Instant,
        mut extend: impl FnMut(&mut W) -> Option<Duration>,
    ) -> bool {
        let mut any = false;
        for w in self.waiting.values_mut() {
            let Some((at, limit)) = w.deadline.filter(|d| !w.timed_out && now >= d.0) else {
                continue;
            };
            match extend(&mut w.wait) {
                Some(more) => w.deadline = Some((at + more, limit + more)),
                None => {
                    w.timed_out = true;
                    any = true;
                }
            }
        }
        any
    }
}
