//! Barrier waits, a component: the request, the scheduler's release (or
//! its failure naming a dead node), and every wait ending when this
//! server leaves the job or the node fails.

use std::time::Instant;

use log::debug;
use pslite_proto::ids::{self, SCHEDULER};
use pslite_proto::{Command, Message};

use super::BarrierOutcome;
use crate::component::{Component, Cx};
use crate::effects::Event;
use crate::error::Failure;

struct Waiter {
    token: u64,
    group: i32,
    outcome: Option<BarrierOutcome>,
}

/// This node's barrier waits.
#[derive(Default)]
pub struct Barriers {
    waiters: Vec<Waiter>,
    next_token: u64,
}

impl Barriers {
    /// Starts waiting on a barrier over `group` (its deadline is the
    /// caller's wait): sends the BARRIER request and returns the token to
    /// ask about it.
    pub fn wait(&mut self, customer_id: i32, group: i32, cx: &mut Cx<'_>) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.waiters.push(Waiter {
            token,
            group,
            outcome: cx.facts.failure().map(|f| Err(f.clone())),
        });
        let mut msg = Message::control(Command::Barrier, SCHEDULER);
        msg.meta.request = true;
        msg.meta.app_id = 0;
        msg.meta.customer_id = customer_id;
        msg.meta.control.barrier_group = group;
        cx.send(msg);
        token
    }

    /// How barrier `token` ended, if it has.
    pub fn outcome(&self, token: u64) -> Option<BarrierOutcome> {
        self.waiters
            .iter()
            .find(|w| w.token == token)
            .and_then(|w| w.outcome.clone())
    }

    /// Forgets barrier `token` (its waiter has returned).
    pub fn end(&mut self, token: u64) {
        self.waiters.retain(|w| w.token != token);
    }

    /// Ends every wait still waiting with `outcome`.
    fn end_all(&mut self, outcome: &BarrierOutcome) {
        for w in &mut self.waiters {
            w.outcome.get_or_insert_with(|| outcome.clone());
        }
    }
}

impl Component for Barriers {
    /// The scheduler's BARRIER reply (the core's table lets no other
    /// through): releases the waiters of its group, or fails them when it
    /// names a dead node (a pslite scheduler).
    fn handle(&mut self, msg: Message, _now: Instant, cx: &mut Cx<'_>) {
        cx.changed();
        let group = msg.meta.control.barrier_group;
        let outcome = match msg.meta.control.failed_peer {
            Some(id) => Err(Failure::PeerDead {
                id,
                secs: cx.facts.config().recovery_timeout.as_secs(),
            }),
            None => Ok(()),
        };
        let matching = self
            .waiters
            .iter()
            .any(|w| w.group == group && w.outcome.is_none());
        if matching {
            for w in self.waiters.iter_mut().filter(|w| w.group == group) {
                w.outcome.get_or_insert(outcome.clone());
            }
        } else if !ids::is_role_group(group) {
            // A C++ scheduler leaves the group of its replies uninitialised:
            // the release is for whatever barrier we are waiting on.
            self.end_all(&outcome);
        } else {
            debug!("barrier release for group {group}, which nobody here waits on");
        }
    }

    /// This server left the job (nothing waits for it, and it waits for
    /// nothing), or the node failed.
    fn on_event(&mut self, event: &Event, _now: Instant, _cx: &mut Cx<'_>) {
        match event {
            Event::Left => self.end_all(&Ok(())),
            Event::Failed(failure) => self.end_all(&Err(failure.clone())),
            _ => {}
        }
    }
}
