//! The components of one node's core, and how the core calls them: each
//! with a [`Cx`] whose [`Facts`] view shows the node and the *other*
//! components (never the one called, which knows its own state), then the
//! effects it emitted carried out.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pslite_proto::replica::RangeMap;
use pslite_proto::{Node, NodeId};

use super::Core;
use crate::checkpoint::checkpoints::Checkpoints;
use crate::component::{Component, Cx, Facts};
use crate::config::VanConfig;
use crate::counters::Counters;
use crate::error::Failure;
use crate::leave::Leave;
use crate::member::{Barriers, Liveness, NodeTable};
use crate::partition::Partitions;
use crate::registration::Registrations;
use crate::replica::replication::Replication;
use crate::resender::Resender;
use crate::scheduler::Scheduler;
use crate::staleness::component::Staleness;
use crate::store::component::Store;

/// The components.
pub(crate) struct Parts {
    /// Membership: joining, the node table, rounds.
    pub(crate) table: NodeTable,
    /// Heartbeats, the scheduler's loss, dead peers, pauses.
    pub(crate) liveness: Liveness,
    /// This node's barrier waits.
    pub(crate) barriers: Barriers,
    /// On the scheduler: ids, barriers, recovery, rounds, status.
    pub(crate) scheduler: Option<Scheduler>,
    /// On the scheduler: the check of registrations' addresses.
    pub(crate) registrations: Registrations,
    /// The key-value store (hosted by the scheduler) and its clients.
    pub(crate) store: Store,
    /// Replicated key ranges.
    pub(crate) replication: Replication,
    /// A server's leave from a running job.
    pub(crate) leave: Leave,
    /// Checkpoints.
    pub(crate) checkpoints: Checkpoints,
    /// With `PS_RESEND=1`: acknowledgements and resends.
    pub(crate) resender: Option<Resender>,
    /// Large data messages in parts: the wire's cut of what goes to
    /// pslite peers, and the reassembly of what arrives.
    pub(crate) partition: Partitions,
    /// Bounded staleness: a server's gates.
    pub(crate) staleness: Staleness,
}

/// A component, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Table,
    Liveness,
    Barriers,
    Scheduler,
    Registrations,
    Store,
    Replication,
    Leave,
    Checkpoints,
    Resender,
    Partition,
    Staleness,
}

impl Part {
    /// The outgoing pipeline's stages, in order (see `pipeline.rs`; the
    /// wire after them keeps the resender's copy).
    pub(crate) const PIPELINE: [Part; 3] = [Part::Replication, Part::Checkpoints, Part::Staleness];
    /// The components whose parts control messages carry (see
    /// `pipeline.rs`), in order.
    pub(crate) const ATTACHMENTS: [Part; 2] = [Part::Replication, Part::Checkpoints];
    /// The clock, in order (the resender's goes last, while listening).
    pub(crate) const CLOCK: [Part; 8] = [
        Part::Table,
        Part::Liveness,
        Part::Scheduler,
        Part::Replication,
        Part::Checkpoints,
        Part::Registrations,
        Part::Store,
        Part::Partition,
    ];
}

/// Who emitted an effect: a message it sends passes the pipeline's stages
/// after its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The core, or the apps: every stage.
    Core,
    /// A component.
    Part(Part),
}

impl Origin {
    /// The first pipeline stage a message from here passes.
    pub(crate) fn first_stage(self) -> usize {
        match self {
            Origin::Part(p) => Part::PIPELINE
                .iter()
                .position(|&s| s == p)
                .map_or(0, |i| i + 1),
            Origin::Core => 0,
        }
    }
}

/// What a component sees of the others.
pub(crate) struct View<'a> {
    cfg: &'a VanConfig,
    counters: &'a Counters,
    blank: &'a Node,
    listening: bool,
    wall: (Instant, SystemTime),
    failure: Option<&'a Failure>,
    /// Membership: the node table.
    member: Option<&'a NodeTable>,
    scheduler: Option<&'a Scheduler>,
    replication: Option<&'a Replication>,
}

impl Facts for View<'_> {
    fn config(&self) -> &VanConfig {
        self.cfg
    }
    fn counters(&self) -> &Counters {
        self.counters
    }
    fn me(&self) -> &Node {
        self.member.map_or(self.blank, NodeTable::me)
    }
    fn is_joined(&self) -> bool {
        self.member.is_some_and(NodeTable::is_joined)
    }
    fn is_listening(&self) -> bool {
        self.listening
    }
    fn failure(&self) -> Option<&Failure> {
        self.failure
    }
    fn node(&self, id: NodeId) -> Option<&Node> {
        self.member.and_then(|m| m.node(id))
    }
    fn table(&self) -> &[Node] {
        self.member.map_or(&[], NodeTable::nodes)
    }
    fn my_entry<'n>(&self, nodes: &'n [Node]) -> Option<&'n Node> {
        self.member.and_then(|m| m.my_entry(nodes))
    }
    fn registered(&self) -> &[Node] {
        self.scheduler.map_or(&[], Scheduler::nodes)
    }
    fn dead_nodes(&self, now: Instant) -> Vec<NodeId> {
        self.scheduler.map_or_else(Vec::new, |s| s.dead_nodes(now))
    }
    fn has_left(&self, id: NodeId) -> bool {
        self.scheduler.is_some_and(|s| s.has_left(id))
    }
    fn range_map(&self) -> Option<&RangeMap> {
        self.replication.and_then(Replication::range_map)
    }
    fn unix_ms(&self, now: Instant) -> u64 {
        let (at, wall) = self.wall;
        let moved = now.saturating_duration_since(at);
        (wall + moved)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// Runs `$body` with `$c` the component in field `$field` of the parts
/// (`opt`: an `Option` field, skipped when `None`) and `$cx` its context,
/// the view leaving out the component itself; then carries out its effects.
macro_rules! with_part {
    ($name:ident, $ty:ty, $part:expr, $field:ident, opt, [$($facts:ident),*]) => {
        pub(crate) fn $name<R>(
            &mut self,
            now: Instant,
            f: impl FnOnce(&mut $ty, &mut Cx<'_>) -> R,
        ) -> Option<R> {
            let r = {
                let listening = self.deaf_since.is_none();
                let wall = self.wall;
                let Core { parts, cfg, counters, blank, fx, holds, rng, failure, .. } = self;
                let c = parts.$field.as_mut()?;
                let view = with_part!(@view cfg, counters, blank, listening, wall, failure, parts, [$($facts),*]);
                f(c, &mut Cx { facts: &view, fx, holds, rng })
            };
            self.settle(Origin::Part($part), now);
            Some(r)
        }
    };
    ($name:ident, $ty:ty, $part:expr, $field:ident, [$($facts:ident),*]) => {
        pub(crate) fn $name<R>(
            &mut self,
            now: Instant,
            f: impl FnOnce(&mut $ty, &mut Cx<'_>) -> R,
        ) -> R {
            let r = {
                let listening = self.deaf_since.is_none();
                let wall = self.wall;
                let Core { parts, cfg, counters, blank, fx, holds, rng, failure, .. } = self;
                let c = &mut parts.$field;
                let view = with_part!(@view cfg, counters, blank, listening, wall, failure, parts, [$($facts),*]);
                f(c, &mut Cx { facts: &view, fx, holds, rng })
            };
            self.settle(Origin::Part($part), now);
            r
        }
    };
    (@view $cfg:ident, $counters:ident, $blank:ident, $listening:ident, $wall:ident, $failure:ident, $parts:ident, [$($facts:ident),*]) => {{
        #[allow(unused_mut, unused_assignments)]
        let mut view = View {
            cfg: $cfg,
            counters: $counters,
            blank: $blank,
            listening: $listening,
            wall: $wall,
            failure: $failure.as_ref(),
            member: None,
            scheduler: None,
            replication: None,
        };
        $( with_part!(@fact view, $facts, $parts); )*
        view
    }};
    (@fact $view:ident, member, $parts:ident) => {
        $view.member = Some(&$parts.table);
    };
    (@fact $view:ident, scheduler, $parts:ident) => {
        $view.scheduler = $parts.scheduler.as_ref();
    };
    (@fact $view:ident, replication, $parts:ident) => {
        $view.replication = Some(&$parts.replication);
    };
}

impl Core {
    // Membership (the node table), the scheduler and replication are the
    // facts the others read; none of them reads its own through the view.
    with_part!(
        with_table,
        NodeTable,
        Part::Table,
        table,
        [scheduler, replication]
    );
    with_part!(with_liveness, Liveness, Part::Liveness, liveness, [member]);
    with_part!(with_barriers, Barriers, Part::Barriers, barriers, []);
    with_part!(
        with_scheduler,
        Scheduler,
        Part::Scheduler,
        scheduler,
        opt,
        [member, replication]
    );
    with_part!(
        with_replication,
        Replication,
        Part::Replication,
        replication,
        [member, scheduler]
    );
    with_part!(
        with_registrations,
        Registrations,
        Part::Registrations,
        registrations,
        [member, scheduler, replication]
    );
    with_part!(
        with_store,
        Store,
        Part::Store,
        store,
        [member, scheduler, replication]
    );
    with_part!(
        with_leave,
        Leave,
        Part::Leave,
        leave,
        [member, scheduler, replication]
    );
    with_part!(
        with_checkpoints,
        Checkpoints,
        Part::Checkpoints,
        checkpoints,
        [member, scheduler, replication]
    );
    with_part!(
        with_partition,
        Partitions,
        Part::Partition,
        partition,
        [member]
    );
    with_part!(
        with_staleness,
        Staleness,
        Part::Staleness,
        staleness,
        [member]
    );
    with_part!(
        with_resender,
        Resender,
        Part::Resender,
        resender,
        opt,
        [member, scheduler, replication]
    );

    /// What a component that is not called sees (the attachments of an
    /// outgoing message read every component).
    pub(crate) fn view(&self) -> View<'_> {
        View {
            cfg: &self.cfg,
            counters: &self.counters,
            blank: &self.blank,
            listening: self.deaf_since.is_none(),
            wall: self.wall,
            failure: self.failure.as_ref(),
            member: Some(&self.parts.table),
            scheduler: self.parts.scheduler.as_ref(),
            replication: Some(&self.parts.replication),
        }
    }

    /// Component `part`, to read (`None`: this node has none).
    pub(crate) fn part(&self, part: Part) -> Option<&dyn Component> {
        let p = &self.parts;
        match part {
            Part::Table => Some(&p.table),
            Part::Liveness => Some(&p.liveness),
            Part::Barriers => Some(&p.barriers),
            Part::Scheduler => p.scheduler.as_ref().map(|s| s as &dyn Component),
            Part::Registrations => Some(&p.registrations),
            Part::Store => Some(&p.store),
            Part::Replication => Some(&p.replication),
            Part::Leave => Some(&p.leave),
            Part::Checkpoints => Some(&p.checkpoints),
            Part::Resender => p.resender.as_ref().map(|r| r as &dyn Component),
            Part::Partition => Some(&p.partition),
            Part::Staleness => Some(&p.staleness),
        }
    }

    /// Runs `f` on component `part` (skipped if this node has none).
    pub(crate) fn on_part(
        &mut self,
        part: Part,
        now: Instant,
        f: impl FnOnce(&mut dyn Component, &mut Cx<'_>),
    ) {
        match part {
            Part::Table => self.with_table(now, |c, cx| f(c, cx)),
            Part::Liveness => self.with_liveness(now, |c, cx| f(c, cx)),
            Part::Barriers => self.with_barriers(now, |c, cx| f(c, cx)),
            Part::Scheduler => self.with_scheduler(now, |c, cx| f(c, cx)).unwrap_or(()),
            Part::Registrations => self.with_registrations(now, |c, cx| f(c, cx)),
            Part::Store => self.with_store(now, |c, cx| f(c, cx)),
            Part::Replication => self.with_replication(now, |c, cx| f(c, cx)),
            Part::Leave => self.with_leave(now, |c, cx| f(c, cx)),
            Part::Checkpoints => self.with_checkpoints(now, |c, cx| f(c, cx)),
            Part::Resender => self.with_resender(now, |c, cx| f(c, cx)).unwrap_or(()),
            Part::Partition => self.with_partition(now, |c, cx| f(c, cx)),
            Part::Staleness => self.with_staleness(now, |c, cx| f(c, cx)),
        }
    }
}
