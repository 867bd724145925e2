//! The core's side of servers that join and leave a running job
//! (`DMLC_NUM_SERVER=MIN:MAX`, pslite-only; see `crate::replica::master`).
//! Joining needs nothing here: the scheduler gives a late server the next
//! rank as if it replaced one, and the range map copies its ranges to it.
//! Leaving is asked for and answered in REPLICA messages:
//! - a server sends LEAVE (op 10) to the scheduler;
//! - the scheduler plans the map without it (copies to the new targets
//!   start while it still serves), or refuses (fewer than MIN would stay:
//!   LEAVE_REFUSED, op 12, `node` = MIN);
//! - once no range holds it, the scheduler counts it as left (dead for
//!   good, nothing fails for it, barriers stop waiting for it) and answers
//!   LEFT (op 11): the server's waits end and it may exit.

use std::time::Instant;

use log::{info, warn};
use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::replica::{ReplicaMsg, ReplicaOp};
use pslite_proto::{Command, Message, Role};

use super::replication::Replication;
use super::Core;
use crate::error::VanError;
use crate::replica::master::LeaveRefused;

/// A server's leave, as far as it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Leave {
    /// Not asked for.
    No,
    /// Asked for; the scheduler has not answered.
    Asked,
    /// Answered: left (`Ok`), or refused (why).
    Answered(Result<(), String>),
}

impl Core {
    /// On a server of a job whose servers join and leave: asks the
    /// scheduler to let this server leave. Its ranges move to the other
    /// servers first; [`Core::leave_outcome`] tells when it may exit.
    pub fn leave_job(&mut self, now: Instant) -> Result<(), VanError> {
        let refuse = |detail: &str| VanError::Setup {
            what: "leave the job",
            detail: detail.to_string(),
        };
        if self.cfg.role != Role::Server || self.cfg.min_servers.is_none() {
            return Err(refuse(
                "only a server of a job with DMLC_NUM_SERVER=MIN:MAX may leave it while it runs",
            ));
        }
        if !self.member.is_joined() {
            return Err(VanError::NotReady);
        }
        if let Some(f) = self.member.failure() {
            return Err(VanError::Failed(f.clone()));
        }
        if matches!(self.leave, Leave::Answered(Ok(()))) {
            return Ok(());
        }
        info!("asking the scheduler to let this server leave: its ranges move first");
        self.leave = Leave::Asked;
        let mut msg = Message::control(Command::Replica, SCHEDULER);
        msg.meta.replica = Some(Box::new(ReplicaMsg::new(ReplicaOp::Leave, 0)));
        self.emit(msg, now);
        Ok(())
    }

    /// How this server's leave ended: `None` while the scheduler has not
    /// answered (or it was not asked); `Some(Err)` says why it was refused.
    pub fn leave_outcome(&self) -> Option<Result<(), String>> {
        match &self.leave {
            Leave::Answered(r) => Some(r.clone()),
            Leave::No | Leave::Asked => None,
        }
    }

    /// On the scheduler: server `id` asks to leave.
    pub(super) fn server_asks_to_leave(&mut self, id: NodeId, now: Instant) {
        if self.scheduler.as_ref().is_some_and(|s| s.has_left(id)) {
            // Asked again (a resend): it has left already.
            self.answer_leave(id, ReplicaOp::Left, 0, now);
            return;
        }
        let Some(min) = self.cfg.min_servers else {
            warn!(
                "scheduler: refusing server {id}'s leave: servers leave a running job only with \
                 DMLC_NUM_SERVER=MIN:MAX"
            );
            self.answer_leave(id, ReplicaOp::LeaveRefused, 0, now);
            return;
        };
        let Replication::Master(m) = &mut self.replication else {
            return;
        };
        match m.server_leaving(id, min.max(1) as usize) {
            Ok(true) => {
                info!(
                    "scheduler: server {id} leaves: its ranges move to the others (map {})",
                    m.map().version
                );
                self.broadcast_map(now);
                self.settle_leaving(now);
            }
            Ok(false) => self.settle_leaving(now),
            Err(LeaveRefused::TooFew { min, staying }) => {
                warn!(
                    "scheduler: refusing server {id}'s leave: {staying} server(s) would stay, \
                     fewer than DMLC_NUM_SERVER's MIN ({min})"
                );
                self.answer_leave(id, ReplicaOp::LeaveRefused, min as NodeId, now);
            }
            Err(LeaveRefused::NotLive) => {
                warn!("scheduler: refusing server {id}'s leave: it holds no place in the map");
                self.answer_leave(id, ReplicaOp::LeaveRefused, 0, now);
            }
        }
    }

    /// On the scheduler, after the map changed: leaving servers that no
    /// range holds any more have left; each is told it may exit.
    pub(super) fn settle_leaving(&mut self, now: Instant) {
        let Replication::Master(m) = &mut self.replication else {
            return;
        };
        for id in m.take_left() {
            self.answer_leave(id, ReplicaOp::Left, 0, now);
            let actions = match &mut self.scheduler {
                Some(s) => s.server_left(id, now),
                None => Vec::new(),
            };
            self.replica_dead.insert(id);
            self.apply_scheduler(actions, now);
        }
    }

    fn answer_leave(&mut self, id: NodeId, op: ReplicaOp, node: NodeId, now: Instant) {
        let mut rep = ReplicaMsg::new(op, 0);
        rep.node = node;
        let mut msg = Message::control(Command::Replica, id);
        msg.meta.replica = Some(Box::new(rep));
        self.emit(msg, now);
    }

    /// On a server: the scheduler's answer to its LEAVE.
    pub(super) fn leave_answered(&mut self, op: ReplicaOp, min: NodeId, now: Instant) {
        if self.leave != Leave::Asked {
            return;
        }
        if op == ReplicaOp::Left {
            info!("this server left the job: its ranges are on the others; it may exit");
            self.leave = Leave::Answered(Ok(()));
            // Its waits (the last barrier, say) are over, and peers that
            // close their connections now are no deaths.
            self.member.release_barriers();
            self.leaving(now);
        } else {
            let why = if min > 0 {
                format!(
                    "the scheduler refused: fewer than DMLC_NUM_SERVER's MIN ({min}) servers \
                     would stay"
                )
            } else {
                "the scheduler refused (see its log)".to_string()
            };
            warn!("this server cannot leave the job: {why}");
            self.leave = Leave::Answered(Err(why));
        }
        self.changed = true;
    }
}
