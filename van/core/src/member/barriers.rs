//! Barrier waits: the request, the scheduler's release (or its failure
//! naming a dead node), and every wait ending when this server leaves
//! the job.

use log::{debug, warn};
use pslite_proto::ids::{self, SCHEDULER};
use pslite_proto::{Command, Message};

use super::{BarrierOutcome, BarrierWaiter, Member};
use crate::error::Failure;

impl Member {
    /// Starts waiting on a barrier over `group` (its deadline is the
    /// caller's wait): the token to ask about it and the BARRIER request
    /// to send.
    pub fn barrier(&mut self, customer_id: i32, group: i32) -> (u64, Message) {
        let token = self.next_token;
        self.next_token += 1;
        let mut outcome = None;
        if let Some(f) = &self.failure {
            outcome = Some(Err(f.clone()));
        }
        self.barriers.push(BarrierWaiter {
            token,
            group,
            outcome,
        });
        let mut msg = Message::control(Command::Barrier, SCHEDULER);
        msg.meta.request = true;
        msg.meta.app_id = 0;
        msg.meta.customer_id = customer_id;
        msg.meta.control.barrier_group = group;
        (token, msg)
    }

    /// How barrier `token` ended, if it has.
    pub fn barrier_outcome(&self, token: u64) -> Option<BarrierOutcome> {
        self.barriers
            .iter()
            .find(|w| w.token == token)
            .and_then(|w| w.outcome.clone())
    }

    /// Forgets barrier `token` (its waiter has returned).
    pub fn end_barrier(&mut self, token: u64) {
        self.barriers.retain(|w| w.token != token);
    }

    /// Ends every barrier wait well (this server left the job: nothing
    /// waits for it, and it waits for nothing).
    pub fn release_barriers(&mut self) {
        for w in &mut self.barriers {
            w.outcome.get_or_insert(Ok(()));
        }
    }

    /// Barrier waiters still waiting.
    pub fn waiting_barriers(&self) -> usize {
        self.barriers.iter().filter(|w| w.outcome.is_none()).count()
    }

    /// The scheduler's BARRIER reply: releases the waiters of its group, or
    /// fails them when it names a dead node (a pslite scheduler).
    pub fn on_barrier_release(&mut self, msg: &Message) {
        if msg.meta.sender != SCHEDULER || msg.meta.request {
            warn!(
                "dropping BARRIER from node {}: only the scheduler releases barriers",
                msg.meta.sender
            );
            return;
        }
        let group = msg.meta.control.barrier_group;
        let outcome = match msg.meta.control.failed_peer {
            Some(id) => Err(Failure::PeerDead {
                id,
                secs: self.cfg.van.recovery_timeout.as_secs(),
            }),
            None => Ok(()),
        };
        let matching = self
            .barriers
            .iter()
            .any(|w| w.group == group && w.outcome.is_none());
        if matching {
            for w in self.barriers.iter_mut().filter(|w| w.group == group) {
                w.outcome.get_or_insert(outcome.clone());
            }
        } else if !ids::is_role_group(group) {
            // A C++ scheduler leaves the group of its replies uninitialised:
            // the release is for whatever barrier we are waiting on.
            for w in self.barriers.iter_mut() {
                w.outcome.get_or_insert(outcome.clone());
            }
        } else {
            debug!("barrier release for group {group}, which nobody here waits on");
        }
    }
}
