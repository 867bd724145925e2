//! A new primary's sync: it asks the other replicas what they applied,
//! applies what they have beyond it, sends each what it lacks, then serves
//! (the requests that waited meanwhile first).

use log::{debug, info, warn};
use pslite_proto::replica::{ReplicaMsg, ReplicaOp};
use pslite_proto::Message;

use super::*;

impl ReplicaServer {
    pub(super) fn on_sync(&mut self, msg: &Message, fx: &mut Effects) {
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
            self.send_entry((r, seq), &entry, (version, stable), sender, None, fx);
        }
        let mut reply = ReplicaMsg::new(ReplicaOp::SyncReply, r);
        reply.version = version;
        reply.seq = delivered;
        reply.stable = delivered;
        self.send_control(reply, sender, Vec::new(), fx);
    }

    pub(super) fn on_sync_reply(&mut self, msg: &Message, holds: &mut Holds, fx: &mut Effects) {
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
        self.sync_progress(r, holds, fx);
    }

    /// Ends a sync once every replica replied and their entries are applied.
    pub(super) fn sync_progress(&mut self, r: u32, holds: &mut Holds, fx: &mut Effects) {
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
        let waiting = holds.release(|x| x == Reason::Sync(r));
        for (seq, entry, to) in sends {
            self.send_entry((r, seq), &entry, (version, stable), to, None, fx);
        }
        for s in copies {
            self.copy_to(r, s, true, fx);
        }
        for msg in waiting {
            self.on_request(msg, holds, fx);
        }
        self.start_catch_ups(r, fx);
        self.release(r, fx);
    }
}
