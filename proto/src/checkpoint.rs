//! pslite-only messages of checkpoints (`PS_CHECKPOINT_DIR`): a request for
//! one and its answers, the scheduler's order to write one and a server's
//! report, the restore plan on the node table, and a worker's requests in
//! flight on its BARRIER (`PBMeta.checkpoint`, field 111, with
//! `PBControl.cmd` CHECKPOINT 111). They go only to pslite nodes of a
//! cluster whose scheduler checkpoints, and to admin clients; the protocol
//! is in `van/src/checkpoint.rs` and docs/PROTOCOL.md.

use crate::pb::{PbCheckpoint, PbCheckpointFile};
use crate::NodeId;

/// What a checkpoint message is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CheckpointOp {
    /// A member or an admin client asks the scheduler for a checkpoint.
    #[default]
    Request = 1,
    /// The scheduler took the request in (`id`), or refused it (`error`).
    Accepted = 2,
    /// Scheduler to a server: write your ranges (`file[0].range`) now.
    Take = 3,
    /// Server to scheduler: the file it wrote (`file[0]`), or `error`.
    Done = 4,
    /// Scheduler to the requester: the checkpoint is complete (every file),
    /// or failed (`error`).
    Result = 5,
    /// On the scheduler's node table: the cluster checkpoints (`dir`), and
    /// the checkpoint servers restore before serving (`id`, `file`).
    Info = 6,
    /// On a worker's BARRIER request: its requests still unanswered.
    Arrival = 7,
}

impl CheckpointOp {
    /// The op with wire number `value`.
    pub fn from_i32(value: i32) -> Option<CheckpointOp> {
        Some(match value {
            1 => CheckpointOp::Request,
            2 => CheckpointOp::Accepted,
            3 => CheckpointOp::Take,
            4 => CheckpointOp::Done,
            5 => CheckpointOp::Result,
            6 => CheckpointOp::Info,
            7 => CheckpointOp::Arrival,
            _ => return None,
        })
    }
}

/// One server's file of a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointFile {
    /// Its name in the checkpoint's directory (`server-0.ckpt`).
    pub name: String,
    /// The server that wrote it.
    pub node: NodeId,
    /// Bytes.
    pub size: u64,
    /// CRC-32 of the whole file.
    pub crc: u32,
    /// The key ranges it holds.
    pub ranges: Vec<u32>,
}

/// The checkpoint part of a message (`PBMeta.checkpoint`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointMsg {
    /// What it is.
    pub op: CheckpointOp,
    /// The checkpoint (0: none).
    pub id: u64,
    /// What the requester calls it.
    pub label: String,
    /// The scheduler's `PS_CHECKPOINT_DIR`.
    pub dir: String,
    /// Files (see [`CheckpointOp`] for which).
    pub files: Vec<CheckpointFile>,
    /// Why it failed or was refused (empty: it did not).
    pub error: String,
    /// [`CheckpointOp::Arrival`]: the worker's requests still unanswered.
    pub in_flight: u64,
    /// [`CheckpointOp::Take`]: checkpoints below this id are deleted.
    pub keep_from: u64,
    /// The cluster's key ranges, `[begin, end)` each.
    pub bounds: Vec<(u64, u64)>,
    /// The range map version the ranges were planned with (0: not
    /// replicated).
    pub map_version: u64,
    /// `PS_REPLICAS`.
    pub replicas: u32,
    /// [`CheckpointOp::Result`]: milliseconds from the barrier to the
    /// manifest.
    pub elapsed_ms: u64,
    /// A member's number for its request, echoed in the answers.
    pub ticket: u64,
    /// TAKE, INFO, RESULT: the job the checkpoints belong to.
    pub job: String,
}

impl CheckpointMsg {
    /// A message of kind `op` about checkpoint `id`, nothing else set.
    pub fn new(op: CheckpointOp, id: u64) -> CheckpointMsg {
        CheckpointMsg {
            op,
            id,
            ..CheckpointMsg::default()
        }
    }

    /// The protobuf view.
    pub fn to_pb(&self) -> PbCheckpoint {
        let nz = |v: u64| (v != 0).then_some(v);
        let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
        PbCheckpoint {
            op: Some(self.op as i32),
            id: nz(self.id),
            label: text(&self.label),
            dir: text(&self.dir),
            file: self
                .files
                .iter()
                .map(|f| PbCheckpointFile {
                    name: text(&f.name),
                    node: Some(f.node),
                    size: Some(f.size),
                    crc: Some(f.crc),
                    range: f.ranges.clone(),
                })
                .collect(),
            error: text(&self.error),
            in_flight: (self.op == CheckpointOp::Arrival).then_some(self.in_flight),
            keep_from: nz(self.keep_from),
            bounds: self.bounds.iter().flat_map(|&(b, e)| [b, e]).collect(),
            map_version: nz(self.map_version),
            replicas: (self.replicas != 0).then_some(self.replicas),
            elapsed_ms: nz(self.elapsed_ms),
            ticket: nz(self.ticket),
            job: text(&self.job),
        }
    }

    /// Reads the protobuf view; `None` for an unknown op.
    pub fn from_pb(pb: PbCheckpoint) -> Option<CheckpointMsg> {
        Some(CheckpointMsg {
            op: CheckpointOp::from_i32(pb.op.unwrap_or(0))?,
            id: pb.id.unwrap_or(0),
            label: pb.label.unwrap_or_default(),
            dir: pb.dir.unwrap_or_default(),
            files: pb
                .file
                .into_iter()
                .map(|f| CheckpointFile {
                    name: f.name.unwrap_or_default(),
                    node: f.node.unwrap_or(crate::K_EMPTY),
                    size: f.size.unwrap_or(0),
                    crc: f.crc.unwrap_or(0),
                    ranges: f.range,
                })
                .collect(),
            error: pb.error.unwrap_or_default(),
            in_flight: pb.in_flight.unwrap_or(0),
            keep_from: pb.keep_from.unwrap_or(0),
            bounds: pb.bounds.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
            map_version: pb.map_version.unwrap_or(0),
            replicas: pb.replicas.unwrap_or(0),
            elapsed_ms: pb.elapsed_ms.unwrap_or(0),
            ticket: pb.ticket.unwrap_or(0),
            job: pb.job.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, Message, Meta};

    #[test]
    fn checkpoint_parts_round_trip_and_stay_off_plain_messages() {
        let mut msg = Message::control(Command::Checkpoint, 8);
        let mut ck = CheckpointMsg::new(CheckpointOp::Done, 3);
        ck.files = vec![CheckpointFile {
            name: "server-0.ckpt".into(),
            node: 8,
            size: 1234,
            crc: 0xdead_beef,
            ranges: vec![0, 1],
        }];
        ck.bounds = vec![(0, 10), (10, u64::MAX)];
        ck.map_version = 4;
        ck.replicas = 2;
        ck.job = "0123456789abcdef0123456789abcdef".into();
        msg.meta.checkpoint = Some(Box::new(ck));
        let back = Meta::decode(&msg.meta.encode()).unwrap();
        assert_eq!(back.checkpoint, msg.meta.checkpoint);
        assert_eq!(back.control.cmd, Command::Checkpoint);

        let mut arrival = CheckpointMsg::new(CheckpointOp::Arrival, 0);
        arrival.in_flight = 0;
        let mut barrier = Message::control(Command::Barrier, 1);
        barrier.meta.checkpoint = Some(Box::new(arrival));
        let back = Meta::decode(&barrier.meta.encode()).unwrap();
        assert_eq!(back.checkpoint, barrier.meta.checkpoint);

        let plain = Meta::default();
        assert_eq!(Meta::decode(&plain.encode()).unwrap().checkpoint, None);
        let mut bad = msg.meta.to_pb();
        if let Some(c) = bad.checkpoint.as_mut() {
            c.op = Some(99);
        }
        assert!(Meta::from_pb(bad).is_err(), "an unknown op is refused");
    }
}
