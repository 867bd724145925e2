//! A worker's side of compression: per key, what error feedback held back
//! and momentum correction's velocity, the seeds of `randomk`, and a
//! server's share of a request prepared with them.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use pslite_proto::{lock, DataType};

use super::{as_f32, encode, from_f32, randomk, Compression, CompressionKind, Encoded};
use super::{ErrorFeedback, Layout, Velocity};
use crate::kv_pairs::{KVPairs, Key, Val};

/// What a worker's compression holds for one key, to save with a
/// checkpoint and restore ([`KVWorker::compression_state`],
/// [`KVWorker::set_compression_state`]): the key's values are compressed
/// and sent with these added, so a worker restarted without them loses
/// what compression held back and the momentum.
///
/// [`KVWorker::compression_state`]: crate::KVWorker::compression_state
/// [`KVWorker::set_compression_state`]: crate::KVWorker::set_compression_state
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyState {
    /// Momentum correction's velocity (`u = momentum * u + g`, one value
    /// per value of the key), `None` before the key's first push with
    /// momentum.
    pub velocity: Option<Vec<f32>>,
    /// Error feedback's residual: what compression has held back so far
    /// (`None`: nothing).
    pub residual: Option<Vec<f32>>,
}

/// A worker's compression state: error feedback, momentum correction's
/// velocities and the push counts `randomk` seeds derive from.
#[derive(Default)]
pub(crate) struct WorkerState {
    feedback: Mutex<ErrorFeedback>,
    velocity: Mutex<Velocity>,
    /// Messages compressed so far per first key (so workers pushing the
    /// same keys in step derive the same seeds).
    counts: Mutex<HashMap<Key, u64>>,
}

impl WorkerState {
    /// What this worker's compression holds for key `key`.
    pub(crate) fn key_state(&self, key: Key) -> KeyState {
        KeyState {
            velocity: lock(&self.velocity).get(key).map(<[f32]>::to_vec),
            residual: lock(&self.feedback).residual(key).map(<[f32]>::to_vec),
        }
    }

    /// Replaces what this worker's compression holds for key `key`.
    pub(crate) fn restore(&self, key: Key, state: &KeyState) {
        lock(&self.velocity).set(key, state.velocity.as_deref());
        lock(&self.feedback).set(key, state.residual.as_deref());
    }

    /// The seed of the next message whose first key is `first`.
    fn next_seed(&self, c: &Compression, first: Key) -> u64 {
        let mut counts = lock(&self.counts);
        let n = counts.entry(first).or_insert(0);
        *n += 1;
        let mut mix = randomk::SplitMix64::new(c.seed ^ first.rotate_left(17) ^ n.rotate_left(43));
        mix.next_u64()
    }

    /// Prepares one server's share of a request: compresses a push's values
    /// (with error feedback) and asks for a compressed answer, as `c` says.
    /// The caller checked that the server reads compressed values.
    pub(crate) fn prepare<V: Val>(
        &self,
        c: &Compression,
        push: bool,
        pull: bool,
        slice: &KVPairs<V>,
        meta: &mut pslite_proto::Meta,
        frames: &mut [Bytes],
    ) {
        let Some(first) = slice.keys.first().copied() else {
            return;
        };
        let needs_seed = c.kind == CompressionKind::RandomK;
        let seed = if needs_seed {
            self.next_seed(c, first)
        } else {
            0
        };
        let mut msg = (c.answers && pull).then(|| c.msg(seed));
        if push && !slice.vals.is_empty() {
            if let Some(values) = as_f32(&slice.vals) {
                let layout = Layout::of(slice.keys.len(), slice.vals.len(), &slice.lens);
                let stepped = c.has_momentum().then(|| {
                    lock(&self.velocity).step(&slice.keys, layout, &values, c.momentum, c.nesterov)
                });
                let pushed: &[f32] = stepped.as_deref().unwrap_or(&values);
                let with_residuals = if c.error_feedback {
                    lock(&self.feedback).corrected(&slice.keys, layout, pushed)
                } else {
                    None
                };
                let corrected: &[f32] = with_residuals.as_deref().unwrap_or(pushed);
                let encoded = encode(c, corrected, seed);
                let sent = encoded
                    .as_ref()
                    .filter(|_| c.error_feedback || c.masks())
                    .map(Encoded::sent);
                if c.error_feedback {
                    lock(&self.feedback).keep(&slice.keys, layout, corrected, sent.as_deref());
                }
                if let Some(sent) = sent.as_deref().filter(|_| c.masks()) {
                    lock(&self.velocity).mask(&slice.keys, layout, sent);
                }
                match (encoded, with_residuals.or(stepped)) {
                    (Some(e), _) => {
                        let mut m = e.msg;
                        m.answer = c.answers && pull;
                        msg = Some(m);
                        frames[1] = Bytes::from(e.payload);
                        meta.data_type[1] = DataType::Other;
                    }
                    // Uncompressed, with the residuals it carries.
                    (None, Some(v)) => frames[1] = from_f32::<V>(v),
                    (None, None) => {}
                }
            }
        }
        meta.compression = msg.map(Box::new);
    }

    /// A push's values for a server that does not read compressed values:
    /// with momentum correction, the velocity (uncompressed, so nothing is
    /// held back and nothing masked); otherwise as they are.
    pub(crate) fn prepare_plain<V: Val>(
        &self,
        c: &Compression,
        push: bool,
        slice: &KVPairs<V>,
        frames: &mut [Bytes],
    ) {
        if !(push && c.has_momentum()) || slice.vals.is_empty() {
            return;
        }
        if let Some(values) = as_f32(&slice.vals) {
            let stepped = lock(&self.velocity).step(
                &slice.keys,
                Layout::of(slice.keys.len(), slice.vals.len(), &slice.lens),
                &values,
                c.momentum,
                c.nesterov,
            );
            frames[1] = from_f32::<V>(stepped);
        }
    }

    /// The velocity momentum correction keeps for `key`.
    #[cfg(test)]
    pub(super) fn velocity(&self, key: Key) -> Option<Vec<f32>> {
        lock(&self.velocity).get(key).map(<[f32]>::to_vec)
    }

    /// The residual error feedback keeps for `key`.
    #[cfg(test)]
    pub(super) fn residual(&self, key: Key) -> Option<Vec<f32>> {
        lock(&self.feedback).residual(key).map(<[f32]>::to_vec)
    }
}
