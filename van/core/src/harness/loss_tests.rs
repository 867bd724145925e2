//! Loss without death: with 10% of messages lost (`PS_DROP_MSG=10`,
//! `PS_RESEND=1`) and a 2 s heartbeat timeout, nobody is taken for dead
//! and a lost message costs milliseconds (resends follow the measured
//! round trip); a node cut off from the scheduler for less than the
//! recovery timeout comes back instead of stopping.

use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// `PS_HEARTBEAT_INTERVAL=1 PS_HEARTBEAT_TIMEOUT=2`, `PS_RESEND=1` with
/// its default timeout (1 s).
fn lossy() -> VanConfig {
    VanConfig {
        heartbeat_interval: Some(SECOND),
        heartbeat_timeout: Some(SECOND * 2),
        watch_all: true,
        recovery_timeout: SECOND * 5,
        resend_timeout: Some(SECOND),
        ..VanConfig::default()
    }
}

/// Whether someone failed, or the scheduler saw a node silent for longer
/// than the heartbeat timeout (it would declare it dead).
fn someone_died(n: &Network) -> bool {
    n.nodes.iter().any(|x| !x.failures.is_empty())
        || !n.nodes[0].core.dead_nodes(n.now, SECOND * 2).is_empty()
}

#[test]
fn ten_percent_loss_takes_nobody_for_dead_with_a_two_second_timeout() {
    for seed in 1..=4 {
        let mut net = Network::cluster(2, 2, lossy(), seed);
        assert!(net.form(SECOND * 10));
        net.faults.drop = 0.1;
        assert!(
            !net.run_until(SECOND * 120, someone_died),
            "seed {seed}: a node was taken for dead, or failed: {:?}",
            net.nodes.iter().map(|n| &n.failures).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_lost_message_costs_milliseconds_not_the_resend_timeout() {
    let mut net = Network::cluster(2, 2, lossy(), 5);
    assert!(net.form(SECOND * 10));
    // A few loss-free barriers measure the round trips (2 ms here).
    for _ in 0..5 {
        assert!(net.barrier_over_all(SECOND));
    }
    net.faults.drop = 0.1;
    // 50 barriers over all: about 5 of the ~20 messages and ACKs of each
    // lost per 5 barriers. With a fixed 1 s wait they would take well over
    // 10 s.
    let start = net.now;
    for i in 0..50 {
        assert!(net.barrier_over_all(SECOND * 10), "barrier {i}");
    }
    let took = net.now - start;
    assert!(took < SECOND * 3, "50 barriers took {took:?}");
    assert!(!someone_died(&net));
}

#[test]
fn a_node_cut_off_from_the_scheduler_for_less_than_the_recovery_timeout_comes_back() {
    let mut net = Network::cluster(1, 2, lossy(), 6);
    assert!(net.form(SECOND * 10));
    net.run_for(SECOND * 3);
    let worker = net.index_of(11).unwrap_or_default();
    // Its heartbeats and the scheduler's answers are lost for 4 s: the
    // scheduler declares it dead (2 s), it takes the scheduler for silent.
    net.heartbeats_lost.insert(worker);
    net.run_for(SECOND * 4);
    assert!(net.nodes[0]
        .core
        .dead_nodes(net.now, SECOND * 2)
        .contains(&11));
    assert!(net.nodes[worker].failures.is_empty(), "it waits");
    // The link heals: its next heartbeat takes it back, and the job goes
    // on with it.
    net.heartbeats_lost.clear();
    assert!(net.run_until(SECOND * 2, |n| n.nodes[0]
        .core
        .dead_nodes(n.now, SECOND * 2)
        .is_empty()));
    assert!(net.barrier_over_all(SECOND * 2));
    net.run_for(SECOND * 10);
    for n in &net.nodes {
        assert!(n.failures.is_empty(), "{:?}", n.failures);
        assert!(n.peer_dead.is_empty(), "{:?}", n.peer_dead);
    }
    // Cut off for longer than the heartbeat and recovery timeouts, it
    // stops.
    net.heartbeats_lost.insert(worker);
    assert!(net.run_until(SECOND * 9, |n| !n.nodes[worker].failures.is_empty()));
    assert!(matches!(
        net.nodes[worker].failures[..],
        [Failure::SchedulerLost { .. }]
    ));
}
