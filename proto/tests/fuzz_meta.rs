//! Property tests ("fuzzing" with proptest, bounded so CI can run them):
//! the meta decoder never panics on any input, and every meta it can write
//! reads back unchanged. `PROPTEST_CASES` raises the number of cases.

use proptest::prelude::*;
use pslite_proto::{Command, Control, DataType, Meta, Node, Role, K_EMPTY};

use pslite_proto::golden::ALL as GOLDEN;

fn unhex(s: &str) -> Vec<u8> {
    pslite_proto::golden::bytes(s).unwrap()
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4096),
        ..ProptestConfig::default()
    }
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![
        Just(Role::Server),
        Just(Role::Worker),
        Just(Role::Scheduler)
    ]
}

fn command() -> impl Strategy<Value = Command> {
    (0..6i32).prop_map(|c| Command::try_from(c).unwrap())
}

fn data_type() -> impl Strategy<Value = DataType> {
    (0..12i32).prop_map(|t| DataType::try_from(t).unwrap())
}

fn node() -> impl Strategy<Value = Node> {
    (
        role(),
        any::<i32>(),
        ".{0,20}",
        any::<i32>(),
        any::<bool>(),
        any::<i32>(),
    )
        .prop_map(
            |(role, id, hostname, port, is_recovery, customer_id)| Node {
                role,
                id,
                hostname,
                port,
                is_recovery,
                customer_id,
                pslite: false,
                host: String::new(),
                pid: 0,
                key: 0,
                features: 0,
            },
        )
}

prop_compose! {
    fn meta()(
        head in any::<i32>(),
        body in proptest::collection::vec(any::<u8>(), 0..64),
        cmd in command(),
        nodes in proptest::collection::vec(node(), 0..4),
        barrier_group in any::<i32>(),
        msg_sig in any::<u64>(),
        flags in any::<[bool; 4]>(),
        app_id in any::<i32>(),
        customer_id in any::<i32>(),
        timestamp in any::<i32>(),
        data_type in proptest::collection::vec(data_type(), 0..5),
        priority in any::<i32>(),
    ) -> Meta {
        Meta {
            head,
            body: body.into(),
            control: Control {
                cmd,
                // What the C++ rules do not write cannot read back.
                node: if cmd == Command::Empty { Vec::new() } else { nodes },
                barrier_group: if cmd == Command::Barrier { barrier_group } else { 0 },
                msg_sig: if cmd == Command::Ack { msg_sig } else { 0 },
                failed_peer: None,
                dead_nodes: Vec::new(),
                round: None,
                round_members: Vec::new(),
                stop: None,
                round_base: None,
                round_left: Vec::new(),
                shared: None,
            },
            request: flags[0],
            push: flags[1],
            pull: flags[2],
            simple_app: flags[3],
            app_id,
            customer_id,
            timestamp,
            data_type,
            priority,
            counters: None,
            status: Vec::new(),
            handler_panic: None,
            store: None,
            replica: None,
            checkpoint: None,
            refusal: None,
            partition: None,
            compression: None,
            staleness: None,
            same_keys: false,
            sender: K_EMPTY,
            recver: K_EMPTY,
            sender_key: None,
            route: None,
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Meta::decode(&bytes);
    }

    #[test]
    fn decoding_mutated_golden_frames_never_panics(
        which in 0..GOLDEN.len(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..6),
    ) {
        let mut frame = unhex(GOLDEN[which]);
        for (at, byte, op) in edits {
            if frame.is_empty() {
                frame.push(byte);
                continue;
            }
            let i = at.index(frame.len());
            match op {
                0 => frame[i] = byte,
                1 => frame.insert(i, byte),
                _ => frame.truncate(i),
            }
        }
        if let Ok(meta) = Meta::decode(&frame) {
            // Whatever decodes re-encodes without panicking.
            let _ = meta.encode();
        }
    }

    #[test]
    fn every_meta_reads_back_unchanged(m in meta()) {
        let decoded = Meta::decode(&m.encode()).unwrap();
        prop_assert_eq!(decoded, m);
    }
}
