//! A server's leave from a running job (`DMLC_NUM_SERVER=MIN:MAX`,
//! pslite-only; see `crate::replica::master`), a component of the core.
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
//!
//! The scheduler's side is replication's (`crate::replica::replication`):
//! the range map decides. This component is the server's: the request and
//! the answer.

use std::time::Instant;

use log::{info, warn};
use pslite_proto::ids::{NodeId, SCHEDULER};
use pslite_proto::replica::{ReplicaMsg, ReplicaOp};
use pslite_proto::{Command, Message, Role};

use crate::component::{Component, Cx};
use crate::effects::{Effect, Event};
use crate::error::VanError;

/// A server's leave, as far as it got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Leave {
    /// Not asked for.
    #[default]
    No,
    /// Asked for; the scheduler has not answered.
    Asked,
    /// Answered: left (`Ok`), or refused (why).
    Answered(Result<(), String>),
}

impl Leave {
    /// Asks the scheduler to let this server leave (see
    /// `Call::Leave`).
    pub fn ask(&mut self, cx: &mut Cx<'_>) -> Result<(), VanError> {
        let refuse = |detail: &str| VanError::Setup {
            what: "leave the job",
            detail: detail.to_string(),
        };
        let cfg = cx.facts.config();
        if cfg.role != Role::Server || cfg.min_servers.is_none() {
            return Err(refuse(
                "only a server of a job with DMLC_NUM_SERVER=MIN:MAX may leave it while it runs",
            ));
        }
        if !cx.facts.is_joined() {
            return Err(VanError::NotReady);
        }
        if let Some(f) = cx.facts.failure() {
            return Err(VanError::Failed(f.clone()));
        }
        if matches!(self, Leave::Answered(Ok(()))) {
            return Ok(());
        }
        info!("asking the scheduler to let this server leave: its ranges move first");
        *self = Leave::Asked;
        let mut msg = Message::control(Command::Replica, SCHEDULER);
        msg.meta.replica = Some(Box::new(ReplicaMsg::new(ReplicaOp::Leave, 0)));
        cx.send(msg);
        Ok(())
    }

    /// How this server's leave ended: `None` while the scheduler has not
    /// answered (or it was not asked); `Some(Err)` says why it was refused.
    pub fn outcome(&self) -> Option<Result<(), String>> {
        match self {
            Leave::Answered(r) => Some(r.clone()),
            Leave::No | Leave::Asked => None,
        }
    }

    /// The scheduler's answer to this server's LEAVE.
    fn answered(&mut self, op: ReplicaOp, min: NodeId, cx: &mut Cx<'_>) {
        if *self != Leave::Asked {
            return;
        }
        if op == ReplicaOp::Left {
            info!("this server left the job: its ranges are on the others; it may exit");
            *self = Leave::Answered(Ok(()));
            // Its waits (the last barrier, say) are over, and peers that
            // close their connections now are no deaths.
            cx.event(Event::Left);
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
            *self = Leave::Answered(Err(why));
        }
        cx.fx.push(Effect::Changed);
    }
}

impl Component for Leave {
    /// The scheduler's LEFT or LEAVE_REFUSED.
    fn handle(&mut self, msg: Message, _now: Instant, cx: &mut Cx<'_>) {
        if let Some(rep) = msg.meta.replica.as_deref() {
            self.answered(rep.op, rep.node, cx);
        }
    }
}
