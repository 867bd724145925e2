//! The resender (`PS_RESEND=1`) as a state machine without I/O: it
//! remembers every message sent until the receiver acknowledges it, says
//! which to send again when their time is up and which to give up on, and
//! recognises messages received twice.
//!
//! The first wait is the receiver's retransmission timeout, from the
//! measured round trip ([`rtt`], as TCP's); each resend waits twice as long
//! as the one before, up to 8 `PS_RESEND_TIMEOUT`s. A message is given up
//! on after at least `max_tries` resends and no sooner than the fixed
//! schedule of the timeout alone would (`PS_RESEND_TIMEOUT`, doubling up to
//! 8 of them, `max_tries` times): resending sooner never fails sooner.
//!
//! Acknowledgements carry C++ ps-lite's signature,
//! `app_id << 48 | sender << 40 | recver << 32 | timestamp << 1 | request`
//! (computed exactly as C++ does, so a C++ peer matches them). That
//! signature truncates node ids and ignores the customer, so internally
//! messages are told apart by the full peer id and, where both ends are
//! pslite, by the customer id an ACK echoes. The duplicate filter forgets
//! entries once no resend of them can still arrive, and never holds more
//! than [`MAX_SEEN`] entries (C++'s grows without bound).
//!
//! As a component of the core it takes the acknowledgements, resends what
//! is due and gives up on the rest; the core's way in asks it about every
//! other message ([`Resender::on_receive`]) and its way out keeps a copy of
//! every message sent ([`Resender::on_send`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use log::{debug, warn};
use pslite_proto::ids::SCHEDULER;
use pslite_proto::{Command, Message, Meta, NodeId, Role, K_EMPTY};

use crate::component::{Component, Cx};
use crate::effects::{Event, Output};
use crate::error::Failure;

pub mod rtt;

use rtt::Rtt;

/// At most this many received signatures are remembered for de-duplication.
pub const MAX_SEEN: usize = 1 << 20;

/// The longest wait between two tries, in timeouts.
const MAX_BACKOFF: u32 = 8;

/// C++ ps-lite's message signature, bit for bit (ids and timestamps are
/// sign-extended C `int`s shifted into a `uint64_t`). pslite-only: a part of
/// a message cut into parts (`PBMeta.partition`, between pslite nodes) mixes
/// in its message number and index, so each part is acknowledged, resent
/// and recognised on its own.
pub fn signature(meta: &Meta) -> u64 {
    let sig = whole_signature(meta);
    match &meta.partition {
        Some(p) if meta.control.is_empty() => {
            let salt = (p.id.wrapping_add(1)).wrapping_mul(0xD6E8_FEB8_6659_FD93)
                ^ (u64::from(p.index) + 1).wrapping_mul(0xA076_1D64_78BD_642F);
            sig ^ (salt & !1)
        }
        _ => sig,
    }
}

/// [`signature`] of the whole message a part belongs to (of the message
/// itself when it is no part).
fn whole_signature(meta: &Meta) -> u64 {
    let widen = |v: i32| v as i64 as u64;
    let sig = (widen(meta.app_id) << 48)
        | (widen(meta.sender) << 40)
        | (widen(meta.recver) << 32)
        | (widen(meta.timestamp) << 1)
        | u64::from(meta.request);
    // pslite-only, replicated key ranges: one worker request reaches a
    // server once per range it holds, all with one timestamp, and again
    // after a map change (which may bring it back to a server it left); the
    // range and the map version tell them apart (its answer carries both).
    match &meta.replica {
        Some(r) if meta.control.is_empty() => {
            let salt = (u64::from(r.range) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ r.version.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
            sig ^ (salt & !1)
        }
        _ => sig,
    }
}

/// Whether a message takes part in acknowledgement: everything but ACK and
/// TERMINATE, with a timestamp and known ends.
pub fn needs_ack(msg: &Message) -> bool {
    let m = &msg.meta;
    !matches!(m.control.cmd, Command::Ack | Command::Terminate)
        && m.timestamp != K_EMPTY
        && m.sender != K_EMPTY
        && m.recver != K_EMPTY
}

struct Pending {
    msg: Message,
    /// When it was first sent: the round trip an ACK measures (Karn: only
    /// while `tries` is 0), and when it may be given up on.
    sent: Instant,
    next: Instant,
    tries: u32,
    /// Acknowledged, but a data request waits for its response: if its
    /// receiver is replaced (recovery) before answering, it is sent again.
    acked: bool,
}

/// Whether a message is a data request (or a part of one), kept until its
/// response arrives.
fn awaits_response(msg: &Message) -> bool {
    msg.meta.control.is_empty() && msg.meta.request
}

/// A part's message number, if it is one.
fn part_of(msg: &Message) -> Option<u64> {
    msg.meta.partition.as_ref().map(|p| p.id)
}

/// What to do with a received message.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// Process it.
    Deliver,
    /// Seen before: drop it (it has been acknowledged again).
    Duplicate,
    /// It was an ACK: consumed here.
    Ack,
}

/// What the clock says after [`Resender::tick`].
#[derive(Default)]
pub struct Due {
    /// Messages to send again.
    pub resend: Vec<Message>,
    /// Messages given up on after the last try.
    pub failed: Vec<Message>,
}

/// The resender's state for one node.
pub struct Resender {
    /// `PS_RESEND_TIMEOUT`: the first wait until a peer's round trip is
    /// measured, and the longest first wait.
    timeout: Duration,
    max_tries: u32,
    /// The round trip to each peer.
    rtt: Rtt,
    /// Unacknowledged messages by (receiver, signature), oldest first.
    pending: BTreeMap<(NodeId, u64), VecDeque<Pending>>,
    /// Received (sender, signature, customer, command), with arrival order.
    seen: HashSet<(NodeId, u64, i32, i32)>,
    seen_order: VecDeque<(Instant, (NodeId, u64, i32, i32))>,
    /// No unacknowledged message is due before this (a lower bound; exact
    /// after each [`Resender::tick`]).
    earliest: Option<Instant>,
    /// The pending keys of the parts of requests, by (receiver, the whole
    /// request's signature): its response settles them all.
    parts: HashMap<(NodeId, u64), Vec<u64>>,
    /// Peers that acknowledged at least once (the others may never: a C++
    /// node without `PS_RESEND`).
    acked_by: HashSet<NodeId>,
}

impl Resender {
    /// A resender that waits `timeout` for the first ACK and gives up after
    /// `max_tries` resends.
    pub fn new(timeout: Duration, max_tries: u32) -> Resender {
        Resender {
            timeout,
            max_tries,
            rtt: Rtt::new(timeout),
            pending: BTreeMap::new(),
            seen: HashSet::new(),
            seen_order: VecDeque::new(),
            earliest: None,
            parts: HashMap::new(),
            acked_by: HashSet::new(),
        }
    }

    /// When [`Resender::tick`] may have work next (never later than the
    /// first resend due; sometimes earlier).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.earliest
    }

    /// How long after its first copy a message may be given up on: the
    /// fixed schedule of `PS_RESEND_TIMEOUT` alone.
    fn patience(&self) -> Duration {
        let mut total = Duration::ZERO;
        for tries in 0..=self.max_tries {
            total += self.timeout * 2u32.pow(tries.min(MAX_BACKOFF.ilog2()));
        }
        total
    }

    /// How long a resend of a message can arrive after its first copy.
    fn window(&self) -> Duration {
        (self.patience() + self.timeout * MAX_BACKOFF) * 2
    }

    /// The wait after try `tries` (0: the first copy) of `msg`: its
    /// receiver's retransmission timeout, doubled on each resend, at most
    /// [`MAX_BACKOFF`] `PS_RESEND_TIMEOUT`s.
    fn wait(rtt: &Rtt, timeout: Duration, msg: &Message, tries: u32) -> Duration {
        let first = rtt.timeout(msg.meta.recver, msg.data_size());
        first
            .saturating_mul(2u32.saturating_pow(tries))
            .min(timeout * MAX_BACKOFF)
    }

    /// The retransmission timeout of a small message to `peer` now (for
    /// logs and tests).
    pub fn rto(&self, peer: NodeId) -> Duration {
        self.rtt.timeout(peer, 0)
    }

    /// Records a message just sent (with `sender` and `recver` set).
    pub fn on_send(&mut self, msg: &Message, now: Instant) {
        if !needs_ack(msg) {
            return;
        }
        let key = (msg.meta.recver, signature(&msg.meta));
        if part_of(msg).is_some() && awaits_response(msg) {
            let whole = (msg.meta.recver, whole_signature(&msg.meta));
            self.parts.entry(whole).or_default().push(key.1);
        }
        let next = now + Resender::wait(&self.rtt, self.timeout, msg, 0);
        self.earliest = Some(self.earliest.map_or(next, |e| e.min(next)));
        self.pending.entry(key).or_default().push_back(Pending {
            msg: msg.clone(),
            sent: now,
            next,
            tries: 0,
            acked: false,
        });
    }

    /// Forgets a message that could not be sent at all.
    pub fn forget(&mut self, msg: &Message) {
        let key = (msg.meta.recver, signature(&msg.meta));
        if let Some(queue) = self.pending.get_mut(&key) {
            queue.pop_back();
            if queue.is_empty() {
                self.pending.remove(&key);
            }
        }
    }

    /// Looks at a received message (with `sender` and `recver` set) and
    /// returns what to do with it and, when it must be acknowledged, the ACK.
    pub fn on_receive(&mut self, msg: &Message, now: Instant) -> (Received, Option<Message>) {
        let m = &msg.meta;
        if m.control.cmd == Command::Ack {
            self.on_ack(m, now);
            return (Received::Ack, None);
        }
        if !needs_ack(msg) {
            return (Received::Deliver, None);
        }
        if m.control.is_empty() && !m.request {
            // A response proves its request arrived: no need to resend it.
            self.on_response(m);
        }
        let sig = signature(m);
        let mut ack = Message::control(Command::Ack, m.sender);
        ack.meta.control.msg_sig = sig;
        // Not read by C++; lets a pslite sender tell customers apart.
        ack.meta.customer_id = m.customer_id;
        self.expire(now);
        let key = (m.sender, sig, m.customer_id, m.control.cmd as i32);
        if !self.seen.insert(key) {
            return (Received::Duplicate, Some(ack));
        }
        self.seen_order.push_back((now, key));
        if self.seen_order.len() > MAX_SEEN {
            if let Some((_, old)) = self.seen_order.pop_front() {
                self.seen.remove(&old);
            }
        }
        (Received::Deliver, Some(ack))
    }

    fn on_response(&mut self, response: &Meta) {
        let request = Meta {
            app_id: response.app_id,
            sender: response.recver,
            recver: response.sender,
            timestamp: response.timestamp,
            request: true,
            replica: response.replica.clone(),
            ..Meta::default()
        };
        let key = (response.sender, signature(&request));
        if let Some(queue) = self.pending.get_mut(&key) {
            if let Some(i) = queue
                .iter()
                .position(|p| p.msg.meta.customer_id == response.customer_id)
            {
                queue.remove(i);
            }
            if queue.is_empty() {
                self.pending.remove(&key);
            }
        }
        // The parts of a request sent in parts: every part of the
        // customer's request arrived.
        if let Some(sigs) = self.parts.get_mut(&key) {
            let customer = response.customer_id;
            sigs.retain(|&sig| {
                let part = (key.0, sig);
                let Some(queue) = self.pending.get_mut(&part) else {
                    return false;
                };
                queue.retain(|p| p.msg.meta.customer_id != customer);
                let empty = queue.is_empty();
                if empty {
                    self.pending.remove(&part);
                }
                !empty
            });
            if sigs.is_empty() {
                self.parts.remove(&key);
            }
        }
    }

    /// Drops the other parts of the message part `failed` belongs to (it
    /// was given up on: the request fails as a whole).
    fn drop_siblings(&mut self, failed: &Message) {
        let Some(id) = part_of(failed) else { return };
        let whole = (failed.meta.recver, whole_signature(&failed.meta));
        let Some(sigs) = self.parts.get_mut(&whole) else {
            return;
        };
        let customer = failed.meta.customer_id;
        sigs.retain(|&sig| {
            let key = (whole.0, sig);
            let Some(queue) = self.pending.get_mut(&key) else {
                return false;
            };
            queue.retain(|p| part_of(&p.msg) != Some(id) || p.msg.meta.customer_id != customer);
            let empty = queue.is_empty();
            if empty {
                self.pending.remove(&key);
            }
            !empty
        });
        if sigs.is_empty() {
            self.parts.remove(&whole);
        }
    }

    fn on_ack(&mut self, ack: &Meta, now: Instant) {
        let key = (ack.sender, ack.control.msg_sig);
        let Some(queue) = self.pending.get_mut(&key) else {
            return;
        };
        let position = if ack.customer_id == K_EMPTY {
            queue.iter().position(|p| !p.acked)
        } else {
            queue
                .iter()
                .position(|p| !p.acked && p.msg.meta.customer_id == ack.customer_id)
        };
        let mut measured = None;
        if let Some(i) = position {
            let p = &queue[i];
            if p.tries == 0 {
                let sample = now.saturating_duration_since(p.sent);
                measured = Some((sample, p.msg.data_size()));
            }
            if awaits_response(&queue[i].msg) {
                queue[i].acked = true;
            } else {
                queue.remove(i);
            }
        }
        if queue.is_empty() {
            self.pending.remove(&key);
        }
        if let Some((sample, size)) = measured {
            self.measured(ack.sender, sample, size);
        }
    }

    /// A round trip to `peer` measured: the first one to a peer (or the
    /// node's first at all) also shortens the waits of what was sent
    /// before it was known (a job's first messages would otherwise wait
    /// the whole `PS_RESEND_TIMEOUT` when lost).
    fn measured(&mut self, peer: NodeId, sample: Duration, size: usize) {
        let first = self.rtt.smoothed(peer).is_none();
        self.rtt.sample(peer, sample, size);
        if !first {
            return;
        }
        let mut earliest = self.earliest;
        for p in self.pending.values_mut().flatten() {
            if p.tries == 0 && !p.acked {
                let next = p.sent + Resender::wait(&self.rtt, self.timeout, &p.msg, 0);
                if next < p.next {
                    p.next = next;
                    earliest = Some(earliest.map_or(next, |e| e.min(next)));
                }
            }
        }
        self.earliest = earliest;
    }

    fn expire(&mut self, now: Instant) {
        let window = self.window();
        while let Some(&(at, key)) = self.seen_order.front() {
            if now.saturating_duration_since(at) <= window {
                break;
            }
            self.seen_order.pop_front();
            self.seen.remove(&key);
        }
    }

    /// Puts every resend off by `d` (the node read nothing for that long:
    /// the acknowledgements may be waiting unread).
    pub fn postpone(&mut self, d: Duration) {
        for p in self.pending.values_mut().flatten() {
            p.next += d;
        }
        self.earliest = self.earliest.map(|e| e + d);
    }

    /// The messages whose time is up at `now`: to resend, or given up.
    pub fn tick(&mut self, now: Instant) -> Due {
        let mut due = Due::default();
        let mut earliest: Option<Instant> = None;
        let patience = self.patience();
        for queue in self.pending.values_mut() {
            let mut i = 0;
            while i < queue.len() {
                let p = &mut queue[i];
                if p.acked || p.next > now {
                    i += 1;
                    continue;
                }
                if p.tries >= self.max_tries && now >= p.sent + patience {
                    if let Some(p) = queue.remove(i) {
                        due.failed.push(p.msg);
                    }
                    continue;
                }
                p.tries += 1;
                let wait = Resender::wait(&self.rtt, self.timeout, &p.msg, p.tries);
                // The last wait ends no later than the patience does.
                p.next = if p.tries >= self.max_tries {
                    (now + wait).min(p.sent + patience).max(now)
                } else {
                    now + wait
                };
                debug!(
                    "try {} to node {} {:.1} ms after the first (its timeout {:.1} ms)",
                    p.tries,
                    p.msg.meta.recver,
                    now.saturating_duration_since(p.sent).as_secs_f64() * 1e3,
                    self.rtt
                        .timeout(p.msg.meta.recver, p.msg.data_size())
                        .as_secs_f64()
                        * 1e3
                );
                due.resend.push(p.msg.clone());
                i += 1;
            }
            for p in queue.iter().filter(|p| !p.acked) {
                earliest = Some(earliest.map_or(p.next, |e| e.min(p.next)));
            }
        }
        self.pending.retain(|_, q| !q.is_empty());
        // A request sent in parts fails once, with its first part given up.
        let mut parts_failed = HashSet::new();
        due.failed.retain(|m| {
            part_of(m).is_none_or(|id| parts_failed.insert((m.meta.recver, id, m.meta.customer_id)))
        });
        for failed in &due.failed {
            self.drop_siblings(failed);
        }
        self.earliest = earliest;
        due
    }

    /// Messages waiting for an ACK from a receiver that `counts`.
    pub fn unacknowledged_to(&self, counts: impl Fn(NodeId) -> bool) -> Vec<&Message> {
        self.pending
            .iter()
            .filter(|((recver, _), _)| counts(*recver))
            .flat_map(|(_, q)| q.iter())
            .filter(|p| !p.acked)
            .map(|p| &p.msg)
            .collect()
    }

    /// Forgets the messages for which `settled` holds: their effect is
    /// known (a barrier released proves its requests arrived, even from a
    /// peer that does not acknowledge them).
    pub fn settle(&mut self, settled: impl Fn(&Message) -> bool) {
        for queue in self.pending.values_mut() {
            queue.retain(|p| !settled(&p.msg));
        }
        self.pending.retain(|_, q| !q.is_empty());
    }

    /// Forgets the messages for which `settled` holds, as an answer that
    /// came at `now` settles them (the scheduler's answer to a heartbeat):
    /// the newest of them, if sent once, measures the round trip as an ACK
    /// would (the answer comes before the ACK, which then finds nothing;
    /// older ones were not what it answered).
    pub fn settle_answered(&mut self, now: Instant, settled: impl Fn(&Message) -> bool) {
        let mut newest: Option<(Instant, u32, NodeId, usize)> = None;
        for queue in self.pending.values_mut() {
            queue.retain(|p| {
                if !settled(&p.msg) {
                    return true;
                }
                if newest.is_none_or(|(sent, ..)| p.sent > sent) {
                    let size = p.msg.data_size();
                    newest = Some((p.sent, p.tries, p.msg.meta.recver, size));
                }
                false
            });
        }
        self.pending.retain(|_, q| !q.is_empty());
        if let Some((sent, 0, peer, size)) = newest {
            self.measured(peer, now.saturating_duration_since(sent), size);
        }
    }

    /// Drops every message waiting for `id` (it is dead for good): the
    /// data requests among them are returned, to be failed.
    pub fn forget_peer(&mut self, id: NodeId) -> Vec<Message> {
        self.parts.retain(|(recver, _), _| *recver != id);
        let mut dropped = Vec::new();
        self.pending.retain(|(recver, _), queue| {
            if *recver != id {
                return true;
            }
            dropped.extend(queue.drain(..).map(|p| p.msg).filter(awaits_response));
            false
        });
        // One message per request sent in parts: it fails once.
        let mut parts_seen = HashSet::new();
        dropped.retain(|m| part_of(m).is_none_or(|id| parts_seen.insert((id, m.meta.customer_id))));
        dropped
    }

    /// Messages waiting for an ACK.
    pub fn unacknowledged(&self) -> usize {
        self.pending
            .values()
            .flat_map(|q| q.iter())
            .filter(|p| !p.acked)
            .count()
    }

    /// Node `id` was replaced by a restarted process: the data requests it
    /// had not answered are returned to be sent to the new one, and their
    /// resend clocks restart.
    pub fn on_peer_replaced(&mut self, id: NodeId, now: Instant) -> Vec<Message> {
        let mut again = Vec::new();
        for ((recver, _), queue) in self.pending.iter_mut() {
            if *recver != id {
                continue;
            }
            for p in queue.iter_mut().filter(|p| awaits_response(&p.msg)) {
                p.acked = false;
                p.tries = 0;
                p.sent = now;
                p.next = now + self.timeout;
                again.push(p.msg.clone());
            }
        }
        if !again.is_empty() {
            let next = now + self.timeout;
            self.earliest = Some(self.earliest.map_or(next, |e| e.min(next)));
        }
        again
    }

    /// Node `id` was replaced by a new process: forgets the control
    /// messages still waiting for its predecessor's ACK (what was said to
    /// that process is not for the new one, which starts from the
    /// scheduler's current table and map; resent, an old node-table update
    /// would overwrite a newer one).
    pub fn forget_control_to(&mut self, id: NodeId) {
        for ((recver, _), queue) in self.pending.iter_mut() {
            if *recver == id {
                queue.retain(|p| p.msg.meta.control.is_empty());
            }
        }
        self.pending.retain(|_, q| !q.is_empty());
    }

    /// Node `id` was replaced by a new process, whose timestamps start over:
    /// forgets what its predecessor sent, so that the newcomer's messages
    /// are not taken for duplicates of them.
    pub fn forget_seen(&mut self, id: NodeId) {
        self.seen.retain(|&(sender, ..)| sender != id);
        self.seen_order.retain(|&(_, (sender, ..))| sender != id);
    }

    /// Whether node `id` acknowledged anything yet.
    pub fn acknowledged_by(&self, id: NodeId) -> bool {
        self.acked_by.contains(&id)
    }

    /// Signatures remembered for de-duplication.
    pub fn remembered(&self) -> usize {
        self.seen.len()
    }
}

impl Component for Resender {
    /// An acknowledgement (every other message passed `on_receive` on its
    /// way in: see `core/route.rs`).
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>) {
        self.on_receive(&msg, now);
        self.acked_by.insert(msg.meta.sender);
        cx.changed();
    }

    /// Resends what is due, and gives up on what was resent too often: a
    /// control message to a scheduler that acknowledges fails the node, a
    /// data message fails its request (unless the range map decides).
    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        let due = Resender::tick(self, now);
        for msg in due.resend {
            debug!("resending {}", crate::describe(&msg));
            cx.facts.counters().resent();
            cx.out(Output::Send(msg));
        }
        for msg in due.failed {
            let failure = Failure::NotAcknowledged {
                peer: msg.meta.recver,
                tries: self.max_tries,
                what: crate::describe(&msg),
            };
            if msg.is_control() {
                // A scheduler that never acknowledged anything runs without
                // PS_RESEND (a C++ one, say): its silence proves nothing.
                // Nor does a heartbeat's: the scheduler's silence is judged
                // by liveness (`member/liveness.rs`), which gives it the
                // recovery timeout to answer again.
                let node = cx.facts.config().role != Role::Scheduler;
                let heartbeat = msg.meta.control.cmd == Command::Heartbeat;
                if msg.meta.recver == SCHEDULER
                    && node
                    && !heartbeat
                    && self.acknowledged_by(SCHEDULER)
                {
                    warn!("{failure}");
                    cx.fail(failure);
                } else {
                    debug!("{failure}");
                }
            } else {
                cx.event(Event::GaveUp(Box::new((msg, failure))));
            }
            cx.changed();
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        Resender::poll_timeout(self)
    }

    /// A worker's request answered through the range map: copies still
    /// resent to earlier primaries stop.
    fn on_event(&mut self, event: &Event, _now: Instant, _cx: &mut Cx<'_>) {
        if let Event::Answered {
            app,
            customer,
            timestamp,
            range,
        } = *event
        {
            self.settle(|m| {
                m.meta.request
                    && m.meta.app_id == app
                    && m.meta.customer_id == customer
                    && m.meta.timestamp == timestamp
                    && m.meta.replica.as_ref().is_some_and(|x| x.range == range)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node 8's ACK of `msg` (sent by node 9).
    fn ack_from_8(msg: &Message) -> Message {
        let mut ack = Message::control(Command::Ack, 9);
        ack.meta.sender = 8;
        ack.meta.control.msg_sig = signature(&msg.meta);
        ack.meta.customer_id = msg.meta.customer_id;
        ack
    }

    fn data(sender: NodeId, recver: NodeId, ts: i32, customer: i32) -> Message {
        let mut m = Message::default();
        m.meta.app_id = 0;
        m.meta.customer_id = customer;
        m.meta.sender = sender;
        m.meta.recver = recver;
        m.meta.timestamp = ts;
        m.meta.request = true;
        m
    }

    const T: Duration = Duration::from_millis(100);

    #[test]
    fn signature_matches_cxx() {
        let mut m = data(9, 8, 3, 0).meta;
        assert_eq!(signature(&m), (9u64 << 40) | (8 << 32) | (3 << 1) | 1);
        m.app_id = K_EMPTY; // control messages: 0x7fffffff << 48 keeps 0xffff
        m.request = false;
        assert_eq!(signature(&m) >> 48, 0xffff);
        // Ids above 255 overlap higher fields, as in C++.
        m.app_id = 0;
        m.sender = 257;
        m.recver = 0;
        m.timestamp = 0;
        assert_eq!(signature(&m), 257u64 << 40);
    }

    #[test]
    fn acked_messages_are_forgotten() {
        let t0 = Instant::now();
        let mut sender = Resender::new(T, 3);
        let mut recver = Resender::new(T, 3);
        let msg = data(9, 8, 1, 0);
        sender.on_send(&msg, t0);
        assert_eq!(sender.unacknowledged(), 1);
        let (what, ack) = recver.on_receive(&msg, t0);
        assert_eq!(what, Received::Deliver);
        let mut ack = ack.unwrap();
        assert_eq!(ack.meta.recver, 9);
        ack.meta.sender = 8;
        assert_eq!(sender.on_receive(&ack, t0).0, Received::Ack);
        assert_eq!(sender.unacknowledged(), 0);
        assert!(sender.tick(t0 + T * 100).resend.is_empty());
    }

    #[test]
    fn unacked_messages_are_resent_with_backoff_then_given_up() {
        let t0 = Instant::now();
        let mut r = Resender::new(T, 3);
        r.on_send(&data(9, 8, 1, 0), t0);
        assert!(r.tick(t0 + T / 2).resend.is_empty());
        let mut now = t0 + T;
        let mut gaps = Vec::new();
        let mut last = t0;
        for _ in 0..3 {
            // Advance in small steps until the next resend.
            loop {
                let due = r.tick(now);
                assert!(due.failed.is_empty());
                if !due.resend.is_empty() {
                    gaps.push(now - last);
                    last = now;
                    break;
                }
                now += T / 10;
            }
        }
        assert!(gaps[1] > gaps[0] && gaps[2] > gaps[1], "{gaps:?}");
        let due = r.tick(now + T * 100);
        assert_eq!(due.failed.len(), 1);
        assert_eq!(r.unacknowledged(), 0);
    }

    #[test]
    fn resends_follow_the_measured_round_trip_and_give_up_no_sooner() {
        let t0 = Instant::now();
        let mut r = Resender::new(T, 3);
        // Node 8 acknowledges within 1 ms, five times: its timeout drops
        // from T (100 ms) to the floor.
        let mut now = t0;
        for ts in 0..5 {
            let msg = data(9, 8, ts, 0);
            r.on_send(&msg, now);
            let ack = ack_from_8(&msg);
            now += Duration::from_millis(1);
            r.on_receive(&ack, now);
        }
        assert_eq!(r.rto(8), rtt::MIN_RTO);
        assert_eq!(
            r.rto(7),
            rtt::MIN_RTO * 2,
            "as the peer measured last, twice"
        );
        assert_eq!(
            Resender::new(T, 3).rto(8),
            T,
            "PS_RESEND_TIMEOUT unmeasured"
        );
        // A lost message: resent after the floor, then 2x, 4x...
        let sent = now;
        r.on_send(&data(9, 8, 100, 0), sent);
        let mut resends = Vec::new();
        let mut failed_at = None;
        while failed_at.is_none() {
            now += Duration::from_millis(1);
            let due = r.tick(now);
            if !due.resend.is_empty() {
                resends.push(now - sent);
            }
            if !due.failed.is_empty() {
                failed_at = Some(now - sent);
            }
        }
        assert_eq!(resends[0], rtt::MIN_RTO, "{resends:?}");
        assert_eq!(resends[1], rtt::MIN_RTO * 3, "{resends:?}");
        // Given up no sooner than the fixed schedule: 1 + 2 + 4 + 8 T.
        let failed_at = failed_at.unwrap_or_default();
        assert!(failed_at >= T * 15 && failed_at <= T * 16, "{failed_at:?}");
        assert!(resends.len() >= 3);
    }

    #[test]
    fn a_heartbeat_answer_measures_the_round_trip_of_the_newest_heartbeat_only() {
        let t0 = Instant::now();
        let heartbeat = |ts| {
            let mut m = Message::control(Command::Heartbeat, SCHEDULER);
            m.meta.sender = 9;
            m.meta.timestamp = ts;
            m
        };
        let mut r = Resender::new(T, 3);
        // An older heartbeat lost and not resent yet, a newer one answered
        // 2 ms after it went: the sample is 2 ms, not 1 s.
        r.on_send(&heartbeat(1), t0);
        let second = t0 + Duration::from_secs(1);
        r.on_send(&heartbeat(2), second);
        r.settle_answered(second + Duration::from_millis(2), |m| {
            m.meta.control.cmd == Command::Heartbeat
        });
        assert_eq!(r.unacknowledged(), 0);
        assert_eq!(r.rtt.smoothed(SCHEDULER), Some(Duration::from_millis(2)));
    }

    #[test]
    fn what_was_sent_before_the_first_round_trip_waits_no_longer_once_it_is_known() {
        let t0 = Instant::now();
        let mut r = Resender::new(T * 10, 3);
        // Sent to 7 before anything was measured, then lost.
        r.on_send(&data(9, 7, 1, 0), t0);
        let msg = data(9, 8, 2, 0);
        r.on_send(&msg, t0);
        let ack = ack_from_8(&msg);
        r.on_receive(&ack, t0 + Duration::from_millis(1));
        // Due after twice the floor (7 not measured), not after 1 s.
        let due = r.tick(t0 + rtt::MIN_RTO * 2);
        assert_eq!(due.resend.len(), 1);
        assert_eq!(due.resend[0].meta.recver, 7);
    }

    #[test]
    fn duplicates_are_dropped_but_acknowledged_again() {
        let t0 = Instant::now();
        let mut r = Resender::new(T, 3);
        let msg = data(9, 8, 4, 0);
        assert_eq!(r.on_receive(&msg, t0).0, Received::Deliver);
        let (what, ack) = r.on_receive(&msg, t0);
        assert_eq!(what, Received::Duplicate);
        assert!(ack.is_some());
        // Same signature from another customer is not a duplicate.
        assert_eq!(r.on_receive(&data(9, 8, 4, 1), t0).0, Received::Deliver);
        // Long after any resend could arrive, the entry is forgotten.
        let later = t0 + r.window() + T;
        assert_eq!(r.on_receive(&data(11, 8, 0, 0), later).0, Received::Deliver);
        assert_eq!(r.remembered(), 1);
    }

    #[test]
    fn acks_tell_customers_apart() {
        let t0 = Instant::now();
        let mut r = Resender::new(T, 3);
        let a = data(9, 8, 5, 0);
        let b = data(9, 8, 5, 1);
        r.on_send(&a, t0);
        r.on_send(&b, t0);
        let ack = ack_from_8(&b);
        r.on_receive(&ack, t0);
        let due = r.tick(t0 + T);
        assert_eq!(due.resend.len(), 1);
        assert_eq!(due.resend[0].meta.customer_id, 0);
    }

    #[test]
    fn a_response_acknowledges_its_request() {
        let t0 = Instant::now();
        let mut r = Resender::new(T, 3);
        r.on_send(&data(9, 8, 7, 0), t0);
        let mut response = data(8, 9, 7, 0);
        response.meta.request = false;
        assert_eq!(r.on_receive(&response, t0).0, Received::Deliver);
        assert_eq!(r.unacknowledged(), 0);
    }

    #[test]
    fn acked_requests_are_sent_again_to_a_replaced_node() {
        let t0 = Instant::now();
        let mut r = Resender::new(T, 3);
        let request = data(9, 8, 2, 0);
        r.on_send(&request, t0);
        let ack = ack_from_8(&request);
        r.on_receive(&ack, t0);
        // Acknowledged: no more resends on timeouts...
        assert_eq!(r.unacknowledged(), 0);
        assert!(r.tick(t0 + T * 100).resend.is_empty());
        // ...but node 8 dies before answering and comes back.
        let again = r.on_peer_replaced(8, t0 + T * 100);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].meta.timestamp, 2);
        assert!(r.on_peer_replaced(11, t0).is_empty());
        // The answer ends it.
        let mut response = data(8, 9, 2, 0);
        response.meta.request = false;
        r.on_receive(&response, t0 + T * 101);
        assert!(r.on_peer_replaced(8, t0 + T * 102).is_empty());
    }

    #[test]
    fn the_duplicate_filter_is_bounded() {
        let t0 = Instant::now();
        let mut r = Resender::new(Duration::from_secs(3600), 3);
        for ts in 0..(MAX_SEEN as i32 + 10) {
            r.on_receive(&data(9, 8, ts, 0), t0);
        }
        assert_eq!(r.remembered(), MAX_SEEN);
    }

    #[test]
    fn control_and_terminate() {
        let mut t = Message::control(Command::Terminate, 9);
        t.meta.sender = 9;
        t.meta.timestamp = 1;
        assert!(!needs_ack(&t));
        let mut b = Message::control(Command::Barrier, 1);
        b.meta.sender = 9;
        b.meta.timestamp = 3;
        assert!(needs_ack(&b));
        b.meta.timestamp = K_EMPTY;
        assert!(!needs_ack(&b));
    }

    /// A request from 9 to 8 (ts 4) cut into `n` parts.
    fn request_parts(n: u32) -> Vec<Message> {
        let mut whole = data(9, 8, 4, 0);
        whole.data = vec![bytes::Bytes::from(vec![0u8; 100 * n as usize])];
        let parts = crate::partition::Partitioner::new(100, 5).split(whole);
        assert_eq!(parts.len(), n as usize);
        parts
    }

    #[test]
    fn parts_are_acknowledged_resent_and_recognised_one_by_one() {
        let t0 = Instant::now();
        let mut r = Resender::new(T, 3);
        let parts = request_parts(3);
        let sigs: HashSet<u64> = parts.iter().map(|p| signature(&p.meta)).collect();
        assert_eq!(sigs.len(), 3, "each part its own signature");
        assert!(!sigs.contains(&signature(&data(9, 8, 4, 0).meta)));
        for p in &parts {
            r.on_send(p, t0);
        }
        // The receiver acknowledges parts 0 and 2; part 1 was lost.
        let mut rx = Resender::new(T, 3);
        for i in [0, 2] {
            let (got, ack) = rx.on_receive(&parts[i], t0);
            assert_eq!(got, Received::Deliver);
            let mut ack = ack.unwrap();
            ack.meta.sender = 8;
            r.on_receive(&ack, t0);
        }
        let due = r.tick(t0 + T);
        assert_eq!(due.resend.len(), 1);
        assert_eq!(due.resend[0].meta.partition.as_ref().unwrap().index, 1);
        // A second copy of part 2 is a duplicate; part 1's resend is not.
        assert_eq!(rx.on_receive(&parts[2], t0).0, Received::Duplicate);
        assert_eq!(rx.on_receive(&due.resend[0], t0).0, Received::Deliver);
        // The response settles every part, acknowledged or not.
        let mut response = data(8, 9, 4, 0);
        response.meta.request = false;
        r.on_receive(&response, t0 + T);
        assert_eq!(r.unacknowledged(), 0);
        assert!(r.pending.is_empty() && r.parts.is_empty());
    }

    #[test]
    fn a_part_given_up_on_fails_its_request_once() {
        let t0 = Instant::now();
        let mut r = Resender::new(T, 1);
        for p in request_parts(4) {
            r.on_send(&p, t0);
        }
        r.tick(t0 + T);
        let due = r.tick(t0 + T * 10);
        // Every part timed out at once: the first fails the request, its
        // siblings go with it.
        assert_eq!(due.failed.len(), 1, "{:?}", due.failed.len());
        assert!(r.pending.is_empty() && r.parts.is_empty());
        // A dead peer's parts fail the request once too.
        for p in request_parts(4) {
            r.on_send(&p, t0);
        }
        assert_eq!(r.forget_peer(8).len(), 1);
        assert!(r.parts.is_empty());
    }
}
