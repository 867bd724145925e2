//! The plan of a checkpoint, made on the scheduler from what it knows of
//! the cluster now (the registered servers, the dead, the range map):
//! which server writes which key ranges, or why none can be taken.

use std::collections::BTreeSet;
use std::time::Instant;

use pslite_proto::ids::{self, NodeId};
use pslite_proto::replica::RangeMap;
use pslite_proto::Role;

use super::format::Shape;
use super::master::Plan;
use crate::component::Facts;

/// On the scheduler: which server writes which ranges now, or why no
/// checkpoint can be taken (a C++ server, a dead one, a lost range).
pub(super) fn current(facts: &dyn Facts, now: Instant) -> Plan {
    if facts.config().role != Role::Scheduler {
        return Plan::default();
    }
    let mut servers: Vec<_> = facts
        .registered()
        .iter()
        .filter(|n| n.role == Role::Server)
        .cloned()
        .collect();
    servers.sort_by_key(|n| n.id);
    servers.dedup_by_key(|n| n.id);
    if let Some(cxx) = servers.iter().find(|n| !n.pslite) {
        return Plan {
            refused: Some(format!(
                "server {} is C++ ps-lite, which cannot write checkpoints (only pslite \
                 servers can)",
                cxx.id
            )),
            ..Plan::default()
        };
    }
    let dead: BTreeSet<NodeId> = facts.dead_nodes(now).into_iter().collect();
    if let Some(map) = facts.range_map() {
        let mut plan = Plan {
            shape: Shape {
                ranges: map.ranges.iter().map(|r| (r.begin, r.end)).collect(),
                replicas: map.replicas,
                map_version: map.version,
            },
            ..Plan::default()
        };
        for (r, range) in map.ranges.iter().enumerate() {
            if range.replicas.is_empty() {
                plan.refused = Some(format!(
                    "key range {r} has no replica left: its state is gone"
                ));
                return plan;
            }
        }
        for n in &servers {
            let held = held_by(map, n.id);
            if !held.is_empty() && !dead.contains(&n.id) {
                plan.servers.push((n.id, ids::id_to_rank(n.id), held));
            }
        }
        return plan;
    }
    let ranges = crate::replica::key_ranges(facts.config().num_servers.max(1) as usize);
    let mut plan = Plan {
        shape: Shape {
            ranges,
            replicas: 1,
            map_version: 0,
        },
        ..Plan::default()
    };
    for n in &servers {
        if dead.contains(&n.id) {
            plan.refused = Some(format!(
                "server {} is dead and not replaced: its key range cannot be written",
                n.id
            ));
            return plan;
        }
        let rank = ids::id_to_rank(n.id);
        plan.servers.push((n.id, rank, vec![rank as u32]));
    }
    plan
}

/// The key ranges of `map` node `id` holds a replica of.
pub(super) fn held_by(map: &RangeMap, id: NodeId) -> Vec<u32> {
    (0..map.ranges.len() as u32)
        .filter(|&r| map.ranges[r as usize].replicas.contains(&id))
        .collect()
}
