//! Row expiry and feature admission (Monolith's), per table
//! ([`TableConfig::expire_after`], [`TableConfig::admit_after`]): the
//! pushes and pulls of a table that has either, and the state they keep
//! ([`Lifecycle`]).
//!
//! **Pushes only.** Only pushes are replicated (`PS_REPLICAS`: a range's
//! replicas apply the same pushes in the same order, pulls are answered by
//! the primary alone), so only pushes count: a pull never makes, refreshes
//! nor counts a row. Every decision is a function of one key range's
//! pushes, so the replicas of a range decide alike.
//!
//! **Steps.** Each key range of a table has a clock, the number of pushes
//! of the table it applied. A table step is one push from each worker, so
//! `expire_after = N` is `N * workers` pushes of the range ([`Tables`]
//! knows the job's workers and the servers' key ranges). A row whose last
//! push is `N * workers` pushes of its range old (that many pushes without
//! it) has expired: a pull answers it as a row that does not exist, a push
//! makes it anew from the initializer (as if first touched). Expired rows
//! are removed from the store by a sweep every `max(N * workers / 2, 1)`
//! pushes of the table on the server, their memory reused by the next rows
//! (the sweep's timing is not visible: a row swept or still held expired
//! reads the same). Each row keeps the clock of its last push (1 word).
//!
//! **Admission.** With `admit_after = K > 1`, an id without a row is a
//! candidate: each push that carries it counts it once (a worker sends an
//! id once per push, duplicates in its batch summed), and the `K`-th makes
//! its row and applies its gradient; the gradients of the pushes before are
//! dropped. A pull of an id without a row answers zeros (as DeepRec and
//! RecIS answer ids not admitted: the feature is absent). An expired row
//! must be admitted again. Candidates are a map of key to (count, clock of
//! the last push that carried it), 16 bytes each plus the map's overhead,
//! at most [`MAX_CANDIDATES`] per key range of a table: ids seen while it
//! is full are not counted (their gradients dropped, counted in
//! `dropped`). With expiry, a candidate not pushed for `expire_after`
//! steps is forgotten: a push finds its count 0 and the sweep removes it
//! (and a full map is swept before it refuses an id), so the sweep's timing
//! is not seen here either.
//!
//! A copy of a range (replicas, checkpoints: `embedding/snapshot.rs`)
//! carries the rows with their last-push clocks and, per table with
//! expiry or admission, the range's clock and candidates ([`encode`],
//! [`decode`]).
//!
//! [`Tables`]: super::Tables

use std::collections::{BTreeMap, HashMap};

use super::config::TableConfig;
use super::table::Table;
use crate::kv_pairs::Key;

/// The most candidates (ids counted, not admitted yet) a key range of a
/// table holds on a server.
pub const MAX_CANDIDATES: usize = 1 << 20;

/// A key range's state: its clock and its candidates.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RangeState {
    /// Pushes of the table this range applied (wrapping).
    pub clock: u32,
    /// Ids not admitted yet: key → (pushes that carried it, clock of the
    /// last one).
    pub candidates: HashMap<Key, (u32, u32)>,
}

/// A table's expiry and admission state on a server (see the module's
/// doc), and what it did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lifecycle {
    /// Per key range, by its first key.
    pub ranges: BTreeMap<Key, RangeState>,
    /// Pushes since the last sweep.
    since_sweep: u64,
    /// Rows expired (removed by a sweep or made anew by a push).
    pub expired: u64,
    /// Rows made after `admit_after` pushes.
    pub admitted: u64,
    /// Row gradients dropped (ids not admitted yet).
    pub dropped: u64,
}

/// The server's side of the job, which the rules depend on.
#[derive(Clone, Copy, Debug)]
pub struct Job<'a> {
    /// The workers (a table step is one push from each).
    pub workers: usize,
    /// The first key of each key range, sorted (the first is 0).
    pub begins: &'a [Key],
}

impl Job<'_> {
    /// The first key of `key`'s range.
    pub fn range_of(&self, key: Key) -> Key {
        let i = self.begins.partition_point(|&b| b <= key);
        self.begins.get(i.wrapping_sub(1)).copied().unwrap_or(0)
    }

    /// `expire_after` in pushes of a range (0: never), below 2^31 so that
    /// wrapping clocks compare.
    fn horizon(&self, config: &TableConfig) -> u32 {
        let pushes = u64::from(config.expire_after) * self.workers.max(1) as u64;
        pushes.min(1 << 31) as u32
    }
}

/// Whether `config` has expiry or admission.
pub fn enabled(config: &TableConfig) -> bool {
    config.expire_after > 0 || config.admit_after > 1
}

/// Whether a row of `t` whose words are `row` (as [`Table::rows`] gives
/// them) is live: held and not expired. A copy leaves expired rows out,
/// which reads the same as keeping them (an expired row is a row that does
/// not exist), so an export or a restore never sees them.
pub fn live(t: &Table, job: Job, row: &[u32]) -> bool {
    let horizon = job.horizon(&t.config);
    if horizon == 0 {
        return true;
    }
    let key = u64::from(row[0]) | (u64::from(row[1]) << 32);
    let clock = t.life.ranges.get(&job.range_of(key)).map_or(0, |r| r.clock);
    let last = row.last().copied().unwrap_or(0);
    clock.wrapping_sub(last) < horizon
}

/// Whether the row in `slot` has expired at `clock`.
fn expired(t: &Table, slot: usize, clock: u32, horizon: u32) -> bool {
    horizon > 0 && clock.wrapping_sub(t.last_push(slot)) >= horizon
}

/// A push of gradients `vals` (`dim` a key) to `keys` (one key range:
/// that of the first key), applied as the module's doc says.
pub fn push(t: &mut Table, job: Job, keys: &[Key], vals: &[f32]) -> Result<(), String> {
    let Some(&first) = keys.first() else {
        return Ok(());
    };
    let dim = t.config.dim as usize;
    let horizon = job.horizon(&t.config);
    let admit = t.config.admit_after;
    let mut life = std::mem::take(&mut t.life);
    let range = life.ranges.entry(job.range_of(first)).or_default();
    let before = range.clock;
    let now = before.wrapping_add(1);
    range.clock = now;
    let mut result = Ok(());
    for (i, &key) in keys.iter().enumerate() {
        let held = t.find(key);
        let slot = match held {
            Some(slot) if !expired(t, slot, before, horizon) => slot,
            _ => {
                if admit > 1 {
                    if range.candidates.len() >= MAX_CANDIDATES && horizon > 0 {
                        forget(range, horizon);
                    }
                    let room = range.candidates.len() < MAX_CANDIDATES;
                    let seen = match range.candidates.get_mut(&key) {
                        // Forgotten, swept or not: the sweep is not seen.
                        Some(c) if horizon > 0 && before.wrapping_sub(c.1) >= horizon => {
                            *c = (1, now);
                            1
                        }
                        Some(c) => {
                            *c = (c.0 + 1, now);
                            c.0
                        }
                        None if room => {
                            range.candidates.insert(key, (1, now));
                            1
                        }
                        None => 0,
                    };
                    if seen < admit {
                        life.dropped += 1;
                        continue;
                    }
                    range.candidates.remove(&key);
                    life.admitted += 1;
                }
                match held {
                    Some(slot) => {
                        life.expired += 1;
                        t.reset(slot);
                        slot
                    }
                    None => match t.touch(key) {
                        Ok(slot) => slot,
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    },
                }
            }
        };
        t.apply(slot, &vals[i * dim..(i + 1) * dim]);
        if horizon > 0 {
            t.set_last_push(slot, now);
        }
    }
    life.since_sweep += 1;
    if horizon > 0 && life.since_sweep >= u64::from((horizon / 2).max(1)) {
        life.since_sweep = 0;
        sweep(t, &mut life, job, horizon);
    }
    t.life = life;
    result
}

/// Removes the expired rows and the candidates not pushed for the
/// horizon.
fn sweep(t: &mut Table, life: &mut Lifecycle, job: Job, horizon: u32) {
    let ranges = &life.ranges;
    let clock = |key: Key| ranges.get(&job.range_of(key)).map_or(0, |r| r.clock);
    let removed = t.retain(|key, last| clock(key).wrapping_sub(last) < horizon);
    life.expired += removed as u64;
    for range in life.ranges.values_mut() {
        forget(range, horizon);
    }
}

/// Forgets the candidates of `range` not pushed for the horizon (which
/// a push finds forgotten whether the sweep removed them or not).
fn forget(range: &mut RangeState, horizon: u32) {
    let now = range.clock;
    range
        .candidates
        .retain(|_, &mut (_, last)| now.wrapping_sub(last) < horizon);
}

/// A pull of `keys`: each row's values if it is held and has not expired,
/// else the initializer's row (zeros with admission: not admitted).
pub fn pull(t: &Table, job: Job, keys: &[Key], out: &mut Vec<f32>) {
    let dim = t.config.dim as usize;
    let horizon = job.horizon(&t.config);
    for &key in keys {
        let clock = t.life.ranges.get(&job.range_of(key)).map_or(0, |r| r.clock);
        match t.find(key) {
            Some(slot) if !expired(t, slot, clock, horizon) => {
                out.extend_from_slice(t.values(slot))
            }
            _ if t.config.admit_after > 1 => out.resize(out.len() + dim, 0.0),
            _ => {
                let at = out.len();
                out.resize(at + dim, 0.0);
                t.initial_values(key, &mut out[at..]);
            }
        }
    }
}

/// The state of the ranges whose first key `keep` accepts, appended to
/// `out`: a `u32` count of ranges, then each range's first key (`u64`),
/// clock (`u32`), candidates (`u64` count) and each candidate's key
/// (`u64`), count and clock (`u32`s). Little-endian.
pub fn encode(life: &Lifecycle, keep: impl Fn(Key) -> bool, out: &mut Vec<u8>) {
    let ranges: Vec<_> = life.ranges.iter().filter(|(b, _)| keep(**b)).collect();
    out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    for (begin, r) in ranges {
        out.extend_from_slice(&begin.to_le_bytes());
        out.extend_from_slice(&r.clock.to_le_bytes());
        out.extend_from_slice(&(r.candidates.len() as u64).to_le_bytes());
        // In key order: the same state gives the same bytes.
        let sorted: BTreeMap<_, _> = r.candidates.iter().collect();
        for (key, (count, last)) in sorted {
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
            out.extend_from_slice(&last.to_le_bytes());
        }
    }
}

/// Reads what [`encode`] wrote, taking bytes with `take`.
pub fn decode<'a>(
    name: &str,
    take: &mut impl FnMut(usize) -> Result<&'a [u8], String>,
) -> Result<BTreeMap<Key, RangeState>, String> {
    let u32_of = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let u64_of = |b: &[u8]| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let mut ranges = BTreeMap::new();
    for _ in 0..u32_of(take(4)?) {
        let begin = u64_of(take(8)?);
        let clock = u32_of(take(4)?);
        let n = u64_of(take(8)?);
        if n > MAX_CANDIDATES as u64 {
            return Err(format!(
                "table {name:?}: a copy with {n} candidates in a range, at most \
                 {MAX_CANDIDATES} are held"
            ));
        }
        let mut candidates = HashMap::with_capacity(n as usize);
        for _ in 0..n {
            let b = take(16)?;
            candidates.insert(u64_of(&b[..8]), (u32_of(&b[8..12]), u32_of(&b[12..])));
        }
        ranges.insert(begin, RangeState { clock, candidates });
    }
    Ok(ranges)
}

impl Lifecycle {
    /// Candidates held.
    pub fn candidates(&self) -> usize {
        self.ranges.values().map(|r| r.candidates.len()).sum()
    }
}
