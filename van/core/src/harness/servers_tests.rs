//! Servers that join and leave a running job (`DMLC_NUM_SERVER=MIN:MAX`)
//! in the in-memory network: a joiner takes its ranges with their state
//! while pushes go on, a leaving server hands its ranges over before it is
//! let go (and nothing fails for it), a leave below MIN is refused, and the
//! property test over random schedules of pushes, pulls, joins, leaves and
//! deaths (at most k-1 replicas of a range at once).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::replica_tests::{
    cases, check_replicas, config, describe, keys, map, may_kill, serving, settle, DrawnKeys, Job,
    MS, SECOND,
};

/// Runs `net` for `d`; a server the scheduler let go exits at once.
fn run_exiting(net: &mut Network, d: Duration) {
    let end = net.now + d;
    while net.now < end && net.step() {
        exit_left(net);
    }
    net.now = net.now.max(end);
}

/// Runs until every request of `job` is answered (within `limit`); a
/// server the scheduler let go exits at once.
fn settle_exiting(net: &mut Network, job: &mut Job, limit: Duration) -> bool {
    let end = net.now + limit;
    loop {
        exit_left(net);
        if job.all_answered(net) {
            return true;
        }
        if net.now >= end || !net.step() {
            return false;
        }
    }
}
use super::*;

/// A job whose servers join and leave: MIN `min`, MAX `max` (ranges),
/// `initial` servers at the start (with [`SumApp`]s), two workers, `k`
/// replicas. Returns the network and the workers' indexes.
fn job(min: i32, max: i32, initial: i32, k: u32, resend: bool, seed: u64) -> (Network, [usize; 2]) {
    let mut net = Network::new(
        VanConfig {
            num_servers: max,
            min_servers: Some(min),
            num_workers: 2,
            ..config(k, resend)
        },
        seed,
    );
    net.add(Role::Scheduler, SCHEDULER_PORT);
    for i in 0..initial {
        let s = net.add(Role::Server, 10_000 + i);
        net.nodes[s].app = Some(SumApp::default());
    }
    let workers = [net.add(Role::Worker, 11_000), net.add(Role::Worker, 11_001)];
    assert!(net.form(SECOND * 10), "the job did not form");
    assert!(net.run_until(SECOND * 5, serving));
    (net, workers)
}

/// [`job`] after four pushes of worker 0 to `keys(max)`, answered.
fn pushed(max: i32, initial: i32, k: u32, seed: u64) -> (Network, [usize; 2], Job, Vec<u64>) {
    let (mut net, workers) = job(1, max, initial, k, false, seed);
    let mut job = Job::default();
    let all = keys(max as usize);
    for _ in 0..4 {
        job.push(&mut net, workers[0], &all);
    }
    settle(&mut net, &mut job, SECOND);
    (net, workers, job, all)
}

/// A new server process registers with the running job; returns its index.
fn join(net: &mut Network, port: i32) -> usize {
    let i = net.add(Role::Server, port);
    net.nodes[i].app = Some(SumApp::default());
    net.register(i);
    i
}

/// Server `i` asks to leave (kept in `net.leaving`).
fn ask_leave(net: &mut Network, i: usize) {
    let ticket = net.call(i, Call::Leave, None);
    net.leaving.insert(i, ticket);
}

/// How server `i`'s leave ended: `None` while the scheduler has not
/// answered (or it was not asked); `Some(Err)` says why it was refused.
fn left(net: &Network, i: usize) -> Option<Result<(), String>> {
    let outcome = net.answer(i, *net.leaving.get(&i)?)?;
    Some(outcome.map(drop).map_err(|e| e.to_string()))
}

/// Servers the scheduler let go exit (their process ends, as after
/// `leave_job` returns); each must hold no range by then. Returns how many.
fn exit_left(net: &mut Network) -> usize {
    let left: Vec<usize> = (1..net.nodes.len())
        .filter(|&i| net.nodes[i].alive && left(net, i) == Some(Ok(())))
        .collect();
    for &i in &left {
        let id = net.id(i);
        let m = map(net);
        // A server that waited for room may have taken the id already.
        let key = net.nodes[i].core.me().key;
        let taken = net.nodes[0]
            .core
            .nodes()
            .iter()
            .any(|n| n.id == id && n.key != key);
        assert!(
            taken
                || m.ranges
                    .iter()
                    .all(|r| !r.replicas.contains(&id) && !r.joining.contains(&id)),
            "server {id} was let go while the map holds it: {m:?}"
        );
        net.kill(i);
    }
    left.len()
}

/// Every worker pulls every key of `all`: the sums are the acknowledged
/// pushes exactly.
fn assert_pull_exact(net: &mut Network, job: &mut Job, w: usize, all: &[u64]) {
    let ts = job.request(net, w, all, false);
    settle(net, job, SECOND * 5);
    let pulled: BTreeMap<u64, i64> = job.pulled[&(w, ts)]
        .iter()
        .copied()
        .filter(|&(_, v)| v != 0)
        .collect();
    assert_eq!(pulled, job.acked);
}

/// No worker saw a failure, a lost request or a dead peer.
fn assert_no_failure(net: &Network, workers: [usize; 2]) {
    for w in workers {
        let n = &net.nodes[w];
        assert!(n.failures.is_empty(), "{:?}", n.failures);
        assert!(n.undeliverable.is_empty(), "{:?}", n.undeliverable);
        assert!(n.peer_dead.is_empty(), "{:?}", n.peer_dead);
    }
}

#[test]
fn the_job_forms_with_min_servers_and_max_ranges() {
    let (net, _) = job(1, 3, 1, 1, false, 1);
    let m = map(&net);
    assert_eq!(m.ranges.len(), 3, "MAX ranges");
    assert!(m.ranges.iter().all(|r| r.replicas == vec![8]));
}

#[test]
fn a_joining_server_takes_its_ranges_with_their_state_while_pushes_go_on() {
    for k in [1, 2] {
        let (mut net, [w0, w1], mut job, all) = pushed(2, 1, k, 2);
        let joiner = join(&mut net, 10_001);
        for _ in 0..20 {
            job.push(&mut net, w0, &all);
            job.push(&mut net, w1, &all);
            net.run_for(MS * 20);
        }
        settle(&mut net, &mut job, SECOND * 5);
        assert!(net.nodes[joiner].core.is_joined());
        assert_eq!(net.id(joiner), 10, "the next rank");
        assert!(
            net.nodes[joiner].core.me().is_recovery,
            "it skips the start barrier"
        );
        assert!(net.run_until(SECOND * 5, |n| map(n)
            .ranges
            .iter()
            .all(|r| r.joining.is_empty())
            && serving(n)));
        let m = map(&net);
        let want: Vec<Vec<NodeId>> = if k == 1 {
            vec![vec![8], vec![10]]
        } else {
            vec![vec![8, 10], vec![10, 8]]
        };
        assert_eq!(
            m.ranges
                .iter()
                .map(|r| r.replicas.clone())
                .collect::<Vec<_>>(),
            want,
            "k {k}"
        );
        check_replicas(&net, &job);
        assert_pull_exact(&mut net, &mut job, w1, &all);
        assert_no_failure(&net, [w0, w1]);
    }
}

#[test]
fn a_leaving_server_hands_its_ranges_over_before_it_goes() {
    for k in [1, 2] {
        let (mut net, [w0, w1], mut job, all) = pushed(2, 2, k, 3);
        let leaver = net.index_of(8).unwrap();
        ask_leave(&mut net, leaver);
        for _ in 0..10 {
            job.push(&mut net, w0, &all);
            job.push(&mut net, w1, &all);
            net.run_for(MS * 20);
        }
        assert!(net.run_until(SECOND * 5, |n| left(n, leaver).is_some()));
        assert_eq!(left(&net, leaver), Some(Ok(())));
        assert_eq!(exit_left(&mut net), 1);
        for _ in 0..5 {
            job.push(&mut net, w1, &all);
        }
        settle(&mut net, &mut job, SECOND * 5);
        assert!(map(&net).ranges.iter().all(|r| r.replicas == vec![10]));
        check_replicas(&net, &job);
        assert_pull_exact(&mut net, &mut job, w0, &all);
        assert_no_failure(&net, [w0, w1]);
        // The scheduler counts it as left, not lost: the last barrier does
        // not wait for it.
        assert!(net.barrier_over_all(SECOND));
    }
}

#[test]
fn a_leave_below_min_is_refused_and_the_server_goes_on() {
    let (mut net, [w0, _]) = job(2, 3, 2, 1, false, 4);
    let s = net.index_of(10).unwrap();
    ask_leave(&mut net, s);
    assert!(net.run_until(SECOND, |n| left(n, s).is_some()));
    let why = left(&net, s).unwrap().unwrap_err();
    assert!(why.contains("MIN (2)"), "{why}");
    let mut job = Job::default();
    job.push(&mut net, w0, &keys(3));
    settle(&mut net, &mut job, SECOND);
    check_replicas(&net, &job);
    assert!(map(&net).ranges.iter().any(|r| r.replicas.contains(&10)));
}

#[test]
fn a_joiner_takes_the_id_of_a_server_that_left() {
    let (mut net, [w0, _]) = job(1, 2, 2, 1, false, 5);
    let mut job = Job::default();
    let all = keys(2);
    job.push(&mut net, w0, &all);
    settle(&mut net, &mut job, SECOND);
    let s = net.index_of(10).unwrap();
    ask_leave(&mut net, s);
    assert!(net.run_until(SECOND * 5, |n| left(n, s).is_some()));
    assert_eq!(exit_left(&mut net), 1);
    let joiner = join(&mut net, 10_005);
    job.push(&mut net, w0, &all);
    assert!(
        net.run_until(SECOND * 5, |n| n.nodes[joiner].core.is_joined()
            && map(n).ranges[1].replicas == vec![10]
            && serving(n))
    );
    assert_eq!(net.id(joiner), 10);
    job.push(&mut net, w0, &all);
    settle(&mut net, &mut job, SECOND * 5);
    check_replicas(&net, &job);
    assert_pull_exact(&mut net, &mut job, w0, &all);
}

/// Whether killing server `i` leaves each range it holds or joins another
/// live replica that is not leaving: a leave counts against the `k-1`
/// replicas of a range that may go at once (once let go, the leaver holds
/// nothing, and a joiner it copied to may be all the range has).
fn keeps_a_holder(net: &Network, i: usize, leaving: &BTreeSet<usize>) -> bool {
    let id = net.id(i);
    map(net)
        .ranges
        .iter()
        .filter(|r| r.replicas.contains(&id) || r.joining.contains(&id))
        .all(|r| {
            r.replicas
                .iter()
                .any(|&s| s != id && net.index_of(s).is_some_and(|j| !leaving.contains(&j)))
        })
}

/// Whether server `id` may ask to leave: no range it holds has a replica
/// or joiner that died but is not declared dead yet (the scheduler would
/// count it as a holder and let the leaver go: a leave and a death at once,
/// as a death during the hand-over would be).
fn may_leave(net: &Network, id: NodeId) -> bool {
    map(net)
        .ranges
        .iter()
        .filter(|r| r.replicas.contains(&id))
        .all(|r| {
            r.replicas
                .iter()
                .chain(&r.joining)
                .all(|&s| net.index_of(s).is_some())
        })
}

#[test]
fn a_cxx_server_cannot_join_a_job_whose_servers_join_and_leave() {
    let (mut net, _) = job(1, 2, 1, 1, false, 6);
    // A C++ server registers (no pslite flag on its entry): there is room,
    // but it would not understand the range map.
    let mut add = Message::control(pslite_proto::Command::AddNode, pslite_proto::ids::SCHEDULER);
    add.meta.control.node = vec![Node::new(Role::Server, "127.0.0.1", 12_345)];
    let now = net.now;
    net.nodes[0].core.handle(add, now);
    net.run_for(SECOND);
    assert_eq!(
        net.nodes[0].core.nodes().len(),
        4,
        "the scheduler and 3 nodes"
    );
    assert!(map(&net).ranges.iter().all(|r| r.joining.is_empty()));
}

#[derive(Clone, Debug)]
enum Step {
    Push { worker: usize, keys: Vec<u8> },
    Pull { worker: usize },
    Join,
    Leave { server: usize },
    Kill { server: usize },
    Wait { ms: u16 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..2usize, prop::collection::vec(0..12u8, 1..6))
            .prop_map(|(worker, keys)| Step::Push { worker, keys }),
        1 => (0..2usize).prop_map(|worker| Step::Pull { worker }),
        1 => Just(Step::Join),
        1 => (0..8usize).prop_map(|server| Step::Leave { server }),
        1 => (0..8usize).prop_map(|server| Step::Kill { server }),
        2 => (1..400u16).prop_map(|ms| Step::Wait { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(128)))]

    /// Random pushes, pulls, servers that join, servers that leave, and
    /// server deaths (k >= 2, never the last live replica of a range, a
    /// leave counting as one going), with and without PS_RESEND: every
    /// request is answered, every replica holds exactly the acknowledged
    /// pushes, no value is applied twice, and the final pull of every key
    /// is the sum of its acknowledged pushes exactly. A server let go holds
    /// no range.
    #[test]
    fn acknowledged_pushes_survive_joins_leaves_and_deaths(
        seed in 0..u64::MAX,
        min in 1..3i32,
        more in 0..3i32,
        initial in 0..3i32,
        k in 1..4u32,
        resend in any::<bool>(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let (max, initial, k) = sizes(min, more, initial, k);
        run_schedule(seed, min, max, initial, k, resend, steps)?;
    }
}

/// MAX (at least 2), the servers at the start (MIN to MAX) and k (at most
/// MAX) from the drawn numbers.
fn sizes(min: i32, more: i32, initial: i32, k: u32) -> (i32, i32, u32) {
    let max = (min + more).max(2);
    (max, (min + initial).min(max), k.min(max as u32))
}

fn run_schedule(
    seed: u64,
    min: i32,
    max: i32,
    initial: i32,
    k: u32,
    resend: bool,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let schedule = format!(
        "seed {seed} min {min} max {max} initial {initial} k {k} resend {resend} {steps:?}"
    );
    let (mut net, workers) = job(min, max, initial, k, resend, seed);
    let drawn = DrawnKeys::new(max as usize);
    let all = drawn.all();
    let mut next_port = 10_100;
    // Servers that asked to leave (and were not refused).
    let mut leaving: BTreeSet<usize> = BTreeSet::new();
    let mut job = Job::default();
    let servers = |net: &Network| -> Vec<usize> {
        (1..net.nodes.len())
            .filter(|&i| {
                net.nodes[i].alive && net.nodes[i].app.is_some() && net.nodes[i].core.is_joined()
            })
            .collect()
    };
    for s in steps {
        match s {
            Step::Push { worker, keys } => {
                job.push(&mut net, workers[worker], &drawn.keys(&keys));
            }
            Step::Pull { worker } => {
                job.request(&mut net, workers[worker], &all, false);
            }
            Step::Join => {
                // At most a few processes waiting for room at a time.
                let waiting = (1..net.nodes.len())
                    .filter(|&i| net.nodes[i].alive && !net.nodes[i].core.is_joined())
                    .count();
                if waiting < 2 {
                    join(&mut net, next_port);
                    next_port += 1;
                }
            }
            Step::Leave { server } => {
                let live = servers(&net);
                let Some(&i) = live.get(server % live.len().max(1)) else {
                    continue;
                };
                if !leaving.contains(&i) && may_leave(&net, net.id(i)) {
                    ask_leave(&mut net, i);
                    leaving.insert(i);
                }
            }
            Step::Kill { server } => {
                let live = servers(&net);
                let Some(&i) = live.get(server % live.len().max(1)) else {
                    continue;
                };
                if k >= 2 && may_kill(&net, net.id(i)) && keeps_a_holder(&net, i, &leaving) {
                    net.kill(i);
                }
            }
            Step::Wait { ms } => run_exiting(&mut net, MS * u32::from(ms)),
        }
        exit_left(&mut net);
        // A refused leave: the server stays.
        leaving.retain(|&i| !matches!(left(&net, i), Some(Err(_))));
        job.collect(&net);
    }
    let answered = settle_exiting(&mut net, &mut job, SECOND * 20);
    prop_assert!(
        answered,
        "{schedule}: requests never answered: {}",
        describe(&net)
    );
    // Copies in progress end, leaves with them.
    let end = net.now + SECOND * 20;
    let settled = loop {
        exit_left(&mut net);
        if map(&net).ranges.iter().all(|r| r.joining.is_empty()) && serving(&net) {
            break true;
        }
        if net.now >= end || !net.step() {
            break false;
        }
    };
    prop_assert!(
        settled,
        "{schedule}: copies never ended: {}",
        describe(&net)
    );
    check_replicas(&net, &job);
    let ts = job.request(&mut net, workers[0], &all, false);
    settle(&mut net, &mut job, SECOND * 5);
    let pulled: BTreeMap<u64, i64> = job.pulled[&(workers[0], ts)]
        .iter()
        .copied()
        .filter(|&(_, v)| v != 0)
        .collect();
    prop_assert_eq!(pulled, job.acked.clone());
    for w in workers {
        prop_assert!(
            net.nodes[w].failures.is_empty(),
            "{:?}",
            net.nodes[w].failures
        );
        prop_assert!(
            net.nodes[w].undeliverable.is_empty(),
            "{:?}",
            net.nodes[w].undeliverable
        );
    }
    Ok(())
}
