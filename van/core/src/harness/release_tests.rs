//! The job's last barrier with replicated key ranges: a server stopped
//! (SIGSTOP) while it waits in it, declared dead and failed over before
//! the barrier is released, still gets its release (it arrived), and
//! leaves when it runs again.

use super::replica_tests::{config, map, serving, SECOND};
use super::*;
use crate::harness::app::SumApp;

const ALL: i32 = pslite_proto::ids::ALL_GROUP;

#[test]
fn a_failed_over_server_that_arrived_at_the_last_barrier_is_released() {
    for worker_late in [false, true] {
        // Heartbeats every 200 ms, dead after 3 s (above the 2 s a stopped
        // process needs to notice its clock jumped).
        let cfg = VanConfig {
            heartbeat_interval: Some(SECOND / 5),
            heartbeat_timeout: Some(SECOND * 3),
            ..config(2, false)
        };
        let mut net = Network::cluster(2, 1, cfg, 21);
        for i in 1..=2 {
            net.nodes[i].app = Some(SumApp::default());
        }
        assert!(net.form(SECOND * 10));
        assert!(net.run_until(SECOND * 5, serving));
        for n in &mut net.nodes {
            n.core.finalizing();
        }
        let stopped = net.index_of(10).expect("server 10");
        let other = net.index_of(8).expect("server 8");
        let worker = net.index_of(9).expect("worker 9");
        let s_wait = net.barrier(stopped, ALL);
        let sched_wait = net.barrier(0, ALL);
        let o_wait = net.barrier(other, ALL);
        net.run_for(SECOND / 2);
        net.pause(stopped);
        // Declared dead, its range fails over to server 8.
        assert!(net.run_until(SECOND * 5, |n| map(n).ranges[1].primary() == Some(8)));
        if worker_late {
            net.run_for(SECOND * 5);
        }
        let w_wait = net.barrier(worker, ALL);
        let others = [(0, sched_wait), (other, o_wait), (worker, w_wait)];
        assert!(
            net.run_until(SECOND * 5, |n| others
                .iter()
                .all(|&(i, t)| matches!(n.outcome(i, t), Some(Ok(()))))),
            "worker late: {worker_late}"
        );
        net.resume(stopped);
        assert!(
            net.run_until(SECOND * 5, |n| matches!(
                n.outcome(stopped, s_wait),
                Some(Ok(()))
            )),
            "worker late: {worker_late}: the stopped server was never released: {:?}, failures \
             {:?}",
            net.outcome(stopped, s_wait),
            net.nodes[stopped].failures
        );
    }
}
