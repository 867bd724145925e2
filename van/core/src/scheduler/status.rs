//! Status for admin clients (`pslite status`): the node table with
//! liveness, each node's latest counters (sent with its heartbeats), and in
//! elastic mode the round's ranks and the workers waiting.

use std::time::{Duration, Instant};

use log::debug;
use pslite_proto::stats::NodeStatus;
use pslite_proto::{Command, Message, Node, K_EMPTY};

use super::Scheduler;
use crate::effects::{Effect, Effects};

impl Scheduler {
    /// An admin client's STATUS request: answer with
    /// [`Scheduler::status_table`] on the connection it came on.
    pub(super) fn status(&mut self, msg: &Message, now: Instant, fx: &mut Effects) {
        if !msg.meta.request {
            debug!("scheduler: dropping a STATUS answer: the scheduler only answers them");
            return;
        }
        let Some(route) = msg.meta.route.clone() else {
            debug!(
                "scheduler: dropping STATUS from node {}: admin clients connect without an \
                 identity",
                msg.meta.sender
            );
            return;
        };
        debug!("scheduler: status request from an admin client");
        let mut answer = Message::control(Command::Status, K_EMPTY);
        answer.meta.status = self.status_table(now);
        answer.meta.timestamp = msg.meta.timestamp;
        fx.push(Effect::Reply(route, answer));
    }

    /// The scheduler first, then every process (by id; before the cluster
    /// forms, the registrations so far, without ids), each with how long ago
    /// it was last heard from, whether it is dead, and its latest counters.
    /// In elastic mode each worker of the round carries its rank, and the
    /// workers waiting for a round follow, marked `waiting`.
    /// Keys are left out: an admin client is not a member.
    pub fn status_table(&self, now: Instant) -> Vec<NodeStatus> {
        let mut rows = self.status_rows(now);
        for row in &mut rows {
            row.node.key = 0;
        }
        rows
    }

    pub(super) fn status_rows(&self, now: Instant) -> Vec<NodeStatus> {
        let mut rows = vec![NodeStatus {
            node: self.cfg.me.clone(),
            last_seen: Some(Duration::ZERO),
            dead: false,
            counters: None,
            counters_age: None,
            waiting: false,
            round_rank: None,
        }];
        let round = self.round().map_or(&[][..], |(_, members)| members);
        let nodes: Vec<&Node> = if self.ready {
            self.process_nodes()
        } else {
            self.nodes.iter().collect()
        };
        for node in nodes {
            let known = self.ready.then_some(node.id);
            let counters = known.and_then(|id| self.counters.get(&id));
            rows.push(NodeStatus {
                node: node.clone(),
                last_seen: known
                    .and_then(|id| self.last_seen.get(&id))
                    .map(|&seen| now.saturating_duration_since(seen)),
                dead: known.is_some_and(|id| self.is_dead(id, now)),
                counters: counters.map(|(c, _)| c.clone()),
                counters_age: counters.map(|&(_, at)| now.saturating_duration_since(at)),
                waiting: false,
                round_rank: known
                    .and_then(|id| round.iter().position(|&m| m == id))
                    .map(|rank| rank as u32),
            });
        }
        if let Some(e) = &self.elastic {
            let waiting = e.rdzv.waiting();
            let mut outside: Vec<&Node> = e
                .outside
                .iter()
                .filter(|n| waiting.contains(&n.id))
                .collect();
            outside.sort_by_key(|n| n.id);
            outside.dedup_by_key(|n| n.id);
            rows.extend(outside.into_iter().map(|node| NodeStatus {
                node: node.clone(),
                last_seen: None,
                dead: false,
                counters: None,
                counters_age: None,
                waiting: true,
                round_rank: None,
            }));
        }
        rows
    }
}
