//! Node ids and node groups, as C++ ps-lite numbers them.
//!
//! The scheduler is node 1. Server rank `r` is node `8 + 2r`, worker rank `r`
//! is node `9 + 2r`. Groups are bit sets over the three roles (scheduler 1,
//! servers 2, workers 4), so `7` names everyone; a node id (>= 8) also names
//! the group holding just that node.

use crate::Role;

/// A node id on the wire (`ps<id>` identities, `PBNode.id`).
pub type NodeId = i32;

/// ps-lite's "no value" marker (`kEmpty`): absent ids, timestamps, app ids.
pub const K_EMPTY: i32 = i32::MAX;

/// The scheduler's node id.
pub const SCHEDULER: NodeId = 1;

/// The group of the scheduler alone.
pub const SCHEDULER_GROUP: i32 = 1;
/// The group of all servers.
pub const SERVER_GROUP: i32 = 2;
/// The group of all workers.
pub const WORKER_GROUP: i32 = 4;
/// Every node: scheduler, servers and workers.
pub const ALL_GROUP: i32 = SCHEDULER_GROUP + SERVER_GROUP + WORKER_GROUP;

/// The node id of server rank `rank`.
pub fn server_rank_to_id(rank: i32) -> NodeId {
    rank * 2 + 8
}

/// The node id of worker rank `rank`.
pub fn worker_rank_to_id(rank: i32) -> NodeId {
    rank * 2 + 9
}

/// The rank of a server or worker id (0 for the scheduler).
pub fn id_to_rank(id: NodeId) -> i32 {
    (id - 8).max(0) / 2
}

/// The role a node id belongs to, if it is a valid node id.
pub fn role_of_id(id: NodeId) -> Option<Role> {
    match id {
        SCHEDULER => Some(Role::Scheduler),
        8.. if id != K_EMPTY => Some(if id % 2 == 0 {
            Role::Server
        } else {
            Role::Worker
        }),
        _ => None,
    }
}

/// The group bit of a role.
pub fn role_group(role: Role) -> i32 {
    match role {
        Role::Scheduler => SCHEDULER_GROUP,
        Role::Server => SERVER_GROUP,
        Role::Worker => WORKER_GROUP,
    }
}

/// Whether `group` is one of the seven role unions a barrier may name.
/// (A C++ scheduler indexes its barrier counters by group, so only 1..=7.)
pub fn is_role_group(group: i32) -> bool {
    (1..=ALL_GROUP).contains(&group)
}

/// Whether `id` belongs to `group` (a role union 1..=7, or a single node id).
pub fn group_contains(group: i32, id: NodeId) -> bool {
    if is_role_group(group) {
        role_of_id(id).is_some_and(|role| group & role_group(role) != 0)
    } else {
        group >= 8 && group == id
    }
}

/// Every node id of `group` in a cluster of `num_servers` and `num_workers`,
/// ascending: the scheduler first, then servers and workers interleaved.
pub fn group_members(group: i32, num_servers: i32, num_workers: i32) -> Vec<NodeId> {
    if !is_role_group(group) {
        let valid = match role_of_id(group) {
            Some(Role::Server) => id_to_rank(group) < num_servers,
            Some(Role::Worker) => id_to_rank(group) < num_workers,
            _ => false,
        };
        return if valid { vec![group] } else { Vec::new() };
    }
    let mut ids = Vec::new();
    if group & SCHEDULER_GROUP != 0 {
        ids.push(SCHEDULER);
    }
    if group & SERVER_GROUP != 0 {
        ids.extend((0..num_servers).map(server_rank_to_id));
    }
    if group & WORKER_GROUP != 0 {
        ids.extend((0..num_workers).map(worker_rank_to_id));
    }
    ids.sort_unstable();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_ranks_round_trip() {
        for rank in 0..100 {
            assert_eq!(id_to_rank(server_rank_to_id(rank)), rank);
            assert_eq!(id_to_rank(worker_rank_to_id(rank)), rank);
            assert_eq!(role_of_id(server_rank_to_id(rank)), Some(Role::Server));
            assert_eq!(role_of_id(worker_rank_to_id(rank)), Some(Role::Worker));
        }
        assert_eq!(role_of_id(SCHEDULER), Some(Role::Scheduler));
        assert_eq!(role_of_id(K_EMPTY), None);
        assert_eq!(role_of_id(0), None);
        assert_eq!(role_of_id(5), None);
    }

    #[test]
    fn groups() {
        assert_eq!(group_members(ALL_GROUP, 2, 2), vec![1, 8, 9, 10, 11]);
        assert_eq!(group_members(WORKER_GROUP, 2, 3), vec![9, 11, 13]);
        assert_eq!(
            group_members(SERVER_GROUP + SCHEDULER_GROUP, 1, 3),
            vec![1, 8]
        );
        assert_eq!(group_members(10, 2, 2), vec![10]);
        assert_eq!(group_members(12, 2, 2), Vec::<NodeId>::new());
        assert!(group_contains(6, 9) && group_contains(6, 8) && !group_contains(6, 1));
        assert!(group_contains(9, 9) && !group_contains(9, 11));
        assert!(!is_role_group(0) && !is_role_group(8) && is_role_group(7));
    }
}
