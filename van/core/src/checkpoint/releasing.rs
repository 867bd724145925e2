//! On the scheduler: the releases of one barrier, gathered as they come
//! through the outgoing pipeline, so that all of them are held if a
//! checkpoint is taken at that barrier ([`crate::effects::Event::Releasing`]
//! says which follow).

use pslite_proto::ids::NodeId;
use pslite_proto::{Command, Message};

/// The releases of one barrier on their way out, until all have come.
pub(super) struct Releasing {
    pub(super) group: i32,
    to: Vec<NodeId>,
    pub(super) releases: Vec<Message>,
}

impl Releasing {
    /// The releases of barrier group `group` to each of `to`.
    pub(super) fn new(group: i32, to: &[NodeId]) -> Releasing {
        Releasing {
            group,
            to: to.to_vec(),
            releases: Vec::with_capacity(to.len()),
        }
    }

    /// Takes `msg` if it is one of these releases; gives it back if not.
    pub(super) fn gather(&mut self, msg: Message) -> Option<Message> {
        if !is_release(&msg)
            || msg.meta.control.barrier_group != self.group
            || !self.to.contains(&msg.meta.recver)
        {
            return Some(msg);
        }
        self.releases.push(msg);
        None
    }

    /// Whether every release has come.
    pub(super) fn is_complete(&self) -> bool {
        self.releases.len() == self.to.len()
    }
}

/// Whether `msg` is a barrier release (not a failure reply).
fn is_release(msg: &Message) -> bool {
    msg.meta.control.cmd == Command::Barrier
        && !msg.meta.request
        && msg.meta.control.failed_peer.is_none()
}
