//! Back-pressure: a node whose apps stop taking messages stops reading
//! (its packets wait in flight, as in a socket) while its timers go on.
//! Heartbeats keep flowing both ways, nobody is declared dead or lost, and
//! once the apps take messages again everything arrives, in order, once.

use std::collections::HashMap;

use super::tests::heartbeats;
use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// Each worker sends `n` requests to the server (timestamps 0..n).
fn flood(net: &mut Network, server: usize, workers: &[usize], n: i32) {
    for ts in 0..n {
        for &w in workers {
            let msg = net.request(w, server, ts);
            net.send(w, msg);
        }
    }
}

/// The timestamps delivered to node `i`, by sender, in delivery order.
fn delivered_by_sender(net: &Network, i: usize) -> HashMap<NodeId, Vec<i32>> {
    let mut by = HashMap::<NodeId, Vec<i32>>::new();
    for m in &net.nodes[i].delivered {
        by.entry(m.meta.sender).or_default().push(m.meta.timestamp);
    }
    by
}

fn healthy(net: &Network) -> bool {
    net.nodes
        .iter()
        .all(|n| n.failures.is_empty() && n.peer_dead.is_empty() && n.undeliverable.is_empty())
}

#[test]
fn a_customer_that_never_drains_stops_reading_but_heartbeats_flow_and_nobody_dies() {
    let mut net = Network::cluster(1, 2, heartbeats(), 50);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    let workers = [net.index_of(9).unwrap(), net.index_of(11).unwrap()];
    // The server's app takes two messages and never drains.
    net.nodes[server].app_capacity = Some(2);
    flood(&mut net, server, &workers, 5);
    net.run_for(SECOND * 60);
    let core = &net.nodes[server].core;
    assert!(!core.is_listening(), "a full queue stops the reading");
    assert_eq!(net.nodes[server].delivered.len(), 2);
    assert_eq!(core.parked(), 1, "one message waits; the rest stay unread");
    // A minute without reading: the scheduler heard the server's heartbeats
    // all along, and the server did not take the scheduler for lost.
    let now = net.now;
    assert!(net.nodes[0].core.dead_nodes(now, SECOND * 2).is_empty());
    assert!(healthy(&net), "nobody failed or was declared dead");
    // The app drains: every request arrives, in order per sender, once.
    net.give_room(server);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[server].delivered.len() == 10));
    assert!(net.nodes[server].core.is_listening());
    for (sender, ts) in delivered_by_sender(&net, server) {
        assert_eq!(ts, (0..5).collect::<Vec<_>>(), "from node {sender}");
    }
    // Replies the scheduler sent meanwhile were read: still nobody lost.
    net.run_for(SECOND * 30);
    assert!(healthy(&net));
    assert!(net.nodes[0].core.dead_nodes(net.now, SECOND * 2).is_empty());
}

#[test]
fn a_scheduler_that_stops_reading_declares_nobody_dead() {
    let mut net = Network::cluster(1, 1, heartbeats(), 51);
    assert!(net.form(SECOND * 5));
    // The scheduler's app is full (it takes no data at all).
    net.nodes[0].app_capacity = Some(net.nodes[0].delivered.len());
    let server = net.index_of(8).unwrap();
    let mut msg = net.request(server, 0, 1);
    msg.meta.simple_app = true;
    net.send(server, msg);
    net.run_for(SECOND * 30);
    assert!(!net.nodes[0].core.is_listening());
    assert!(healthy(&net));
    net.give_room(0);
    net.run_for(SECOND * 10);
    assert!(net.nodes[0].core.is_listening());
    assert_eq!(net.nodes[0].delivered.len(), 1);
    assert!(healthy(&net), "the silence while deaf counted for nobody");
}

#[test]
fn under_resend_a_deaf_spell_shorter_than_the_resend_window_loses_nothing() {
    let cfg = VanConfig {
        resend_timeout: Some(SECOND),
        ..heartbeats()
    };
    let mut net = Network::cluster(1, 2, cfg, 52);
    assert!(net.form(SECOND * 5));
    let server = net.index_of(8).unwrap();
    let workers = [net.index_of(9).unwrap(), net.index_of(11).unwrap()];
    net.nodes[server].app_capacity = Some(3);
    flood(&mut net, server, &workers, 6);
    net.run_for(SECOND * 20);
    assert!(!net.nodes[server].core.is_listening());
    net.give_room(server);
    assert!(net.run_until(SECOND * 30, |n| n.nodes[server].delivered.len() == 12));
    net.run_for(SECOND * 30);
    // Resent copies that piled up are dropped as duplicates: each once.
    assert_eq!(net.nodes[server].delivered.len(), 12);
    for (sender, ts) in delivered_by_sender(&net, server) {
        assert_eq!(ts, (0..6).collect::<Vec<_>>(), "from node {sender}");
    }
    assert!(healthy(&net));
}
