//! Key-value data as it travels: [`KVPairs`] (keys, values, optional
//! lengths), the value types a KV app can carry ([`Val`]), and the mapping
//! to and from data frames (`[keys][vals][lens]`).

use std::fmt::Debug;
use std::ops::AddAssign;

use bytemuck::Pod;
use bytes::Bytes;
use pslite_proto::{DataType, Message};

use crate::sarray::SArray;
use crate::Error;

/// A key: ps-lite keys are `uint64_t`.
pub type Key = u64;

/// A value type a KV app can carry: plain numbers, little-endian on the wire.
pub trait Val: Pod + Default + Debug + PartialEq + AddAssign + Send + Sync + 'static {
    /// The `data_type` written for value frames.
    const DATA_TYPE: DataType;
}

macro_rules! impl_val {
    ($($t:ty => $d:ident),*) => {
        $(impl Val for $t {
            const DATA_TYPE: DataType = DataType::$d;
        })*
    };
}

impl_val!(
    f32 => Float, f64 => Double, i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    u8 => UInt8, u16 => UInt16, u32 => UInt32, u64 => UInt64
);

/// One byte of raw data, typed OTHER on the wire as C++ ps-lite's
/// `KVWorker<char>` types its values (MXNet's KVStore sends such frames);
/// sums wrap (an all-reduce of bytes that all workers but one send as
/// zeros is a broadcast: `pslite.torch`'s raw app).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct RawByte(pub u8);

impl AddAssign for RawByte {
    fn add_assign(&mut self, other: RawByte) {
        self.0 = self.0.wrapping_add(other.0);
    }
}

impl Val for RawByte {
    const DATA_TYPE: DataType = DataType::Other;
}

/// Whether a frame typed `frame` can be read as `V`: its own type, raw
/// bytes (`OTHER`, as C++ `KVWorker<char>` sends), or any one-byte type for
/// one-byte values.
pub fn accepts<V: Val>(frame: DataType) -> bool {
    frame == V::DATA_TYPE
        || frame == DataType::Other
        || (std::mem::size_of::<V>() == 1
            && matches!(frame, DataType::Char | DataType::Int8 | DataType::UInt8))
}

/// Keys with their values and, optionally, the number of values per key.
#[derive(Clone, Debug, PartialEq)]
pub struct KVPairs<V: Val> {
    /// Sorted, unique keys.
    pub keys: SArray<Key>,
    /// The values: `lens[i]` for key i, or `vals.len() / keys.len()` each.
    pub vals: SArray<V>,
    /// Values per key; empty when every key has the same number.
    pub lens: SArray<i32>,
}

impl<V: Val> Default for KVPairs<V> {
    fn default() -> Self {
        KVPairs {
            keys: SArray::new(),
            vals: SArray::new(),
            lens: SArray::new(),
        }
    }
}

impl<V: Val> KVPairs<V> {
    /// Pairs from keys and values (each key the same number of values).
    pub fn new(keys: impl Into<SArray<Key>>, vals: impl Into<SArray<V>>) -> Self {
        KVPairs {
            keys: keys.into(),
            vals: vals.into(),
            lens: SArray::new(),
        }
    }

    /// Pairs with a number of values per key.
    pub fn with_lens(
        keys: impl Into<SArray<Key>>,
        vals: impl Into<SArray<V>>,
        lens: impl Into<SArray<i32>>,
    ) -> Self {
        KVPairs {
            keys: keys.into(),
            vals: vals.into(),
            lens: lens.into(),
        }
    }

    /// Checks keys are sorted and unique, and vals fit keys/lens. With
    /// `need_vals` (pushes) values must be present.
    pub fn validate(&self, need_vals: bool) -> Result<(), Error> {
        let keys = self.keys.as_slice();
        if !self.keys.known_ascending() {
            if let Some(i) = first_unsorted(keys) {
                return Err(if keys[i] == keys[i + 1] {
                    Error::DuplicateKey { key: keys[i] }
                } else {
                    Error::UnsortedKeys { index: i + 1 }
                });
            }
            self.keys.mark_ascending();
        }
        self.check_shape(need_vals)
    }

    /// Checks vals fit keys/lens (not the order of the keys). With
    /// `need_vals` (pushes) values must be present.
    pub fn check_shape(&self, need_vals: bool) -> Result<(), Error> {
        let keys = self.keys.as_slice();
        if !need_vals && self.vals.is_empty() && self.lens.is_empty() {
            return Ok(());
        }
        if !self.lens.is_empty() {
            if self.lens.len() != keys.len() {
                return Err(Error::LensMismatch {
                    keys: keys.len(),
                    lens: self.lens.len(),
                });
            }
            if let Some(&bad) = self.lens.iter().find(|&&l| l < 0) {
                return Err(Error::InvalidInput(format!(
                    "negative length {bad} in lens"
                )));
            }
            let total: i64 = self.lens.iter().map(|&l| i64::from(l)).sum();
            if total != self.vals.len() as i64 {
                return Err(Error::ValsMismatch {
                    vals: self.vals.len(),
                    expected: format!("{total} (the sum of lens)"),
                });
            }
        } else if keys.is_empty() {
            if !self.vals.is_empty() {
                return Err(Error::ValsMismatch {
                    vals: self.vals.len(),
                    expected: "0 (no keys)".into(),
                });
            }
        } else if self.vals.len() % keys.len() != 0 || (need_vals && self.vals.is_empty()) {
            return Err(Error::ValsMismatch {
                vals: self.vals.len(),
                expected: format!("a positive multiple of the {} keys", keys.len()),
            });
        }
        Ok(())
    }

    /// The data frames and their types: keys, vals (empty for a pull
    /// request), then lens if any.
    pub fn to_frames(&self) -> (Vec<Bytes>, Vec<DataType>) {
        let mut frames = vec![self.keys.bytes().clone(), self.vals.bytes().clone()];
        let mut types = vec![DataType::UInt64, V::DATA_TYPE];
        if !self.lens.is_empty() {
            frames.push(self.lens.bytes().clone());
            types.push(DataType::Int32);
        }
        (frames, types)
    }

    /// Reads the data frames of a KV message, checking their types and sizes
    /// (but not that the keys are sorted: see [`KVPairs::validate`]).
    pub fn from_message(msg: &Message) -> Result<Self, Error> {
        Self::read(msg, None)
    }

    /// [`KVPairs::from_message`] for an answer that left its keys out
    /// (`same_keys`): its keys frame must be empty, and `keys` (the
    /// request's) take its place before the shape is checked.
    pub(crate) fn from_answer_without_keys(
        msg: &Message,
        keys: &SArray<Key>,
    ) -> Result<Self, Error> {
        Self::read(msg, Some(keys))
    }

    fn read(msg: &Message, keys_sent: Option<&SArray<Key>>) -> Result<Self, Error> {
        let malformed = |what: String| Error::Malformed {
            sender: msg.meta.sender,
            what,
        };
        let types = &msg.meta.data_type;
        let type_of = |i: usize| types.get(i).copied();
        let mut out = KVPairs::default();
        let mut frames = msg.data.iter().cloned();
        if let Some(keys) = frames.next() {
            if type_of(0).is_some_and(|t| t != DataType::UInt64) {
                return Err(malformed(format!("keys frame typed {:?}", type_of(0))));
            }
            out.keys = SArray::from_bytes(keys).map_err(|e| malformed(format!("keys: {e}")))?;
        }
        if let Some(keys) = keys_sent {
            if !out.keys.is_empty() {
                return Err(malformed(format!(
                    "an answer said to leave its keys out carries {} keys",
                    out.keys.len()
                )));
            }
            out.keys = keys.clone();
        }
        if let Some(vals) = frames.next() {
            if let Some(t) = type_of(1).filter(|&t| !accepts::<V>(t)) {
                return Err(malformed(format!(
                    "values typed {t:?}, expected {:?}",
                    V::DATA_TYPE
                )));
            }
            out.vals = SArray::from_bytes(vals).map_err(|e| malformed(format!("values: {e}")))?;
        }
        if let Some(lens) = frames.next() {
            if type_of(2).is_some_and(|t| t != DataType::Int32) {
                return Err(malformed(format!("lens frame typed {:?}", type_of(2))));
            }
            out.lens = SArray::from_bytes(lens).map_err(|e| malformed(format!("lens: {e}")))?;
        }
        if frames.next().is_some() {
            return Err(malformed(format!(
                "{} data frames (at most 3)",
                msg.data.len()
            )));
        }
        // The shape is checked; the order of the keys is the sender's
        // promise (as in C++ ps-lite), not re-checked: a pass over every key
        // of every message costs more than anything else on the receive path.
        out.check_shape(false)
            .map_err(|e| malformed(e.to_string()))?;
        Ok(out)
    }

    /// The number of values each key has (from lens, or uniform).
    pub fn values_per_key(&self) -> Vec<usize> {
        if !self.lens.is_empty() {
            return self.lens.iter().map(|&l| l.max(0) as usize).collect();
        }
        let k = self.vals.len().checked_div(self.keys.len()).unwrap_or(0);
        vec![k; self.keys.len()]
    }
}

/// The index `i` of the first key with `keys[i] >= keys[i + 1]`, if any.
/// Scans in branch-free blocks (which vectorise) and only looks for the
/// exact place in a block that has one: millions of keys take microseconds.
pub fn first_unsorted(keys: &[Key]) -> Option<usize> {
    const BLOCK: usize = 2048;
    let mut start = 0;
    while start + 1 < keys.len() {
        let end = (start + BLOCK + 1).min(keys.len());
        let block = &keys[start..end];
        let bad = block[..block.len() - 1]
            .iter()
            .zip(&block[1..])
            .fold(false, |bad, (a, b)| bad | (a >= b));
        if bad {
            return block
                .windows(2)
                .position(|w| w[0] >= w[1])
                .map(|i| start + i);
        }
        start = end - 1;
    }
    None
}

/// What a server's request handle learns about a request besides its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KVMeta {
    /// The worker's command (`cmd`, sent as `head`).
    pub cmd: i32,
    /// A push.
    pub push: bool,
    /// A pull.
    pub pull: bool,
    /// The requesting node's id.
    pub sender: i32,
    /// The request's timestamp (echoed in the response).
    pub timestamp: i32,
    /// The requesting customer (echoed in the response).
    pub customer_id: i32,
    /// The app the request is for.
    pub app_id: i32,
    /// The request's priority.
    pub priority: i32,
    /// How the worker asked the answer's values to be compressed
    /// ([`Compression::compress_answers`](crate::Compression::compress_answers));
    /// [`KVServer::response`](crate::KVServer::response) does it.
    pub compression: Option<crate::Compression>,
    /// A pslite worker's pull that takes its answer without keys when they
    /// are exactly these (the request's; `PBMeta.same_keys`):
    /// [`KVServer::response`](crate::KVServer::response) leaves them out then.
    pub(crate) same_keys: Option<RequestKeys>,
}

/// A request's keys, kept for its answer (shown by their number: a pull
/// may have millions).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RequestKeys(pub(crate) SArray<Key>);

impl std::fmt::Debug for RequestKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} keys>", self.0.len())
    }
}

impl KVMeta {
    /// The KV meta of a request message.
    pub fn of(msg: &Message) -> KVMeta {
        Self::with_keys(msg, None)
    }

    /// The KV meta of request `msg` whose keys are `keys` (kept for an
    /// answer without keys, if the request asks for one).
    pub(crate) fn with_keys(msg: &Message, keys: Option<&SArray<Key>>) -> KVMeta {
        KVMeta {
            cmd: msg.meta.head,
            push: msg.meta.push,
            pull: msg.meta.pull,
            sender: msg.meta.sender,
            timestamp: msg.meta.timestamp,
            customer_id: msg.meta.customer_id,
            app_id: msg.meta.app_id,
            priority: msg.meta.priority,
            compression: msg
                .meta
                .compression
                .as_deref()
                .and_then(crate::Compression::for_answer),
            same_keys: keys
                .filter(|_| msg.meta.same_keys && msg.meta.pull && msg.meta.request)
                .map(|keys| RequestKeys(keys.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_without_keys_takes_the_requests_and_is_checked_against_them() {
        let keys = SArray::from_vec(vec![4u64, 7, 9]);
        let answer = |pairs: KVPairs<f32>, drop_keys: bool| {
            let (mut frames, types) = pairs.to_frames();
            if drop_keys {
                frames[0] = Bytes::new();
            }
            let mut msg = Message::default();
            msg.meta.same_keys = true;
            msg.meta.sender = 8;
            msg.meta.data_type = types;
            msg.data = frames;
            msg
        };
        let two_each = answer(
            KVPairs::new(keys.clone(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            true,
        );
        let read = KVPairs::<f32>::from_answer_without_keys(&two_each, &keys).unwrap();
        assert_eq!(&read.keys[..], &[4, 7, 9]);
        assert_eq!(read.values_per_key(), vec![2, 2, 2]);
        // Values that do not fit the request's keys.
        let short = answer(KVPairs::new(keys.clone(), vec![1.0; 4]), true);
        assert!(matches!(
            KVPairs::<f32>::from_answer_without_keys(&short, &keys),
            Err(Error::Malformed { sender: 8, .. })
        ));
        // Keys where the answer says there are none.
        let with_keys = answer(KVPairs::new(keys.clone(), vec![1.0; 3]), false);
        assert!(matches!(
            KVPairs::<f32>::from_answer_without_keys(&with_keys, &keys),
            Err(Error::Malformed { sender: 8, .. })
        ));
        // Lens are read against the request's keys too.
        let lens = answer(
            KVPairs::with_lens(keys.clone(), vec![1.0; 4], vec![1, 0, 3]),
            true,
        );
        let read = KVPairs::<f32>::from_answer_without_keys(&lens, &keys).unwrap();
        assert_eq!(read.values_per_key(), vec![1, 0, 3]);
    }

    #[test]
    fn validation() {
        let ok = KVPairs::<f32>::new(vec![1, 2, 3], vec![1.0; 6]);
        assert!(ok.validate(true).is_ok());
        assert!(matches!(
            KVPairs::<f32>::new(vec![1, 3, 2], vec![1.0; 3]).validate(true),
            Err(Error::UnsortedKeys { index: 2 })
        ));
        assert!(matches!(
            KVPairs::<f32>::new(vec![1, 1], vec![1.0; 2]).validate(true),
            Err(Error::DuplicateKey { key: 1 })
        ));
        assert!(matches!(
            KVPairs::<f32>::new(vec![1, 2], vec![1.0; 3]).validate(true),
            Err(Error::ValsMismatch { .. })
        ));
        assert!(matches!(
            KVPairs::<f32>::new(vec![1, 2], Vec::new()).validate(true),
            Err(Error::ValsMismatch { .. })
        ));
        assert!(KVPairs::<f32>::new(vec![1, 2], Vec::new())
            .validate(false)
            .is_ok());
        let lens = KVPairs::<f32>::with_lens(vec![1, 2], vec![1.0; 5], vec![2, 3]);
        assert!(lens.validate(true).is_ok());
        assert_eq!(lens.values_per_key(), vec![2, 3]);
        assert!(matches!(
            KVPairs::<f32>::with_lens(vec![1, 2], vec![1.0; 5], vec![2, 2]).validate(true),
            Err(Error::ValsMismatch { .. })
        ));
        assert!(matches!(
            KVPairs::<f32>::with_lens(vec![1, 2], vec![1.0; 5], vec![5]).validate(true),
            Err(Error::LensMismatch { .. })
        ));
    }

    #[test]
    fn keys_are_checked_once_per_array() {
        let keys = SArray::from_vec(vec![1u64, 2, 3]);
        let pairs = KVPairs::<f32>::new(keys.clone(), vec![0.0; 3]);
        assert!(!keys.known_ascending());
        pairs.validate(true).unwrap();
        // Clones share what was learnt; parts of it inherit it.
        assert!(keys.known_ascending());
        assert!(keys.slice(1..3).known_ascending());
        // A fresh array is checked again.
        let bad = KVPairs::<f32>::new(vec![3u64, 1], vec![0.0; 2]);
        assert!(bad.validate(true).is_err());
        assert!(!bad.keys.known_ascending());
    }

    #[test]
    fn unsorted_keys_are_found_anywhere() {
        let sorted: Vec<Key> = (0..10_000).map(|i| i * 3).collect();
        assert_eq!(first_unsorted(&sorted), None);
        assert_eq!(first_unsorted(&[]), None);
        assert_eq!(first_unsorted(&[5]), None);
        for at in [0, 1, 2047, 2048, 2049, 5000, 9998] {
            let mut keys = sorted.clone();
            keys[at + 1] = keys[at];
            assert_eq!(first_unsorted(&keys), Some(at), "duplicate after {at}");
            keys[at + 1] = keys[at].saturating_sub(1);
            assert_eq!(first_unsorted(&keys), Some(at), "descent after {at}");
        }
    }

    #[test]
    fn frames_round_trip_and_reject_garbage() {
        let pairs = KVPairs::<f64>::with_lens(vec![7, 9], vec![1.0, 2.0, 3.0], vec![1, 2]);
        let (frames, types) = pairs.to_frames();
        let mut msg = Message {
            data: frames,
            ..Message::default()
        };
        msg.meta.data_type = types;
        assert_eq!(KVPairs::<f64>::from_message(&msg).unwrap(), pairs);
        // Raw bytes (OTHER) are accepted.
        msg.meta.data_type[1] = DataType::Other;
        assert!(KVPairs::<f64>::from_message(&msg).is_ok());
        // A wrong value type is not.
        msg.meta.data_type[1] = DataType::Int8;
        assert!(KVPairs::<f64>::from_message(&msg).is_err());
        msg.meta.data_type[1] = DataType::Double;
        // Keys not a multiple of 8 bytes.
        msg.data[0] = Bytes::from_static(&[1, 2, 3]);
        assert!(KVPairs::<f64>::from_message(&msg).is_err());
        // Lens that do not add up.
        msg.data[0] = pairs.keys.bytes().clone();
        msg.data[2] = SArray::from_vec(vec![1i32, 5]).bytes().clone();
        assert!(KVPairs::<f64>::from_message(&msg).is_err());
    }

    #[test]
    fn one_byte_values_read_char_frames() {
        assert!(accepts::<u8>(DataType::Char));
        assert!(accepts::<u8>(DataType::Other));
        assert!(accepts::<i8>(DataType::UInt8));
        assert!(!accepts::<f32>(DataType::Char));
    }
}
