//! What the MXNet examples share: MXNet's KVStore conventions on top of
//! ps-lite (`kvstore_dist.h`, `kvstore_dist_server.h` of MXNet 1.9.1).
//! Included by `mxnet_worker.rs` and `mxnet_server.rs`; not an example.

#![allow(dead_code)]

use pslite::{DataType, Val};

/// MXNet's SimpleApp command heads (`CommandType`).
pub const CMD_CONTROLLER: i32 = 0;
/// Sets multi-precision on the servers.
pub const CMD_SET_MULTI_PRECISION: i32 = 1;
/// Tells the servers to stop.
pub const CMD_STOP_SERVER: i32 = 2;
/// Switches the servers to synchronous mode.
pub const CMD_SYNC_MODE: i32 = 3;
/// Sets gradient compression.
pub const CMD_SET_GRADIENT_COMPRESSION: i32 = 4;
/// Sets profiler parameters.
pub const CMD_SET_PROFILER_PARAMS: i32 = 5;

/// One raw byte of an MXNet value. C++ `KVWorker<char>`/`KVServer<char>`
/// type their value frames OTHER (`char` has no ps-lite DataType of its own);
/// a pslite `u8` would be UINT8. MXNet ignores the type, but this keeps the
/// frames identical to MXNet's.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct MxByte(pub u8);

impl std::ops::AddAssign for MxByte {
    fn add_assign(&mut self, other: MxByte) {
        self.0 = self.0.wrapping_add(other.0);
    }
}

impl Val for MxByte {
    const DATA_TYPE: DataType = DataType::Other;
}

/// The dense float types MXNet's servers handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// float32 (mshadow code 0).
    F32,
    /// float64 (mshadow code 1).
    F64,
    /// float16 (mshadow code 2).
    F16,
}

impl Dtype {
    fn code(self) -> i32 {
        match self {
            Dtype::F32 => 0,
            Dtype::F64 => 1,
            Dtype::F16 => 2,
        }
    }

    /// MXNet's data head: the Cantor pair of (request type 0 = dense push or
    /// pull, mshadow dtype code): float32 0, float64 2, float16 5.
    pub fn head(self) -> i32 {
        let (m, d) = (0, self.code());
        (m + d) * (m + d + 1) / 2 + d
    }

    /// The dtype of a data head (inverse Cantor pair); only request type 0
    /// (dense) is handled.
    pub fn of_head(head: i32) -> Result<Dtype, String> {
        if head < 0 {
            return Err(format!("head {head} is not an MXNet data head"));
        }
        let w = ((((8 * head as i64 + 1) as f64).sqrt() - 1.0) / 2.0).floor() as i64;
        let d = head as i64 - w * (w + 1) / 2;
        let m = w - d;
        match (m, d) {
            (0, 0) => Ok(Dtype::F32),
            (0, 1) => Ok(Dtype::F64),
            (0, 2) => Ok(Dtype::F16),
            (0, d) => Err(format!(
                "head {head}: dtype {d} unsupported (MXNet serves float types only)"
            )),
            (m, _) => Err(format!(
                "head {head}: request type {m} (row-sparse/compressed) unsupported"
            )),
        }
    }

    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
            Dtype::F16 => 2,
        }
    }

    /// Values as MXNet's raw bytes.
    pub fn encode(self, vals: &[f32]) -> Vec<MxByte> {
        let mut out = Vec::with_capacity(vals.len() * self.size());
        for &v in vals {
            match self {
                Dtype::F32 => out.extend(v.to_le_bytes().map(MxByte)),
                Dtype::F64 => out.extend(f64::from(v).to_le_bytes().map(MxByte)),
                Dtype::F16 => out.extend(f32_to_f16(v).to_le_bytes().map(MxByte)),
            }
        }
        out
    }

    /// Raw bytes as values (a trailing partial value is ignored).
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(self.size())
            .map(|c| self.read(c) as f32)
            .collect()
    }

    /// One value from exactly `self.size()` bytes.
    fn read(self, c: &[u8]) -> f64 {
        let mut b = [0u8; 8];
        b[..c.len().min(8)].copy_from_slice(&c[..c.len().min(8)]);
        match self {
            Dtype::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Dtype::F64 => f64::from_le_bytes(b),
            Dtype::F16 => f64::from(f16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        }
    }

    /// `acc += add`, element-wise, as values of this dtype.
    pub fn add_into(self, acc: &mut [u8], add: &[u8]) {
        let n = self.size();
        for (a, b) in acc.chunks_exact_mut(n).zip(add.chunks_exact(n)) {
            match self {
                Dtype::F32 => {
                    let s = self.read(a) as f32 + self.read(b) as f32;
                    a.copy_from_slice(&s.to_le_bytes());
                }
                Dtype::F64 => {
                    let s = self.read(a) + self.read(b);
                    a.copy_from_slice(&s.to_le_bytes());
                }
                Dtype::F16 => {
                    let s = self.read(a) as f32 + self.read(b) as f32;
                    a.copy_from_slice(&f32_to_f16(s).to_le_bytes());
                }
            }
        }
    }
}

/// IEEE half to single (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let mant = f32::from(h & 0x3ff);
    match exp {
        0 => sign * mant * 2f32.powi(-24),
        31 if mant == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + mant / 1024.0) * 2f32.powi(exp - 15),
    }
}

/// IEEE single to half, rounding to nearest even (as mshadow's `half_t`).
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let mant = b & 0x7f_ffff;
    if exp == 255 {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = m >> shift;
        let rem = m & ((1u32 << shift) - 1);
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}
