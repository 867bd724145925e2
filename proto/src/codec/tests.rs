//! The golden meta frames of PROTOCOL.md, captured from C++ ps-lite traffic:
//! each is rebuilt from its decoded values and must encode to the same bytes.

use super::*;
use crate::golden;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    golden::bytes(s).unwrap()
}

fn node(role: Role, id: i32, port: i32, customer_id: i32) -> Node {
    Node {
        role,
        id,
        hostname: "127.0.0.1".into(),
        port,
        is_recovery: false,
        customer_id,
        pslite: false,
        host: String::new(),
        pid: 0,
        key: 0,
        features: 0,
    }
}

fn control(cmd: Command, nodes: Vec<Node>, barrier_group: i32) -> Control {
    Control {
        cmd,
        node: nodes,
        barrier_group,
        msg_sig: 0,
        failed_peer: None,
        dead_nodes: Vec::new(),
        round: None,
        round_members: Vec::new(),
        stop: None,
        round_base: None,
        round_left: Vec::new(),
        shared: None,
    }
}

/// Encodes `meta`, compares with `golden`, decodes `golden` and compares with `meta`.
fn check(name: &str, meta: Meta, golden: &str) {
    assert_eq!(
        hex(&meta.encode()),
        golden,
        "{name}: encoding differs from C++"
    );
    let decoded = Meta::decode(&unhex(golden)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(decoded, meta, "{name}: decoding differs");
}

#[test]
fn add_node_request() {
    let meta = Meta {
        control: control(
            Command::AddNode,
            vec![node(Role::Server, K_EMPTY, 9092, 0)],
            0,
        ),
        timestamp: 0,
        ..Meta::default()
    };
    check("ADD_NODE request", meta, golden::ADD_NODE_REQUEST);
}

#[test]
fn add_node_reply() {
    let nodes = vec![
        node(Role::Server, 8, 9092, 0),
        node(Role::Worker, 9, 9093, 0),
        node(Role::Worker, 11, 9094, 0),
        node(Role::Scheduler, 1, 9091, 376),
    ];
    let meta = Meta {
        control: control(Command::AddNode, nodes, 0),
        timestamp: 2,
        ..Meta::default()
    };
    check("ADD_NODE reply", meta, golden::ADD_NODE_REPLY);
}

#[test]
fn barrier_request_and_reply() {
    let request = Meta {
        control: control(Command::Barrier, vec![], 7),
        request: true,
        app_id: 0,
        customer_id: 0,
        timestamp: 3,
        ..Meta::default()
    };
    check("BARRIER request", request, golden::BARRIER_REQUEST);
    let reply = Meta {
        control: control(Command::Barrier, vec![], 441_436_800),
        app_id: 0,
        customer_id: 0,
        timestamp: 7,
        ..Meta::default()
    };
    check("BARRIER reply", reply, golden::BARRIER_REPLY);
}

#[test]
fn terminate() {
    let meta = Meta {
        control: control(Command::Terminate, vec![], 0),
        customer_id: 0,
        ..Meta::default()
    };
    check("TERMINATE", meta, golden::TERMINATE);
}

fn data_meta(timestamp: i32) -> Meta {
    Meta {
        head: 0,
        app_id: 0,
        customer_id: 0,
        timestamp,
        ..Meta::default()
    }
}

#[test]
fn kv_messages() {
    let types = vec![DataType::UInt64, DataType::Other, DataType::Int32];
    let push = Meta {
        request: true,
        push: true,
        data_type: types.clone(),
        ..data_meta(3)
    };
    check("push request", push, golden::PUSH_REQUEST);
    let push_response = Meta {
        push: true,
        ..data_meta(1)
    };
    check("push response", push_response, golden::PUSH_RESPONSE);
    let pull_response = Meta {
        pull: true,
        data_type: types,
        ..data_meta(6)
    };
    check("pull response", pull_response, golden::PULL_RESPONSE);
}

#[test]
fn simple_app_response() {
    let meta = Meta {
        head: 3,
        simple_app: true,
        ..data_meta(0)
    };
    check("SimpleApp response", meta, golden::SIMPLE_APP_RESPONSE);
}

#[test]
fn body_is_written_only_when_present() {
    let mut meta = data_meta(5);
    meta.simple_app = true;
    meta.request = true;
    meta.body = bytes::Bytes::from_static(b"test");
    let decoded = Meta::decode(&meta.encode()).unwrap();
    assert_eq!(decoded.body.as_ref(), b"test");
    meta.body = bytes::Bytes::new();
    assert!(!hex(&meta.encode()).contains("1204"));
}

#[test]
fn negative_garbage_barrier_group_round_trips() {
    // C++ leaves barrier_group uninitialised in replies: it may be negative,
    // which protobuf writes as a 10-byte varint.
    let meta = Meta {
        control: control(Command::Barrier, vec![], -1_234_567),
        app_id: 0,
        customer_id: 0,
        timestamp: 9,
        ..Meta::default()
    };
    let frame = meta.encode();
    assert_eq!(Meta::decode(&frame).unwrap(), meta);
}

#[test]
fn ack_carries_msg_sig_only() {
    let mut meta = Meta {
        control: Control::new(Command::Ack),
        ..Meta::default()
    };
    meta.control.msg_sig = 0xdead_beef_1234;
    meta.control.barrier_group = 5; // not written on ACK
    let decoded = Meta::decode(&meta.encode()).unwrap();
    assert_eq!(decoded.control.msg_sig, 0xdead_beef_1234);
    assert_eq!(decoded.control.barrier_group, 0);
}

#[test]
fn absent_fields_take_cxx_defaults() {
    // An empty frame is a valid (all-absent) PBMeta.
    let meta = Meta::decode(&[]).unwrap();
    assert_eq!(meta.head, 0);
    assert_eq!(meta.app_id, K_EMPTY);
    assert_eq!(meta.timestamp, K_EMPTY);
    assert_eq!(meta.customer_id, 0);
    assert!(meta.control.is_empty());
}

#[test]
fn malformed_frames_are_typed_errors() {
    assert!(matches!(
        Meta::decode(&unhex("ffffffff")),
        Err(DecodeError::Protobuf(_))
    ));
    // control with cmd 9
    assert!(matches!(
        Meta::decode(&unhex("1a020809")),
        Err(DecodeError::UnknownCommand(9))
    ));
    // data_type [12]
    assert!(matches!(
        Meta::decode(&unhex("4a010c")),
        Err(DecodeError::UnknownDataType(12))
    ));
    // ADD_NODE with a node of role 7
    assert!(matches!(
        Meta::decode(&unhex("1a0608021202 0807".replace(' ', "").as_str())),
        Err(DecodeError::UnknownRole(7))
    ));
    // A control part without its required cmd reads as cmd 0 (a data
    // message), as prost does not track presence of required scalars.
    assert!(Meta::decode(&unhex("1a00")).unwrap().control.is_empty());
    // every truncation of a golden frame is an error or a valid meta, never a panic
    let golden = unhex(golden::ADD_NODE_REQUEST);
    for len in 0..golden.len() {
        let _ = Meta::decode(&golden[..len]);
    }
}

#[test]
fn pslite_only_fields_round_trip_and_stay_off_by_default() {
    use crate::stats::{NodeCounters, NodeStatus, PeerCounters};
    let counters = NodeCounters {
        peers: vec![PeerCounters {
            peer: 8,
            messages_sent: 2,
            bytes_sent: 300,
            messages_received: 1,
            bytes_received: 40,
        }],
        resends: 1,
        dropped_injected: 5,
        requests_in_flight: -1,
        handler_calls: 7,
        handler_nanos: 9000,
        uptime: std::time::Duration::from_millis(1234),
        ..NodeCounters::default()
    };
    let mut meta = Meta {
        control: control(Command::Heartbeat, vec![node(Role::Worker, 9, 9093, 0)], 0),
        ..Meta::default()
    };
    let plain = meta.encode();
    meta.counters = Some(Box::new(counters.clone()));
    let with_counters = meta.encode();
    // The extension is appended as field 100 after ps-lite's own fields.
    assert_eq!(&with_counters[..plain.len()], &plain[..]);
    assert_eq!(&with_counters[plain.len()..plain.len() + 2], &[0xa2, 0x06]);
    assert_eq!(Meta::decode(&with_counters).unwrap(), meta);

    let answer = Meta {
        control: control(Command::Status, Vec::new(), 0),
        status: vec![NodeStatus {
            node: node(Role::Server, 8, 9092, 0),
            last_seen: Some(std::time::Duration::from_millis(5)),
            dead: true,
            counters: Some(counters),
            counters_age: Some(std::time::Duration::from_millis(7)),
            waiting: true,
            round_rank: Some(2),
        }],
        ..Meta::default()
    };
    assert_eq!(Meta::decode(&answer.encode()).unwrap(), answer);
}

#[test]
fn pslite_only_fields_round_trip_and_are_absent_by_default() {
    let mut meta = Meta {
        control: control(Command::Barrier, vec![node(Role::Worker, 9, 5000, 0)], 7),
        ..Meta::default()
    };
    let plain = meta.encode();
    meta.control.failed_peer = Some(11);
    meta.control.dead_nodes = vec![11, 13];
    meta.control.node[0].pslite = true;
    let extended = meta.encode();
    assert!(extended.len() > plain.len());
    let back = Meta::decode(&extended).unwrap();
    assert_eq!(back.control.failed_peer, Some(11));
    assert_eq!(back.control.dead_nodes, vec![11, 13]);
    assert!(back.control.node[0].pslite);
    let back = Meta::decode(&plain).unwrap();
    assert_eq!(back.control.failed_peer, None);
    assert!(back.control.dead_nodes.is_empty() && !back.control.node[0].pslite);
}

#[test]
fn store_messages_round_trip_and_unknown_ops_are_refused() {
    use crate::store::{StoreMsg, StoreOp, StoreStatus};
    let store = StoreMsg {
        id: 42,
        op: StoreOp::CompareSet,
        keys: vec!["k".into(), "é".into()],
        value: Some(bytes::Bytes::from_static(b"\0new")),
        expected: Some(bytes::Bytes::new()),
        number: -7,
        timeout: Some(std::time::Duration::from_millis(1500)),
        status: StoreStatus::Timeout,
        error: Some("why".into()),
        found: true,
        version: 9,
        values: vec![bytes::Bytes::new(), bytes::Bytes::from_static(b"v")],
        limit: Some(crate::store::OverLimit {
            which: crate::store::StoreLimit::Watches,
            size: 3,
            limit: 2,
        }),
    };
    let mut meta = Meta {
        control: Control::new(Command::Store),
        request: true,
        customer_id: 0,
        store: Some(Box::new(store)),
        ..Meta::default()
    };
    let back = Meta::decode(&meta.encode()).unwrap();
    assert_eq!(back, meta);
    // An empty expected value differs from none (the key must not exist).
    meta.store.as_mut().unwrap().expected = None;
    assert_eq!(Meta::decode(&meta.encode()).unwrap().store, meta.store);

    // A bound this node does not know (a newer scheduler) still refuses,
    // without the typed part.
    let mut pb = meta.to_pb();
    if let Some(limit) = pb.store.as_mut().and_then(|s| s.limit.as_mut()) {
        limit.which = Some(99);
    }
    let back = Meta::decode(&prost::Message::encode_to_vec(&pb)).unwrap();
    assert_eq!(back.store.and_then(|s| s.limit), None);

    let mut pb = meta.to_pb();
    pb.store.as_mut().unwrap().op = Some(99);
    let bytes = prost::Message::encode_to_vec(&pb);
    assert!(matches!(
        Meta::decode(&bytes),
        Err(DecodeError::UnknownStoreOp)
    ));
}

#[test]
fn shm_fields_round_trip_and_stay_off_the_wire_when_unused() {
    use crate::shm::ShmFrame;
    let meta = data_meta(3);
    // No descriptors: the very bytes of `encode` (golden frames unchanged).
    assert_eq!(meta.encode_with_shm(&[]), meta.encode());
    let frame = ShmFrame {
        index: 1,
        fd: 7,
        token: 0xfeed,
        generation: 3,
        offset: 0,
        length: 1 << 20,
    };
    let bytes = meta.encode_with_shm(&[frame]);
    assert_ne!(bytes, meta.encode());
    // A decoder that ignores field 104 (as C++ does) reads the same meta.
    assert_eq!(Meta::decode(&bytes).unwrap(), meta);
    let (back, shm) = Meta::decode_with_shm(&bytes).unwrap();
    assert_eq!(back, meta);
    assert_eq!(shm, vec![frame]);
    let (_, none) = Meta::decode_with_shm(&meta.encode()).unwrap();
    assert!(none.is_empty());

    // Host identity and pid ride on the node entry, absent when unset.
    let mut ctl = Meta {
        control: Control::new(Command::AddNode),
        ..Meta::default()
    };
    ctl.control.node.push(node(Role::Worker, 9, 1234, 0));
    let plain = ctl.encode();
    ctl.control.node[0].host = "boot/uid/ns".into();
    ctl.control.node[0].pid = 4242;
    let with = ctl.encode();
    assert!(with.len() > plain.len());
    let back = Meta::decode(&with).unwrap();
    assert_eq!(back.control.node[0].host, "boot/uid/ns");
    assert_eq!(back.control.node[0].pid, 4242);
}

#[test]
fn partition_compression_and_features_round_trip_and_are_absent_by_default() {
    use crate::compression::{CompressionKind, CompressionMsg};
    use crate::partition::Partition;
    // A C++ push's bytes are unchanged until a field is set.
    let mut meta = cxx_push();
    assert_eq!(hex(&meta.encode()), golden::PUSH_REQUEST);
    meta.partition = Some(Box::new(Partition {
        id: 77,
        index: 0,
        count: 3,
        total: 3_000_000,
        offset: 0,
        frames: vec![8, 2_999_992],
    }));
    meta.compression = Some(Box::new(CompressionMsg {
        kind: CompressionKind::TopK,
        param: 0.01,
        count: Some(1000),
        k: 10,
        seed: 0,
        answer: true,
        answer_feedback: true,
    }));
    let bytes = meta.encode();
    assert!(
        bytes.starts_with(&unhex(golden::PUSH_REQUEST)),
        "appended after ps-lite's fields"
    );
    assert_eq!(Meta::decode(&bytes).unwrap(), meta);
    // An unknown compressor is refused with its own error.
    let mut pb = meta.to_pb();
    if let Some(c) = pb.compression.as_mut() {
        c.kind = Some(9);
    }
    let mut buf = Vec::new();
    prost::Message::encode(&pb, &mut buf).unwrap();
    assert!(matches!(
        Meta::decode(&buf),
        Err(DecodeError::UnknownCompression)
    ));
    // A node's features travel with its entry, and only when set.
    let mut n = node(Role::Server, 8, 9092, 0);
    let plain = control(Command::AddNode, vec![n.clone()], 0);
    n.features = crate::FEATURE_PARTITION | crate::FEATURE_COMPRESSION;
    let with = control(Command::AddNode, vec![n], 0);
    let (a, b) = (
        Meta {
            control: plain,
            ..Meta::default()
        },
        Meta {
            control: with,
            ..Meta::default()
        },
    );
    assert!(b.encode().len() > a.encode().len());
    assert_eq!(Meta::decode(&b.encode()).unwrap(), b);
    assert_eq!(
        Meta::decode(&a.encode()).unwrap().control.node[0].features,
        0
    );
}

#[test]
fn shared_node_entries_read_back_after_the_messages_own() {
    let shared = crate::SharedNodes::new(vec![
        node(Role::Server, 8, 9092, 0),
        node(Role::Server, 10, 9093, 0),
    ]);
    let own = node(Role::Worker, 9, 9100, 0);
    let mut meta = Meta {
        control: control(Command::AddNode, vec![own.clone()], 0),
        timestamp: 7,
        ..Meta::default()
    };
    meta.control.round = Some(3);
    meta.control.shared = Some(shared.clone());
    let frame = meta.encode();
    assert_eq!(frame, meta.encode_with_shm(&[]));
    let read = Meta::decode(&frame).unwrap();
    // One list, in order: the message's entries, then the shared ones.
    let mut want = vec![own];
    want.extend(shared.nodes().iter().cloned());
    assert_eq!(read.control.node, want);
    assert_eq!(read.control.round, Some(3));
    assert_eq!(read.control.cmd, Command::AddNode);
    assert_eq!(read.timestamp, 7);
    assert!(read.control.shared.is_none());
    // The same as a message holding all of them (what a C++ node gets).
    let mut whole = meta.clone();
    whole.control.shared = None;
    whole.control.node = want;
    assert_eq!(Meta::decode(&whole.encode()).unwrap(), read);
    assert_eq!(meta.control.node_count(), 3);
}

#[test]
fn same_keys_round_trips_and_is_absent_by_default() {
    // A C++ push's bytes are unchanged until the field is set.
    let mut meta = cxx_push();
    assert_eq!(hex(&meta.encode()), golden::PUSH_REQUEST);
    meta.same_keys = true;
    let bytes = meta.encode();
    assert!(
        bytes.starts_with(&unhex(golden::PUSH_REQUEST)),
        "appended after ps-lite's fields"
    );
    assert_eq!(bytes.len(), unhex(golden::PUSH_REQUEST).len() + 3);
    assert_eq!(Meta::decode(&bytes).unwrap(), meta);
}

/// The meta of a C++ worker's push (`golden::PUSH_REQUEST`).
fn cxx_push() -> Meta {
    Meta {
        app_id: 0,
        timestamp: 3,
        request: true,
        push: true,
        customer_id: 0,
        head: 0,
        data_type: vec![DataType::UInt64, DataType::Other, DataType::Int32],
        ..Meta::default()
    }
}
