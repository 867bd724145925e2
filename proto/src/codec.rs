//! Meta frame encoding and decoding, byte-compatible with C++ ps-lite.
//!
//! C++ ps-lite always writes `head`, `request`, `push`, `pull`, `simple_app`,
//! `customer_id` and `priority`; writes `app_id` and `timestamp` unless they
//! are `kEmpty`; writes `body`, `control` and `data_type` only when non-empty;
//! never writes `data_size`. In the control part it always writes `cmd` and
//! every field of each node, `barrier_group` only on BARRIER and `msg_sig`
//! only on ACK. [`Meta::encode`] follows those rules, so it reproduces C++'s
//! bytes exactly; [`Meta::decode`] reverses them and rejects, with a typed
//! error, only what cannot be interpreted (bad protobuf, unknown enum values).

use prost::Message as _;

use crate::checkpoint::CheckpointMsg;
use crate::compression::CompressionMsg;
use crate::ids::K_EMPTY;
use crate::partition::Partition;
use crate::pb::{PbControl, PbMeta, PbNode, PbShm};
use crate::refusal::Refusal;
use crate::replica::ReplicaMsg;
use crate::shm::ShmFrame;
use crate::staleness::StalenessMsg;
use crate::stats::{NodeCounters, NodeStatus};
use crate::store::StoreMsg;
use crate::{Command, Control, DataType, Meta, Node, Role};

/// Why a meta frame could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not a valid `PBMeta` protobuf.
    #[error("meta frame is not a valid PBMeta protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// `PBNode.role` is not 0, 1 or 2.
    #[error("meta frame names unknown role {0} (expected 0 server, 1 worker, 2 scheduler)")]
    UnknownRole(i32),
    /// `PBControl.cmd` is not 0..=5 nor a pslite-only command (100..=102,
    /// 110, 111).
    #[error(
        "meta frame names unknown control command {0} (expected 0..=5, 100..=102, 110 or 111)"
    )]
    UnknownCommand(i32),
    /// A `data_type` entry is not 0..=11.
    #[error("meta frame names unknown data type {0} (expected 0..=11)")]
    UnknownDataType(i32),
    /// A pslite-only store message names an unknown op or status.
    #[error("meta frame carries a store message with an unknown op or status")]
    UnknownStoreOp,
    /// A pslite-only replication message names an unknown op.
    #[error("meta frame carries a replication message with an unknown op")]
    UnknownReplicaOp,
    /// A pslite-only checkpoint message names an unknown op.
    #[error("meta frame carries a checkpoint message with an unknown op")]
    UnknownCheckpointOp,
    /// A pslite-only compressed message names an unknown compressor.
    #[error("meta frame names an unknown compressor")]
    UnknownCompression,
}

impl Meta {
    /// The meta frame C++ ps-lite would write for this meta.
    pub fn encode(&self) -> Vec<u8> {
        let pb = self.to_pb();
        let mut buf = Vec::with_capacity(pb.encoded_len() + self.shared_len());
        // Encoding into a Vec with enough capacity cannot fail.
        let _ = pb.encode(&mut buf);
        self.append_shared(&mut buf);
        buf
    }

    /// The bytes [`Meta::append_shared`] adds.
    fn shared_len(&self) -> usize {
        self.control.shared.as_ref().map_or(0, |s| {
            let len = s.encoded().len();
            1 + prost::encoding::encoded_len_varint(len as u64) + len
        })
    }

    /// The control part's shared node entries (see [`crate::SharedNodes`]),
    /// as a second `control` field after everything else: protobuf
    /// readers (prost, C++) merge it into the first, appending the entries
    /// to `node`.
    fn append_shared(&self, buf: &mut Vec<u8>) {
        if self.control.is_empty() {
            return;
        }
        if let Some(shared) = &self.control.shared {
            let bytes = shared.encoded();
            prost::encoding::encode_key(3, prost::encoding::WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(bytes.len() as u64, buf);
            buf.extend_from_slice(bytes);
        }
    }

    /// Decodes a meta frame. `sender` and `recver` are left `K_EMPTY`: they
    /// come from the transport, not from the frame.
    pub fn decode(frame: &[u8]) -> Result<Meta, DecodeError> {
        Meta::from_pb(PbMeta::decode(frame)?)
    }

    /// [`Meta::encode`] plus the pslite-only shared-memory descriptors
    /// (field 104) when `shm` is not empty; exactly [`Meta::encode`]'s bytes
    /// when it is.
    pub fn encode_with_shm(&self, shm: &[ShmFrame]) -> Vec<u8> {
        let mut pb = self.to_pb();
        if !shm.is_empty() {
            pb.shm = Some(PbShm {
                frame: shm.iter().map(|f| f.to_pb()).collect(),
            });
        }
        let mut buf = Vec::with_capacity(pb.encoded_len() + self.shared_len());
        let _ = pb.encode(&mut buf);
        self.append_shared(&mut buf);
        buf
    }

    /// [`Meta::decode`], also returning the shared-memory descriptors the
    /// frame carries (field 104; empty if none). They are not checked here:
    /// the receiver checks them against the segments it can map.
    pub fn decode_with_shm(frame: &[u8]) -> Result<(Meta, Vec<ShmFrame>), DecodeError> {
        let mut pb = PbMeta::decode(frame)?;
        let shm = pb
            .shm
            .take()
            .map(|s| s.frame.iter().map(ShmFrame::from_pb).collect())
            .unwrap_or_default();
        Ok((Meta::from_pb(pb)?, shm))
    }

    /// This meta as the generated protobuf struct, with C++'s presence rules.
    pub fn to_pb(&self) -> PbMeta {
        let control = (!self.control.is_empty()).then(|| control_to_pb(&self.control));
        PbMeta {
            head: Some(self.head),
            body: (!self.body.is_empty()).then(|| self.body.clone()),
            control,
            request: Some(self.request),
            push: Some(self.push),
            simple_app: Some(self.simple_app),
            app_id: (self.app_id != K_EMPTY).then_some(self.app_id),
            timestamp: (self.timestamp != K_EMPTY).then_some(self.timestamp),
            data_type: self.data_type.iter().map(|&t| t as i32).collect(),
            customer_id: Some(self.customer_id),
            data_size: None,
            pull: Some(self.pull),
            priority: Some(self.priority),
            counters: self.counters.as_deref().map(NodeCounters::to_pb),
            status: self.status.iter().map(NodeStatus::to_pb).collect(),
            handler_panic: self.handler_panic.as_deref().map(str::to_string),
            store: self.store.as_deref().map(StoreMsg::to_pb),
            shm: None,
            replica: self.replica.as_deref().map(ReplicaMsg::to_pb),
            checkpoint: self.checkpoint.as_deref().map(CheckpointMsg::to_pb),
            refusal: self.refusal.as_deref().map(Refusal::to_pb),
            partition: self.partition.as_deref().map(Partition::to_pb),
            compression: self.compression.as_deref().map(CompressionMsg::to_pb),
            staleness: self.staleness.as_deref().map(|s| s.to_pb()),
            same_keys: self.same_keys.then_some(true),
        }
    }

    /// Reads the generated protobuf struct, with C++'s defaults for absent fields.
    pub fn from_pb(pb: PbMeta) -> Result<Meta, DecodeError> {
        let control = match pb.control {
            Some(ctrl) => control_from_pb(ctrl)?,
            None => Control::default(),
        };
        let data_type = pb
            .data_type
            .iter()
            .map(|&t| DataType::try_from(t).map_err(|_| DecodeError::UnknownDataType(t)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Meta {
            head: pb.head.unwrap_or(0),
            body: pb.body.unwrap_or_default(),
            control,
            request: pb.request.unwrap_or(false),
            push: pb.push.unwrap_or(false),
            pull: pb.pull.unwrap_or(false),
            simple_app: pb.simple_app.unwrap_or(false),
            app_id: pb.app_id.unwrap_or(K_EMPTY),
            customer_id: pb.customer_id.unwrap_or(0),
            timestamp: pb.timestamp.unwrap_or(K_EMPTY),
            data_type,
            priority: pb.priority.unwrap_or(0),
            counters: pb.counters.map(|c| Box::new(NodeCounters::from_pb(c))),
            status: pb
                .status
                .into_iter()
                .map(NodeStatus::from_pb)
                .collect::<Result<_, _>>()?,
            handler_panic: pb.handler_panic.map(String::into_boxed_str),
            store: match pb.store {
                Some(s) => Some(Box::new(
                    StoreMsg::from_pb(s).ok_or(DecodeError::UnknownStoreOp)?,
                )),
                None => None,
            },
            replica: match pb.replica {
                Some(r) => Some(Box::new(
                    ReplicaMsg::from_pb(r).ok_or(DecodeError::UnknownReplicaOp)?,
                )),
                None => None,
            },
            checkpoint: match pb.checkpoint {
                Some(c) => Some(Box::new(
                    CheckpointMsg::from_pb(c).ok_or(DecodeError::UnknownCheckpointOp)?,
                )),
                None => None,
            },
            refusal: pb.refusal.map(|r| Box::new(Refusal::from_pb(r))),
            partition: pb.partition.map(|p| Box::new(Partition::from_pb(p))),
            compression: match pb.compression {
                Some(c) => Some(Box::new(
                    CompressionMsg::from_pb(c).ok_or(DecodeError::UnknownCompression)?,
                )),
                None => None,
            },
            staleness: pb.staleness.map(|s| Box::new(StalenessMsg::from_pb(s))),
            same_keys: pb.same_keys.unwrap_or(false),
            sender: K_EMPTY,
            recver: K_EMPTY,
            sender_key: None,
            route: None,
        })
    }
}

fn control_to_pb(ctrl: &Control) -> PbControl {
    PbControl {
        cmd: ctrl.cmd as i32,
        node: ctrl.node.iter().map(node_to_pb).collect(),
        barrier_group: (ctrl.cmd == Command::Barrier).then_some(ctrl.barrier_group),
        msg_sig: (ctrl.cmd == Command::Ack).then_some(ctrl.msg_sig),
        failed_peer: ctrl.failed_peer,
        dead_nodes: ctrl.dead_nodes.clone(),
        round: ctrl.round,
        round_members: ctrl.round_members.clone(),
        stop: ctrl.stop.clone(),
        round_base: ctrl.round_base,
        round_left: ctrl.round_left.clone(),
    }
}

fn control_from_pb(pb: PbControl) -> Result<Control, DecodeError> {
    let cmd = Command::try_from(pb.cmd).map_err(|_| DecodeError::UnknownCommand(pb.cmd))?;
    let node = pb
        .node
        .into_iter()
        .map(node_from_pb)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Control {
        cmd,
        node,
        barrier_group: pb.barrier_group.unwrap_or(0),
        msg_sig: pb.msg_sig.unwrap_or(0),
        failed_peer: pb.failed_peer,
        dead_nodes: pb.dead_nodes,
        round: pb.round,
        round_members: pb.round_members,
        stop: pb.stop,
        round_base: pb.round_base,
        round_left: pb.round_left,
        shared: None,
    })
}

/// `nodes` as `PBControl.node` fields (see [`crate::SharedNodes`]).
pub(crate) fn encode_nodes(nodes: &[Node]) -> Vec<u8> {
    let pbs: Vec<PbNode> = nodes.iter().map(node_to_pb).collect();
    let len = pbs
        .iter()
        .map(|pb| prost::encoding::message::encoded_len(2, pb))
        .sum();
    let mut buf = Vec::with_capacity(len);
    for pb in &pbs {
        prost::encoding::message::encode(2, pb, &mut buf);
    }
    buf
}

pub(crate) fn node_to_pb(node: &Node) -> PbNode {
    PbNode {
        role: node.role as i32,
        id: Some(node.id),
        hostname: Some(node.hostname.clone()),
        port: Some(node.port),
        is_recovery: Some(node.is_recovery),
        customer_id: Some(node.customer_id),
        pslite: node.pslite.then_some(true),
        host: (!node.host.is_empty()).then(|| node.host.clone()),
        pid: (node.pid != 0).then_some(node.pid),
        key: (node.key != 0).then_some(node.key),
        features: (node.features != 0).then_some(node.features),
    }
}

pub(crate) fn node_from_pb(pb: PbNode) -> Result<Node, DecodeError> {
    Ok(Node {
        role: Role::try_from(pb.role).map_err(|_| DecodeError::UnknownRole(pb.role))?,
        id: pb.id.unwrap_or(K_EMPTY),
        hostname: pb.hostname.unwrap_or_default(),
        port: pb.port.unwrap_or(0),
        is_recovery: pb.is_recovery.unwrap_or(false),
        customer_id: pb.customer_id.unwrap_or(0),
        pslite: pb.pslite.unwrap_or(false),
        host: pb.host.unwrap_or_default(),
        pid: pb.pid.unwrap_or(0),
        key: pb.key.unwrap_or(0),
        features: pb.features.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests;
