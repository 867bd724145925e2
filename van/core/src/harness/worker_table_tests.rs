//! A worker's part of the node table (issue 33): a pslite worker holds the
//! servers, the scheduler and its own process, not the other workers (a
//! C++ worker uses no more), and with that part it pushes and pulls,
//! recovers after a restart, and goes through elastic rounds (joins,
//! leaves, a worker barrier). Servers keep everyone: they answer workers.

use pslite_proto::ids::{SCHEDULER, SERVER_GROUP, WORKER_GROUP};

use super::tests::heartbeats;
use super::*;
use crate::rendezvous::RendezvousConfig;

const SECOND: Duration = Duration::from_secs(1);

/// Every joined worker's table holds exactly the servers, the scheduler
/// and its own entry; every server's holds the whole job (`entries`
/// entries).
fn tables_trimmed(net: &Network, entries: usize) {
    let servers: Vec<NodeId> = net
        .members(SERVER_GROUP)
        .iter()
        .map(|&i| net.id(i))
        .collect();
    for n in net.nodes.iter().filter(|n| n.alive && n.core.is_joined()) {
        let me = n.core.me().id;
        let mut ids: Vec<NodeId> = n.core.nodes().iter().map(|e| e.id).collect();
        ids.sort_unstable();
        match n.core.me().role {
            Role::Worker => {
                let mut want = servers.clone();
                want.extend([SCHEDULER, me]);
                want.sort_unstable();
                assert_eq!(ids, want, "worker {me}'s table");
            }
            Role::Server => assert_eq!(ids.len(), entries, "server {me}'s table"),
            Role::Scheduler => {}
        }
    }
}

/// A push of `value` to key `key` from worker `w` to server `s`, with
/// timestamp `ts`.
fn push(net: &Network, w: usize, s: usize, ts: i32, key: u64, value: i64) -> Message {
    let mut msg = net.request(w, s, ts);
    msg.data = vec![
        bytes::Bytes::from(key.to_le_bytes().to_vec()),
        bytes::Bytes::from(value.to_le_bytes().to_vec()),
    ];
    msg.meta.data_type = vec![
        pslite_proto::DataType::UInt64,
        pslite_proto::DataType::Int64,
    ];
    msg
}

/// Worker `w` pushes `value` to `key` on every server, then pulls it
/// back: the answers arrive and the pulls carry each server's sum, which
/// must be `sum`.
fn push_pull(net: &mut Network, w: usize, ts: i32, key: u64, value: i64, sum: i64) {
    let servers = net.members(SERVER_GROUP);
    let before = net.nodes[w].delivered.len();
    for &s in &servers {
        let msg = push(net, w, s, ts, key, value);
        net.send(w, msg);
    }
    let pushed = before + servers.len();
    assert!(
        net.run_until(SECOND * 5, |n| n.nodes[w].delivered.len() >= pushed),
        "worker {}'s pushes were not answered",
        net.id(w)
    );
    for &s in &servers {
        let mut pull = push(net, w, s, ts + 1, key, 0);
        pull.meta.push = false;
        pull.meta.pull = true;
        pull.data.truncate(1);
        pull.meta.data_type.truncate(1);
        net.send(w, pull);
    }
    let pulled = pushed + servers.len();
    assert!(
        net.run_until(SECOND * 5, |n| n.nodes[w].delivered.len() >= pulled),
        "worker {}'s pulls were not answered",
        net.id(w)
    );
    for answer in &net.nodes[w].delivered[pushed..pulled] {
        let sums = answer.data.get(1).map(|b| app::i64s(b)).unwrap_or_default();
        assert_eq!(sums, vec![sum], "pulled from {}", answer.meta.sender);
    }
}

#[test]
fn a_worker_holds_its_part_of_the_table_pushes_pulls_and_recovers() {
    let mut net = Network::cluster(2, 3, heartbeats(), 33);
    // Indices 1 and 2 are the servers.
    for s in [1, 2] {
        net.nodes[s].app = Some(SumApp::default());
    }
    assert!(net.form(SECOND * 5));
    tables_trimmed(&net, 6);
    let workers = net.members(WORKER_GROUP);
    for (i, &w) in workers.iter().enumerate() {
        push_pull(&mut net, w, 10, 1, 1, i as i64 + 1);
    }

    // A worker's process dies and a new one at its address takes its id
    // again: its table is its part again, and its requests go through.
    let w = workers[1];
    let id = net.id(w);
    net.kill(w);
    net.run_for(SECOND * 2);
    net.restart(w);
    net.nodes[w].delivered.clear();
    net.register(w);
    assert!(net.run_until(SECOND * 10, |n| n.nodes[w].core.is_joined()));
    assert_eq!(net.id(w), id, "it took its id again");
    assert!(net.nodes[w].core.me().is_recovery);
    tables_trimmed(&net, 6);
    push_pull(&mut net, w, 20, 1, 10, 13);
    // A barrier over everyone still completes (the scheduler's).
    assert!(net.barrier_over_all(SECOND * 10));
    assert!(net.nodes.iter().all(|n| n.failures.is_empty()));
}

#[test]
fn a_worker_with_its_part_of_the_table_goes_through_elastic_rounds() {
    let cfg = VanConfig {
        num_servers: 2,
        num_workers: 4,
        elastic: Some(RendezvousConfig {
            min: 1,
            max: 4,
            last_call: SECOND,
            timeout: SECOND * 30,
        }),
        ..heartbeats()
    };
    let mut net = Network::new(cfg, 34);
    net.add(Role::Scheduler, SCHEDULER_PORT);
    for i in 0..2 {
        let s = net.add(Role::Server, 10_000 + i);
        net.nodes[s].app = Some(SumApp::default());
    }
    let a = net.add(Role::Worker, 11_000);
    let b = net.add(Role::Worker, 11_001);
    assert!(net.form(SECOND * 5));
    assert_eq!(net.nodes[a].core.round(), Some((0, vec![9, 11])));
    tables_trimmed(&net, 5);

    // A worker joins at a worker barrier: everyone has round 1 with it.
    let c = net.add(Role::Worker, 11_002);
    net.register(c);
    net.run_for(SECOND / 10);
    let waiters: Vec<(usize, Ticket)> = [a, b]
        .iter()
        .map(|&i| (i, net.barrier(i, WORKER_GROUP)))
        .collect();
    assert!(net.run_until(SECOND * 5, |n| n.nodes[c].core.is_joined()
        && waiters
            .iter()
            .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))));
    for &w in &[a, b, c] {
        assert_eq!(net.nodes[w].core.round(), Some((1, vec![9, 11, 13])));
    }
    tables_trimmed(&net, 6);
    push_pull(&mut net, c, 10, 5, 3, 3);

    // A worker leaves: the others go on in round 2, their tables their part.
    net.leave(a);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[b].core.round()
        == Some((2, vec![11, 13]))
        && n.nodes[c].core.round() == Some((2, vec![11, 13]))));
    net.kill(a);
    net.run_for(SECOND * 2);
    tables_trimmed(&net, 5);
    push_pull(&mut net, b, 30, 5, 4, 7);
    let waiters: Vec<(usize, Ticket)> = [b, c]
        .iter()
        .map(|&i| (i, net.barrier(i, WORKER_GROUP)))
        .collect();
    assert!(net.run_until(SECOND * 5, |n| waiters
        .iter()
        .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))));
    assert!([b, c].iter().all(|&w| net.nodes[w].failures.is_empty()));
}
