//! The store through whole clusters of cores in the in-memory network
//! (virtual time): answers across nodes, waits and watches that end with
//! their requester, a C++ scheduler without a store.

use std::time::Duration;

use bytes::Bytes;
use pslite_proto::store::{StoreMsg, StoreOp, StoreStatus};

use super::{Faults, Network};
use crate::{Call, Done, Failure, Ticket, VanConfig};

fn req(op: StoreOp, key: &str) -> StoreMsg {
    StoreMsg::request(op, vec![key.to_string()])
}

fn set(key: &str, value: &str) -> StoreMsg {
    StoreMsg {
        value: Some(Bytes::from(value.to_string())),
        ..req(StoreOp::Set, key)
    }
}

const SECOND: Duration = Duration::from_secs(1);

fn answer(net: &Network, i: usize, ticket: Ticket) -> Option<StoreMsg> {
    match net.answer(i, ticket)? {
        Ok(Done::Store(answer)) => Some(answer),
        _ => None,
    }
}

#[test]
fn adds_under_loss_duplication_and_reordering_count_exactly_once() {
    let cfg = VanConfig {
        resend_timeout: Some(Duration::from_millis(50)),
        ..VanConfig::default()
    };
    let mut net = Network::cluster(1, 4, cfg, 21);
    net.faults = Faults {
        drop: 0.2,
        duplicate: 0.2,
        max_delay: Duration::from_millis(30),
    };
    assert!(net.form(SECOND * 30));
    let mut calls = Vec::new();
    for round in 0..25 {
        for i in 1..net.nodes.len() {
            let mut add = req(StoreOp::Add, "n");
            add.number = 1 + round % 3;
            calls.push((i, net.store(i, add)));
        }
    }
    assert!(net.run_until(SECOND * 60, |n| calls
        .iter()
        .all(|&(i, id)| answer(n, i, id).is_some())));
    let expected: i64 = (0..25).map(|r| (1 + r % 3) * 5).sum();
    let mut sums: Vec<i64> = calls
        .iter()
        .map(|&(i, id)| answer(&net, i, id).map_or(0, |a| a.number))
        .collect();
    sums.sort_unstable();
    sums.dedup();
    assert_eq!(sums.len(), calls.len(), "every add saw its own sum");
    assert_eq!(sums.last().copied(), Some(expected));
}

#[test]
fn get_before_set_returns_at_the_set_and_waits_time_out_on_the_scheduler() {
    let mut net = Network::cluster(1, 2, VanConfig::default(), 22);
    assert!(net.form(SECOND * 5));
    let mut get = req(StoreOp::Get, "k");
    get.timeout = Some(SECOND * 30);
    let g = net.store(2, get);
    let mut wait = req(StoreOp::Wait, "never");
    wait.timeout = Some(SECOND * 2);
    let w = net.store(1, wait);
    net.run_for(SECOND);
    assert!(answer(&net, 2, g).is_none(), "GET waits for the key");
    let s = net.store(3, set("k", "v"));
    assert!(net.run_until(SECOND, |n| answer(n, 2, g).is_some()));
    assert!(answer(&net, 3, s).is_some());
    assert_eq!(
        answer(&net, 2, g).and_then(|a| a.value).as_deref(),
        Some(&b"v"[..])
    );
    assert!(answer(&net, 1, w).is_none());
    assert!(net.run_until(SECOND * 2, |n| answer(n, 1, w).is_some()));
    assert_eq!(
        answer(&net, 1, w).map(|a| a.status),
        Some(StoreStatus::Timeout)
    );
}

#[test]
fn a_waiting_get_fails_when_the_scheduler_is_lost() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 23);
    assert!(net.form(SECOND * 5));
    let mut get = req(StoreOp::Get, "k");
    get.timeout = Some(SECOND * 3600);
    let g = net.store(2, get);
    net.run_for(SECOND);
    net.kill(0);
    assert!(net.run_until(SECOND * 30, |n| n.answer(2, g).is_some()));
    assert!(matches!(
        net.answer(2, g),
        Some(Err(crate::VanError::Failed(
            Failure::SchedulerLost { .. } | Failure::SchedulerClosed { .. }
        )))
    ));
}

fn watches(net: &Network) -> usize {
    net.nodes[0].core.store_watches()
}

#[test]
fn a_dead_or_restarted_watcher_loses_its_watches_and_waits() {
    let cfg = VanConfig {
        heartbeat_interval: Some(SECOND),
        heartbeat_timeout: Some(SECOND * 3),
        ..VanConfig::default()
    };
    let mut net = Network::cluster(1, 3, cfg, 24);
    assert!(net.form(SECOND * 5));
    let (w2, _rx2) = net.store_watch(2, "k");
    let (w3, rx3) = net.store_watch(3, "k");
    let mut get = req(StoreOp::Get, "never");
    get.timeout = Some(SECOND * 3600);
    net.store(2, get);
    assert!(net.run_until(SECOND, |n| answer(n, 2, w2).is_some()
        && answer(n, 3, w3).is_some()));
    assert_eq!((watches(&net), net.nodes[0].core.store_waiting()), (2, 1));

    // Node 2 dies: once the scheduler declares it dead, its watch and
    // its waiting GET are gone; node 3's watch stays.
    net.kill(2);
    assert!(net.run_until(SECOND * 10, |n| watches(n) == 1));
    assert_eq!(net.nodes[0].core.store_waiting(), 0);
    let s = net.store(1, set("k", "v"));
    assert!(net.run_until(SECOND, |n| answer(n, 1, s).is_some()));
    assert!(net.run_until(SECOND, |n| n.nodes[3]
        .store_events
        .iter()
        .any(|(w, e)| *w == rx3 && e.value.as_deref() == Some(&b"v"[..]))));

    // Node 3 restarts (takes its id back): the old process's watch
    // does not carry over to the new one.
    net.restart(3);
    net.register(3);
    assert!(net.run_until(SECOND * 10, |n| watches(n) == 0));
}

#[test]
fn a_leaving_node_unwatches_everything() {
    let mut net = Network::cluster(1, 2, VanConfig::default(), 25);
    assert!(net.form(SECOND * 5));
    let (a, _ra) = net.store_watch(2, "a");
    let (b, _rb) = net.store_watch(2, "b");
    assert!(net.run_until(SECOND, |n| answer(n, 2, a).is_some()
        && answer(n, 2, b).is_some()));
    assert_eq!(watches(&net), 2);
    net.store_leave(2);
    assert!(net.run_until(SECOND, |n| watches(n) == 0));
}

#[test]
fn a_leaving_nodes_unwatch_does_not_hold_up_its_exit() {
    let cfg = VanConfig {
        resend_timeout: Some(Duration::from_millis(100)),
        ..VanConfig::default()
    };
    let mut net = Network::cluster(1, 1, cfg, 26);
    assert!(net.form(SECOND * 5));
    let (w, _rx) = net.store_watch(2, "a");
    assert!(net.run_until(SECOND, |n| answer(n, 2, w).is_some()));
    // The scheduler is gone (stopping too): the UNWATCH is never
    // acknowledged, and the node does not wait for it.
    net.kill(0);
    net.store_leave(2);
    net.run_for(Duration::from_millis(50));
    assert!(
        net.nodes[2].core.unacknowledged_at_exit().is_empty(),
        "{:?}",
        net.nodes[2].core.unacknowledged_at_exit()
    );
}

#[test]
fn a_node_whose_scheduler_is_not_pslite_is_refused_at_once() {
    use pslite_proto::{Command, Message, Node, Role};
    let cfg = VanConfig {
        role: Role::Worker,
        host: "127.0.0.1".into(),
        scheduler_host: "127.0.0.1".into(),
        scheduler_port: 9000,
        ..VanConfig::default()
    };
    let now = std::time::Instant::now();
    let mut core = crate::Core::new(&cfg, 10_001, now, std::time::SystemTime::UNIX_EPOCH, 1);
    core.call(Call::Join { customer: 0 }, None, now)
        .expect("join");
    // The table a C++ scheduler sends: its entries carry no pslite mark.
    let mut server = Node::new(Role::Server, "127.0.0.1", 10_000);
    server.id = 8;
    let mut worker = Node::new(Role::Worker, "127.0.0.1", 10_001);
    worker.id = 9;
    let mut scheduler = Node::new(Role::Scheduler, "127.0.0.1", 9000);
    scheduler.id = pslite_proto::ids::SCHEDULER;
    let mut table = Message::control(Command::AddNode, 9);
    table.meta.control.node = vec![server, worker, scheduler];
    table.meta.sender = pslite_proto::ids::SCHEDULER;
    core.handle(table, now);
    assert!(core.is_joined());
    core.take_output();
    let e = core.call(Call::Store(req(StoreOp::Get, "k")), Some(SECOND), now);
    assert!(matches!(e, Err(crate::VanError::StoreUnsupported)), "{e:?}");
    assert!(
        !core
            .take_output()
            .iter()
            .any(|o| matches!(o, crate::Output::Send(_))),
        "nothing goes to a C++ scheduler"
    );
}
