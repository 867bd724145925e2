//! `fp16` and `bf16`: each value cast to a 16-bit float on the wire
//! (Horovod's `Compression.fp16`), 2x smaller than `f32`. A value that is
//! already a float16 (bfloat16) number crosses exactly, so half-precision
//! gradients summed as `f32` go as they are; any other value is rounded
//! once, to nearest, ties to even. Infinities and NaNs stay what they are;
//! `fp16` turns magnitudes from 65520 up into infinities (its largest
//! number is 65504), `bf16` keeps `f32`'s range.
//!
//! Payload: one `u16` per value, little-endian (IEEE binary16 for `fp16`,
//! the top half of the `f32`'s bits for `bf16`).

/// The 16-bit format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Half {
    /// IEEE 754 binary16: 5 exponent bits, 10 fraction bits.
    F16,
    /// bfloat16: `f32`'s 8 exponent bits, 7 fraction bits.
    Bf16,
}

/// One value at a time (the tests' view; `compress` and `decompress` loop
/// per format).
#[cfg(test)]
impl Half {
    fn encode(self, x: f32) -> u16 {
        match self {
            Half::F16 => f32_to_f16(x),
            Half::Bf16 => f32_to_bf16(x),
        }
    }

    fn decode(self, h: u16) -> f32 {
        match self {
            Half::F16 => f16_to_f32(h),
            Half::Bf16 => f32::from_bits(u32::from(h) << 16),
        }
    }
}

/// Compresses `values`.
pub(crate) fn compress(values: &[f32], half: Half) -> Vec<u8> {
    // One loop per format (no choice per value): this runs over every
    // gradient of a step.
    fn each(values: &[f32], encode: impl Fn(f32) -> u16) -> Vec<u8> {
        let mut out = vec![0u8; values.len() * 2];
        for (o, &v) in out.chunks_exact_mut(2).zip(values) {
            o.copy_from_slice(&encode(v).to_le_bytes());
        }
        out
    }
    match half {
        Half::F16 => each(values, f32_to_f16),
        Half::Bf16 => each(values, f32_to_bf16),
    }
}

/// The `count` values `payload` stands for.
pub(crate) fn decompress(payload: &[u8], count: usize, half: Half) -> Result<Vec<f32>, String> {
    if Some(payload.len()) != count.checked_mul(2) {
        return Err(format!(
            "a {half:?} frame of {} bytes for {count} values (expected 2 a value)",
            payload.len()
        ));
    }
    fn each(payload: &[u8], decode: impl Fn(u16) -> f32) -> Vec<f32> {
        payload
            .chunks_exact(2)
            .map(|b| decode(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    }
    Ok(match half {
        Half::F16 => {
            // Every binary16 number's f32, computed once (256 KiB): a
            // lookup is several times faster than the arithmetic.
            static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
            let table = TABLE.get_or_init(|| (0..=u16::MAX).map(f16_to_f32).collect());
            each(payload, |h| table[usize::from(h)])
        }
        Half::Bf16 => each(payload, |h| f32::from_bits(u32::from(h) << 16)),
    })
}

/// `x` rounded to the nearest bfloat16 (ties to even); NaNs stay NaNs.
fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        // Keep the sign and a quiet NaN whatever the payload's low bits.
        return ((bits >> 16) as u16) | 0x0040;
    }
    // Adding just under half of the dropped part's unit, plus the kept
    // part's lowest bit, rounds to nearest with ties to even (a carry may
    // run into the exponent: the next binade, or infinity, as it should).
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// `x` rounded to the nearest IEEE binary16 (ties to even).
fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    if abs >= 0x7f80_0000 {
        // Infinity, or a NaN (kept quiet, with the top of its payload).
        let nan = if abs > 0x7f80_0000 {
            0x0200 | ((abs >> 13) & 0x03ff) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    // 65520 is half-way between 65504 (the largest binary16) and 65536:
    // ties go to the even one, which is infinity.
    if abs >= 0x477f_f000 {
        return sign | 0x7c00;
    }
    // Below 2^-14 the result is subnormal: a whole number of 2^-24 units.
    // Adding 0.5 (whose unit in the last place is 2^-24) makes the FPU
    // round to that unit, to nearest and ties to even; the units are what
    // the sum's fraction bits hold above 0.5's.
    if abs < 0x3880_0000 {
        let sum = f32::from_bits(abs) + 0.5;
        return sign | (sum.to_bits() - 0.5f32.to_bits()) as u16;
    }
    // Normal: rebias the exponent (127 -> 15) and drop 13 fraction bits,
    // rounding to nearest with ties to even as for bfloat16.
    let odd = (abs >> 13) & 1;
    let rebased = abs - ((127 - 15) << 23);
    sign | ((rebased + 0x0fff + odd) >> 13) as u16
}

/// The `f32` of binary16 `h` (exact: every binary16 number is an `f32`).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exponent = u32::from(h >> 10) & 0x1f;
    let fraction = u32::from(h & 0x03ff);
    let bits = match exponent {
        0 => {
            // Zero or subnormal: fraction x 2^-24, exact in f32.
            let magnitude = fraction as f32 * f32::from_bits(0x3380_0000);
            return f32::from_bits(sign | magnitude.to_bits());
        }
        0x1f => sign | 0x7f80_0000 | (fraction << 13),
        _ => sign | ((exponent + 127 - 15) << 23) | (fraction << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of binary16 `h` computed independently, in f64.
    fn f16_value(h: u16) -> f64 {
        let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((h >> 10) & 0x1f);
        let f = f64::from(h & 0x3ff);
        match e {
            0 => sign * f * 2f64.powi(-24),
            0x1f if f == 0.0 => sign * f64::INFINITY,
            0x1f => f64::NAN,
            _ => sign * (1.0 + f / 1024.0) * 2f64.powi(e - 15),
        }
    }

    #[test]
    fn every_half_number_crosses_exactly() {
        for h in 0..=u16::MAX {
            for half in [Half::F16, Half::Bf16] {
                let x = half.decode(h);
                if x.is_nan() {
                    assert!(half.decode(half.encode(x)).is_nan(), "{half:?} {h:#06x}");
                    continue;
                }
                assert_eq!(half.encode(x), h, "{half:?} {h:#06x} = {x}");
            }
            let v = f16_value(h);
            let x = f16_to_f32(h);
            assert!(
                v.is_nan() == x.is_nan() && (v.is_nan() || f64::from(x) == v),
                "{h:#06x}"
            );
        }
    }

    /// Rounds to the nearest of the two neighbours, ties to the even one,
    /// for f32 values all over the range (a walk through every exponent).
    #[test]
    fn rounds_to_nearest_ties_to_even() {
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..200_000 {
            // A linear congruential walk over the finite f32 bit patterns.
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let x = f32::from_bits((state >> 33) as u32 % 0x7f80_0000);
            for x in [x, -x] {
                for half in [Half::F16, Half::Bf16] {
                    check_nearest(half, x);
                }
            }
        }
        for x in [
            65504.0,
            65519.0,
            65520.0,
            65536.0,
            1e-8,
            2.9802322e-8,
            5.9604645e-8,
        ] {
            check_nearest(Half::F16, x);
        }
        assert_eq!(
            f32_to_f16(65520.0),
            0x7c00,
            "the tie above 65504 goes to infinity"
        );
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(
            f32_to_f16(2.9802322e-8),
            0,
            "2^-25, a tie, goes to even zero"
        );
        assert_eq!(
            f32_to_f16(1.0 + 2f32.powi(-11)),
            0x3c00,
            "tie to even (down)"
        );
        assert_eq!(
            f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)),
            0x3c02,
            "tie to even (up)"
        );
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80, "rounds up to infinity");
        assert_eq!(f32_to_f16(f32::NEG_INFINITY), 0xfc00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert!(f32::from_bits(u32::from(f32_to_bf16(-f32::NAN)) << 16).is_nan());
    }

    fn check_nearest(half: Half, x: f32) {
        let h = half.encode(x);
        let got = f64::from(half.decode(h));
        let x64 = f64::from(x);
        // Neighbours: the half numbers one step either side of the result.
        for n in [h.wrapping_sub(1), h.wrapping_add(1)] {
            let other = f64::from(half.decode(n));
            if other.is_nan() || (other.signum() != got.signum() && got != 0.0) {
                continue;
            }
            let (d_got, d_other) = ((got - x64).abs(), (other - x64).abs());
            assert!(
                d_got < d_other || (d_got == d_other && h & 1 == 0) || got.is_infinite(),
                "{half:?}: {x} -> {got} ({h:#06x}), but {other} is nearer or an even tie"
            );
        }
    }

    #[test]
    fn frames_of_the_wrong_size_are_refused() {
        let p = compress(&[1.0, -2.5, 3.0], Half::F16);
        assert_eq!(p.len(), 6);
        assert_eq!(decompress(&p, 3, Half::F16).unwrap(), vec![1.0, -2.5, 3.0]);
        assert!(decompress(&p, 4, Half::F16).is_err());
        assert!(decompress(&p[..5], 3, Half::Bf16).is_err());
        assert!(decompress(&p, usize::MAX, Half::Bf16).is_err());
    }
}
