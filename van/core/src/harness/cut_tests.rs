//! Cut links (`ip link set ... down`/`up`, see `cut.rs`): the scheduler's
//! own cut is not the nodes' death; one node's cut is, on time; and a
//! scheduler cut off for longer than the heartbeat timeout plus the
//! recovery timeout ends the job on both sides.

use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// The chaos soak's liveness: heartbeats every second, dead after 4 s,
/// `PS_RESEND=1`; 5 s to recover.
fn soak() -> VanConfig {
    VanConfig {
        heartbeat_interval: Some(SECOND),
        heartbeat_timeout: Some(SECOND * 4),
        watch_all: true,
        recovery_timeout: SECOND * 5,
        resend_timeout: Some(SECOND),
        ..VanConfig::default()
    }
}

/// The soak's cluster (3 servers, 4 workers), formed and heartbeating.
fn formed(seed: u64) -> Network {
    let mut net = Network::cluster(3, 4, soak(), seed);
    assert!(net.form(SECOND * 10));
    net.run_for(SECOND * 3);
    net
}

/// Whether the scheduler holds someone dead.
fn someone_dead(n: &Network) -> bool {
    !n.nodes[0].core.declared_dead(n.now).is_empty()
}

#[test]
fn a_cut_of_the_schedulers_link_below_the_timeout_kills_nobody() {
    // Cuts of 2-3.5 s begun at every tenth of the heartbeat period: what
    // the nodes send meanwhile arrives at TCP's next retransmission, up to
    // twice the cut later, so without the outage rule some node's last
    // message is more than the 4 s timeout old when it arrives.
    for phase in 0..10u32 {
        for cut_ms in [2000u64, 3000, 3500] {
            let mut net = formed(u64::from(phase) + 100 * cut_ms);
            net.run_for(SECOND / 10 * phase);
            net.cut_link(0, Duration::from_millis(cut_ms));
            assert!(
                !net.run_until(SECOND * 20, someone_dead),
                "phase {phase}, cut {cut_ms} ms: the scheduler declared {:?} dead",
                net.nodes[0].core.declared_dead(net.now)
            );
            for n in &net.nodes {
                assert!(n.failures.is_empty(), "{:?}", n.failures);
            }
            // And the job goes on.
            assert!(net.barrier_over_all(SECOND * 2));
        }
    }
}

#[test]
fn one_nodes_cut_link_is_its_death_on_time() {
    for phase in 0..5u32 {
        let mut net = formed(u64::from(phase));
        net.run_for(SECOND / 5 * phase);
        let server = net.index_of(9).expect("server 9");
        let cut = net.now;
        net.cut_link(server, SECOND * 8);
        assert!(net.run_until(SECOND * 8, someone_dead));
        // Dead after 4 s of silence, its last heartbeat at most 1 s before
        // the cut (ticks land 1 ms late).
        let took = net.now - cut;
        assert!(
            took >= SECOND * 3 && took <= SECOND * 4 + SECOND / 10,
            "phase {phase}: took {took:?}"
        );
        assert_eq!(net.nodes[0].core.declared_dead(net.now), vec![9]);
    }
}

#[test]
fn a_paused_server_during_the_schedulers_cut_still_dies() {
    // The scheduler's 3 s cut excuses everyone's silence while it lasts;
    // a server stopped since just before it is declared dead once the
    // others are heard again (a timeout after the outage), and nobody else.
    let mut net = formed(7);
    let server = net.index_of(10).expect("server 10");
    net.pause(server);
    net.cut_link(0, SECOND * 3);
    assert!(net.run_until(SECOND * 15, someone_dead));
    assert_eq!(net.nodes[0].core.declared_dead(net.now), vec![10]);
    net.run_for(SECOND * 5);
    assert_eq!(net.nodes[0].core.declared_dead(net.now), vec![10]);
}

#[test]
fn a_scheduler_cut_off_past_the_timeout_and_recovery_ends_the_job() {
    // Decided: in its own outage the scheduler allows the nodes as much
    // silence as they allow it: the heartbeat timeout plus
    // PS_RECOVERY_TIMEOUT (4 + 5 s here). Past that it declares them dead,
    // and they, hearing no scheduler for as long, fail on their own.
    // Nothing waits forever.
    let mut net = formed(3);
    let cut = net.now;
    net.cut_link(0, SECOND * 30);
    assert!(net.run_until(SECOND * 20, someone_dead));
    let took = net.now - cut;
    assert!(
        took >= SECOND * 8 - SECOND / 10 && took <= SECOND * 9 + SECOND / 2,
        "the scheduler gave up on the outage after {took:?}"
    );
    assert!(net.run_until(SECOND * 10, |n| n.nodes[1..]
        .iter()
        .all(|x| !x.failures.is_empty())));
    for n in &net.nodes[1..] {
        assert!(
            matches!(n.failures[..], [Failure::SchedulerLost { .. }]),
            "{:?}",
            n.failures
        );
    }
}
