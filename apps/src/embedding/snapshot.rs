//! A copy of a key range of every table ([`encode`], [`decode`]): what a
//! replica joining a range and a checkpoint's section of the float32 app
//! hold. Little-endian: the magic `PSLEMB01`, the number of tables
//! (`u32`), then per table its configuration's words (a `u32` count, the
//! words: `embedding/config.rs`), its rows in the range (a `u64` count)
//! and each row's words as the store keeps them (the key as two words,
//! the values, the optimizer's state, with expiry the last push's clock),
//! then for a table with expiry or admission its key ranges' clocks and
//! candidates (`embedding/lifecycle.rs`). Every table is in every copy,
//! with no rows if none is in the range, so a copy carries the
//! configurations.

use std::collections::BTreeMap;

use super::config::TableConfig;
use super::lifecycle::{self, RangeState};
use super::table::Table;

/// A table in a copy: its configuration, its rows' words, its ranges'
/// expiry and admission state.
pub type TableCopy = (TableConfig, Vec<u32>, BTreeMap<u64, RangeState>);

const MAGIC: &[u8; 8] = b"PSLEMB01";

/// The tables' configurations and their live rows (not expired in `job`)
/// whose key `keep` accepts.
pub fn encode<'a>(
    tables: impl Iterator<Item = &'a Table>,
    job: lifecycle::Job,
    keep: impl Fn(u64) -> bool,
) -> Vec<u8> {
    let tables: Vec<&Table> = tables.collect();
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(tables.len() as u32).to_le_bytes());
    for t in tables {
        let words = t.config.to_words();
        out.extend_from_slice(&(words.len() as u32).to_le_bytes());
        out.extend_from_slice(bytemuck::cast_slice(&words));
        let count_at = out.len();
        out.extend_from_slice(&0u64.to_le_bytes());
        let mut count = 0u64;
        for row in t.rows() {
            let key = u64::from(row[0]) | (u64::from(row[1]) << 32);
            if keep(key) && lifecycle::live(t, job, row) {
                for w in row {
                    out.extend_from_slice(&w.to_le_bytes());
                }
                count += 1;
            }
        }
        out[count_at..count_at + 8].copy_from_slice(&count.to_le_bytes());
        if lifecycle::enabled(&t.config) {
            lifecycle::encode(&t.life, &keep, &mut out);
        }
    }
    out
}

/// Reads `data` as [`encode`] wrote it: each table's configuration and its
/// rows' words; the error says where it is wrong.
pub fn decode(data: &[u8]) -> Result<Vec<TableCopy>, String> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let bytes = at
            .checked_add(n)
            .and_then(|end| data.get(at..end))
            .ok_or_else(|| {
                format!(
                    "an embedding copy of {} bytes ends inside an entry at byte {at}",
                    data.len()
                )
            })?;
        at += n;
        Ok(bytes)
    };
    if take(8)? != MAGIC {
        return Err("an embedding copy does not start with PSLEMB01".into());
    }
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let tables = word(take(4)?);
    let mut out = Vec::new();
    for _ in 0..tables {
        let n = word(take(4)?) as usize;
        let words: Vec<u32> = take(n.saturating_mul(4))?
            .chunks_exact(4)
            .map(word)
            .collect();
        let config = TableConfig::from_words(&words)?;
        let b = take(8)?;
        let rows = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        let len = usize::try_from(rows)
            .ok()
            .and_then(|r| r.checked_mul(config.stride() * 4))
            .ok_or_else(|| format!("table {:?}: {rows} rows cannot be held", config.name))?;
        let row_words: Vec<u32> = take(len)?.chunks_exact(4).map(word).collect();
        let ranges = if lifecycle::enabled(&config) {
            lifecycle::decode(&config.name, &mut take)?
        } else {
            BTreeMap::new()
        };
        out.push((config, row_words, ranges));
    }
    if at != data.len() {
        return Err(format!(
            "an embedding copy has {} bytes after its last table",
            data.len() - at
        ));
    }
    Ok(out)
}
