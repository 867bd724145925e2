//! A deterministic in-memory network of [`Core`]s with virtual time (tests
//! only; raft-rs's `harness/network` is the model): whole clusters exchange
//! messages with no sockets, no threads and no sleeps. Packets can be
//! dropped, duplicated and delayed (which reorders them); nodes can be
//! killed and restarted, and a node's apps can stop taking messages
//! ([`SimNode::app_capacity`]: the node then reads nothing and its packets
//! wait in flight, as in a socket). Every meta frame goes through the
//! codec, as on the wire.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pslite_proto::ids::{self, NodeId};
use pslite_proto::{Message, Meta, Node, Role, K_EMPTY};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::VanConfig;
use crate::core::{Core, Output};
use crate::error::Failure;
use crate::member::BarrierOutcome;

/// What the network does to packets. Losses and duplicates model
/// `PS_DROP_MSG` and resends on a reliable transport (TCP): they hit only
/// packets between identified nodes to a node that has joined, as
/// `PS_DROP_MSG` does; delays (and so reordering across connections) hit
/// every packet.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Probability that a packet is lost.
    pub drop: f64,
    /// Probability that a packet arrives twice.
    pub duplicate: f64,
    /// Each packet takes 1 ms plus up to this much more (reordering).
    pub max_delay: Duration,
}

struct Packet {
    at: Instant,
    seq: u64,
    to: usize,
    identity: NodeId,
    key: Option<u64>,
    msg: Message,
}

/// One node of the network: its core and what came out of it.
pub struct SimNode {
    /// The node's control plane.
    pub core: Core,
    /// Where it listens.
    pub host: String,
    /// Its port.
    pub port: i32,
    /// Whether it runs (a killed node receives and does nothing).
    pub alive: bool,
    /// Stopped (SIGSTOP): packets to it wait.
    paused: bool,
    /// Data messages delivered to its apps.
    pub delivered: Vec<Message>,
    /// How many deliveries its apps take in all (`None`: any number): past
    /// it the apps' queues are full and refuse (see [`Network::give_room`]).
    pub app_capacity: Option<usize>,
    /// Failures reported (node failed).
    pub failures: Vec<Failure>,
    /// Messages it gave up on.
    pub undeliverable: Vec<(Message, Failure)>,
    /// Peers reported dead for good.
    pub peer_dead: Vec<NodeId>,
    /// "Still waiting to join" reports.
    pub waiting: Vec<Duration>,
    /// What each of those reports says it waits for.
    pub waiting_for: Vec<crate::core::WaitingFor>,
    /// Answers to admin clients (`pslite status`), with the connection
    /// (routing id) they went to, not read yet (their share of the reply
    /// budget stays taken until [`Network::read_answers`]).
    pub answers: Vec<(bytes::Bytes, Message)>,
    reserved: usize,
    /// Elastic rounds reported: (round, workers in rank order).
    pub rounds: Vec<(u64, Vec<NodeId>)>,
    /// The app that answers KV requests (replication tests), if any.
    pub app: Option<SumApp>,
    /// Range maps reported (replicated key ranges).
    pub maps: Vec<pslite_proto::replica::RangeMap>,
    /// Store events handed to this process's watchers: (watcher, event).
    pub store_events: Vec<(u64, pslite_proto::store::StoreMsg)>,
    /// Connections: peer id -> (node index or none, identity and key used).
    conns: HashMap<NodeId, (Option<usize>, NodeId, Option<u64>)>,
    /// Identities refused (a stranger's, or an earlier process's).
    pub refused: Vec<crate::core::IdentityRefused>,
}

/// The network: nodes, packets in flight, and the virtual clock.
pub struct Network {
    /// The virtual time.
    pub now: Instant,
    /// The nodes; index 0 is the scheduler of clusters built here.
    pub nodes: Vec<SimNode>,
    /// What happens to packets.
    pub faults: Faults,
    /// Template configuration of new nodes.
    pub config: VanConfig,
    packets: Vec<Packet>,
    /// Connection events due: (when, node, its peer, what), as a socket
    /// monitor reports them (connections come up 1 ms after they are
    /// opened to a live node; a killed node's connections close at once).
    links: Vec<(Instant, usize, NodeId, crate::core::LinkEvent)>,
    rng: StdRng,
    seq: u64,
    /// Steps taken without the clock moving (a busy-loop detector).
    stalled_steps: u32,
    /// The files checkpoints wrote (one file system shared by every node).
    pub disk: std::collections::BTreeMap<std::path::PathBuf, bytes::Bytes>,
    /// Parts of messages put on the wire, by receiving node.
    pub parts_sent_to: HashMap<usize, usize>,
}

/// Steps at one virtual instant after which the harness calls it a busy
/// loop (a core whose deadline stays in the past after `tick`) and fails
/// the test, instead of hanging it. Real runs take a handful.
const MAX_STEPS_AT_ONE_INSTANT: u32 = 100_000;

/// The scheduler's address in clusters built here.
pub const SCHEDULER_PORT: i32 = 9000;

impl Network {
    /// An empty network whose nodes use `config` (role and port aside).
    pub fn new(config: VanConfig, seed: u64) -> Network {
        Network {
            now: Instant::now(),
            nodes: Vec::new(),
            faults: Faults::default(),
            config: VanConfig {
                scheduler_host: "127.0.0.1".into(),
                scheduler_port: SCHEDULER_PORT,
                host: "127.0.0.1".into(),
                ..config
            },
            packets: Vec::new(),
            links: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            seq: 0,
            stalled_steps: 0,
            disk: std::collections::BTreeMap::new(),
            parts_sent_to: HashMap::new(),
        }
    }

    /// A scheduler, `servers` servers and `workers` workers (in that index
    /// order, ports 9000, 10000, 10001...), none registered yet.
    pub fn cluster(servers: i32, workers: i32, config: VanConfig, seed: u64) -> Network {
        let mut net = Network::new(
            VanConfig {
                num_servers: servers,
                num_workers: workers,
                ..config
            },
            seed,
        );
        net.add(Role::Scheduler, SCHEDULER_PORT);
        for i in 0..servers + workers {
            let role = if i < servers {
                Role::Server
            } else {
                Role::Worker
            };
            net.add(role, 10_000 + i);
        }
        net
    }

    /// Adds a node of `role` listening on `port`; returns its index.
    pub fn add(&mut self, role: Role, port: i32) -> usize {
        let cfg = VanConfig {
            role,
            port: Some(port),
            ..self.config.clone()
        };
        let seed = self.rng.random();
        let core = Core::new(&cfg, port, self.now, seed);
        self.nodes.push(SimNode {
            core,
            host: "127.0.0.1".into(),
            port,
            alive: true,
            paused: false,
            delivered: Vec::new(),
            app_capacity: None,
            failures: Vec::new(),
            undeliverable: Vec::new(),
            peer_dead: Vec::new(),
            waiting: Vec::new(),
            waiting_for: Vec::new(),
            answers: Vec::new(),
            rounds: Vec::new(),
            app: None,
            maps: Vec::new(),
            store_events: Vec::new(),
            conns: HashMap::new(),
            refused: Vec::new(),
            reserved: 0,
        });
        let i = self.nodes.len() - 1;
        self.flush(i);
        i
    }

    /// Kills node `i`: it stops receiving and ticking, and every
    /// connection to it closes (as the kernel closes a dead process's
    /// sockets).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].alive = false;
        self.close_links_to(i);
    }

    /// Stops node `i` as SIGSTOP would: it does nothing, but its
    /// connections stay open and what is sent to it waits in its socket.
    /// [`Network::resume`] continues it.
    pub fn pause(&mut self, i: usize) {
        self.nodes[i].alive = false;
        self.nodes[i].paused = true;
    }

    /// Continues node `i` after [`Network::pause`]: what arrived meanwhile
    /// is read first, then its clock runs (it jumped).
    pub fn resume(&mut self, i: usize) {
        self.nodes[i].alive = true;
        self.nodes[i].paused = false;
        let now = self.now;
        for p in &mut self.packets {
            if p.to == i && p.at < now {
                p.at = now;
            }
        }
    }

    /// Every connection to node `i` closes now.
    fn close_links_to(&mut self, i: usize) {
        let now = self.now;
        for (j, n) in self.nodes.iter().enumerate() {
            for (&peer, &(target, _, _)) in &n.conns {
                if target == Some(i) {
                    self.links
                        .push((now, j, peer, crate::core::LinkEvent::Down));
                }
            }
        }
    }

    /// Replaces node `i` by a fresh process at the same address (a restart).
    pub fn restart(&mut self, i: usize) {
        let role = self.nodes[i].core.me().role;
        let port = self.nodes[i].port;
        let cfg = VanConfig {
            role,
            port: Some(port),
            ..self.config.clone()
        };
        let seed = self.rng.random();
        self.close_links_to(i);
        let node = &mut self.nodes[i];
        node.core = Core::new(&cfg, port, self.now, seed);
        node.alive = true;
        node.paused = false;
        node.conns.clear();
        node.delivered.clear();
        node.failures.clear();
        node.rounds.clear();
        node.maps.clear();
        if node.app.is_some() {
            node.app = Some(SumApp::default());
        }
        self.flush(i);
    }

    /// Every live node registers (joins) as customer 0.
    pub fn register_all(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].alive {
                self.register(i);
            }
        }
    }

    /// Node `i` registers as customer 0.
    pub fn register(&mut self, i: usize) {
        let now = self.now;
        self.nodes[i].core.register(0, now);
        self.flush(i);
    }

    /// Whether every live node has joined.
    pub fn all_joined(&self) -> bool {
        self.nodes
            .iter()
            .filter(|n| n.alive)
            .all(|n| n.core.is_joined())
    }

    /// Node `i` starts waiting on a barrier over `group`.
    pub fn barrier(&mut self, i: usize, group: i32) -> u64 {
        self.barrier_within(i, group, None)
    }

    /// Node `i` starts waiting on a barrier over `group`, for at most
    /// `timeout`.
    pub fn barrier_within(&mut self, i: usize, group: i32, timeout: Option<Duration>) -> u64 {
        let now = self.now;
        let token = self.nodes[i]
            .core
            .barrier(0, group, timeout, now)
            .expect("barrier request refused");
        self.flush(i);
        token
    }

    /// How node `i`'s barrier `token` ended, if it has.
    pub fn outcome(&self, i: usize, token: u64) -> Option<BarrierOutcome> {
        self.nodes[i].core.barrier_outcome(token)
    }

    /// The indices of the live nodes in `group`.
    pub fn members(&self, group: i32) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].alive)
            .filter(|&i| ids::group_contains(group, self.nodes[i].core.me().id))
            .collect()
    }

    /// Every live member enters a barrier over everyone; whether all were
    /// released within `limit`.
    pub fn barrier_over_all(&mut self, limit: Duration) -> bool {
        let waiters: Vec<(usize, u64)> = self
            .members(ids::ALL_GROUP)
            .into_iter()
            .map(|i| (i, self.barrier(i, ids::ALL_GROUP)))
            .collect();
        self.run_until(limit, |n| {
            waiters
                .iter()
                .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))
        })
    }

    /// Node `i` sends a data message (as an app would).
    pub fn send(&mut self, i: usize, msg: Message) {
        let now = self.now;
        let msg = self.nodes[i]
            .core
            .send(msg, now)
            .expect("the core refused to send");
        self.flush(i);
        for msg in msg {
            self.transmit(i, msg);
        }
    }

    /// Node `i` sends store request `req` (its caller waits up to an
    /// hour); ask its core for the answer with the id returned.
    pub fn store(&mut self, i: usize, req: pslite_proto::store::StoreMsg) -> u64 {
        self.store_within(i, req, Duration::from_secs(3600))
    }

    /// Node `i` sends store request `req`, its caller waiting up to `limit`.
    pub fn store_within(
        &mut self,
        i: usize,
        req: pslite_proto::store::StoreMsg,
        limit: Duration,
    ) -> u64 {
        let now = self.now;
        let id = self.nodes[i]
            .core
            .store_request(req, limit, now)
            .expect("store request refused");
        self.flush(i);
        id
    }

    /// Node `i` watches store key `key`: its events are recorded in
    /// [`SimNode::store_events`] under the watcher returned second; ask the
    /// core for the WATCH answer with the id returned first.
    pub fn store_watch(&mut self, i: usize, key: &str) -> (u64, u64) {
        let watcher = self.nodes[i].core.store_watch(key);
        let req = pslite_proto::store::StoreMsg::request(
            pslite_proto::store::StoreOp::Watch,
            vec![key.to_string()],
        );
        (self.store(i, req), watcher)
    }

    /// Node `i` stops (finalized): its exit drain begins (see
    /// [`Core::drain_outcome`]).
    pub fn finish(&mut self, i: usize) {
        let now = self.now;
        self.nodes[i].core.finish(now);
        self.flush(i);
    }

    /// Node `i` leaves the store (as at finalize): its watches end.
    pub fn store_leave(&mut self, i: usize) {
        let now = self.now;
        self.nodes[i].core.store_leave(now);
        self.flush(i);
    }

    /// Node `i`'s apps drain their queues and take any number again: what
    /// they refused is handed over.
    pub fn give_room(&mut self, i: usize) {
        let now = self.now;
        self.nodes[i].app_capacity = None;
        self.nodes[i].core.room(now);
        self.flush(i);
    }

    /// Carries out node `i`'s outputs (and its app's answers, at once).
    pub(crate) fn flush(&mut self, i: usize) {
        loop {
            let outputs = self.nodes[i].core.take_output();
            if outputs.is_empty() {
                return;
            }
            // Connections (and disconnections, in order) at once, as the Van
            // opens them under the core's lock: a send carried out meanwhile
            // (an app's answer) finds them.
            for out in &outputs {
                match out {
                    Output::Connect {
                        node,
                        identity,
                        key,
                        ..
                    } => {
                        let target = self
                            .nodes
                            .iter()
                            .position(|n| n.host == node.hostname && n.port == node.port);
                        if target.is_some_and(|t| self.nodes[t].alive) {
                            let at = self.now + Duration::from_millis(1);
                            self.links
                                .push((at, i, node.id, crate::core::LinkEvent::Up));
                        }
                        self.nodes[i]
                            .conns
                            .insert(node.id, (target, *identity, *key));
                    }
                    Output::Disconnect(id) => {
                        self.nodes[i].conns.remove(id);
                    }
                    _ => {}
                }
            }
            self.carry_out(i, outputs);
        }
    }

    fn carry_out(&mut self, i: usize, outputs: Vec<Output>) {
        let now = self.now;
        let mut refused = Vec::new();
        for out in outputs {
            match out {
                Output::Deliver(msg)
                    if !refused.is_empty()
                        || self.nodes[i]
                            .app_capacity
                            .is_some_and(|cap| self.nodes[i].delivered.len() >= cap) =>
                {
                    refused.push(Output::Deliver(msg));
                }
                out @ (Output::Snapshot { .. } | Output::Restore { .. }) if !refused.is_empty() => {
                    refused.push(out)
                }
                Output::Deliver(msg) if msg.meta.request && self.nodes[i].app.is_some() => {
                    let node = &mut self.nodes[i];
                    let Some(app) = node.app.as_mut() else {
                        continue;
                    };
                    let answer = app.apply(&msg);
                    node.delivered.push(msg);
                    match node.core.send(answer, now) {
                        Ok(msgs) => {
                            // Its connection first, as the Van opens it.
                            self.flush(i);
                            for msg in msgs {
                                self.transmit(i, msg)
                            }
                        }
                        // A node that failed (say, fenced: a replacement
                        // took its place) sends nothing more; its app's
                        // answers are dropped, as the Van drops them.
                        Err(_) if node.core.failure().is_some() => {}
                        Err(e) => panic!("the core refused an answer: {e}"),
                    }
                }
                Output::Snapshot {
                    token,
                    begin,
                    end,
                    apps,
                    ..
                } => {
                    let node = &mut self.nodes[i];
                    if let Some(app) = &node.app {
                        let data = app.snapshot(begin, end);
                        for a in apps {
                            node.core.snapshot_taken(token, a, data.clone(), now);
                        }
                    }
                }
                Output::Restore {
                    token,
                    begin,
                    end,
                    apps,
                    data,
                    ..
                } => {
                    let node = &mut self.nodes[i];
                    if let Some(app) = node.app.as_mut() {
                        for (a, d) in apps.into_iter().zip(data) {
                            app.restore(begin, end, &d);
                            node.core.restored(token, a, now);
                        }
                    }
                }
                Output::RangeMap(map) => self.nodes[i].maps.push(map),
                Output::Checkpoint { token, io } => {
                    let result = self.perform(&io);
                    self.nodes[i].core.checkpoint_io_done(token, result, now);
                }
                Output::Connect { .. } | Output::Disconnect(_) => {} // carried out by flush
                Output::Send(msg) => self.transmit(i, msg),
                Output::Deliver(msg) => self.nodes[i].delivered.push(msg),
                Output::Undeliverable(msg, f) => self.nodes[i].undeliverable.push((msg, f)),
                Output::PeerDead(id, _) => self.nodes[i].peer_dead.push(id),
                Output::Failed(f) => self.nodes[i].failures.push(f),
                Output::Waiting { waited, what, .. } => {
                    self.nodes[i].waiting.push(waited);
                    self.nodes[i].waiting_for.push(what);
                }
                Output::Reply {
                    route,
                    msg,
                    reserved,
                } => {
                    self.nodes[i].reserved += reserved;
                    self.nodes[i].answers.push((route, msg));
                }
                Output::RoundBegan { round, workers } => {
                    self.nodes[i].rounds.push((round, workers))
                }
                Output::StoreEvent { watchers, event } => {
                    for w in watchers {
                        self.nodes[i].store_events.push((w, event.clone()));
                    }
                }
            }
        }
        if !refused.is_empty() {
            let now = self.now;
            self.nodes[i].core.park(refused, now);
        }
    }

    /// Whether node `i` reads what arrives (a node that does not leaves
    /// its packets in flight, as a socket keeps them).
    fn reads(&self, i: usize) -> bool {
        self.nodes[i].alive && self.nodes[i].core.is_listening()
    }

    /// Carries out a checkpoint's file operation on [`Network::disk`].
    fn perform(&mut self, io: &crate::checkpoint::disk::Io) -> crate::checkpoint::disk::IoResult {
        use crate::checkpoint::disk::{Io, IoResult};
        match io {
            Io::Write { path, bytes } => {
                self.disk.insert(path.clone(), bytes.clone());
                IoResult::Done
            }
            Io::Read { paths } => {
                let mut out = Vec::new();
                for candidates in paths {
                    match candidates
                        .iter()
                        .find_map(|p| self.disk.get(p).map(|b| (p.clone(), b.clone())))
                    {
                        Some(found) => out.push(found),
                        None => {
                            return IoResult::Failed(format!(
                                "checkpoint file {candidates:?} is missing"
                            ))
                        }
                    }
                }
                IoResult::Read(out)
            }
            Io::Prune { dir, below } => {
                self.disk.retain(|path, _| {
                    path.strip_prefix(dir)
                        .ok()
                        .and_then(|p| p.components().next())
                        .and_then(|c| {
                            c.as_os_str()
                                .to_str()?
                                .strip_prefix("checkpoint-")?
                                .parse::<u64>()
                                .ok()
                        })
                        .is_none_or(|id| id >= *below)
                });
                IoResult::Done
            }
        }
    }

    /// The checkpoints on [`Network::disk`] under `dir`, as
    /// [`crate::checkpoint::disk::scan`] finds them on a real one.
    pub fn scan_checkpoints(&self, dir: &std::path::Path) -> Vec<crate::checkpoint::disk::Found> {
        use crate::checkpoint::disk::{checkpoint_dir, Found, MANIFEST};
        let mut ids: Vec<u64> = self
            .disk
            .keys()
            .filter_map(|p| p.strip_prefix(dir).ok())
            .filter_map(|p| p.components().next())
            .filter_map(|c| {
                c.as_os_str()
                    .to_str()?
                    .strip_prefix("checkpoint-")?
                    .parse()
                    .ok()
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| {
                let manifest_path = checkpoint_dir(dir, id).join(MANIFEST);
                Found {
                    id,
                    manifest: self.disk.get(&manifest_path).cloned().map(Ok),
                    manifest_path,
                }
            })
            .collect()
    }

    /// Puts a message from node `i` on the network, through its faults.
    fn transmit(&mut self, i: usize, msg: Message) {
        if !self.nodes[i].alive {
            return;
        }
        let Some(&(Some(to), identity, key)) = self.nodes[i].conns.get(&msg.meta.recver) else {
            return; // no connection, or to an address where nobody listens
        };
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
            self.seq += 1;
            self.packets.push(Packet {
                at: self.now + delay,
                seq: self.seq,
                to,
                identity,
                key,
                msg: msg.clone(),
            });
        }
    }

    /// The next time something happens: a packet arrives or a core's
    /// deadline passes.
    fn next_event(&self) -> Option<Instant> {
        let packets = self
            .packets
            .iter()
            .filter(|p| !self.nodes[p.to].paused && (self.reads(p.to) || !self.nodes[p.to].alive))
            .map(|p| p.at)
            .chain(self.links.iter().map(|l| l.0))
            .min();
        let timers = self
            .nodes
            .iter()
            .filter(|n| n.alive)
            .filter_map(|n| n.core.poll_timeout())
            .min();
        packets.into_iter().chain(timers).min()
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
        let mut due: Vec<Packet> = Vec::new();
        let mut i = 0;
        while i < self.packets.len() {
            // A stopped node's packets wait in its socket, as do a full
            // node's (it reads nothing).
            let p = &self.packets[i];
            if p.at <= now
                && !self.nodes[p.to].paused
                && (self.reads(p.to) || !self.nodes[p.to].alive)
            {
                due.push(self.packets.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|p| (p.at, p.seq));
        let mut events = Vec::new();
        let mut k = 0;
        while k < self.links.len() {
            if self.links[k].0 <= now {
                events.push(self.links.remove(k));
            } else {
                k += 1;
            }
        }
        for (_, i, peer, event) in events {
            if self.nodes[i].alive {
                self.nodes[i].core.link_event(peer, event, now);
                self.flush(i);
            }
        }
        for p in due {
            if !self.nodes[p.to].alive {
                continue;
            }
            if !self.reads(p.to) {
                // It stopped reading meanwhile: the packet waits.
                self.packets.push(p);
                continue;
            }
            // Through the codec, as on the wire; the sender comes from the
            // connection's identity.
            let mut meta = Meta::decode(&p.msg.meta.encode()).expect("a meta we encoded decodes");
            meta.sender = p.identity;
            meta.sender_key = p.key;
            let msg = Message {
                meta,
                data: p.msg.data,
            };
            if let Some(refused) = self.nodes[p.to].core.handle(msg, now) {
                self.nodes[p.to].refused.push(refused);
            }
            self.flush(p.to);
        }
        for i in 0..self.nodes.len() {
            if !self.nodes[i].alive {
                continue;
            }
            if self.nodes[i].core.poll_timeout().is_some_and(|t| t <= now) {
                self.nodes[i].core.tick(now);
                self.flush(i);
            }
        }
        true
    }

    /// Runs until `done` holds (true) or `limit` of virtual time passes or
    /// nothing is left to happen (false).
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Network) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if self.now > end || !self.step() {
                return done(self);
            }
        }
    }

    /// Runs for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.next_event().is_some_and(|t| t <= end) {
            self.step();
        }
        self.now = self.now.max(end);
    }

    /// Registers every node and runs until the cluster has formed.
    pub fn form(&mut self, limit: Duration) -> bool {
        self.register_all();
        self.run_until(limit, Network::all_joined)
    }

    /// A data request from node `from` to node `to` with timestamp `ts`.
    pub fn request(&self, from: usize, to: usize, ts: i32) -> Message {
        let mut msg = Message::default();
        msg.meta.app_id = 0;
        msg.meta.customer_id = 0;
        msg.meta.request = true;
        msg.meta.push = true;
        msg.meta.timestamp = ts;
        msg.meta.recver = self.nodes[to].core.me().id;
        msg.meta.sender = self.nodes[from].core.me().id;
        msg.data = vec![bytes::Bytes::from(ts.to_le_bytes().to_vec())];
        msg
    }

    /// The admin clients read node `i`'s answers: returns them, and their
    /// share of the reply budget is free again.
    pub fn read_answers(&mut self, i: usize) -> Vec<(bytes::Bytes, Message)> {
        let node = &mut self.nodes[i];
        let gauge = node.core.reply_gauge();
        gauge.fetch_sub(node.reserved, std::sync::atomic::Ordering::Relaxed);
        node.reserved = 0;
        std::mem::take(&mut node.answers)
    }

    /// The key the live node with id `id` presents in its identity (what a
    /// test that forges a member's message must know).
    pub fn key_of(&self, id: NodeId) -> Option<u64> {
        self.index_of(id).map(|i| self.nodes[i].core.me().key)
    }

    /// The id of node `i`.
    pub fn id(&self, i: usize) -> NodeId {
        self.nodes[i].core.me().id
    }

    /// The index of the node with id `id`.
    pub fn index_of(&self, id: NodeId) -> Option<usize> {
        (id != K_EMPTY)
            .then(|| {
                self.nodes
                    .iter()
                    .position(|n| n.alive && n.core.me().id == id)
            })
            .flatten()
    }
}

/// A server app for the replication tests: sums pushed `i64` values per
/// key, remembers every value applied (each push carries values never
/// pushed before, so applying one twice shows), answers pulls with the sums,
/// and copies and restores key ranges.
#[derive(Clone, Debug, Default)]
pub struct SumApp {
    /// Per key: the values applied.
    pub store: std::collections::BTreeMap<u64, Vec<i64>>,
    /// Values applied a second time.
    pub doubles: Vec<(u64, i64)>,
    /// What it did, for test failures.
    pub trace: Vec<String>,
}

fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

impl SumApp {
    /// Applies a KV request; returns the answer (the core pairs it).
    pub fn apply(&mut self, msg: &Message) -> Message {
        let keys = msg.data.first().map(|b| u64s(b)).unwrap_or_default();
        if msg.meta.push {
            let vals = msg.data.get(1).map(|b| i64s(b)).unwrap_or_default();
            self.trace.push(format!(
                "apply from {} ts {} keys {keys:?} vals {vals:?}",
                msg.meta.sender, msg.meta.timestamp
            ));
            for (k, v) in keys.iter().zip(vals) {
                let slot = self.store.entry(*k).or_default();
                if slot.contains(&v) {
                    self.doubles.push((*k, v));
                }
                slot.push(v);
            }
        }
        let mut answer = Message::default();
        answer.meta.app_id = msg.meta.app_id;
        answer.meta.customer_id = msg.meta.customer_id;
        answer.meta.push = msg.meta.push;
        answer.meta.pull = msg.meta.pull;
        answer.meta.head = msg.meta.head;
        answer.meta.timestamp = msg.meta.timestamp;
        answer.meta.recver = msg.meta.sender;
        if msg.meta.pull {
            let sums: Vec<u8> = keys
                .iter()
                .flat_map(|k| self.sum(*k).to_le_bytes())
                .collect();
            let keys: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
            answer.data = vec![keys.into(), sums.into()];
            answer.meta.data_type = vec![
                pslite_proto::DataType::UInt64,
                pslite_proto::DataType::Int64,
            ];
        }
        answer
    }

    /// The sum of key `k`'s values.
    pub fn sum(&self, k: u64) -> i64 {
        self.store.get(&k).map_or(0, |v| v.iter().sum())
    }

    /// The keys in `[begin, end)` with their values.
    pub fn copy(&self, begin: u64, end: u64) -> Vec<(u64, Vec<i64>)> {
        self.store
            .iter()
            .filter(|(&k, _)| k >= begin && (k < end || end == u64::MAX))
            .map(|(&k, v)| (k, v.clone()))
            .collect()
    }

    fn snapshot(&self, begin: u64, end: u64) -> bytes::Bytes {
        let mut out = Vec::new();
        for (k, vals) in self.copy(begin, end) {
            out.extend(k.to_le_bytes());
            out.extend((vals.len() as u64).to_le_bytes());
            for v in vals {
                out.extend(v.to_le_bytes());
            }
        }
        out.into()
    }

    fn restore(&mut self, begin: u64, end: u64, data: &[u8]) {
        self.trace
            .push(format!("restore {begin}..{end}: {} bytes", data.len()));
        self.store
            .retain(|&k, _| !(k >= begin && (k < end || end == u64::MAX)));
        let words = u64s(data);
        let mut at = 0;
        while at + 2 <= words.len() {
            let (k, n) = (words[at], words[at + 1] as usize);
            let vals = words[at + 2..at + 2 + n]
                .iter()
                .map(|&w| w as i64)
                .collect();
            self.store.insert(k, vals);
            at += 2 + n;
        }
    }
}

#[cfg(test)]
mod backpressure_tests;
#[cfg(test)]
mod checkpoint_tests;
#[cfg(test)]
mod deadline_tests;
#[cfg(test)]
mod elastic_tests;
#[cfg(test)]
mod identity_tests;
#[cfg(test)]
mod partition_tests;
#[cfg(test)]
mod replica_tests;
#[cfg(test)]
mod servers_tests;
#[cfg(test)]
mod tests;
