//! The request table: what a customer knows about the requests it sent,
//! one record per request, with no sockets, threads or clock.
//!
//! A request is named by its timestamp, unique within its customer (app id,
//! customer id): the record is where everything about one request lives
//! for its whole life, the app's own part included (its *payload*: what a
//! [`KVWorker`](crate::KVWorker) collects from each server, its callback,
//! the pulled values; nothing for a [`SimpleApp`](crate::SimpleApp)), and
//! where anything else a request needs for its life belongs (an id for
//! at-most-once application, how often it was sent).
//!
//! The rules:
//! - A request is **open** until each node it was sent to has answered once
//!   (or, for a request to no named node, until the expected number of
//!   responses arrived), or until it **fails** (its receiver died, its
//!   message was given up on, a handler panicked). A response from a node
//!   that owes none (never asked, answered already, or the request is over)
//!   is a stray: it is dropped.
//! - The last response (or the failure) makes it **completing**: the one
//!   caller that got the [`Completion`] runs the app's completion (a
//!   callback, assembling pulled values) outside any lock, then hands it
//!   back with [`RequestTable::finish`]: the request is **done**.
//! - A done request stays until waited for (its outcome is given once;
//!   a payload that holds a result, such as pulled values, stays until
//!   taken) or, once its handle is dropped ([`RequestTable::detach`]),
//!   goes when it is done.
//! - An open request that has had no answer for `warn_after`
//!   (`PS_REQUEST_WARN`) is **overdue**: [`RequestTable::tick`] reports it,
//!   naming the nodes that still owe an answer, and again each time its
//!   wait has doubled (after `warn_after`, 2x, 4x, ..., at least once an
//!   hour), so a request nobody answers cannot hang silently.
//! - A failure of the whole node fails every wait; nothing is overdue after
//!   it.
//! - A request sent as several messages to one node (a large pull, in
//!   chunks: see [`KVWorker`](crate::KVWorker)) names that node once per
//!   message and gives each message after the first a timestamp of its own,
//!   an **alias** ([`RequestTable::alias`]): a response or failure under an
//!   alias counts for the request, and the alias goes with its record.
//!
//! Time is an argument: the customer's thread calls [`RequestTable::tick`]
//! when [`RequestTable::poll_timeout`] says, and the tests below run it
//! under virtual time.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use pslite_postoffice::Failure;
use pslite_proto::NodeId;

use crate::Error;

/// The longest gap between two reports of one overdue request.
pub const MAX_WARN_GAP: Duration = Duration::from_secs(3600);

/// Where a request is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for responses.
    Open,
    /// Its completion runs (the payload is out with the [`Completion`]).
    Completing,
    /// Over: its outcome waits to be collected.
    Done,
}

/// One request.
struct Record<P> {
    /// Responses it needs.
    expected: usize,
    /// Responses counted.
    received: usize,
    /// The nodes that still owe a response (`None`: responses from any
    /// node count).
    owing: Option<Vec<NodeId>>,
    stage: Stage,
    failure: Option<Failure>,
    /// The app's part; `None` while its completion runs.
    payload: Option<P>,
    /// Its handle was dropped: nobody will collect it.
    detached: bool,
    /// Further timestamps its messages carry ([`RequestTable::alias`]).
    aliases: Vec<i32>,
    /// When it was sent.
    sent: Instant,
    /// When to report it overdue next.
    warn_at: Instant,
}

/// A request whose responses are in (or that failed): its completion is
/// to run, then [`RequestTable::finish`] takes it back.
#[must_use = "a completion must be finished, or its waiters wait forever"]
pub struct Completion<P> {
    /// The request's timestamp.
    pub ts: i32,
    /// The app's part of the record, to complete.
    pub payload: P,
    /// Why it failed, if it did.
    pub failure: Option<Failure>,
}

/// What a response did to its request.
pub enum Answer<P> {
    /// Not owed: dropped.
    Stray,
    /// Left alone (the caller will offer it again elsewhere).
    Deferred,
    /// The app declined it: not counted.
    Declined,
    /// Counted; more are due.
    Counted,
    /// It completed the request (or failed it): run the completion.
    Completed(Completion<P>),
}

/// An open request that has waited too long for an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overdue {
    /// The request's timestamp.
    pub ts: i32,
    /// The nodes that still owe an answer (empty for a request to no named
    /// node: see `missing`).
    pub owing: Vec<NodeId>,
    /// How many responses are missing.
    pub missing: usize,
    /// How long it has waited.
    pub waited: Duration,
}

/// A done request's outcome, collected.
#[derive(Debug)]
pub struct Outcome<P> {
    /// Why it failed, if it did.
    pub failure: Option<Failure>,
    /// The responses it counted.
    pub responses: usize,
    /// Its payload if the record went (`None`: kept, holding a result still
    /// to be taken).
    pub payload: Option<P>,
}

/// What [`RequestTable::finish`] found worth telling.
#[derive(Debug, Default, PartialEq)]
pub struct Finished {
    /// The request had been counted in flight (it expected responses).
    pub was_in_flight: bool,
    /// Nothing will collect it (its handle was dropped) and it failed: the
    /// failure, for the log.
    pub unwatched_failure: Option<Failure>,
    /// This many done requests wait to be collected (reported at each
    /// multiple of [`UNCLAIMED_WARN_EVERY`]).
    pub unclaimed: Option<usize>,
}

/// Done requests nobody collected, between two warnings about them.
pub const UNCLAIMED_WARN_EVERY: usize = 10_000;

/// Hashes a timestamp with one multiplication. Timestamps are chosen by
/// this customer (consecutive integers), never by a peer (a response only
/// looks one up), so SipHash's defence against chosen keys buys nothing
/// here and would cost on every response.
#[derive(Default)]
struct TsHasher(u64);

impl Hasher for TsHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: spreads consecutive numbers over the high bits
        // the table probes with.
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_i32(&mut self, ts: i32) {
        self.write_u64(u64::from(ts as u32));
    }
}

/// The requests of one customer.
pub struct RequestTable<P> {
    next_ts: i32,
    records: HashMap<i32, Record<P>, BuildHasherDefault<TsHasher>>,
    /// Aliases of open or done records: alias -> the record's timestamp.
    aliases: HashMap<i32, i32, BuildHasherDefault<TsHasher>>,
    /// Done records (waiting to be collected).
    unclaimed: usize,
    /// The node failed: every wait fails with this.
    node_failure: Option<Failure>,
    warn_after: Duration,
    /// No open request is overdue before this (a lower bound: requests
    /// that completed since are not taken out; exact after a tick).
    next_check: Option<Instant>,
}

impl<P> RequestTable<P> {
    /// An empty table that reports requests unanswered for `warn_after`.
    pub fn new(warn_after: Duration) -> Self {
        RequestTable {
            next_ts: 0,
            records: HashMap::default(),
            aliases: HashMap::default(),
            unclaimed: 0,
            node_failure: None,
            warn_after,
            next_check: None,
        }
    }

    /// Opens a request sent at `now` to each of `recvers` (one response
    /// each), or, with `None`, expecting `expected` responses from any
    /// node. Returns its timestamp, and its completion at once if it
    /// expects nothing.
    pub fn open(
        &mut self,
        recvers: Option<&[NodeId]>,
        expected: usize,
        payload: P,
        now: Instant,
    ) -> (i32, Option<Completion<P>>) {
        let ts = self.next_ts;
        self.next_ts = self.next_ts.wrapping_add(1) & i32::MAX;
        let expected = recvers.map_or(expected, <[NodeId]>::len);
        let warn_at = now + self.warn_after;
        let mut record = Record {
            expected,
            received: 0,
            owing: recvers.map(<[NodeId]>::to_vec),
            stage: Stage::Open,
            failure: None,
            payload: Some(payload),
            detached: false,
            aliases: Vec::new(),
            sent: now,
            warn_at,
        };
        let completion = if expected == 0 {
            record.stage = Stage::Completing;
            record.payload.take().map(|payload| Completion {
                ts,
                payload,
                failure: None,
            })
        } else {
            self.next_check = Some(self.next_check.map_or(warn_at, |t| t.min(warn_at)));
            None
        };
        self.records.insert(ts, record);
        (ts, completion)
    }

    /// A further timestamp for open request `ts`, for one more message of
    /// it (to a node it names once per message): responses and failures
    /// under it count for `ts`. `None` if `ts` is not open.
    pub fn alias(&mut self, ts: i32) -> Option<i32> {
        let r = self.records.get_mut(&ts)?;
        if r.stage != Stage::Open {
            return None;
        }
        let alias = self.next_ts;
        self.next_ts = self.next_ts.wrapping_add(1) & i32::MAX;
        r.aliases.push(alias);
        self.aliases.insert(alias, ts);
        Some(alias)
    }

    /// The request a message's timestamp belongs to (itself, or the
    /// request it is an alias of).
    fn resolve(&self, ts: i32) -> i32 {
        self.aliases.get(&ts).copied().unwrap_or(ts)
    }

    /// Removes record `ts` and its aliases.
    fn remove(&mut self, ts: i32) -> Option<Record<P>> {
        let r = self.records.remove(&ts)?;
        for alias in &r.aliases {
            self.aliases.remove(alias);
        }
        Some(r)
    }

    /// A response from `sender` to request `ts`. If `sender` owes one,
    /// `record` sees the payload first and says whether the response counts
    /// (`Ok(false)`: declined, the node still owes one), fails the request
    /// (`Err`), or is left alone (`None`: deferred).
    pub fn respond(
        &mut self,
        ts: i32,
        sender: NodeId,
        record: impl FnOnce(&mut P) -> Option<Result<bool, Failure>>,
    ) -> Answer<P> {
        let ts = self.resolve(ts);
        let Some(r) = self.records.get_mut(&ts) else {
            return Answer::Stray;
        };
        if r.stage != Stage::Open {
            return Answer::Stray;
        }
        let owed_at = match &r.owing {
            None => None,
            Some(owing) => match owing.iter().position(|&id| id == sender) {
                Some(i) => Some(i),
                None => return Answer::Stray,
            },
        };
        let Some(payload) = r.payload.as_mut() else {
            return Answer::Stray;
        };
        let Some(recorded) = record(payload) else {
            return Answer::Deferred;
        };
        match recorded {
            Ok(false) => Answer::Declined,
            Ok(true) => {
                if let (Some(owing), Some(i)) = (r.owing.as_mut(), owed_at) {
                    owing.swap_remove(i);
                }
                r.received += 1;
                if r.received < r.expected {
                    return Answer::Counted;
                }
                match Self::start_completion(ts, r, None) {
                    Some(c) => Answer::Completed(c),
                    None => Answer::Counted,
                }
            }
            Err(failure) => match Self::start_completion(ts, r, Some(failure)) {
                Some(c) => Answer::Completed(c),
                None => Answer::Stray,
            },
        }
    }

    /// Fails open request `ts`: its completion, if it was open.
    pub fn fail(&mut self, ts: i32, failure: Failure) -> Option<Completion<P>> {
        let ts = self.resolve(ts);
        let r = self.records.get_mut(&ts)?;
        if r.stage != Stage::Open {
            return None;
        }
        Self::start_completion(ts, r, Some(failure))
    }

    fn start_completion(
        ts: i32,
        r: &mut Record<P>,
        failure: Option<Failure>,
    ) -> Option<Completion<P>> {
        let payload = r.payload.take()?;
        r.stage = Stage::Completing;
        Some(Completion {
            ts,
            payload,
            failure,
        })
    }

    /// Takes back a completion that has run: the request is done.
    pub fn finish(&mut self, completion: Completion<P>) -> Finished {
        let ts = completion.ts;
        let Some(r) = self.records.get_mut(&ts) else {
            return Finished::default();
        };
        if r.stage != Stage::Completing {
            return Finished::default();
        }
        r.stage = Stage::Done;
        r.failure = completion.failure;
        r.payload = Some(completion.payload);
        let mut finished = Finished {
            was_in_flight: r.expected > 0,
            ..Finished::default()
        };
        if r.detached {
            finished.unwatched_failure = r.failure.take();
            self.remove(ts);
        } else {
            self.unclaimed += 1;
            if self.unclaimed % UNCLAIMED_WARN_EVERY == 0 {
                finished.unclaimed = Some(self.unclaimed);
            }
        }
        finished
    }

    /// The node failed: every wait fails with `failure` from now on.
    pub fn fail_node(&mut self, failure: Failure) {
        self.node_failure.get_or_insert(failure);
        self.next_check = None;
    }

    /// Open requests that still wait for node `id`.
    pub fn waiting_on(&self, id: NodeId) -> Vec<i32> {
        self.records
            .iter()
            .filter(|(_, r)| r.stage == Stage::Open)
            .filter(|(_, r)| r.owing.as_ref().is_some_and(|o| o.contains(&id)))
            .map(|(&ts, _)| ts)
            .collect()
    }

    /// How many responses request `ts` has counted.
    pub fn num_responses(&self, ts: i32) -> usize {
        self.records.get(&ts).map_or(0, |r| r.received)
    }

    /// Whether `ts` was handed out (and may have been collected since).
    fn issued(&self, ts: i32) -> bool {
        (0..self.next_ts).contains(&ts)
    }

    /// Whether a wait for request `ts` can return: it is done, collected,
    /// unknown, or the node failed.
    pub fn is_settled(&self, ts: i32) -> bool {
        self.node_failure.is_some() || self.records.get(&ts).is_none_or(|r| r.stage == Stage::Done)
    }

    /// The outcome of request `ts` once it is done (`None`: not yet). The
    /// record goes with it, unless `take` is false and `holds_result` says
    /// its payload holds a result still to be taken. `Ok(None)`: collected
    /// before; an error if the timestamp was never handed out or the node
    /// failed first.
    pub fn collect(
        &mut self,
        ts: i32,
        take: bool,
        holds_result: impl FnOnce(&P) -> bool,
    ) -> Option<Result<Option<Outcome<P>>, Error>> {
        let Some(r) = self.records.get(&ts) else {
            return Some(if self.issued(ts) {
                Ok(None)
            } else {
                Err(Error::UnknownTimestamp(ts))
            });
        };
        if r.stage != Stage::Done {
            return self
                .node_failure
                .clone()
                .map(|cause| Err(Error::RequestFailed { ts, cause }));
        }
        let mut outcome = Outcome {
            failure: r.failure.clone(),
            responses: r.received,
            payload: None,
        };
        if take || !r.payload.as_ref().is_some_and(holds_result) {
            self.unclaimed -= 1;
            outcome.payload = self.remove(ts).and_then(|r| r.payload);
        }
        Some(Ok(Some(outcome)))
    }

    /// Nothing will collect request `ts` (its handle was dropped): it goes
    /// when it is done (now, if it is).
    pub fn detach(&mut self, ts: i32) {
        let Some(r) = self.records.get_mut(&ts) else {
            return;
        };
        if r.stage == Stage::Done {
            self.unclaimed -= 1;
            self.remove(ts);
        } else {
            r.detached = true;
        }
    }

    /// When [`RequestTable::tick`] has something to do next (`None`:
    /// nothing, until a request opens).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_check
    }

    /// Reports the open requests overdue at `now`, and schedules their next
    /// report for when their wait has doubled (at most [`MAX_WARN_GAP`]
    /// later).
    pub fn tick(&mut self, now: Instant) -> Vec<Overdue> {
        if self.node_failure.is_some() || self.next_check.is_none_or(|t| now < t) {
            return Vec::new();
        }
        let mut overdue = Vec::new();
        let mut next: Option<Instant> = None;
        for (&ts, r) in &mut self.records {
            if r.stage != Stage::Open {
                continue;
            }
            if r.warn_at <= now {
                let waited = now.saturating_duration_since(r.sent);
                overdue.push(Overdue {
                    ts,
                    owing: r.owing.clone().unwrap_or_default(),
                    missing: r.expected.saturating_sub(r.received),
                    waited,
                });
                r.warn_at = now + waited.clamp(self.warn_after, MAX_WARN_GAP.max(self.warn_after));
            }
            next = Some(next.map_or(r.warn_at, |t| t.min(r.warn_at)));
        }
        self.next_check = next;
        overdue.sort_by_key(|o| o.ts);
        overdue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(30);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Counts a response from `sender` with no payload check.
    fn answer(t: &mut RequestTable<u32>, ts: i32, sender: NodeId) -> Answer<u32> {
        t.respond(ts, sender, |hits| {
            *hits += 1;
            Some(Ok(true))
        })
    }

    /// The last response, from `sender`: completes and finishes request `ts`.
    fn finish_with(t: &mut RequestTable<u32>, ts: i32, sender: NodeId) -> Finished {
        let c = completed(answer(t, ts, sender));
        t.finish(c)
    }

    /// A wait by timestamp: `None` while it would block.
    fn wait(t: &mut RequestTable<u32>, ts: i32) -> Option<Result<(), Error>> {
        t.collect(ts, false, |_| false)
            .map(|r| match r?.and_then(|o| o.failure) {
                Some(cause) => Err(Error::RequestFailed { ts, cause }),
                None => Ok(()),
            })
    }

    fn completed(a: Answer<u32>) -> Completion<u32> {
        match a {
            Answer::Completed(c) => c,
            _ => panic!("expected the request to complete"),
        }
    }

    #[test]
    fn a_request_completes_with_one_response_from_each_receiver() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        let (ts, none) = t.open(Some(&[8, 10]), 0, 0u32, t0);
        assert!(none.is_none());
        assert!(matches!(answer(&mut t, ts, 8), Answer::Counted));
        assert!(
            matches!(answer(&mut t, ts, 8), Answer::Stray),
            "8 answered already"
        );
        assert!(
            matches!(answer(&mut t, ts, 12), Answer::Stray),
            "12 was never asked"
        );
        assert_eq!(t.num_responses(ts), 1);
        assert!(wait(&mut t, ts).is_none(), "still open");
        let c = completed(answer(&mut t, ts, 10));
        assert_eq!((c.ts, c.payload, c.failure.clone()), (ts, 2, None));
        assert!(
            wait(&mut t, ts).is_none(),
            "not done before its completion ran"
        );
        assert!(matches!(answer(&mut t, ts, 10), Answer::Stray));
        assert!(t.finish(c).was_in_flight);
        let outcome = t.collect(ts, false, |_| false);
        let Some(Ok(Some(o))) = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!((o.failure, o.responses, o.payload), (None, 2, Some(2)));
        // Collected: a second wait returns at once; a stranger's is unknown.
        assert!(matches!(t.collect(ts, false, |_| false), Some(Ok(None))));
        assert!(matches!(
            wait(&mut t, 99),
            Some(Err(Error::UnknownTimestamp(99)))
        ));
    }

    #[test]
    fn a_request_in_several_messages_to_one_node_counts_each_under_its_alias() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        // Two messages to node 8 (the second under an alias), one to 10.
        let (ts, _) = t.open(Some(&[8, 8, 10]), 0, 0u32, t0);
        let alias = t.alias(ts).unwrap();
        assert_ne!(alias, ts);
        let (next, _) = t.open(Some(&[8]), 0, 0u32, t0);
        assert!(next != ts && next != alias, "aliases are never reused");
        assert!(matches!(answer(&mut t, alias, 8), Answer::Counted));
        assert!(matches!(answer(&mut t, ts, 10), Answer::Counted));
        assert_eq!(t.num_responses(ts), 2);
        assert!(
            matches!(answer(&mut t, alias, 10), Answer::Stray),
            "10 answered"
        );
        let c = completed(answer(&mut t, ts, 8));
        assert_eq!(
            (c.ts, c.payload),
            (ts, 3),
            "completes under its own timestamp"
        );
        t.finish(c);
        assert!(matches!(answer(&mut t, alias, 8), Answer::Stray), "over");
        assert!(t.alias(ts).is_none(), "no alias for a request that is over");
        assert!(matches!(t.collect(ts, true, |_| false), Some(Ok(Some(_)))));
        assert!(t.aliases.is_empty(), "the alias went with its record");
        // A failure under an alias fails the request.
        let alias = t.alias(next).unwrap();
        let c = t
            .fail(alias, Failure::PeerDead { id: 8, secs: 30 })
            .unwrap();
        assert_eq!(
            (c.ts, c.failure.clone()),
            (next, Some(Failure::PeerDead { id: 8, secs: 30 }))
        );
        t.finish(c);
        t.detach(next);
        assert!(t.records.is_empty() && t.aliases.is_empty());
    }

    #[test]
    fn a_request_expecting_nothing_completes_at_once() {
        let mut t = RequestTable::new(W);
        let (ts, c) = t.open(Some(&[]), 0, 7u32, Instant::now());
        let f = t.finish(c.expect("nothing to wait for"));
        assert!(!f.was_in_flight);
        assert!(t.poll_timeout().is_none(), "nothing can be overdue");
        let taken = t.collect(ts, true, |_| false);
        assert!(matches!(
            taken,
            Some(Ok(Some(Outcome {
                payload: Some(7),
                ..
            })))
        ));
    }

    #[test]
    fn a_declined_or_deferred_response_leaves_its_sender_owing() {
        let mut t = RequestTable::new(W);
        let (ts, _) = t.open(Some(&[8]), 0, 0u32, Instant::now());
        assert!(matches!(
            t.respond(ts, 8, |_| Some(Ok(false))),
            Answer::Declined
        ));
        assert!(matches!(t.respond(ts, 8, |_| None), Answer::Deferred));
        assert_eq!(t.waiting_on(8), vec![ts]);
        let _ = completed(answer(&mut t, ts, 8));
    }

    #[test]
    fn failures_complete_open_requests_once() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        let (a, _) = t.open(Some(&[8, 10]), 0, 0u32, t0);
        let (b, _) = t.open(Some(&[10]), 0, 0u32, t0);
        let (c, _) = t.open(None, 2, 0u32, t0);
        assert_eq!(t.waiting_on(8), vec![a]);
        let mut on_10 = t.waiting_on(10);
        on_10.sort();
        assert_eq!(on_10, vec![a, b]);
        let dead = Failure::PeerDead { id: 10, secs: 30 };
        let done = t.fail(b, dead.clone()).expect("b was open");
        assert!(t.fail(b, dead.clone()).is_none(), "completing already");
        t.finish(done);
        assert!(matches!(
            wait(&mut t, b),
            Some(Err(Error::RequestFailed {
                cause: Failure::PeerDead { id: 10, .. },
                ..
            }))
        ));
        // A response that carries a failure (a remote handler panicked).
        let panicked = Failure::HandlerPanicked {
            node: 8,
            message: "boom".into(),
        };
        let done = completed(t.respond(a, 8, |_| Some(Err(panicked.clone()))));
        assert_eq!(done.failure, Some(panicked));
        t.finish(done);
        // Responses from any node count for a request to no named node.
        assert!(matches!(answer(&mut t, c, 9), Answer::Counted));
        let _ = completed(answer(&mut t, c, 11));
    }

    #[test]
    fn a_node_failure_fails_every_wait_but_not_what_is_done() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        let (open, _) = t.open(Some(&[8]), 0, 0u32, t0);
        let (done, _) = t.open(Some(&[8]), 0, 0u32, t0);
        finish_with(&mut t, done, 8);
        t.fail_node(Failure::Stopped);
        assert!(t.is_settled(open));
        assert!(matches!(
            wait(&mut t, open),
            Some(Err(Error::RequestFailed {
                cause: Failure::Stopped,
                ..
            }))
        ));
        assert!(matches!(wait(&mut t, done), Some(Ok(()))));
        assert!(t.tick(t0 + W * 10).is_empty(), "nothing overdue after it");
        assert!(t.poll_timeout().is_none());
    }

    #[test]
    fn a_result_stays_until_taken_and_detached_requests_go_when_done() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        let (kept, _) = t.open(Some(&[8]), 0, 0u32, t0);
        finish_with(&mut t, kept, 8);
        // Waiting keeps a payload that holds a result...
        for _ in 0..2 {
            let waited = t.collect(kept, false, |_| true);
            assert!(matches!(
                waited,
                Some(Ok(Some(Outcome { payload: None, .. })))
            ));
        }
        // ... until it is taken.
        let taken = t.collect(kept, true, |_| true);
        assert!(matches!(
            taken,
            Some(Ok(Some(Outcome {
                payload: Some(1),
                ..
            })))
        ));
        assert!(matches!(t.collect(kept, true, |_| true), Some(Ok(None))));

        // Detached while open: gone when done, its failure handed back
        // for the log.
        let (gone, _) = t.open(Some(&[8]), 0, 0u32, t0);
        t.detach(gone);
        let c = t.fail(gone, Failure::Stopped).expect("open");
        let f = t.finish(c);
        assert_eq!(f.unwatched_failure, Some(Failure::Stopped));
        assert_eq!(t.records.len(), 0);
        // Detached when done: gone at once.
        let (late, _) = t.open(Some(&[8]), 0, 0u32, t0);
        finish_with(&mut t, late, 8);
        t.detach(late);
        assert_eq!((t.records.len(), t.unclaimed), (0, 0));
    }

    #[test]
    fn uncollected_requests_are_counted() {
        let mut t = RequestTable::new(W);
        let now = Instant::now();
        let mut reported = Vec::new();
        for _ in 0..2 * UNCLAIMED_WARN_EVERY {
            let (ts, _) = t.open(Some(&[8]), 0, 0u32, now);
            if let Some(n) = finish_with(&mut t, ts, 8).unclaimed {
                reported.push(n);
            }
        }
        assert_eq!(reported, [UNCLAIMED_WARN_EVERY, 2 * UNCLAIMED_WARN_EVERY]);
    }

    #[test]
    fn an_answered_request_is_never_overdue() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        let (ts, _) = t.open(Some(&[8]), 0, 0u32, t0);
        assert_eq!(t.poll_timeout(), Some(t0 + W));
        finish_with(&mut t, ts, 8);
        // The deadline is a lower bound: the tick at it finds nothing.
        assert!(t.tick(t0 + W).is_empty());
        assert_eq!(t.poll_timeout(), None);
    }

    #[test]
    fn an_unanswered_request_is_reported_naming_who_owes_and_again_as_its_wait_doubles() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        let (ts, _) = t.open(Some(&[8, 10, 12]), 0, 0u32, t0);
        let (other, _) = t.open(Some(&[8]), 0, 0u32, t0 + secs(5));
        assert!(matches!(answer(&mut t, ts, 10), Answer::Counted));
        finish_with(&mut t, other, 8);
        assert_eq!(t.poll_timeout(), Some(t0 + W));
        assert!(t.tick(t0 + W - Duration::from_millis(1)).is_empty());
        let first = t.tick(t0 + W);
        assert_eq!(
            first,
            vec![Overdue {
                ts,
                owing: vec![8, 12],
                missing: 2,
                waited: W,
            }]
        );
        // Next when the wait has doubled: at 2W, then 4W, 8W.
        assert_eq!(t.poll_timeout(), Some(t0 + 2 * W));
        assert!(t.tick(t0 + 2 * W - secs(1)).is_empty());
        assert!(matches!(answer(&mut t, ts, 12), Answer::Counted));
        let second = t.tick(t0 + 2 * W);
        assert_eq!(second.len(), 1);
        assert_eq!(
            (second[0].owing.clone(), second[0].waited),
            (vec![8], 2 * W)
        );
        assert_eq!(t.poll_timeout(), Some(t0 + 4 * W));
        // A late tick counts the wait from the send.
        let third = t.tick(t0 + 5 * W);
        assert_eq!(third[0].waited, 5 * W);
        assert_eq!(t.poll_timeout(), Some(t0 + 10 * W));
        // Once answered, never again.
        finish_with(&mut t, ts, 8);
        assert!(t.tick(t0 + 100 * W).is_empty());
        assert_eq!(t.poll_timeout(), None);
    }

    #[test]
    fn reports_repeat_at_least_hourly() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        let (ts, _) = t.open(None, 3, 0u32, t0);
        let mut now = t0 + W;
        let mut gaps = Vec::new();
        for _ in 0..10 {
            let overdue = t.tick(now);
            assert_eq!(overdue.len(), 1);
            assert_eq!((overdue[0].ts, overdue[0].missing), (ts, 3));
            assert!(overdue[0].owing.is_empty());
            let next = t.poll_timeout().unwrap();
            gaps.push((next - now).as_secs());
            now = next;
        }
        assert_eq!(gaps, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
    }

    #[test]
    fn requests_opened_later_are_reported_at_their_own_time() {
        let t0 = Instant::now();
        let mut t = RequestTable::new(W);
        let (a, _) = t.open(Some(&[8]), 0, 0u32, t0);
        let (b, _) = t.open(Some(&[10]), 0, 0u32, t0 + secs(10));
        assert_eq!(t.tick(t0 + W).iter().map(|o| o.ts).collect::<Vec<_>>(), [a]);
        assert_eq!(t.poll_timeout(), Some(t0 + secs(10) + W));
        let at_b = t.tick(t0 + secs(10) + W);
        assert_eq!(at_b.iter().map(|o| o.ts).collect::<Vec<_>>(), [b]);
        assert_eq!(at_b[0].owing, [10]);
    }

    #[test]
    fn timestamps_wrap_to_zero() {
        let mut t = RequestTable::<()>::new(W);
        t.next_ts = i32::MAX;
        let (last, _) = t.open(Some(&[8]), 0, (), Instant::now());
        let (first, _) = t.open(Some(&[8]), 0, (), Instant::now());
        assert_eq!((last, first), (i32::MAX, 0));
    }
}
