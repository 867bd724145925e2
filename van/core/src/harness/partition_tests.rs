//! Large messages in parts (`PS_PARTITION_BYTES`) through whole clusters of
//! cores in the in-memory network: exactly once and exact under loss,
//! duplication and reordering with `PS_RESEND`, answers in parts, peers
//! that do not reassemble (C++, older pslite) getting whole messages, and
//! nodes whose apps use no priorities sending whole messages.
//! (Requests carry priority -1: a node cuts once its apps use priorities.)

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use pslite_proto::ids::{SERVER_GROUP, WORKER_GROUP};
use pslite_proto::{DataType, Message};

use super::tests::resend;
use super::{Faults, Network, SumApp};
use crate::config::VanConfig;

const SECOND: Duration = Duration::from_secs(1);
const PART: usize = 4096;

/// A push from node `from` to node `to` with timestamp `ts` whose payload
/// (`len` bytes) says who sent it and when.
fn big_request(net: &Network, from: usize, to: usize, ts: i32, len: usize) -> Message {
    let mut msg = net.request(from, to, ts);
    let tag = (net.id(from) as u8) ^ (ts as u8).wrapping_mul(7);
    msg.data = vec![
        Bytes::from(ts.to_le_bytes().to_vec()),
        Bytes::from(
            (0..len)
                .map(|i| (i as u8).wrapping_mul(13) ^ tag)
                .collect::<Vec<u8>>(),
        ),
    ];
    msg.meta.data_type = vec![DataType::Int32, DataType::UInt8];
    msg.meta.priority = -1;
    msg
}

fn parted(cfg: VanConfig) -> VanConfig {
    VanConfig {
        partition_bytes: PART,
        ..cfg
    }
}

/// Every worker sends `count` requests of `len` bytes to every server;
/// returns once every server has delivered each exactly once, checking
/// every byte.
fn exchange_big(net: &mut Network, count: i32, len: usize, limit: Duration) {
    let servers = net.members(SERVER_GROUP);
    let workers = net.members(WORKER_GROUP);
    let mut sent = Vec::new();
    for &w in &workers {
        for &s in &servers {
            for ts in 0..count {
                let msg = big_request(net, w, s, ts, len);
                sent.push((s, msg.clone()));
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
            assert!(m.meta.partition.is_none(), "a part delivered");
            let original = sent
                .iter()
                .find(|(to, o)| {
                    *to == s
                        && o.meta.sender == m.meta.sender
                        && o.meta.timestamp == m.meta.timestamp
                })
                .map(|(_, o)| o)
                .expect("delivered a message nobody sent");
            assert_eq!(m.data, original.data, "{}", crate::describe(m));
            assert_eq!(m.meta.data_type, original.meta.data_type);
        }
        assert_eq!(seen.len(), expected);
    }
}

#[test]
fn parts_arrive_whole_and_exactly_once_under_loss_duplication_and_reordering() {
    let mut net = Network::cluster(2, 2, parted(resend(50)), 40);
    net.faults = Faults {
        drop: 0.2,
        duplicate: 0.2,
        max_delay: Duration::from_millis(30),
    };
    assert!(net.form(SECOND * 30));
    // 20 000 bytes: 5 parts each, every one at risk.
    exchange_big(&mut net, 20, 20_000, SECOND * 120);
    let parts: usize = net.parts_sent_to.values().sum();
    assert!(parts >= 2 * 2 * 20 * 5, "{parts} parts on the wire");
}

#[test]
fn parts_arrive_whole_without_resend() {
    let mut net = Network::cluster(1, 2, parted(VanConfig::default()), 41);
    assert!(net.form(SECOND * 5));
    exchange_big(&mut net, 10, 3 * PART + 17, SECOND * 10);
}

#[test]
fn answers_in_parts_come_back_whole() {
    let mut net = Network::cluster(1, 1, parted(resend(50)), 42);
    net.faults = Faults {
        drop: 0.1,
        duplicate: 0.1,
        max_delay: Duration::from_millis(10),
    };
    assert!(net.form(SECOND * 30));
    let (server, worker) = (1, 2);
    net.nodes[server].app = Some(SumApp::default());
    // 3000 keys, 2 values pushed each: 48 KB requests, and a pull's answer
    // of keys and sums as large.
    let keys: Vec<u64> = (0..3000).map(|k| k * 5 + 1).collect();
    let key_bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
    for (ts, value) in [(0, 3i64), (1, 4)] {
        let mut push = net.request(worker, server, ts);
        push.data = vec![
            Bytes::from(key_bytes.clone()),
            Bytes::from(
                keys.iter()
                    .flat_map(|k| (*k as i64 * value).to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        ];
        push.meta.data_type = vec![DataType::UInt64, DataType::Int64];
        push.meta.priority = -1;
        net.send(worker, push);
    }
    let mut pull = net.request(worker, server, 2);
    pull.meta.push = false;
    pull.meta.pull = true;
    pull.data = vec![Bytes::from(key_bytes.clone())];
    pull.meta.data_type = vec![DataType::UInt64];
    pull.meta.priority = -1;
    // The pull goes after both pushes are answered (as a worker would).
    assert!(net.run_until(SECOND * 60, |n| n.nodes[worker].delivered.len() >= 2));
    net.send(worker, pull);
    let answered = net.run_until(SECOND * 60, |n| {
        n.nodes[worker]
            .delivered
            .iter()
            .any(|m| m.meta.timestamp == 2)
    });
    assert!(answered, "no answer to the pull");
    let answers: Vec<&Message> = net.nodes[worker]
        .delivered
        .iter()
        .filter(|m| m.meta.timestamp == 2)
        .collect();
    assert_eq!(answers.len(), 1, "one answer");
    let answer = answers[0];
    assert_eq!(answer.data[0], Bytes::from(key_bytes));
    let sums: Vec<i64> = answer.data[1]
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<i64> = keys.iter().map(|k| *k as i64 * 7).collect();
    assert_eq!(sums, want);
    assert!(net.parts_sent_to.get(&worker).copied().unwrap_or(0) >= 12);
    assert!(net.parts_sent_to.get(&server).copied().unwrap_or(0) >= 24);
}

#[test]
fn peers_that_do_not_reassemble_get_whole_messages() {
    let mut net = Network::cluster(2, 1, parted(VanConfig::default()), 43);
    // Server 1 advertises nothing, as a C++ node (or an older pslite one).
    net.nodes[1].core.set_features(0);
    assert!(net.form(SECOND * 5));
    exchange_big(&mut net, 5, 5 * PART, SECOND * 10);
    assert_eq!(net.parts_sent_to.get(&1), None, "a part reached server 1");
    assert!(net.parts_sent_to.get(&2).copied().unwrap_or(0) >= 25);
}

#[test]
fn partition_off_sends_whole_messages() {
    let mut net = Network::cluster(
        1,
        1,
        VanConfig {
            partition_bytes: 0,
            ..VanConfig::default()
        },
        44,
    );
    assert!(net.form(SECOND * 5));
    exchange_big(&mut net, 3, 10 * PART, SECOND * 10);
    assert!(net.parts_sent_to.is_empty());
}

#[test]
fn without_priorities_messages_go_whole() {
    let mut net = Network::cluster(1, 2, parted(VanConfig::default()), 45);
    assert!(net.form(SECOND * 5));
    let (server, worker) = (1, 2);
    // Equal priorities: first come first served, parts would gain nothing.
    for ts in 0..3 {
        let mut msg = big_request(&net, worker, server, ts, 10 * PART);
        msg.meta.priority = 0;
        net.send(worker, msg);
    }
    assert!(net.run_until(SECOND * 10, |n| n.nodes[server].delivered.len() >= 3));
    assert!(net.parts_sent_to.is_empty(), "{:?}", net.parts_sent_to);
    // The first request of another priority: from then on, large ones are
    // cut (priority 0 ones too: they may be the bulk a later one passes).
    net.send(worker, big_request(&net, worker, server, 3, 10 * PART));
    let mut last = big_request(&net, worker, server, 4, 10 * PART);
    last.meta.priority = 0;
    net.send(worker, last);
    assert!(net.run_until(SECOND * 10, |n| n.nodes[server].delivered.len() >= 5));
    // 11 parts each (10 parts of values, and the timestamp frame's 4 bytes).
    assert_eq!(net.parts_sent_to.get(&server).copied(), Some(22));
}

/// The receiver's bound on one sender's incomplete messages
/// (`PS_HOLD_LIMIT / 4`): the harness hands parts to the network in order,
/// message after message, and the network delays each by up to 30 ms, so
/// parts of several messages arrive interleaved and the server refuses the
/// ones that would begin beyond the bound; unacknowledged, they come again
/// (`PS_RESEND`) and are taken once the earlier messages completed: every
/// request is delivered exactly once and exact.
#[test]
fn messages_beyond_the_hold_limit_come_again_and_are_taken() {
    // 2.5 messages of 20 000 bytes per sender.
    let cfg = VanConfig {
        hold_limit: 4 * 50_000,
        ..parted(resend(50))
    };
    let mut net = Network::cluster(1, 1, cfg, 46);
    net.faults = Faults {
        drop: 0.0,
        duplicate: 0.0,
        max_delay: Duration::from_millis(30),
    };
    assert!(net.form(SECOND * 30));
    exchange_big(&mut net, 20, 20_000, SECOND * 120);
    let server = net.members(SERVER_GROUP)[0];
    let c = net.nodes[server].core.counters().snapshot(net.now);
    assert!(c.dropped_hold_limit > 0, "no part was refused: {c:?}");
    assert_eq!(c.dropped_malformed, 0);
}

/// One message larger than the receiver's bound goes (its sender's first
/// incomplete message is always taken), also under loss.
#[test]
fn a_message_larger_than_the_hold_limit_is_taken() {
    let cfg = VanConfig {
        hold_limit: 4 * 10_000,
        ..parted(resend(50))
    };
    let mut net = Network::cluster(1, 1, cfg, 47);
    net.faults = Faults {
        drop: 0.1,
        duplicate: 0.1,
        max_delay: Duration::from_millis(5),
    };
    assert!(net.form(SECOND * 30));
    exchange_big(&mut net, 3, 25 * PART, SECOND * 120);
}

/// Parts from anyone but a member through the identity the node table
/// names (issue 43): no ps<id> identity, an id no member has, a member's id
/// without its key. However large the messages they announce, the server
/// holds nothing for them (each dropped as from an unknown peer, before
/// anything is allocated), and the members' large messages in parts still
/// go through exact.
#[test]
fn strangers_parts_are_never_held() {
    let mut net = Network::cluster(1, 2, parted(resend(50)), 48);
    assert!(net.form(SECOND * 30));
    let server = net.members(SERVER_GROUP)[0];
    let worker = net.members(WORKER_GROUP)[0];
    let (worker_id, worker_key) = (net.id(worker), net.key_of(net.id(worker)));
    let strangers = [
        (pslite_proto::K_EMPTY, None),
        (13, None),
        (1001, Some(7)),
        (worker_id, None),
        (worker_id, worker_key.map(|k| k ^ 1)),
    ];
    let before = net.nodes[server].core.counters().snapshot(net.now);
    for (n, &(sender, key)) in strangers.iter().enumerate() {
        for id in 0..20u64 {
            // Part 0 of a 1 GiB message, and all but the last of a 64 KiB one.
            let mut huge = big_request(&net, worker, server, 100 + id as i32, PART);
            huge.meta.partition = Some(Box::new(pslite_proto::partition::Partition {
                id: 1_000_000 + id + 100 * n as u64,
                index: 0,
                count: 1 << 18,
                total: 1 << 30,
                offset: 0,
                frames: vec![4, (1 << 30) - 4],
            }));
            huge.data = vec![Bytes::from(vec![0u8; PART])];
            let small = big_request(&net, worker, server, 200 + id as i32, 16 * PART);
            let mut parts = crate::partition::Partitioner::new(PART, 5_000_000 + id).split(small);
            parts.pop();
            for mut m in std::iter::once(huge).chain(parts) {
                m.meta.sender = sender;
                m.meta.sender_key = key;
                let now = net.now;
                net.nodes[server].core.handle(m, now);
                net.flush(server);
            }
        }
    }
    let c = net.nodes[server].core.counters().snapshot(net.now);
    assert_eq!(net.nodes[server].core.held_for_peers(), (0, 0));
    assert!(
        c.dropped_unknown_peer >= before.dropped_unknown_peer + 5 * 20 * 17,
        "{c:?}"
    );
    assert!(net.nodes[server].delivered.is_empty());
    // The members' own messages in parts still go through, exact.
    exchange_big(&mut net, 5, 10 * PART, SECOND * 60);
    assert_eq!(net.nodes[server].core.held_for_peers(), (0, 0));
    let _ = worker_key;
}
