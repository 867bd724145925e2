//! pslite-only: how a KV message's values are compressed
//! (`PBMeta.compression`, field 131). The compressors live in the `pslite`
//! crate (`pslite::compression`); this is only the wire form. Every field
//! comes from the network: the receiver checks all of them.

use crate::pb::PbCompression;

/// A compressor, with its wire number (declared in `meta.proto`, generated
/// by prost).
pub use crate::pb::CompressionKind;

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
            kind: CompressionKind::try_from(pb.kind?).ok()?,
            param: pb.param.unwrap_or(0.0),
            count: pb.count,
            k: pb.k.unwrap_or(0),
            seed: pb.seed.unwrap_or(0),
            answer: pb.answer.unwrap_or(false),
            answer_feedback: pb.answer_feedback.unwrap_or(false),
        })
    }
}
