//! The scheduler state machine driven directly: no sockets, no sleeps; time
//! is an `Instant` the test advances.

use super::*;
use crate::effects::{Effect, Effects, Event};
use crate::member::LINK_GRACE;
use crate::rendezvous::RendezvousConfig;
use pslite_proto::ids::{self, SCHEDULER};
use pslite_proto::stats::NodeStatus;
use std::time::Duration;

const HOST: &str = "127.0.0.1";

fn scheduler(num_servers: i32, num_workers: i32, timeout: Option<u64>) -> Scheduler {
    let mut me = Node::new(Role::Scheduler, HOST, 9000);
    me.id = SCHEDULER;
    Scheduler::new(
        SchedulerConfig {
            me,
            van: VanConfig {
                num_servers,
                num_workers,
                heartbeat_timeout: timeout.map(Duration::from_secs),
                heartbeat_interval: None,
                watch_all: true,
                ..VanConfig::default()
            },
        },
        Instant::now(),
    )
}

fn add_node(role: Role, host: &str, port: i32, customer_id: i32) -> Message {
    let mut msg = Message::control(Command::AddNode, SCHEDULER);
    let mut node = Node::new(role, host, port);
    node.customer_id = customer_id;
    msg.meta.control.node.push(node);
    msg
}

fn barrier(sender: NodeId, customer_id: i32, group: i32) -> Message {
    let mut msg = Message::control(Command::Barrier, SCHEDULER);
    msg.meta.sender = sender;
    msg.meta.request = true;
    msg.meta.app_id = 0;
    msg.meta.customer_id = customer_id;
    msg.meta.control.barrier_group = group;
    msg
}

/// The scheduler driven one call at a time, its effects returned.
impl Scheduler {
    fn handle(&mut self, msg: &Message, now: Instant) -> Vec<Effect> {
        let mut fx = Effects::default();
        self.on_message(msg, now, &mut fx);
        fx.take()
    }

    fn tick(&mut self, now: Instant) -> Vec<Effect> {
        let mut fx = Effects::default();
        self.on_tick(now, &mut fx);
        fx.take()
    }
}

fn sends(actions: &[Effect]) -> Vec<&Message> {
    actions
        .iter()
        .filter_map(|a| match a {
            Effect::Send(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn recvers(actions: &[Effect]) -> Vec<NodeId> {
    sends(actions).iter().map(|m| m.meta.recver).collect()
}

/// Registers every (role, host, port, customer) and returns the final actions.
fn form(s: &mut Scheduler, regs: &[(Role, &str, i32, i32)], now: Instant) -> Vec<Effect> {
    let mut last = Vec::new();
    for (i, &(role, host, port, cid)) in regs.iter().enumerate() {
        last = s.handle(&add_node(role, host, port, cid), now);
        if i + 1 < regs.len() {
            assert!(last.is_empty(), "acted before the table was full");
            assert!(!s.is_ready());
        }
    }
    last
}

fn id_of(s: &Scheduler, port: i32) -> NodeId {
    s.nodes().iter().find(|n| n.port == port).unwrap().id
}

#[test]
fn ids_follow_hostname_then_numeric_port() {
    let mut s = scheduler(2, 2, None);
    let now = Instant::now();
    let actions = form(
        &mut s,
        &[
            (Role::Worker, "b.host", 9001, 0),
            (Role::Server, HOST, 10000, 0),
            (Role::Worker, "a.host", 9999, 0),
            (Role::Server, HOST, 9999, 0),
        ],
        now,
    );
    assert!(s.is_ready());
    assert!(matches!(
        actions.last(),
        Some(Effect::Event(Event::Formed(_)))
    ));
    // 9999 < 10000 numerically although "10000" < "9999" as text.
    assert_eq!(id_of(&s, 10000), 10);
    assert_eq!(
        s.nodes()
            .iter()
            .find(|n| n.port == 9999 && n.role == Role::Server)
            .unwrap()
            .id,
        8
    );
    assert_eq!(
        s.nodes()
            .iter()
            .find(|n| n.hostname == "a.host")
            .unwrap()
            .id,
        9
    );
    assert_eq!(
        s.nodes()
            .iter()
            .find(|n| n.hostname == "b.host")
            .unwrap()
            .id,
        11
    );
    assert_eq!(s.missing(), Missing::default());
}

#[test]
fn ids_are_deterministic_whatever_the_arrival_order() {
    let regs = [
        (Role::Server, HOST, 9100, 0),
        (Role::Server, HOST, 9101, 0),
        (Role::Worker, HOST, 9102, 0),
        (Role::Worker, HOST, 9103, 0),
        (Role::Worker, HOST, 9104, 0),
    ];
    let mut reference = None;
    for rotation in 0..regs.len() {
        let mut order = regs.to_vec();
        order.rotate_left(rotation);
        order.swap(0, rotation % 2 + 1);
        let mut s = scheduler(2, 3, None);
        form(&mut s, &order, Instant::now());
        let ids: Vec<_> = regs.iter().map(|r| id_of(&s, r.2)).collect();
        assert_eq!(ids, vec![8, 10, 9, 11, 13]);
        assert_eq!(*reference.get_or_insert(ids.clone()), ids);
    }
}

#[test]
fn table_goes_to_every_process_after_connecting_to_it() {
    let mut s = scheduler(1, 2, None);
    let actions = form(
        &mut s,
        &[
            (Role::Server, HOST, 9001, 0),
            (Role::Worker, HOST, 9002, 0),
            (Role::Worker, HOST, 9003, 0),
        ],
        Instant::now(),
    );
    for id in [8, 9, 11] {
        let connect = actions
            .iter()
            .position(|a| matches!(a, Effect::Connect(n) if n.id == id))
            .unwrap();
        let send = actions
            .iter()
            .position(|a| matches!(a, Effect::Send(m) if m.meta.recver == id))
            .unwrap();
        assert!(connect < send, "node {id}: send before connect");
    }
    let table = sends(&actions)[0];
    assert_eq!(table.meta.control.cmd, Command::AddNode);
    assert!(!table.meta.request);
    let nodes = &table.meta.control.node;
    assert_eq!(nodes.len(), 4);
    let last = nodes.last().unwrap();
    assert_eq!(
        (last.role, last.id, last.port),
        (Role::Scheduler, SCHEDULER, 9000)
    );
}

#[test]
fn missing_counts_per_role() {
    let mut s = scheduler(2, 3, None);
    let now = Instant::now();
    s.handle(&add_node(Role::Worker, HOST, 9001, 0), now);
    s.handle(&add_node(Role::Server, HOST, 9002, 0), now);
    assert_eq!(
        s.missing(),
        Missing {
            servers: 1,
            workers: 2
        }
    );
}

#[test]
fn repeated_and_surplus_registrations_are_dropped() {
    let mut s = scheduler(1, 1, None);
    let now = Instant::now();
    assert!(s
        .handle(&add_node(Role::Server, HOST, 9001, 0), now)
        .is_empty());
    assert!(s
        .handle(&add_node(Role::Server, HOST, 9001, 0), now)
        .is_empty());
    assert!(s
        .handle(&add_node(Role::Server, HOST, 9005, 0), now)
        .is_empty());
    assert_eq!(
        s.missing(),
        Missing {
            servers: 0,
            workers: 1
        }
    );
    let actions = s.handle(&add_node(Role::Worker, HOST, 9002, 0), now);
    assert_eq!(recvers(&actions), vec![8, 9]);
}

#[test]
fn malformed_registrations_are_dropped() {
    let mut s = scheduler(1, 1, None);
    let now = Instant::now();
    let mut two = add_node(Role::Server, HOST, 9001, 0);
    two.meta
        .control
        .node
        .push(Node::new(Role::Worker, HOST, 9002));
    assert!(s.handle(&two, now).is_empty());
    assert!(s
        .handle(&add_node(Role::Scheduler, HOST, 9003, 0), now)
        .is_empty());
    assert!(s
        .handle(&add_node(Role::Server, HOST, 0, 0), now)
        .is_empty());
    assert!(s
        .handle(&add_node(Role::Server, "", 9004, 0), now)
        .is_empty());
    assert_eq!(
        s.missing(),
        Missing {
            servers: 1,
            workers: 1
        }
    );
}

#[test]
fn customers_of_one_process_share_its_id() {
    // One server process, one worker process hosting two worker customers.
    let mut s = scheduler(1, 2, None);
    let actions = form(
        &mut s,
        &[
            (Role::Worker, HOST, 9002, 1),
            (Role::Server, HOST, 9001, 0),
            (Role::Worker, HOST, 9002, 0),
        ],
        Instant::now(),
    );
    let workers: Vec<_> = s
        .nodes()
        .iter()
        .filter(|n| n.role == Role::Worker)
        .collect();
    assert_eq!(workers.len(), 2);
    assert!(workers.iter().all(|n| n.id == 9));
    // One table per process, not per customer.
    assert_eq!(recvers(&actions), vec![8, 9]);

    // A worker barrier counts both customers, then releases the process once.
    assert!(s
        .handle(&barrier(9, 0, ids::WORKER_GROUP), Instant::now())
        .is_empty());
    let release = s.handle(&barrier(9, 1, ids::WORKER_GROUP), Instant::now());
    assert_eq!(recvers(&release), vec![9]);
}

fn formed_1_2_2(timeout: Option<u64>, now: Instant) -> Scheduler {
    let mut s = scheduler(2, 2, timeout);
    form(
        &mut s,
        &[
            (Role::Server, HOST, 9001, 0),
            (Role::Server, HOST, 9002, 0),
            (Role::Worker, HOST, 9003, 0),
            (Role::Worker, HOST, 9004, 0),
        ],
        now,
    );
    s
}

#[test]
fn barrier_releases_the_whole_group_once_everyone_arrived() {
    let now = Instant::now();
    let mut s = formed_1_2_2(None, now);
    for id in [1, 8, 9, 10] {
        assert!(s.handle(&barrier(id, 0, 7), now).is_empty());
        // Arriving twice does not count twice.
        assert!(s.handle(&barrier(id, 0, 7), now).is_empty());
    }
    let release = s.handle(&barrier(11, 0, 7), now);
    assert_eq!(recvers(&release), vec![1, 8, 9, 10, 11]);
    for reply in sends(&release) {
        assert_eq!(reply.meta.control.cmd, Command::Barrier);
        assert!(!reply.meta.request);
        assert_eq!(reply.meta.control.barrier_group, 7);
        assert_eq!(reply.meta.app_id, 0);
    }
    // The round starts over.
    assert!(s.handle(&barrier(1, 0, 7), now).is_empty());
}

#[test]
fn barriers_are_counted_per_group() {
    let now = Instant::now();
    let mut s = formed_1_2_2(None, now);
    assert!(s.handle(&barrier(8, 0, ids::SERVER_GROUP), now).is_empty());
    assert!(s.handle(&barrier(9, 0, ids::WORKER_GROUP), now).is_empty());
    assert!(s.handle(&barrier(9, 0, 6), now).is_empty());
    let servers = s.handle(&barrier(10, 0, ids::SERVER_GROUP), now);
    assert_eq!(recvers(&servers), vec![8, 10]);
    let workers = s.handle(&barrier(11, 0, ids::WORKER_GROUP), now);
    assert_eq!(recvers(&workers), vec![9, 11]);
    for id in [8, 10] {
        assert!(s.handle(&barrier(id, 0, 6), now).is_empty());
    }
    assert_eq!(
        recvers(&s.handle(&barrier(11, 0, 6), now)),
        vec![8, 9, 10, 11]
    );
    // Scheduler with servers.
    assert!(s.handle(&barrier(1, 0, 3), now).is_empty());
    assert!(s.handle(&barrier(8, 0, 3), now).is_empty());
    assert_eq!(recvers(&s.handle(&barrier(10, 0, 3), now)), vec![1, 8, 10]);
}

#[test]
fn bad_barriers_are_dropped() {
    let now = Instant::now();
    let mut s = scheduler(1, 1, None);
    // Before the cluster formed.
    assert!(s.handle(&barrier(8, 0, 7), now).is_empty());
    let mut s = formed_1_2_2(None, now);
    for group in [0, 8, 9, -1, 441_436_800] {
        assert!(s.handle(&barrier(9, 0, group), now).is_empty());
    }
    // A worker in the server group, an unknown node, a reply.
    assert!(s.handle(&barrier(9, 0, ids::SERVER_GROUP), now).is_empty());
    assert!(s.handle(&barrier(13, 0, ids::WORKER_GROUP), now).is_empty());
    assert!(s
        .handle(&barrier(K_EMPTY, 0, ids::WORKER_GROUP), now)
        .is_empty());
    let mut reply = barrier(11, 0, ids::WORKER_GROUP);
    reply.meta.request = false;
    assert!(s.handle(&reply, now).is_empty());
    // None of them counted: the worker group still needs both workers.
    assert!(s.handle(&barrier(9, 0, ids::WORKER_GROUP), now).is_empty());
    assert_eq!(
        recvers(&s.handle(&barrier(11, 0, ids::WORKER_GROUP), now)),
        vec![9, 11]
    );
}

#[test]
fn heartbeats_are_answered_with_the_scheduler_node() {
    let now = Instant::now();
    let mut s = formed_1_2_2(Some(10), now);
    let mut hb = Message::control(Command::Heartbeat, SCHEDULER);
    hb.meta.sender = 9;
    let actions = s.handle(&hb, now);
    let ack = sends(&actions)[0];
    assert_eq!(ack.meta.recver, 9);
    assert_eq!(ack.meta.control.cmd, Command::Heartbeat);
    assert_eq!(ack.meta.control.node[0].id, SCHEDULER);
    hb.meta.sender = 99;
    assert!(s.handle(&hb, now).is_empty());
}

#[test]
fn dead_nodes_follow_the_heartbeat_timeout() {
    let t0 = Instant::now();
    let mut s = formed_1_2_2(Some(10), t0);
    assert!(s.dead_nodes(t0 + Duration::from_secs(5)).is_empty());
    let mut hb = Message::control(Command::Heartbeat, SCHEDULER);
    for id in [9, 10, 11] {
        hb.meta.sender = id;
        s.handle(&hb, t0 + Duration::from_secs(8));
    }
    assert_eq!(s.dead_nodes(t0 + Duration::from_secs(11)), vec![8]);
    // Without a timeout nobody is ever dead.
    let s = formed_1_2_2(None, t0);
    assert!(s.dead_nodes(t0 + Duration::from_secs(100_000)).is_empty());
}

#[test]
fn a_node_without_heartbeats_whose_connection_stays_closed_is_dead() {
    // C++ nodes send no heartbeats by default, and the default timeout
    // watches only nodes that do: a closed connection still tells.
    let t0 = Instant::now();
    let mut s = formed_1_2_2(Some(10), t0);
    s.cfg.van.watch_all = false;
    assert!(s.nodes().iter().all(|n| !n.pslite));
    s.link_down(8, t0 + Duration::from_secs(2));
    // ZeroMQ reconnects to a live process within the grace.
    s.link_down(10, t0 + Duration::from_secs(2));
    s.link_up(10);
    assert!(s.dead_nodes(t0 + Duration::from_secs(2)).is_empty());
    let later = t0 + Duration::from_secs(2) + LINK_GRACE;
    assert_eq!(s.dead_nodes(later), vec![8]);
    assert!(s
        .poll_timeout()
        .is_some_and(|at| at <= later + Duration::from_millis(1)));
    // Silence alone does not kill a node that never sent a heartbeat.
    assert_eq!(s.dead_nodes(t0 + Duration::from_secs(1000)), vec![8]);
    // PS_HEARTBEAT_TIMEOUT=0 turns both off.
    let mut s = formed_1_2_2(None, t0);
    s.link_down(8, t0);
    assert!(s.dead_nodes(t0 + Duration::from_secs(100)).is_empty());
}

#[test]
fn a_new_node_takes_over_a_dead_node_of_its_role() {
    let t0 = Instant::now();
    let mut s = formed_1_2_2(Some(10), t0);
    let t1 = t0 + Duration::from_secs(8);
    let mut hb = Message::control(Command::Heartbeat, SCHEDULER);
    for id in [8, 9, 11] {
        hb.meta.sender = id;
        s.handle(&hb, t1);
    }
    // Server 10 has been silent for more than 10 s at t2.
    let t2 = t0 + Duration::from_secs(12);
    // A worker cannot take a server's place.
    assert!(s
        .handle(&add_node(Role::Worker, HOST, 9500, 0), t2)
        .is_empty());
    let actions = s.handle(&add_node(Role::Server, HOST, 9600, 0), t2);
    // Announced first, then connected to before anything is sent.
    assert_eq!(actions[0], Effect::Event(Event::Replacing(vec![10])));
    assert!(
        matches!(&actions[1], Effect::Connect(n) if n.id == 10 && n.port == 9600 && n.is_recovery)
    );
    let msgs = sends(&actions);
    // The recovered node gets the whole table, the live ones only its entry.
    assert_eq!(msgs[0].meta.recver, 10);
    assert_eq!(msgs[0].meta.control.node.len(), 5);
    let updates: Vec<_> = msgs[1..].iter().map(|m| m.meta.recver).collect();
    assert_eq!(updates, vec![8, 9, 11]);
    for m in &msgs[1..] {
        let [entry] = m.meta.control.node.as_slice() else {
            panic!()
        };
        assert_eq!((entry.id, entry.port, entry.is_recovery), (10, 9600, true));
    }
    assert!(s.dead_nodes(t2).is_empty());
    assert_eq!(id_of(&s, 9600), 10);
}

#[test]
fn a_full_cluster_without_dead_nodes_ignores_new_nodes() {
    let t0 = Instant::now();
    let mut s = formed_1_2_2(Some(10), t0);
    assert!(s
        .handle(&add_node(Role::Server, HOST, 9600, 0), t0)
        .is_empty());
    let mut s = formed_1_2_2(None, t0);
    let later = t0 + Duration::from_secs(1000);
    assert!(s
        .handle(&add_node(Role::Server, HOST, 9600, 0), later)
        .is_empty());
}

#[test]
fn a_process_restarted_on_its_address_recovers_at_once() {
    let t0 = Instant::now();
    let mut s = formed_1_2_2(None, t0);
    let actions = s.handle(&add_node(Role::Worker, HOST, 9004, 0), t0);
    let msgs = sends(&actions);
    assert_eq!(msgs[0].meta.recver, 11);
    assert_eq!(msgs[0].meta.control.node.len(), 5);
    assert_eq!(msgs.len(), 4);
    // It restarts again: another recovery.
    let again = s.handle(&add_node(Role::Worker, HOST, 9004, 0), t0);
    assert_eq!(sends(&again).len(), 4);
}

#[test]
fn a_restarted_node_arriving_early_waits_for_a_death() {
    let t0 = Instant::now();
    let mut s = formed_1_2_2(Some(10), t0);
    // Everyone alive: the new server waits.
    assert!(s
        .handle(&add_node(Role::Server, HOST, 9600, 0), t0)
        .is_empty());
    assert!(s.tick(t0 + Duration::from_secs(5)).is_empty());
    let mut hb = Message::control(Command::Heartbeat, SCHEDULER);
    for id in [10, 9, 11] {
        hb.meta.sender = id;
        s.handle(&hb, t0 + Duration::from_secs(8));
    }
    // Server 8 is dead at 11 s: the waiting node takes its id.
    let actions = s.tick(t0 + Duration::from_secs(11));
    assert_eq!(actions[0], Effect::Event(Event::Replacing(vec![8])));
    assert!(matches!(&actions[1], Effect::Connect(n) if n.id == 8 && n.port == 9600));
    assert_eq!(id_of(&s, 9600), 8);
    assert!(s.tick(t0 + Duration::from_secs(12)).is_empty());
}

#[test]
fn a_recovered_node_still_counts_once_in_a_barrier() {
    let t0 = Instant::now();
    let mut s = formed_1_2_2(None, t0);
    assert!(s.handle(&barrier(9, 0, ids::WORKER_GROUP), t0).is_empty());
    s.handle(&add_node(Role::Worker, HOST, 9003, 0), t0);
    // Worker 9 restarted and arrives again: still one arrival.
    assert!(s.handle(&barrier(9, 0, ids::WORKER_GROUP), t0).is_empty());
    assert_eq!(
        recvers(&s.handle(&barrier(11, 0, ids::WORKER_GROUP), t0)),
        vec![9, 11]
    );
}

/// A STATUS request from an admin client whose connection has routing
/// id `[0, port]` (ZeroMQ generates one per connection).
fn status_request(port: i32) -> Message {
    let mut msg = Message::control(Command::Status, SCHEDULER);
    msg.meta.request = true;
    msg.meta.timestamp = 42;
    msg.meta.route = Some(bytes::Bytes::from(vec![0, port as u8, (port >> 8) as u8]));
    msg
}

/// The status table of the one Reply action a STATUS request produces.
fn answered(actions: &[Effect], port: i32) -> Vec<NodeStatus> {
    let [Effect::Reply(route, msg)] = actions else {
        panic!("expected one Reply, got {actions:?}");
    };
    assert_eq!(&route[..], [0, port as u8, (port >> 8) as u8]);
    assert_eq!(msg.meta.control.cmd, Command::Status);
    assert!(!msg.meta.request);
    assert_eq!(
        msg.meta.timestamp, 42,
        "the answer echoes the request's timestamp"
    );
    msg.meta.status.clone()
}

#[test]
fn status_lists_registrations_before_the_cluster_forms() {
    let mut s = scheduler(1, 1, None);
    let now = Instant::now();
    s.handle(&add_node(Role::Server, HOST, 9100, 0), now);
    let rows = answered(&s.handle(&status_request(7000), now), 7000);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].node.id, SCHEDULER);
    assert_eq!(rows[1].node.port, 9100);
    assert_eq!(rows[1].node.id, K_EMPTY, "no id before the cluster forms");
    assert!(rows[1].last_seen.is_none() && rows[1].counters.is_none());
}

#[test]
fn status_reports_heartbeat_counters_liveness_and_recovery() {
    let mut s = scheduler(1, 1, Some(10));
    let t0 = Instant::now();
    form(
        &mut s,
        &[(Role::Server, HOST, 9100, 0), (Role::Worker, HOST, 9101, 0)],
        t0,
    );
    let (server, worker) = (id_of(&s, 9100), id_of(&s, 9101));
    let mut beat = Message::control(Command::Heartbeat, SCHEDULER);
    beat.meta.sender = worker;
    let counters = NodeCounters {
        resends: 3,
        requests_in_flight: 2,
        ..NodeCounters::default()
    };
    beat.meta.counters = Some(Box::new(counters.clone()));
    s.handle(&beat, t0 + Duration::from_secs(4));

    let t1 = t0 + Duration::from_secs(12);
    let rows = answered(&s.handle(&status_request(7000), t1), 7000);
    let ids: Vec<NodeId> = rows.iter().map(|r| r.node.id).collect();
    assert_eq!(ids, vec![SCHEDULER, server, worker]);
    let (srv, wrk) = (&rows[1], &rows[2]);
    assert!(
        srv.dead,
        "the server sent nothing for 12 s with a 10 s timeout"
    );
    assert_eq!(srv.last_seen, Some(Duration::from_secs(12)));
    assert!(srv.counters.is_none());
    assert!(!wrk.dead);
    assert_eq!(wrk.last_seen, Some(Duration::from_secs(8)));
    assert_eq!(wrk.counters.as_ref(), Some(&counters));
    assert_eq!(wrk.counters_age, Some(Duration::from_secs(8)));

    // A restarted server takes the dead one's id: flagged, counters reset.
    s.handle(&add_node(Role::Server, HOST, 9200, 0), t1);
    let rows = answered(&s.handle(&status_request(7000), t1), 7000);
    assert!(rows[1].node.is_recovery && rows[1].node.port == 9200 && !rows[1].dead);
}

#[test]
fn bad_status_requests_are_dropped() {
    let mut s = scheduler(1, 1, None);
    let now = Instant::now();
    // From a peer with an identity (not an admin client's connection):
    // nothing to answer on, whatever address it names.
    let mut no_route = status_request(7000);
    no_route.meta.route = None;
    no_route.meta.control.node = vec![Node::new(Role::Worker, HOST, 7000)];
    assert!(s.handle(&no_route, now).is_empty());
    let mut reply = status_request(7000);
    reply.meta.request = false;
    assert!(s.handle(&reply, now).is_empty());
}

#[test]
fn elastic_status_gives_round_ranks_and_lists_waiting_workers() {
    let mut me = Node::new(Role::Scheduler, HOST, 9000);
    me.id = SCHEDULER;
    let mut s = Scheduler::new(
        SchedulerConfig {
            me,
            van: VanConfig {
                num_servers: 1,
                num_workers: 2,
                heartbeat_timeout: None,
                heartbeat_interval: None,
                watch_all: true,
                elastic: Some(RendezvousConfig {
                    min: 2,
                    max: 2,
                    last_call: Duration::from_secs(1),
                    timeout: Duration::from_secs(60),
                }),
                ..VanConfig::default()
            },
        },
        Instant::now(),
    );
    let now = Instant::now();
    let pslite = |role, port| {
        let mut msg = add_node(role, HOST, port, 0);
        msg.meta.control.node[0].pslite = true;
        msg
    };
    s.handle(&pslite(Role::Server, 9100), now);
    s.handle(&pslite(Role::Worker, 9201), now);
    s.handle(&pslite(Role::Worker, 9202), now);
    assert_eq!(
        s.round().map(|(n, m)| (n, m.to_vec())),
        Some((0, vec![9, 11]))
    );
    // The round is full (MAX = 2): a third worker waits.
    s.handle(&pslite(Role::Worker, 9203), now);
    assert_eq!(s.waiting_workers(), &[13]);

    let rows = answered(&s.handle(&status_request(7000), now), 7000);
    let summary: Vec<(NodeId, bool, Option<u32>)> = rows
        .iter()
        .map(|r| (r.node.id, r.waiting, r.round_rank))
        .collect();
    assert_eq!(
        summary,
        vec![
            (SCHEDULER, false, None),
            (8, false, None),
            (9, false, Some(0)),
            (11, false, Some(1)),
            (13, true, None),
        ]
    );
    assert_eq!(rows[4].node.port, 9203, "the waiting worker's own entry");
}

#[test]
fn a_pslite_worker_gets_its_part_of_the_table_and_a_cxx_worker_all_of_it() {
    // Four worker entries: a process with two customers has two.
    let mut s = scheduler(2, 4, None);
    let now = Instant::now();
    // Servers 10000 (pslite) and 10001 (C++); workers 11000 (pslite, two
    // customers), 11001 (C++), 11002 (pslite).
    let regs = [
        (Role::Server, 10_000, 0, true),
        (Role::Server, 10_001, 0, false),
        (Role::Worker, 11_000, 0, true),
        (Role::Worker, 11_000, 1, true),
        (Role::Worker, 11_001, 0, false),
        (Role::Worker, 11_002, 0, true),
    ];
    let mut last = Vec::new();
    for (role, port, cid, pslite) in regs {
        let mut msg = add_node(role, HOST, port, cid);
        msg.meta.control.node[0].pslite = pslite;
        last = s.handle(&msg, now);
    }
    assert!(s.is_ready());
    let tables = sends(&last);
    assert_eq!(tables.len(), 5, "one table per process");
    for t in tables {
        let recver = t.meta.recver;
        let entries: Vec<(NodeId, i32)> = t.meta.control.nodes().map(|n| (n.id, n.port)).collect();
        let port = s.nodes().iter().find(|n| n.id == recver).unwrap().port;
        // What a receiver reads: the entries in the frame.
        let read = pslite_proto::Meta::decode(&t.meta.encode())
            .unwrap()
            .control
            .node;
        let read: Vec<(NodeId, i32)> = read.iter().map(|n| (n.id, n.port)).collect();
        assert_eq!(read, entries, "{recver} reads what it was sent");
        // pslite processes share one copy of the entries; C++ ones get theirs.
        let cxx = port == 10_001 || port == 11_001;
        assert_eq!(t.meta.control.shared.is_some(), !cxx, "{recver}");
        if [11_000, 11_002].contains(&port) {
            // The servers, its own entries (both customers), the scheduler.
            let own = entries.iter().filter(|(id, _)| *id == recver).count();
            let want_own = if port == 11_000 { 2 } else { 1 };
            assert_eq!(own, want_own, "{recver}'s own entries: {entries:?}");
            assert_eq!(entries.len(), 2 + want_own + 1, "{recver}: {entries:?}");
            assert!(entries
                .iter()
                .all(|&(id, _)| id == recver || ids::role_of_id(id) != Some(Role::Worker)));
            assert!(entries.iter().any(|e| e.0 == SCHEDULER));
        } else if cxx {
            // C++ nodes: every entry, then the scheduler, as before.
            assert_eq!(entries.len(), 7, "{recver}: {entries:?}");
            assert_eq!(entries.last().map(|e| e.0), Some(SCHEDULER));
        } else {
            // A pslite server: every entry.
            assert_eq!(entries.len(), 7, "{recver}: {entries:?}");
            assert!(entries.iter().any(|e| e.0 == SCHEDULER));
        }
    }
}
