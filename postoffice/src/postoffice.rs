//! The Postoffice: one per node, owning the Van, the node groups, barriers
//! and the routes to this process's customers.
//!
//! Unlike C++ ps-lite's `Postoffice::Get()` it is a value, not a global:
//! several nodes can live in one process (tests do that). Clones share the
//! same node.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{debug, error, warn};
use pslite_proto::ids::{self, NodeId};
use pslite_proto::stats::NodeCounters;
use pslite_proto::{lock, Message, Node, Role};
use pslite_van::{Call, Counters, Van, VanError};

use crate::metrics::{self, MetricsServer};
use crate::queue::CustomerQueue;
use crate::router::{CustomerRouter, Inline, Ready};
use crate::{key_ranges, Config, Error, KeyRange};

/// The workers of the current elastic round (see the README, "Elastic
/// workers"). In plain mode (`DMLC_NUM_WORKER` a number) there is one round,
/// 0, with every worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    /// The round number: 0 for the first round, then 1, 2, ...
    pub round: u64,
    /// The round's workers in rank order: a worker's rank is its index.
    pub workers: Vec<NodeId>,
}

/// A membership-change callback.
pub(crate) type MembershipCallback = Arc<dyn Fn(&Membership) + Send + Sync>;

struct Inner {
    config: Config,
    router: Arc<CustomerRouter>,
    /// The thread that refuses requests held for apps that never came
    /// (`PS_APP_WAIT`), and its stop flag.
    app_clock: Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>>,
    van: Mutex<Option<Arc<Van>>>,
    counters: Arc<Counters>,
    metrics: Mutex<Option<MetricsServer>>,
}

/// A node of a ps-lite cluster. See the crate docs for the life cycle.
#[derive(Clone)]
pub struct Postoffice {
    inner: Arc<Inner>,
}

impl Postoffice {
    /// A node configured by `config`; nothing is started yet.
    pub fn new(config: Config) -> Postoffice {
        let router = Arc::new(
            CustomerRouter::new(config.van.role, config.queue_limit, config.van.hold_limit)
                .with_app_wait(config.app_wait),
        );
        Postoffice {
            inner: Arc::new(Inner {
                config,
                router,
                app_clock: Mutex::new(None),
                van: Mutex::new(None),
                counters: Arc::new(Counters::new(Instant::now())),
                metrics: Mutex::new(None),
            }),
        }
    }

    /// A node configured by the `DMLC_*` / `PS_*` environment variables.
    pub fn from_env() -> Result<Postoffice, Error> {
        Ok(Postoffice::new(Config::from_env()?))
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Starts the node (once per process) and joins the cluster as
    /// `customer_id`; with `do_barrier`, then waits until every node has
    /// started (a recovered node skips that barrier, as the others are past it).
    pub fn start(&self, customer_id: i32, do_barrier: bool) -> Result<(), Error> {
        let van = {
            let mut slot = lock(&self.inner.van);
            match &*slot {
                Some(van) => Arc::clone(van),
                None => {
                    if self.inner.config.malloc_tune {
                        let tunables = crate::settings::foreign("GLIBC_TUNABLES");
                        // Arenas capped on workers only (their answers are
                        // freed by the application's threads); servers keep
                        // glibc's arena per thread.
                        let arenas = self.inner.config.role() != Role::Worker
                            || crate::settings::foreign("MALLOC_ARENA_MAX").is_some();
                        pslite_van::heap::keep_large_buffers(
                            &tunables.unwrap_or_default().to_string_lossy(),
                            arenas,
                        );
                    }
                    let dispatch = Arc::clone(&self.inner.router) as Arc<dyn pslite_van::Dispatch>;
                    let van = Van::start_with_counters(
                        self.inner.config.van.clone(),
                        dispatch,
                        Arc::clone(&self.inner.counters),
                    )
                    .map_err(|e| self.explain_start_error(e))?;
                    let van = Arc::new(van);
                    *slot = Some(Arc::clone(&van));
                    van
                }
            }
        };
        if self.inner.config.role() == Role::Scheduler {
            crate::launched::mark_scheduler(van.my_node().port);
        }
        van.call(
            Call::Join {
                customer: customer_id,
            },
            None,
        )?;
        self.start_metrics(&van);
        self.start_app_clock(&van);
        // A recovered node, and an elastic worker admitted after the first
        // round, skip the start barrier: the others are past it.
        let late = self.is_worker() && van.joined_round().is_some_and(|r| r > 0);
        if do_barrier && !van.my_node().is_recovery && !late {
            self.barrier_with_timeout(
                customer_id,
                ids::ALL_GROUP,
                Some(self.inner.config.van.start_timeout),
            )?;
        }
        debug!("customer {customer_id} started");
        Ok(())
    }

    /// Starts, once, the thread that refuses requests held for apps this
    /// node never created (see [`CustomerRouter::expire_held`]).
    fn start_app_clock(&self, van: &Arc<Van>) {
        let mut slot = lock(&self.inner.app_clock);
        if slot.is_some() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let router = Arc::clone(&self.inner.router);
        let van = Arc::downgrade(van);
        let stopped = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name("pslite-app-wait".into())
            .spawn(move || app_clock(&router, &van, &stopped));
        match spawned {
            Ok(thread) => *slot = Some((stop, thread)),
            Err(e) => warn!(
                "cannot start the thread that refuses requests for apps this node lacks: {e}; \
                 such requests wait"
            ),
        }
    }

    /// Starts the metrics endpoint once, if `PS_METRICS_PORT` is set. A node
    /// runs on without it (with an error logged) if it cannot bind.
    fn start_metrics(&self, van: &Van) {
        let Some(port) = self.inner.config.metrics_port else {
            return;
        };
        let mut slot = lock(&self.inner.metrics);
        if slot.is_some() {
            return;
        }
        let c = &self.inner.config;
        let host = c.van.bind_host.clone().unwrap_or_else(|| match c.role() {
            Role::Scheduler => c.van.scheduler_host.clone(),
            _ => c.van.host.clone(),
        });
        let Some(ip) = pslite_van::resolve::bind_ip(&host) else {
            error!("PS_METRICS_PORT: cannot serve metrics: host {host:?} does not resolve");
            return;
        };
        let node = van.my_node();
        let counters = Arc::clone(&self.inner.counters);
        let shm = van.shm_stats();
        let render = Arc::new(move || {
            metrics::render(&node, &counters.snapshot(Instant::now()), shm.as_deref())
        });
        match MetricsServer::start(&ip, port, render) {
            Ok(server) => *slot = Some(server),
            Err(e) => error!("PS_METRICS_PORT: cannot serve metrics on {ip}:{port}: {e}"),
        }
    }

    /// This node's counters now: messages and bytes per peer, resends, drops
    /// by reason, requests in flight, handler time. Cheap enough to call often.
    pub fn counters(&self) -> NodeCounters {
        self.inner.counters.snapshot(Instant::now())
    }

    /// The live counters, for apps that count their requests and handlers.
    pub fn counters_handle(&self) -> &Arc<Counters> {
        &self.inner.counters
    }

    /// Where the metrics endpoint (`PS_METRICS_PORT`) listens, once started.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        lock(&self.inner.metrics).as_ref().map(MetricsServer::addr)
    }

    /// Leaves the cluster: with `do_barrier`, first waits until every node
    /// is finalizing. Customer 0 then stops the node.
    pub fn finalize(&self, customer_id: i32, do_barrier: bool) -> Result<(), Error> {
        if customer_id == 0 {
            if let Some(van) = lock(&self.inner.van).as_ref() {
                van.finalizing();
            }
        }
        let result = if do_barrier {
            self.barrier(customer_id, ids::ALL_GROUP)
        } else {
            Ok(())
        };
        if customer_id == 0 {
            if let Some(van) = lock(&self.inner.van).take() {
                if !do_barrier && self.is_elastic() {
                    // Leaving alone: end this worker's round now rather
                    // than at the heartbeat timeout.
                    if let Err(e) = van.leave() {
                        debug!("cannot tell the scheduler this worker leaves: {e}");
                    }
                }
                van.stop();
            }
            lock(&self.inner.metrics).take();
            if let Some((stop, thread)) = lock(&self.inner.app_clock).take() {
                stop.store(true, Ordering::SeqCst);
                self.inner.router.wake();
                let _ = thread.join();
            }
        }
        result
    }

    /// Waits until every member of `group` (a sum of [`ids::SCHEDULER_GROUP`],
    /// [`ids::SERVER_GROUP`], [`ids::WORKER_GROUP`]) has called `barrier` for
    /// it. Returns at once if this node is the group's only member, unless
    /// the cluster takes checkpoints: a checkpoint is taken at a barrier the
    /// scheduler sees, so with `PS_CHECKPOINT_DIR` a lone worker's barriers
    /// go to it too.
    pub fn barrier(&self, customer_id: i32, group: i32) -> Result<(), Error> {
        self.barrier_with_timeout(customer_id, group, None)
    }

    /// [`Postoffice::barrier`] with a deadline.
    pub fn barrier_with_timeout(
        &self,
        customer_id: i32,
        group: i32,
        timeout: Option<Duration>,
    ) -> Result<(), Error> {
        let van = self.van()?;
        let c = &self.inner.config.van;
        let role_ok = ids::is_role_group(group) && group & ids::role_group(c.role) != 0;
        let alone = ids::group_members(group, c.num_servers, c.num_workers).len() <= 1;
        // Elastic barriers are where waiting workers are admitted: always
        // asked of the scheduler.
        if role_ok && alone && c.elastic.is_none() && !van.checkpointing() {
            return Ok(());
        }
        let barrier = Call::Barrier {
            customer: customer_id,
            group,
        };
        van.call(barrier, timeout)?;
        Ok(())
    }

    /// Takes a checkpoint of the servers now (`PS_CHECKPOINT_DIR`), as a
    /// collective of the workers: each calls it at the same point of its
    /// work with no request in flight, exactly one with `ask` (it asks the
    /// scheduler for a checkpoint labelled `label`). They meet at a barrier
    /// over the workers, where the checkpoint is taken, and are released
    /// once it is complete or failed. Returns the asker's result (its id,
    /// directory and files; `None` to the others); a refused or failed
    /// checkpoint is [`pslite_van::Failure::Checkpoint`], to the asker
    /// only. Each step waits up to `timeout`.
    pub fn checkpoint(
        &self,
        customer_id: i32,
        label: &str,
        ask: bool,
        timeout: Duration,
    ) -> Result<Option<pslite_proto::checkpoint::CheckpointMsg>, Error> {
        let van = self.van()?;
        let label = label.to_string();
        let asked = ask.then(|| van.call(Call::Checkpoint { label }, Some(timeout)));
        // The barrier even after a refusal: the other workers wait there.
        self.barrier_with_timeout(customer_id, ids::WORKER_GROUP, Some(timeout))?;
        let Some(accepted) = asked else {
            return Ok(None);
        };
        let (request, _) = accepted?.checkpoint()?;
        let result = van.call(Call::CheckpointResult { request }, Some(timeout))?;
        Ok(Some(result.checkpoint()?.1))
    }

    /// Registers a customer (an app instance); data messages for it arrive
    /// on the returned queue, starting with any that came before.
    pub fn register_customer(&self, app_id: i32, customer_id: i32) -> Result<CustomerQueue, Error> {
        self.inner
            .router
            .register((app_id, customer_id))
            .ok_or(Error::DuplicateCustomer {
                app_id,
                customer_id,
            })
    }

    /// Like [`Postoffice::register_customer`], with a handler that sees each
    /// message first, on the receive thread, and may keep it (see [`Inline`]),
    /// taking what `ready` says; the rest waits in the Postoffice until
    /// [`Postoffice::customer_ready`] (see [`Ready`]).
    pub fn register_customer_inline(
        &self,
        app_id: i32,
        customer_id: i32,
        inline: Inline,
        ready: Ready,
    ) -> Result<CustomerQueue, Error> {
        self.inner
            .router
            .register_ready((app_id, customer_id), Some(inline), ready)
            .ok_or(Error::DuplicateCustomer {
                app_id,
                customer_id,
            })
    }

    /// Removes a customer registered with [`Postoffice::register_customer`].
    pub fn unregister_customer(&self, app_id: i32, customer_id: i32) {
        self.inner.router.unregister((app_id, customer_id));
    }

    /// How many data messages wait for customers that have not registered
    /// yet (they are delivered when the customer registers).
    pub fn held_messages(&self) -> usize {
        self.inner.router.held()
    }

    /// Customer (`app_id`, `customer_id`) now takes what `ready` says (its
    /// request handle is set): what waited for it is delivered, in order.
    pub fn customer_ready(&self, app_id: i32, customer_id: i32, ready: Ready) {
        self.inner.router.set_ready((app_id, customer_id), ready);
    }

    /// How many data messages wait for customer (`app_id`, `customer_id`):
    /// it has not registered, or does not take them yet.
    pub fn held_for(&self, app_id: i32, customer_id: i32) -> usize {
        self.inner.router.held_for((app_id, customer_id))
    }

    /// Sends a message; returns the bytes sent.
    pub fn send(&self, msg: Message) -> Result<usize, Error> {
        Ok(self.van()?.send(msg)?)
    }

    /// A handle on the job's key-value store, hosted by the scheduler
    /// (after `start`; see [`crate::store`]).
    pub fn store(&self) -> Result<crate::store::Store, Error> {
        Ok(crate::store::Store::new(self.van()?))
    }

    /// The Van (after `start`).
    pub fn van(&self) -> Result<Arc<Van>, Error> {
        lock(&self.inner.van).clone().ok_or(Error::NotStarted)
    }

    /// This node's role.
    pub fn role(&self) -> Role {
        self.inner.config.van.role
    }

    /// Whether this node is a worker.
    pub fn is_worker(&self) -> bool {
        self.role() == Role::Worker
    }

    /// Whether this node is a server.
    pub fn is_server(&self) -> bool {
        self.role() == Role::Server
    }

    /// Whether this node is the scheduler.
    pub fn is_scheduler(&self) -> bool {
        self.role() == Role::Scheduler
    }

    /// This node as the cluster knows it (id assigned once started).
    pub fn my_node(&self) -> Result<Node, Error> {
        Ok(self.van()?.my_node())
    }

    /// This node's id (1 for the scheduler, 8+2r servers, 9+2r workers).
    pub fn my_id(&self) -> Result<NodeId, Error> {
        Ok(self.my_node()?.id)
    }

    /// This node's rank among the nodes of its role; in elastic mode, a
    /// worker's rank in the current round (its index in
    /// [`Postoffice::membership`]).
    pub fn my_rank(&self) -> Result<i32, Error> {
        let id = self.my_id()?;
        if self.is_elastic() && self.is_worker() {
            let position = self.membership().workers.iter().position(|&w| w == id);
            return position.map(|p| p as i32).ok_or(Error::NotJoined);
        }
        Ok(ids::id_to_rank(id))
    }

    /// Whether node `id` is a pslite node (its table entry says so), which
    /// understands pslite-only fields such as a failed request's cause.
    pub fn is_pslite(&self, id: NodeId) -> bool {
        self.van()
            .is_ok_and(|v| v.nodes().iter().any(|n| n.id == id && n.pslite))
    }

    /// What node `id` can receive beyond ps-lite's messages (see
    /// [`pslite_van::Van::peer_features`]); 0 when unknown.
    pub fn peer_features(&self, id: NodeId) -> u32 {
        self.van().map_or(0, |v| v.peer_features(id))
    }

    /// Whether data to node `id` goes through shared memory (a pslite node
    /// of this host, `PS_SHM`), not over a network link.
    pub fn shares_memory_with(&self, id: NodeId) -> bool {
        self.van().is_ok_and(|v| v.shares_memory_with(id))
    }

    /// Whether this node replaced a dead one.
    pub fn is_recovery(&self) -> bool {
        self.van().is_ok_and(|v| v.my_node().is_recovery)
    }

    /// `DMLC_NUM_WORKER`; in elastic mode, the current round's worker
    /// count (0 before this node joined one).
    pub fn num_workers(&self) -> i32 {
        if self.is_elastic() {
            return self.membership().workers.len() as i32;
        }
        self.inner.config.van.num_workers
    }

    /// `DMLC_NUM_SERVER`.
    pub fn num_servers(&self) -> i32 {
        self.inner.config.van.num_servers
    }

    /// On a server of a job whose servers join and leave
    /// (`DMLC_NUM_SERVER=MIN:MAX`): leaves the running job. The scheduler
    /// first moves this server's key ranges, with their state, to the other
    /// servers (pushes go on meanwhile); once none is held here it lets the
    /// server go, and this returns `Ok` (a barrier this node waits on ends
    /// too). Then finalize without a barrier and exit. Fails if the
    /// scheduler refuses (fewer than MIN servers would stay) or does not
    /// let it go within `limit`; the server then goes on serving.
    pub fn leave_job(&self, limit: Duration) -> Result<(), Error> {
        self.van()?.call(Call::Leave, Some(limit))?;
        Ok(())
    }

    /// Whether this node runs in elastic mode (`DMLC_NUM_WORKER=MIN:MAX`).
    pub fn is_elastic(&self) -> bool {
        self.inner.config.van.elastic.is_some()
    }

    /// The current round and its workers in rank order. In plain mode:
    /// round 0 with every worker by rank. In elastic mode before this node
    /// joined a round: round 0 with no workers.
    pub fn membership(&self) -> Membership {
        if !self.is_elastic() {
            return Membership {
                round: 0,
                workers: self.node_ids(ids::WORKER_GROUP),
            };
        }
        match self.van().ok().and_then(|v| v.round()) {
            Some((round, workers)) => Membership { round, workers },
            None => Membership {
                round: 0,
                workers: Vec::new(),
            },
        }
    }

    /// Elastic mode: the round this node joined in, once joined. A worker
    /// that joined after round 0 was admitted at a barrier the others
    /// reached (its `start` skipped the start barrier): it must not call
    /// that barrier itself.
    pub fn joined_round(&self) -> Option<u64> {
        self.van().ok().and_then(|v| v.joined_round())
    }

    /// Calls `f` with the new membership each time a round begins or this
    /// node joins one (elastic mode only; never in plain mode), on the
    /// receive thread: keep it short, do not block in it. Register it
    /// before `start` to see the round this node joins.
    pub fn on_membership_change(&self, f: impl Fn(&Membership) + Send + Sync + 'static) {
        self.inner.router.on_membership(Arc::new(f));
    }

    /// The key range each server owns, by server rank.
    pub fn server_key_ranges(&self) -> Vec<KeyRange> {
        key_ranges(self.num_servers())
    }

    /// The node ids of `group` (a role union 1..=7 or a node id): one per
    /// process once started (customers of one process share its id).
    pub fn node_ids(&self, group: i32) -> Vec<NodeId> {
        let c = &self.inner.config.van;
        let ids = ids::group_members(group, c.num_servers, c.num_workers);
        let Ok(van) = self.van() else {
            return ids;
        };
        let table = van.nodes();
        if table.is_empty() {
            return ids;
        }
        let mut ids: Vec<NodeId> = table
            .iter()
            .map(|n| n.id)
            .filter(|&id| ids::group_contains(group, id))
            .collect();
        if self.is_worker() {
            // A worker's table holds no other worker (it talks to servers
            // and the scheduler only, as a C++ worker): the workers are the
            // round's in elastic mode, else one per rank.
            let workers = if self.is_elastic() {
                van.round().map(|(_, workers)| workers).unwrap_or_default()
            } else {
                ids::group_members(ids::WORKER_GROUP, 0, c.num_workers)
            };
            ids.extend(
                workers
                    .into_iter()
                    .filter(|&id| ids::group_contains(group, id)),
            );
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Nodes silent for longer than `timeout` (ps-lite's `GetDeadNodes`;
    /// zero means none): on the scheduler, servers and workers whose
    /// heartbeats stopped; elsewhere, the scheduler if it fell silent.
    pub fn dead_nodes(&self, timeout: Duration) -> Vec<NodeId> {
        if timeout.is_zero() {
            return Vec::new();
        }
        self.van()
            .map(|v| v.dead_nodes(timeout))
            .unwrap_or_default()
    }

    fn explain_start_error(&self, err: VanError) -> Error {
        let c = &self.inner.config.van;
        match err {
            VanError::Bind { endpoint, source } => {
                let (var, value) = if c.role == Role::Scheduler {
                    ("DMLC_PS_ROOT_PORT", c.scheduler_port.to_string())
                } else {
                    ("PORT", c.port.map(|p| p.to_string()).unwrap_or_default())
                };
                Error::Listen {
                    endpoint,
                    reason: source.to_string(),
                    var,
                    value,
                }
            }
            VanError::Resolve { host } => Error::BindHost { host },
            other => other.into(),
        }
    }
}

/// The clock of requests held for apps this node does not have: refuses
/// each once it has waited `PS_APP_WAIT` (or did not fit the hold), telling
/// pslite requesters why; until `stop`.
fn app_clock(router: &CustomerRouter, van: &std::sync::Weak<Van>, stop: &AtomicBool) {
    let mut seen = 0;
    // Ends with the node too when it is dropped without finalize.
    while !stop.load(Ordering::SeqCst) && van.strong_count() > 0 {
        let refusals = router.expire_held(Instant::now());
        if !refusals.is_empty() {
            let Some(van) = van.upgrade() else { return };
            for msg in refusals {
                let requester = msg.meta.recver;
                let refusal = msg.meta.refusal.as_deref().map(ToString::to_string);
                let refusal = refusal.unwrap_or_default();
                let pslite = van.nodes().iter().any(|n| n.id == requester && n.pslite);
                if !pslite {
                    warn!(
                        "dropping a request from node {requester}, which is not a pslite node \
                         and cannot be told why: {refusal}"
                    );
                    continue;
                }
                warn!("refusing a request from node {requester}: {refusal}");
                if let Err(e) = van.send(msg) {
                    warn!("cannot tell node {requester} that its request was refused: {e}");
                }
            }
        }
        let next = router
            .next_expiry()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
        seen = router.wait_for_held(seen, next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ranges_match_cxx() {
        let r = key_ranges(1);
        assert_eq!(
            r,
            vec![KeyRange {
                begin: 0,
                end: u64::MAX
            }]
        );
        assert!(r[0].contains(u64::MAX));
        let r = key_ranges(2);
        assert_eq!(r[1].begin, 9_223_372_036_854_775_807);
        assert_eq!(r[0].end, r[1].begin);
        let r = key_ranges(3);
        assert_eq!(r[1].begin, u64::MAX / 3);
        assert_eq!(r[2].begin, u64::MAX / 3 * 2);
        assert!(r[2].contains(u64::MAX) && !r[1].contains(r[2].begin));
    }
}
