//! A node's own checkpoint requests (`Core::checkpoint_request`): one
//! ticket each, and the scheduler's answers to it (ACCEPTED, then RESULT),
//! kept until its waiter returns.

use std::collections::HashMap;

use pslite_proto::checkpoint::{CheckpointMsg, CheckpointOp};
use pslite_proto::ids::SCHEDULER;
use pslite_proto::{Command, Message};

/// The answers kept for a node's own requests at most.
const MAX_ANSWERS: usize = 64;

/// This node's requests: ticket -> (ACCEPTED, RESULT) once here.
pub(super) struct Requests {
    answers: HashMap<u64, (Option<CheckpointMsg>, Option<CheckpointMsg>)>,
    next_ticket: u64,
}

impl Requests {
    pub(super) fn new() -> Requests {
        Requests {
            answers: HashMap::new(),
            next_ticket: 1,
        }
    }

    /// A new request labelled `label`: its ticket and the REQUEST to send
    /// the scheduler (the oldest request's answers are forgotten beyond
    /// [`MAX_ANSWERS`]).
    pub(super) fn open(&mut self, label: &str) -> (u64, Message) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        if self.answers.len() >= MAX_ANSWERS {
            if let Some(&oldest) = self.answers.keys().min() {
                self.answers.remove(&oldest);
            }
        }
        self.answers.insert(ticket, (None, None));
        let mut req = CheckpointMsg::new(CheckpointOp::Request, 0);
        req.label = label.to_string();
        req.ticket = ticket;
        let mut msg = Message::control(Command::Checkpoint, SCHEDULER);
        msg.meta.request = true;
        msg.meta.checkpoint = Some(Box::new(req));
        (ticket, msg)
    }

    /// The answers to request `ticket` so far (ACCEPTED, RESULT).
    pub(super) fn answer(&self, ticket: u64) -> (Option<CheckpointMsg>, Option<CheckpointMsg>) {
        self.answers.get(&ticket).cloned().unwrap_or_default()
    }

    /// Forgets request `ticket` (its waiter returned).
    pub(super) fn end(&mut self, ticket: u64) {
        self.answers.remove(&ticket);
    }

    /// The scheduler's ACCEPTED or RESULT `ck`: kept if it answers a
    /// request of this node; whether it did.
    pub(super) fn answered(&mut self, ck: &CheckpointMsg) -> bool {
        let Some(slot) = self.answers.get_mut(&ck.ticket) else {
            return false;
        };
        if ck.op == CheckpointOp::Accepted {
            slot.0 = Some(ck.clone());
        } else {
            slot.1 = Some(ck.clone());
        }
        true
    }
}
