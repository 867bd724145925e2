//! Bounded staleness as a component of a server's core (`Part::Staleness`):
//! the [`Gate`] of each app, fed by what passes through the core.
//!
//! - The data path routes here every KV request that carries a staleness
//!   part (`PBMeta.staleness`, sent only to nodes with
//!   [`FEATURE_STALENESS`](pslite_proto::FEATURE_STALENESS)): a worker's
//!   tick is taken by the gate (never delivered), a push goes to the apps
//!   and is remembered until its answer, a pull with a bound goes to the
//!   apps if the gate admits it, else is held ([`Reason::Stale`]) until a
//!   tick, an applied push or a change of members admits it.
//! - A push is *applied* when the server's app answers it: the answer
//!   passes this component's pipeline stage on its way out
//!   ([`Component::outgoing`]), which tells the gate.
//! - The workers of the bound follow membership: the node table's workers
//!   (an elastic round's), less those the scheduler declares dead (at once:
//!   the others do not wait through the recovery window) and those given
//!   up on; a worker replaced by a new process starts again at clock 0, one
//!   declared dead by mistake that comes back keeps its count.
//!
//! A node that never receives a staleness part keeps no gate: its pipeline
//! stage returns at once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use pslite_proto::ids::{self, NodeId};
use pslite_proto::{Message, Role};

use super::Gate;
use crate::component::{Component, Cx, Facts};
use crate::effects::{Event, Output};
use crate::hold::Reason;

/// A push waiting for its answer: (app, worker, customer, timestamp).
type PushKey = (i32, NodeId, i32, i32);

/// A server's bounded-staleness gates, one per app (see the module docs).
#[derive(Default)]
pub struct Staleness {
    /// Per app id: the gate, whose held pulls are tickets of
    /// [`Reason::Stale`] holds.
    gates: HashMap<i32, Gate<u64>>,
    /// Pushes delivered and not answered yet, with the clock they carried.
    pushes: HashMap<PushKey, u64>,
    /// An elastic round's workers, once one began.
    round: Option<Vec<NodeId>>,
    /// Workers given up as dead (nothing replaced them).
    gone: HashSet<NodeId>,
    /// Nodes the scheduler declares dead now (a replacement may still
    /// come): out of the bound meanwhile.
    declared: Vec<NodeId>,
    next_ticket: u64,
    /// The largest `clock - floor` of a bounded pull when it went to the
    /// apps (how far its worker was ahead of the slowest).
    max_gap: u64,
    /// Pulls held so far.
    held_total: u64,
}

impl Staleness {
    /// The workers of the bound now.
    fn live(&self, facts: &dyn Facts) -> BTreeSet<NodeId> {
        let workers: Vec<NodeId> = match &self.round {
            Some(w) => w.clone(),
            None => facts
                .table()
                .iter()
                .filter(|n| n.role == Role::Worker)
                .map(|n| n.id)
                .collect(),
        };
        workers
            .into_iter()
            .filter(|id| !self.gone.contains(id) && !self.declared.contains(id))
            .collect()
    }

    /// Membership changed: every gate takes the new workers.
    fn members_changed(&mut self, cx: &mut Cx<'_>) {
        let live = self.live(cx.facts);
        let apps: Vec<i32> = self.gates.keys().copied().collect();
        for app in apps {
            let admitted = match self.gates.get_mut(&app) {
                Some(g) => g.set_workers(live.iter().copied()),
                None => continue,
            };
            self.admit(app, admitted, cx);
        }
    }

    /// The gate of `app`, made for the live workers on first use.
    fn gate(&mut self, app: i32, facts: &dyn Facts) -> &mut Gate<u64> {
        let live = self.live(facts);
        self.gates.entry(app).or_insert_with(|| Gate::new(live))
    }

    /// Hands the pulls the gate of `app` admitted to the apps.
    fn admit(&mut self, app: i32, tickets: Vec<u64>, cx: &mut Cx<'_>) {
        if tickets.is_empty() {
            return;
        }
        let floor = self.gates.get(&app).map_or(u64::MAX, Gate::floor);
        let tickets: BTreeSet<u64> = tickets.into_iter().collect();
        let released = cx
            .holds
            .release(|r| matches!(r, Reason::Stale(t) if tickets.contains(&t)));
        for msg in released {
            self.deliver(msg, floor, cx);
        }
    }

    /// A pull (or any request) goes to the apps; a bounded pull's gap is
    /// recorded.
    fn deliver(&mut self, msg: Message, floor: u64, cx: &mut Cx<'_>) {
        if let Some(st) = msg.meta.staleness.as_deref() {
            if st.bound.is_some() {
                let gap = st.clock.saturating_sub(floor);
                self.max_gap = self.max_gap.max(gap);
                cx.facts.counters().stale_gap(gap);
            }
        }
        cx.for_apps(Output::Deliver(msg));
    }

    /// The largest clock gap a bounded pull went to the apps with.
    pub fn max_gap(&self) -> u64 {
        self.max_gap
    }

    /// Pulls held so far.
    pub fn held_total(&self) -> u64 {
        self.held_total
    }
}

impl Component for Staleness {
    /// A KV request with a staleness part (the data path checked its
    /// sender may send it).
    fn handle(&mut self, msg: Message, _now: Instant, cx: &mut Cx<'_>) {
        let Some(st) = msg.meta.staleness.as_deref().copied() else {
            return cx.for_apps(Output::Deliver(msg));
        };
        let (app, worker) = (msg.meta.app_id, msg.meta.sender);
        if ids::role_of_id(worker) != Some(Role::Worker) || !msg.meta.request {
            return cx.for_apps(Output::Deliver(msg));
        }
        if let Some(pushes) = st.pushes {
            let admitted = self.gate(app, cx.facts).tick(worker, st.clock, pushes);
            return self.admit(app, admitted, cx);
        }
        if msg.meta.push {
            // The gate exists before the answer tells it the push applied.
            self.gate(app, cx.facts);
            let key = (app, worker, msg.meta.customer_id, msg.meta.timestamp);
            self.pushes.insert(key, st.clock);
            // Pushes are never held (the gate could deadlock otherwise).
            return cx.for_apps(Output::Deliver(msg));
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let gate = self.gate(app, cx.facts);
        if gate.pull(st.clock, st.bound, ticket).is_some() {
            let floor = gate.floor();
            return self.deliver(msg, floor, cx);
        }
        self.held_total += 1;
        cx.facts.counters().stale_held();
        if let Err(refused) = cx.holds.hold(Reason::Stale(ticket), msg) {
            // Stale holds have no budget: this cannot happen.
            cx.for_apps(Output::Deliver(refused.item));
        }
    }

    /// Membership: a worker given up as dead leaves the bound, a replaced
    /// one starts again, a round's workers are the bound.
    fn on_event(&mut self, event: &Event, _now: Instant, cx: &mut Cx<'_>) {
        match event {
            Event::PeerDead(id) => {
                self.gone.insert(*id);
                self.pushes.retain(|k, _| k.1 != *id);
            }
            Event::PeerReplaced(id) => {
                self.gone.remove(id);
                self.pushes.retain(|k, _| k.1 != *id);
                // A new process starts at clock 0: its old progress goes.
                for gate in self.gates.values_mut() {
                    gate.restart(*id);
                }
            }
            Event::RoundBegan { workers, .. } => self.round = Some(workers.clone()),
            Event::DeadNodes(dead) => self.declared = dead.clone(),
            _ => {}
        }
        if !self.gates.is_empty() {
            self.members_changed(cx);
        }
    }

    /// A server's answer to a push: the push is applied.
    fn outgoing(
        &mut self,
        msg: Message,
        _now: Instant,
        cx: &mut Cx<'_>,
    ) -> Result<Option<Message>, crate::error::Failure> {
        if self.pushes.is_empty() || msg.meta.request || !msg.meta.push || msg.is_control() {
            return Ok(Some(msg));
        }
        let m = &msg.meta;
        let key = (m.app_id, m.recver, m.customer_id, m.timestamp);
        if let Some(clock) = self.pushes.remove(&key) {
            let admitted = match self.gates.get_mut(&m.app_id) {
                Some(g) => g.push_applied(m.recver, clock),
                None => Vec::new(),
            };
            self.admit(m.app_id, admitted, cx);
        }
        Ok(Some(msg))
    }
}
