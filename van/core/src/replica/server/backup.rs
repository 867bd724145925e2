//! A backup (or a joiner past its copy): the primary's entries delivered in
//! `seq` order (gaps wait), acknowledged once in the apps' queue.

use log::debug;
use pslite_proto::replica::{ReplicaMsg, ReplicaOp};
use pslite_proto::Message;

use super::*;

impl ReplicaServer {
    pub(super) fn on_entry(&mut self, msg: Message, holds: &mut Holds, fx: &mut Effects) {
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
                self.ack(r, fx);
            }
            return;
        }
        if state.buffered.len() < MAX_AHEAD {
            state.buffered.insert(rep.seq, entry);
        }
        self.apply_buffered(r, fx);
        self.sync_progress(r, holds, fx);
    }

    /// Applies the buffered entries that are next in order, then tells the
    /// primary how far this replica got.
    pub(super) fn apply_buffered(&mut self, r: u32, fx: &mut Effects) {
        let Some(before) = self.ranges.get(&r).map(|s| s.delivered) else {
            return;
        };
        self.deliver_buffered(r, fx);
        if self
            .ranges
            .get(&r)
            .is_some_and(|s| s.delivered > before && s.role != Role::Primary)
        {
            self.ack(r, fx);
        }
    }

    pub(super) fn deliver_buffered(&mut self, r: u32, fx: &mut Effects) {
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
                fx.send(answer);
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
            fx.push(Effect::ForApps(Output::Deliver(msg)));
        }
    }

    /// Tells the primary how far this replica got: every entry up to
    /// `delivered` is in its apps' queue, in order (each is applied before
    /// anything delivered later, a new primary's requests included).
    pub(super) fn ack(&mut self, r: u32, fx: &mut Effects) {
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
        self.send_control(rep, primary, Vec::new(), fx);
    }
}
