//! The primary: a worker's request delivered once, logged and sent to every
//! replica, its answer held until every replica applied it; the replicas'
//! acknowledgements, and the apps' answers paired with their requests.

use bytes::Bytes;
use log::{debug, info};
use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::replica::{ReplicaMsg, ReplicaOp};
use pslite_proto::{Command, Message};

use super::*;

impl ReplicaServer {
    pub(super) fn on_request(&mut self, msg: Message, holds: &mut Holds, fx: &mut Effects) {
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
            // Unbounded as the sync is: it ends once the replicas answer.
            let _ = holds.hold(Reason::Sync(r), msg);
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
                self.release(r, fx);
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
                self.send_entry((r, seq), &entry, (version, stable), s, answer, fx);
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
        fx.push(Effect::ForApps(Output::Deliver(deliver)));
    }

    pub(super) fn send_entry(
        &mut self,
        (r, seq): (u32, u64),
        entry: &Entry,
        (version, stable): (u64, u64),
        to: NodeId,
        answer: Option<(i32, u64)>,
        fx: &mut Effects,
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
        self.send(msg, to, fx);
    }

    pub(super) fn on_applied(&mut self, msg: &Message, fx: &mut Effects) {
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
        self.release(r, fx);
    }

    /// Sends the answers every gating replica has acknowledged, and reports
    /// joiners that caught up.
    pub(super) fn release(&mut self, r: u32, fx: &mut Effects) {
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
            self.send(msg, to, fx);
        }
        for (j, since) in ready_joiners {
            info!("range {r}: node {j} caught up; telling the scheduler");
            let mut rep = ReplicaMsg::new(ReplicaOp::Ready, r);
            rep.version = since;
            rep.node = j;
            self.send_control(rep, SCHEDULER, Vec::new(), fx);
        }
    }

    /// The apps answered a request delivered with local timestamp
    /// `msg.meta.timestamp`: the message to send now (an answer to a pull),
    /// or `None` (held for acknowledgements, or an entry's answer, which
    /// goes nowhere). Answers to deliveries not made here pass unchanged.
    pub fn on_answer(&mut self, mut msg: Message, fx: &mut Effects) -> Option<Message> {
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
                self.release(range, fx);
                None
            }
            Local::Entry { range, seq } => {
                let state = self.ranges.get_mut(&range)?;
                state.mark_answered(seq);
                if state.role == Role::Primary {
                    self.release(range, fx);
                }
                None
            }
        }
    }
}
