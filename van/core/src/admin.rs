//! An admin client's side of the protocol: a program that is not a
//! cluster member (`pslite status`, `pslite store`, checkpoints) asking a
//! running cluster's scheduler, with no socket and no clock.
//!
//! The driver (`pslite_van::admin::AdminClient`) holds one DEALER (with no
//! identity) to the scheduler. A request is a [`Call`] (status, a store
//! request, a checkpoint and its result) given to [`Admin::call`]: it
//! returns a [`Ticket`] and a message to send ([`Admin::take_output`]).
//! What the scheduler sends back on that connection goes to
//! [`Admin::handle`]: an answer completes the wait whose command and
//! timestamp it carries, a store event goes to the caller waiting for one
//! ([`Admin::next_event`]) or queues; anything else is dropped. What the
//! DEALER's socket monitor sees goes to [`Admin::link_event`] and
//! [`Admin::handshake_failed`]: they tell the errors apart (nothing
//! accepting the connection, a scheduler that accepted it and did not
//! answer, a handshake refused over `PS_AUTH_TOKEN`, a connection that
//! closed). Every wait has its deadline, on the wait ([`Tickets`]), so a
//! scheduler that is not there (or is C++ ps-lite, which does not know
//! these requests) gives a clear error instead of a hang.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pslite_proto::checkpoint::{CheckpointMsg, CheckpointOp};
use pslite_proto::ids::SCHEDULER;
use pslite_proto::store::StoreOp;
use pslite_proto::{Command, Message, Meta};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::effects::LinkEvent;
use crate::tickets::{Ticket, Tickets};
use crate::{Call, Cause, Done, VanError};

/// How much longer than its deadline a request that waits on the scheduler
/// (a GET, WAIT or MULTI_GET with a timeout) may wait for its answer, once
/// the scheduler is known to be there: the answer leaves it at that
/// deadline.
pub const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// Handshakes dropped in a row after which a client without a token takes
/// it that the scheduler wants one (ZeroMQ retries every 100 ms).
const DROPS_MEAN_A_TOKEN: u32 = 5;

/// What an admin client saw of its connection to the scheduler (from its
/// DEALER's socket monitor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// No connection attempt has finished (a host that does not answer).
    Pending,
    /// Connecting failed this many times (nothing listens there).
    Failing(u32),
    /// Connections were made but the peer hung up during the ZeroMQ
    /// handshake, this many times in a row (a scheduler that wants a
    /// `PS_AUTH_TOKEN` does that to a client without one, or not a ZeroMQ
    /// socket at all).
    Dropped(u32),
    /// A ZeroMQ socket there accepted the connection and the handshake.
    Accepted,
}

/// How a handshake with the scheduler failed (the DEALER monitor's
/// handshake-failure events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handshake {
    /// The peer hung up during it, with no detail.
    Dropped,
    /// The scheduler refused the token presented (ZAP status).
    TokenRefused(u32),
    /// One side authenticates and the other does not.
    MechanismMismatch,
    /// Another ZMTP protocol error (its code).
    Protocol(u32),
}

/// Why an admin request failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum AdminError {
    /// A ZeroMQ call of the driver failed.
    #[error("{context}: {source}")]
    Zmq {
        /// What was being done.
        context: String,
        /// ZeroMQ's error.
        source: Cause,
    },
    /// Setting up the client's sockets failed (e.g. `PS_AUTH_TOKEN`), or
    /// a call an admin client does not make (joining, a barrier...).
    #[error(transparent)]
    Van(#[from] VanError),
    /// The host of the scheduler does not resolve.
    #[error("cannot find the way to the scheduler: host {0:?} does not resolve")]
    Resolve(String),
    /// No answer came back in time.
    #[error("{}", no_answer(scheduler, *timeout, *connection))]
    NoAnswer {
        /// The scheduler's address.
        scheduler: String,
        /// How long we waited (the timeout asked for, and the grace of a
        /// request waiting on the scheduler if it was given).
        timeout: Duration,
        /// What became of the connection to the scheduler.
        connection: Connection,
    },
    /// The scheduler refused this client's ZeroMQ handshake: a wrong or
    /// missing `PS_AUTH_TOKEN`, or one it does not expect.
    #[error("{detail}")]
    Refused {
        /// What was refused and what to set.
        detail: String,
    },
    /// The scheduler's connection closed while the client waited: it
    /// stopped or died.
    #[error("the scheduler at {scheduler} closed the connection (it stopped or died)")]
    SchedulerGone {
        /// The scheduler's address.
        scheduler: String,
    },
}

/// The message of [`AdminError::NoAnswer`]: why there may have been none.
fn no_answer(scheduler: &str, timeout: Duration, connection: Connection) -> String {
    let head = format!(
        "no answer from the scheduler at {scheduler} within {:.1} s",
        timeout.as_secs_f64()
    );
    match connection {
        Connection::Accepted => format!(
            "{head}, although it accepted the connection: is it a pslite scheduler (C++ \
             ps-lite does not answer these requests)?"
        ),
        Connection::Failing(attempts) => format!(
            "{head}: nothing accepted the connection ({attempts} attempt{}): is a pslite \
             scheduler running there? (check DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT, or \
             --host/--port)",
            if attempts == 1 { "" } else { "s" }
        ),
        Connection::Dropped(times) => format!(
            "{head}: it closed the connection during the ZeroMQ handshake ({times} time{}): \
             does it require a PS_AUTH_TOKEN (set the cluster's), and is it a pslite scheduler?",
            if times == 1 { "" } else { "s" }
        ),
        Connection::Pending => format!(
            "{head}: the connection was not made in that time: is the host reachable and a \
             pslite scheduler running there? (check DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT, or \
             --host/--port)"
        ),
    }
}

/// What a wait is for: the answer it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asking {
    Status,
    Store,
    /// A checkpoint's acceptance, then its result.
    Accepted,
    Result,
    /// The next store event of this client's watches.
    Event,
}

/// One wait: the answer it matches (command and timestamp), and what came.
struct Asked {
    asking: Asking,
    timestamp: i32,
    /// How much longer it waits if the scheduler accepted the connection
    /// by its deadline.
    grace: Duration,
    answer: Option<Meta>,
    /// The scheduler's connection closed while it waited.
    gone: bool,
}

/// An admin client's protocol state. See the module docs.
pub struct Admin {
    scheduler: String,
    /// Whether this client presents a `PS_AUTH_TOKEN`.
    has_token: bool,
    connection: Connection,
    /// Why the scheduler refused the handshake, once it has: every call
    /// fails with it from then on.
    refused: Option<String>,
    waits: Tickets<Asked>,
    /// Store events no caller waited for yet.
    events: VecDeque<Meta>,
    out: Vec<Message>,
    rng: StdRng,
}

impl Admin {
    /// A client of the scheduler at `scheduler` (its address, for
    /// messages); `has_token`: whether it presents a `PS_AUTH_TOKEN`;
    /// `seed` draws its requests' timestamps.
    pub fn new(scheduler: String, has_token: bool, seed: u64) -> Admin {
        Admin {
            scheduler,
            has_token,
            connection: Connection::Pending,
            refused: None,
            waits: Tickets::default(),
            events: VecDeque::new(),
            out: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The scheduler's address.
    pub fn scheduler(&self) -> &str {
        &self.scheduler
    }

    /// What this client has seen of its connection to the scheduler.
    pub fn connection(&self) -> Connection {
        self.connection
    }

    /// Starts `call` (status, store, checkpoint, checkpoint result) and
    /// returns the ticket to wait on, which times out `limit` after `now`
    /// (a store request waiting on the scheduler gets [`ANSWER_GRACE`] more
    /// if it accepted the connection by then). A refused handshake fails at
    /// once.
    pub fn call(
        &mut self,
        call: Call,
        limit: Duration,
        now: Instant,
    ) -> Result<Ticket, AdminError> {
        if let Some(detail) = &self.refused {
            return Err(AdminError::Refused {
                detail: detail.clone(),
            });
        }
        // A fresh timestamp pairs the answer with this request (and keeps a
        // resending scheduler from taking it for a duplicate of the last one).
        let timestamp = self.rng.random_range(0..i32::MAX);
        let mut grace = Duration::ZERO;
        let asking = match call {
            Call::Status => {
                self.send(Command::Status, timestamp, |_| {});
                Asking::Status
            }
            Call::Store(mut req) => {
                if req.timeout.is_some()
                    && matches!(req.op, StoreOp::Get | StoreOp::Wait | StoreOp::MultiGet)
                {
                    grace = ANSWER_GRACE;
                }
                // The scheduler answers store requests with their id as timestamp.
                req.id = timestamp as u64;
                self.send(Command::Store, timestamp, |m| m.store = Some(Box::new(req)));
                Asking::Store
            }
            Call::Checkpoint { label } => {
                let mut req = CheckpointMsg::new(CheckpointOp::Request, 0);
                req.label = label;
                self.send(Command::Checkpoint, timestamp, |m| {
                    m.checkpoint = Some(Box::new(req))
                });
                Asking::Accepted
            }
            // The result comes with the accepted request's timestamp.
            Call::CheckpointResult { request } => {
                let asked = Asked::new(Asking::Result, request as i32);
                return Ok(self.waits.start(asked, Some(limit), now));
            }
            other => {
                return Err(AdminError::Van(VanError::Setup {
                    what: "ask the scheduler",
                    detail: format!(
                        "an admin client asks for the status, the store and checkpoints, \
                         not {other:?}"
                    ),
                }))
            }
        };
        let asked = Asked {
            grace,
            ..Asked::new(asking, timestamp)
        };
        Ok(self.waits.start(asked, Some(limit), now))
    }

    /// Waits up to `limit` from `now` for the next event of this client's
    /// store watches (a WATCH with a timeout): done with [`Done::Store`],
    /// or [`Done::Ok`] if none came.
    pub fn next_event(&mut self, limit: Duration, now: Instant) -> Ticket {
        let mut asked = Asked::new(Asking::Event, 0);
        asked.answer = self.events.pop_front();
        self.waits.start(asked, Some(limit), now)
    }

    /// Queues the request `cmd` with `timestamp`, filled in by `fill`.
    fn send(&mut self, cmd: Command, timestamp: i32, fill: impl FnOnce(&mut Meta)) {
        let mut msg = Message::control(cmd, SCHEDULER);
        msg.meta.request = true;
        msg.meta.timestamp = timestamp;
        fill(&mut msg.meta);
        self.out.push(msg);
    }

    /// The requests to send to the scheduler, in order.
    pub fn take_output(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.out)
    }

    /// One message from the scheduler's connection (its frames): an answer
    /// completes the wait it pairs with, a store event goes to a waiter or
    /// queues; anything else (a request, garbage, an answer nothing waits
    /// for, a second answer) is dropped.
    pub fn handle(&mut self, frames: Vec<Vec<u8>>) {
        let Some(m) = frames.first().and_then(|m| Meta::decode(m).ok()) else {
            return;
        };
        if m.request {
            return;
        }
        let event = m.store.as_ref().is_some_and(|s| s.op == StoreOp::Event);
        let result = m
            .checkpoint
            .as_ref()
            .is_some_and(|c| c.op == CheckpointOp::Result);
        let waiter = self.waits.waits_mut().find(|a| {
            a.answer.is_none()
                && if event {
                    a.asking == Asking::Event
                } else {
                    a.asking != Asking::Event
                        && (a.asking.cmd(), a.timestamp) == (m.control.cmd, m.timestamp)
                        && (a.asking != Asking::Result || result)
                }
        });
        match waiter {
            Some(a) => a.answer = Some(m),
            None if event => self.events.push_back(m),
            None => {}
        }
    }

    /// What the DEALER's monitor saw: the connection up, closed (which
    /// fails every call waiting), a connection attempt failed, or refused.
    pub fn link_event(&mut self, event: LinkEvent) {
        match (event, self.connection) {
            (LinkEvent::Up, _) => self.connection = Connection::Accepted,
            // Up once and closed: the scheduler stopped or died (a wait
            // there would last its whole timeout for nothing).
            (LinkEvent::Down, Connection::Accepted) => {
                for a in self.waits.waits_mut().filter(|a| a.answer.is_none()) {
                    a.gone = true;
                }
            }
            // Retries follow every failure; they count only connections
            // nothing accepted.
            (LinkEvent::Unreachable, Connection::Pending) => {
                self.connection = Connection::Failing(1)
            }
            (LinkEvent::Unreachable, Connection::Failing(n)) => {
                self.connection = Connection::Failing(n + 1)
            }
            (LinkEvent::Refused(detail), _) => self.refused = Some(detail),
            _ => {}
        }
    }

    /// A handshake with the scheduler failed: refused (every call fails,
    /// saying what to set), or dropped (after a few in a row, a client
    /// without a token takes it that the scheduler wants one).
    pub fn handshake_failed(&mut self, how: Handshake) {
        let s = &self.scheduler;
        let detail = match how {
            Handshake::Dropped => {
                let times = match self.connection {
                    Connection::Dropped(n) => n + 1,
                    _ => 1,
                };
                self.connection = Connection::Dropped(times);
                if times < DROPS_MEAN_A_TOKEN || self.has_token {
                    return;
                }
                format!(
                    "the scheduler at {s} closed the connection during the ZeroMQ handshake \
                     {times} times in a row: it requires a PS_AUTH_TOKEN and this client \
                     presented none (set PS_AUTH_TOKEN to the cluster's token), or it is not a \
                     pslite scheduler"
                )
            }
            Handshake::TokenRefused(status) => format!(
                "the scheduler at {s} refused this client's PS_AUTH_TOKEN (status {status}): \
                 set PS_AUTH_TOKEN to the cluster's token"
            ),
            Handshake::MechanismMismatch if self.has_token => format!(
                "the scheduler at {s} does not authenticate (its cluster has no \
                 PS_AUTH_TOKEN) but this client presents one: unset PS_AUTH_TOKEN"
            ),
            Handshake::MechanismMismatch => format!(
                "the scheduler at {s} requires a PS_AUTH_TOKEN and this client presented \
                 none: set PS_AUTH_TOKEN to the cluster's token"
            ),
            Handshake::Protocol(code) => format!(
                "the ZeroMQ handshake with the scheduler at {s} failed (protocol error \
                 {code:#x}): check PS_AUTH_TOKEN"
            ),
        };
        self.refused = Some(detail);
    }

    /// When [`Admin::tick`] has work next: the earliest deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.waits.poll_timeout()
    }

    /// Times out the waits whose deadline passed at `now` (a wait with a
    /// grace gets it instead if the scheduler accepted the connection).
    pub fn tick(&mut self, now: Instant) {
        let accepted = self.connection == Connection::Accepted;
        self.waits.tick_extending(now, |a| {
            let grace = std::mem::take(&mut a.grace);
            (accepted && !grace.is_zero()).then_some(grace)
        });
    }

    /// How the call of `ticket` ended; `None` while it goes on.
    pub fn outcome(&self, ticket: Ticket) -> Option<Result<Done, AdminError>> {
        let w = self.waits.get(ticket)?;
        let a = &w.wait;
        let no_answer = || AdminError::NoAnswer {
            scheduler: self.scheduler.clone(),
            timeout: w.limit(),
            connection: self.connection,
        };
        if let Some(answer) = &a.answer {
            return Some(a.asking.done(answer).ok_or_else(no_answer));
        }
        if let Some(detail) = &self.refused {
            let detail = detail.clone();
            return Some(Err(AdminError::Refused { detail }));
        }
        if a.gone {
            let scheduler = self.scheduler.clone();
            return Some(Err(AdminError::SchedulerGone { scheduler }));
        }
        match a.asking {
            Asking::Event => w.timed_out.then_some(Ok(Done::Ok)),
            _ => w.timed_out.then(|| Err(no_answer())),
        }
    }

    /// The waiter of `ticket` returned: its wait is forgotten (an answer
    /// that comes later is dropped).
    pub fn end_wait(&mut self, ticket: Ticket) {
        self.waits.end(ticket);
    }
}

impl Asked {
    fn new(asking: Asking, timestamp: i32) -> Asked {
        Asked {
            asking,
            timestamp,
            grace: Duration::ZERO,
            answer: None,
            gone: false,
        }
    }
}

impl Asking {
    /// The command of the request and its answer.
    fn cmd(self) -> Command {
        match self {
            Asking::Status => Command::Status,
            Asking::Store | Asking::Event => Command::Store,
            Asking::Accepted | Asking::Result => Command::Checkpoint,
        }
    }

    /// What an answer says (`None`: it lacks what was asked for).
    fn done(self, meta: &Meta) -> Option<Done> {
        let checkpoint = |c: &CheckpointMsg| Done::Checkpoint {
            request: meta.timestamp as u64,
            answer: c.clone(),
        };
        match self {
            Asking::Status => Some(Done::Status(meta.status.clone())),
            Asking::Store | Asking::Event => meta.store.as_deref().cloned().map(Done::Store),
            Asking::Accepted | Asking::Result => meta.checkpoint.as_deref().map(checkpoint),
        }
    }
}

#[cfg(test)]
mod tests;
