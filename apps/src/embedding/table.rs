//! One table's rows on one server ([`Table`]): a slab of fixed-size rows
//! (the key, the values, the optimizer's state: [`TableConfig::stride`]
//! words each) in chunks of [`CHUNK_ROWS`] rows, and an open-addressing
//! index of `u32` slots (linear probing, at most 3/4 full, grown by half)
//! that finds a key's row by comparing the key stored in the row itself.
//! Per row that is the row's bytes, 8 for the key, the state, and 4 / load
//! (5.3 to 8) bytes of index; a chunk is allocated whole but its pages are
//! touched (resident) only as rows fill it. Rows are removed by
//! [`Table::retain`] (expiry's sweep: the rows kept move down, the index is
//! rebuilt, emptied chunks freed) and by a restore, which rebuilds the
//! table.

use super::config::TableConfig;
use super::lifecycle::Lifecycle;
use super::{init, optim};

/// Rows per chunk of the slab.
pub const CHUNK_ROWS: usize = 1 << 12;
/// An empty index entry.
const EMPTY: u32 = u32::MAX;
/// The most rows a table holds on one server.
pub const MAX_ROWS: usize = (u32::MAX - 1) as usize;

/// One table's rows (see the module's doc).
pub struct Table {
    /// The settings (dimension, initializer, optimizer).
    pub config: TableConfig,
    stride: usize,
    chunks: Vec<Vec<u32>>,
    len: usize,
    index: Vec<u32>,
    /// Expiry and admission (`embedding/lifecycle.rs`).
    pub(super) life: Lifecycle,
}

impl Table {
    /// An empty table.
    pub fn new(config: TableConfig) -> Table {
        Table {
            stride: config.stride(),
            config,
            chunks: Vec::new(),
            len: 0,
            index: Vec::new(),
            life: Lifecycle::default(),
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated for rows and index (the chunks' capacity: pages of
    /// a chunk not filled yet are not resident).
    pub fn bytes(&self) -> usize {
        let words: usize = self.chunks.iter().map(|c| c.capacity()).sum();
        (words + self.index.len()) * 4
    }

    /// Bytes the rows' pages take (filled rows and the index).
    pub fn used_bytes(&self) -> usize {
        (self.len * self.stride + self.index.len()) * 4
    }

    fn row_words(&self, slot: usize) -> &[u32] {
        let (c, i) = (slot / CHUNK_ROWS, slot % CHUNK_ROWS);
        &self.chunks[c][i * self.stride..(i + 1) * self.stride]
    }

    fn row_words_mut(&mut self, slot: usize) -> &mut [u32] {
        let (c, i) = (slot / CHUNK_ROWS, slot % CHUNK_ROWS);
        &mut self.chunks[c][i * self.stride..(i + 1) * self.stride]
    }

    fn key_at(&self, slot: usize) -> u64 {
        let w = self.row_words(slot);
        u64::from(w[0]) | (u64::from(w[1]) << 32)
    }

    /// The index position to start probing at for `key` (the mixed key
    /// scaled to the index's length).
    fn home(&self, key: u64) -> usize {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (key >> 29);
        ((u128::from(h) * self.index.len() as u128) >> 64) as usize
    }

    /// The slot of `key`'s row, if held.
    pub fn find(&self, key: u64) -> Option<usize> {
        if self.index.is_empty() {
            return None;
        }
        let len = self.index.len();
        let mut at = self.home(key);
        loop {
            let slot = self.index[at];
            if slot == EMPTY {
                return None;
            }
            if self.key_at(slot as usize) == key {
                return Some(slot as usize);
            }
            at = if at + 1 == len { 0 } else { at + 1 };
        }
    }

    /// Puts `slot` (holding `key`) in the index, which has room.
    fn index_insert(&mut self, key: u64, slot: usize) {
        let len = self.index.len();
        let mut at = self.home(key);
        while self.index[at] != EMPTY {
            at = if at + 1 == len { 0 } else { at + 1 };
        }
        self.index[at] = slot as u32;
    }

    /// Grows the index by half when one more row would fill it past 3/4.
    fn grow_index(&mut self) {
        if (self.len + 1) * 4 <= self.index.len() * 3 {
            return;
        }
        let size = (self.index.len() + self.index.len() / 2).max(64);
        self.index = vec![EMPTY; size];
        for slot in 0..self.len {
            let key = self.key_at(slot);
            self.index_insert(key, slot);
        }
    }

    /// Appends a row for `key` whose words (after the key) are `rest`'s,
    /// or the initial row if `rest` is None; its slot. Err: the table is
    /// full.
    fn append(&mut self, key: u64, rest: Option<&[u32]>) -> Result<usize, String> {
        if self.len >= MAX_ROWS {
            return Err(format!(
                "table {:?} holds {MAX_ROWS} rows on this server, the most it can",
                self.config.name
            ));
        }
        self.grow_index();
        let slot = self.len;
        if slot / CHUNK_ROWS == self.chunks.len() {
            self.chunks
                .push(Vec::with_capacity(CHUNK_ROWS * self.stride));
        }
        let stride = self.stride;
        let chunk = &mut self.chunks[slot / CHUNK_ROWS];
        chunk.extend_from_slice(&[key as u32, (key >> 32) as u32]);
        match rest {
            Some(words) => chunk.extend_from_slice(words),
            None => chunk.resize(chunk.len() + stride - 2, 0),
        }
        self.len += 1;
        self.index_insert(key, slot);
        if rest.is_none() {
            self.reset(slot);
        }
        Ok(slot)
    }

    /// Makes the row in `slot` its initial row again (values and state;
    /// the last push's clock is left to the caller).
    pub fn reset(&mut self, slot: usize) {
        let dim = self.config.dim as usize;
        let (init, seed, opt) = (self.config.init, self.config.seed, self.config.optimizer);
        let state_words = opt.state_words(dim);
        let words = self.row_words_mut(slot);
        let key = u64::from(words[0]) | (u64::from(words[1]) << 32);
        let (vals, state) = words[2..2 + dim + state_words].split_at_mut(dim);
        init::fill(init, seed, key, bytemuck::cast_slice_mut(vals));
        optim::init_state(&opt, state);
    }

    /// The initial values of the row of `key`, written to `out`.
    pub fn initial_values(&self, key: u64, out: &mut [f32]) {
        init::fill(self.config.init, self.config.seed, key, out);
    }

    /// The clock of the last push of the row in `slot` (0 without expiry).
    pub fn last_push(&self, slot: usize) -> u32 {
        if self.config.expire_after == 0 {
            return 0;
        }
        self.row_words(slot)[self.stride - 1]
    }

    /// Sets the clock of the last push of the row in `slot` (with expiry).
    pub fn set_last_push(&mut self, slot: usize, clock: u32) {
        if self.config.expire_after > 0 {
            let last = self.stride - 1;
            self.row_words_mut(slot)[last] = clock;
        }
    }

    /// Keeps the rows for which `keep(key, last push)` holds, in their
    /// order, and rebuilds the index; chunks left empty are freed. The
    /// number of rows removed.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, u32) -> bool) -> usize {
        let mut kept = 0;
        for slot in 0..self.len {
            if !keep(self.key_at(slot), self.last_push(slot)) {
                continue;
            }
            if kept != slot {
                let row = self.row_words(slot).to_vec();
                self.row_words_mut(kept).copy_from_slice(&row);
            }
            kept += 1;
        }
        let removed = self.len - kept;
        if removed == 0 {
            return 0;
        }
        self.len = kept;
        self.chunks.truncate(kept.div_ceil(CHUNK_ROWS));
        let full = self.chunks.len().saturating_sub(1) * CHUNK_ROWS;
        if let Some(last) = self.chunks.last_mut() {
            last.truncate((kept - full) * self.stride);
        }
        self.index.fill(EMPTY);
        for slot in 0..self.len {
            let key = self.key_at(slot);
            self.index_insert(key, slot);
        }
        removed
    }

    /// The slot of `key`'s row, made on first touch.
    pub fn touch(&mut self, key: u64) -> Result<usize, String> {
        match self.find(key) {
            Some(slot) => Ok(slot),
            None => self.append(key, None),
        }
    }

    /// The values of the row in `slot`.
    pub fn values(&self, slot: usize) -> &[f32] {
        let dim = self.config.dim as usize;
        bytemuck::cast_slice(&self.row_words(slot)[2..2 + dim])
    }

    /// Applies gradient `g` to the row in `slot`.
    pub fn apply(&mut self, slot: usize, g: &[f32]) {
        let dim = self.config.dim as usize;
        let opt = self.config.optimizer;
        let words = &mut self.row_words_mut(slot)[2..2 + dim + opt.state_words(dim)];
        let (vals, state) = words.split_at_mut(dim);
        optim::step(&opt, bytemuck::cast_slice_mut(vals), state, g);
    }

    /// Each row's words (the key first), in slot order.
    pub fn rows(&self) -> impl Iterator<Item = &[u32]> + '_ {
        (0..self.len).map(|slot| self.row_words(slot))
    }

    /// Words per row.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Adds row `words` (the key first, [`Table::stride`] words) as it is.
    /// The caller makes sure the key is not held yet.
    pub fn insert_words(&mut self, words: &[u32]) -> Result<(), String> {
        let key = u64::from(words[0]) | (u64::from(words[1]) << 32);
        self.append(key, Some(&words[2..])).map(|_| ())
    }
}
