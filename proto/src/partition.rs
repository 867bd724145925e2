//! pslite-only: one part of a data message cut into parts
//! (`PBMeta.partition`, field 130). The cutting and the reassembly live in
//! the van (`pslite_van::partition`); this is only the wire form. Every
//! field comes from the network: the receiver checks all of them.

use crate::pb::PbPartition;

/// Which part of a data message a message is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partition {
    /// The whole message's number, unique per sender and receiver.
    pub id: u64,
    /// This part, from 0.
    pub index: u32,
    /// How many parts the message has.
    pub count: u32,
    /// Bytes of all the message's data frames.
    pub total: u64,
    /// Where this part's bytes start among them.
    pub offset: u64,
    /// Part 0 only: the length of each of the message's data frames.
    pub frames: Vec<u64>,
}

impl Partition {
    pub(crate) fn to_pb(&self) -> PbPartition {
        PbPartition {
            id: Some(self.id),
            index: Some(self.index),
            count: Some(self.count),
            total: Some(self.total),
            offset: Some(self.offset),
            frame: self.frames.clone(),
        }
    }

    pub(crate) fn from_pb(pb: PbPartition) -> Partition {
        Partition {
            id: pb.id.unwrap_or(0),
            index: pb.index.unwrap_or(u32::MAX),
            count: pb.count.unwrap_or(0),
            total: pb.total.unwrap_or(0),
            offset: pb.offset.unwrap_or(u64::MAX),
            frames: pb.frame,
        }
    }
}
