//! The contract every part of the core implements: membership, the
//! scheduler, the resender, the store, replication, checkpoints, leaving
//! servers and registrations are each a [`Component`]. The core routes
//! messages, the clock and [`Event`]s to them; they answer with
//! [`Effects`], never by calling each other.
//!
//! A component reads what others know through [`Facts`] (a read-only view
//! the core gives it, never of itself), holds messages only in the core's
//! hold facility ([`Holds`]), and draws randomness from the node's
//! generator, so a whole cluster stays deterministic under one seed.

use std::time::Instant;

use pslite_proto::replica::RangeMap;
use pslite_proto::{Message, Node, NodeId};
use rand::rngs::StdRng;

use crate::config::VanConfig;
use crate::counters::Counters;
use crate::effects::{Effect, Effects, Event, Output};
use crate::error::Failure;
use crate::hold::Holds;

/// One part of a node's control plane.
///
/// Besides the three calls every state machine of this crate has
/// (`handle`, `tick`, `poll_timeout`: no clock-driven work unless it says
/// so), a component may take part in the two stages where features meet:
/// - the **outgoing pipeline** ([`Component::outgoing`]): every message
///   the apps send passes each component's stage in the core's order; a
///   message a component emits passes the stages after its own;
/// - the **node-table attachments** ([`Component::attach`],
///   [`Component::attached`]): control messages carry parts that belong to
///   other components (a node table carries the range map and the
///   checkpoint to restore; a worker's barrier request its requests in
///   flight): each component adds its part to what leaves, and reads its
///   part of what arrives before the message goes to its own component.
pub trait Component {
    /// A message the core's table routed to this component, with its
    /// sender checked (see `core/route.rs`).
    fn handle(&mut self, msg: Message, now: Instant, cx: &mut Cx<'_>);

    /// Clock-driven work at `now` (the core ticks every component when any
    /// deadline is due).
    fn tick(&mut self, now: Instant, cx: &mut Cx<'_>) {
        let _ = (now, cx);
    }

    /// When [`Component::tick`] has work next.
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    /// What another component announced.
    fn on_event(&mut self, event: &Event, now: Instant, cx: &mut Cx<'_>) {
        let _ = (event, now, cx);
    }

    /// Its stage of the outgoing pipeline: the message to pass on (changed
    /// or not), `None` if it holds or consumes it (emitting what it sends
    /// instead, which goes on from the next stage), or why it cannot go
    /// (the app's send fails with it).
    fn outgoing(
        &mut self,
        msg: Message,
        now: Instant,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Message>, Failure> {
        let _ = (now, cx);
        Ok(Some(msg))
    }

    /// Adds its part to a control message this node sends (a node table,
    /// a barrier request).
    fn attach(&self, msg: &mut Message, facts: &dyn Facts) {
        let _ = (msg, facts);
    }

    /// Reads its part of a control message that arrived, before the
    /// message goes to its component.
    fn attached(&mut self, msg: &Message, now: Instant, cx: &mut Cx<'_>) {
        let _ = (msg, now, cx);
    }
}

/// What a component may read of the node and the other components.
pub trait Facts {
    /// The node's configuration.
    fn config(&self) -> &VanConfig;
    /// What the node counts (atomics: a component may count too).
    fn counters(&self) -> &Counters;
    /// This node as the cluster knows it (its id once joined).
    fn me(&self) -> &Node;
    /// Whether this node has joined.
    fn is_joined(&self) -> bool;
    /// Whether this node reads what arrives (not while an app's queue is
    /// full or the driver is stalled: nobody's silence counts then).
    fn is_listening(&self) -> bool;
    /// Why this node failed, if it did.
    fn failure(&self) -> Option<&Failure>;
    /// Node `id`'s entry in the node table.
    fn node(&self, id: NodeId) -> Option<&Node>;
    /// The node table (servers, workers, the scheduler) once joined.
    fn table(&self) -> &[Node];
    /// This node's usable entry in `nodes` (a node table), if it has one.
    fn my_entry<'n>(&self, nodes: &'n [Node]) -> Option<&'n Node>;
    /// On the scheduler: the processes registered (every entry, several
    /// per process with several customers); empty elsewhere.
    fn registered(&self) -> &[Node];
    /// On the scheduler: the processes dead at `now`; empty elsewhere.
    fn dead_nodes(&self, now: Instant) -> Vec<NodeId>;
    /// On the scheduler: whether server `id` left the job by itself.
    fn has_left(&self, id: NodeId) -> bool;
    /// The range map this node knows, when key ranges are replicated.
    fn range_map(&self) -> Option<&RangeMap>;
    /// Wall-clock time at `now`, in ms since the Unix epoch: as the driver
    /// last passed it in ([`crate::Core::tick`]), moved on by the
    /// monotonic clock.
    fn unix_ms(&self, now: Instant) -> u64;
}

/// What a component gets with each call: what it may read, where its
/// effects go, the node's holds and its random generator.
pub struct Cx<'a> {
    /// The node and the other components, read-only.
    pub facts: &'a dyn Facts,
    /// Where the effects go, in order.
    pub fx: &'a mut Effects,
    /// The one place messages are held (see `crate::hold`).
    pub holds: &'a mut Holds,
    /// The node's random generator (seeded once per node).
    pub rng: &'a mut StdRng,
}

impl Cx<'_> {
    /// Sends `msg` (see [`Effect::Send`]).
    pub fn send(&mut self, msg: Message) {
        self.fx.send(msg);
    }

    /// Announces `event`.
    pub fn event(&mut self, event: Event) {
        self.fx.event(event);
    }

    /// Hands `out` to the driver.
    pub fn out(&mut self, out: Output) {
        self.fx.out(out);
    }

    /// Hands `out` to the apps, in order.
    pub fn for_apps(&mut self, out: Output) {
        self.fx.push(Effect::ForApps(out));
    }

    /// Something a waiter looks at changed.
    pub fn changed(&mut self) {
        self.fx.push(Effect::Changed);
    }

    /// The node fails.
    pub fn fail(&mut self, failure: Failure) {
        self.fx.push(Effect::Fail(failure));
    }
}
