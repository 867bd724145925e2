//! `2bit`: MXNet's 2-bit gradient compression: each value becomes
//! `+threshold` (at or above it), `-threshold` (at or below its negative)
//! or 0; with error feedback, what is left over waits in the residual until
//! it reaches the threshold (MXNet's scheme). 16x smaller than `f32`.
//!
//! Payload: 2 bits per value, four to a byte, least significant first:
//! `00` zero, `01` `+threshold`, `10` `-threshold` (`11` is refused).

/// Compresses `values` with `threshold` (positive, finite).
pub(crate) fn compress(values: &[f32], threshold: f32) -> Vec<u8> {
    values
        .chunks(4)
        .map(|chunk| {
            chunk.iter().enumerate().fold(0u8, |b, (i, &v)| {
                let code = if v >= threshold {
                    1
                } else if v <= -threshold {
                    2
                } else {
                    0
                };
                b | (code << (2 * i))
            })
        })
        .collect()
}

/// The `count` values `payload` stands for.
pub(crate) fn decompress(payload: &[u8], count: usize, threshold: f32) -> Result<Vec<f32>, String> {
    if !(threshold.is_finite() && threshold > 0.0) {
        return Err(format!("a 2bit frame with threshold {threshold}"));
    }
    let expected = count.div_ceil(4);
    if payload.len() != expected {
        return Err(format!(
            "a 2bit frame of {} bytes for {count} values (expected {expected})",
            payload.len()
        ));
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        out.push(match payload[i / 4] >> (2 * (i % 4)) & 3 {
            0 => 0.0,
            1 => threshold,
            2 => -threshold,
            _ => return Err(format!("a 2bit frame with code 3 at value {i}")),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantises_to_three_levels() {
        let v = [0.6, -0.6, 0.2, -0.49, 0.5, -0.5, 3.0];
        let p = compress(&v, 0.5);
        assert_eq!(p.len(), 2);
        assert_eq!(
            decompress(&p, v.len(), 0.5).unwrap(),
            vec![0.5, -0.5, 0.0, 0.0, 0.5, -0.5, 0.5]
        );
    }

    #[test]
    fn bad_payloads_are_refused() {
        assert!(decompress(&[0xff], 4, 0.5).is_err(), "code 3");
        assert!(decompress(&[0], 5, 0.5).is_err(), "too short");
        assert!(decompress(&[0], 4, 0.0).is_err(), "threshold 0");
        assert!(decompress(&[0], 4, f32::INFINITY).is_err());
    }
}
