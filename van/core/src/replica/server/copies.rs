//! Copies of a range to a joiner: the primary's snapshot (taken by the apps
//! in their request order), sent with the log around it; the joiner's
//! restore before it applies what follows.

use bytes::Bytes;
use log::{debug, info};
use pslite_proto::ids::NodeId;
use pslite_proto::replica::{ReplicaMsg, ReplicaOp};
use pslite_proto::Message;

use super::*;

impl ReplicaServer {
    /// A serving primary starts copying the range to joiners it has not.
    pub(super) fn start_catch_ups(&mut self, r: u32, fx: &mut Effects) {
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
            self.copy_to(r, j, false, fx);
        }
    }

    /// Sends node `j` a snapshot of range `r` and the entries after it: a
    /// joiner, or a `backup` the log can no longer bring up to date.
    pub(super) fn copy_to(&mut self, r: u32, j: NodeId, backup: bool, fx: &mut Effects) {
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
        fx.push(Effect::ForApps(Output::Snapshot {
            token,
            range: r,
            begin,
            end,
            apps: self.apps.iter().copied().collect(),
        }));
    }

    /// The apps' copy for snapshot `token` (app `app`'s part).
    pub fn snapshot_taken(&mut self, token: u64, app: i32, data: Bytes, fx: &mut Effects) {
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
        self.send_control(rep, j, data, fx);
        for (seq, entry) in tail {
            self.send_entry((r, seq), &entry, (version, stable), j, None, fx);
        }
    }

    pub(super) fn on_snapshot(&mut self, msg: Message, fx: &mut Effects) {
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
            self.finish_restore(token, fx);
            return;
        }
        fx.push(Effect::ForApps(Output::Restore {
            token,
            range: r,
            begin,
            end,
            apps: rep.apps,
            data: msg.data,
        }));
    }

    /// App `app` restored its part of restore `token`.
    pub fn restored(&mut self, token: u64, app: i32, fx: &mut Effects) {
        let Some(left) = self.restores_left.get_mut(&token) else {
            return;
        };
        left.remove(&app);
        if left.is_empty() {
            self.restores_left.remove(&token);
            self.finish_restore(token, fx);
        }
    }

    pub(super) fn finish_restore(&mut self, token: u64, fx: &mut Effects) {
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
        self.ack(r, fx);
        self.apply_buffered(r, fx);
    }
}
