//! The simulated network: packets in flight, link events, each node's next
//! deadline, and the step that moves virtual time to the next of them. A
//! step costs what it touches, not the size of the network: packets wait
//! in a heap by arrival, deadlines in an ordered set refreshed only for the
//! nodes touched since (see [`Nodes`]), and packets to a node that reads
//! nothing aside until it reads again. Each node's outputs are carried out
//! by `crate::carry`, as the Van carries them out, with [`SimOut`] as the
//! backend.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pslite_proto::replica::RangeMap;
use pslite_proto::store::StoreMsg;
use pslite_proto::{Message, Meta, Node, NodeId, K_EMPTY};
use rand::Rng;

use super::{Network, SimNode, MAX_STEPS_AT_ONE_INSTANT};
use crate::carry::{self, Backend};
use crate::checkpoint::disk::Io;
use crate::effects::LinkEvent;
use crate::effects::{Route, WaitingFor};
use crate::error::Failure;

/// A message on its way.
pub(super) struct Packet {
    pub(super) at: Instant,
    seq: u64,
    to: usize,
    identity: NodeId,
    key: Option<u64>,
    /// The meta frame, encoded as on the wire.
    meta: Bytes,
    data: Vec<Bytes>,
}

impl PartialEq for Packet {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Packet {}
impl PartialOrd for Packet {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Packet {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// What is in flight, and when each node has work next.
#[derive(Default)]
pub(super) struct Queues {
    /// Packets by arrival.
    packets: BinaryHeap<Reverse<Packet>>,
    /// Packets to nodes that read nothing now (stopped, or their apps
    /// full), by node, until they read again.
    aside: BTreeMap<usize, Vec<Packet>>,
    /// Connection events due: (when, node, its peer, what), in the order
    /// they happened, as a socket monitor reports them (connections come up
    /// 1 ms after they are opened to a live node; a killed node's close at
    /// once).
    pub(super) links: Vec<(Instant, usize, NodeId, LinkEvent)>,
    /// Each node's next deadline, as last looked at.
    timers: BTreeSet<(Instant, usize)>,
    timer_of: Vec<Option<Instant>>,
    seq: u64,
}

/// The nodes of a network: indexed like a slice; handing one out to
/// change marks it, so its deadline and packets are looked at again
/// before the next step.
pub struct Nodes {
    list: Vec<SimNode>,
    touched: BTreeSet<usize>,
}

impl Nodes {
    pub(super) fn new() -> Nodes {
        Nodes {
            list: Vec::new(),
            touched: BTreeSet::new(),
        }
    }

    pub(super) fn push(&mut self, node: SimNode) {
        self.touched.insert(self.list.len());
        self.list.push(node);
    }
}

impl std::ops::Deref for Nodes {
    type Target = [SimNode];
    fn deref(&self) -> &[SimNode] {
        &self.list
    }
}

impl<I: std::slice::SliceIndex<[SimNode]>> std::ops::Index<I> for Nodes {
    type Output = I::Output;
    fn index(&self, i: I) -> &I::Output {
        &self.list[i]
    }
}

impl std::ops::IndexMut<usize> for Nodes {
    fn index_mut(&mut self, i: usize) -> &mut SimNode {
        self.touched.insert(i);
        &mut self.list[i]
    }
}

impl<'a> IntoIterator for &'a Nodes {
    type Item = &'a SimNode;
    type IntoIter = std::slice::Iter<'a, SimNode>;
    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

impl<'a> IntoIterator for &'a mut Nodes {
    type Item = &'a mut SimNode;
    type IntoIter = std::slice::IterMut<'a, SimNode>;
    fn into_iter(self) -> Self::IntoIter {
        self.touched.extend(0..self.list.len());
        self.list.iter_mut()
    }
}

impl Network {
    /// Whether node `i` reads what arrives (a node that does not leaves
    /// its packets in flight, as a socket keeps them).
    fn reads(&self, i: usize) -> bool {
        self.nodes[i].alive && self.nodes[i].core.is_listening()
    }

    /// Whether packets to node `i` wait (it is stopped, or alive and not
    /// reading; a dead node's packets arrive, and are dropped).
    fn waits(&self, i: usize) -> bool {
        self.nodes[i].paused || (self.nodes[i].alive && !self.reads(i))
    }

    /// Looks again at the nodes touched since the last look: their next
    /// deadline, and the packets set aside for them if they read again.
    fn look_again(&mut self) {
        let touched = std::mem::take(&mut self.nodes.touched);
        for i in touched {
            let q = &mut self.queues;
            if q.timer_of.len() <= i {
                q.timer_of.resize(i + 1, None);
            }
            if let Some(t) = q.timer_of[i].take() {
                q.timers.remove(&(t, i));
            }
            let next = self.nodes[i]
                .alive
                .then(|| self.nodes[i].core.poll_timeout())
                .flatten();
            if let Some(t) = next {
                self.queues.timers.insert((t, i));
                self.queues.timer_of[i] = Some(t);
            }
            if !self.waits(i) {
                if let Some(aside) = self.queues.aside.remove(&i) {
                    self.queues.packets.extend(aside.into_iter().map(Reverse));
                }
            }
        }
    }

    /// Node `i` continues after a stop: what arrived meanwhile is read
    /// first (it arrived by now), then its clock runs.
    pub(super) fn arrived_by_now(&mut self, i: usize) {
        let now = self.now;
        let q = &mut self.queues;
        let mut packets: Vec<Packet> = std::mem::take(&mut q.packets)
            .into_iter()
            .map(|Reverse(p)| p)
            .chain(q.aside.remove(&i).unwrap_or_default())
            .collect();
        for p in &mut packets {
            if p.to == i && p.at < now {
                p.at = now;
            }
        }
        q.packets = packets.into_iter().map(Reverse).collect();
    }

    /// Every connection to node `i` closes now.
    pub(super) fn close_links_to(&mut self, i: usize) {
        let now = self.now;
        for (j, n) in self.nodes.iter().enumerate() {
            for (&peer, &(target, _, _)) in &n.conns {
                if target == Some(i) {
                    self.queues.links.push((now, j, peer, LinkEvent::Down));
                }
            }
        }
    }

    /// Carries out node `i`'s outputs (and its app's answers, at once), as
    /// the Van does: links first, then the rest; what the apps refused
    /// waits in the core.
    pub(crate) fn flush(&mut self, i: usize) {
        loop {
            let node = &mut self.nodes[i];
            let outputs = timed(&mut node.core_time, || node.core.take_output());
            if outputs.is_empty() {
                return;
            }
            carry::links_first(&outputs, &mut SimOut { net: self, i });
            let refused = carry::carry_out(outputs, &mut SimOut { net: self, i });
            if !refused.is_empty() {
                let now = self.now;
                self.nodes[i].core.park(refused, now);
            }
        }
    }

    /// Puts a message from node `i` on the network, through its faults.
    pub(super) fn transmit(&mut self, i: usize, msg: Message) {
        if !self.nodes[i].alive {
            return;
        }
        let Some(&(Some(to), identity, key)) = self.nodes[i].conns.get(&msg.meta.recver) else {
            return; // no connection, or to an address where nobody listens
        };
        // Encoded once, as the Van writes it: what goes on the wire is
        // counted (see [`SimNode::traffic`]).
        let meta = Bytes::from(msg.meta.encode());
        let bytes = meta.len() + msg.data.iter().map(Bytes::len).sum::<usize>();
        let traffic = &mut self.nodes[i].traffic;
        traffic.messages += 1;
        traffic.bytes += bytes as u64;
        let heartbeat = msg.meta.control.cmd == pslite_proto::Command::Heartbeat;
        if heartbeat && (self.heartbeats_lost.contains(&i) || self.heartbeats_lost.contains(&to)) {
            return;
        }
        if msg.meta.partition.is_some() {
            *self.parts_sent_to.entry(to).or_default() += 1;
        }
        let faulty = identity != K_EMPTY && self.nodes[to].core.is_joined();
        if faulty && self.rng.random_bool(self.faults.drop) {
            return;
        }
        let copies = if faulty && self.rng.random_bool(self.faults.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let extra = self.faults.max_delay.as_micros() as u64;
            let delay = Duration::from_millis(1)
                + Duration::from_micros(if extra > 0 {
                    self.rng.random_range(0..extra)
                } else {
                    0
                });
            let at = self.through_cuts(i, to, self.now + delay);
            self.queues.seq += 1;
            self.queues.packets.push(Reverse(Packet {
                at,
                seq: self.queues.seq,
                to,
                identity,
                key,
                meta: meta.clone(),
                data: msg.data.clone(),
            }));
        }
    }

    /// The next time something happens: a packet arrives, a link event is
    /// due, or a core's deadline passes.
    pub(super) fn next_event(&mut self) -> Option<Instant> {
        self.look_again();
        while let Some(Reverse(p)) = self.queues.packets.peek() {
            let to = p.to;
            if !self.waits(to) {
                break;
            }
            if let Some(Reverse(p)) = self.queues.packets.pop() {
                self.queues.aside.entry(to).or_default().push(p);
            }
        }
        let packet = self.queues.packets.peek().map(|Reverse(p)| p.at);
        let link = self.queues.links.iter().map(|l| l.0).min();
        let timer = self.queues.timers.first().map(|&(t, _)| t);
        [packet, link, timer].into_iter().flatten().min()
    }

    /// Moves time to the next event and handles it; false if nothing is
    /// left to happen.
    pub fn step(&mut self) -> bool {
        let Some(at) = self.next_event() else {
            return false;
        };
        if at > self.now {
            self.now = at;
            self.stalled_steps = 0;
        } else {
            self.stalled_steps += 1;
            assert!(
                self.stalled_steps < MAX_STEPS_AT_ONE_INSTANT,
                "busy loop: {MAX_STEPS_AT_ONE_INSTANT} steps without virtual time moving \
                 (a core's poll_timeout stays in the past after tick, or packets bounce \
                 with no delay)"
            );
        }
        let now = self.now;
        // A stopped node's packets wait in its socket, as do a full node's
        // (it reads nothing): `next_event` set them aside.
        let mut due: Vec<Packet> = Vec::new();
        while self
            .queues
            .packets
            .peek()
            .is_some_and(|Reverse(p)| p.at <= now)
        {
            if let Some(Reverse(p)) = self.queues.packets.pop() {
                if self.waits(p.to) {
                    self.queues.aside.entry(p.to).or_default().push(p);
                } else {
                    due.push(p);
                }
            }
        }
        let mut events = Vec::new();
        let mut k = 0;
        while k < self.queues.links.len() {
            if self.queues.links[k].0 <= now {
                events.push(self.queues.links.remove(k));
            } else {
                k += 1;
            }
        }
        for (_, i, peer, event) in events {
            if self.nodes[i].alive {
                let node = &mut self.nodes[i];
                timed(&mut node.core_time, || {
                    node.core.link_event(peer, event, now)
                });
                self.flush(i);
            }
        }
        for p in due {
            if !self.nodes[p.to].alive {
                continue;
            }
            if !self.reads(p.to) {
                // It stopped reading meanwhile: the packet waits.
                self.queues.packets.push(Reverse(p));
                continue;
            }
            // Through the codec, as on the wire; the sender comes from the
            // connection's identity.
            let mut meta = Meta::decode(&p.meta).expect("a meta we encoded decodes");
            meta.sender = p.identity;
            meta.sender_key = p.key;
            let msg = Message { meta, data: p.data };
            let node = &mut self.nodes[p.to];
            let refused = timed(&mut node.core_time, || node.core.handle(msg, now));
            if let Some(refused) = refused {
                node.refused.push(refused);
            }
            self.flush(p.to);
        }
        self.look_again();
        let due: BTreeSet<usize> = self
            .queues
            .timers
            .range(..=(now, usize::MAX))
            .map(|&(_, i)| i)
            .collect();
        for i in due {
            if !self.nodes[i].alive {
                continue;
            }
            if self.nodes[i].core.poll_timeout().is_some_and(|t| t <= now) {
                let wall = self.wall(now);
                let node = &mut self.nodes[i];
                timed(&mut node.core_time, || node.core.tick(now, wall));
                self.flush(i);
            }
        }
        true
    }
}

/// Runs `f` (a call into a core), adding the time it took to `total`:
/// what [`SimNode::core_time`] sums up.
pub(super) fn timed<T>(total: &mut Duration, f: impl FnOnce() -> T) -> T {
    // The simulation measures the core's own time (virtual time is
    // elsewhere).
    #[allow(clippy::disallowed_methods)]
    let start = Instant::now();
    let out = f();
    *total += start.elapsed();
    out
}

/// The harness's side of `crate::carry`: node `i`'s outputs carried out
/// on the simulated network, its app run in place.
struct SimOut<'a> {
    net: &'a mut Network,
    i: usize,
}

impl Backend for SimOut<'_> {
    fn link(&mut self, node: &Node, identity: NodeId, key: Option<u64>) {
        let net = &mut *self.net;
        let target = net
            .by_address
            .get(&(node.hostname.clone(), node.port))
            .copied();
        if target.is_some_and(|t| net.nodes[t].alive) {
            let at = net.now + Duration::from_millis(1);
            net.queues.links.push((at, self.i, node.id, LinkEvent::Up));
        }
        net.nodes[self.i]
            .conns
            .insert(node.id, (target, identity, key));
    }

    fn unlink(&mut self, id: NodeId) {
        self.net.nodes[self.i].conns.remove(&id);
    }

    // Opened by `link`.
    fn connect(&mut self, _: Node, _: NodeId, _: Option<u64>, _: Route) {}

    fn send(&mut self, msg: Message) {
        self.net.transmit(self.i, msg);
    }

    fn deliver(&mut self, msg: Message) -> Result<(), Message> {
        let (net, i) = (&mut *self.net, self.i);
        let now = net.now;
        let node = &mut net.nodes[i];
        if node
            .app_capacity
            .is_some_and(|cap| node.delivered.len() >= cap)
        {
            return Err(msg);
        }
        let Some(app) = node.app.as_mut().filter(|_| msg.meta.request) else {
            node.delivered.push(msg);
            return Ok(());
        };
        let answer = app.apply(&msg);
        node.delivered.push(msg);
        match node.core.send(answer, now) {
            Ok(msgs) => {
                // Its connection first, as the Van opens it.
                net.flush(i);
                for msg in msgs {
                    net.transmit(i, msg);
                }
            }
            // A node that failed (say, fenced: a replacement took its
            // place) sends nothing more; its app's answers are dropped, as
            // the Van drops them.
            Err(_) if node.core.failure().is_some() => {}
            Err(e) => panic!("the core refused an answer: {e}"),
        }
        Ok(())
    }

    fn snapshot(&mut self, app: i32, token: u64, begin: u64, end: u64) {
        let now = self.net.now;
        let node = &mut self.net.nodes[self.i];
        if let Some(a) = &node.app {
            let data = a.snapshot(begin, end);
            node.core.snapshot_taken(token, app, data, now);
        }
    }

    fn restore(&mut self, app: i32, token: u64, begin: u64, end: u64, data: Bytes) {
        let now = self.net.now;
        let node = &mut self.net.nodes[self.i];
        if let Some(a) = node.app.as_mut() {
            a.restore(begin, end, &data);
            node.core.restored(token, app, now);
        }
    }

    fn undeliverable(&mut self, msg: Message, failure: Failure) {
        self.net.nodes[self.i].undeliverable.push((msg, failure));
    }

    fn peer_dead(&mut self, id: NodeId, _: Failure) {
        self.net.nodes[self.i].peer_dead.push(id);
    }

    fn failed(&mut self, failure: Failure) {
        self.net.nodes[self.i].failures.push(failure);
    }

    fn round_began(&mut self, round: u64, workers: Vec<NodeId>) {
        self.net.nodes[self.i].rounds.push((round, workers));
    }

    fn range_map(&mut self, map: RangeMap) {
        self.net.nodes[self.i].maps.push(map);
    }

    fn checkpoint_io(&mut self, token: u64, io: Io) {
        self.net.checkpoint_io(self.i, token, io);
    }

    fn reply(&mut self, route: Bytes, msg: Message, reserved: usize) {
        let node = &mut self.net.nodes[self.i];
        node.reserved += reserved;
        node.answers.push((route, msg));
    }

    fn store_event(&mut self, watchers: Vec<u64>, event: StoreMsg) {
        let node = &mut self.net.nodes[self.i];
        for w in watchers {
            node.store_events.push((w, event.clone()));
        }
    }

    fn waiting(&mut self, what: WaitingFor, waited: Duration, _: Duration) {
        let node = &mut self.net.nodes[self.i];
        node.waiting.push(waited);
        node.waiting_for.push(what);
    }
}
