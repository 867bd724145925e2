//! The node side of the control plane (a server or a worker, and the
//! scheduler's own view of itself): three components of the core, with no
//! sockets and no clock, each fed control messages, events and the time.
//!
//! - [`NodeTable`] (`table.rs`): joining (ADD_NODE out, the scheduler's
//!   node table in, the start deadline and the "still waiting" log lines),
//!   node-table updates after a recovery (reconnect to a node that moved,
//!   resend to a node replaced), elastic rounds, the scheduler's LEAVE.
//! - [`Liveness`] (`liveness.rs`): heartbeats to the scheduler, its loss,
//!   the nodes it declares dead and those nothing replaced in time, time
//!   this node could not hear held against nobody.
//! - [`Barriers`] (`barriers.rs`): this node's barrier waits and their
//!   release.
//!
//! They never call each other: what one needs of the node table it reads
//! through [`Facts`](crate::component::Facts), and what one did reaches
//! the others as an [`Event`](crate::effects::Event) (joined, a round
//! began, a peer replaced, the node failed).
//!
//! No single message ends a node: a node table that lacks this node, that
//! gives it an id of another role, or that comes from anyone but the
//! scheduler is logged and ignored; only the start deadline ends a node
//! that is still joining.

use std::time::Duration;

use pslite_proto::ids::NodeId;
use pslite_proto::Message;

use crate::error::Failure;

mod barriers;
mod liveness;
mod table;

pub use barriers::Barriers;
pub use liveness::Liveness;
pub use table::NodeTable;

/// How long a closed connection to a peer must stay closed, with nothing
/// heard from the peer meanwhile, before the peer counts as gone: its
/// process died and the kernel closed its sockets (ZeroMQ reconnects to a
/// live peer within about 100 ms).
pub const LINK_GRACE: Duration = Duration::from_secs(1);

/// A clock-driven step that comes this much later than it was due means the
/// process was stopped meanwhile (SIGSTOP, a VM pause, a debugger, heavy
/// swapping): the time it lost is not held against its peers.
pub const PAUSE_SLACK: Duration = Duration::from_secs(2);

/// How often a node still waiting to join says so.
pub const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How a barrier this node waits on ended.
pub type BarrierOutcome = Result<(), Failure>;

/// The elastic round a scheduler's ADD_NODE carries (pslite-only fields
/// 102 and 103), if any.
fn msg_round(msg: &Message) -> Option<(u64, Vec<NodeId>)> {
    let c = &msg.meta.control;
    c.round.map(|n| (n, c.round_members.clone()))
}

/// Whether timestamp `a` comes before `b` (timestamps count up and wrap at
/// `i32::MAX`).
fn older(a: i32, b: i32) -> bool {
    let ahead = b.wrapping_sub(a) & i32::MAX;
    ahead != 0 && ahead < 1 << 30
}
