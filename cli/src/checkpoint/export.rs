//! `pslite checkpoint export`: a `pslite.torch` job's embedding tables out
//! of a complete checkpoint (`PS_CHECKPOINT_DIR`), as files one process
//! loads for inference without servers (`pslite.torch.load_tables`,
//! `EmbeddingBag.from_export`; docs/TORCH.md, "Serving").
//!
//! What it reads: the checkpoint's manifest, then for each key range one
//! file that holds it (the first listed that reads back whole and matches
//! the manifest's size and checksum: with `PS_REPLICAS` a damaged replica's
//! file is passed over, saying so), and in it the float32 app's section
//! (the tables' copy, `pslite::embedding::decode_copy`). Every file is
//! checked whole before anything is written.
//!
//! What it writes in `--out` (created if needed): per table `NAME.ids.npy`
//! (int64, ascending: the ids as the workers gave them, recovered from the
//! servers' keys with `embedding::id_of`) and `NAME.rows.npy` (float32,
//! one row per id), NAME being the table's name if it is made of letters,
//! digits, `.`, `_` and `-` only (else `table-ID`); then `tables.json`
//! last, listing the checkpoint and each table's name, id, dimension,
//! initializer, seed, optimizer, rows and files. The optimizer's state is
//! not exported (inference does not need it; the checkpoint keeps it).
//! Memory: every table's ids and values (their bytes), one server file
//! being read, and a copy in id order of the table being written.
//! Dense weights are not in the checkpoint: the servers of a `pslite.torch`
//! job hold no dense parameters (they sum gradients), so they come from the
//! user's `torch.save` of the model.
//!
//! NumPy's `.npy` format (version 1.0): the magic `\x93NUMPY`, the version
//! bytes 1 and 0, a little-endian `u16` header length, then a Python dict
//! literal (`descr`, `fortran_order`, `shape`) padded with spaces and a
//! newline so the data starts at a multiple of 64 bytes, then the data in C
//! order.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use pslite::checkpoint::disk::{self, MANIFEST};
use pslite::checkpoint::format::{self, Manifest};
use pslite::embedding::{self, Init, Optimizer, TableConfig};

/// Options of `pslite checkpoint export`.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The job's PS_CHECKPOINT_DIR (the checkpoint its LATEST names is
    /// exported, unless --checkpoint says which), or one checkpoint's
    /// directory (`DIR/checkpoint-000003`).
    pub dir: PathBuf,
    /// Where to write the tables (created if needed; files of the same
    /// names there are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// The checkpoint to export, by id [default: the one LATEST names].
    #[arg(long)]
    pub checkpoint: Option<u64>,
}

/// One table gathered from every range.
struct Gathered {
    config: TableConfig,
    /// The ids, in the files' order.
    ids: Vec<i64>,
    /// Their rows' values (as f32 bits), `dim` a row, in the same order.
    values: Vec<u32>,
}

/// Runs `pslite checkpoint export`; what it wrote, or why not.
pub fn run(args: &ExportArgs) -> Result<String, String> {
    let dir = checkpoint_dir(&args.dir, args.checkpoint)?;
    let manifest_path = dir.join(MANIFEST);
    let bytes = fs::read(&manifest_path).map_err(|e| {
        format!(
            "cannot read {}: {e} (is {} a complete checkpoint of a pslite job?)",
            manifest_path.display(),
            dir.display()
        )
    })?;
    let manifest = format::decode_manifest(&bytes)
        .map_err(|e| format!("{} is not a usable manifest: {e}", manifest_path.display()))?;
    let tables = gather(&dir, &manifest)?;
    if tables.is_empty() {
        return Err(format!(
            "checkpoint {} in {} holds no embedding table (a checkpoint of a pslite.torch job \
             whose workers created pslite.torch.EmbeddingBag or Embedding modules has them)",
            manifest.id,
            dir.display()
        ));
    }
    fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let mut listed = Vec::new();
    let mut total = 0usize;
    for t in tables.into_values() {
        listed.push(write_table(&args.out, t, &mut total)?);
    }
    let count = listed.len();
    let doc = serde_json::json!({
        "format": "pslite-tables",
        "version": 1,
        "checkpoint": {
            "id": manifest.id,
            "job": manifest.job,
            "label": manifest.label,
            "created_ms": manifest.created_ms,
            "dir": dir.display().to_string(),
        },
        "dense": serde_json::Value::Null,
        "tables": listed,
    });
    let json = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    let path = args.out.join("tables.json");
    fs::write(&path, json + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(format!(
        "exported {count} tables ({total} rows) of checkpoint {} to {}",
        manifest.id,
        args.out.display()
    ))
}

/// The directory of the checkpoint to export.
fn checkpoint_dir(dir: &Path, id: Option<u64>) -> Result<PathBuf, String> {
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if let Some(id) = id {
        return Ok(disk::checkpoint_dir(dir, id));
    }
    if dir.join(MANIFEST).exists() {
        return Ok(dir.to_path_buf());
    }
    match disk::read_latest(dir)? {
        Some((_, id)) => Ok(disk::checkpoint_dir(dir, id)),
        None => Err(format!(
            "{} has no LATEST and no MANIFEST: give a job's PS_CHECKPOINT_DIR after a complete \
             checkpoint, one checkpoint's directory, or --checkpoint N",
            dir.display()
        )),
    }
}

/// Every table's rows over the checkpoint's ranges, by table id.
fn gather(dir: &Path, manifest: &Manifest) -> Result<BTreeMap<u32, Gathered>, String> {
    let app = pslite::ALL_REDUCE_APPS.float32;
    let mut tables: BTreeMap<u32, Gathered> = BTreeMap::new();
    for r in 0..manifest.shape.ranges.len() as u32 {
        let file = read_range(dir, manifest, r)?;
        let Some(section) = file.sections.iter().find(|s| s.range == r && s.app == app) else {
            continue; // nothing of the float32 app in this range
        };
        let copy = embedding::decode_copy(&section.data).map_err(|e| {
            format!(
                "key range {r} of checkpoint {} is not a pslite.torch job's tables: {e}",
                manifest.id
            )
        })?;
        for (config, words) in copy {
            let t = tables.entry(config.table).or_insert_with(|| Gathered {
                config: config.clone(),
                ids: Vec::new(),
                values: Vec::new(),
            });
            if t.config != config {
                return Err(format!(
                    "table {:?} has {} in one key range and {} in another",
                    config.name, t.config, config
                ));
            }
            let dim = config.dim as usize;
            for row in words.chunks_exact(config.stride()) {
                let key = u64::from(row[0]) | (u64::from(row[1]) << 32);
                t.ids.push(embedding::id_of(config.table, key) as i64);
                t.values.extend_from_slice(&row[2..2 + dim]);
            }
        }
    }
    Ok(tables)
}

/// The server file holding range `r`, read and checked whole.
fn read_range(dir: &Path, manifest: &Manifest, r: u32) -> Result<format::ServerFile, String> {
    let mut problems = Vec::new();
    for entry in manifest.files_of(r) {
        let path = dir.join(&entry.name);
        let bytes = match fs::read(&path) {
            Ok(b) => bytes::Bytes::from(b),
            Err(e) => {
                problems.push(format!("cannot read {}: {e}", path.display()));
                continue;
            }
        };
        if bytes.len() as u64 != entry.size || format::content_crc(&bytes) != Some(entry.crc) {
            problems.push(format!(
                "{} has {} bytes and not the content the manifest records ({} bytes): \
                 truncated, corrupt or another checkpoint's",
                path.display(),
                bytes.len(),
                entry.size
            ));
            continue;
        }
        match format::decode_server(&bytes) {
            Ok(f) if f.job == manifest.job && f.id == manifest.id => return Ok(f),
            Ok(f) => problems.push(format!(
                "{} belongs to job {} checkpoint {}, the manifest to job {} checkpoint {}",
                path.display(),
                f.job,
                f.id,
                manifest.job,
                manifest.id
            )),
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    if problems.is_empty() {
        problems.push("the manifest lists no file for it".into());
    }
    Err(format!(
        "key range {r} of checkpoint {}: {}",
        manifest.id,
        problems.join("; ")
    ))
}

/// Writes one table's two `.npy` files; its entry in `tables.json`.
fn write_table(out: &Path, t: Gathered, total: &mut usize) -> Result<serde_json::Value, String> {
    let c = &t.config;
    let stem = file_stem(c);
    let dim = c.dim as usize;
    let n = t.ids.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by_key(|&i| t.ids[i]);
    let ids: Vec<u8> = order.iter().flat_map(|&i| t.ids[i].to_le_bytes()).collect();
    let vals: Vec<u8> = order
        .iter()
        .flat_map(|&i| t.values[i * dim..(i + 1) * dim].iter())
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let ids_name = format!("{stem}.ids.npy");
    let rows_name = format!("{stem}.rows.npy");
    write_npy(&out.join(&ids_name), "<i8", &[n], &ids)?;
    write_npy(&out.join(&rows_name), "<f4", &[n, dim], &vals)?;
    *total += n;
    let init = match c.init {
        Init::Zeros => serde_json::json!(["zeros"]),
        Init::Uniform { low, high } => serde_json::json!(["uniform", low, high]),
        Init::Normal { std } => serde_json::json!(["normal", std]),
    };
    let optimizer = match c.optimizer {
        Optimizer::Sgd { lr } => serde_json::json!({"kind": "SGD", "lr": lr}),
        Optimizer::AdaGrad {
            lr,
            eps,
            initial_accumulator,
        } => serde_json::json!({"kind": "RowWiseAdaGrad", "lr": lr, "eps": eps,
                                 "initial_accumulator": initial_accumulator}),
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => serde_json::json!({"kind": "RowWiseAdam", "lr": lr, "betas": [beta1, beta2],
                                 "eps": eps}),
    };
    Ok(serde_json::json!({
        "name": c.name,
        "table": c.table,
        "dim": c.dim,
        "init": init,
        "seed": c.seed,
        "optimizer": optimizer,
        "expire_after": c.expire_after,
        "admit_after": c.admit_after,
        "rows": n,
        "ids": ids_name,
        "values": rows_name,
    }))
}

/// The table's file names' stem: its name if that is a plain file name.
fn file_stem(c: &TableConfig) -> String {
    let plain = !c.name.is_empty()
        && !c.name.starts_with('.')
        && !c.name.starts_with("table-")
        && c.name.len() <= 200
        && c.name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if plain {
        c.name.clone()
    } else {
        format!("table-{}", c.table)
    }
}

/// The header of a `.npy` file (see the module's doc).
fn npy_header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let mut f = fs::File::create(path).map_err(fail)?;
    f.write_all(&npy_header(descr, shape)).map_err(fail)?;
    f.write_all(data).map_err(fail)?;
    f.sync_all().map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_headers_are_numpys() {
        // The layout numpy.lib.format documents (python/tests load the
        // exported files with numpy.load).
        let h = npy_header("<i8", &[3]);
        assert_eq!(h.len() % 64, 0);
        assert!(h.starts_with(b"\x93NUMPY\x01\x00"));
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(text.starts_with("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"));
        assert!(text.ends_with(" \n"));
        let h = npy_header("<f4", &[2, 16]);
        assert_eq!(h.len() % 64, 0);
        assert!(std::str::from_utf8(&h[10..])
            .unwrap()
            .contains("'shape': (2, 16), }"));
        assert_eq!(u16::from_le_bytes([h[8], h[9]]) as usize, h.len() - 10);
    }

    #[test]
    fn only_plain_names_name_files() {
        let mut c = TableConfig {
            table: 42,
            name: "user.v2".into(),
            dim: 4,
            init: Init::Zeros,
            seed: 0,
            optimizer: Optimizer::Sgd { lr: 0.1 },
            expire_after: 0,
            admit_after: 0,
        };
        assert_eq!(file_stem(&c), "user.v2");
        for bad in ["../etc", "a/b", ".hidden", "table-7", "ü", ""] {
            c.name = bad.into();
            assert_eq!(file_stem(&c), "table-42", "{bad:?}");
        }
    }
}
