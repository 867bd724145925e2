//! `SArray<T>`: a shared, immutable array of plain values backed by
//! [`Bytes`], so that keys and values travel from a user's buffer to
//! ZeroMQ, and from a received frame to an app, without copies.
//!
//! Cloning and slicing share the buffer. An array made from a `Vec<T>`
//! takes the vector over without copying. An array made from received bytes
//! is used in place when the bytes are aligned for `T`; a misaligned frame
//! (ZeroMQ may place a frame anywhere in its receive buffer) is copied once
//! and counted in [`misaligned_copies`].

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, Range};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytemuck::Pod;
use bytes::Bytes;
use pslite_postoffice::Tracked;

#[cfg(target_endian = "big")]
compile_error!("pslite's wire format is little-endian; big-endian hosts are not supported");

static MISALIGNED_COPIES: AtomicU64 = AtomicU64::new(0);

/// How many received frames had to be copied because they were not aligned
/// for their element type (process-wide).
pub fn misaligned_copies() -> u64 {
    MISALIGNED_COPIES.load(Ordering::Relaxed)
}

/// A received frame whose length is not a whole number of elements.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a frame of {len} bytes is not a whole number of {elem}-byte elements")]
pub struct FrameLengthError {
    /// The frame's length in bytes.
    pub len: usize,
    /// The element size.
    pub elem: usize,
}

/// A shared, immutable array of `T`.
pub struct SArray<T> {
    bytes: Bytes,
    /// Set once the elements are known to be strictly ascending (checked
    /// keys); shared by clones, so a key array pushed again and again is
    /// checked once.
    ascending: Option<Arc<AtomicBool>>,
    _elem: PhantomData<T>,
}

impl<T> Clone for SArray<T> {
    fn clone(&self) -> Self {
        SArray {
            bytes: self.bytes.clone(),
            ascending: self.ascending.clone(),
            _elem: PhantomData,
        }
    }
}

/// A vector's elements as bytes.
struct VecBytes<T>(Vec<T>);

impl<T: Pod> AsRef<[u8]> for VecBytes<T> {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

impl<T: Pod + Send + Sync> SArray<T> {
    /// An empty array.
    pub fn new() -> Self {
        SArray {
            bytes: Bytes::new(),
            ascending: None,
            _elem: PhantomData,
        }
    }

    /// Takes `values` over without copying.
    pub fn from_vec(values: Vec<T>) -> Self {
        if values.is_empty() {
            return SArray::new();
        }
        // A large array tells the shared-memory path's cache when it dies,
        // so the cache can send it again without a copy while it lives and
        // needs no clone of it.
        SArray {
            bytes: Bytes::from_owner(Tracked::new(VecBytes(values))),
            ascending: Some(Arc::new(AtomicBool::new(false))),
            _elem: PhantomData,
        }
    }

    /// An array over the bytes of `owner`, without copying them (unless
    /// they are misaligned for `T`, see [`SArray::from_bytes`]): for memory
    /// another runtime owns, such as a NumPy array, held until the array and
    /// every clone and slice of it are dropped.
    ///
    /// The owner promises what `Bytes` promise: its bytes do not move when
    /// it moves, and they do not change while the array lives. (A buffer
    /// changed after the array is dropped is fine: the shared-memory path
    /// sends only arrays it knows alive again without a copy.)
    pub fn from_owner<O>(owner: O) -> Result<Self, FrameLengthError>
    where
        O: AsRef<[u8]> + Send + 'static,
    {
        let bytes = Bytes::from_owner(Tracked::new(owner));
        let mut array = SArray::from_bytes(bytes)?;
        if array.ascending.is_none() && !array.is_empty() {
            array.ascending = Some(Arc::new(AtomicBool::new(false)));
        }
        Ok(array)
    }

    /// Copies `values`.
    pub fn from_slice(values: &[T]) -> Self {
        SArray::from_vec(values.to_vec())
    }

    /// Views received bytes as elements: in place when aligned, else copied.
    pub fn from_bytes(bytes: Bytes) -> Result<Self, FrameLengthError> {
        let elem = std::mem::size_of::<T>();
        if bytes.len() % elem != 0 {
            return Err(FrameLengthError {
                len: bytes.len(),
                elem,
            });
        }
        if bytes.is_empty() {
            return Ok(SArray::new());
        }
        if (bytes.as_ptr() as usize) % std::mem::align_of::<T>() == 0 {
            return Ok(SArray {
                bytes,
                ascending: None,
                _elem: PhantomData,
            });
        }
        MISALIGNED_COPIES.fetch_add(1, Ordering::Relaxed);
        let mut values = vec![T::zeroed(); bytes.len() / elem];
        bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(&bytes);
        Ok(SArray::from_vec(values))
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        if self.bytes.is_empty() {
            return &[];
        }
        // Invariant: non-empty bytes are aligned and a whole number of T.
        bytemuck::cast_slice(&self.bytes)
    }

    /// A sub-array sharing this one's buffer.
    pub fn slice(&self, range: Range<usize>) -> Self {
        let elem = std::mem::size_of::<T>();
        SArray {
            bytes: self.bytes.slice(range.start * elem..range.end * elem),
            // A part of an ascending array is ascending.
            ascending: self
                .known_ascending()
                .then(|| Arc::new(AtomicBool::new(true))),
            _elem: PhantomData,
        }
    }

    /// Whether these elements were already found strictly ascending.
    pub(crate) fn known_ascending(&self) -> bool {
        self.ascending
            .as_ref()
            .is_some_and(|a| a.load(Ordering::Relaxed))
    }

    /// Remembers (for this array and its clones) that the elements are
    /// strictly ascending. The buffer is immutable, so it stays true.
    pub(crate) fn mark_ascending(&self) {
        if let Some(a) = &self.ascending {
            a.store(true, Ordering::Relaxed);
        }
    }

    /// The underlying bytes (little-endian elements), shared.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The elements as a fresh vector.
    pub fn to_vec(&self) -> Vec<T> {
        self.as_slice().to_vec()
    }

    /// Concatenates arrays (one copy; none if there is only one).
    pub fn concat(parts: &[SArray<T>]) -> Self {
        match parts {
            [] => SArray::new(),
            [one] => one.clone(),
            _ => {
                let total = parts.iter().map(|p| p.len()).sum();
                let mut values = Vec::with_capacity(total);
                for p in parts {
                    values.extend_from_slice(p.as_slice());
                }
                SArray::from_vec(values)
            }
        }
    }
}

impl<T: Pod + Send + Sync> Default for SArray<T> {
    fn default() -> Self {
        SArray::new()
    }
}

impl<T: Pod + Send + Sync> Deref for SArray<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Pod + Send + Sync> From<Vec<T>> for SArray<T> {
    fn from(values: Vec<T>) -> Self {
        SArray::from_vec(values)
    }
}

impl<T: Pod + Send + Sync> From<&[T]> for SArray<T> {
    fn from(values: &[T]) -> Self {
        SArray::from_slice(values)
    }
}

impl<T: Pod + Send + Sync + fmt::Debug> fmt::Debug for SArray<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice().iter()).finish()
    }
}

impl<T: Pod + Send + Sync + PartialEq> PartialEq for SArray<T> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: Pod + Send + Sync + Eq> Eq for SArray<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_vec_shares_without_copy() {
        let v = vec![1.0f32, 2.0, 3.0, 4.0];
        let ptr = v.as_ptr() as usize;
        let a = SArray::from_vec(v);
        assert_eq!(a.as_ptr() as usize, ptr);
        let s = a.slice(1..3);
        assert_eq!(&s[..], &[2.0, 3.0]);
        assert_eq!(s.as_ptr() as usize, ptr + 4);
    }

    #[test]
    fn misaligned_bytes_are_copied_and_counted() {
        let raw = Bytes::from(vec![0u8; 17]);
        let odd = raw.slice(1..17);
        let before = misaligned_copies();
        let a = SArray::<u64>::from_bytes(odd).unwrap();
        assert_eq!(a.len(), 2);
        assert!(misaligned_copies() > before);
        assert!(SArray::<u64>::from_bytes(Bytes::from(vec![0u8; 12])).is_err());
        assert!(SArray::<u64>::from_bytes(Bytes::new()).unwrap().is_empty());
    }

    #[test]
    fn from_owner_shares_foreign_bytes() {
        struct Foreign(Box<[u8]>);
        impl AsRef<[u8]> for Foreign {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        let raw: Box<[u8]> = bytemuck::cast_slice(&[1.5f32, 2.5, 3.5]).into();
        let ptr = raw.as_ptr() as usize;
        let a = SArray::<f32>::from_owner(Foreign(raw)).unwrap();
        assert_eq!(a.as_ptr() as usize, ptr);
        assert_eq!(&a[..], &[1.5, 2.5, 3.5]);
        assert!(SArray::<f32>::from_owner(Foreign(vec![0u8; 6].into())).is_err());
    }

    #[test]
    fn concat_of_one_is_free() {
        let a = SArray::from_vec(vec![1u64, 2]);
        let c = SArray::concat(std::slice::from_ref(&a));
        assert_eq!(c.as_ptr(), a.as_ptr());
        let b = SArray::from_vec(vec![3u64]);
        assert_eq!(&SArray::concat(&[a, b])[..], &[1, 2, 3]);
    }
}
