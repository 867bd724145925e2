//! Embedding tables that live on the servers (`pslite.torch.EmbeddingBag`
//! and `Embedding`): [`Tables`], the rows of every table a server holds,
//! created on first touch and trained by a row-wise optimizer applied to
//! the gradients the workers push.
//!
//! **Where.** A data-parallel job's servers ([`crate::serve_all_reduce`])
//! serve them on their float32 app ([`crate::ALL_REDUCE_APPS`]`.float32`)
//! beside the all-reduce ([`TorchServerHandle`]): a request whose `cmd`
//! has the [`EMBEDDING`] bit is a table's. That app is the one replicated
//! (`PS_REPLICAS`) and checkpointed (`PS_CHECKPOINT_DIR`) by default, so
//! both carry the tables with nothing to configure.
//!
//! **Requests** (`cmd` bits: [`EMBEDDING`], [`CONFIG`], the table id in
//! [`TABLE_MASK`]):
//! - `EMBEDDING | table`: a pull reads rows (making missing ones), a push
//!   applies one gradient per key (`dim` values each) with the table's
//!   optimizer, a push-pull both.
//! - `EMBEDDING | CONFIG | table`: a push of the table's configuration
//!   ([`TableConfig::to_words`], the same record for each key), sent to
//!   the first key of every key range, so each range's replicas get it in
//!   order with its data. The same configuration again is accepted; another
//!   one is refused, naming the table.
//! - `EMBEDDING | CONFIG` (table 0): a pull of [`STATS_WORDS`] words per key:
//!   this server's tables, rows, store bytes, resident bytes, the rows'
//!   own bytes, rows expired, rows admitted, candidates held and gradients
//!   dropped ([`Tables::stats`]).
//!
//! **Keys.** A table's id is a hash of its name ([`table_id`]); id `i`
//! of table `t` is key [`key_of`]`(t, i)`, a bijective mix of the 64 bits
//! of `i`, so any id is a key of its own and rows spread evenly over the
//! servers' key ranges. A row's initial values depend on the table's seed
//! and the key only (`embedding/init.rs`).
//!
//! **Memory**: `embedding/table.rs` (a slab of rows and a `u32` index).
//! **Expiry and admission** (per table): `embedding/lifecycle.rs`.

use std::collections::BTreeMap;

use log::warn;

use crate::all_reduce::AllReduceHandle;
use crate::kv_pairs::{KVMeta, KVPairs, Key};
use crate::kv_server::{KVServer, ReplicatedHandle};
use crate::sarray::SArray;
use crate::Refusal;

mod config;
mod init;
mod lifecycle;
mod optim;
mod snapshot;
mod table;
#[cfg(test)]
mod tests;

pub use config::{
    Init, Optimizer, TableConfig, MAX_ADMIT_AFTER, MAX_DIM, MAX_EXPIRE_AFTER, MAX_NAME,
};
pub use lifecycle::MAX_CANDIDATES;
pub use table::{Table, CHUNK_ROWS};

/// The `cmd` bit of a table's request on a data-parallel job's float32
/// app (other commands there are the all-reduce's).
pub const EMBEDDING: i32 = 1 << 30;
/// The `cmd` bit of a table's configuration (a push) or, with table 0,
/// of the servers' statistics (a pull).
pub const CONFIG: i32 = 1 << 28;
/// The bits of a table's id in `cmd`.
pub const TABLE_MASK: i32 = CONFIG - 1;
/// Words per key of a statistics pull: tables, then rows, store bytes,
/// resident bytes of the process, the rows' own bytes (`dim * 4` each),
/// rows expired, rows admitted, candidates held and row gradients dropped
/// (not admitted yet), each a `u64` as two words (low first).
pub const STATS_WORDS: usize = 17;

/// MurmurHash3's 64-bit finalizer: a bijection of 64 bits that mixes them.
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^= x >> 33;
    x = x.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    x ^ (x >> 33)
}

/// The inverse of [`mix`]: `unmix(mix(x)) == x`.
pub fn unmix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(inverse(0xC4CE_B9FE_1A85_EC53));
    x ^= x >> 33;
    x = x.wrapping_mul(inverse(0xFF51_AFD7_ED55_8CCD));
    x ^ (x >> 33)
}

/// The multiplicative inverse of odd `c` modulo 2^64 (Newton's iteration:
/// each step doubles the bits that are right, 3 of them at the start).
const fn inverse(c: u64) -> u64 {
    let mut x = c;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// The id of the table named `name`: its FNV-1a hash in [`TABLE_MASK`]'s
/// bits (never 0). Two names with one id are refused at configuration.
pub fn table_id(name: &str) -> u32 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in name.as_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3);
    }
    let id = (mix(h) as u32) & TABLE_MASK as u32;
    id.max(1)
}

/// The key of id `id` (any 64 bits: a negative `i64` as its bits) in table
/// `table`: `mix(id ^ mix(table ^ GOLDEN))`.
pub fn key_of(table: u32, id: u64) -> Key {
    mix(id ^ mix(u64::from(table) ^ 0x9E37_79B9_7F4A_7C15))
}

/// The id whose key is `key` in table `table`: the inverse of [`key_of`]
/// (a serving export turns the servers' keys back into the ids).
pub fn id_of(table: u32, key: Key) -> u64 {
    unmix(key) ^ mix(u64::from(table) ^ 0x9E37_79B9_7F4A_7C15)
}

/// The values of the row a table configured as `config` makes for `key`
/// on first touch (what a lookup of an id never trained answers).
pub fn initial_row(config: &TableConfig, key: Key) -> Vec<f32> {
    let mut out = vec![0.0; config.dim as usize];
    init::fill(config.init, config.seed, key, &mut out);
    out
}

/// Each table's configuration and its rows' words (the key as two words,
/// the values, the optimizer's state: [`TableConfig::stride`] words a row)
/// in a copy [`Tables::snapshot`] made (a checkpoint's float32 section of
/// a `pslite.torch` job); the error says where it is wrong.
pub fn decode_copy(data: &[u8]) -> Result<Vec<(TableConfig, Vec<u32>)>, String> {
    let copy = snapshot::decode(data)?;
    Ok(copy
        .into_iter()
        .map(|(config, rows, _)| (config, rows))
        .collect())
}

/// Whether `key` is in `[begin, end)` (`end == u64::MAX`: every key from
/// `begin` on).
fn in_range(key: Key, begin: Key, end: Key) -> bool {
    key >= begin && (key < end || end == u64::MAX)
}

/// Every table a server holds (see the module's doc).
pub struct Tables {
    tables: BTreeMap<u32, Table>,
    /// The job's workers (a table step of expiry is a push from each).
    workers: usize,
    /// The first key of each of the servers' key ranges (expiry's clocks
    /// and admission's counts are per range).
    begins: Vec<Key>,
}

impl Default for Tables {
    fn default() -> Self {
        Tables {
            tables: BTreeMap::new(),
            workers: 1,
            begins: vec![0],
        }
    }
}

impl Tables {
    /// No table, one worker, one key range.
    pub fn new() -> Self {
        Self::default()
    }

    /// No table, for a job of `workers` workers and servers whose key
    /// ranges start at `begins`.
    pub fn for_job(workers: usize, mut begins: Vec<Key>) -> Self {
        begins.push(0);
        begins.sort_unstable();
        begins.dedup();
        Tables {
            tables: BTreeMap::new(),
            workers: workers.max(1),
            begins,
        }
    }

    /// The table of id `table`, if configured.
    pub fn table(&self, table: u32) -> Option<&Table> {
        self.tables.get(&table)
    }

    /// Configures a table: new, or the same as it is; else why not.
    pub fn configure(&mut self, config: TableConfig) -> Result<(), String> {
        config.check()?;
        match self.tables.get(&config.table) {
            None => {
                self.tables.insert(config.table, Table::new(config));
                Ok(())
            }
            Some(t) if t.config == config => Ok(()),
            Some(t) if t.config.name != config.name => Err(format!(
                "tables {:?} and {:?} have the same id {} (a hash of the name): rename one",
                t.config.name, config.name, config.table
            )),
            Some(t) => Err(format!(
                "table {:?} exists on the servers with {}, and this worker creates it with {}: \
                 every worker must create a table with the same settings (after a restore, the \
                 checkpoint's)",
                config.name, t.config, config
            )),
        }
    }

    /// Applies one request (`meta.cmd` has [`EMBEDDING`]); the answer's
    /// pairs, or the refusal (nothing of a refused push is applied).
    pub fn apply(&mut self, meta: &KVMeta, req: &KVPairs<f32>) -> Result<KVPairs<f32>, Refusal> {
        let refuse = |reason: String| Refusal::Other {
            app: meta.app_id,
            reason,
        };
        let table = (meta.cmd & TABLE_MASK) as u32;
        if meta.cmd & CONFIG != 0 {
            if table == 0 {
                if meta.push {
                    return Err(refuse("table statistics are pulled, not pushed".into()));
                }
                let stats = self.stats();
                let vals: Vec<f32> = (0..req.keys.len())
                    .flat_map(|_| stats.iter().map(|&w| f32::from_bits(w)))
                    .collect();
                return Ok(KVPairs::new(req.keys.clone(), vals));
            }
            if !meta.push || meta.pull {
                return Err(refuse("a table's configuration is pushed alone".into()));
            }
            let n = req.values_per_key().first().copied().unwrap_or(0);
            let words: Vec<u32> = req.vals[..n.min(req.vals.len())]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let config = TableConfig::from_words(&words).map_err(&refuse)?;
            if config.table != table {
                return Err(refuse(format!(
                    "table {:?}: its configuration names id {}, the request {table}",
                    config.name, config.table
                )));
            }
            self.configure(config).map_err(refuse)?;
            return Ok(KVPairs::default());
        }
        let job = lifecycle::Job {
            workers: self.workers,
            begins: &self.begins,
        };
        let Some(t) = self.tables.get_mut(&table) else {
            return Err(refuse(format!(
                "embedding table id {table} is not configured on this server (a module sends \
                 its configuration before its first pull or push)"
            )));
        };
        let dim = t.config.dim as usize;
        if meta.push {
            let want = req.keys.len() * dim;
            if req.vals.len() != want || !req.lens.iter().all(|&l| l as usize == dim) {
                return Err(refuse(format!(
                    "table {:?} has rows of {dim} values: a push of {} keys must send {want} \
                     values, got {}",
                    t.config.name,
                    req.keys.len(),
                    req.vals.len()
                )));
            }
            if lifecycle::enabled(&t.config) {
                lifecycle::push(t, job, &req.keys, &req.vals).map_err(&refuse)?;
            } else {
                for (i, &key) in req.keys.iter().enumerate() {
                    let slot = t.touch(key).map_err(&refuse)?;
                    t.apply(slot, &req.vals[i * dim..(i + 1) * dim]);
                }
            }
        }
        if !meta.pull {
            return Ok(KVPairs::default());
        }
        let mut vals = Vec::with_capacity(req.keys.len() * dim);
        if lifecycle::enabled(&t.config) {
            lifecycle::pull(t, job, &req.keys, &mut vals);
        } else {
            for &key in req.keys.iter() {
                let slot = t.touch(key).map_err(&refuse)?;
                vals.extend_from_slice(t.values(slot));
            }
        }
        Ok(KVPairs {
            keys: req.keys.clone(),
            vals: SArray::from_vec(vals),
            lens: SArray::new(),
        })
    }

    /// [`STATS_WORDS`] words: tables, rows, store bytes, resident bytes,
    /// the rows' own bytes, rows expired, rows admitted, candidates,
    /// gradients dropped.
    pub fn stats(&self) -> [u32; STATS_WORDS] {
        let rows: usize = self.tables.values().map(Table::len).sum();
        let bytes: usize = self.tables.values().map(Table::bytes).sum();
        let own: usize = self
            .tables
            .values()
            .map(|t| t.len() * t.config.dim as usize * 4)
            .sum();
        let life =
            |f: fn(&Table) -> u64| -> usize { self.tables.values().map(f).sum::<u64>() as usize };
        let expired = life(|t| t.life.expired);
        let admitted = life(|t| t.life.admitted);
        let candidates = life(|t| t.life.candidates() as u64);
        let dropped = life(|t| t.life.dropped);
        let mut out = [0u32; STATS_WORDS];
        out[0] = self.tables.len() as u32;
        let all = [
            rows,
            bytes,
            resident_bytes(),
            own,
            expired,
            admitted,
            candidates,
            dropped,
        ];
        for (i, v) in all.into_iter().enumerate() {
            out[1 + 2 * i] = v as u32;
            out[2 + 2 * i] = (v as u64 >> 32) as u32;
        }
        out
    }

    /// The configurations and rows of keys `[begin, end)`
    /// (`embedding/snapshot.rs`).
    pub fn snapshot(&self, begin: Key, end: Key) -> Vec<u8> {
        let job = lifecycle::Job {
            workers: self.workers,
            begins: &self.begins,
        };
        snapshot::encode(self.tables.values(), job, |k| in_range(k, begin, end))
    }

    /// Replaces the rows of keys `[begin, end)` by `data`'s (from
    /// [`Tables::snapshot`]) and takes its tables' configurations; on an
    /// error nothing changes.
    pub fn restore(&mut self, begin: Key, end: Key, data: &[u8]) -> Result<(), String> {
        let copy = snapshot::decode(data)?;
        let mut next: BTreeMap<u32, Table> = BTreeMap::new();
        for (id, t) in &self.tables {
            let mut kept = Table::new(t.config.clone());
            kept.life = t.life.clone();
            kept.life.ranges.retain(|&b, _| !in_range(b, begin, end));
            for row in t.rows() {
                let key = u64::from(row[0]) | (u64::from(row[1]) << 32);
                if !in_range(key, begin, end) {
                    kept.insert_words(row)?;
                }
            }
            next.insert(*id, kept);
        }
        for (config, rows, ranges) in copy {
            let t = match next.get_mut(&config.table) {
                Some(t) if t.config == config => t,
                Some(t) => {
                    return Err(format!(
                        "table {:?} is held here with {} and the copy has {:?} with {}",
                        t.config.name, t.config, config.name, config
                    ))
                }
                None => next
                    .entry(config.table)
                    .or_insert_with(|| Table::new(config.clone())),
            };
            let stride = t.stride();
            for row in rows.chunks_exact(stride) {
                let key = u64::from(row[0]) | (u64::from(row[1]) << 32);
                if !in_range(key, begin, end) {
                    return Err(format!(
                        "table {:?}: key {key} is outside the range {begin}..{end}",
                        config.name
                    ));
                }
                if t.find(key).is_some() {
                    return Err(format!("table {:?}: key {key} twice", config.name));
                }
                t.insert_words(row)?;
            }
            t.life.ranges.extend(ranges);
        }
        self.tables = next;
        Ok(())
    }
}

/// The process's resident bytes (`/proc/self/statm`), 0 where unknown.
fn resident_bytes() -> usize {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * usize::try_from(page).unwrap_or(4096)
}

/// The request handle of a data-parallel job's float32 app: the
/// all-reduce ([`AllReduceHandle`]) and the embedding tables ([`Tables`],
/// requests whose `cmd` has [`EMBEDDING`]). Replicated and checkpointed:
/// its copies are the tables' (a round of the all-reduce in flight is not
/// state a copy can carry; checkpoints are taken with none in flight).
pub struct TorchServerHandle {
    all_reduce: AllReduceHandle<f32>,
    tables: Tables,
}

impl TorchServerHandle {
    /// Rounds of `workers` workers, averaging, and no table; the servers'
    /// key ranges start at `begins` ([`Tables::for_job`]).
    pub fn new(workers: usize, begins: Vec<Key>) -> Self {
        TorchServerHandle {
            all_reduce: AllReduceHandle::new(workers).averaging(),
            tables: Tables::for_job(workers, begins),
        }
    }

    /// The tables.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }
}

impl ReplicatedHandle<f32> for TorchServerHandle {
    fn handle(&mut self, meta: &KVMeta, req: KVPairs<f32>, server: &KVServer<f32>) {
        if meta.cmd & EMBEDDING == 0 {
            return self.all_reduce.handle(meta, req, server);
        }
        let res = self.tables.apply(meta, &req);
        if let Err(e) = server.answer(meta, res) {
            warn!("cannot answer node {}: {e}", meta.sender);
        }
    }

    fn snapshot(&self, begin: Key, end: Key) -> Vec<u8> {
        self.tables.snapshot(begin, end)
    }

    fn restore(&mut self, begin: Key, end: Key, data: &[u8]) -> Result<(), String> {
        self.tables.restore(begin, end, data)
    }
}
