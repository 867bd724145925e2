//! A large pull in chunks: how its keys are cut, and its answers' values
//! put in place as they arrive (see the [`KVWorker`](crate::KVWorker) docs).

use crate::kv_pairs::{KVPairs, Key, Val};
use crate::sarray::SArray;

/// A large pull sends a pslite server its keys in requests of at most
/// this many bytes of keys (fewer, larger requests cost less per byte)...
pub const PULL_CHUNK_BYTES: usize = 4 << 20;
/// ... the first of this many (the first answer starts once it arrived: 2
/// ms at 1 Gbit/s), each next one twice the one before.
pub const PULL_FIRST_CHUNK_BYTES: usize = 256 << 10;

/// A pull's keys in chunks of `first` keys, each next chunk twice the one
/// before up to `most` keys (at least one chunk; a remainder under half of
/// the next chunk joins the last one), sharing the keys' buffer.
pub(super) fn pull_chunks(keys: &SArray<Key>, first: usize, most: usize) -> Vec<SArray<Key>> {
    let most = most.max(1);
    let mut size = first.clamp(1, most);
    let n = keys.len();
    let mut out = Vec::new();
    let mut at = 0;
    while at < n {
        let end = if n - at < size + size.div_ceil(2) {
            n
        } else {
            at + size
        };
        out.push(keys.slice(at..end));
        at = end;
        size = (size * 2).min(most);
    }
    if out.is_empty() {
        out.push(keys.clone());
    }
    out
}

/// A pull's values put in place as its answers arrive (answers with the
/// same number of values for every key, no lens), so that its completion
/// need not join them.
pub(super) struct Placed<V: Val> {
    vals: Vec<V>,
    /// Values per key (set by the first answer).
    per_key: Option<usize>,
    /// Keys placed.
    keys: usize,
    /// An answer did not fit: joined at the end instead.
    broken: bool,
}

impl<V: Val> Placed<V> {
    pub(super) fn new() -> Self {
        Placed {
            vals: Vec::new(),
            per_key: None,
            keys: 0,
            broken: false,
        }
    }

    /// Copies answer `part` to its place among `requested`.
    pub(super) fn place(&mut self, requested: &[Key], part: &KVPairs<V>) {
        let n = part.keys.len();
        let Some(&first) = part.keys.first() else {
            return;
        };
        if self.broken || !part.lens.is_empty() || part.vals.len() % n != 0 {
            self.broken = true;
            return;
        }
        let k = part.vals.len() / n;
        if *self.per_key.get_or_insert(k) != k {
            self.broken = true;
            return;
        }
        if self.vals.is_empty() {
            self.vals = vec![V::default(); requested.len() * k];
        }
        let at = requested.partition_point(|&x| x < first);
        match self.vals.get_mut(at * k..(at + n) * k) {
            Some(out) => {
                out.copy_from_slice(&part.vals);
                self.keys += n;
            }
            None => self.broken = true,
        }
    }

    /// The values, if every answer was placed and they cover `requested`
    /// (the keys are checked apart).
    pub(super) fn take(&mut self, requested: usize) -> Option<SArray<V>> {
        (!self.broken && self.keys == requested && self.per_key.is_some())
            .then(|| SArray::from_vec(std::mem::take(&mut self.vals)))
    }
}
