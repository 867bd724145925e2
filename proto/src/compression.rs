//! pslite-only: how a KV message's values are compressed
//! (`PBMeta.compression`, field 131). The compressors live in the `pslite`
//! crate (`pslite::compression`); this is only the wire form. Every field
//! comes from the network: the receiver checks all of them.

use crate::pb::PbCompression;

/// A compressor, with its wire number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompressionKind {
    /// The sign of each value and one scale (the mean magnitude).
    OneBit = 1,
    /// The `k` values of largest magnitude, with their positions.
    TopK = 2,
    /// `k` values at positions drawn from a seed both ends know.
    RandomK = 3,
    /// MXNet's 2-bit quantisation: `+threshold`, `-threshold` or 0.
    TwoBit = 4,
    /// Each value cast to IEEE half precision (`f16`), 2 bytes.
    Fp16 = 5,
    /// Each value cast to bfloat16 (the top 16 bits of an `f32`), 2 bytes.
    Bf16 = 6,
}

impl CompressionKind {
    /// The compressor with wire number `value`.
    pub fn from_i32(value: i32) -> Option<CompressionKind> {
        Some(match value {
            1 => CompressionKind::OneBit,
            2 => CompressionKind::TopK,
            3 => CompressionKind::RandomK,
            4 => CompressionKind::TwoBit,
            5 => CompressionKind::Fp16,
            6 => CompressionKind::Bf16,
            _ => return None,
        })
    }
}

/// The compression part of a KV message's meta. Equal when every field is
/// bit for bit (a NaN parameter equals itself: it is refused on arrival).
#[derive(Clone, Debug)]
pub struct CompressionMsg {
    /// The compressor.
    pub kind: CompressionKind,
    /// Its parameter: TopK and RandomK the fraction kept (below 1) or the
    /// number kept (1 and more), TwoBit the threshold; unused by OneBit, Fp16 and Bf16.
    pub param: f32,
    /// `Some(n)` when this message's values frame is compressed: it stands
    /// for `n` values.
    pub count: Option<u64>,
    /// TopK, RandomK: how many values the frame carries.
    pub k: u64,
    /// RandomK: the seed the kept positions were drawn with.
    pub seed: u64,
    /// On a request: answer with values compressed the same way.
    pub answer: bool,
    /// On a request with `answer`: the server keeps error feedback (per
    /// worker and key) on its compressed answers.
    pub answer_feedback: bool,
}

impl PartialEq for CompressionMsg {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.param.to_bits() == other.param.to_bits()
            && self.count == other.count
            && self.k == other.k
            && self.seed == other.seed
            && self.answer == other.answer
            && self.answer_feedback == other.answer_feedback
    }
}

impl Eq for CompressionMsg {}

impl CompressionMsg {
    pub(crate) fn to_pb(&self) -> PbCompression {
        PbCompression {
            kind: Some(self.kind as i32),
            param: Some(self.param),
            count: self.count,
            k: (self.k != 0).then_some(self.k),
            seed: (self.seed != 0).then_some(self.seed),
            answer: self.answer.then_some(true),
            answer_feedback: self.answer_feedback.then_some(true),
        }
    }

    /// `None` if the compressor is unknown.
    pub(crate) fn from_pb(pb: PbCompression) -> Option<CompressionMsg> {
        Some(CompressionMsg {
            kind: CompressionKind::from_i32(pb.kind.unwrap_or(0))?,
            param: pb.param.unwrap_or(0.0),
            count: pb.count,
            k: pb.k.unwrap_or(0),
            seed: pb.seed.unwrap_or(0),
            answer: pb.answer.unwrap_or(false),
            answer_feedback: pb.answer_feedback.unwrap_or(false),
        })
    }
}
