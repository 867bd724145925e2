//! The checkpoint file format: one file per server and checkpoint (its key
//! ranges, one section per range and app) and one manifest per checkpoint
//! (every server's file, written last: its presence makes the checkpoint
//! complete). Pure encoding and decoding; reading and writing files is
//! `disk.rs`'s.
//!
//! Layout, version 2: a few framing bytes (little-endian) around a header
//! described once, in `proto/proto/meta.proto` (`PBCheckpointHeader`, encoded
//! by prost like every other pslite message):
//!
//! ```text
//! magic       8 bytes  "PSLCKPT\0"
//! version     u32      2
//! header_len  u32
//! header_crc  u32      CRC-32 of the header
//! header      header_len bytes: PBCheckpointHeader (kind, job, id, time,
//!             writer, label, the cluster's key ranges, replicas, map version;
//!             a server's file: the ranges it holds and its sections (range,
//!             app, length, CRC-32); a manifest: every server's file with the
//!             CRC-32 of its content)
//! sections    the sections' bytes, in header order (server files only)
//! content_crc u32      CRC-32 of every byte before it
//! ```
//!
//! A file's *content checksum* is its last four bytes, the CRC-32 of the rest
//! ([`content_crc`]); the manifest records it for each server file, so it
//! ties the manifest to those very files (two files of the same size differ
//! in it), and each file names its job, checkpoint, writer and ranges.
//!
//! A file is read whole and checked before anything in it is used: the
//! magic, the version, the header's checksum and fields, the kind, the
//! length the header announces against the file's (truncated or too long),
//! each section's checksum, and the content's. Every failure is a
//! [`FormatError`] saying what is wrong.

use bytes::Bytes;
use prost::Message as _;
use pslite_proto::checkpoint::CheckpointFile;
use pslite_proto::pb::{PbCheckpointFile, PbCheckpointHeader, PbCheckpointSection};
use pslite_proto::NodeId;

/// The first bytes of every checkpoint file.
pub const MAGIC: &[u8; 8] = b"PSLCKPT\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 2;
/// Bytes before the header: magic, version, header length and CRC.
const PREAMBLE: usize = 8 + 4 + 4 + 4;

/// The checksum a manifest records for a file: the CRC-32 of every byte but
/// the last four (where a well-formed file stores the same value); `None`
/// for fewer than four bytes.
pub fn content_crc(bytes: &[u8]) -> Option<u32> {
    let body = bytes.len().checked_sub(4)?;
    Some(crc32fast::hash(&bytes[..body]))
}

/// Which kind of checkpoint file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One server's key ranges.
    Server = 1,
    /// The list of a checkpoint's server files.
    Manifest = 2,
}

impl Kind {
    fn from_u32(v: u32) -> Option<Kind> {
        match v {
            1 => Some(Kind::Server),
            2 => Some(Kind::Manifest),
            _ => None,
        }
    }

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
    /// The job it belongs to.
    pub job: String,
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
    /// The key ranges it holds.
    pub ranges: Vec<u32>,
    /// One per range and app.
    pub sections: Vec<Section>,
}

/// A checkpoint's manifest: every server file, written once all were.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// The job it belongs to.
    pub job: String,
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

/// A file: its header, framed and checksummed, then its sections.
fn encode(header: &PbCheckpointHeader, sections: &[&[u8]]) -> Vec<u8> {
    let head = header.encode_to_vec();
    let body: usize = sections.iter().map(|s| s.len()).sum();
    let mut out = Vec::with_capacity(PREAMBLE + head.len() + body + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&head).to_le_bytes());
    out.extend_from_slice(&head);
    for s in sections {
        out.extend_from_slice(s);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The key ranges of a header's `bounds`.
fn ranges_of(bounds: &[u64]) -> Result<Vec<(u64, u64)>, FormatError> {
    if bounds.len() % 2 != 0 {
        return Err(FormatError::Malformed(
            "its key ranges have an odd number of bounds".into(),
        ));
    }
    let ranges: Vec<(u64, u64)> = bounds.chunks_exact(2).map(|p| (p[0], p[1])).collect();
    if let Some(i) = ranges.iter().position(|&(b, e)| b > e) {
        return Err(FormatError::Malformed(format!(
            "key range {i} begins after it ends"
        )));
    }
    Ok(ranges)
}

/// Checks `data` and reads its header; the sections start at the returned
/// offset.
fn decode(data: &[u8], expected: Kind) -> Result<(PbCheckpointHeader, usize), FormatError> {
    if data.len() < MAGIC.len() || &data[..MAGIC.len()] != MAGIC {
        return Err(FormatError::NotACheckpoint);
    }
    let truncated = |needed: u64| FormatError::Truncated {
        size: data.len() as u64,
        needed,
    };
    if data.len() < PREAMBLE {
        return Err(truncated(PREAMBLE as u64));
    }
    let version = le_u32(&data[8..12]);
    if version != VERSION {
        return Err(FormatError::Version { found: version });
    }
    let header_len = le_u32(&data[12..16]) as usize;
    let header_crc = le_u32(&data[16..20]);
    let header_end = PREAMBLE + header_len;
    if data.len() < header_end + 4 {
        return Err(truncated((header_end + 4) as u64));
    }
    let head = &data[PREAMBLE..header_end];
    let computed = crc32fast::hash(head);
    if computed != header_crc {
        return Err(FormatError::HeaderChecksum {
            stored: header_crc,
            computed,
        });
    }
    let header = PbCheckpointHeader::decode(head)
        .map_err(|e| FormatError::Malformed(format!("its header does not decode: {e}")))?;
    let kind = header.kind.unwrap_or(0);
    let kind = Kind::from_u32(kind)
        .ok_or_else(|| FormatError::Malformed(format!("unknown kind {kind}")))?;
    if kind != expected {
        return Err(FormatError::Kind {
            found: kind.name(),
            expected: expected.name(),
        });
    }
    let body = header
        .section
        .iter()
        .try_fold(0u64, |sum, s| sum.checked_add(s.length.unwrap_or(0)))
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
    let ranges = ranges_of(&header.bounds)?;
    let mut at = header_end;
    for s in &header.section {
        let (range, app) = (s.range.unwrap_or(0), s.app.unwrap_or(0));
        if range as usize >= ranges.len() {
            return Err(FormatError::Malformed(format!(
                "a section of key range {range}, which the {} ranges lack",
                ranges.len()
            )));
        }
        let end = at + s.length.unwrap_or(0) as usize;
        let computed = crc32fast::hash(&data[at..end]);
        let stored = s.crc.unwrap_or(0);
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
    let stored = le_u32(&data[at..at + 4]);
    let computed = crc32fast::hash(&data[..at]);
    if computed != stored {
        return Err(FormatError::FileChecksum { stored, computed });
    }
    Ok((header, header_end))
}

/// The header's fields both kinds share.
fn common(
    kind: Kind,
    job: &str,
    id: u64,
    created_ms: u64,
    writer: NodeId,
    label: &str,
    shape: &Shape,
) -> PbCheckpointHeader {
    PbCheckpointHeader {
        kind: Some(kind as u32),
        job: Some(job.to_string()),
        id: Some(id),
        created_ms: Some(created_ms),
        writer: Some(writer),
        label: Some(label.to_string()),
        bounds: shape.ranges.iter().flat_map(|&(b, e)| [b, e]).collect(),
        replicas: Some(shape.replicas),
        map_version: Some(shape.map_version),
        ..PbCheckpointHeader::default()
    }
}

fn shape_of(h: &PbCheckpointHeader) -> Result<Shape, FormatError> {
    Ok(Shape {
        ranges: ranges_of(&h.bounds)?,
        replicas: h.replicas.unwrap_or(0),
        map_version: h.map_version.unwrap_or(0),
    })
}

/// A server's file as bytes.
pub fn encode_server(file: &ServerFile) -> Vec<u8> {
    let mut header = common(
        Kind::Server,
        &file.job,
        file.id,
        file.created_ms,
        file.writer,
        &file.label,
        &file.shape,
    );
    header.range = file.ranges.clone();
    header.section = file
        .sections
        .iter()
        .map(|s| PbCheckpointSection {
            range: Some(s.range),
            app: Some(s.app),
            length: Some(s.data.len() as u64),
            crc: Some(crc32fast::hash(&s.data)),
        })
        .collect();
    let bodies: Vec<&[u8]> = file.sections.iter().map(|s| &s.data[..]).collect();
    encode(&header, &bodies)
}

/// Reads a server's file, checked whole; sections share `data`'s buffer.
pub fn decode_server(data: &Bytes) -> Result<ServerFile, FormatError> {
    let (h, mut at) = decode(data, Kind::Server)?;
    let shape = shape_of(&h)?;
    if let Some(r) = h.range.iter().find(|&&r| r as usize >= shape.ranges.len()) {
        return Err(FormatError::Malformed(format!(
            "it holds key range {r}, which the {} ranges lack",
            shape.ranges.len()
        )));
    }
    let mut sections = Vec::with_capacity(h.section.len());
    for s in &h.section {
        let end = at + s.length.unwrap_or(0) as usize;
        sections.push(Section {
            range: s.range.unwrap_or(0),
            app: s.app.unwrap_or(0),
            data: data.slice(at..end),
        });
        at = end;
    }
    Ok(ServerFile {
        job: h.job.unwrap_or_default(),
        id: h.id.unwrap_or(0),
        created_ms: h.created_ms.unwrap_or(0),
        writer: h.writer.unwrap_or(pslite_proto::K_EMPTY),
        label: h.label.unwrap_or_default(),
        shape,
        ranges: h.range,
        sections,
    })
}

/// A manifest as bytes.
pub fn encode_manifest(m: &Manifest) -> Vec<u8> {
    let mut header = common(
        Kind::Manifest,
        &m.job,
        m.id,
        m.created_ms,
        pslite_proto::ids::SCHEDULER,
        &m.label,
        &m.shape,
    );
    header.file = m
        .files
        .iter()
        .map(|f| PbCheckpointFile {
            name: Some(f.name.clone()),
            node: Some(f.node),
            size: Some(f.size),
            crc: Some(f.crc),
            range: f.ranges.clone(),
        })
        .collect();
    encode(&header, &[])
}

/// Reads a manifest, checked whole (every range in some file, no file with
/// a range the cluster lacks).
pub fn decode_manifest(data: &[u8]) -> Result<Manifest, FormatError> {
    let (h, _) = decode(data, Kind::Manifest)?;
    let shape = shape_of(&h)?;
    let files: Vec<CheckpointFile> = h
        .file
        .into_iter()
        .map(|f| CheckpointFile {
            name: f.name.unwrap_or_default(),
            node: f.node.unwrap_or(pslite_proto::K_EMPTY),
            size: f.size.unwrap_or(0),
            crc: f.crc.unwrap_or(0),
            ranges: f.range,
        })
        .collect();
    let ranges = shape.ranges.len() as u32;
    for f in &files {
        if let Some(r) = f.ranges.iter().find(|&&r| r >= ranges) {
            return Err(FormatError::Malformed(format!(
                "file {} holds key range {r}, which the {ranges} ranges lack",
                f.name
            )));
        }
    }
    if let Some(r) = (0..ranges).find(|r| !files.iter().any(|f| f.ranges.contains(r))) {
        return Err(FormatError::Malformed(format!(
            "no file holds key range {r}"
        )));
    }
    Ok(Manifest {
        job: h.job.unwrap_or_default(),
        id: h.id.unwrap_or(0),
        created_ms: h.created_ms.unwrap_or(0),
        label: h.label.unwrap_or_default(),
        shape,
        files,
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

    const JOB: &str = "0123456789abcdef0123456789abcdef";

    fn server_file() -> ServerFile {
        ServerFile {
            job: JOB.into(),
            ranges: vec![0, 1],
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
            job: JOB.into(),
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
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        let err = decode_server(&Bytes::from(bytes)).unwrap_err();
        assert_eq!(err, FormatError::Version { found: 1 });
        assert!(err.to_string().contains("version 1"), "{err}");

        let m = encode_manifest(&manifest());
        let err = decode_server(&Bytes::from(m)).unwrap_err();
        assert!(matches!(err, FormatError::Kind { .. }), "{err}");
        let s = encode_server(&server_file());
        assert!(matches!(decode_manifest(&s), Err(FormatError::Kind { .. })));
        let err = decode_server(&Bytes::from_static(b"{\"weights\": []}")).unwrap_err();
        assert_eq!(err, FormatError::NotACheckpoint);
    }

    #[test]
    fn the_content_checksum_differs_between_files_of_one_size() {
        // The manifest's checksum of a file must tell two well-formed files
        // apart (a CRC over a file that ends with its own CRC would not).
        let a = encode_server(&server_file());
        let mut other = server_file();
        other.job = "fedcba9876543210fedcba9876543210".into();
        let b = encode_server(&other);
        assert_eq!(a.len(), b.len());
        assert_ne!(content_crc(&a), content_crc(&b));
        assert_eq!(content_crc(&a), Some(le_u32(&a[a.len() - 4..])));
        assert_eq!(content_crc(b"abc"), None);
        let read = decode_server(&Bytes::from(b)).unwrap();
        assert_eq!(
            (read.job.as_str(), read.ranges.as_slice()),
            (other.job.as_str(), &[0, 1][..])
        );
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
