//! Property tests of KV message assembly: any frames with any types either
//! read as consistent key-value pairs or are rejected, never a panic.

use bytes::Bytes;
use proptest::prelude::*;
use pslite::{DataType, KVPairs, Message};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4096),
        ..ProptestConfig::default()
    }
}

fn frames() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<i32>, usize)> {
    (
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..96), 0..5),
        proptest::collection::vec(0..12i32, 0..5),
        0..8usize,
    )
}

fn message(frames: Vec<Vec<u8>>, types: Vec<i32>, offset: usize) -> Message {
    let mut msg = Message::default();
    msg.meta.data_type = types
        .into_iter()
        .filter_map(|t| DataType::try_from(t).ok())
        .collect();
    // Offsets make frames misaligned, as ZeroMQ may deliver them.
    msg.data = frames
        .into_iter()
        .map(|f| {
            let mut padded = vec![0u8; offset];
            padded.extend(f);
            Bytes::from(padded).slice(offset..)
        })
        .collect();
    msg
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn kv_frames_are_read_or_rejected((frames, types, offset) in frames()) {
        let msg = message(frames, types, offset);
        if let Ok(kvs) = KVPairs::<f32>::from_message(&msg) {
            prop_assert!(kvs.check_shape(false).is_ok());
            // Every value belongs to a key.
            let per_key: usize = kvs.values_per_key().iter().sum();
            prop_assert_eq!(per_key, kvs.vals.len());
        }
        let _ = KVPairs::<u8>::from_message(&msg);
        let _ = KVPairs::<f64>::from_message(&msg);
    }

    #[test]
    fn valid_pairs_round_trip(keys in proptest::collection::btree_set(any::<u64>(), 0..20), k in 1..4usize) {
        let keys: Vec<u64> = keys.into_iter().collect();
        let vals: Vec<i32> = (0..keys.len() * k).map(|i| i as i32).collect();
        let pairs = KVPairs::new(keys, vals);
        let (frames, types) = pairs.to_frames();
        let mut msg = Message { data: frames, ..Message::default() };
        msg.meta.data_type = types;
        prop_assert_eq!(KVPairs::<i32>::from_message(&msg).unwrap(), pairs);
    }
}
