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
//!
//! One state, its roles in files: `map.rs` (a new map, each range's role),
//! `primary.rs`, `backup.rs`, `sync.rs` (a new primary's) and `copies.rs`
//! (to joiners).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use log::{debug, warn};
use pslite_proto::ids::NodeId;
use pslite_proto::replica::{Applied, RangeMap, ReplicaMsg, ReplicaOp};
use pslite_proto::{Command, Message, K_EMPTY};

use crate::effects::{Effect, Effects, Output};
use crate::hold::{Holds, Reason};

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
    /// Snapshot requests to the apps: token -> (range, joiner).
    snapshots: BTreeMap<u64, (u32, NodeId)>,
    /// Restores asked of the apps: token -> range.
    restores: BTreeMap<u64, u32>,
    /// The timestamp of its next replication control message.
    next_ts: i32,
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
    /// Server `me`, with an empty map (it acts once a map arrives); its
    /// control messages get timestamps counted from `first_ts`.
    pub fn new(me: NodeId, first_ts: i32) -> ReplicaServer {
        ReplicaServer {
            me,
            map: RangeMap::default(),
            ranges: BTreeMap::new(),
            local: HashMap::new(),
            next_local: 0,
            next_token: 1,
            snapshots: BTreeMap::new(),
            restores: BTreeMap::new(),
            next_ts: first_ts,
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

    /// Each range's state, described (for logs and test failures), with
    /// the requests `holds` keeps for each.
    pub fn describe(&self, holds: &Holds) -> String {
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
                    holds.count(|x| x == Reason::Sync(*r)),
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

    fn send(&mut self, mut msg: Message, to: NodeId, fx: &mut Effects) {
        msg.meta.recver = to;
        if msg.is_control() {
            msg.meta.timestamp = self.next_ts;
            self.next_ts = self.next_ts.wrapping_add(1) & i32::MAX;
        }
        fx.send(msg);
    }

    fn control(op: ReplicaOp, range: u32, version: u64) -> (Message, ReplicaMsg) {
        let msg = Message::control(Command::Replica, K_EMPTY);
        let mut rep = ReplicaMsg::new(op, range);
        rep.version = version;
        (msg, rep)
    }

    fn send_control(&mut self, rep: ReplicaMsg, to: NodeId, data: Vec<Bytes>, fx: &mut Effects) {
        let (mut msg, _) = Self::control(rep.op, rep.range, rep.version);
        msg.meta.replica = Some(Box::new(rep));
        msg.data = data;
        self.send(msg, to, fx);
    }

    fn next_local_ts(&mut self) -> i32 {
        let ts = self.next_local;
        self.next_local = self.next_local.wrapping_add(1) & i32::MAX;
        ts
    }

    /// A message with a replication part, from a member (one of a map not
    /// received yet waits for it in `holds`).
    pub fn handle(&mut self, msg: Message, holds: &mut Holds, fx: &mut Effects) {
        let Some(rep) = msg.meta.replica.as_deref() else {
            return;
        };
        if rep.version > self.map.version {
            if holds.hold(Reason::Map(rep.version), msg).is_err() {
                warn!("dropping a replication message of a map not received yet: too many held");
            }
            return;
        }
        match rep.op {
            ReplicaOp::Request => self.on_request(msg, holds, fx),
            ReplicaOp::Entry => self.on_entry(msg, holds, fx),
            ReplicaOp::Applied => self.on_applied(&msg, fx),
            ReplicaOp::Sync => self.on_sync(&msg, fx),
            ReplicaOp::SyncReply => self.on_sync_reply(&msg, holds, fx),
            ReplicaOp::Snapshot => self.on_snapshot(msg, fx),
            op => debug!(
                "dropping a replication {op:?} from node {}: not for a server",
                msg.meta.sender
            ),
        }
    }
}

mod backup;
mod copies;
mod map;
mod primary;
mod sync;

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
