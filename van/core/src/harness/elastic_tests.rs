//! Elastic worker rounds (`DMLC_NUM_WORKER=MIN:MAX`) on whole clusters of
//! cores in the in-memory network, with virtual time: the first round at
//! MAX or at MIN plus the last call, joiners admitted at a barrier, deaths
//! re-ranking the survivors, barriers counting the round, the job failing
//! below MIN, and a random schedule of joins and deaths.

use proptest::prelude::*;
use pslite_proto::ids::{ALL_GROUP, SCHEDULER, WORKER_GROUP};
use pslite_proto::Command;

use super::*;
use crate::rendezvous::RendezvousConfig;

const SECOND: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// A scheduler and `servers` servers (indices 0, 1..=servers) of an
/// elastic job with MIN:MAX workers; no worker yet; everyone registered.
fn elastic(servers: i32, min: usize, max: usize, seed: u64) -> Network {
    elastic_with(servers, min, max, seed, |_| {})
}

/// [`elastic`] with the configuration changed by `edit`.
fn elastic_with(
    servers: i32,
    min: usize,
    max: usize,
    seed: u64,
    edit: impl FnOnce(&mut VanConfig),
) -> Network {
    let mut cfg = VanConfig {
        num_servers: servers,
        num_workers: max as i32,
        elastic: Some(RendezvousConfig {
            min,
            max,
            last_call: SECOND * 2,
            timeout: SECOND * 10,
        }),
        heartbeat_interval: Some(SECOND),
        heartbeat_timeout: Some(SECOND * 3),
        watch_all: true,
        recovery_timeout: SECOND * 5,
        ..VanConfig::default()
    };
    edit(&mut cfg);
    let mut net = Network::new(cfg, seed);
    net.add(Role::Scheduler, SCHEDULER_PORT);
    for i in 0..servers {
        net.add(Role::Server, 10_000 + i);
    }
    net.register_all();
    net
}

/// A new worker registers; returns its index. It registers 10 ms after
/// the previous one, so the join order is the call order.
fn join(net: &mut Network) -> usize {
    let port = 11_000 + net.nodes.len() as i32;
    let w = net.add(Role::Worker, port);
    net.register(w);
    net.run_for(MS * 10);
    w
}

/// Every live joined node sees round `number` with `members`.
fn everyone_in(net: &Network, number: u64, members: &[NodeId]) -> bool {
    net.nodes
        .iter()
        .filter(|n| n.alive && n.core.is_joined())
        .all(|n| n.core.round() == Some((number, members.to_vec())))
}

#[test]
fn the_first_round_begins_at_once_with_max_workers() {
    let mut net = elastic(1, 2, 3, 1);
    let ws: Vec<usize> = (0..3).map(|_| join(&mut net)).collect();
    assert!(
        net.run_until(SECOND, Network::all_joined),
        "no last call at MAX"
    );
    let ids: Vec<NodeId> = ws.iter().map(|&w| net.id(w)).collect();
    assert_eq!(ids, vec![9, 11, 13], "worker ids in join order");
    assert!(everyone_in(&net, 0, &ids));
    assert_eq!(net.id(1), 8);
    for &w in &ws {
        assert_eq!(net.nodes[w].core.joined_round(), Some(0));
        assert_eq!(net.nodes[w].rounds, vec![(0, ids.clone())]);
    }
    // The table holds the servers, the round's workers and the scheduler.
    assert_eq!(net.nodes[1].core.nodes().len(), 5);
}

#[test]
fn with_min_workers_the_first_round_begins_after_the_last_call() {
    let mut net = elastic(1, 2, 4, 2);
    let a = join(&mut net);
    let b = join(&mut net);
    net.run_for(SECOND);
    let c = join(&mut net); // during the last call: in the first round
    assert!(!net.all_joined(), "the last call (2 s) has not passed");
    assert!(net.run_until(SECOND * 2, Network::all_joined));
    let ids = vec![net.id(a), net.id(b), net.id(c)];
    assert_eq!(ids, vec![9, 11, 13]);
    assert!(everyone_in(&net, 0, &ids));
}

/// A 1-server job with workers 9 and 11 in round 0.
fn two_running(seed: u64, min: usize, max: usize) -> (Network, usize, usize) {
    let mut net = elastic(1, min, max, seed);
    let a = join(&mut net);
    let b = join(&mut net);
    assert!(net.run_until(SECOND * 3, Network::all_joined));
    assert!(everyone_in(&net, 0, &[9, 11]));
    (net, a, b)
}

#[test]
fn a_joiner_waits_and_is_admitted_when_a_worker_barrier_completes() {
    let (mut net, a, b) = two_running(3, 2, 4);
    let c = join(&mut net);
    net.run_for(SECOND * 5);
    assert!(
        !net.nodes[c].core.is_joined(),
        "a round runs: the joiner waits"
    );
    assert_eq!(net.nodes[0].core.round().map(|r| r.0), Some(0));
    let ta = net.barrier(a, WORKER_GROUP);
    net.run_for(SECOND);
    assert!(net.outcome(a, ta).is_none(), "b has not arrived");
    assert!(!net.nodes[c].core.is_joined());
    let tb = net.barrier(b, WORKER_GROUP);
    assert!(net.run_until(SECOND, |n| n.nodes[c].core.is_joined()
        && matches!(n.outcome(a, ta), Some(Ok(())))
        && matches!(n.outcome(b, tb), Some(Ok(())))));
    let ids = vec![9, 11, 13];
    assert_eq!(net.id(c), 13);
    assert!(
        everyone_in(&net, 1, &ids),
        "the release comes with the new round"
    );
    assert_eq!(net.nodes[c].core.joined_round(), Some(1));
    assert_eq!(
        net.nodes[a].rounds,
        vec![(0, vec![9, 11]), (1, ids.clone())]
    );
    // The server takes the newcomer's data; the next barrier counts three.
    let push = net.request(c, 1, 7);
    net.send(c, push);
    assert!(net.run_until(SECOND, |n| n.nodes[1].delivered.len() == 1));
    let t: Vec<(usize, Ticket)> = [a, b]
        .iter()
        .map(|&i| (i, net.barrier(i, WORKER_GROUP)))
        .collect();
    net.run_for(SECOND);
    assert!(
        t.iter().all(|&(i, t)| net.outcome(i, t).is_none()),
        "c is a member now"
    );
    let tc = net.barrier(c, WORKER_GROUP);
    assert!(net.run_until(SECOND, |n| {
        t.iter()
            .chain(&[(c, tc)])
            .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))
    }));
}

#[test]
fn a_dead_member_ends_the_round_and_a_pending_barrier_releases_the_survivors() {
    let mut net = elastic(1, 2, 3, 4);
    let ws: Vec<usize> = (0..3).map(|_| join(&mut net)).collect();
    assert!(net.run_until(SECOND, Network::all_joined));
    let (a, b, c) = (ws[0], ws[1], ws[2]);
    let ta = net.barrier(a, ALL_GROUP);
    let tc = net.barrier(c, ALL_GROUP);
    let ts = net.barrier(1, ALL_GROUP);
    let t0 = net.barrier(0, ALL_GROUP);
    net.run_for(SECOND);
    assert!(net.outcome(a, ta).is_none(), "b has not arrived");
    net.kill(b);
    let waiters = [(a, ta), (c, tc), (1, ts), (0, t0)];
    assert!(net.run_until(SECOND * 6, |n| waiters
        .iter()
        .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))));
    assert!(everyone_in(&net, 1, &[9, 13]), "the survivors, re-ranked");
    assert_eq!(net.nodes[c].core.round().map(|r| r.1[1]), Some(13));
    // The dead worker is out of the table: nobody takes its data.
    assert!(!net.nodes[1].core.nodes().iter().any(|n| n.id == 11));
}

#[test]
fn barriers_count_the_rounds_members_not_max() {
    let (mut net, _, _) = two_running(5, 2, 4);
    let waiters: Vec<(usize, Ticket)> = net
        .members(ALL_GROUP)
        .into_iter()
        .map(|i| (i, net.barrier(i, ALL_GROUP)))
        .collect();
    assert_eq!(waiters.len(), 4, "scheduler, server, two workers");
    assert!(net.run_until(SECOND, |n| waiters
        .iter()
        .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))));
}

fn rendezvous_failed(f: &Failure) -> Option<(usize, usize, u64)> {
    match *f {
        Failure::RendezvousFailed {
            have,
            min,
            waited_secs,
        } => Some((have, min, waited_secs)),
        _ => None,
    }
}

#[test]
fn below_min_the_job_fails_at_the_deadline_on_every_node() {
    let mut net = elastic(1, 2, 4, 6);
    let w = join(&mut net);
    net.run_for(SECOND * 9);
    assert!(net.nodes.iter().all(|n| n.failures.is_empty()));
    assert!(net.nodes[w].core.join_status().is_none(), "still waiting");
    net.run_for(SECOND * 2);
    for i in [0, 1, w] {
        let failures = &net.nodes[i].failures;
        assert_eq!(failures.len(), 1, "node {i}: {failures:?}");
        assert_eq!(
            rendezvous_failed(&failures[0]),
            Some((1, 2, 10)),
            "node {i}"
        );
    }
    match net.nodes[w].core.join_status() {
        Some(Err(e)) => assert!(e.to_string().contains("elastic rendezvous failed"), "{e}"),
        other => panic!("expected the failure, got {other:?}"),
    }
    // A worker arriving afterwards is told at once.
    let late = join(&mut net);
    net.run_for(SECOND);
    assert_eq!(net.nodes[late].failures.len(), 1);
}

#[test]
fn a_death_below_min_fails_the_job_after_the_timeout_unless_someone_joins() {
    let (mut net, a, b) = two_running(7, 2, 4);
    net.kill(b);
    net.run_for(SECOND * 8);
    assert!(net.nodes[a].failures.is_empty(), "within the timeout");
    // A joiner in time: the next round begins at once (no last call).
    let c = join(&mut net);
    assert!(net.run_until(SECOND, |n| n.nodes[c].core.is_joined()));
    assert!(everyone_in(&net, 1, &[9, 13]));
    // Again, and nobody comes: failed 10 s after the death is noticed.
    net.kill(c);
    assert!(net.run_until(SECOND * 20, |n| !n.nodes[a].failures.is_empty()));
    assert_eq!(
        rendezvous_failed(&net.nodes[a].failures[0]).map(|f| (f.0, f.1)),
        Some((1, 2))
    );
    assert_eq!(net.nodes[1].failures.len(), 1, "the server is told too");
}

#[test]
fn a_leaving_worker_ends_the_round_at_once() {
    let mut net = elastic(1, 1, 3, 8);
    let a = join(&mut net);
    let b = join(&mut net);
    assert!(net.run_until(SECOND * 3, Network::all_joined));
    let now = net.now;
    net.nodes[b].core.leave(now);
    net.flush(b);
    net.kill(b);
    assert!(net.run_until(SECOND / 2, |n| everyone_in(n, 1, &[9])));
    assert_eq!(net.nodes[a].core.round(), Some((1, vec![9])));
}

#[test]
fn a_newcomers_data_that_beats_the_table_to_a_server_is_held_until_it() {
    let (mut net, _, _) = two_running(9, 2, 4);
    let c = join(&mut net);
    let mut push = net.request(2, 1, 5);
    push.meta.sender = 13; // not in the server's table yet
    push.meta.sender_key = Some(net.nodes[c].core.me().key);
    let now = net.now;
    net.nodes[1].core.handle(push, now);
    net.flush(1);
    assert!(net.nodes[1].delivered.is_empty());
    let t: Vec<(usize, Ticket)> = [2, 3]
        .iter()
        .map(|&i| (i, net.barrier(i, WORKER_GROUP)))
        .collect();
    assert!(net.run_until(SECOND, |n| n.nodes[c].core.is_joined()));
    assert_eq!(net.nodes[1].delivered.len(), 1, "delivered with the table");
    assert!(t
        .iter()
        .all(|&(i, t)| matches!(net.outcome(i, t), Some(Ok(())))));
}

#[test]
fn a_plain_number_sends_no_round_and_no_leave() {
    let mut net = Network::cluster(1, 2, VanConfig::default(), 10);
    assert!(net.form(SECOND));
    for n in &net.nodes {
        assert_eq!(n.core.round(), None);
        assert!(n.rounds.is_empty());
    }
    // A LEAVE sent to a plain scheduler is logged and dropped.
    let mut leave = Message::control(Command::Leave, SCHEDULER);
    leave.meta.sender = net.id(2);
    let now = net.now;
    net.nodes[0].core.handle(leave, now);
    net.flush(0);
    net.run_for(SECOND);
    assert!(net.nodes.iter().all(|n| n.failures.is_empty()));
}

#[derive(Clone, Debug)]
enum Step {
    Join,
    Kill(usize),
    Barrier,
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Join),
        (0..6usize).prop_map(Step::Kill),
        Just(Step::Barrier),
        (1..4000u64).prop_map(Step::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever joins, deaths and barriers happen, with packets reordered
    /// across connections: every round a node is
    /// told of has MIN..=MAX distinct members, rounds only go up, every
    /// live joined node ends up in the scheduler's round, and the job
    /// either runs or failed with the rendezvous error on every live node.
    #[test]
    fn random_joins_and_deaths_keep_rounds_consistent(
        min in 1usize..3,
        extra in 0usize..3,
        seed in any::<u64>(),
        steps in proptest::collection::vec(step(), 1..30),
    ) {
        let max = min + extra;
        let mut net = elastic(1, min, max, seed);
        // Packets take 1 to 6 ms: messages on different connections reorder.
        net.faults.max_delay = MS * 5;
        let mut workers: Vec<usize> = Vec::new();
        for s in steps {
            match s {
                Step::Join => workers.push(join(&mut net)),
                Step::Kill(k) => {
                    let live: Vec<usize> =
                        workers.iter().copied().filter(|&w| net.nodes[w].alive).collect();
                    if !live.is_empty() {
                        net.kill(live[k % live.len()]);
                    }
                }
                Step::Barrier => {
                    for &w in &workers {
                        let n = &net.nodes[w];
                        if n.alive && n.core.is_joined() && n.failures.is_empty() {
                            net.barrier(w, WORKER_GROUP);
                        }
                    }
                }
                Step::Wait(ms) => net.run_for(Duration::from_millis(ms)),
            }
        }
        // Settle: dead workers admitted from the wait list are found dead
        // one heartbeat timeout later, and may cascade; a failure found
        // at the end of a window still has its LEAVEs on the way.
        let news = |net: &Network| {
            let rounds: usize = net.nodes.iter().map(|n| n.rounds.len()).sum();
            let failures: usize = net.nodes.iter().map(|n| n.failures.len()).sum();
            (rounds, failures)
        };
        for _ in 0..20 {
            let before = news(&net);
            net.run_for(SECOND * 5);
            if news(&net) == before {
                break;
            }
        }
        let sched = net.nodes[0].core.round();
        let failed = !net.nodes[0].failures.is_empty();
        for (i, n) in net.nodes.iter().enumerate() {
            let mut last = None;
            for (number, members) in &n.rounds {
                prop_assert!(last.is_none_or(|l| *number > l), "node {}: rounds go up", i);
                last = Some(*number);
                prop_assert!((min..=max).contains(&members.len()));
                let mut unique = members.clone();
                unique.sort_unstable();
                unique.dedup();
                prop_assert_eq!(unique.len(), members.len());
            }
            if !n.alive || !n.core.is_joined() {
                continue;
            }
            if failed {
                prop_assert!(n.failures.iter().any(|f| rendezvous_failed(f).is_some()), "node {i}");
            } else if n.failures.is_empty() && sched.is_some() {
                prop_assert_eq!(n.core.round(), sched.clone(), "node {}", i);
            }
        }
    }
}

#[test]
fn after_a_death_joiners_wait_for_a_barrier_unless_the_survivors_are_below_min() {
    // Enough survivors: the joiner waits for the next worker barrier.
    let mut net = elastic(1, 2, 4, 11);
    let ws: Vec<usize> = (0..3).map(|_| join(&mut net)).collect();
    assert!(net.run_until(SECOND * 3, Network::all_joined));
    let d = join(&mut net);
    net.kill(ws[2]);
    assert!(net.run_until(SECOND * 5, |n| everyone_in(n, 1, &[9, 11])));
    assert!(!net.nodes[d].core.is_joined(), "admitted at a barrier only");
    let t: Vec<(usize, Ticket)> = ws[..2]
        .iter()
        .map(|&i| (i, net.barrier(i, WORKER_GROUP)))
        .collect();
    assert!(net.run_until(SECOND, |n| n.nodes[d].core.is_joined()
        && t.iter()
            .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))));
    assert!(everyone_in(&net, 2, &[9, 11, 15]));

    // Too few survivors: the joiner is taken in at once, and counts as
    // arrived at the next worker barrier (its start() returned instead).
    let (mut net, a, b) = two_running(12, 2, 4);
    let c = join(&mut net);
    net.kill(b);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[c].core.is_joined()));
    assert!(everyone_in(&net, 1, &[9, 13]));
    let ta = net.barrier(a, WORKER_GROUP);
    assert!(net.run_until(SECOND, |n| matches!(n.outcome(a, ta), Some(Ok(())))));
    // The one after counts c again.
    let ta = net.barrier(a, WORKER_GROUP);
    net.run_for(SECOND);
    assert!(net.outcome(a, ta).is_none());
    let tc = net.barrier(c, WORKER_GROUP);
    assert!(net.run_until(SECOND, |n| [(a, ta), (c, tc)]
        .iter()
        .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))));
}

#[test]
fn a_newcomer_is_not_excused_from_a_barrier_no_worker_reached() {
    let (mut net, a, b) = two_running(13, 2, 4);
    // The server and the scheduler wait at the final barrier all along.
    let ts = net.barrier(1, ALL_GROUP);
    let t0 = net.barrier(0, ALL_GROUP);
    let c = join(&mut net);
    let t: Vec<(usize, Ticket)> = [a, b]
        .iter()
        .map(|&i| (i, net.barrier(i, WORKER_GROUP)))
        .collect();
    assert!(net.run_until(SECOND, |n| n.nodes[c].core.is_joined()));
    assert!(t
        .iter()
        .all(|&(i, t)| matches!(net.outcome(i, t), Some(Ok(())))));
    let t: Vec<(usize, Ticket)> = [a, b]
        .iter()
        .map(|&i| (i, net.barrier(i, ALL_GROUP)))
        .collect();
    net.run_for(SECOND);
    assert!(net.outcome(1, ts).is_none(), "the newcomer has not arrived");
    let tc = net.barrier(c, ALL_GROUP);
    let all: Vec<(usize, Ticket)> = t.into_iter().chain([(c, tc), (1, ts), (0, t0)]).collect();
    assert!(net.run_until(SECOND, |n| all
        .iter()
        .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))));
}

#[test]
fn a_cxx_node_cannot_join_an_elastic_job() {
    let mut net = elastic(1, 1, 2, 14);
    // A C++ ps-lite worker: its entry has no pslite flag.
    let mut add = Message::control(Command::AddNode, SCHEDULER);
    add.meta.control.node = vec![Node::new(Role::Worker, "127.0.0.1", 12_345)];
    let now = net.now;
    net.nodes[0].core.handle(add, now);
    net.flush(0);
    net.run_for(SECOND * 5);
    assert_eq!(net.nodes[0].core.round(), None, "no round: nobody joined");
    assert!(!net.nodes[1].core.is_joined());
    // A pslite worker still can.
    let w = join(&mut net);
    assert!(net.run_until(SECOND * 3, Network::all_joined));
    assert_eq!(net.nodes[w].core.round(), Some((0, vec![9])));
}

#[test]
fn under_resend_a_joiner_waits_long_without_failing() {
    let mut net = elastic_with(1, 2, 4, 15, |c| {
        c.resend_timeout = Some(Duration::from_millis(200));
        c.max_resends = 3;
    });
    let a = join(&mut net);
    let b = join(&mut net);
    assert!(net.run_until(SECOND * 3, Network::all_joined));
    let c = join(&mut net);
    net.run_for(SECOND * 60);
    assert!(
        net.nodes.iter().all(|n| n.failures.is_empty()),
        "{:?}",
        net.nodes[c].failures
    );
    let t: Vec<(usize, Ticket)> = [a, b]
        .iter()
        .map(|&i| (i, net.barrier(i, WORKER_GROUP)))
        .collect();
    assert!(net.run_until(SECOND * 2, |n| n.nodes[c].core.is_joined()
        && t.iter()
            .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))));
    assert!(everyone_in(&net, 1, &[9, 11, 13]));
}

#[test]
fn a_worker_killed_while_waiting_for_the_first_round_is_noticed_by_its_connection() {
    // Default liveness (a 10 s heartbeat timeout that only watches nodes
    // that sent heartbeats): a waiting worker sends none yet.
    let mut net = elastic_with(1, 2, 3, 12, |c| {
        c.heartbeat_timeout = Some(SECOND * 10);
        c.watch_all = false;
    });
    let a = join(&mut net);
    let b = join(&mut net);
    net.kill(b);
    // The last call (2 s) passes: the round must not begin with the dead
    // worker (it would wait for it for ever): it has one worker, below MIN.
    net.run_for(SECOND * 3);
    assert_eq!(net.nodes[0].core.round(), None);
    let c = join(&mut net);
    assert!(net.run_until(SECOND * 5, |n| n.nodes[a].core.is_joined()
        && n.nodes[c].core.is_joined()));
    let (_, workers) = net.nodes[0].core.round().expect("a round");
    assert_eq!(workers, vec![net.id(a), net.id(c)]);
}

/// The workers of a running round get the next one as a change (the
/// joiners' entries, the workers gone): a join or a leave costs the
/// scheduler O(N) bytes in all, not a table of N entries to each of N
/// nodes; every node ends in the same round.
#[test]
fn a_new_round_goes_to_the_members_as_a_change() {
    const WORKERS: usize = 60;
    let mut net = elastic(2, WORKERS, WORKERS + 1, 21);
    let workers: Vec<usize> = (0..WORKERS).map(|_| join(&mut net)).collect();
    assert!(net.run_until(SECOND * 3, Network::all_joined));
    let n = net.nodes.len() as u64;
    let before = net.nodes[0].traffic;
    let joiner = join(&mut net);
    let waiters: Vec<(usize, Ticket)> = workers
        .iter()
        .map(|&w| (w, net.barrier(w, WORKER_GROUP)))
        .collect();
    assert!(
        net.run_until(SECOND * 2, |n| n.nodes[joiner].core.is_joined()
            && waiters
                .iter()
                .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(())))))
    );
    let mut members: Vec<NodeId> = workers.iter().map(|&w| net.id(w)).collect();
    members.push(net.id(joiner));
    assert!(everyone_in(&net, 1, &members));
    let join_bytes = net.nodes[0].traffic.bytes - before.bytes;
    // The joiner's table (about 40 bytes an entry) and, to each other
    // node, a change and a barrier release: well under 200 bytes a node.
    // A table to everyone would be about 40 * n * n bytes.
    assert!(
        join_bytes < 200 * n + 60 * n,
        "a join cost the scheduler {join_bytes} bytes at {n} nodes"
    );
    // A worker leaves: the others drop it, from the change alone.
    let before = net.nodes[0].traffic;
    let leaver = workers[3];
    let now = net.now;
    net.nodes[leaver].core.leave(now);
    net.flush(leaver);
    members.retain(|&id| id != net.id(leaver));
    assert!(net.run_until(SECOND, |n| n
        .nodes
        .iter()
        .enumerate()
        .filter(|&(i, n)| i != leaver && n.alive && n.core.is_joined())
        .all(|(_, n)| n.core.round() == Some((2, members.clone())))));
    let leave_bytes = net.nodes[0].traffic.bytes - before.bytes;
    assert!(
        leave_bytes < 100 * n,
        "a leave cost the scheduler {leave_bytes} bytes at {n} nodes"
    );
    for &w in &workers {
        if w != leaver {
            assert!(!net.nodes[w]
                .core
                .nodes()
                .iter()
                .any(|e| e.id == net.id(leaver)));
        }
    }
}

/// A change of a round a worker does not hold (it missed one: a resend
/// that came late) is not applied: the worker asks for the whole table and
/// the scheduler sends it.
#[test]
fn a_change_of_a_round_not_held_brings_the_whole_table() {
    // No heartbeats: the messages counted are the ask and the table.
    let mut net = elastic_with(1, 2, 4, 22, |c| c.heartbeat_interval = None);
    let a = join(&mut net);
    join(&mut net);
    assert!(net.run_until(SECOND * 3, Network::all_joined));
    let scheduler_key = net.key_of(SCHEDULER);
    let mut change = Message::control(Command::AddNode, net.id(a));
    change.meta.sender = SCHEDULER;
    change.meta.sender_key = scheduler_key;
    change.meta.control.round = Some(7);
    change.meta.control.round_base = Some(6);
    change.meta.control.round_left = vec![11];
    let (sent, sched_sent) = (net.nodes[a].traffic, net.nodes[0].traffic);
    let now = net.now;
    net.nodes[a].core.handle(change, now);
    net.flush(a);
    net.run_for(SECOND / 10);
    assert_eq!(
        net.nodes[a].core.round(),
        Some((0, vec![9, 11])),
        "not applied"
    );
    assert_eq!(net.nodes[a].traffic.messages, sent.messages + 1, "it asked");
    assert_eq!(
        net.nodes[0].traffic.messages,
        sched_sent.messages + 1,
        "the table came back"
    );
    assert!(everyone_in(&net, 0, &[9, 11]));
}
