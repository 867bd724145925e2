//! ps-lite's default server handle, [`DefaultHandle`]: a sum store that
//! runs on one thread, on engine threads (with its check) or replicated.

use dashmap::DashMap;
use log::warn;
use pslite_proto::refusal::Refusal;

use super::{KVServer, ReplicatedHandle};
use crate::kv_pairs::{KVMeta, KVPairs, Key, Val};
use crate::sarray::SArray;

/// ps-lite's default server handle: pushes add into a store, pulls read it.
/// Keys may hold any number of values (lens); a key pulled before any push
/// reads as one zero. The store is a sharded concurrent map, so the handle
/// runs on engine threads as it is ([`DefaultHandle::into_handle`] for
/// [`KVServer::set_concurrent_request_handle`]).
pub struct DefaultHandle<V: Val> {
    store: DashMap<Key, Vec<V>, KeyHash>,
}

impl<V: Val> Default for DefaultHandle<V> {
    fn default() -> Self {
        DefaultHandle {
            store: DashMap::with_hasher(KeyHash),
        }
    }
}

/// The store's hash of a key: one multiply and a shift (keys come from
/// workers, not from strangers; a keyed SipHash per key cost the sum store
/// about 40% of its time).
#[derive(Clone, Copy, Default)]
pub struct KeyHash;

impl std::hash::BuildHasher for KeyHash {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

/// The hasher of [`KeyHash`].
#[derive(Default)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, key: u64) {
        let mixed = (self.0 ^ key).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = mixed ^ (mixed >> 29);
    }
}

impl<V: Val> DefaultHandle<V> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one request to the store and returns the response pairs
    /// (answer with them: [`KVServer::answer`]; callable from several
    /// threads at once). A push that sends a key another number of values
    /// than the key holds is refused whole ([`Refusal::Lengths`], naming
    /// the first such key): nothing of it is applied. A key's first push
    /// sets its number of values.
    pub fn apply(&self, meta: &KVMeta, req: &KVPairs<V>) -> Result<KVPairs<V>, Refusal> {
        if meta.push {
            self.check_lengths(meta, req)?;
            let per_key = req.values_per_key();
            let mut offset = 0;
            for (&key, &n) in req.keys.iter().zip(&per_key) {
                let vals = &req.vals[offset..offset + n];
                offset += n;
                let mut slot = self
                    .store
                    .entry(key)
                    .or_insert_with(|| vec![V::default(); n]);
                for (s, v) in slot.iter_mut().zip(vals) {
                    *s += *v;
                }
            }
        }
        if !meta.pull {
            return Ok(KVPairs::default());
        }
        let mut vals = Vec::new();
        let mut lens = Vec::with_capacity(req.keys.len());
        for key in req.keys.iter() {
            match self.store.get(key) {
                Some(stored) => {
                    vals.extend_from_slice(&stored);
                    lens.push(stored.len() as i32);
                }
                None => {
                    vals.push(V::default());
                    lens.push(1);
                }
            }
        }
        let uniform = lens.windows(2).all(|w| w[0] == w[1]);
        Ok(KVPairs {
            keys: req.keys.clone(),
            vals: SArray::from_vec(vals),
            lens: if uniform {
                SArray::new()
            } else {
                SArray::from_vec(lens)
            },
        })
    }

    /// Whether push `req` sends each key the number of values it holds
    /// (a key not yet held takes any): else [`Refusal::Lengths`] naming
    /// the first key that does not. Pulls always pass.
    pub fn check_lengths(&self, meta: &KVMeta, req: &KVPairs<V>) -> Result<(), Refusal> {
        if !meta.push {
            return Ok(());
        }
        let per_key = req.values_per_key();
        let mismatch = req.keys.iter().zip(&per_key).find_map(|(&key, &n)| {
            let held = self.store.get(&key)?.len();
            (held != n).then_some((key, held, n))
        });
        match mismatch {
            Some((key, held, sent)) => Err(Refusal::Lengths {
                app: meta.app_id,
                key,
                held: held as u64,
                sent: sent as u64,
            }),
            None => Ok(()),
        }
    }

    /// The stored keys in `[begin, end)` with their values (key order).
    pub fn range(&self, begin: Key, end: Key) -> Vec<(Key, Vec<V>)> {
        let mut out: Vec<(Key, Vec<V>)> = self
            .store
            .iter()
            .filter(|e| *e.key() >= begin && (*e.key() < end || end == u64::MAX))
            .map(|e| (*e.key(), e.value().clone()))
            .collect();
        out.sort_unstable_by_key(|(k, _)| *k);
        out
    }

    /// The handle as a closure for [`KVServer::set_request_handle`] or
    /// [`KVServer::set_concurrent_request_handle`] (engine threads).
    pub fn into_handle(self) -> impl Fn(&KVMeta, KVPairs<V>, &KVServer<V>) + Send + Sync + 'static {
        move |meta, req, server| {
            let res = self.apply(meta, &req);
            if let Err(e) = server.answer(meta, res) {
                warn!("cannot answer node {}: {e}", meta.sender);
            }
        }
    }
}

/// A copy of a key range: for each key, the key (`u64`), its number of
/// values (`u64`) and the values' bytes, little-endian.
impl<V: Val> ReplicatedHandle<V> for DefaultHandle<V> {
    fn handle(&mut self, meta: &KVMeta, req: KVPairs<V>, server: &KVServer<V>) {
        let res = self.apply(meta, &req);
        if let Err(e) = server.answer(meta, res) {
            warn!("cannot answer node {}: {e}", meta.sender);
        }
    }

    fn snapshot(&self, begin: Key, end: Key) -> Vec<u8> {
        let mut out = Vec::new();
        for (key, vals) in self.range(begin, end) {
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&(vals.len() as u64).to_le_bytes());
            out.extend_from_slice(bytemuck::cast_slice(&vals));
        }
        out
    }

    fn restore(&mut self, begin: Key, end: Key, data: &[u8]) -> Result<(), String> {
        let size = std::mem::size_of::<V>();
        let mut parsed = Vec::new();
        let mut at = 0;
        let word = |at: usize| -> Result<u64, String> {
            data.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| format!("the copy ends inside an entry at byte {at}"))
        };
        while at < data.len() {
            let key = word(at)?;
            let n = word(at + 8)? as usize;
            at += 16;
            let bytes = n
                .checked_mul(size)
                .and_then(|len| data.get(at..at + len))
                .ok_or_else(|| format!("key {key}: {n} values run past the copy's end"))?;
            if !(key >= begin && (key < end || end == u64::MAX)) {
                return Err(format!("key {key} is outside the range {begin}..{end}"));
            }
            let mut vals = vec![V::default(); n];
            bytemuck::cast_slice_mut::<V, u8>(&mut vals).copy_from_slice(bytes);
            parsed.push((key, vals));
            at += n * size;
        }
        self.store
            .retain(|&k, _| !(k >= begin && (k < end || end == u64::MAX)));
        self.store.extend(parsed);
        Ok(())
    }
}
