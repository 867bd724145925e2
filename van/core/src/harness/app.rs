//! The apps of the harness's nodes: [`SumApp`], a server app that sums
//! what is pushed and copies and restores key ranges, enough to check that
//! replication and checkpoints lose and double nothing.

use pslite_proto::Message;

/// A server app for the replication tests: sums pushed `i64` values per
/// key, remembers every value applied (each push carries values never
/// pushed before, so applying one twice shows), answers pulls with the sums,
/// and copies and restores key ranges.
#[derive(Clone, Debug, Default)]
pub struct SumApp {
    /// Per key: the values applied.
    pub store: std::collections::BTreeMap<u64, Vec<i64>>,
    /// Values applied a second time.
    pub doubles: Vec<(u64, i64)>,
    /// What it did, for test failures.
    pub trace: Vec<String>,
}

pub(super) fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

pub(super) fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

impl SumApp {
    /// Applies a KV request; returns the answer (the core pairs it).
    pub fn apply(&mut self, msg: &Message) -> Message {
        let keys = msg.data.first().map(|b| u64s(b)).unwrap_or_default();
        if msg.meta.push {
            let vals = msg.data.get(1).map(|b| i64s(b)).unwrap_or_default();
            self.trace.push(format!(
                "apply from {} ts {} keys {keys:?} vals {vals:?}",
                msg.meta.sender, msg.meta.timestamp
            ));
            for (k, v) in keys.iter().zip(vals) {
                let slot = self.store.entry(*k).or_default();
                if slot.contains(&v) {
                    self.doubles.push((*k, v));
                }
                slot.push(v);
            }
        }
        let mut answer = Message::default();
        answer.meta.app_id = msg.meta.app_id;
        answer.meta.customer_id = msg.meta.customer_id;
        answer.meta.push = msg.meta.push;
        answer.meta.pull = msg.meta.pull;
        answer.meta.head = msg.meta.head;
        answer.meta.timestamp = msg.meta.timestamp;
        answer.meta.recver = msg.meta.sender;
        if msg.meta.pull {
            let sums: Vec<u8> = keys
                .iter()
                .flat_map(|k| self.sum(*k).to_le_bytes())
                .collect();
            let keys: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
            answer.data = vec![keys.into(), sums.into()];
            answer.meta.data_type = vec![
                pslite_proto::DataType::UInt64,
                pslite_proto::DataType::Int64,
            ];
        }
        answer
    }

    /// The sum of key `k`'s values.
    pub fn sum(&self, k: u64) -> i64 {
        self.store.get(&k).map_or(0, |v| v.iter().sum())
    }

    /// The keys in `[begin, end)` with their values.
    pub fn copy(&self, begin: u64, end: u64) -> Vec<(u64, Vec<i64>)> {
        self.store
            .iter()
            .filter(|(&k, _)| k >= begin && (k < end || end == u64::MAX))
            .map(|(&k, v)| (k, v.clone()))
            .collect()
    }

    pub(super) fn snapshot(&self, begin: u64, end: u64) -> bytes::Bytes {
        let mut out = Vec::new();
        for (k, vals) in self.copy(begin, end) {
            out.extend(k.to_le_bytes());
            out.extend((vals.len() as u64).to_le_bytes());
            for v in vals {
                out.extend(v.to_le_bytes());
            }
        }
        out.into()
    }

    pub(super) fn restore(&mut self, begin: u64, end: u64, data: &[u8]) {
        self.trace
            .push(format!("restore {begin}..{end}: {} bytes", data.len()));
        self.store
            .retain(|&k, _| !(k >= begin && (k < end || end == u64::MAX)));
        let words = u64s(data);
        let mut at = 0;
        while at + 2 <= words.len() {
            let (k, n) = (words[at], words[at + 1] as usize);
            let vals = words[at + 2..at + 2 + n]
                .iter()
                .map(|&w| w as i64)
                .collect();
            self.store.insert(k, vals);
            at += 2 + n;
        }
    }
}
