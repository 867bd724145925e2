//! What a caller asks the core and blocks on: a [`Call`] (join, a barrier,
//! a store request, a checkpoint, a server's leave, the exit drain and
//! flush) given to [`Core::call`], which starts it and returns a
//! [`Ticket`]; the core completes the ticket (joined, a barrier released,
//! an answer here) or times it out at the deadline the caller gave (the
//! core's, ticked like any other), so the driver has one wait for every
//! call and no clock of its own, and no component keeps a caller's
//! deadline.

use std::time::{Duration, Instant};

use pslite_proto::checkpoint::CheckpointMsg;
use pslite_proto::ids;
use pslite_proto::stats::NodeStatus;
use pslite_proto::store::StoreMsg;

use super::Core;
use crate::error::{Failure, VanError};
pub use crate::tickets::Ticket;
use crate::tickets::Tickets;

/// How long the exit flush ([`Call::Flush`]) waits for the driver to
/// write what waits in its links before the sockets close.
pub const EXIT_FLUSH: Duration = Duration::from_secs(1);

/// A blocking call of a user, given to [`Core::call`].
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// Join the cluster as customer `customer` (ADD_NODE to the scheduler;
    /// on the scheduler, every node registering). Its deadline is
    /// `PS_START_TIMEOUT`'s, kept by the node table; returns at once if joined.
    Join {
        /// The customer joining.
        customer: i32,
    },
    /// Wait until every member of `group` (a sum of 1 scheduler, 2
    /// servers, 4 workers) has entered a barrier over it.
    Barrier {
        /// The customer entering.
        customer: i32,
        /// The group.
        group: i32,
    },
    /// A request to the key-value store the scheduler hosts; done with
    /// [`Done::Store`].
    Store(StoreMsg),
    /// Ask the scheduler for a checkpoint labelled `label`, taken at the
    /// workers' next barrier where none has a request in flight; done once
    /// accepted ([`Done::Checkpoint`], whose `request` the result is
    /// waited for with).
    Checkpoint {
        /// The checkpoint's label.
        label: String,
    },
    /// The result of accepted checkpoint `request` (every server's file,
    /// in [`Done::Checkpoint`]'s answer).
    CheckpointResult {
        /// From the acceptance.
        request: u64,
    },
    /// The scheduler's status table: itself first, then every node with
    /// its liveness and last counters ([`Done::Status`]). An admin
    /// client's call (`crate::admin`); a member does not make it.
    Status,
    /// On a server of a job whose servers join and leave: leave it once
    /// its ranges are on the other servers.
    Leave,
    /// The exit drain: this node stops once what it sent is acknowledged
    /// (see `Core::finish`); its store watches end.
    Drain,
    /// The driver's writes waiting in its links go out before the sockets
    /// close (for up to [`EXIT_FLUSH`]); `waiting`: whether any waits now
    /// (the driver says [`Core::links_flushed`] once none does).
    Flush {
        /// Whether a write waits in a link now.
        waiting: bool,
    },
}

/// What the core waits on for a ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wait {
    Join,
    Barrier { token: u64, group: i32 },
    Store(u64),
    CheckpointAccepted(u64),
    CheckpointResult(u64),
    Leave,
    Drain,
    Flush,
}

/// How a call ended well.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    /// Joined, released, left, drained, flushed.
    Ok,
    /// A store request's answer.
    Store(StoreMsg),
    /// The scheduler's status table.
    Status(Vec<NodeStatus>),
    /// A checkpoint request's acceptance or result.
    Checkpoint {
        /// The request, for [`Call::CheckpointResult`].
        request: u64,
        /// The scheduler's answer: the checkpoint's id, and in a result
        /// its directory and files.
        answer: CheckpointMsg,
    },
}

impl Done {
    /// A store call's answer ([`VanError::Internal`] for another call's).
    pub fn store(self) -> Result<StoreMsg, VanError> {
        match self {
            Done::Store(answer) => Ok(answer),
            other => Err(other.mismatch("a store call")),
        }
    }

    /// A status call's table ([`VanError::Internal`] for another call's).
    pub fn status(self) -> Result<Vec<NodeStatus>, VanError> {
        match self {
            Done::Status(rows) => Ok(rows),
            other => Err(other.mismatch("a status call")),
        }
    }

    /// A checkpoint call's request and answer ([`VanError::Internal`] for
    /// another call's).
    pub fn checkpoint(self) -> Result<(u64, CheckpointMsg), VanError> {
        match self {
            Done::Checkpoint { request, answer } => Ok((request, answer)),
            other => Err(other.mismatch("a checkpoint call")),
        }
    }

    /// The error of `call` ended with this outcome, another call's.
    fn mismatch(&self, call: &str) -> VanError {
        let what = match self {
            Done::Ok => "no answer",
            Done::Store(_) => "a store answer",
            Done::Status(_) => "a status table",
            Done::Checkpoint { .. } => "a checkpoint answer",
        };
        VanError::Internal(format!("{call} ended with {what}"))
    }
}

/// The waits under way.
#[derive(Default)]
pub(super) struct Waits {
    pub(super) tickets: Tickets<Wait>,
    /// The driver's links have nothing waiting (see [`Call::Flush`]).
    flushed: bool,
}

impl Core {
    /// Starts `call` and returns the ticket to wait on; the wait times out
    /// after `limit` if one is given (a call the core cannot start fails
    /// at once: a barrier over a group this node is not in, say).
    pub fn call(
        &mut self,
        call: Call,
        limit: Option<Duration>,
        now: Instant,
    ) -> Result<Ticket, VanError> {
        let wait = match call {
            Call::Join { customer } => {
                self.with_table(now, |t, cx| t.register(customer, now, cx));
                Wait::Join
            }
            Call::Barrier { customer, group } => {
                if !ids::is_role_group(group) || group & ids::role_group(self.cfg.role) == 0 {
                    return Err(VanError::InvalidGroup(group));
                }
                if !self.is_joined() {
                    return Err(VanError::NotReady);
                }
                let token = self.with_barriers(now, |b, cx| b.wait(customer, group, cx));
                Wait::Barrier { token, group }
            }
            Call::Store(req) => Wait::Store(self.with_store(now, |s, cx| s.request(req, cx))?),
            Call::Checkpoint { label } => {
                Wait::CheckpointAccepted(self.with_checkpoints(now, |c, cx| c.request(&label, cx))?)
            }
            Call::CheckpointResult { request } => Wait::CheckpointResult(request),
            Call::Status => {
                return Err(VanError::Setup {
                    what: "ask for the status table",
                    detail: "only an admin client asks for it (`pslite status`)".into(),
                })
            }
            Call::Leave => {
                self.with_leave(now, |l, cx| l.ask(cx))?;
                Wait::Leave
            }
            Call::Drain => {
                self.with_store(now, |s, cx| s.leave(cx));
                self.finish(now);
                Wait::Drain
            }
            Call::Flush { waiting } => {
                self.waits.flushed = !waiting;
                Wait::Flush
            }
        };
        Ok(self.waits.tickets.start(wait, limit, now))
    }

    /// How the call of `ticket` ended; `None` while it goes on.
    pub fn outcome(&self, ticket: Ticket) -> Option<Result<Done, VanError>> {
        let w = self.waits.tickets.get(ticket)?;
        let limit = w.limit();
        match w.wait {
            Wait::Join => self.join_status().map(|r| r.map(|()| Done::Ok)),
            Wait::Barrier { token, group } => {
                let timeout = VanError::BarrierTimeout {
                    group,
                    secs: limit.as_secs(),
                    identity_conflicts: self.identity_conflicts(),
                };
                match self.parts.barriers.outcome(token) {
                    Some(Ok(())) => Some(Ok(Done::Ok)),
                    Some(Err(f)) => Some(Err(f.into())),
                    None => w.timed_out.then_some(Err(timeout)),
                }
            }
            Wait::Store(id) => {
                if let Some(answer) = self.parts.store.answer(id) {
                    return Some(Ok(Done::Store(answer.clone())));
                }
                if let Some(f) = self.failure() {
                    return Some(Err(f.clone().into()));
                }
                let secs = limit.as_secs_f64();
                w.timed_out.then_some(Err(VanError::StoreNoAnswer { secs }))
            }
            Wait::CheckpointAccepted(request) | Wait::CheckpointResult(request) => {
                if let Some(f) = self.failure() {
                    return Some(Err(f.clone().into()));
                }
                let result = matches!(w.wait, Wait::CheckpointResult(_));
                let answers = self.parts.checkpoints.answer(request);
                if let Some(answer) = if result { answers.1 } else { answers.0 } {
                    if answer.error.is_empty() {
                        return Some(Ok(Done::Checkpoint { request, answer }));
                    }
                    let detail = if result {
                        format!("checkpoint {} failed: {}", answer.id, answer.error)
                    } else {
                        format!("checkpoint refused: {}", answer.error)
                    };
                    return Some(Err(Failure::Checkpoint { detail }.into()));
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
                if let Some(outcome) = self.parts.leave.outcome() {
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
    /// forgotten (an accepted checkpoint's request stays, for its result).
    pub fn end_wait(&mut self, ticket: Ticket) {
        let accepted = matches!(self.outcome(ticket), Some(Ok(_)));
        let Some(w) = self.waits.tickets.end(ticket) else {
            return;
        };
        match w.wait {
            Wait::Barrier { token, .. } => self.parts.barriers.end(token),
            Wait::Store(id) => self.parts.store.end(id),
            Wait::CheckpointResult(request) => self.parts.checkpoints.end(request),
            Wait::CheckpointAccepted(request) if !accepted => self.parts.checkpoints.end(request),
            _ => {}
        }
    }

    /// Nothing waits in the driver's links any more (see [`Call::Flush`]).
    pub fn links_flushed(&mut self) {
        if !self.waits.flushed {
            self.waits.flushed = true;
            self.changed = true;
        }
    }
}
