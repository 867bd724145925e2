//! pslite-only: the descriptor of a data frame that travels through shared
//! memory between two pslite nodes of one host (`PBMeta.shm`, field 104).
//! The segments themselves and the checks of a received descriptor live in
//! the van (`pslite_van::shm`); this is only the wire form.

use crate::pb::PbShmFrame;

/// One data frame carried in one of the sender's shared-memory segments.
/// Every field comes from the network: the receiver checks all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmFrame {
    /// Which data frame of the message (0-based) this is; that frame is
    /// empty on the wire.
    pub index: u32,
    /// The sender's file descriptor number of the segment (a memfd).
    pub fd: i32,
    /// The random token in the segment's header.
    pub token: u64,
    /// The use of the segment this message stands for.
    pub generation: u64,
    /// Where the bytes start in the segment's data area.
    pub offset: u64,
    /// How many bytes.
    pub length: u64,
}

impl ShmFrame {
    pub(crate) fn to_pb(self) -> PbShmFrame {
        PbShmFrame {
            index: Some(self.index),
            fd: Some(self.fd),
            token: Some(self.token),
            generation: Some(self.generation),
            offset: Some(self.offset),
            length: Some(self.length),
        }
    }

    pub(crate) fn from_pb(pb: &PbShmFrame) -> ShmFrame {
        ShmFrame {
            index: pb.index.unwrap_or(u32::MAX),
            fd: pb.fd.unwrap_or(-1),
            token: pb.token.unwrap_or(0),
            generation: pb.generation.unwrap_or(0),
            offset: pb.offset.unwrap_or(u64::MAX),
            length: pb.length.unwrap_or(0),
        }
    }
}
