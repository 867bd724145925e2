//! A deterministic in-memory network of [`Core`]s with virtual time (tests
//! only; raft-rs's `harness/network` is the model): whole clusters exchange
//! messages with no sockets, no threads and no sleeps. Packets can be
//! dropped, duplicated and delayed (which reorders them); nodes can be
//! killed and restarted, and a node's apps can stop taking messages
//! ([`SimNode::app_capacity`]: the node then reads nothing and its packets
//! wait in flight, as in a socket). Every meta frame goes through the
//! codec, as on the wire, and each node's outputs go through the Van's own
//! interpreter (`crate::carry`).
//!
//! Built for tests, and with the crate's `harness` feature for simulations
//! elsewhere; a step costs what it touches (see `net.rs`), so clusters of
//! thousands of nodes run. `app.rs` holds the server app, `disk.rs` the
//! file system checkpoints write to.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pslite_proto::ids::{self, NodeId};
use pslite_proto::{Message, Role, K_EMPTY};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::VanConfig;
use crate::core::{Call, Core, Done, Ticket};
use crate::error::{Failure, VanError};
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
    pub waiting_for: Vec<crate::effects::WaitingFor>,
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
    pub(crate) conns: HashMap<NodeId, (Option<usize>, NodeId, Option<u64>)>,
    /// Identities refused (a stranger's, or an earlier process's).
    pub refused: Vec<crate::core::IdentityRefused>,
    /// What it put on the network (messages and their encoded bytes).
    pub traffic: Traffic,
    /// The time spent in its core's calls (handling what arrived, ticks,
    /// outputs, the harness's requests): the control plane's CPU.
    pub core_time: Duration,
}

/// Messages and bytes (meta frame as encoded, plus data frames) a node put
/// on the network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages sent.
    pub messages: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The network: nodes, packets in flight, and the virtual clock.
pub struct Network {
    /// The virtual time.
    pub now: Instant,
    /// Where virtual time began.
    origin: Instant,
    /// The nodes; index 0 is the scheduler of clusters built here.
    pub nodes: Nodes,
    /// What happens to packets.
    pub faults: Faults,
    /// Template configuration of new nodes.
    pub config: VanConfig,
    /// What is in flight, and when each node has work next.
    queues: Queues,
    /// The nodes by address.
    by_address: HashMap<(String, i32), usize>,
    rng: StdRng,
    /// Steps taken without the clock moving (a busy-loop detector).
    stalled_steps: u32,
    /// The files checkpoints wrote (one file system shared by every node).
    pub disk: std::collections::BTreeMap<std::path::PathBuf, bytes::Bytes>,
    /// Writes to [`Network::disk`] that fail or wait, and the log of its
    /// operations.
    pub disk_faults: DiskFaults,
    /// Nodes whose heartbeats (sent or answered) are lost for now; what
    /// else they send and receive goes through.
    pub heartbeats_lost: std::collections::HashSet<usize>,
    /// Parts of messages put on the wire, by receiving node.
    pub parts_sent_to: HashMap<usize, usize>,
    /// The servers that asked to leave the job, and their calls' tickets.
    pub leaving: HashMap<usize, Ticket>,
    /// Links cut (see [`Network::cut_link`]), until when.
    cuts: HashMap<usize, Instant>,
    /// Connections whose packets wait for TCP's next retransmission after
    /// a cut: (from, to) -> when they arrive.
    stalls: HashMap<(usize, usize), Instant>,
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
        // The simulation's origin of virtual time.
        #[allow(clippy::disallowed_methods)]
        let origin = Instant::now();
        Network {
            now: origin,
            origin,
            nodes: Nodes::new(),
            faults: Faults::default(),
            config: VanConfig {
                scheduler_host: "127.0.0.1".into(),
                scheduler_port: SCHEDULER_PORT,
                host: "127.0.0.1".into(),
                ..config
            },
            queues: Queues::default(),
            by_address: HashMap::new(),
            rng: StdRng::seed_from_u64(seed),
            stalled_steps: 0,
            disk: std::collections::BTreeMap::new(),
            disk_faults: DiskFaults::default(),
            heartbeats_lost: std::collections::HashSet::new(),
            parts_sent_to: HashMap::new(),
            leaving: HashMap::new(),
            cuts: HashMap::new(),
            stalls: HashMap::new(),
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
        let core = Core::new(&cfg, port, self.now, self.wall(self.now), seed);
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
            traffic: Traffic::default(),
            core_time: Duration::ZERO,
        });
        let i = self.nodes.len() - 1;
        self.by_address.insert(("127.0.0.1".to_string(), port), i);
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
        self.arrived_by_now(i);
    }

    /// The virtual wall clock at `now`: it reads 2025-06-15 at the start.
    pub fn wall(&self, now: Instant) -> std::time::SystemTime {
        std::time::UNIX_EPOCH
            + Duration::from_secs(1_750_000_000)
            + now.saturating_duration_since(self.origin)
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
        let wall = self.wall(self.now);
        let node = &mut self.nodes[i];
        node.core = Core::new(&cfg, port, self.now, wall, seed);
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
        let node = &mut self.nodes[i];
        let join = Call::Join { customer: 0 };
        net::timed(&mut node.core_time, || node.core.call(join, None, now))
            .expect("joining is never refused");
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
    pub fn barrier(&mut self, i: usize, group: i32) -> Ticket {
        self.barrier_within(i, group, None)
    }

    /// Node `i` starts waiting on a barrier over `group`, for at most
    /// `timeout`.
    pub fn barrier_within(&mut self, i: usize, group: i32, timeout: Option<Duration>) -> Ticket {
        let now = self.now;
        let node = &mut self.nodes[i];
        let barrier = Call::Barrier { customer: 0, group };
        let ticket = net::timed(&mut node.core_time, || {
            node.core.call(barrier, timeout, now)
        })
        .expect("barrier request refused");
        self.flush(i);
        ticket
    }

    /// How node `i`'s barrier `ticket` ended, if it has (its failure as
    /// the node has it; a barrier with a deadline: see [`Network::answer`]).
    pub fn outcome(&self, i: usize, ticket: Ticket) -> Option<BarrierOutcome> {
        let outcome = self.nodes[i].core.outcome(ticket)?;
        Some(outcome.map(drop).map_err(|e| match e {
            VanError::Failed(f) => f,
            e => panic!("a barrier without a deadline ended with {e}"),
        }))
    }

    /// How node `i`'s call `ticket` ended, if it has.
    pub fn answer(&self, i: usize, ticket: Ticket) -> Option<Result<Done, VanError>> {
        self.nodes[i].core.outcome(ticket)
    }

    /// Node `i` starts `call`, waiting up to `limit` (the call must start).
    pub fn call(&mut self, i: usize, call: Call, limit: Option<Duration>) -> Ticket {
        let now = self.now;
        let ticket = self.nodes[i]
            .core
            .call(call, limit, now)
            .expect("the call was refused");
        self.flush(i);
        ticket
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
        let waiters: Vec<(usize, Ticket)> = self
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
    /// hour); ask [`Network::answer`] with the ticket returned.
    pub fn store(&mut self, i: usize, req: pslite_proto::store::StoreMsg) -> Ticket {
        self.store_within(i, req, Duration::from_secs(3600))
    }

    /// Node `i` sends store request `req`, its caller waiting up to `limit`.
    pub fn store_within(
        &mut self,
        i: usize,
        req: pslite_proto::store::StoreMsg,
        limit: Duration,
    ) -> Ticket {
        self.call(i, Call::Store(req), Some(limit))
    }

    /// Node `i` watches store key `key`: its events are recorded in
    /// [`SimNode::store_events`] under the watcher returned second; ask the
    /// core for the WATCH answer with the ticket returned first.
    pub fn store_watch(&mut self, i: usize, key: &str) -> (Ticket, u64) {
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
        let node = &mut self.nodes[i];
        net::timed(&mut node.core_time, || node.core.finish(now));
        self.flush(i);
    }

    /// Elastic mode: worker `i` leaves the job (its round ends).
    pub fn leave(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        net::timed(&mut node.core_time, || node.core.leave(now));
        self.flush(i);
    }

    /// Node `i` stops as the Van stops it (its exit drain begins): its
    /// store watches end.
    pub fn store_leave(&mut self, i: usize) {
        self.call(i, Call::Drain, None);
    }

    /// Node `i`'s apps drain their queues and take any number again: what
    /// they refused is handed over.
    pub fn give_room(&mut self, i: usize) {
        let now = self.now;
        self.nodes[i].app_capacity = None;
        self.nodes[i].core.room(now);
        self.flush(i);
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

mod app;
mod disk;
mod net;

pub use app::SumApp;
pub use disk::DiskFaults;
// For the tests' `use super::*`.
#[cfg(test)]
use app::{i64s, u64s};
pub use net::Nodes;
use net::Queues;
#[cfg(test)]
use pslite_proto::Node;

#[cfg(test)]
mod backpressure_tests;
#[cfg(test)]
mod checkpoint_tests;
mod cut;
#[cfg(test)]
mod cut_tests;
#[cfg(test)]
mod deadline_tests;
#[cfg(test)]
mod elastic_tests;
#[cfg(test)]
mod identity_tests;
#[cfg(test)]
mod loss_tests;
#[cfg(test)]
mod partition_tests;
#[cfg(test)]
mod release_tests;
#[cfg(test)]
mod replica_tests;
#[cfg(test)]
mod servers_tests;
#[cfg(test)]
mod staleness_tests;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod worker_table_tests;
