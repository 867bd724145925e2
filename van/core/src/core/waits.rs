//! What a caller of the driver blocks on: a [`Ticket`] the core completes
//! (joined, a barrier released, an answer here) or times out (its deadline
//! is the core's, ticked like any other), so the driver has one wait for
//! every call and no clock of its own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pslite_proto::checkpoint::CheckpointMsg;
use pslite_proto::store::StoreMsg;

use super::Core;
use crate::error::{Failure, VanError};

/// How long [`Core::exit_flush`] waits for the driver to write what waits
/// in its links before the sockets close.
pub const EXIT_FLUSH: Duration = Duration::from_secs(1);

/// What a caller waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// This node to join ([`Core::register`]).
    Join,
    /// Barrier `token` ([`Core::barrier`]).
    Barrier(u64),
    /// The answer to store request `id` ([`Core::store_request`]).
    Store(u64),
    /// The scheduler's acceptance of checkpoint request `ticket`
    /// ([`Core::checkpoint_request`]).
    CheckpointAccepted(u64),
    /// The result of checkpoint request `ticket`.
    CheckpointResult(u64),
    /// The scheduler's answer to this server's leave ([`Core::leave_job`]).
    Leave,
    /// The exit drain ([`Core::finish`]).
    Drain,
    /// The driver's writes waiting in its links, before the sockets close
    /// ([`Core::exit_flush`]).
    Flush,
}

/// A wait the core keeps: ask [`Core::outcome`], then [`Core::end_wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

/// How a wait ended well.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    /// Joined, released, left, drained, flushed.
    Ok,
    /// A store request's answer.
    Store(StoreMsg),
    /// A checkpoint request's acceptance or result.
    Checkpoint(CheckpointMsg),
}

struct Waiting {
    wait: Wait,
    /// When it times out, and its limit (for the error).
    deadline: Option<(Instant, Duration)>,
    timed_out: bool,
}

/// The waits under way.
#[derive(Default)]
pub(super) struct Waits {
    waiting: BTreeMap<Ticket, Waiting>,
    next: u64,
    /// The driver's links have nothing waiting (see [`Core::exit_flush`]).
    flushed: bool,
}

impl Waits {
    /// The earliest deadline of a wait not timed out yet.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.waiting
            .values()
            .filter(|w| !w.timed_out)
            .filter_map(|w| w.deadline.map(|d| d.0))
            .min()
    }

    /// Times out the waits whose deadline passed; whether any did.
    pub(super) fn tick(&mut self, now: Instant) -> bool {
        let mut any = false;
        for w in self.waiting.values_mut() {
            if !w.timed_out && w.deadline.is_some_and(|d| now >= d.0) {
                w.timed_out = true;
                any = true;
            }
        }
        any
    }
}

impl Core {
    /// Starts a wait for `wait`, timed out after `limit` if one is given
    /// (the waits whose end the components time, a barrier's or a store
    /// request's, have none here).
    pub fn wait(&mut self, wait: Wait, limit: Option<Duration>, now: Instant) -> Ticket {
        let waits = &mut self.waits;
        let ticket = Ticket(waits.next);
        waits.next += 1;
        waits.waiting.insert(
            ticket,
            Waiting {
                wait,
                deadline: limit.map(|l| (now + l, l)),
                timed_out: false,
            },
        );
        ticket
    }

    /// How the wait on `ticket` ended; `None` while it goes on.
    pub fn outcome(&self, ticket: Ticket) -> Option<Result<Done, VanError>> {
        let w = self.waits.waiting.get(&ticket)?;
        let limit = w.deadline.map_or(Duration::ZERO, |d| d.1);
        match w.wait {
            Wait::Join => self.join_status().map(|r| r.map(|()| Done::Ok)),
            Wait::Barrier(token) => {
                let outcome = self.barrier_outcome(token)?;
                Some(
                    outcome
                        .map(|()| Done::Ok)
                        .map_err(|failure| match VanError::from(failure) {
                            VanError::BarrierTimeout { group, secs, .. } => {
                                VanError::BarrierTimeout {
                                    group,
                                    secs,
                                    identity_conflicts: self.identity_conflicts(),
                                }
                            }
                            e => e,
                        }),
                )
            }
            Wait::Store(id) => {
                let answer = self.store_answer(id)?;
                Some(answer.map(Done::Store).map_err(VanError::from))
            }
            Wait::CheckpointAccepted(ticket) | Wait::CheckpointResult(ticket) => {
                let result = matches!(w.wait, Wait::CheckpointResult(_));
                let answers = match self.checkpoint_answer(ticket) {
                    Ok(answers) => answers,
                    Err(f) => return Some(Err(f.into())),
                };
                if let Some(answer) = if result { answers.1 } else { answers.0 } {
                    return Some(Ok(Done::Checkpoint(answer)));
                }
                w.timed_out.then(|| {
                    Err(Failure::Checkpoint {
                        detail: format!(
                            "no {} from the scheduler within {:.1} s{}",
                            if result { "result" } else { "answer" },
                            limit.as_secs_f64(),
                            if result {
                                " (a checkpoint is taken at the workers' next barrier where \
                                 none has a request in flight)"
                            } else {
                                ""
                            }
                        ),
                    }
                    .into())
                })
            }
            Wait::Leave => {
                if let Some(outcome) = self.leave_outcome() {
                    return Some(
                        outcome
                            .map(|()| Done::Ok)
                            .map_err(|detail| VanError::Setup {
                                what: "leave the job",
                                detail,
                            }),
                    );
                }
                if let Some(f) = self.failure() {
                    return Some(Err(VanError::Failed(f.clone())));
                }
                w.timed_out.then(|| {
                    Err(VanError::Setup {
                        what: "leave the job",
                        detail: format!(
                            "the scheduler did not let this server go within {} s (its ranges \
                             are still being copied to the other servers, or the scheduler is \
                             unreachable)",
                            limit.as_secs()
                        ),
                    })
                })
            }
            Wait::Drain => self.drain_outcome().map(|_| Ok(Done::Ok)),
            // A node that failed (its receive thread died, say) flushes
            // nothing more.
            Wait::Flush => (self.waits.flushed || w.timed_out || self.failure().is_some())
                .then_some(Ok(Done::Ok)),
        }
    }

    /// The waiter of `ticket` returned: the wait and what it waited on are
    /// forgotten.
    pub fn end_wait(&mut self, ticket: Ticket) {
        let Some(w) = self.waits.waiting.remove(&ticket) else {
            return;
        };
        match w.wait {
            Wait::Barrier(token) => self.end_barrier(token),
            Wait::Store(id) => self.end_store(id),
            Wait::CheckpointResult(t) => self.end_checkpoint(t),
            Wait::Join | Wait::CheckpointAccepted(_) | Wait::Leave | Wait::Drain | Wait::Flush => {}
        }
    }

    /// The node stops: the driver's writes that wait in its links (to a
    /// peer slow to read, or written while another thread held the socket)
    /// go out before the sockets close, for up to [`EXIT_FLUSH`]. `waiting`:
    /// whether any waits now; the driver says [`Core::links_flushed`] once
    /// none does.
    pub fn exit_flush(&mut self, waiting: bool, now: Instant) -> Ticket {
        self.waits.flushed = !waiting;
        self.wait(Wait::Flush, Some(EXIT_FLUSH), now)
    }

    /// Nothing waits in the driver's links any more (see
    /// [`Core::exit_flush`]).
    pub fn links_flushed(&mut self) {
        if !self.waits.flushed {
            self.waits.flushed = true;
            self.changed = true;
        }
    }
}
