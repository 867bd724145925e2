//! `topk`: the `k` values of largest magnitude and their positions (as
//! BytePS's topk compressor); the others count as 0 (error feedback keeps
//! them for later).
//!
//! Payload: `k` positions (`u32`, ascending), then their `k` values (`f32`),
//! little-endian.

/// Compresses `values` to its `k` largest magnitudes (`k <= len`, and
/// `len` fits a `u32`).
pub(crate) fn compress(values: &[f32], k: usize) -> Vec<u8> {
    let k = k.min(values.len());
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    if k < values.len() && k > 0 {
        order.select_nth_unstable_by(k - 1, |&a, &b| {
            values[b as usize]
                .abs()
                .total_cmp(&values[a as usize].abs())
        });
    }
    order.truncate(k);
    order.sort_unstable();
    let mut out = Vec::with_capacity(8 * k);
    for &i in &order {
        out.extend_from_slice(&i.to_le_bytes());
    }
    for &i in &order {
        out.extend_from_slice(&values[i as usize].to_le_bytes());
    }
    out
}

/// The `count` values `payload` (of `k` positions and values) stands for.
pub(crate) fn decompress(payload: &[u8], count: usize, k: usize) -> Result<Vec<f32>, String> {
    if k > count || payload.len() != k.saturating_mul(8) {
        return Err(format!(
            "a topk frame of {} bytes for {k} of {count} values (expected {})",
            payload.len(),
            k.saturating_mul(8)
        ));
    }
    let (positions, values) = payload.split_at(4 * k);
    let mut out = vec![0.0f32; count];
    let mut last = None;
    for (p, v) in positions.chunks_exact(4).zip(values.chunks_exact(4)) {
        let i = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
        if i >= count || last.is_some_and(|l| l >= i) {
            return Err(format!(
                "a topk frame with position {i} (of {count} values, ascending)"
            ));
        }
        last = Some(i);
        out[i] = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_largest_magnitudes() {
        let v = [0.1, -5.0, 0.2, 3.0, -0.3, 4.0];
        let p = compress(&v, 3);
        assert_eq!(
            decompress(&p, v.len(), 3).unwrap(),
            vec![0.0, -5.0, 0.0, 3.0, 0.0, 4.0]
        );
        assert_eq!(decompress(&compress(&v, 6), 6, 6).unwrap(), v.to_vec());
        assert_eq!(decompress(&compress(&v, 0), 6, 0).unwrap(), vec![0.0; 6]);
    }

    #[test]
    fn bad_payloads_are_refused() {
        let p = compress(&[1.0, 2.0, 3.0], 2);
        assert!(decompress(&p, 3, 3).is_err(), "length");
        assert!(decompress(&p, 1, 2).is_err(), "k above count");
        let mut bad = p.clone();
        bad[0..4].copy_from_slice(&9u32.to_le_bytes());
        assert!(decompress(&bad, 3, 2).is_err(), "position out of range");
        let mut twice = p.clone();
        let second: [u8; 4] = twice[4..8].try_into().unwrap();
        twice[0..4].copy_from_slice(&second);
        assert!(decompress(&twice, 3, 2).is_err(), "repeated position");
    }
}
