//! A request's options ([`KVOptions`]) and what runs when it completes
//! ([`Callback`]).

use crate::compression::Compression;
use crate::kv_pairs::{KVPairs, Val};
use crate::sarray::SArray;
use crate::Error;

/// Runs when a request completes: the pulled pairs (empty for a push), or
/// why it failed.
pub type Callback<V> = Box<dyn FnOnce(Result<KVPairs<V>, Error>) + Send>;
/// Options of a request: command, priority, lens, callback and
/// compression.
pub struct KVOptions<V: Val> {
    pub(super) cmd: i32,
    pub(super) priority: i32,
    pub(super) lens: Option<SArray<i32>>,
    pub(super) callback: Option<Callback<V>>,
    /// `None`: the worker's ([`KVWorker::set_compression`](super::KVWorker::set_compression)).
    pub(super) compression: Option<Option<Compression>>,
}

impl<V: Val> Default for KVOptions<V> {
    fn default() -> Self {
        KVOptions {
            cmd: 0,
            priority: 0,
            lens: None,
            callback: None,
            compression: None,
        }
    }
}

impl<V: Val> KVOptions<V> {
    /// The default options: cmd 0, priority 0, uniform values, no callback.
    pub fn new() -> Self {
        Self::default()
    }

    /// The command the server's handle sees (sent as `head`).
    pub fn cmd(mut self, cmd: i32) -> Self {
        self.cmd = cmd;
        self
    }

    /// The request's priority: what this node sends to a server goes
    /// higher priority first, first come first served among equals (large
    /// values in parts, so a request waits for at most one part of a lower
    /// one); the server's answer goes back with it. ps-lite's meta field.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Compresses this request's values (and asks for a compressed answer,
    /// if `compression` says so) with `compression` (`None`: sends them as
    /// they are), instead of the worker's
    /// ([`KVWorker::set_compression`](super::KVWorker::set_compression)). Servers that do not read
    /// compressed values (C++ ones) get them as they are.
    pub fn compression(mut self, compression: Option<Compression>) -> Self {
        self.compression = Some(compression);
        self
    }

    /// Values per key, for pushes with variable-length values (copied).
    pub fn lens(mut self, lens: &[i32]) -> Self {
        self.lens = Some(SArray::from_slice(lens));
        self
    }

    /// Values per key, shared without copying.
    pub fn zlens(mut self, lens: SArray<i32>) -> Self {
        self.lens = Some(lens);
        self
    }

    /// Runs `callback` when the request completes, with the pulled pairs.
    pub fn callback(
        mut self,
        callback: impl FnOnce(Result<KVPairs<V>, Error>) + Send + 'static,
    ) -> Self {
        self.callback = Some(Box::new(callback));
        self
    }
}
