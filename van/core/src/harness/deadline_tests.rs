//! The deadlines a caller waits under, decided by the core at its ticks:
//! barrier timeouts, store calls without an answer, and the exit drain
//! (15 resend timeouts, at most 30 s, then a line saying what it waited
//! for). Virtual time: every bound is checked to the tick.

use pslite_proto::ids::{ALL_GROUP, WORKER_GROUP};
use pslite_proto::store::{StoreMsg, StoreOp};

use super::tests::resend;
use super::*;
use crate::core::{DrainOutcome, DRAIN_RESEND_TIMEOUTS, MAX_DRAIN};

const SECOND: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

/// A 1 + 1 cluster with `PS_RESEND` (`timeout_ms`) whose worker stops with
/// a request to a server that acknowledged before and then died: returns
/// the network and the worker, its exit drain just begun.
fn stopping_with_a_lost_request(timeout_ms: u64, seed: u64) -> (Network, usize) {
    let mut net = Network::cluster(1, 1, resend(timeout_ms), seed);
    assert!(net.form(SECOND * 5));
    let (server, worker) = (net.index_of(8).unwrap(), net.index_of(9).unwrap());
    let first = net.request(worker, server, 1);
    net.send(worker, first);
    net.run_for(SECOND);
    net.kill(server);
    let lost = net.request(worker, server, 2);
    net.send(worker, lost);
    net.finish(worker);
    (net, worker)
}

/// Runs until node `i`'s exit drain ends (within `limit`); how long it took.
fn drain_time(net: &mut Network, i: usize, limit: Duration) -> Duration {
    let started = net.now;
    assert!(net.run_until(limit, |n| n.nodes[i].core.drain_outcome().is_some()));
    net.now - started
}

#[test]
fn a_barrier_times_out_at_its_deadline_and_the_cluster_goes_on() {
    let mut net = Network::cluster(1, 2, VanConfig::default(), 40);
    assert!(net.form(SECOND * 5));
    let (w1, w2) = (net.index_of(9).unwrap(), net.index_of(11).unwrap());
    let started = net.now;
    // Worker 11 never enters: worker 9 gives up after 5 s, to the tick.
    let t = net.barrier_within(w1, WORKER_GROUP, Some(SECOND * 5));
    let untimed = net.barrier(0, ALL_GROUP);
    net.run_for(SECOND * 5 - MS);
    assert!(net.answer(w1, t).is_none());
    assert!(net.run_until(SECOND, |n| n.answer(w1, t).is_some()));
    assert_eq!(net.now - started, SECOND * 5);
    let Some(Err(err)) = net.answer(w1, t) else {
        panic!("the barrier did not time out");
    };
    assert!(
        matches!(
            err,
            crate::VanError::BarrierTimeout {
                group: WORKER_GROUP,
                secs: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("barrier over group 4 was not released within 5 s"),
        "{err}"
    );
    // A barrier without a deadline waits on; the node is not failed.
    net.run_for(SECOND * 60);
    assert!(net.outcome(0, untimed).is_none());
    assert!(net.nodes.iter().all(|n| n.failures.is_empty()));
    // The next barrier of the group releases both (the late entry of
    // worker 11 counts for the round worker 9 gave up on: the scheduler
    // keeps no timeouts).
    net.nodes[w1].core.end_wait(t);
    let a = net.barrier(w2, WORKER_GROUP);
    let b = net.barrier(w1, WORKER_GROUP);
    assert!(net.run_until(SECOND, |n| n.outcome(w2, a) == Some(Ok(()))));
    let _ = b;
}

#[test]
fn a_store_call_without_an_answer_ends_at_its_limit() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 41);
    assert!(net.form(SECOND * 5));
    // The scheduler holds a GET of a missing key for an hour; the caller
    // gives up after 2 s.
    let mut get = StoreMsg::request(StoreOp::Get, vec!["missing".into()]);
    get.timeout = Some(SECOND * 3600);
    let id = net.store_within(1, get, SECOND * 2);
    let started = net.now;
    assert!(net.run_until(SECOND * 10, |n| n.answer(1, id).is_some()));
    assert_eq!(net.now - started, SECOND * 2);
    assert!(matches!(
        net.answer(1, id),
        Some(Err(crate::VanError::StoreNoAnswer { secs })) if secs == 2.0
    ));
    // The answer that comes later finds nobody waiting, and harms nothing.
    net.nodes[1].core.end_wait(id);
    let s = net.store(1, {
        let mut set = StoreMsg::request(StoreOp::Set, vec!["missing".into()]);
        set.value = Some(bytes::Bytes::from_static(b"v"));
        set
    });
    assert!(net.run_until(SECOND, |n| matches!(n.answer(1, s), Some(Ok(_)))));
}

#[test]
fn the_exit_drain_ends_as_soon_as_everything_is_acknowledged() {
    let mut net = Network::cluster(1, 1, resend(100), 42);
    assert!(net.form(SECOND * 5));
    let (server, worker) = (net.index_of(8).unwrap(), net.index_of(9).unwrap());
    // The server has acknowledged before: what goes to it is waited for.
    let first = net.request(worker, server, 1);
    net.send(worker, first);
    net.run_for(SECOND);
    let msg = net.request(worker, server, 2);
    net.send(worker, msg);
    net.finish(worker);
    assert_eq!(net.nodes[worker].core.drain_outcome(), None);
    assert!(net.run_until(SECOND, |n| n.nodes[worker].core.drain_outcome().is_some()));
    assert_eq!(
        net.nodes[worker].core.drain_outcome(),
        Some(&DrainOutcome::Flushed)
    );
}

#[test]
fn the_exit_drain_gives_up_after_15_resend_timeouts_saying_what_it_waited_for() {
    let timeout = Duration::from_millis(100);
    let (mut net, worker) = stopping_with_a_lost_request(100, 43);
    assert_eq!(
        drain_time(&mut net, worker, SECOND * 60),
        timeout * DRAIN_RESEND_TIMEOUTS
    );
    match net.nodes[worker].core.drain_outcome() {
        Some(DrainOutcome::GaveUp { waited, left }) => {
            assert_eq!(*waited, timeout * DRAIN_RESEND_TIMEOUTS);
            assert_eq!(left.len(), 1, "{left:?}");
            assert!(
                left[0].contains("9 -> 8") && left[0].contains("ts 2"),
                "{left:?}"
            );
        }
        other => panic!("expected the drain to give up, got {other:?}"),
    }
}

#[test]
fn the_exit_drain_lasts_at_most_30_seconds_however_long_the_resend_timeout() {
    let (mut net, worker) = stopping_with_a_lost_request(10_000, 44);
    assert_eq!(drain_time(&mut net, worker, SECOND * 120), MAX_DRAIN);
    assert!(matches!(
        net.nodes[worker].core.drain_outcome(),
        Some(DrainOutcome::GaveUp { .. })
    ));
}

#[test]
fn without_resend_or_with_a_failed_node_there_is_nothing_to_drain() {
    let mut net = Network::cluster(1, 1, VanConfig::default(), 45);
    assert!(net.form(SECOND * 5));
    net.finish(1);
    assert_eq!(
        net.nodes[1].core.drain_outcome(),
        Some(&DrainOutcome::Flushed)
    );

    let (mut net, worker) = stopping_with_a_lost_request(1000, 46);
    assert_eq!(net.nodes[worker].core.drain_outcome(), None);
    let now = net.now;
    net.nodes[worker].core.fail(Failure::Stopped, now);
    assert_eq!(
        net.nodes[worker].core.drain_outcome(),
        Some(&DrainOutcome::Failed)
    );
}
