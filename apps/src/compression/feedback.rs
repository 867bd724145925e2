//! Error feedback on the worker: what compression left out of a key's
//! values (the residual) is added to that key's next values before they are
//! compressed, so nothing is lost for good, only delayed (as BytePS and
//! MXNet's 2-bit compression do). Residuals are kept per key, so requests
//! whose key sets change from one push to the next (sparse models) keep
//! them too.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hash of a key (FxHash's): keys come from this
/// process's own requests, not from the network, and SipHash's resistance
/// to chosen keys would cost a third of a sparse push's compression time.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// How many values each key of a request has.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Layout<'a> {
    /// Every key the same number.
    Uniform(usize),
    /// `lens[i]` for key i.
    Lens(&'a [i32]),
}

impl<'a> Layout<'a> {
    /// The layout of `values` values over `keys` keys: `lens` when given
    /// (a request's lengths), else the same number for every key.
    pub(crate) fn of(keys: usize, values: usize, lens: &'a [i32]) -> Layout<'a> {
        if lens.is_empty() {
            Layout::Uniform(values / keys.max(1))
        } else {
            Layout::Lens(lens)
        }
    }

    /// `(key index, range of its values)` for `n` keys.
    fn ranges(self, n: usize) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + 'a {
        let mut at = 0;
        (0..n).map(move |i| {
            let len = match self {
                Layout::Uniform(k) => k,
                Layout::Lens(lens) => lens.get(i).map_or(0, |&l| l.max(0) as usize),
            };
            let range = at..at + len;
            at += len;
            (i, range)
        })
    }
}

/// One key's residual (most keys of sparse models hold one value: no
/// allocation for those).
#[derive(Clone, Debug)]
enum Residual {
    One(f32),
    Many(Box<[f32]>),
}

impl Residual {
    fn as_slice(&self) -> &[f32] {
        match self {
            Residual::One(v) => std::slice::from_ref(v),
            Residual::Many(v) => v,
        }
    }
}

/// The residuals of one worker, by key.
#[derive(Default)]
pub(crate) struct ErrorFeedback {
    residual: HashMap<u64, Residual, BuildHasherDefault<KeyHasher>>,
}

impl ErrorFeedback {
    /// `values` with each key's residual added, or `None` when no key has
    /// one (a residual of another length than the key's values now is
    /// ignored: the key changed shape).
    pub(crate) fn corrected(
        &self,
        keys: &[u64],
        layout: Layout,
        values: &[f32],
    ) -> Option<Vec<f32>> {
        if self.residual.is_empty() {
            return None;
        }
        let mut out: Option<Vec<f32>> = None;
        for (i, range) in layout.ranges(keys.len()) {
            let Some(r) = self.residual.get(&keys[i]) else {
                continue;
            };
            let r = r.as_slice();
            let out = out.get_or_insert_with(|| values.to_vec());
            if let Some(vals) = out.get_mut(range).filter(|v| v.len() == r.len()) {
                for (v, e) in vals.iter_mut().zip(r) {
                    *v += *e;
                }
            }
        }
        out
    }

    /// Keeps `corrected - sent` as each key's residual (`sent`: what the
    /// receiver will read), or forgets the keys' residuals when everything
    /// was sent (`sent` is `None`: the values went uncompressed).
    pub(crate) fn keep(
        &mut self,
        keys: &[u64],
        layout: Layout,
        corrected: &[f32],
        sent: Option<&[f32]>,
    ) {
        let Some(sent) = sent else {
            if !self.residual.is_empty() {
                for key in keys {
                    self.residual.remove(key);
                }
            }
            return;
        };
        for (i, range) in layout.ranges(keys.len()) {
            let (Some(c), Some(s)) = (corrected.get(range.clone()), sent.get(range)) else {
                continue;
            };
            let residual = if c.len() == 1 {
                Residual::One(c[0] - s[0])
            } else {
                Residual::Many(c.iter().zip(s).map(|(c, s)| c - s).collect())
            };
            self.residual.insert(keys[i], residual);
        }
    }

    /// Keys holding a residual.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.residual.len()
    }

    /// Key `key`'s residual.
    pub(crate) fn residual(&self, key: u64) -> Option<&[f32]> {
        self.residual.get(&key).map(Residual::as_slice)
    }

    /// Sets key `key`'s residual to `values` (`None`: it has none).
    pub(crate) fn set(&mut self, key: u64, values: Option<&[f32]>) {
        match values {
            None => {
                self.residual.remove(&key);
            }
            Some([one]) => {
                self.residual.insert(key, Residual::One(*one));
            }
            Some(many) => {
                self.residual.insert(key, Residual::Many(many.into()));
            }
        }
    }
}

/// Momentum correction's state on a worker (Deep Gradient Compression):
/// each key's velocity `u`, updated with every push's gradient before error
/// feedback adds the residual. With error feedback the residual then
/// accumulates the velocity (`v += u`) instead of the gradient, so what a
/// compressor holds back and sends late carries the momentum it would have
/// had, and the optimizer applies what arrives without momentum of its own.
#[derive(Default)]
pub(crate) struct Velocity {
    velocity: HashMap<u64, Box<[f32]>, BuildHasherDefault<KeyHasher>>,
}

impl Velocity {
    /// Updates each key's velocity with its gradient `values`,
    /// `u = momentum * u + g` (`u = g` for a key without one, or whose
    /// shape changed), and returns what the push carries: `u`, or with
    /// `nesterov` `g + momentum * u`.
    pub(crate) fn step(
        &mut self,
        keys: &[u64],
        layout: Layout,
        values: &[f32],
        momentum: f32,
        nesterov: bool,
    ) -> Vec<f32> {
        let mut out = values.to_vec();
        for (i, range) in layout.ranges(keys.len()) {
            let Some(g) = values.get(range.clone()) else {
                continue;
            };
            let u = match self.velocity.get_mut(&keys[i]) {
                Some(u) if u.len() == g.len() => {
                    for (u, g) in u.iter_mut().zip(g) {
                        *u = momentum * *u + g;
                    }
                    &**u
                }
                _ => {
                    self.velocity.insert(keys[i], g.into());
                    g
                }
            };
            if let Some(out) = out.get_mut(range) {
                for ((o, g), u) in out.iter_mut().zip(g).zip(u.iter()) {
                    *o = if nesterov { g + momentum * u } else { *u };
                }
            }
        }
        out
    }

    /// Momentum factor masking: clears each key's velocity where `sent`
    /// (what the receiver reads, aligned with the push's values) is not
    /// zero, so a value that has just arrived does not keep moving the
    /// parameter with momentum of its own.
    pub(crate) fn mask(&mut self, keys: &[u64], layout: Layout, sent: &[f32]) {
        for (i, range) in layout.ranges(keys.len()) {
            let (Some(u), Some(s)) = (self.velocity.get_mut(&keys[i]), sent.get(range)) else {
                continue;
            };
            for (u, s) in u.iter_mut().zip(s) {
                if *s != 0.0 {
                    *u = 0.0;
                }
            }
        }
    }

    /// Key `key`'s velocity.
    pub(crate) fn get(&self, key: u64) -> Option<&[f32]> {
        self.velocity.get(&key).map(|u| &u[..])
    }

    /// Sets key `key`'s velocity to `values` (`None`: it has none; its next
    /// push starts one from its gradient).
    pub(crate) fn set(&mut self, key: u64, values: Option<&[f32]>) {
        match values {
            None => {
                self.velocity.remove(&key);
            }
            Some(u) => {
                self.velocity.insert(key, u.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residuals_follow_keys_across_key_sets() {
        let mut ef = ErrorFeedback::default();
        let keys = [1u64, 5, 9];
        let g = [1.0f32, 2.0, 3.0];
        assert_eq!(ef.corrected(&keys, Layout::Uniform(1), &g), None);
        let x = g.to_vec();
        // Sent 0, 2, 0: keys 1 and 9 keep their values.
        ef.keep(&keys, Layout::Uniform(1), &x, Some(&[0.0, 2.0, 0.0]));
        assert_eq!(ef.residual(1), Some(&[1.0][..]));
        assert_eq!(ef.residual(5), Some(&[0.0][..]));
        // A later request with other keys gets key 9's residual only.
        let x = ef
            .corrected(&[7, 9], Layout::Uniform(1), &[10.0, 10.0])
            .unwrap();
        assert_eq!(x, vec![10.0, 13.0]);
        // Sent uncompressed: the residuals of those keys are gone.
        ef.keep(&[7, 9], Layout::Uniform(1), &x, None);
        assert_eq!(ef.residual(9), None);
        assert_eq!(ef.len(), 2);
    }

    #[test]
    fn lens_and_shape_changes() {
        let mut ef = ErrorFeedback::default();
        let lens = [2, 1];
        let x = [1.0, 1.0, 1.0];
        ef.keep(&[3, 4], Layout::Lens(&lens), &x, Some(&[0.5, 0.0, 1.0]));
        assert_eq!(ef.residual(3), Some(&[0.5, 1.0][..]));
        // Key 3 now has three values: its old residual no longer fits.
        let x = ef.corrected(&[3], Layout::Uniform(3), &[1.0, 1.0, 1.0]);
        assert_eq!(x, Some(vec![1.0, 1.0, 1.0]));
    }
}
