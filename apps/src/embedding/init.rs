//! A new row's values ([`fill`]): a counter-based stream of random words
//! seeded by the table's seed and the row's key only, so every replica,
//! every rerun and a server that restores a checkpoint create the same
//! row, whatever order rows are touched in.
//!
//! The stream (written out again in `python/tests/test_torch_embedding.py`
//! to check a uniform row exactly): `s = mix(seed ^ mix(key ^ ROW))`, then
//! word `j` is `mix(s + (j + 1) * GOLDEN)` (wrapping). Uniform value: `low +
//! (high - low) * u` in float64, rounded to float32, `u = (word >> 40) /
//! 2^24`. Normal: Box–Muller on pairs of words.

use super::config::Init;
use super::mix;

/// The golden ratio's 64-bit constant (the stream's step).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
/// Separates a row's stream from the keys' mix.
const ROW: u64 = 0xD1B5_4A32_D192_ED03;

/// Word `j` of the stream of the row of `key` in a table seeded `seed`.
fn word(seed: u64, key: u64, j: u64) -> u64 {
    let s = mix(seed ^ mix(key ^ ROW));
    mix(s.wrapping_add((j + 1).wrapping_mul(GOLDEN)))
}

/// Writes the initial values of the row of `key` into `out`.
pub fn fill(init: Init, seed: u64, key: u64, out: &mut [f32]) {
    match init {
        Init::Zeros => out.fill(0.0),
        Init::Uniform { low, high } => {
            let (low, span) = (f64::from(low), f64::from(high) - f64::from(low));
            for (j, v) in out.iter_mut().enumerate() {
                let u = (word(seed, key, j as u64) >> 40) as f64 / (1u64 << 24) as f64;
                *v = (low + span * u) as f32;
            }
        }
        Init::Normal { std } => {
            let std = f64::from(std);
            for (pair, vals) in out.chunks_mut(2).enumerate() {
                let j = 2 * pair as u64;
                // u1 in (0, 1]: its logarithm is finite.
                let u1 = ((word(seed, key, j) >> 11) + 1) as f64 / (1u64 << 53) as f64;
                let u2 = (word(seed, key, j + 1) >> 11) as f64 / (1u64 << 53) as f64;
                let r = (-2.0 * u1.ln()).sqrt();
                let theta = std::f64::consts::TAU * u2;
                vals[0] = (std * r * theta.cos()) as f32;
                if let Some(second) = vals.get_mut(1) {
                    *second = (std * r * theta.sin()) as f32;
                }
            }
        }
    }
}
