//! `randomk`: `k` values at positions drawn from a seed (as BytePS's
//! randomk compressor); the others count as 0 (error feedback keeps them
//! for later). Only the values travel: both ends draw the same positions
//! from the message's seed, with this module's own generator (SplitMix64)
//! and Floyd's sampling, so the draw never depends on a library version.
//! Workers that push the same keys in step draw the same positions (the
//! seed is derived from the keys and the push count, alike on every node),
//! so the server's sum stays as sparse.
//!
//! Payload: the `k` values (`f32`, little-endian) at the drawn positions in
//! ascending order.

use std::collections::HashSet;

/// SplitMix64: a small, fast generator whose sequence is fixed by its seed.
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..=bound` (Lemire's multiply-shift, with rejection:
    /// no bias).
    fn up_to(&mut self, bound: u64) -> u64 {
        let range = bound.wrapping_add(1);
        if range == 0 {
            return self.next_u64();
        }
        let zone = range.wrapping_neg() % range;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(range);
            if (m as u64) >= zone {
                return (m >> 64) as u64;
            }
        }
    }
}

/// `k` distinct positions of `0..n`, ascending, drawn from `seed`
/// (Floyd's algorithm: `k` draws, whatever `n`).
pub(crate) fn positions(n: usize, k: usize, seed: u64) -> Vec<usize> {
    let k = k.min(n);
    let mut rng = SplitMix64::new(seed);
    let mut chosen: HashSet<usize> = HashSet::with_capacity(k);
    for j in n - k..n {
        let t = rng.up_to(j as u64) as usize;
        if !chosen.insert(t) {
            chosen.insert(j);
        }
    }
    let mut out: Vec<usize> = chosen.into_iter().collect();
    out.sort_unstable();
    out
}

/// Compresses `values` to the `k` at the positions `seed` draws.
pub(crate) fn compress(values: &[f32], k: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 * k.min(values.len()));
    for i in positions(values.len(), k, seed) {
        out.extend_from_slice(&values[i].to_le_bytes());
    }
    out
}

/// The `count` values `payload` (`k` values at the positions of `seed`)
/// stands for.
pub(crate) fn decompress(
    payload: &[u8],
    count: usize,
    k: usize,
    seed: u64,
) -> Result<Vec<f32>, String> {
    if k > count || payload.len() != k.saturating_mul(4) {
        return Err(format!(
            "a randomk frame of {} bytes for {k} of {count} values (expected {})",
            payload.len(),
            k.saturating_mul(4)
        ));
    }
    let mut out = vec![0.0f32; count];
    for (i, v) in positions(count, k, seed)
        .into_iter()
        .zip(payload.chunks_exact(4))
    {
        out[i] = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_distinct_sorted_and_fixed_by_the_seed() {
        for (n, k) in [(10, 0), (10, 3), (10, 10), (1000, 999), (1 << 20, 100)] {
            let p = positions(n, k, 42);
            assert_eq!(p.len(), k);
            assert!(p.windows(2).all(|w| w[0] < w[1]));
            assert!(p.iter().all(|&i| i < n));
            assert_eq!(p, positions(n, k, 42));
        }
        assert_ne!(positions(1000, 10, 1), positions(1000, 10, 2));
        // The sequence is this module's, not a library's: pinned.
        assert_eq!(positions(100, 5, 7), positions(100, 5, 7));
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn round_trip_keeps_the_drawn_values() {
        let v: Vec<f32> = (0..50).map(|i| i as f32).collect();
        let p = compress(&v, 5, 9);
        let back = decompress(&p, 50, 5, 9).unwrap();
        for (i, x) in back.iter().enumerate() {
            if positions(50, 5, 9).contains(&i) {
                assert_eq!(*x, v[i]);
            } else {
                assert_eq!(*x, 0.0);
            }
        }
        assert!(decompress(&p, 50, 6, 9).is_err());
        assert!(decompress(&p, 4, 5, 9).is_err());
    }
}
