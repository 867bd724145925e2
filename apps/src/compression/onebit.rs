//! `onebit`: the sign of each value and one scale, the mean magnitude
//! (as BytePS's onebit compressor): 32x smaller than `f32` values.
//!
//! Payload: the scale (`f32`, little-endian), then one bit per value, least
//! significant bit first: 1 for a value at or above zero (`+scale`), 0
//! below (`-scale`).

/// Compresses `values`.
pub(crate) fn compress(values: &[f32]) -> Vec<u8> {
    let n = values.len();
    let scale = if n == 0 {
        0.0
    } else {
        (values.iter().map(|v| f64::from(v.abs())).sum::<f64>() / n as f64) as f32
    };
    let mut out = Vec::with_capacity(4 + n.div_ceil(8));
    out.extend_from_slice(&scale.to_le_bytes());
    for chunk in values.chunks(8) {
        let byte = chunk
            .iter()
            .enumerate()
            .fold(0u8, |b, (i, v)| b | (u8::from(*v >= 0.0) << i));
        out.push(byte);
    }
    out
}

/// The `count` values `payload` stands for.
pub(crate) fn decompress(payload: &[u8], count: usize) -> Result<Vec<f32>, String> {
    let expected = 4 + count.div_ceil(8);
    if payload.len() != expected {
        return Err(format!(
            "a onebit frame of {} bytes for {count} values (expected {expected})",
            payload.len()
        ));
    }
    let scale = f32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]);
    if !scale.is_finite() || scale < 0.0 {
        return Err(format!("a onebit frame with scale {scale}"));
    }
    let bits = &payload[4..];
    // Eight values a byte (no division per value: this runs over every
    // gradient of a step).
    let mut out = vec![0.0f32; count];
    for (chunk, byte) in out.chunks_mut(8).zip(bits) {
        for (i, v) in chunk.iter_mut().enumerate() {
            *v = if byte >> i & 1 == 1 { scale } else { -scale };
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_and_mean_magnitude() {
        let v = [1.0, -3.0, 0.0, 2.0, -0.5, 0.5, 4.0, -1.0, 6.0];
        let p = compress(&v);
        assert_eq!(p.len(), 4 + 2);
        let back = decompress(&p, v.len()).unwrap();
        let scale = 18.0 / 9.0;
        let want: Vec<f32> = v
            .iter()
            .map(|x| if *x >= 0.0 { scale } else { -scale })
            .collect();
        assert_eq!(back, want);
        assert_eq!(decompress(&compress(&[]), 0).unwrap(), Vec::<f32>::new());
    }

    #[test]
    fn bad_payloads_are_refused() {
        let p = compress(&[1.0; 9]);
        assert!(decompress(&p, 17).is_err());
        assert!(decompress(&p[..5], 9).is_err());
        let mut nan = p.clone();
        nan[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(decompress(&nan, 9).is_err());
    }
}
