//! A server's side of replication: primary, backup or joiner of each range
//! it holds, between the network and its apps.
//!
//! Rules (a range at one map version):
//! - **Primary.** A pull is delivered to the apps and answered at once. A
//!   push (or push-pull) not applied before gets the range's next `seq`, is
//!   logged, sent as an ENTRY to every other replica and joiner, and
//!   delivered to the apps; its answer is held until the apps answered it
//!   and every replica (and caught-up joiner) acknowledged `seq` (APPLIED).
//!   With one backup and no joiner, a push's ENTRY asks the backup to
//!   answer the worker itself once it delivered it (`answer`): the primary
//!   then drops its held answer, unless that backup left the replicas.
//!   A request applied before (same worker, same request id) is not applied
//!   again: it is answered once every replica has its entry (a push-pull
//!   then reads the values as they are).
//! - **Backup.** Entries from the primary are delivered in `seq` order (gaps
//!   wait) and acknowledged once delivered: they are in the apps' queue, in
//!   order, so each is applied before anything delivered later (a pull or
//!   push this server takes as a new primary included); the apps' answers
//!   go nowhere else. A backup keeps the entries above `stable` (on every
//!   replica) for a new primary.
//! - **New primary** (promoted, or the primary moved): before serving it asks
//!   the other replicas (SYNC) what they applied; each sends the entries it
//!   has beyond the new primary's, then SYNC_REPLY. The new primary applies
//!   them (and the old primary's entries it held past a gap), sends every
//!   replica what it lacks, and serves. Entries only ever
//!   come from the primary of the receiver's map (or, during a sync, from
//!   its replicas), so two replicas never hold different entries at one
//!   `seq`.
//! - **Joiner.** Its primary takes a snapshot of the range from the apps at
//!   `seq` s0 (in request order), sends it with the applied table up to s0,
//!   the entries after `stable` up to s0 (for the joiner's log) and every
//!   entry after s0. The joiner restores the snapshot, applies the entries
//!   after s0 and acknowledges as far as its log is whole; once it has
//!   acknowledged s0 its acknowledgements gate answers, and once it has
//!   every entry answered without it, the primary reports it READY to the
//!   scheduler, which makes it a replica.
//! - Messages from a newer map version wait for that map; from an older one
//!   they are handled under the current one (requests) or dropped.
//!
//! The apps see requests with a local timestamp (several requests of one
//! worker request, for different ranges, may reach one server) and answer
//! them as usual; this state machine pairs the answer with the request.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use log::{debug, info, warn};
use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::replica::{Applied, RangeMap, ReplicaMsg, ReplicaOp};
use pslite_proto::{Command, Message, K_EMPTY};

use crate::effects::Output;

/// What the server side asks the core to do.
#[derive(Debug)]
pub enum ServerOut {
    /// Send this message (to `meta.recver`).
    Send(Message),
    /// Hand this request to the apps.
    Deliver(Message),
    /// Ask the apps for a copy of a range ([`Output::Snapshot`], answered
    /// with [`ReplicaServer::snapshot_taken`]) or to restore one
    /// ([`Output::Restore`], answered with [`ReplicaServer::restored`]).
    Apps(Output),
}

/// One logged request of a range.
#[derive(Clone, Debug)]
struct Entry {
    /// The request as the apps get it (push only).
    msg: Message,
    request_id: u64,
    origin: NodeId,
    done_below: u64,
    /// The backup answers the worker once it delivered this entry: the
    /// worker's timestamp and map version (on the primary's first
    /// forward only; never sent again from the log).
    answer: Option<(i32, u64)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Role {
    Primary,
    Backup,
    Joining,
}

/// The primary's view of a joiner catching up.
#[derive(Debug, Default)]
struct CatchUp {
    /// The map version it started at (READY carries it).
    since: u64,
    /// The seq of its snapshot.
    s0: u64,
    /// The snapshot request to the apps, until answered.
    token: Option<u64>,
    /// Its acknowledgements gate answers.
    gating: bool,
    /// The highest seq answered without it.
    ungated_upto: u64,
    ready_sent: bool,
    /// A replica the log could not bring up to date (no READY for it).
    backup: bool,
}

/// A copy being restored by the apps.
#[derive(Debug)]
struct Restoring {
    /// Pairs the apps' answers with it.
    token: u64,
    /// The seq of the copy.
    s0: u64,
    /// The copy's primary had every entry up to here on every replica; it
    /// sends the entries after it up to `s0` too, for a later new primary
    /// that lacks them (a sync asks the replicas for them).
    stable: u64,
    /// The applied table up to `s0`.
    applied: Vec<Applied>,
}

/// A new primary's sync with the other replicas.
#[derive(Debug, Default)]
struct Sync {
    waiting: BTreeSet<NodeId>,
    /// The highest seq a replica applied.
    max: u64,
    /// What each replica applied.
    replies: BTreeMap<NodeId, u64>,
}

/// The at-most-once table of one worker in one range.
#[derive(Debug, Default, Clone)]
struct Client {
    incarnation: u64,
    /// The worker said every request below this id is answered.
    done_below: u64,
    ids: BTreeMap<u64, u64>,
}

/// What this server knows of one range it holds.
#[derive(Debug)]
struct RangeState {
    role: Role,
    /// The map version of the role.
    version: u64,
    /// The primary when the role was set.
    primary: Option<NodeId>,
    /// The highest seq delivered to the apps (all below too).
    delivered: u64,
    /// The highest seq the apps answered (all below too), and those
    /// answered above it.
    answered: u64,
    answered_above: BTreeSet<u64>,
    log: BTreeMap<u64, Entry>,
    /// Entries that came before their turn.
    buffered: BTreeMap<u64, Entry>,
    applied: BTreeMap<NodeId, Client>,
    stable: u64,
    // Primary only.
    sync: Option<Sync>,
    acked: BTreeMap<NodeId, u64>,
    gating: BTreeSet<NodeId>,
    catch_up: BTreeMap<NodeId, CatchUp>,
    /// Answers waiting for acknowledgements, by seq.
    pending: BTreeMap<u64, Vec<Message>>,
    /// Seqs whose worker the (only) backup answers: the primary sends its
    /// held answer only if that backup left the replicas meanwhile.
    tail: BTreeMap<u64, NodeId>,
    /// Requests waiting for the sync to end.
    waiting: Vec<Message>,
    // Joiner only: the snapshot being restored.
    restoring: Option<Restoring>,
    restored: bool,
}

impl RangeState {
    fn new(role: Role, version: u64, primary: Option<NodeId>) -> RangeState {
        RangeState {
            role,
            version,
            primary,
            delivered: 0,
            answered: 0,
            answered_above: BTreeSet::new(),
            log: BTreeMap::new(),
            buffered: BTreeMap::new(),
            applied: BTreeMap::new(),
            stable: 0,
            sync: None,
            acked: BTreeMap::new(),
            gating: BTreeSet::new(),
            catch_up: BTreeMap::new(),
            pending: BTreeMap::new(),
            tail: BTreeMap::new(),
            waiting: Vec::new(),
            restoring: None,
            restored: false,
        }
    }

    fn is_answered(&self, seq: u64) -> bool {
        seq <= self.answered || self.answered_above.contains(&seq)
    }

    fn mark_answered(&mut self, seq: u64) {
        if seq <= self.answered {
            return;
        }
        self.answered_above.insert(seq);
        while self.answered_above.remove(&(self.answered + 1)) {
            self.answered += 1;
        }
    }

    /// The seq request `id` of `worker` was applied as, if it was.
    fn applied_as(&self, worker: NodeId, id: u64) -> Option<u64> {
        let c = self.applied.get(&worker)?;
        (c.incarnation == id >> 32)
            .then(|| c.ids.get(&id).copied())
            .flatten()
    }

    /// Records request `id` of `worker` as `seq`, forgetting the ids it
    /// says are answered.
    fn record(&mut self, worker: NodeId, id: u64, seq: u64, done_below: u64) {
        let c = self.applied.entry(worker).or_default();
        if c.incarnation != id >> 32 {
            // A new process took the worker's id: the old one's requests
            // will never come again.
            c.incarnation = id >> 32;
            c.done_below = 0;
            c.ids.clear();
        }
        c.ids.insert(id, seq);
        if done_below >> 32 == c.incarnation && done_below > c.done_below {
            c.done_below = done_below;
            c.ids = c.ids.split_off(&done_below);
        }
    }

    /// Whether request `id` of `worker` was answered already (its id is
    /// below what the worker said is done): a stale copy, never applied.
    fn answered_before(&self, worker: NodeId, id: u64) -> bool {
        self.applied
            .get(&worker)
            .is_some_and(|c| c.incarnation == id >> 32 && id < c.done_below)
    }

    /// The applied table up to `upto`, and each worker's `done_below` as an
    /// entry with seq 0 (real seqs start at 1).
    fn applied_table(&self, upto: u64) -> Vec<Applied> {
        let mut out = Vec::new();
        for (&worker, c) in &self.applied {
            if c.done_below > 0 {
                out.push(Applied {
                    worker,
                    request_id: c.done_below,
                    seq: 0,
                });
            }
            for (&request_id, &seq) in &c.ids {
                if seq <= upto {
                    out.push(Applied {
                        worker,
                        request_id,
                        seq,
                    });
                }
            }
        }
        out
    }

    /// How far this replica can answer for: `delivered`, or less while its
    /// log lacks an entry above `stable` (a restored copy's tail still on
    /// its way), which a later new primary's sync would ask it for.
    fn held_upto(&self) -> u64 {
        if self.stable >= self.delivered
            || self.log.range(self.stable + 1..=self.delivered).count() as u64
                == self.delivered - self.stable
        {
            return self.delivered;
        }
        let mut upto = self.stable;
        while upto < self.delivered && self.log.contains_key(&(upto + 1)) {
            upto += 1;
        }
        upto
    }

    fn trim(&mut self, stable: u64) {
        if stable > self.stable {
            self.stable = stable;
            self.log = self.log.split_off(&(stable + 1));
        }
    }
}

/// The replication part of `msg`, its range and the sender.
fn part(msg: &Message) -> Option<(&ReplicaMsg, u32, NodeId)> {
    let rep = msg.meta.replica.as_deref()?;
    Some((rep, rep.range, msg.meta.sender))
}

/// The entries of `log` after `from` up to `to` (none if `from >= to`).
fn log_between(log: &BTreeMap<u64, Entry>, from: u64, to: u64) -> Vec<(u64, Entry)> {
    if from >= to {
        return Vec::new();
    }
    log.range(from + 1..=to)
        .map(|(&s, e)| (s, e.clone()))
        .collect()
}

/// What a local delivery was, to pair the apps' answer with it.
#[derive(Debug)]
enum Local {
    /// A worker's request this node serves as primary (`seq` for pushes).
    Request {
        range: u32,
        seq: Option<u64>,
        worker: NodeId,
        ts: i32,
        request_id: u64,
        /// The map version the request was sent under (its answer echoes
        /// it: the worker's resender pairs them by it).
        version: u64,
    },
    /// A log entry applied here as a replica (or by a syncing primary).
    Entry { range: u32, seq: u64 },
}

/// A server's replication state.
pub struct ReplicaServer {
    me: NodeId,
    map: RangeMap,
    ranges: BTreeMap<u32, RangeState>,
    local: HashMap<i32, Local>,
    next_local: i32,
    next_token: u64,
    /// Messages of a newer map version than ours.
    ahead: Vec<Message>,
    /// Snapshot requests to the apps: token -> (range, joiner).
    snapshots: BTreeMap<u64, (u32, NodeId)>,
    /// Restores asked of the apps: token -> range.
    restores: BTreeMap<u64, u32>,
    out: Vec<ServerOut>,
    /// Apps that answer snapshot and restore requests.
    apps: BTreeSet<i32>,
    /// Snapshot parts received so far: token -> (app, bytes).
    parts: BTreeMap<u64, Vec<(i32, Bytes)>>,
    /// Restore answers still missing: token -> apps left.
    restores_left: BTreeMap<u64, BTreeSet<i32>>,
    /// What happened lately, for test failures.
    pub trace: Vec<String>,
}

/// The most messages of a newer map held back.
const MAX_AHEAD: usize = 100_000;

impl ReplicaServer {
    /// Server `me`, with an empty map (it acts once a map arrives).
    pub fn new(me: NodeId) -> ReplicaServer {
        ReplicaServer {
            me,
            map: RangeMap::default(),
            ranges: BTreeMap::new(),
            local: HashMap::new(),
            next_local: 0,
            next_token: 1,
            ahead: Vec::new(),
            snapshots: BTreeMap::new(),
            restores: BTreeMap::new(),
            out: Vec::new(),
            apps: BTreeSet::from([0]),
            parts: BTreeMap::new(),
            restores_left: BTreeMap::new(),
            trace: Vec::new(),
        }
    }

    /// The apps whose state is copied (each answers snapshot and restore
    /// requests); app 0 by default.
    pub fn set_apps(&mut self, apps: BTreeSet<i32>) {
        if !apps.is_empty() {
            self.apps = apps;
        }
    }

    /// The current map.
    pub fn map(&self) -> &RangeMap {
        &self.map
    }

    /// What to carry out, in order.
    pub fn take_output(&mut self) -> Vec<ServerOut> {
        std::mem::take(&mut self.out)
    }

    /// Each range's state, described (for logs and test failures).
    pub fn describe(&self) -> String {
        let mut ranges: Vec<_> = self.ranges.iter().collect();
        ranges.sort_by_key(|(r, _)| **r);
        ranges
            .into_iter()
            .map(|(r, s)| {
                format!(
                    "range {r}: {:?} v{} primary {:?} delivered {} answered {} pending {:?} \
                     gating {:?} acked {:?} sync {:?} waiting {} buffered {:?} catch-up {:?}",
                    s.role,
                    s.version,
                    s.primary,
                    s.delivered,
                    s.answered,
                    s.pending.keys().collect::<Vec<_>>(),
                    s.gating,
                    s.acked,
                    s.sync,
                    s.waiting.len(),
                    s.buffered.keys().collect::<Vec<_>>(),
                    s.catch_up
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Whether this node is the serving primary of range `r` (tests).
    pub fn serves(&self, r: u32) -> bool {
        self.ranges
            .get(&r)
            .is_some_and(|s| s.role == Role::Primary && s.sync.is_none())
    }

    fn send(&mut self, mut msg: Message, to: NodeId) {
        msg.meta.recver = to;
        self.out.push(ServerOut::Send(msg));
    }

    fn control(op: ReplicaOp, range: u32, version: u64) -> (Message, ReplicaMsg) {
        let msg = Message::control(Command::Replica, K_EMPTY);
        let mut rep = ReplicaMsg::new(op, range);
        rep.version = version;
        (msg, rep)
    }

    fn send_control(&mut self, rep: ReplicaMsg, to: NodeId, data: Vec<Bytes>) {
        let (mut msg, _) = Self::control(rep.op, rep.range, rep.version);
        msg.meta.replica = Some(Box::new(rep));
        msg.data = data;
        self.send(msg, to);
    }

    fn next_local_ts(&mut self) -> i32 {
        let ts = self.next_local;
        self.next_local = self.next_local.wrapping_add(1) & i32::MAX;
        ts
    }

    /// A new map from the scheduler.
    pub fn on_map(&mut self, map: RangeMap) {
        if map.version <= self.map.version {
            return;
        }
        if cfg!(test) {
            self.trace.push(format!("map {map:?}"));
        }
        self.map = map;
        let version = self.map.version;
        let me = self.me;
        for r in 0..self.map.ranges.len() as u32 {
            let Some(entry) = self.map.range(r).cloned() else {
                continue;
            };
            let primary = entry.primary();
            let role = if primary == Some(me) {
                Some(Role::Primary)
            } else if entry.replicas.contains(&me) {
                Some(Role::Backup)
            } else if entry.joining.contains(&me) {
                Some(Role::Joining)
            } else {
                None
            };
            let Some(role) = role else {
                if self.ranges.remove(&r).is_some() {
                    info!("range {r} moved away from this server (map {version})");
                }
                continue;
            };
            let state = self
                .ranges
                .entry(r)
                .or_insert_with(|| RangeState::new(Role::Joining, 0, None));
            let was = std::mem::replace(&mut state.role, Role::Joining);
            let primary_changed = state.primary != primary;
            state.version = version;
            state.primary = primary;
            match (was, role) {
                (Role::Primary, Role::Primary) => {
                    state.role = Role::Primary;
                    state.gating = entry
                        .replicas
                        .iter()
                        .copied()
                        .filter(|&s| s != me)
                        .collect();
                    // A copy to a joiner the map added again since (a new
                    // process with its id) starts over.
                    state.catch_up.retain(|j, c| {
                        entry.replicas.contains(j)
                            || (entry.joining.contains(j) && c.since >= entry.joined_at(*j))
                    });
                    // A joiner that became a replica gates as one now.
                    let joined: Vec<NodeId> = state
                        .catch_up
                        .keys()
                        .copied()
                        .filter(|j| entry.replicas.contains(j))
                        .collect();
                    for j in joined {
                        state.catch_up.remove(&j);
                    }
                    if let Some(sync) = &mut state.sync {
                        // A replica that left (died) sends nothing more:
                        // what only it had is not waited for (it was on no
                        // other replica, so never answered).
                        sync.waiting.retain(|s| entry.replicas.contains(s));
                        sync.replies.retain(|s, _| entry.replicas.contains(s));
                        sync.max = sync
                            .replies
                            .values()
                            .copied()
                            .fold(state.delivered, u64::max);
                    }
                    let catch_up = &state.catch_up;
                    state
                        .acked
                        .retain(|s, _| entry.replicas.contains(s) || catch_up.contains_key(s));
                }
                (_, Role::Primary) => {
                    // Promoted (or the primary moved here): sync first.
                    // Entries buffered past a gap came from the old primary
                    // and stay: the sync may fill the gap (the replicas
                    // that had them may have lost their copy of one).
                    state.role = Role::Primary;
                    state.pending.clear();
                    state.tail.clear();
                    state.catch_up.clear();
                    state.acked.clear();
                    state.gating = entry
                        .replicas
                        .iter()
                        .copied()
                        .filter(|&s| s != me)
                        .collect();
                    let others: BTreeSet<NodeId> = state.gating.clone();
                    info!(
                        "range {r}: this server is its primary now (map {version}); syncing with \
                         {others:?}"
                    );
                    state.sync = Some(Sync {
                        waiting: others.clone(),
                        max: state.delivered,
                        replies: BTreeMap::new(),
                    });
                    let from = state.delivered;
                    for s in others {
                        let mut rep = ReplicaMsg::new(ReplicaOp::Sync, r);
                        rep.version = version;
                        rep.seq = from;
                        self.send_control(rep, s, Vec::new());
                    }
                }
                (Role::Primary, Role::Backup) => {
                    // Demoted: the workers send what waits here again to the
                    // new primary, which applies it at most once.
                    state.role = Role::Backup;
                    state.pending.clear();
                    state.tail.clear();
                    state.waiting.clear();
                    state.catch_up.clear();
                    state.acked.clear();
                    state.gating.clear();
                    state.sync = None;
                }
                (Role::Backup, Role::Backup) | (Role::Joining, Role::Backup) => {
                    state.role = Role::Backup;
                    if primary_changed {
                        // Entries past a gap came from the old primary; the new
                        // one's sync sends what is missing.
                        state.buffered.clear();
                    }
                }
                (Role::Joining, Role::Joining) => {
                    if primary_changed {
                        // Start over with the new primary's snapshot: what
                        // the old one's copy brought counts for nothing (its
                        // seqs may run ahead of the new primary's snapshot).
                        *state = RangeState::new(Role::Joining, version, primary);
                    }
                }
                (_, Role::Joining) => {
                    *state = RangeState::new(Role::Joining, version, primary);
                }
            }
            self.sync_progress(r);
            self.start_catch_ups(r);
            self.release(r);
        }
        // Our deliveries of ranges we no longer hold answer nobody.
        let ranges = &self.ranges;
        self.local.retain(|_, l| match l {
            Local::Request { range, .. } | Local::Entry { range, .. } => ranges.contains_key(range),
        });
        let ahead = std::mem::take(&mut self.ahead);
        for msg in ahead {
            self.handle(msg);
        }
    }

    /// A message with a replication part, from a member.
    pub fn handle(&mut self, msg: Message) {
        let Some(rep) = msg.meta.replica.as_deref() else {
            return;
        };
        if rep.version > self.map.version {
            if self.ahead.len() < MAX_AHEAD {
                self.ahead.push(msg);
            } else {
                warn!("dropping a replication message of a map not received yet: too many held");
            }
            return;
        }
        match rep.op {
            ReplicaOp::Request => self.on_request(msg),
            ReplicaOp::Entry => self.on_entry(msg),
            ReplicaOp::Applied => self.on_applied(&msg),
            ReplicaOp::Sync => self.on_sync(&msg),
            ReplicaOp::SyncReply => self.on_sync_reply(&msg),
            ReplicaOp::Snapshot => self.on_snapshot(msg),
            op => debug!(
                "dropping a replication {op:?} from node {}: not for a server",
                msg.meta.sender
            ),
        }
    }

    fn on_request(&mut self, msg: Message) {
        let Some(rep) = msg.meta.replica.as_deref().cloned() else {
            return;
        };
        let r = rep.range;
        let worker = msg.meta.sender;
        let Some(state) = self.ranges.get_mut(&r) else {
            debug!("dropping a request for range {r} from node {worker}: not held here");
            return;
        };
        if state.role != Role::Primary {
            debug!("dropping a request for range {r} from node {worker}: not its primary");
            return;
        }
        if state.sync.is_some() {
            state.waiting.push(msg);
            return;
        }
        if msg.meta.push && state.answered_before(worker, rep.request_id) {
            debug!(
                "dropping request {} of node {worker} for range {r}: answered before (a stale \
                 copy)",
                rep.request_id
            );
            return;
        }
        let ts = msg.meta.timestamp;
        let mut deliver = msg;
        let local = self.next_local;
        let seq = if !deliver.meta.push {
            None
        } else if let Some(seq) = state.applied_as(worker, rep.request_id) {
            // Sent again after a failover or a lost answer: applied
            // already. Answer once every replica has it.
            if !deliver.meta.pull {
                let answer = push_answer(&deliver.meta, worker, r, ts, rep.request_id, rep.version);
                // The primary answers this one (and the first, again).
                state.tail.remove(&seq);
                state.pending.entry(seq).or_default().push(answer);
                self.release(r);
                return;
            }
            // A push-pull: read the values as they are.
            deliver.meta.push = false;
            deliver.data.truncate(1);
            deliver.data.push(Bytes::new());
            deliver.meta.data_type.truncate(2);
            Some(seq)
        } else {
            let seq = state.delivered + 1;
            state.delivered = seq;
            state.record(worker, rep.request_id, seq, rep.done_below);
            let mut entry_msg = deliver.clone();
            entry_msg.meta.pull = false;
            entry_msg.meta.replica = None;
            let entry = Entry {
                msg: entry_msg,
                request_id: rep.request_id,
                origin: worker,
                done_below: rep.done_below,
                answer: None,
            };
            state.log.insert(seq, entry.clone());
            // One backup and no joiner: the backup answers the worker once
            // it has the entry (three hops instead of four; a push-pull's
            // answer carries values, which the primary's apps give).
            let tail = state.gating.first().copied().filter(|_| {
                state.gating.len() == 1 && state.catch_up.is_empty() && !deliver.meta.pull
            });
            if let Some(b) = tail {
                state.tail.insert(seq, b);
            }
            let to: Vec<NodeId> = state
                .gating
                .iter()
                .chain(state.catch_up.keys())
                .copied()
                .collect();
            let (stable, version) = (state.stable, state.version);
            for s in to {
                let answer = (Some(s) == tail).then_some((ts, rep.version));
                self.send_entry(r, seq, &entry, (version, stable), s, answer);
            }
            Some(seq)
        };
        self.local.insert(
            local,
            Local::Request {
                range: r,
                seq,
                worker,
                ts,
                request_id: rep.request_id,
                version: rep.version,
            },
        );
        self.next_local_ts();
        deliver.meta.timestamp = local;
        deliver.meta.replica = None;
        if cfg!(test) {
            self.trace.push(format!(
                "local {local}: request r{r} id {} from {worker} ts {ts} {:?}",
                rep.request_id,
                self.local.get(&local)
            ));
        }
        self.out.push(ServerOut::Deliver(deliver));
    }

    fn send_entry(
        &mut self,
        r: u32,
        seq: u64,
        entry: &Entry,
        (version, stable): (u64, u64),
        to: NodeId,
        answer: Option<(i32, u64)>,
    ) {
        let mut msg = Message::control(Command::Replica, to);
        msg.meta.app_id = entry.msg.meta.app_id;
        msg.meta.customer_id = entry.msg.meta.customer_id;
        msg.meta.head = entry.msg.meta.head;
        msg.meta.push = true;
        msg.meta.priority = entry.msg.meta.priority;
        msg.meta.data_type = entry.msg.meta.data_type.clone();
        msg.data = entry.msg.data.clone();
        let mut rep = ReplicaMsg::new(ReplicaOp::Entry, r);
        rep.version = version;
        rep.seq = seq;
        rep.request_id = entry.request_id;
        rep.origin = entry.origin;
        rep.done_below = entry.done_below;
        rep.stable = stable;
        rep.answer = answer;
        msg.meta.replica = Some(Box::new(rep));
        self.send(msg, to);
    }

    fn on_entry(&mut self, msg: Message) {
        let Some(rep) = msg.meta.replica.as_deref().cloned() else {
            return;
        };
        let r = rep.range;
        let sender = msg.meta.sender;
        let Some(state) = self.ranges.get_mut(&r) else {
            debug!("dropping an entry of range {r} from node {sender}: not held here");
            return;
        };
        let from_primary = state.role != Role::Primary && state.primary == Some(sender);
        let syncing = state.role == Role::Primary
            && state
                .sync
                .as_ref()
                .is_some_and(|s| s.replies.contains_key(&sender) || s.waiting.contains(&sender));
        if !from_primary && !syncing {
            debug!(
                "dropping an entry of range {r} from node {sender}: not its primary in map {}",
                self.map.version
            );
            return;
        }
        state.trim(rep.stable.min(state.answered));
        let mut entry_msg = msg;
        entry_msg.meta.control = pslite_proto::Control::default();
        entry_msg.meta.request = true;
        entry_msg.meta.pull = false;
        entry_msg.meta.replica = None;
        entry_msg.meta.sender = rep.origin;
        let entry = Entry {
            msg: entry_msg,
            request_id: rep.request_id,
            origin: rep.origin,
            done_below: rep.done_below,
            answer: rep
                .answer
                .filter(|_| from_primary && state.role == Role::Backup),
        };
        if rep.seq <= state.delivered {
            // Seen before (or one of a copy's tail, applied by the copy:
            // kept for a later new primary's sync); say again how far this
            // replica is.
            if rep.seq > state.stable {
                state.log.entry(rep.seq).or_insert(entry);
            }
            if state.role != Role::Primary {
                self.ack(r);
            }
            return;
        }
        if state.buffered.len() < MAX_AHEAD {
            state.buffered.insert(rep.seq, entry);
        }
        self.apply_buffered(r);
        self.sync_progress(r);
    }

    /// Applies the buffered entries that are next in order, then tells the
    /// primary how far this replica got.
    fn apply_buffered(&mut self, r: u32) {
        let Some(before) = self.ranges.get(&r).map(|s| s.delivered) else {
            return;
        };
        self.deliver_buffered(r);
        if self
            .ranges
            .get(&r)
            .is_some_and(|s| s.delivered > before && s.role != Role::Primary)
        {
            self.ack(r);
        }
    }

    fn deliver_buffered(&mut self, r: u32) {
        loop {
            let Some(state) = self.ranges.get_mut(&r) else {
                return;
            };
            if (state.role == Role::Joining && !state.restored) || state.restoring.is_some() {
                return;
            }
            let next = state.delivered + 1;
            let Some(entry) = state.buffered.remove(&next) else {
                return;
            };
            state.buffered = state.buffered.split_off(&next);
            state.delivered = next;
            let twice = state.applied_as(entry.origin, entry.request_id).is_some();
            state.record(entry.origin, entry.request_id, next, entry.done_below);
            if let Some((ts, version)) = entry.answer.filter(|_| state.role == Role::Backup) {
                // In the apps' queue here and at the primary, in order: the
                // push is on both replicas.
                let answer = push_answer(
                    &entry.msg.meta,
                    entry.origin,
                    r,
                    ts,
                    entry.request_id,
                    version,
                );
                self.out.push(ServerOut::Send(answer));
                if cfg!(test) {
                    self.trace
                        .push(format!("answer r{r} seq {next} to {}", entry.origin));
                }
            }
            let mut entry = entry;
            entry.answer = None;
            state.log.insert(next, entry.clone());
            if twice {
                // Applied before under another seq: keep the order, skip
                // the effect.
                state.mark_answered(next);
                continue;
            }
            let local = self.next_local_ts();
            self.local.insert(
                local,
                Local::Entry {
                    range: r,
                    seq: next,
                },
            );
            let mut msg = entry.msg;
            msg.meta.timestamp = local;
            if cfg!(test) {
                self.trace.push(format!(
                    "local {local}: entry r{r} seq {next} id {} from {}",
                    entry.request_id, entry.origin
                ));
            }
            self.out.push(ServerOut::Deliver(msg));
        }
    }

    /// Tells the primary how far this replica got: every entry up to
    /// `delivered` is in its apps' queue, in order (each is applied before
    /// anything delivered later, a new primary's requests included).
    fn ack(&mut self, r: u32) {
        let Some(state) = self.ranges.get(&r) else {
            return;
        };
        let Some(primary) = state.primary.filter(|&p| p != self.me) else {
            return;
        };
        let mut rep = ReplicaMsg::new(ReplicaOp::Applied, r);
        rep.version = self.map.version;
        rep.seq = state.held_upto();
        if cfg!(test) {
            self.trace.push(format!(
                "ack r{r} seq {} to {primary} v{}",
                rep.seq, rep.version
            ));
        }
        self.send_control(rep, primary, Vec::new());
    }

    fn on_applied(&mut self, msg: &Message) {
        let Some((rep, r, sender)) = part(msg) else {
            return;
        };
        if cfg!(test) {
            self.trace.push(format!(
                "applied r{r} seq {} from {sender} v{}",
                rep.seq, rep.version
            ));
        }
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        if state.role != Role::Primary {
            return;
        }
        if state
            .catch_up
            .get(&sender)
            .is_some_and(|c| rep.version < c.since)
        {
            debug!("range {r}: ignoring an APPLIED of node {sender} from before its copy began");
            return;
        }
        let acked = state.acked.entry(sender).or_insert(0);
        *acked = (*acked).max(rep.seq);
        let acked = *acked;
        if let Some(c) = state.catch_up.get_mut(&sender) {
            if !c.gating && c.token.is_none() && acked >= c.s0 {
                c.gating = true;
            }
        }
        self.release(r);
    }

    /// Sends the answers every gating replica has acknowledged, and reports
    /// joiners that caught up.
    fn release(&mut self, r: u32) {
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        if state.role != Role::Primary || state.sync.is_some() {
            return;
        }
        let gating: Vec<NodeId> = state
            .gating
            .iter()
            .copied()
            .chain(
                state
                    .catch_up
                    .iter()
                    .filter(|(_, c)| c.gating)
                    .map(|(&j, _)| j),
            )
            .collect();
        let floor = gating
            .iter()
            .map(|g| state.acked.get(g).copied().unwrap_or(0))
            .min()
            .unwrap_or(u64::MAX);
        let ready: Vec<u64> = state
            .pending
            .range(..=floor)
            .map(|(&s, _)| s)
            .filter(|&s| state.is_answered(s))
            .collect();
        let mut sends = Vec::new();
        for s in ready {
            if let Some(answers) = state.pending.remove(&s) {
                for c in state.catch_up.values_mut().filter(|c| !c.gating) {
                    c.ungated_upto = c.ungated_upto.max(s);
                }
                // Its backup answered the worker (it acknowledged the
                // entry), unless it left the replicas meanwhile.
                let by_tail = state
                    .tail
                    .remove(&s)
                    .is_some_and(|b| state.gating.contains(&b));
                if !by_tail {
                    sends.extend(answers);
                }
            }
        }
        let stable = floor.min(state.answered);
        state.trim(stable);
        let mut ready_joiners = Vec::new();
        for (&j, c) in state.catch_up.iter_mut() {
            let acked = state.acked.get(&j).copied().unwrap_or(0);
            if !c.backup && c.gating && !c.ready_sent && acked >= c.ungated_upto.max(c.s0) {
                c.ready_sent = true;
                ready_joiners.push((j, c.since));
            }
        }
        for msg in sends {
            let to = msg.meta.recver;
            self.send(msg, to);
        }
        for (j, since) in ready_joiners {
            info!("range {r}: node {j} caught up; telling the scheduler");
            let mut rep = ReplicaMsg::new(ReplicaOp::Ready, r);
            rep.version = since;
            rep.node = j;
            self.send_control(rep, SCHEDULER, Vec::new());
        }
    }

    fn on_sync(&mut self, msg: &Message) {
        let Some((rep, r, sender)) = part(msg) else {
            return;
        };
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        if state.primary != Some(sender) || state.role == Role::Primary {
            debug!("dropping SYNC of range {r} from node {sender}: not its primary here");
            return;
        }
        if cfg!(test) {
            self.trace.push(format!(
                "sync r{r} from {sender} at {}: I have {}",
                rep.seq, state.delivered
            ));
        }
        let entries = log_between(&state.log, rep.seq, state.delivered);
        if entries.len() as u64 != state.delivered.saturating_sub(rep.seq) {
            warn!(
                "range {r}: the log lacks entries {}..={} a new primary asked for",
                rep.seq + 1,
                state.delivered
            );
        }
        let (delivered, version, stable) = (state.delivered, self.map.version, state.stable);
        for (seq, entry) in entries {
            self.send_entry(r, seq, &entry, (version, stable), sender, None);
        }
        let mut reply = ReplicaMsg::new(ReplicaOp::SyncReply, r);
        reply.version = version;
        reply.seq = delivered;
        reply.stable = delivered;
        self.send_control(reply, sender, Vec::new());
    }

    fn on_sync_reply(&mut self, msg: &Message) {
        let Some((rep, r, sender)) = part(msg) else {
            return;
        };
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        let Some(sync) = state.sync.as_mut() else {
            return;
        };
        if !sync.waiting.remove(&sender) {
            return;
        }
        sync.max = sync.max.max(rep.seq);
        sync.replies.insert(sender, rep.seq);
        let acked = state.acked.entry(sender).or_insert(0);
        *acked = (*acked).max(rep.stable);
        self.sync_progress(r);
    }

    /// Ends a sync once every replica replied and their entries are applied.
    fn sync_progress(&mut self, r: u32) {
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        let Some(sync) = &state.sync else {
            return;
        };
        if !sync.waiting.is_empty() || state.delivered < sync.max {
            return;
        }
        let Some(sync) = state.sync.take() else {
            return;
        };
        // Entries of the old primary past a gap no replica filled were on
        // no other replica: never answered, and this primary numbers anew.
        state.buffered.clear();
        let mut sends = Vec::new();
        let mut copies = Vec::new();
        for (&s, &had) in &sync.replies {
            if !state.gating.contains(&s) {
                continue;
            }
            let missing = log_between(&state.log, had, state.delivered);
            if missing.len() as u64 == state.delivered.saturating_sub(had) {
                sends.extend(missing.into_iter().map(|(seq, e)| (seq, e, s)));
            } else {
                // Behind what this primary's log holds (it restored a copy
                // since): a copy brings it up to date.
                copies.push(s);
            }
        }
        let (version, stable) = (state.version, state.stable);
        info!(
            "range {r}: synced at seq {}; serving (map {version})",
            state.delivered
        );
        let waiting = std::mem::take(&mut state.waiting);
        for (seq, entry, to) in sends {
            self.send_entry(r, seq, &entry, (version, stable), to, None);
        }
        for s in copies {
            self.copy_to(r, s, true);
        }
        for msg in waiting {
            self.on_request(msg);
        }
        self.start_catch_ups(r);
        self.release(r);
    }

    /// A serving primary starts copying the range to joiners it has not.
    fn start_catch_ups(&mut self, r: u32) {
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        if state.role != Role::Primary || state.sync.is_some() {
            return;
        }
        let Some(entry) = self.map.range(r) else {
            return;
        };
        let new: Vec<NodeId> = entry
            .joining
            .iter()
            .copied()
            .filter(|j| !state.catch_up.contains_key(j))
            .collect();
        for j in new {
            self.copy_to(r, j, false);
        }
    }

    /// Sends node `j` a snapshot of range `r` and the entries after it: a
    /// joiner, or a `backup` the log can no longer bring up to date.
    fn copy_to(&mut self, r: u32, j: NodeId, backup: bool) {
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        let Some(entry) = self.map.range(r) else {
            return;
        };
        let (begin, end) = (entry.begin, entry.end);
        let token = self.next_token;
        self.next_token += 1;
        state.catch_up.insert(
            j,
            CatchUp {
                since: self.map.version,
                s0: state.delivered,
                token: Some(token),
                backup,
                ..CatchUp::default()
            },
        );
        state.acked.insert(j, 0);
        self.snapshots.insert(token, (r, j));
        info!(
            "range {r}: copying it to node {j} (snapshot at seq {})",
            state.delivered
        );
        self.out.push(ServerOut::Apps(Output::Snapshot {
            token,
            range: r,
            begin,
            end,
            apps: self.apps.iter().copied().collect(),
        }));
    }

    /// The apps' copy for snapshot `token` (app `app`'s part).
    pub fn snapshot_taken(&mut self, token: u64, app: i32, data: Bytes) {
        let parts = self.parts.entry(token).or_default();
        parts.push((app, data));
        if parts.len() < self.apps.len() {
            return;
        }
        let parts = self.parts.remove(&token).unwrap_or_default();
        let Some((r, j)) = self.snapshots.remove(&token) else {
            return;
        };
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        let Some(c) = state.catch_up.get_mut(&j) else {
            return;
        };
        if c.token != Some(token) {
            return;
        }
        c.token = None;
        let s0 = c.s0;
        let since = c.since;
        let mut rep = ReplicaMsg::new(ReplicaOp::Snapshot, r);
        // The map version the copy started at: a joiner refuses a copy
        // meant for an earlier process with its id (the resender may hand
        // it one).
        rep.version = since;
        rep.seq = s0;
        // The entries not yet on every replica follow the copy: the joiner
        // keeps them in its log (a new primary that lacks one gets it in
        // its sync from whichever replica has it).
        let stable = state.stable.min(s0);
        rep.stable = stable;
        rep.applied = state.applied_table(s0);
        rep.apps = parts.iter().map(|(a, _)| *a).collect();
        let data = parts.into_iter().map(|(_, d)| d).collect();
        let tail = log_between(&state.log, stable, s0);
        let version = state.version;
        self.send_control(rep, j, data);
        for (seq, entry) in tail {
            self.send_entry(r, seq, &entry, (version, stable), j, None);
        }
    }

    fn on_snapshot(&mut self, msg: Message) {
        let Some(rep) = msg.meta.replica.as_deref().cloned() else {
            return;
        };
        let r = rep.range;
        let sender = msg.meta.sender;
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        let Some(range) = self.map.range(r) else {
            return;
        };
        let joiner = state.role == Role::Joining
            && !state.restored
            && rep.version >= range.joined_at(self.me);
        let lagging = state.role == Role::Backup && rep.seq > state.delivered;
        if state.primary != Some(sender) || !(joiner || lagging) || state.restoring.is_some() {
            debug!("dropping a snapshot of range {r} from node {sender}: not expected");
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        state.restoring = Some(Restoring {
            token,
            s0: rep.seq,
            stable: rep.stable.min(rep.seq),
            applied: rep.applied.clone(),
        });
        self.restores.insert(token, r);
        self.restores_left
            .insert(token, rep.apps.iter().copied().collect());
        info!(
            "range {r}: restoring a copy from node {sender} at seq {}",
            rep.seq
        );
        let (begin, end) = (range.begin, range.end);
        if rep.apps.is_empty() {
            self.restores_left.remove(&token);
            self.finish_restore(token);
            return;
        }
        self.out.push(ServerOut::Apps(Output::Restore {
            token,
            range: r,
            begin,
            end,
            apps: rep.apps,
            data: msg.data,
        }));
    }

    /// App `app` restored its part of restore `token`.
    pub fn restored(&mut self, token: u64, app: i32) {
        let Some(left) = self.restores_left.get_mut(&token) else {
            return;
        };
        left.remove(&app);
        if left.is_empty() {
            self.restores_left.remove(&token);
            self.finish_restore(token);
        }
    }

    fn finish_restore(&mut self, token: u64) {
        let Some(r) = self.restores.remove(&token) else {
            return;
        };
        let Some(state) = self.ranges.get_mut(&r) else {
            return;
        };
        if state.restoring.as_ref().is_none_or(|x| x.token != token) {
            return;
        }
        let Some(Restoring {
            s0,
            stable,
            applied,
            ..
        }) = state.restoring.take()
        else {
            return;
        };
        state.restored = true;
        state.delivered = s0;
        state.answered = s0;
        state.answered_above.clear();
        state.stable = stable;
        // The entries up to the copy are in it; those after `stable` stay
        // in the log (for a later new primary's sync).
        let after = state.buffered.split_off(&(s0 + 1));
        let tail = std::mem::replace(&mut state.buffered, after);
        state.log = tail.into_iter().filter(|(s, _)| *s > stable).collect();
        state.applied.clear();
        for a in applied {
            let c = state.applied.entry(a.worker).or_default();
            c.incarnation = a.request_id >> 32;
            if a.seq == 0 {
                c.done_below = a.request_id;
            } else {
                c.ids.insert(a.request_id, a.seq);
            }
        }
        self.ack(r);
        self.apply_buffered(r);
    }

    /// The apps answered a request delivered with local timestamp
    /// `msg.meta.timestamp`: the message to send now (an answer to a pull),
    /// or `None` (held for acknowledgements, or an entry's answer, which
    /// goes nowhere). Answers to deliveries not made here pass unchanged.
    pub fn on_answer(&mut self, mut msg: Message) -> Option<Message> {
        if msg.meta.request || !msg.meta.control.is_empty() || msg.meta.simple_app {
            return Some(msg);
        }
        let Some(local) = self.local.remove(&msg.meta.timestamp) else {
            return Some(msg);
        };
        match local {
            Local::Request {
                range,
                seq,
                worker,
                ts,
                request_id,
                version,
            } => {
                msg.meta.timestamp = ts;
                msg.meta.recver = worker;
                let mut rep = ReplicaMsg::new(ReplicaOp::Response, range);
                rep.request_id = request_id;
                rep.version = version;
                msg.meta.replica = Some(Box::new(rep));
                let Some(seq) = seq else {
                    return Some(msg);
                };
                let state = self.ranges.get_mut(&range)?;
                if state.role != Role::Primary {
                    return None;
                }
                state.mark_answered(seq);
                state.pending.entry(seq).or_default().push(msg);
                self.release(range);
                None
            }
            Local::Entry { range, seq } => {
                let state = self.ranges.get_mut(&range)?;
                state.mark_answered(seq);
                if state.role == Role::Primary {
                    self.release(range);
                }
                None
            }
        }
    }
}

/// The answer to a push from `worker` (its request `request_id`, timestamp
/// `ts`, sent under map `version`) for range `r`: a push answer carries no
/// values (what a primary sends for a push applied before, and a backup
/// for a push it has).
fn push_answer(
    request: &pslite_proto::Meta,
    worker: NodeId,
    r: u32,
    ts: i32,
    request_id: u64,
    version: u64,
) -> Message {
    let mut answer = Message::default();
    answer.meta.app_id = request.app_id;
    answer.meta.customer_id = request.customer_id;
    answer.meta.push = true;
    answer.meta.head = request.head;
    answer.meta.timestamp = ts;
    answer.meta.recver = worker;
    let mut out = ReplicaMsg::new(ReplicaOp::Response, r);
    out.request_id = request_id;
    out.version = version;
    answer.meta.replica = Some(Box::new(out));
    answer
}
