//! Gradient compression, negotiated per request: a worker compresses the
//! values of a push for a server whose node-table entry says it reads
//! compressed values ([`pslite_proto::FEATURE_COMPRESSION`], every pslite
//! node of this version); C++ servers and older pslite ones get the values
//! as they are. The server's [`KVServer`](crate::KVServer) decompresses
//! before its request handle runs (handles see ordinary values, and
//! [`DefaultHandle`](crate::DefaultHandle) sums them), and, when the request
//! asks ([`Compression::compress_answers`]), compresses its answer the same
//! way, with error feedback of its own when the request asks
//! ([`Compression::answer_feedback`]): per worker and key, what the answer
//! left out is added to that key's next answer to that worker (as BytePS's
//! servers do).
//!
//! Compressors, as BytePS and MXNet have them:
//! - `onebit`: each value's sign and one scale, the mean magnitude (32x);
//! - `topk[:K]`: the K values of largest magnitude and their positions;
//! - `randomk[:K]`: K values at positions drawn from a seed both ends derive
//!   alike (only the values travel);
//! - `2bit[:T]`: MXNet's 2-bit quantisation with threshold T (16x);
//! - `fp16`, `bf16`: each value cast to a 16-bit float (2x, Horovod's
//!   `Compression.fp16`): float16 (bfloat16) values cross exactly, others
//!   are rounded once to nearest; the server still sums in `f32`, and a
//!   compressed answer (the sum, or the mean) is rounded once.
//!
//! K is a fraction of the values (below 1; default 0.01) or a number of
//! them (1 and more); T defaults to 0.5. With error feedback (on by
//! default, except for the casts `fp16` and `bf16`, whose rounding is
//! below a gradient's noise, as in Horovod) the worker keeps, per key, what compression left out and adds
//! it to the key's next values. A message with fewer than
//! [`MIN_VALUES`] values, or that compression would not make smaller, goes
//! uncompressed (its residuals are sent along and cleared).
//!
//! The wire form is `PBMeta.compression` (field 131) with the values frame
//! replaced by the compressed bytes, typed `OTHER`; see docs/PROTOCOL.md.
//! The compressors themselves are pure code over `f32` slices
//! (`compression/{onebit,topk,randomk,twobit,cast}.rs`), tested on their
//! own; a worker's state (error feedback, momentum, seeds) is in
//! `compression/worker.rs`, a server's compressed answers in
//! `compression/answer.rs`.

mod answer;
mod cast;
mod feedback;
mod onebit;
mod randomk;
mod topk;
mod twobit;
mod worker;

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
pub use pslite_proto::compression::CompressionKind;
use pslite_proto::compression::CompressionMsg;
use pslite_proto::{DataType, Message};

use crate::kv_pairs::Val;
use crate::Error;

#[cfg(test)]
use answer::compress_answer;
pub(crate) use answer::AnswerFeedback;
pub(crate) use feedback::{ErrorFeedback, Layout, Velocity};
pub use worker::KeyState;
pub(crate) use worker::WorkerState;

/// Messages with fewer values go uncompressed.
pub const MIN_VALUES: usize = 16;
/// The most values one compressed message may stand for (4 GiB of `f32`):
/// a receiver refuses more, so a forged count cannot make it allocate
/// without bound.
pub const MAX_VALUES: u64 = 1 << 30;
/// `topk` and `randomk` keep this fraction unless told otherwise.
pub const DEFAULT_FRACTION: f32 = 0.01;
/// `2bit`'s threshold unless told otherwise (MXNet's default).
pub const DEFAULT_THRESHOLD: f32 = 0.5;
/// The seed `randomk` positions derive from unless told otherwise: the
/// same on every node, so workers pushing the same keys in step draw the
/// same positions.
pub const DEFAULT_SEED: u64 = 0x7073_6c69_7465_6b21;

/// A compressor and its options, for a [`KVWorker`](crate::KVWorker)
/// ([`KVWorker::set_compression`](crate::KVWorker::set_compression)) or one
/// request ([`KVOptions::compression`](crate::KVOptions::compression)).
///
/// ```
/// use pslite::Compression;
/// let c: Compression = "topk:0.05".parse().unwrap();
/// assert_eq!(c.to_string(), "topk:0.05");
/// let c = Compression::two_bit(0.1).unwrap().compress_answers(true);
/// assert!(c.answers());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Compression {
    kind: CompressionKind,
    param: f32,
    error_feedback: bool,
    answers: bool,
    answer_feedback: bool,
    seed: u64,
    momentum: f32,
    nesterov: bool,
    masking: bool,
}

impl PartialEq for Compression {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.param.to_bits() == other.param.to_bits()
            && self.error_feedback == other.error_feedback
            && self.answers == other.answers
            && self.answer_feedback == other.answer_feedback
            && self.seed == other.seed
            && self.momentum.to_bits() == other.momentum.to_bits()
            && self.nesterov == other.nesterov
            && self.masking == other.masking
    }
}

impl Eq for Compression {}

impl Compression {
    fn new(kind: CompressionKind, param: f32) -> Compression {
        Compression {
            kind,
            param,
            error_feedback: !kind_is_cast(kind),
            answers: false,
            answer_feedback: false,
            seed: DEFAULT_SEED,
            momentum: 0.0,
            nesterov: false,
            masking: false,
        }
    }

    /// `onebit`: signs and one scale.
    pub fn onebit() -> Compression {
        Compression::new(CompressionKind::OneBit, 0.0)
    }

    /// `fp16`: each value cast to IEEE half precision (error feedback off
    /// unless asked for).
    pub fn fp16() -> Compression {
        Compression::new(CompressionKind::Fp16, 0.0)
    }

    /// `bf16`: each value cast to bfloat16 (error feedback off unless
    /// asked for).
    pub fn bf16() -> Compression {
        Compression::new(CompressionKind::Bf16, 0.0)
    }

    /// Whether the compressor is a cast (`fp16`, `bf16`): every value goes,
    /// rounded.
    pub fn is_cast(&self) -> bool {
        kind_is_cast(self.kind)
    }

    /// `topk`: the `k` values of largest magnitude: a fraction (below 1) or
    /// a number (1 and more).
    pub fn topk(k: f32) -> Result<Compression, Error> {
        Ok(Compression::new(CompressionKind::TopK, check_k("topk", k)?))
    }

    /// `randomk`: `k` values at seeded positions: a fraction (below 1) or a
    /// number (1 and more).
    pub fn randomk(k: f32) -> Result<Compression, Error> {
        Ok(Compression::new(
            CompressionKind::RandomK,
            check_k("randomk", k)?,
        ))
    }

    /// `2bit`: MXNet's 2-bit quantisation with `threshold` (positive).
    pub fn two_bit(threshold: f32) -> Result<Compression, Error> {
        if !(threshold.is_finite() && threshold > 0.0) {
            return Err(Error::InvalidInput(format!(
                "2bit's threshold must be a positive number, got {threshold}"
            )));
        }
        Ok(Compression::new(CompressionKind::TwoBit, threshold))
    }

    /// Keeps what compression leaves out of each key's values and adds it
    /// to the key's next values (on by default; off by default for `fp16`
    /// and `bf16`).
    pub fn error_feedback(mut self, on: bool) -> Compression {
        self.error_feedback = on;
        self
    }

    /// Asks servers to compress their answers to pulls and push-pulls the
    /// same way (off by default: for answers that are gradients, e.g. a
    /// sum of the workers' pushes; never for model weights).
    pub fn compress_answers(mut self, on: bool) -> Compression {
        self.answers = on;
        self
    }

    /// With [`Compression::compress_answers`]: asks servers to keep error
    /// feedback on their compressed answers, per worker and key (what an
    /// answer left out is added to that key's next answer to this worker, as
    /// BytePS's servers do). Off by default: every value then reaches the
    /// worker, but late, and in bursts (a value `randomk` left out for ten
    /// answers comes with all ten); with SGD and momentum that can
    /// destabilise training that the answers' losses alone would not (see
    /// docs/BENCHMARKS.md). Servers that do not know it answer without.
    pub fn answer_feedback(mut self, on: bool) -> Compression {
        self.answer_feedback = on;
        self
    }

    /// Whether servers are asked for error feedback on their answers.
    pub fn has_answer_feedback(&self) -> bool {
        self.answer_feedback
    }

    /// The seed `randomk` positions derive from (default [`DEFAULT_SEED`];
    /// give every node the same one).
    pub fn seed(mut self, seed: u64) -> Compression {
        self.seed = seed;
        self
    }

    /// Momentum correction (Deep Gradient Compression, Lin et al. 2018;
    /// BytePS's momentum compressor): the worker keeps each key's velocity
    /// `u = momentum * u + g` and pushes it (with [`Compression::nesterov`],
    /// `g + momentum * u`), so error feedback accumulates the velocity,
    /// `v += u`, and what is held back arrives with its momentum; whoever
    /// applies the answers then steps without momentum of its own
    /// (`pslite.torch.DistributedOptimizer` arranges both). The velocity
    /// is kept whatever was sent (as BytePS's momentum compressor), unless
    /// [`Compression::momentum_masking`] asks otherwise. A push that goes
    /// uncompressed (too small) is then exactly momentum SGD.
    /// `momentum` from 0 (off, the default) to below 1. Worker-side only:
    /// nothing changes on the wire, and a server that does not read
    /// compressed values gets the velocity uncompressed.
    pub fn momentum(mut self, momentum: f32) -> Result<Compression, Error> {
        if !(momentum.is_finite() && (0.0..1.0).contains(&momentum)) {
            return Err(Error::InvalidInput(format!(
                "momentum must be from 0 to below 1, got {momentum}"
            )));
        }
        self.momentum = momentum;
        Ok(self)
    }

    /// With [`Compression::momentum`]: pushes `g + momentum * u` (Nesterov's
    /// momentum, as `torch.optim.SGD(nesterov=True)` steps) instead of `u`.
    pub fn nesterov(mut self, on: bool) -> Compression {
        self.nesterov = on;
        self
    }

    /// With [`Compression::momentum`], for `topk` and `randomk`: clears the
    /// velocity where a value was sent (Deep Gradient Compression's
    /// momentum factor masking: the value arrived whole, and the momentum
    /// it built up with it). Off by default: on `train_digits.py` it cost
    /// `topk:0.1` 0.98 -> 0.96 (docs/BENCHMARKS.md). `onebit` and `2bit`
    /// send every value in some form but only part of it, so nothing is
    /// masked for them.
    pub fn momentum_masking(mut self, on: bool) -> Compression {
        self.masking = on;
        self
    }

    /// Whether momentum factor masking is asked for.
    pub fn has_momentum_masking(&self) -> bool {
        self.masking
    }

    /// The momentum of momentum correction (0: off).
    pub fn momentum_factor(&self) -> f32 {
        self.momentum
    }

    /// Whether momentum correction uses Nesterov's momentum.
    pub fn is_nesterov(&self) -> bool {
        self.nesterov
    }

    /// Whether momentum correction is on.
    fn has_momentum(&self) -> bool {
        self.momentum > 0.0
    }

    /// Whether momentum factor masking applies: asked for, and the
    /// compressor sends some values whole and nothing of the others
    /// (`topk`, `randomk`).
    fn masks(&self) -> bool {
        self.masking
            && self.has_momentum()
            && matches!(self.kind, CompressionKind::TopK | CompressionKind::RandomK)
    }

    /// The compressor.
    pub fn kind(&self) -> CompressionKind {
        self.kind
    }

    /// Whether error feedback is on.
    pub fn has_error_feedback(&self) -> bool {
        self.error_feedback
    }

    /// Whether answers are to be compressed too.
    pub fn answers(&self) -> bool {
        self.answers
    }

    /// `k` of `topk`/`randomk` for `n` values.
    fn k_for(&self, n: usize) -> usize {
        if self.param < 1.0 {
            // The fraction is an f32 (0.05 is 0.0500000007): a relative
            // tolerance keeps 5% of 2000 at 100.
            let exact = f64::from(self.param) * n as f64;
            ((exact * (1.0 - 1e-6)).ceil() as usize).clamp(1, n.max(1))
        } else {
            (self.param as usize).min(n)
        }
    }

    /// The request's part of the meta (values not compressed).
    fn msg(&self, seed: u64) -> CompressionMsg {
        CompressionMsg {
            kind: self.kind,
            param: self.param,
            count: None,
            k: 0,
            seed: if self.kind == CompressionKind::RandomK {
                seed
            } else {
                0
            },
            answer: self.answers,
            answer_feedback: self.answers && self.answer_feedback,
        }
    }

    /// The options a received request asks its answer to be compressed
    /// with, if any.
    pub(crate) fn for_answer(msg: &CompressionMsg) -> Option<Compression> {
        if !msg.answer {
            return None;
        }
        let c = match msg.kind {
            CompressionKind::OneBit => Compression::onebit(),
            CompressionKind::TopK => Compression::topk(msg.param).ok()?,
            CompressionKind::RandomK => Compression::randomk(msg.param).ok()?,
            CompressionKind::TwoBit => Compression::two_bit(msg.param).ok()?,
            CompressionKind::Fp16 => Compression::fp16(),
            CompressionKind::Bf16 => Compression::bf16(),
        };
        // The request's seed: every worker's request of these keys in step
        // carries the same, and a push-pull's answer keeps randomk's values
        // where its push put them (the sum is non-zero only there: the
        // answer carries all of it).
        Some(c.seed(msg.seed).error_feedback(msg.answer_feedback))
    }
}

/// `fp16` and `bf16`: casts, which send every value.
fn kind_is_cast(kind: CompressionKind) -> bool {
    matches!(kind, CompressionKind::Fp16 | CompressionKind::Bf16)
}

fn check_k(name: &str, k: f32) -> Result<f32, Error> {
    if k.is_finite() && k > 0.0 && (k < 1.0 || k.fract() == 0.0) {
        Ok(k)
    } else {
        Err(Error::InvalidInput(format!(
            "{name}'s k must be a fraction of the values (0 < k < 1) or a whole number of them \
             (1 and more), got {k}"
        )))
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            CompressionKind::OneBit => f.write_str("onebit"),
            CompressionKind::TopK => write!(f, "topk:{}", self.param),
            CompressionKind::RandomK => write!(f, "randomk:{}", self.param),
            CompressionKind::TwoBit => write!(f, "2bit:{}", self.param),
            CompressionKind::Fp16 => f.write_str("fp16"),
            CompressionKind::Bf16 => f.write_str("bf16"),
        }
    }
}

impl FromStr for Compression {
    type Err = Error;

    /// `onebit`, `topk[:K]`, `randomk[:K]`, `2bit[:THRESHOLD]`, `fp16` or
    /// `bf16`.
    fn from_str(s: &str) -> Result<Compression, Error> {
        let s = s.trim();
        let (name, param) = match s.split_once(':') {
            Some((name, param)) => (name, Some(param)),
            None => (s, None),
        };
        let number = |default: f32| -> Result<f32, Error> {
            match param {
                None => Ok(default),
                Some(p) => p.trim().parse::<f32>().map_err(|_| {
                    Error::InvalidInput(format!("compression {s:?}: {p:?} is not a number"))
                }),
            }
        };
        match name.to_ascii_lowercase().as_str() {
            "onebit" if param.is_none() => Ok(Compression::onebit()),
            "topk" => Compression::topk(number(DEFAULT_FRACTION)?),
            "randomk" => Compression::randomk(number(DEFAULT_FRACTION)?),
            "2bit" | "twobit" => Compression::two_bit(number(DEFAULT_THRESHOLD)?),
            "fp16" | "float16" if param.is_none() => Ok(Compression::fp16()),
            "bf16" | "bfloat16" if param.is_none() => Ok(Compression::bf16()),
            _ => Err(Error::InvalidInput(format!(
                "unknown compression {s:?}: expected onebit, topk[:K], randomk[:K], \
                 2bit[:THRESHOLD], fp16 or bf16 (K a fraction below 1 or a count)"
            ))),
        }
    }
}

/// `none` (or an empty string) is `None`; anything else as
/// [`Compression::from_str`]. For command lines.
pub fn parse_compression(s: &str) -> Result<Option<Compression>, Error> {
    match s.trim() {
        "" | "none" => Ok(None),
        other => other.parse().map(Some),
    }
}

/// Values compressed for the wire: the meta part and the payload.
pub(crate) struct Encoded {
    pub(crate) msg: CompressionMsg,
    pub(crate) payload: Vec<u8>,
}

impl Encoded {
    /// What the receiver will read back (for error feedback and masking;
    /// computed when asked: a cast without feedback never needs it).
    pub(crate) fn sent(&self) -> Vec<f32> {
        // `encode` checked that the payload decodes.
        decode(&self.msg, &self.payload).unwrap_or_default()
    }
}

/// Compresses `values` with `c` (randomk positions from `seed`); `None`
/// when it is not worth it (too few values, or no smaller).
pub(crate) fn encode(c: &Compression, values: &[f32], seed: u64) -> Option<Encoded> {
    let n = values.len();
    if n < MIN_VALUES || n as u64 > MAX_VALUES {
        return None;
    }
    let mut msg = c.msg(seed);
    msg.count = Some(n as u64);
    let payload = match c.kind {
        CompressionKind::OneBit => onebit::compress(values),
        CompressionKind::TwoBit => twobit::compress(values, c.param),
        CompressionKind::TopK => {
            msg.k = c.k_for(n) as u64;
            topk::compress(values, msg.k as usize)
        }
        CompressionKind::RandomK => {
            msg.k = c.k_for(n) as u64;
            randomk::compress(values, msg.k as usize, seed)
        }
        CompressionKind::Fp16 => cast::compress(values, cast::Half::F16),
        CompressionKind::Bf16 => cast::compress(values, cast::Half::Bf16),
    };
    if payload.len() >= n * 4 {
        return None;
    }
    Some(Encoded { msg, payload })
}

/// The values compressed `payload` stands for, as `msg` describes them;
/// every field is checked (they come from the network).
pub(crate) fn decode(msg: &CompressionMsg, payload: &[u8]) -> Result<Vec<f32>, String> {
    let count = msg
        .count
        .ok_or("the values are not compressed (no count)")?;
    if count > MAX_VALUES {
        return Err(format!(
            "compressed values stand for {count} values (at most {MAX_VALUES})"
        ));
    }
    let count = count as usize;
    let k = usize::try_from(msg.k).unwrap_or(usize::MAX);
    match msg.kind {
        CompressionKind::OneBit => onebit::decompress(payload, count),
        CompressionKind::TwoBit => twobit::decompress(payload, count, msg.param),
        CompressionKind::TopK => topk::decompress(payload, count, k),
        CompressionKind::RandomK => randomk::decompress(payload, count, k, msg.seed),
        CompressionKind::Fp16 => cast::decompress(payload, count, cast::Half::F16),
        CompressionKind::Bf16 => cast::decompress(payload, count, cast::Half::Bf16),
    }
}

/// `vals` as `f32` (borrowed for `f32` values, converted for `f64`);
/// `None` for value types compression does not apply to.
fn as_f32<V: Val>(vals: &[V]) -> Option<Cow<'_, [f32]>> {
    match V::DATA_TYPE {
        DataType::Float => Some(Cow::Borrowed(bytemuck::cast_slice(vals))),
        DataType::Double => Some(Cow::Owned(
            bytemuck::cast_slice::<V, f64>(vals)
                .iter()
                .map(|&v| v as f32)
                .collect(),
        )),
        _ => None,
    }
}

/// `f32` values as `V`'s bytes (`V` is `f32` or `f64`), without copying
/// `f32` ones.
fn from_f32<V: Val>(vals: Vec<f32>) -> Bytes {
    match V::DATA_TYPE {
        DataType::Double => {
            let wide: Vec<f64> = vals.into_iter().map(f64::from).collect();
            crate::sarray::SArray::from_vec(wide).bytes().clone()
        }
        _ => crate::sarray::SArray::from_vec(vals).bytes().clone(),
    }
}

/// Whether compression applies to values of type `V` (`f32`, `f64`).
pub(crate) fn applies_to<V: Val>() -> bool {
    matches!(V::DATA_TYPE, DataType::Float | DataType::Double)
}

/// Decompresses a received KV message's values in place (its meta then says
/// the values are plain; the answer request, if any, stays). Does nothing
/// to a message whose values are not compressed.
pub(crate) fn expand<V: Val>(msg: &mut Message) -> Result<(), String> {
    let Some(c) = msg.meta.compression.as_deref_mut() else {
        return Ok(());
    };
    if c.count.is_none() {
        return Ok(());
    }
    if !applies_to::<V>() {
        return Err(format!(
            "compressed values for an app of {:?} values (compression applies to f32 and f64)",
            V::DATA_TYPE
        ));
    }
    let payload = msg
        .data
        .get(1)
        .ok_or("compressed values without a values frame")?;
    let values = decode(c, payload)?;
    c.count = None;
    c.k = 0;
    msg.data[1] = from_f32::<V>(values);
    if let Some(t) = msg.meta.data_type.get_mut(1) {
        *t = V::DATA_TYPE;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
