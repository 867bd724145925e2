//! Whole clusters of cores in the in-memory network: forming, barriers,
//! recovery, heartbeats, scheduler loss, resends under loss, duplication
//! and reordering, and hostile control messages. No sockets, no sleeps:
//! time is virtual.

use std::collections::HashSet;

use proptest::prelude::*;
use pslite_proto::ids::{ALL_GROUP, SCHEDULER, SCHEDULER_GROUP, SERVER_GROUP, WORKER_GROUP};
use pslite_proto::{Command, Node};

use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// Heartbeats every second, a 3 s timeout for every node, 5 s to recover.
pub(super) fn heartbeats() -> VanConfig {
    VanConfig {
        heartbeat_interval: Some(SECOND),
        heartbeat_timeout: Some(SECOND * 3),
        watch_all: true,
        recovery_timeout: SECOND * 5,
        ..VanConfig::default()
    }
}

/// `PS_RESEND` with a timeout of `timeout_ms`.
pub(super) fn resend(timeout_ms: u64) -> VanConfig {
    VanConfig {
        resend_timeout: Some(Duration::from_millis(timeout_ms)),
        ..VanConfig::default()
    }
}

#[test]
fn clusters_of_every_size_form_with_ps_lite_ids() {
    for (servers, workers) in [(1, 1), (2, 2), (3, 5), (8, 4), (32, 32)] {
        let mut net = Network::cluster(servers, workers, VanConfig::default(), 1);
        assert!(net.form(SECOND * 10), "{servers}+{workers} did not form");
        let mut server_ids: Vec<NodeId> = (1..=servers as usize).map(|i| net.id(i)).collect();
        let mut worker_ids: Vec<NodeId> = (servers as usize + 1..net.nodes.len())
            .map(|i| net.id(i))
            .collect();
        server_ids.sort_unstable();
        worker_ids.sort_unstable();
        assert_eq!(
            server_ids,
            (0..servers).map(ids::server_rank_to_id).collect::<Vec<_>>()
        );
        assert_eq!(
            worker_ids,
            (0..workers).map(ids::worker_rank_to_id).collect::<Vec<_>>()
        );
        for n in &net.nodes {
            // A worker keeps the servers, the scheduler and itself.
            let entries = match n.core.me().role {
                Role::Worker => servers + 2,
                _ => servers + workers + 1,
            };
            assert_eq!(n.core.nodes().len(), entries as usize);
            assert!(n.failures.is_empty());
        }
    }
}

#[test]
fn a_node_waiting_to_join_says_so_every_ten_seconds_then_times_out() {
    let cfg = VanConfig {
        start_timeout: SECOND * 35,
        ..VanConfig::default()
    };
    // A worker whose scheduler never answers.
    let mut net = Network::new(cfg, 2);
    let w = net.add(Role::Worker, 10_000);
    net.register(w);
    assert!(net.nodes[w].core.join_status().is_none());
    net.run_for(SECOND * 34);
    assert_eq!(
        net.nodes[w].waiting,
        vec![Duration::ZERO, SECOND * 10, SECOND * 20, SECOND * 30]
    );
    assert!(net.nodes[w].core.join_status().is_none());
    net.run_for(SECOND * 2);
    match net.nodes[w].core.join_status() {
        Some(Err(crate::VanError::StartTimeout(t))) => {
            assert_eq!(t.waited, SECOND * 35);
            assert_eq!(t.missing_servers, None);
        }
        other => panic!("expected a start timeout, got {other:?}"),
    }
}

#[test]
fn waiting_lines_name_what_they_wait_for() {
    use crate::effects::WaitingFor;
    // The scheduler and the server are up; the worker is late.
    let mut net = Network::cluster(1, 1, VanConfig::default(), 3);
    net.kill(2);
    net.register_all();
    net.run_for(SECOND * 11);
    let scheduler = net.nodes[0].waiting_for.last().cloned().unwrap();
    assert_eq!(
        scheduler,
        WaitingFor::Registrations {
            servers: (0, 1),
            workers: Some((1, 1))
        }
    );
    assert_eq!(scheduler.to_string(), "waiting for 1 worker to register");
    let server = net.nodes[1].waiting_for.last().unwrap().to_string();
    assert_eq!(
        server,
        "waiting for the node table from the scheduler at 127.0.0.1:9000 (sent once 1 server \
         and 1 worker have registered)"
    );
    // Before anyone registered, the scheduler names both roles.
    let none = WaitingFor::Registrations {
        servers: (2, 2),
        workers: Some((1, 3)),
    };
    assert_eq!(
        none.to_string(),
        "waiting for 2 servers and 1 of 3 workers to register"
    );
    let elastic = WaitingFor::Registrations {
        servers: (0, 1),
        workers: None,
    };
    assert_eq!(
        elastic.to_string(),
        "waiting for the first round's workers (DMLC_NUM_WORKER=MIN:MAX) to register"
    );
}

#[test]
fn a_start_timeout_names_identities_heard_before_they_were_assigned() {
    let cfg = VanConfig {
        start_timeout: SECOND * 5,
        ..VanConfig::default()
    };
    let mut net = Network::cluster(1, 1, cfg, 20);
    net.kill(2);
    net.register_all();
    // A squatter holding ps8 on the scheduler's port says something.
    let mut hello = Message::control(Command::Heartbeat, SCHEDULER);
    hello.meta.sender = 8;
    let now = net.now;
    net.nodes[0].core.handle(hello, now);
    net.run_for(SECOND * 6);
    match net.nodes[0].core.join_status() {
        Some(Err(crate::VanError::StartTimeout(t))) => {
            assert_eq!(t.identity_conflicts, vec![8]);
            assert!(t.to_string().contains("possible identity conflict"), "{t}");
        }
        other => panic!("expected a start timeout, got {other:?}"),
    }
}

#[test]
fn a_scheduler_times_out_naming_the_missing_nodes() {
    let cfg = VanConfig {
        start_timeout: SECOND * 5,
        ..VanConfig::default()
    };
    let mut net = Network::cluster(2, 2, cfg, 3);
    net.kill(2);
    net.kill(4);
    net.register_all();
    net.run_for(SECOND * 6);
    match net.nodes[0].core.join_status() {
        Some(Err(crate::VanError::StartTimeout(t))) => {
            assert_eq!((t.missing_servers, t.missing_workers), (Some(1), Some(1)));
        }
        other => panic!("expected a start timeout, got {other:?}"),
    }
}

/// Every live member of `group` enters a barrier; returns (index, token).
fn enter(net: &mut Network, group: i32) -> Vec<(usize, Ticket)> {
    net.members(group)
        .into_iter()
        .map(|i| (i, net.barrier(i, group)))
        .collect()
}

fn all_released(net: &Network, waiters: &[(usize, Ticket)]) -> bool {
    waiters
        .iter()
        .all(|&(i, t)| matches!(net.outcome(i, t), Some(Ok(()))))
}

#[test]
fn barriers_of_all_seven_groups_release_exactly_their_members() {
    let mut net = Network::cluster(2, 3, VanConfig::default(), 4);
    assert!(net.form(SECOND * 5));
    for group in 1..=ALL_GROUP {
        let members = net.members(group);
        let expected = usize::from(group & SCHEDULER_GROUP != 0)
            + if group & SERVER_GROUP != 0 { 2 } else { 0 }
            + if group & WORKER_GROUP != 0 { 3 } else { 0 };
        assert_eq!(members.len(), expected, "group {group}");
        // All but the last enter: nobody is released.
        let mut waiters = Vec::new();
        for &i in &members[..members.len() - 1] {
            waiters.push((i, net.barrier(i, group)));
        }
        net.run_for(SECOND);
        for &(i, t) in &waiters {
            assert!(net.outcome(i, t).is_none(), "group {group} released early");
        }
        let last = members[members.len() - 1];
        waiters.push((last, net.barrier(last, group)));
        assert!(
            net.run_until(SECOND, |n| all_released(n, &waiters)),
            "group {group} not released"
        );
    }
}

#[test]
fn a_restarted_server_takes_its_id_back_and_gets_the_unanswered_requests() {
    let mut net = Network::cluster(2, 1, resend(100), 5);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    let worker = net.index_of(9).unwrap();
    // The server dies with a request in flight.
    net.kill(server);
    let msg = net.request(worker, server, 42);
    net.send(worker, msg);
    net.run_for(SECOND * 2);
    assert!(net.nodes[worker].undeliverable.is_empty());
    net.restart(server);
    net.register(server);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[server].core.is_joined()));
    assert_eq!(net.id(server), 8);
    assert!(net.nodes[server].core.me().is_recovery);
    assert!(net.run_until(SECOND * 10, |n| n.nodes[server]
        .delivered
        .iter()
        .any(|m| m.meta.timestamp == 42)));
}

#[test]
fn without_resend_requests_to_a_restarted_server_fail_instead_of_waiting() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 19);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    let worker = net.index_of(9).unwrap();
    net.kill(server);
    let msg = net.request(worker, server, 5);
    net.send(worker, msg);
    net.restart(server);
    net.register(server);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[worker].peer_dead.contains(&8)));
}

#[test]
fn a_restarted_worker_rejoins_and_barriers_go_on() {
    let mut net = Network::cluster(1, 2, VanConfig::default(), 6);
    assert!(net.form(SECOND * 5));
    let worker = net.index_of(11).unwrap();
    net.kill(worker);
    net.restart(worker);
    net.register(worker);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[worker].core.is_joined()));
    assert_eq!(net.id(worker), 11);
    let waiters = enter(&mut net, ALL_GROUP);
    assert!(net.run_until(SECOND * 5, |n| all_released(n, &waiters)));
}

#[test]
fn a_dead_worker_fails_the_barriers_that_wait_for_it_after_the_recovery_timeout() {
    let mut net = Network::cluster(1, 2, heartbeats(), 7);
    assert!(net.form(SECOND * 5));
    let dead = net.index_of(11).unwrap();
    // Hung (its connections stay open): the heartbeat timeout tells.
    net.pause(dead);
    let waiters = enter(&mut net, ALL_GROUP);
    // Heartbeat timeout (3 s) then recovery timeout (5 s).
    net.run_for(SECOND * 7);
    for &(i, t) in &waiters {
        assert!(net.outcome(i, t).is_none(), "failed before the deadline");
    }
    assert!(net.run_until(SECOND * 3, |n| waiters
        .iter()
        .all(|&(i, t)| n.outcome(i, t).is_some())));
    for &(i, t) in &waiters {
        assert_eq!(
            net.outcome(i, t),
            Some(Err(Failure::PeerDead { id: 11, secs: 5 })),
            "node {}",
            net.id(i)
        );
    }
    // The server learned that node 11 is gone for good; the other worker
    // holds no worker but itself, and hears nothing of it.
    net.run_for(SECOND);
    assert_eq!(net.nodes[net.index_of(8).unwrap()].peer_dead, vec![11]);
    assert!(net.nodes[net.index_of(9).unwrap()].peer_dead.is_empty());
    // A barrier entered later fails at once, too.
    let late = enter(&mut net, WORKER_GROUP);
    assert!(net.run_until(SECOND, |n| late
        .iter()
        .all(|&(i, t)| n.outcome(i, t).is_some())));
}

#[test]
fn a_dead_node_replaced_in_time_does_not_fail_the_barrier() {
    let mut net = Network::cluster(1, 2, heartbeats(), 8);
    assert!(net.form(SECOND * 5));
    let dead = net.index_of(11).unwrap();
    net.kill(dead);
    let mut waiters = enter(&mut net, ALL_GROUP);
    net.run_for(SECOND * 4);
    // A new process on another port takes over the dead id.
    let fresh = net.add(Role::Worker, 20_000);
    net.register(fresh);
    assert!(net.run_until(SECOND * 3, |n| n.nodes[fresh].core.is_joined()));
    assert_eq!(net.id(fresh), 11);
    waiters.push((fresh, net.barrier(fresh, ALL_GROUP)));
    assert!(net.run_until(SECOND * 3, |n| all_released(n, &waiters)));
}

#[test]
fn by_default_only_nodes_that_send_heartbeats_can_be_declared_dead() {
    // Defaults: heartbeats every second, a 10 s timeout for the nodes that
    // send them. Node 1 (a server) behaves like a C++ node: no heartbeats.
    let mut net = Network::cluster(1, 2, VanConfig::default(), 17);
    let cpp = 1;
    let cfg = VanConfig {
        role: Role::Server,
        port: Some(10_000),
        heartbeat_interval: None,
        ..net.config.clone()
    };
    net.nodes[cpp].core = Core::new(&cfg, 10_000, net.now, net.wall(net.now), 1);
    assert!(net.form(SECOND * 5));
    net.run_for(SECOND * 60);
    assert!(net
        .nodes
        .iter()
        .all(|n| n.failures.is_empty() && n.peer_dead.is_empty()));
    // A worker that sends heartbeats and dies is declared dead, and the
    // barriers waiting for it fail after the recovery timeout (30 s).
    let dead = net.index_of(11).unwrap();
    net.kill(dead);
    let waiters = enter(&mut net, ALL_GROUP);
    assert!(net.run_until(SECOND * 45, |n| waiters
        .iter()
        .all(|&(i, t)| n.outcome(i, t).is_some())));
    for &(i, t) in &waiters {
        assert!(
            matches!(
                net.outcome(i, t),
                Some(Err(Failure::PeerDead { id: 11, .. }))
            ),
            "node {}: {:?}",
            net.id(i),
            net.outcome(i, t)
        );
    }
}

#[test]
fn with_default_settings_nodes_fail_promptly_when_the_scheduler_dies() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 18);
    assert!(net.form(SECOND * 5));
    net.run_for(SECOND * 5);
    net.kill(0);
    let killed = net.now;
    assert!(net.run_until(SECOND * 15, |n| n.nodes[1..]
        .iter()
        .all(|n| !n.failures.is_empty())));
    assert!(
        net.now - killed <= SECOND * 12,
        "took {:?}",
        net.now - killed
    );
}

#[test]
fn nodes_fail_when_the_scheduler_falls_silent() {
    let mut net = Network::cluster(1, 1, heartbeats(), 9);
    assert!(net.form(SECOND * 5));
    net.run_for(SECOND * 10);
    assert!(
        net.nodes.iter().all(|n| n.failures.is_empty()),
        "heartbeats keep nodes alive"
    );
    // Stopped, not dead: its connections stay open, only its silence tells.
    // The nodes call it for the recovery timeout (5 s) after the heartbeat
    // timeout (3 s) before they give up.
    net.pause(0);
    net.run_for(SECOND * 7);
    assert!(net.nodes[1..].iter().all(|n| n.failures.is_empty()));
    assert!(net.run_until(SECOND * 3, |n| n.nodes[1..]
        .iter()
        .all(|n| !n.failures.is_empty())));
    for n in &net.nodes[1..] {
        assert!(matches!(
            n.failures[..],
            [Failure::SchedulerLost {
                timeout_secs: 3,
                ..
            }]
        ));
    }
}

#[test]
fn a_killed_scheduler_is_noticed_by_its_closed_connection() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 9);
    assert!(net.form(SECOND * 5));
    net.run_for(SECOND * 3);
    let killed = net.now;
    net.kill(0);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[1..]
        .iter()
        .all(|n| !n.failures.is_empty())));
    let took = net.now - killed;
    assert!(took <= crate::member::LINK_GRACE + SECOND / 10, "{took:?}");
    for n in &net.nodes[1..] {
        assert!(matches!(n.failures[..], [Failure::SchedulerClosed { .. }]));
    }
}

#[test]
fn after_the_last_barrier_the_schedulers_closed_connection_is_no_loss() {
    for finalize in [false, true] {
        let mut net = Network::cluster(1, 1, VanConfig::default(), 9);
        assert!(net.form(SECOND * 5));
        net.run_for(SECOND * 3);
        // Every node finalizes (or not) and passes a barrier over all.
        if finalize {
            for n in &mut net.nodes {
                n.core.finalizing();
            }
        }
        assert!(net.barrier_over_all(SECOND * 2));
        // The scheduler leaves first; the others are slow to stop.
        net.kill(0);
        net.run_for(crate::member::LINK_GRACE * 3);
        for n in &net.nodes[1..] {
            if finalize {
                assert!(n.failures.is_empty(), "{:?}", n.failures);
            } else {
                assert!(matches!(n.failures[..], [Failure::SchedulerClosed { .. }]));
            }
        }
    }
}

#[test]
fn finalizing_nodes_still_notice_a_death_before_the_last_barrier_is_released() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 9);
    assert!(net.form(SECOND * 5));
    // Heartbeats answered: the scheduler is watched.
    net.run_for(SECOND * 3);
    // ps-lite's servers and scheduler finalize at once and wait in the
    // last barrier for the whole job.
    for n in &mut net.nodes {
        n.core.finalizing();
    }
    net.kill(0);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[1..]
        .iter()
        .all(|n| !n.failures.is_empty())));
    for n in &net.nodes[1..] {
        assert!(matches!(n.failures[..], [Failure::SchedulerClosed { .. }]));
    }
}

#[test]
fn a_killed_worker_is_declared_dead_by_its_closed_connection() {
    let mut net = Network::cluster(1, 2, VanConfig::default(), 10);
    assert!(net.form(SECOND * 5));
    net.run_for(SECOND * 3);
    let w = net.index_of(11).unwrap();
    let killed = net.now;
    net.kill(w);
    // Within the grace, the scheduler tells the others; the server gives
    // up on it after the recovery window (the other worker does not hold
    // it: workers keep no other worker).
    let others: Vec<usize> = vec![net.index_of(8).unwrap()];
    assert!(net.run_until(SECOND * 60, |n| others
        .iter()
        .all(|&i| n.nodes[i].peer_dead.contains(&11))));
    assert!(net.nodes[net.index_of(9).unwrap()].peer_dead.is_empty());
    let took = net.now - killed;
    let window = VanConfig::default().recovery_timeout;
    assert!(took <= window + SECOND * 2, "{took:?}");
    assert!(took >= window, "{took:?}");
}

#[test]
fn a_paused_node_keeps_its_connections_and_is_not_declared_dead_by_them() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 11);
    assert!(net.form(SECOND * 5));
    let s = net.index_of(8).unwrap();
    net.pause(s);
    net.run_for(SECOND * 5);
    // Its heartbeats stopped 5 s ago (the timeout is 10 s): not dead yet.
    let w = net.index_of(9).unwrap();
    assert!(net.nodes[w].peer_dead.is_empty());
    net.resume(s);
    net.run_for(SECOND * 40);
    assert!(net
        .nodes
        .iter()
        .all(|n| n.peer_dead.is_empty() && n.failures.is_empty()));
}

/// Sends `count` requests from every worker to every server and checks
/// that each arrives exactly once.
fn exchange(net: &mut Network, count: i32, limit: Duration) {
    let servers: Vec<usize> = net.members(SERVER_GROUP);
    let workers: Vec<usize> = net.members(WORKER_GROUP);
    for &w in &workers {
        for &s in &servers {
            for ts in 0..count {
                let msg = net.request(w, s, ts);
                net.send(w, msg);
            }
        }
    }
    let expected = workers.len() * count as usize;
    let arrived = net.run_until(limit, |n| {
        servers
            .iter()
            .all(|&s| n.nodes[s].delivered.len() >= expected)
    });
    assert!(arrived, "requests lost");
    for &s in &servers {
        let mut seen = HashSet::new();
        for m in &net.nodes[s].delivered {
            assert!(
                seen.insert((m.meta.sender, m.meta.timestamp)),
                "delivered twice: {}",
                crate::describe(m)
            );
        }
        assert_eq!(seen.len(), expected);
    }
}

#[test]
fn resend_delivers_exactly_once_under_loss_duplication_and_reordering() {
    let mut net = Network::cluster(2, 2, resend(50), 10);
    net.faults = Faults {
        drop: 0.2,
        duplicate: 0.2,
        max_delay: Duration::from_millis(30),
    };
    assert!(net.form(SECOND * 30));
    exchange(&mut net, 50, SECOND * 60);
    let waiters = enter(&mut net, ALL_GROUP);
    assert!(net.run_until(SECOND * 30, |n| all_released(n, &waiters)));
}

#[test]
fn the_table_is_acknowledged_on_first_receipt_so_nothing_is_left_to_resend() {
    let mut net = Network::cluster(2, 2, resend(1000), 11);
    assert!(net.form(SECOND * 5));
    let waiters = enter(&mut net, ALL_GROUP);
    assert!(net.run_until(SECOND, |n| all_released(n, &waiters)));
    net.run_for(Duration::from_millis(50));
    for n in &net.nodes {
        assert_eq!(
            n.core.unacknowledged_at_exit(),
            Vec::<String>::new(),
            "{}",
            n.core.me()
        );
    }
}

#[test]
fn peers_that_never_acknowledge_are_not_waited_for_at_exit() {
    // A worker with PS_RESEND=1 and a scheduler without (as a C++ one).
    let mut net = Network::cluster(1, 1, VanConfig::default(), 12);
    let worker = 2;
    let cfg = VanConfig {
        role: Role::Worker,
        port: Some(10_001),
        resend_timeout: Some(SECOND),
        ..net.config.clone()
    };
    net.nodes[worker].core = Core::new(&cfg, 10_001, net.now, net.wall(net.now), 1);
    assert!(net.form(SECOND * 5));
    let waiters = enter(&mut net, ALL_GROUP);
    assert!(net.run_until(SECOND, |n| all_released(n, &waiters)));
    let core = &net.nodes[worker].core;
    assert!(core.unacknowledged_at_exit().is_empty());
}

#[test]
fn forged_node_tables_do_not_end_a_joining_node() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 13);
    let server = 1;
    net.register(server);
    // A stranger claiming the scheduler's identity sends a table without
    // this server, then one from a non-scheduler identity.
    let mut forged = Message::control(Command::AddNode, K_EMPTY);
    let mut other = Node::new(Role::Server, "10.9.9.9", 1);
    other.id = 8;
    forged.meta.control.node = vec![other];
    forged.meta.sender = SCHEDULER;
    forged.meta.timestamp = 0;
    let now = net.now;
    net.nodes[server].core.handle(forged.clone(), now);
    forged.meta.sender = 11;
    net.nodes[server].core.handle(forged, now);
    assert!(net.nodes[server].failures.is_empty());
    assert!(net.nodes[server].core.join_status().is_none());
    // The real cluster still forms.
    assert!(net.form(SECOND * 5));
    assert!(net.nodes.iter().all(|n| n.failures.is_empty()));
}

#[test]
fn terminate_from_the_wire_is_never_obeyed() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 14);
    assert!(net.form(SECOND * 5));
    let mut stop = Message::control(Command::Terminate, 8);
    stop.meta.sender = 8; // even from the node's own identity
    let now = net.now;
    net.nodes[1].core.handle(stop, now);
    let waiters = enter(&mut net, ALL_GROUP);
    assert!(net.run_until(SECOND, |n| all_released(n, &waiters)));
}

#[test]
fn data_is_accepted_only_as_the_roles_allow() {
    let mut net = Network::cluster(2, 2, VanConfig::default(), 15);
    assert!(net.form(SECOND * 5));
    let s8 = net.index_of(8).unwrap();
    let now = net.now;
    // A server sending a KV request to a server, a worker a KV response to
    // a worker: dropped and counted.
    let mut push = net.request(s8, s8, 1);
    push.meta.sender = 10;
    push.meta.sender_key = net.key_of(10);
    net.nodes[s8].core.handle(push, now);
    let w9 = net.index_of(9).unwrap();
    let mut response = net.request(w9, w9, 1);
    response.meta.request = false;
    response.meta.sender = 11;
    response.meta.sender_key = net.key_of(11);
    net.nodes[w9].core.handle(response, now);
    net.flush(s8);
    net.flush(w9);
    assert!(net.nodes[s8].delivered.is_empty() && net.nodes[w9].delivered.is_empty());
    assert_eq!(
        net.nodes[s8].core.rejected() + net.nodes[w9].core.rejected(),
        2
    );
    // The real thing gets through.
    exchange(&mut net, 3, SECOND);
}

#[test]
fn data_before_joining_is_held_within_the_byte_budget() {
    let cfg = VanConfig {
        hold_limit: 4000,
        ..VanConfig::default()
    };
    let mut net = Network::cluster(1, 1, cfg, 16);
    let server = 1;
    let now = net.now;
    let mut big = net.request(2, server, 0);
    big.data = vec![bytes::Bytes::from(vec![0u8; 900])];
    big.meta.sender = 9;
    big.meta.sender_key = Some(net.nodes[2].core.me().key);
    for ts in 0..3 {
        big.meta.timestamp = ts;
        net.nodes[server].core.handle(big.clone(), now);
    }
    // From an id that cannot be a member of a 1 + 1 cluster: dropped.
    big.meta.sender = 13;
    net.nodes[server].core.handle(big, now);
    assert_eq!(
        net.nodes[server].core.rejected(),
        3,
        "a quarter of the budget per sender, and nothing from a stranger"
    );
    assert!(net.form(SECOND * 5));
    assert_eq!(net.nodes[server].delivered.len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random drop/duplicate/reorder/delay schedules over random cluster
    /// sizes: the cluster forms, every barrier releases every member
    /// exactly once (never before the last member entered), and no node
    /// is stuck.
    #[test]
    fn clusters_form_and_barriers_release_once_under_random_faults(
        servers in 1i32..4,
        workers in 1i32..4,
        drop in 0.0f64..0.25,
        duplicate in 0.0f64..0.25,
        delay_ms in 0u64..40,
        seed in any::<u64>(),
        groups in proptest::collection::vec(1i32..=7, 1..4),
    ) {
        let mut net = Network::cluster(servers, workers, resend(40), seed);
        net.faults = Faults { drop, duplicate, max_delay: Duration::from_millis(delay_ms) };
        prop_assert!(net.form(SECOND * 60), "the cluster did not form");
        for group in groups {
            let members = net.members(group);
            let mut waiters = Vec::new();
            for (k, &i) in members.iter().enumerate() {
                waiters.push((i, net.barrier(i, group)));
                if k + 1 < members.len() {
                    net.run_for(Duration::from_millis(delay_ms * 3 + 5));
                    for &(j, t) in &waiters {
                        prop_assert!(net.outcome(j, t).is_none(), "released before all entered");
                    }
                }
            }
            prop_assert!(
                net.run_until(SECOND * 60, |n| all_released(n, &waiters)),
                "group {} not released", group
            );
            for &(i, t) in &waiters {
                net.nodes[i].core.end_wait(t);
            }
        }
        for n in &net.nodes {
            prop_assert!(n.failures.is_empty(), "{:?}", n.failures);
            prop_assert!(n.core.poll_timeout().is_none_or(|t| t > net.now - SECOND));
        }
    }
}

#[test]
fn a_node_stopped_for_15_s_comes_back_and_the_cluster_goes_on() {
    // Default liveness: heartbeats every second, dead after 10 s of
    // silence, 30 s to be replaced.
    let mut net = Network::cluster(1, 1, VanConfig::default(), 12);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    let worker = net.index_of(9).unwrap();
    net.run_for(SECOND * 2);
    net.pause(server);
    // A request waits in the stopped server's socket.
    let msg = net.request(worker, server, 77);
    net.send(worker, msg);
    net.run_for(SECOND * 15);
    assert!(net.nodes[worker].peer_dead.is_empty());
    net.resume(server);
    net.run_for(SECOND * 40);
    for n in &net.nodes {
        assert!(n.failures.is_empty(), "{:?}", n.failures);
        assert!(n.peer_dead.is_empty(), "{:?}", n.peer_dead);
    }
    assert!(net.nodes[server]
        .delivered
        .iter()
        .any(|m| m.meta.timestamp == 77));
    // It is alive in the scheduler's eyes again, and barriers work.
    let waiters = enter(&mut net, ALL_GROUP);
    assert!(net.run_until(SECOND, |n| all_released(n, &waiters)));
}

#[test]
fn a_stopped_node_whose_place_was_taken_is_told_so_and_stops() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 13);
    assert!(net.form(SECOND * 5));
    let old = net.index_of(8).unwrap();
    net.pause(old);
    // A new server process at another address waits to replace the next
    // server that dies; the stopped one is declared dead after 10 s.
    let new = net.add(Role::Server, 20_000);
    net.register(new);
    assert!(net.run_until(SECOND * 15, |n| n.nodes[new].core.is_joined()));
    assert_eq!(net.id(new), 8);
    net.resume(old);
    assert!(net.run_until(SECOND * 5, |n| !n.nodes[old].failures.is_empty()));
    assert!(
        matches!(&net.nodes[old].failures[..], [Failure::Replaced { id: 8, by }] if by.ends_with(":20000")),
        "{:?}",
        net.nodes[old].failures
    );
    // The cluster goes on with the new process.
    net.kill(old);
    let waiters = enter(&mut net, ALL_GROUP);
    assert!(net.run_until(SECOND, |n| all_released(n, &waiters)));
}

/// A server stopped (SIGSTOP) while it waits in the job's last barrier,
/// past the heartbeat timeout, and resumed after the others were released
/// and the scheduler is gone: it is released too and leaves without a
/// failure. Whether the release came before or after the scheduler
/// declared it dead.
#[test]
fn a_server_paused_across_the_last_barrier_release_is_released() {
    for worker_late in [false, true] {
        let mut net = Network::cluster(1, 1, VanConfig::default(), 14);
        assert!(net.form(SECOND * 5));
        net.run_for(SECOND * 3);
        for n in &mut net.nodes {
            n.core.finalizing();
        }
        let server = net.index_of(8).unwrap();
        let worker = net.index_of(9).unwrap();
        let s_wait = net.barrier(server, ALL_GROUP);
        let sched_wait = net.barrier(0, ALL_GROUP);
        net.run_for(SECOND);
        net.pause(server);
        if worker_late {
            // Declared dead first (10 s of silence), then released.
            net.run_for(SECOND * 12);
        }
        let w_wait = net.barrier(worker, ALL_GROUP);
        assert!(
            net.run_until(SECOND * 5, |n| all_released(
                n,
                &[(0, sched_wait), (worker, w_wait)]
            )),
            "worker late: {worker_late}"
        );
        // The scheduler and the worker stop as a finalized job does.
        net.finish(0);
        net.finish(worker);
        net.run_for(SECOND * 20);
        net.kill(0);
        net.kill(worker);
        net.resume(server);
        net.run_for(SECOND * 5);
        assert!(
            matches!(net.outcome(server, s_wait), Some(Ok(()))),
            "worker late: {worker_late}: {:?}, failures {:?}",
            net.outcome(server, s_wait),
            net.nodes[server].failures
        );
    }
}
