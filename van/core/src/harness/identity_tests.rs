//! Identities in the in-memory network: a member's ZeroMQ identity carries
//! its process's key between pslite nodes, so a stranger (or an earlier
//! process of a replaced node) that uses a member's id is refused, and
//! forged control messages (node tables, heartbeats with dead nodes,
//! barrier releases, LEAVE) are ignored, while the real cluster goes on.

use pslite_proto::ids::{ALL_GROUP, SCHEDULER};
use pslite_proto::{Command, Node};

use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// Delivers `msg` to node `to` as if it came from identity `ps<sender>`
/// (with `key`, if any); returns the refusal the core reported.
fn inject(
    net: &mut Network,
    to: usize,
    sender: NodeId,
    key: Option<u64>,
    mut msg: Message,
) -> Option<crate::core::IdentityRefused> {
    msg.meta.sender = sender;
    msg.meta.sender_key = key;
    if msg.meta.timestamp == K_EMPTY {
        msg.meta.timestamp = 7;
    }
    let now = net.now;
    let refused = net.nodes[to].core.handle(msg, now);
    net.flush(to);
    refused
}

#[test]
fn pslite_members_present_their_keys_and_the_cluster_works() {
    let mut net = Network::cluster(2, 2, VanConfig::default(), 1);
    assert!(net.form(SECOND * 5));
    for n in &net.nodes {
        let me = n.core.me();
        assert_ne!(me.key, 0);
        // Every table entry carries its process's key.
        for entry in n.core.nodes() {
            let owner = net.nodes.iter().find(|m| m.core.me().id == entry.id);
            assert_eq!(Some(entry.key), owner.map(|m| m.core.me().key));
        }
        // Connections to members present this node's key.
        for (_, identity, key) in n.conns.values() {
            if *identity != K_EMPTY {
                assert_eq!(*key, Some(me.key));
            }
        }
        assert!(n.refused.is_empty(), "{:?}", n.refused);
    }
    assert!(net.barrier_over_all(SECOND * 2));
}

#[test]
fn a_stranger_using_a_members_identity_is_refused_and_logged_once() {
    let mut net = Network::cluster(2, 2, VanConfig::default(), 2);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    // A push "from worker 9": plain identity, then a wrong key.
    for (n, key) in [None, Some(12345), None].into_iter().enumerate() {
        let push = net.request(server, server, 40 + n as i32);
        let refused = inject(&mut net, server, 9, key, push);
        assert_eq!(refused.is_some(), n == 0, "logged once per identity");
    }
    assert!(net.nodes[server].delivered.is_empty());
    // The real worker 9 still gets through.
    let worker = net.index_of(9).unwrap();
    let push = net.request(worker, server, 1);
    net.send(worker, push);
    assert!(net.run_until(SECOND, |n| n.nodes[server].delivered.len() == 1));
}

#[test]
fn forged_control_messages_with_the_schedulers_id_are_ignored_mid_job() {
    let mut net = Network::cluster(2, 2, VanConfig::default(), 3);
    assert!(net.form(SECOND * 5));
    let worker = net.index_of(9).unwrap();
    let before = net.nodes[worker].core.node(8).cloned();
    // A table that moves server 8 to the stranger.
    let mut moved = Node::new(Role::Server, "10.6.6.6", 6666);
    moved.id = 8;
    moved.is_recovery = true;
    moved.pslite = true;
    let mut table = Message::control(Command::AddNode, K_EMPTY);
    table.meta.control.node = vec![moved];
    assert!(inject(&mut net, worker, SCHEDULER, None, table.clone()).is_some());
    assert!(inject(&mut net, worker, SCHEDULER, Some(1), table).is_none());
    assert_eq!(net.nodes[worker].core.node(8).cloned(), before);
    // A heartbeat answer naming every server dead, then a barrier release
    // and a LEAVE.
    let mut hb = Message::control(Command::Heartbeat, K_EMPTY);
    hb.meta.control.dead_nodes = vec![8, 10];
    inject(&mut net, worker, SCHEDULER, None, hb);
    let mut release = Message::control(Command::Barrier, K_EMPTY);
    release.meta.control.barrier_group = ALL_GROUP;
    inject(&mut net, worker, SCHEDULER, None, release);
    inject(
        &mut net,
        worker,
        SCHEDULER,
        None,
        Message::control(Command::Leave, K_EMPTY),
    );
    net.run_for(SECOND * 40);
    assert!(net.nodes[worker].peer_dead.is_empty());
    assert!(net.nodes[worker].failures.is_empty());
    assert!(net.barrier_over_all(SECOND * 2));
}

#[test]
fn a_joining_node_ignores_tables_that_do_not_carry_its_key() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 4);
    let server = 1;
    net.register(server);
    let scheduler_key = net.nodes[0].core.me().key;
    // A well-formed table for this server, as a pslite scheduler would
    // send it, but without the server's own key: from a stranger that
    // presents the scheduler's id with and without some key.
    let mut me = net.nodes[server].core.me().clone();
    me.id = 8;
    me.key = 99;
    let mut scheduler = Node::new(Role::Scheduler, "127.0.0.1", SCHEDULER_PORT);
    scheduler.id = SCHEDULER;
    scheduler.pslite = true;
    scheduler.key = scheduler_key;
    let mut table = Message::control(Command::AddNode, K_EMPTY);
    table.meta.control.node = vec![me, scheduler];
    for key in [None, Some(scheduler_key)] {
        inject(&mut net, server, SCHEDULER, key, table.clone());
        assert!(!net.nodes[server].core.is_joined());
    }
    assert!(net.form(SECOND * 5));
    assert!(net.nodes.iter().all(|n| n.failures.is_empty()));
}

#[test]
fn a_replaced_process_is_refused_by_its_peers() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 5);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    let worker = net.index_of(9).unwrap();
    let old_key = net.nodes[server].core.me().key;
    net.restart(server);
    net.register(server);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[server].core.is_joined()));
    let new_key = net.nodes[server].core.me().key;
    assert_ne!(old_key, new_key);
    // The worker's table has the new process's key: a late response from
    // the old process is refused.
    assert_eq!(net.nodes[worker].core.node(8).map(|n| n.key), Some(new_key));
    let mut late = net.request(server, worker, 3);
    late.meta.request = false;
    assert!(inject(&mut net, worker, 8, Some(old_key), late).is_some());
    assert!(net.nodes[worker].delivered.is_empty());
}

/// Found by replication's packet-fault property test: a late message of a
/// dead process reached the scheduler after a restart at the same address
/// took its place; the LEAVE fencing the old process went to that address,
/// to the replacement, which stopped (and its ranges were lost).
#[test]
fn a_late_message_of_a_dead_process_does_not_fence_its_replacement_at_its_address() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 6);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    let old_key = net.nodes[server].core.me().key;
    net.kill(server);
    net.restart(server);
    net.register(server);
    assert!(net.run_until(SECOND * 40, |n| n.nodes[server].core.is_joined()));
    // A heartbeat the dead process sent before it died arrives late.
    let late = Message::control(Command::Heartbeat, SCHEDULER);
    assert!(inject(&mut net, 0, 8, Some(old_key), late).is_some());
    net.run_for(SECOND);
    assert!(
        net.nodes[server].failures.is_empty(),
        "{:?}",
        net.nodes[server].failures
    );
    assert!(net.barrier_over_all(SECOND));
}

/// Found by replication's packet-fault property test: the scheduler's
/// updates naming a replacement (its key) went to a dead node and stayed
/// in the scheduler's resender; once that node was replaced too, they were
/// resent to the new process, the oldest last (its backoff is the
/// longest), which then took the older key for current and refused the
/// node's messages for good.
#[test]
fn updates_meant_for_a_replaced_process_do_not_reach_its_replacement() {
    let cfg = VanConfig {
        heartbeat_interval: Some(Duration::from_millis(100)),
        heartbeat_timeout: Some(Duration::from_millis(500)),
        resend_timeout: Some(Duration::from_millis(50)),
        max_resends: 1000,
        ..VanConfig::default()
    };
    let mut net = Network::cluster(2, 1, cfg, 8);
    assert!(net.form(SECOND * 5));
    let (a, b) = (net.index_of(8).unwrap(), net.index_of(10).unwrap());
    let worker = net.index_of(9).unwrap();
    net.kill(b);
    // Server 8 is replaced twice while server 10 is dead: both updates
    // wait for 10's acknowledgement.
    for _ in 0..2 {
        net.kill(a);
        net.restart(a);
        net.register(a);
        assert!(net.run_until(SECOND * 40, |n| n.nodes[a].core.is_joined()));
        net.run_for(SECOND);
    }
    net.restart(b);
    net.register(b);
    assert!(net.run_until(SECOND * 40, |n| n.nodes[b].core.is_joined()));
    net.run_for(SECOND * 30);
    let key = net.nodes[a].core.me().key;
    assert_eq!(net.nodes[b].core.node(8).map(|n| n.key), Some(key));
    assert_eq!(net.nodes[worker].core.node(8).map(|n| n.key), Some(key));
}

/// Found by replication's packet-fault property test: an update naming a
/// replacement's key was lost, the node was replaced again, and the first
/// update, resent, arrived after the second: the worker took the older key
/// for current and refused the server's answers for good.
#[test]
fn an_update_older_than_the_entry_it_would_replace_is_ignored() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 9);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    let worker = net.index_of(9).unwrap();
    let old_key = net.nodes[server].core.me().key;
    net.kill(server);
    net.restart(server);
    net.register(server);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[server].core.is_joined()));
    let new_key = net.nodes[server].core.me().key;
    let sched_key = net.key_of(SCHEDULER);
    let entry = net.nodes[worker].core.node(8).cloned().unwrap();
    assert_eq!(entry.key, new_key);
    let update = |key: u64, ts: i32| {
        let mut msg = Message::control(Command::AddNode, 9);
        let mut node = entry.clone();
        node.key = key;
        msg.meta.control.node = vec![node];
        msg.meta.timestamp = ts;
        msg
    };
    inject(
        &mut net,
        worker,
        SCHEDULER,
        sched_key,
        update(new_key, 100_000),
    );
    inject(
        &mut net,
        worker,
        SCHEDULER,
        sched_key,
        update(old_key, 99_999),
    );
    assert_eq!(net.nodes[worker].core.node(8).map(|n| n.key), Some(new_key));
    // A newer one is taken.
    inject(
        &mut net,
        worker,
        SCHEDULER,
        sched_key,
        update(old_key, 100_001),
    );
    assert_eq!(net.nodes[worker].core.node(8).map(|n| n.key), Some(old_key));
}

#[test]
fn status_tables_carry_no_keys() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 6);
    assert!(net.form(SECOND * 5));
    let mut status = Message::control(Command::Status, K_EMPTY);
    status.meta.request = true;
    status.meta.route = Some(bytes::Bytes::from_static(&[0, 0, 0, 0, 7]));
    inject(&mut net, 0, K_EMPTY, None, status);
    let rows = &net.nodes[0]
        .answers
        .last()
        .expect("no answer")
        .1
        .meta
        .status;
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.node.key == 0));
}

/// A STORE request from an admin client on connection `[0, n]`.
fn admin_store(n: u8, req: pslite_proto::store::StoreMsg) -> Message {
    let mut msg = Message::control(Command::Store, K_EMPTY);
    msg.meta.request = true;
    msg.meta.store = Some(Box::new(req));
    msg.meta.route = Some(bytes::Bytes::from(vec![0, 0, 0, 0, n]));
    // Whatever address it names is never used.
    msg.meta.control.node = vec![Node::new(Role::Server, "127.0.0.1", SCHEDULER_PORT + 1)];
    msg
}

#[test]
fn admin_answers_go_back_on_their_connection_within_the_byte_bound() {
    use pslite_proto::store::{StoreLimit, StoreMsg, StoreOp, StoreStatus};
    let cfg = VanConfig {
        store_limits: crate::store::StoreLimits {
            max_total: 10 << 20,
            ..crate::store::StoreLimits::default()
        },
        ..VanConfig::default()
    };
    let mut net = Network::cluster(1, 1, cfg, 7);
    assert!(net.form(SECOND * 5));
    let mut set = StoreMsg::request(StoreOp::Set, vec!["big".into()]);
    set.value = Some(bytes::Bytes::from(vec![7u8; 3 << 20]));
    inject(&mut net, 0, K_EMPTY, None, admin_store(1, set));
    net.read_answers(0);
    // Clients that never read: three 3 MiB answers fit in 10 MiB, the
    // rest are refused, naming the bound, until answers are read.
    for n in 0..5 {
        let get = StoreMsg::request(StoreOp::Get, vec!["big".into()]);
        inject(&mut net, 0, K_EMPTY, None, admin_store(10 + n, get));
    }
    let answers = net.read_answers(0);
    assert_eq!(answers.len(), 5);
    for (n, (route, msg)) in answers.iter().enumerate() {
        assert_eq!(
            &route[..],
            [0, 0, 0, 0, 10 + n as u8],
            "back on its connection"
        );
        let store = msg.meta.store.as_deref().expect("a store answer");
        if n < 3 {
            assert_eq!(store.status, StoreStatus::Ok);
            assert_eq!(store.value.as_ref().map(|v| v.len()), Some(3 << 20));
        } else {
            assert_eq!(store.limit.map(|l| l.which), Some(StoreLimit::Bytes));
        }
    }
    // Read: room again.
    let get = StoreMsg::request(StoreOp::Get, vec!["big".into()]);
    inject(&mut net, 0, K_EMPTY, None, admin_store(20, get));
    let answers = net.read_answers(0);
    assert_eq!(
        answers[0].1.meta.store.as_deref().map(|s| s.status),
        Some(StoreStatus::Ok)
    );
    // The named address was never connected to.
    assert!(!net.nodes[0].conns.keys().any(|&id| id == K_EMPTY));
}

#[test]
fn forged_registrations_before_the_nodes_start_are_refused_and_named() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 8);
    // A stranger registers a server and a worker at addresses where no
    // node listens, before the real ones start.
    for (role, port) in [(Role::Server, 4), (Role::Worker, 5)] {
        let mut reg = Message::control(Command::AddNode, SCHEDULER);
        reg.meta.control.node = vec![Node::new(role, "127.0.0.1", port)];
        inject(&mut net, 0, K_EMPTY, None, reg);
    }
    net.run_for(SECOND);
    // The real ones register while the forged ones are still checked.
    assert!(net.form(SECOND * 10), "the real cluster did not form");
    let ports: Vec<i32> = net.nodes[0].core.nodes().iter().map(|n| n.port).collect();
    assert!(!ports.contains(&4) && !ports.contains(&5), "{ports:?}");
    // A scheduler whose cluster never forms names them in its start error.
    let mut lonely = Network::cluster(1, 1, VanConfig::default(), 9);
    let mut reg = Message::control(Command::AddNode, SCHEDULER);
    reg.meta.control.node = vec![Node::new(Role::Server, "127.0.0.1", 4)];
    inject(&mut lonely, 0, K_EMPTY, None, reg);
    lonely.register(0);
    lonely.run_for(VanConfig::default().start_timeout + SECOND);
    let err = lonely.nodes[0]
        .core
        .join_status()
        .expect("timed out")
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("refused registrations: server at 127.0.0.1:4"),
        "{text}"
    );
    assert!(text.contains("1 of 1 servers"), "{text}");
}

#[test]
fn registrations_presenting_a_members_identity_before_forming_take_no_place() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 10);
    // A stranger that presents member identities (ps8, ps9: no process has
    // an id yet) registers a server and a worker, at addresses where real
    // nodes listen, before those nodes register.
    for (sender, i) in [(8, 1), (9, 2)] {
        let role = if sender == 8 {
            Role::Server
        } else {
            Role::Worker
        };
        let mut reg = Message::control(Command::AddNode, SCHEDULER);
        let node = Node::new(role, net.nodes[i].host.clone(), net.nodes[i].port + 1000);
        reg.meta.control.node = vec![node];
        inject(&mut net, 0, sender, None, reg);
    }
    net.run_for(SECOND);
    assert!(net.form(SECOND * 10), "the real cluster did not form");
    let ports: Vec<i32> = net.nodes[0].core.nodes().iter().map(|n| n.port).collect();
    for i in [1, 2] {
        assert!(ports.contains(&net.nodes[i].port), "{ports:?}");
        assert!(!ports.contains(&(net.nodes[i].port + 1000)), "{ports:?}");
    }
    assert!(net.barrier_over_all(SECOND * 2));
}
