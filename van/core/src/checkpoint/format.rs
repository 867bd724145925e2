//! The checkpoint file format: one file per server and checkpoint (its key
//! ranges, one section per range and app) and one manifest per checkpoint
//! (every server's file, written last: its presence makes the checkpoint
//! complete). Pure encoding and decoding; reading and writing files is
//! `disk.rs`'s.
//!
//! Layout (little-endian), version 1:
//!
//! ```text
//! magic       8 bytes  "PSLCKPT\0"
//! version     u32      1
//! kind        u32      1 server file, 2 manifest
//! header_len  u32
//! header_crc  u32      CRC-32 of the header
//! header      header_len bytes:
//!               id u64, created (ms since the Unix epoch) u64, writer node i32,
//!               label (u32 length + UTF-8), replicas u32, map version u64,
//!               ranges u32 + (begin u64, end u64) each,
//!               sections u32 + (range u32, app i32, length u64, crc u32) each,
//!               files u32 + (name, node i32, size u64, crc u32,
//!                            ranges u32 + u32 each) each
//! sections    the sections' bytes, in header order (server files only)
//! file_crc    u32      CRC-32 of every byte before it
//! ```
//!
//! A file is read whole and checked before anything in it is used: the
//! magic, the version, the kind, the header's checksum, the length the
//! header announces against the file's (truncated or too long), each
//! section's checksum, and the whole file's. Every failure is a
//! [`FormatError`] saying what is wrong.

use bytes::Bytes;
use pslite_proto::checkpoint::CheckpointFile;
use pslite_proto::NodeId;

/// The first bytes of every checkpoint file.
pub const MAGIC: &[u8; 8] = b"PSLCKPT\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes before the header: magic, version, kind, header length and CRC.
const PREAMBLE: usize = 8 + 4 + 4 + 4 + 4;

/// Which kind of checkpoint file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One server's key ranges.
    Server = 1,
    /// The list of a checkpoint's server files.
    Manifest = 2,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Server => "a server's file",
            Kind::Manifest => "a manifest",
        }
    }
}

/// The key ranges a checkpoint belongs to: what a job must have to restore
/// it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// Every range of the cluster, `[begin, end)`, in key order (as many as
    /// servers).
    pub ranges: Vec<(u64, u64)>,
    /// `PS_REPLICAS` when it was taken (informational).
    pub replicas: u32,
    /// The range map version it was taken at (0: not replicated;
    /// informational).
    pub map_version: u64,
}

impl Shape {
    /// Why a job whose key ranges are `ranges` cannot restore a checkpoint
    /// of this shape (`None`: it can). Replicas and map versions may differ.
    pub fn mismatch(&self, ranges: &[(u64, u64)]) -> Option<String> {
        if self.ranges.len() != ranges.len() {
            return Some(format!(
                "it was taken with {} servers (key ranges), this job has {}: start the job \
                 with DMLC_NUM_SERVER={}",
                self.ranges.len(),
                ranges.len(),
                self.ranges.len()
            ));
        }
        let differ = self.ranges.iter().zip(ranges).position(|(a, b)| a != b)?;
        Some(format!(
            "its key range {differ} is {:?}, this job's is {:?}",
            self.ranges[differ], ranges[differ]
        ))
    }
}

/// One range's state as one app copied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// The range.
    pub range: u32,
    /// The app.
    pub app: i32,
    /// What the app's snapshot returned.
    pub data: Bytes,
}

/// A server's file: its ranges at the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerFile {
    /// The checkpoint.
    pub id: u64,
    /// When it was written, ms since the Unix epoch.
    pub created_ms: u64,
    /// The server that wrote it.
    pub writer: NodeId,
    /// The requester's label.
    pub label: String,
    /// The cluster it belongs to.
    pub shape: Shape,
    /// One per range and app.
    pub sections: Vec<Section>,
}

/// A checkpoint's manifest: every server file, written once all were.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// The checkpoint.
    pub id: u64,
    /// When it was completed, ms since the Unix epoch.
    pub created_ms: u64,
    /// The requester's label.
    pub label: String,
    /// The cluster it belongs to.
    pub shape: Shape,
    /// The server files.
    pub files: Vec<CheckpointFile>,
}

impl Manifest {
    /// The files holding range `r`, in the order listed (each range is in
    /// at least one: the scheduler completes no checkpoint otherwise).
    pub fn files_of(&self, r: u32) -> Vec<&CheckpointFile> {
        self.files
            .iter()
            .filter(|f| f.ranges.contains(&r))
            .collect()
    }
}

/// What is wrong with a checkpoint file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// It does not start with [`MAGIC`].
    #[error("it is not a pslite checkpoint file (it does not start with {MAGIC:?})")]
    NotACheckpoint,
    /// Another format version.
    #[error("it is in checkpoint format version {found}; this build reads version {VERSION} only")]
    Version {
        /// The file's version.
        found: u32,
    },
    /// A server file where a manifest was expected, or the other way round.
    #[error("it is {found}, not {expected}")]
    Kind {
        /// What it is.
        found: &'static str,
        /// What was expected.
        expected: &'static str,
    },
    /// Shorter than its header says (a partial write, a truncated copy).
    #[error("it is truncated: {size} bytes, its header announces {needed}")]
    Truncated {
        /// The file's size.
        size: u64,
        /// What the header announces.
        needed: u64,
    },
    /// Longer than its header says.
    #[error("it has {extra} bytes after its end (its header announces {needed})")]
    Trailing {
        /// Bytes too many.
        extra: u64,
        /// What the header announces.
        needed: u64,
    },
    /// The header's checksum does not match.
    #[error("its header is corrupt (CRC-32 {computed:#010x}, stored {stored:#010x})")]
    HeaderChecksum {
        /// Stored.
        stored: u32,
        /// Computed.
        computed: u32,
    },
    /// A section's checksum does not match.
    #[error(
        "its section of key range {range}, app {app} is corrupt (CRC-32 {computed:#010x}, \
         stored {stored:#010x})"
    )]
    SectionChecksum {
        /// The range.
        range: u32,
        /// The app.
        app: i32,
        /// Stored.
        stored: u32,
        /// Computed.
        computed: u32,
    },
    /// The whole file's checksum does not match.
    #[error("it is corrupt (CRC-32 {computed:#010x}, stored {stored:#010x})")]
    FileChecksum {
        /// Stored.
        stored: u32,
        /// Computed.
        computed: u32,
    },
    /// The header's fields do not fit together.
    #[error("its header is malformed: {0}")]
    Malformed(String),
}

struct Writer(Vec<u8>);

impl Writer {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], FormatError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(FormatError::Malformed(format!(
                "it ends inside {what} (at byte {} of {})",
                self.at,
                self.data.len()
            )));
        };
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }
    fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i32(&mut self, what: &str) -> Result<i32, FormatError> {
        Ok(self.u32(what)? as i32)
    }
    fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        let b = self.take(8, what)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        Ok(u64::from_le_bytes(w))
    }
    fn str(&mut self, what: &str) -> Result<String, FormatError> {
        let n = self.u32(what)? as usize;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| FormatError::Malformed(format!("{what} is not UTF-8")))
    }
    /// A count of items of at least `min_size` bytes each, bounded by what
    /// is left (a corrupt count cannot make us allocate more).
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize, FormatError> {
        let n = self.u32(what)? as usize;
        let left = self.data.len() - self.at;
        if n.saturating_mul(min_size) > left {
            return Err(FormatError::Malformed(format!(
                "{n} {what} cannot fit in its {left} bytes"
            )));
        }
        Ok(n)
    }
}

/// The header's fields common to both kinds.
struct Header {
    kind: Kind,
    id: u64,
    created_ms: u64,
    writer: NodeId,
    label: String,
    shape: Shape,
    /// (range, app, length, crc)
    sections: Vec<(u32, i32, u64, u32)>,
    files: Vec<CheckpointFile>,
}

fn encode(header: &Header, sections: &[&[u8]]) -> Vec<u8> {
    let mut h = Writer(Vec::new());
    h.u64(header.id);
    h.u64(header.created_ms);
    h.i32(header.writer);
    h.str(&header.label);
    h.u32(header.shape.replicas);
    h.u64(header.shape.map_version);
    h.u32(header.shape.ranges.len() as u32);
    for &(b, e) in &header.shape.ranges {
        h.u64(b);
        h.u64(e);
    }
    h.u32(header.sections.len() as u32);
    for &(range, app, len, crc) in &header.sections {
        h.u32(range);
        h.i32(app);
        h.u64(len);
        h.u32(crc);
    }
    h.u32(header.files.len() as u32);
    for f in &header.files {
        h.str(&f.name);
        h.i32(f.node);
        h.u64(f.size);
        h.u32(f.crc);
        h.u32(f.ranges.len() as u32);
        for &r in &f.ranges {
            h.u32(r);
        }
    }
    let body: usize = sections.iter().map(|s| s.len()).sum();
    let mut out = Writer(Vec::with_capacity(PREAMBLE + h.0.len() + body + 4));
    out.0.extend_from_slice(MAGIC);
    out.u32(VERSION);
    out.u32(header.kind as u32);
    out.u32(h.0.len() as u32);
    out.u32(crc32fast::hash(&h.0));
    out.0.extend_from_slice(&h.0);
    for s in sections {
        out.0.extend_from_slice(s);
    }
    let crc = crc32fast::hash(&out.0);
    out.u32(crc);
    out.0
}

/// Checks `data` and reads its header; the sections start at the returned
/// offset.
fn decode(data: &[u8], expected: Kind) -> Result<(Header, usize), FormatError> {
    if data.len() < MAGIC.len() || &data[..MAGIC.len()] != MAGIC {
        return Err(FormatError::NotACheckpoint);
    }
    let mut r = Reader { data, at: 8 };
    let truncated = |needed: u64| FormatError::Truncated {
        size: data.len() as u64,
        needed,
    };
    if data.len() < PREAMBLE {
        return Err(truncated(PREAMBLE as u64));
    }
    let version = r.u32("the version")?;
    if version != VERSION {
        return Err(FormatError::Version { found: version });
    }
    let kind = match r.u32("the kind")? {
        1 => Kind::Server,
        2 => Kind::Manifest,
        other => {
            return Err(FormatError::Malformed(format!("unknown kind {other}")));
        }
    };
    if kind != expected {
        return Err(FormatError::Kind {
            found: kind.name(),
            expected: expected.name(),
        });
    }
    let header_len = r.u32("the header length")? as usize;
    let header_crc = r.u32("the header checksum")?;
    let header_end = PREAMBLE + header_len;
    if data.len() < header_end + 4 {
        return Err(truncated((header_end + 4) as u64));
    }
    let computed = crc32fast::hash(&data[PREAMBLE..header_end]);
    if computed != header_crc {
        return Err(FormatError::HeaderChecksum {
            stored: header_crc,
            computed,
        });
    }
    let mut h = Reader {
        data: &data[..header_end],
        at: PREAMBLE,
    };
    let id = h.u64("the id")?;
    let created_ms = h.u64("the creation time")?;
    let writer = h.i32("the writer")?;
    let label = h.str("the label")?;
    let replicas = h.u32("the replicas")?;
    let map_version = h.u64("the map version")?;
    let n = h.count("key ranges", 16)?;
    let mut ranges = Vec::with_capacity(n);
    for _ in 0..n {
        ranges.push((h.u64("a key range")?, h.u64("a key range")?));
    }
    let n = h.count("sections", 20)?;
    let mut sections = Vec::with_capacity(n);
    for _ in 0..n {
        sections.push((
            h.u32("a section")?,
            h.i32("a section")?,
            h.u64("a section")?,
            h.u32("a section")?,
        ));
    }
    let n = h.count("files", 24)?;
    let mut files = Vec::with_capacity(n);
    for _ in 0..n {
        let name = h.str("a file name")?;
        let node = h.i32("a file")?;
        let size = h.u64("a file")?;
        let crc = h.u32("a file")?;
        let k = h.count("ranges of a file", 4)?;
        let mut fr = Vec::with_capacity(k);
        for _ in 0..k {
            fr.push(h.u32("a file's range")?);
        }
        files.push(CheckpointFile {
            name,
            node,
            size,
            crc,
            ranges: fr,
        });
    }
    if h.at != header_end {
        return Err(FormatError::Malformed(format!(
            "{} bytes after its last field",
            header_end - h.at
        )));
    }
    let body = sections
        .iter()
        .try_fold(0u64, |sum, s| sum.checked_add(s.2))
        .ok_or_else(|| FormatError::Malformed("section lengths overflow".into()))?;
    let needed = (header_end as u64)
        .checked_add(body)
        .and_then(|n| n.checked_add(4))
        .ok_or_else(|| FormatError::Malformed("section lengths overflow".into()))?;
    let size = data.len() as u64;
    if size < needed {
        return Err(truncated(needed));
    }
    if size > needed {
        return Err(FormatError::Trailing {
            extra: size - needed,
            needed,
        });
    }
    for (i, &(b, e)) in ranges.iter().enumerate() {
        if b > e {
            return Err(FormatError::Malformed(format!(
                "key range {i} begins after it ends"
            )));
        }
    }
    let mut at = header_end;
    for &(range, app, len, stored) in &sections {
        if range as usize >= ranges.len() {
            return Err(FormatError::Malformed(format!(
                "a section of key range {range}, which the {} ranges lack",
                ranges.len()
            )));
        }
        let end = at + len as usize;
        let computed = crc32fast::hash(&data[at..end]);
        if computed != stored {
            return Err(FormatError::SectionChecksum {
                range,
                app,
                stored,
                computed,
            });
        }
        at = end;
    }
    let stored = u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    let computed = crc32fast::hash(&data[..at]);
    if computed != stored {
        return Err(FormatError::FileChecksum { stored, computed });
    }
    let header = Header {
        kind,
        id,
        created_ms,
        writer,
        label,
        shape: Shape {
            ranges,
            replicas,
            map_version,
        },
        sections,
        files,
    };
    Ok((header, header_end))
}

/// A server's file as bytes.
pub fn encode_server(file: &ServerFile) -> Vec<u8> {
    let header = Header {
        kind: Kind::Server,
        id: file.id,
        created_ms: file.created_ms,
        writer: file.writer,
        label: file.label.clone(),
        shape: file.shape.clone(),
        sections: file
            .sections
            .iter()
            .map(|s| {
                (
                    s.range,
                    s.app,
                    s.data.len() as u64,
                    crc32fast::hash(&s.data),
                )
            })
            .collect(),
        files: Vec::new(),
    };
    let bodies: Vec<&[u8]> = file.sections.iter().map(|s| &s.data[..]).collect();
    encode(&header, &bodies)
}

/// Reads a server's file, checked whole; sections share `data`'s buffer.
pub fn decode_server(data: &Bytes) -> Result<ServerFile, FormatError> {
    let (h, mut at) = decode(data, Kind::Server)?;
    let mut sections = Vec::with_capacity(h.sections.len());
    for &(range, app, len, _) in &h.sections {
        let end = at + len as usize;
        sections.push(Section {
            range,
            app,
            data: data.slice(at..end),
        });
        at = end;
    }
    Ok(ServerFile {
        id: h.id,
        created_ms: h.created_ms,
        writer: h.writer,
        label: h.label,
        shape: h.shape,
        sections,
    })
}

/// A manifest as bytes.
pub fn encode_manifest(m: &Manifest) -> Vec<u8> {
    let header = Header {
        kind: Kind::Manifest,
        id: m.id,
        created_ms: m.created_ms,
        writer: pslite_proto::ids::SCHEDULER,
        label: m.label.clone(),
        shape: m.shape.clone(),
        sections: Vec::new(),
        files: m.files.clone(),
    };
    encode(&header, &[])
}

/// Reads a manifest, checked whole.
pub fn decode_manifest(data: &[u8]) -> Result<Manifest, FormatError> {
    let (h, _) = decode(data, Kind::Manifest)?;
    let ranges = h.shape.ranges.len() as u32;
    for f in &h.files {
        if let Some(r) = f.ranges.iter().find(|&&r| r >= ranges) {
            return Err(FormatError::Malformed(format!(
                "file {} holds key range {r}, which the {ranges} ranges lack",
                f.name
            )));
        }
    }
    if let Some(r) = (0..ranges).find(|r| !h.files.iter().any(|f| f.ranges.contains(r))) {
        return Err(FormatError::Malformed(format!(
            "no file holds key range {r}"
        )));
    }
    Ok(Manifest {
        id: h.id,
        created_ms: h.created_ms,
        label: h.label,
        shape: h.shape,
        files: h.files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            ranges: crate::replica::key_ranges(2),
            replicas: 2,
            map_version: 3,
        }
    }

    fn server_file() -> ServerFile {
        ServerFile {
            id: 7,
            created_ms: 1_700_000_000_000,
            writer: 8,
            label: "epoch 2".into(),
            shape: shape(),
            sections: vec![
                Section {
                    range: 0,
                    app: 0,
                    data: Bytes::from_static(b"range zero's state"),
                },
                Section {
                    range: 1,
                    app: 0,
                    data: Bytes::from(vec![7u8; 1000]),
                },
            ],
        }
    }

    fn manifest() -> Manifest {
        Manifest {
            id: 7,
            created_ms: 1_700_000_000_001,
            label: "epoch 2".into(),
            shape: shape(),
            files: vec![CheckpointFile {
                name: "server-0.ckpt".into(),
                node: 8,
                size: 1234,
                crc: 99,
                ranges: vec![0, 1],
            }],
        }
    }

    #[test]
    fn server_files_and_manifests_round_trip() {
        let file = server_file();
        let bytes = Bytes::from(encode_server(&file));
        assert_eq!(decode_server(&bytes), Ok(file));
        let m = manifest();
        assert_eq!(decode_manifest(&encode_manifest(&m)), Ok(m.clone()));
        assert_eq!(m.files_of(1).len(), 1);
        // An empty file (a server with no state) round-trips too.
        let empty = ServerFile {
            sections: vec![Section {
                range: 0,
                app: 0,
                data: Bytes::new(),
            }],
            ..server_file()
        };
        let bytes = Bytes::from(encode_server(&empty));
        assert_eq!(decode_server(&bytes), Ok(empty));
    }

    #[test]
    fn a_truncated_file_is_refused_at_every_length() {
        let bytes = encode_server(&server_file());
        for len in 0..bytes.len() {
            let cut = Bytes::copy_from_slice(&bytes[..len]);
            let err = decode_server(&cut).expect_err("a truncated file was read");
            assert!(
                matches!(
                    err,
                    FormatError::Truncated { .. }
                        | FormatError::NotACheckpoint
                        | FormatError::HeaderChecksum { .. }
                        | FormatError::Malformed(_)
                ),
                "{len}: {err}"
            );
        }
        let cut = Bytes::copy_from_slice(&bytes[..bytes.len() - 10]);
        let err = decode_server(&cut).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        let mut longer = bytes.clone();
        longer.push(0);
        let err = decode_server(&Bytes::from(longer)).unwrap_err();
        assert!(
            matches!(err, FormatError::Trailing { extra: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_flipped_byte_anywhere_is_caught() {
        let bytes = encode_server(&server_file());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            let bad = Bytes::from(bad);
            assert!(
                decode_server(&bad).is_err(),
                "byte {i} flipped and the file was read"
            );
        }
        // In a section: the error names it.
        let mut bad = bytes.clone();
        let at = bytes.len() - 4 - 500;
        bad[at] ^= 1;
        let err = decode_server(&Bytes::from(bad)).unwrap_err();
        assert!(
            matches!(
                err,
                FormatError::SectionChecksum {
                    range: 1,
                    app: 0,
                    ..
                }
            ),
            "{err}"
        );
        let m = encode_manifest(&manifest());
        for i in 0..m.len() {
            let mut bad = m.clone();
            bad[i] ^= 0x01;
            assert!(decode_manifest(&bad).is_err(), "manifest byte {i} flipped");
        }
    }

    #[test]
    fn wrong_version_kind_and_magic_are_refused() {
        let mut bytes = encode_server(&server_file());
        bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
        let err = decode_server(&Bytes::from(bytes)).unwrap_err();
        assert_eq!(err, FormatError::Version { found: 2 });
        assert!(err.to_string().contains("version 2"), "{err}");

        let m = encode_manifest(&manifest());
        let err = decode_server(&Bytes::from(m)).unwrap_err();
        assert!(matches!(err, FormatError::Kind { .. }), "{err}");
        let s = encode_server(&server_file());
        assert!(matches!(decode_manifest(&s), Err(FormatError::Kind { .. })));
        let err = decode_server(&Bytes::from_static(b"{\"weights\": []}")).unwrap_err();
        assert_eq!(err, FormatError::NotACheckpoint);
    }

    #[test]
    fn a_wrong_shape_is_named() {
        let s = shape();
        assert_eq!(s.mismatch(&crate::replica::key_ranges(2)), None);
        let why = s.mismatch(&crate::replica::key_ranges(3)).unwrap();
        assert!(
            why.contains("2 servers") && why.contains("DMLC_NUM_SERVER=2"),
            "{why}"
        );
        let mut other = crate::replica::key_ranges(2);
        other[1].0 += 1;
        other[0].1 += 1;
        let why = s.mismatch(&other).unwrap();
        assert!(why.contains("key range 0"), "{why}");
    }

    #[test]
    fn a_manifest_must_cover_every_range() {
        let mut m = manifest();
        m.files[0].ranges = vec![0];
        let err = decode_manifest(&encode_manifest(&m)).unwrap_err();
        assert!(
            err.to_string().contains("no file holds key range 1"),
            "{err}"
        );
        m.files[0].ranges = vec![0, 1, 5];
        assert!(decode_manifest(&encode_manifest(&m)).is_err());
    }
}
