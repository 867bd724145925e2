//! Property tests of the scheduler state machine: arbitrary sequences of
//! control messages from arbitrary senders never panic it, and whatever it
//! does keeps its invariants (valid ids per role, one id per process).

// The test takes its time origin from the clock.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use proptest::prelude::*;
use pslite_proto::ids;
use pslite_proto::{Command, Message, Node, Role, K_EMPTY};
use pslite_van_core::effects::{Effect, Effects};
use pslite_van_core::scheduler::{Scheduler, SchedulerConfig};
use pslite_van_core::VanConfig;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2048),
        ..ProptestConfig::default()
    }
}

fn message() -> impl Strategy<Value = Message> {
    (
        0..6i32,
        prop_oneof![Just(K_EMPTY), -2..16i32],
        proptest::collection::vec((0..3i32, 9000..9006i32, -1..3i32, any::<bool>()), 0..3),
        -2..10i32,
        any::<bool>(),
        -1..3i32,
    )
        .prop_map(|(cmd, sender, nodes, group, request, customer)| {
            let mut msg = Message::control(Command::try_from(cmd).unwrap(), 1);
            msg.meta.sender = sender;
            msg.meta.request = request;
            msg.meta.customer_id = customer;
            msg.meta.control.barrier_group = group;
            msg.meta.control.node = nodes
                .into_iter()
                .map(|(role, port, cid, host)| {
                    let mut n = Node::new(
                        Role::try_from(role).unwrap(),
                        if host { "127.0.0.1" } else { "10.0.0.1" },
                        port,
                    );
                    n.customer_id = cid;
                    n
                })
                .collect();
            msg
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_control_traffic_keeps_the_invariants(
        msgs in proptest::collection::vec((message(), 0..3000u64), 0..60),
        heartbeats in any::<bool>(),
    ) {
        let mut me = Node::new(Role::Scheduler, "127.0.0.1", 8999);
        me.id = 1;
        let t0 = Instant::now();
        let van = VanConfig {
            num_servers: 2,
            num_workers: 2,
            heartbeat_timeout: heartbeats.then(|| Duration::from_secs(1)),
            heartbeat_interval: None,
            recovery_timeout: Duration::from_secs(3),
            watch_all: true,
            ..VanConfig::default()
        };
        let mut s = Scheduler::new(SchedulerConfig { me, van }, t0);
        let mut now = t0;
        for (msg, dt) in msgs {
            now += Duration::from_millis(dt);
            let mut fx = Effects::default();
            s.on_message(&msg, now, &mut fx);
            s.on_tick(now, &mut fx);
            for a in fx {
                if let Effect::Send(m) = a {
                    prop_assert!(m.meta.recver != K_EMPTY);
                }
            }
            if s.is_ready() {
                for n in s.nodes() {
                    prop_assert_eq!(ids::role_of_id(n.id), Some(n.role));
                    // One id per process, one process per id.
                    for other in s.nodes() {
                        prop_assert_eq!(n.same_process(other), n.id == other.id);
                    }
                }
            }
        }
    }
}
