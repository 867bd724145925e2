//! How components learn what others did: every [`Event`] goes to the
//! components that take it ([`listeners`], one table), then to the core's
//! own handling (what concerns the node as a whole: held messages released,
//! a peer's requests sent again or failed, what the driver reports).

use std::time::Instant;

use log::{debug, info, warn};
use pslite_proto::ids::NodeId;
use pslite_proto::{Command, Role};

use super::parts::{Origin, Part};
use super::Core;
use crate::effects::{Event, Output};
use crate::error::Failure;
use crate::hold::Reason;

/// The components that take `event`, in order.
fn listeners(event: &Event) -> &'static [Part] {
    match event {
        Event::Forming(_) | Event::Replacing(_) | Event::Replaced(_) | Event::Back(_) => {
            &[Part::Replication]
        }
        Event::PeerReplaced(_) => &[
            Part::Liveness,
            Part::Store,
            Part::Partition,
            Part::Staleness,
        ],
        Event::PeerDead(_) => &[Part::Partition, Part::Staleness],
        Event::Formed(_) => &[Part::Table, Part::Checkpoints],
        Event::TableChanged(_) | Event::Round { .. } => &[Part::Table],
        Event::Joined | Event::Replicated => &[Part::Liveness],
        Event::Failed(_) => &[Part::Liveness, Part::Barriers],
        Event::Left => &[Part::Barriers],
        Event::TableTaken => &[Part::Replication, Part::Staleness],
        Event::RoundBegan { .. } => &[Part::Liveness, Part::Staleness],
        Event::DeadNodes(_) => &[Part::Staleness],
        Event::Releasing { .. } => &[Part::Checkpoints],
        Event::Registered(_)
        | Event::FailedOver { .. }
        | Event::ServerLeft(_)
        | Event::StopJob(_) => &[Part::Scheduler],
        Event::Answered { .. } => &[Part::Resender],
        Event::Waiting { .. } | Event::GaveUp(_) => &[],
    }
}

impl Core {
    /// Routes `event` (from `origin`) to the components that take it, then
    /// handles what concerns the node as a whole.
    pub(super) fn route_event(&mut self, event: Event, origin: Origin, now: Instant) {
        for &part in listeners(&event) {
            if Origin::Part(part) != origin {
                self.on_part(part, now, |c, cx| c.on_event(&event, now, cx));
            }
        }
        match event {
            Event::Joined => {
                for msg in self.holds.release(|r| r == Reason::Joining) {
                    if msg.meta.control.cmd == Command::Replica {
                        self.dispatch(msg, now);
                    } else {
                        self.data(msg, now);
                    }
                }
            }
            Event::PeerReplaced(id) => self.peer_replaced(id, now),
            Event::PeerDead(id) => self.peer_dead(id),
            Event::RoundBegan { round, workers } => {
                self.changed = true;
                self.out.push(Output::RoundBegan { round, workers });
                for msg in self.holds.release(|r| r == Reason::Newcomer) {
                    if self.parts.table.is_member(msg.meta.sender) {
                        self.data(msg, now);
                    } else {
                        self.reject(&msg, "its sender is not in the node table");
                    }
                }
            }
            Event::Waiting { waited, limit } => {
                let what = self.waiting_for();
                self.out.push(Output::Waiting {
                    waited,
                    limit,
                    what,
                });
            }
            Event::Formed(table) => {
                let servers = match self.cfg.min_servers {
                    // Servers that join and leave: as many as registered.
                    Some(_) => table
                        .iter()
                        .filter(|n| n.role == Role::Server)
                        .map(|n| n.id)
                        .collect::<std::collections::BTreeSet<_>>()
                        .len() as i32,
                    None => self.cfg.num_servers,
                };
                info!(
                    "scheduler: cluster formed with {servers} servers and {} workers",
                    self.cfg.num_workers
                );
            }
            Event::Left => self.leaving(now),
            Event::GaveUp(gave_up) => {
                let (msg, failure) = *gave_up;
                if self.parts.replication.owns(&msg) {
                    debug!("{failure}: the range map decides where it goes next");
                } else {
                    warn!("{failure}");
                    self.out.push(Output::Undeliverable(msg, failure));
                }
            }
            _ => {}
        }
    }

    /// Node `id` restarted: the requests it never answered go to the new
    /// process (the old one may have taken them to its grave); without a
    /// resender they cannot, and fail instead of waiting forever.
    fn peer_replaced(&mut self, id: NodeId, now: Instant) {
        let is_scheduler = self.parts.scheduler.is_some();
        let covered = self.parts.replication.covers(id);
        let Some(r) = &mut self.parts.resender else {
            if !is_scheduler && !covered {
                self.out
                    .push(Output::PeerDead(id, Failure::PeerRestarted { id }));
            }
            return;
        };
        // The new process's timestamps start over.
        r.forget_seen(id);
        if is_scheduler {
            // Sent before the new process registered (it gets the current
            // table and map with its own). Not elsewhere: a node may learn
            // of the replacement after it sent the new process something (a
            // copy of its ranges, by the map).
            r.forget_control_to(id);
        }
        let again = r.on_peer_replaced(id, now);
        if !again.is_empty() {
            info!(
                "sending {} unanswered requests again to the new node {id}",
                again.len()
            );
        }
        for msg in again {
            self.counters.resent();
            self.out.push(Output::Send(msg));
        }
    }

    /// Node `id` died and nothing replaced it in time: what waits on it
    /// fails (a dead server's ranges failed over instead, with replicated
    /// key ranges: its requests went to the new primaries).
    fn peer_dead(&mut self, id: NodeId) {
        let failure = Failure::PeerDead {
            id,
            secs: self.cfg.recovery_timeout.as_secs(),
        };
        if let Some(r) = &mut self.parts.resender {
            for msg in r.forget_peer(id) {
                if !self.parts.replication.owns(&msg) {
                    self.out.push(Output::Undeliverable(msg, failure.clone()));
                }
            }
        }
        if !self.parts.replication.covers(id) {
            self.out.push(Output::PeerDead(id, failure));
        }
    }
}
