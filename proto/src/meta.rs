//! The meta of a message: what it is, who it is for, and how to read its data.

use bytes::Bytes;

use crate::checkpoint::CheckpointMsg;
use crate::compression::CompressionMsg;
use crate::ids::{NodeId, K_EMPTY};
use crate::partition::Partition;
use crate::refusal::Refusal;
use crate::replica::ReplicaMsg;
use crate::staleness::StalenessMsg;
use crate::stats::{NodeCounters, NodeStatus};
use crate::store::StoreMsg;
use crate::Node;

/// The control command of a message; [`Command::Empty`] marks a data message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Command {
    /// Not a control message.
    #[default]
    Empty = 0,
    /// Stop the receive loop (a node sends it to itself).
    Terminate = 1,
    /// Register with the scheduler / the scheduler's node table.
    AddNode = 2,
    /// Barrier request (to the scheduler) or release (from it).
    Barrier = 3,
    /// Acknowledges a message by signature (resender).
    Ack = 4,
    /// Liveness report to the scheduler, and its answer.
    Heartbeat = 5,
    /// pslite-only: an admin client asks the scheduler for the node table
    /// and every node's counters (request), and gets them (response, in
    /// [`Meta::status`]). Never sent to a peer not known to be pslite.
    Status = 100,
    /// pslite-only: a request to the key-value store the scheduler hosts,
    /// its answer, or a watch event (in [`Meta::store`]). Never sent to a
    /// peer not known to be pslite.
    Store = 101,
    /// pslite-only, elastic mode only: a worker leaves the job (its round
    /// ends). Never sent to a peer not known to be pslite.
    Leave = 102,
    /// pslite-only, replicated key ranges only: the control messages of
    /// replication (the range map, sync, state copies; [`Meta::replica`]).
    Replica = 110,
    /// pslite-only, checkpointing clusters only: checkpoint requests,
    /// orders, reports and answers ([`Meta::checkpoint`]).
    Checkpoint = 111,
}

impl Command {
    /// The command with wire number `value`.
    pub fn from_i32(value: i32) -> Option<Command> {
        Some(match value {
            0 => Command::Empty,
            1 => Command::Terminate,
            2 => Command::AddNode,
            3 => Command::Barrier,
            4 => Command::Ack,
            5 => Command::Heartbeat,
            100 => Command::Status,
            101 => Command::Store,
            102 => Command::Leave,
            110 => Command::Replica,
            111 => Command::Checkpoint,
            _ => return None,
        })
    }
}

/// The control part of a meta (`PBControl`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Control {
    /// What to do; `Empty` for data messages.
    pub cmd: Command,
    /// Nodes carried by ADD_NODE and HEARTBEAT.
    pub node: Vec<Node>,
    /// The group of a BARRIER (1..=7). Replies from a C++ scheduler carry
    /// garbage here, so receivers must not trust it.
    pub barrier_group: i32,
    /// The signature an ACK acknowledges.
    pub msg_sig: u64,
    /// pslite-only (field 100): on a BARRIER reply, the barrier failed
    /// because this node died and nothing replaced it.
    pub failed_peer: Option<NodeId>,
    /// pslite-only (field 101): on a scheduler's HEARTBEAT, the nodes it
    /// holds dead.
    pub dead_nodes: Vec<NodeId>,
    /// pslite-only (field 102), elastic mode only: on the scheduler's
    /// ADD_NODE, the elastic round the table describes.
    pub round: Option<u64>,
    /// pslite-only (field 103), elastic mode only: with `round`, the round's
    /// workers in rank order.
    pub round_members: Vec<NodeId>,
    /// pslite-only (field 104): on a LEAVE from the scheduler, the job
    /// stops, and why.
    pub stop: Option<String>,
    /// pslite-only (field 105), elastic mode only: with `round`, the table
    /// is a change of round `round_base`: `round_members` the workers that
    /// joined (ranked after the others), `round_left` those gone, `node`
    /// the joiners' entries. On a member's ADD_NODE: it asks for the whole
    /// table (it holds round `round_base`).
    pub round_base: Option<u64>,
    /// pslite-only (field 106), elastic mode only: see `round_base`.
    pub round_left: Vec<NodeId>,
    /// More entries of `node`, shared between messages and encoded once
    /// (see [`SharedNodes`]): written after `node`, read back into `node`.
    /// Only a sender sets it; a decoded control part has `None`.
    pub shared: Option<SharedNodes>,
}

/// Node entries one sender puts in many messages (the scheduler's node
/// table, to every pslite process): held once, encoded once (the first
/// time a message carrying them is encoded), the same bytes copied into
/// each frame, where each message would otherwise hold and encode a copy.
/// On the wire they are a second `control` field (3) holding only `node`
/// entries (2), after the first: protobuf merges the two, so a reader
/// finds them at the end of `node`.
#[derive(Clone, Debug)]
pub struct SharedNodes(std::sync::Arc<SharedInner>);

#[derive(Debug)]
struct SharedInner {
    nodes: Vec<Node>,
    encoded: std::sync::OnceLock<Vec<u8>>,
}

impl SharedNodes {
    /// Shares `nodes`.
    pub fn new(nodes: Vec<Node>) -> SharedNodes {
        SharedNodes(std::sync::Arc::new(SharedInner {
            nodes,
            encoded: std::sync::OnceLock::new(),
        }))
    }

    /// The entries.
    pub fn nodes(&self) -> &[Node] {
        &self.0.nodes
    }

    /// The entries as `PBControl.node` fields (each tag, length and
    /// `PBNode`), encoded on first use.
    pub(crate) fn encoded(&self) -> &[u8] {
        self.0
            .encoded
            .get_or_init(|| crate::codec::encode_nodes(&self.0.nodes))
    }
}

impl PartialEq for SharedNodes {
    fn eq(&self, other: &SharedNodes) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.nodes == other.0.nodes
    }
}

impl Eq for SharedNodes {}

impl Control {
    /// A control part with command `cmd` and nothing else.
    pub fn new(cmd: Command) -> Control {
        Control {
            cmd,
            ..Control::default()
        }
    }

    /// Whether this is a data message (no control command).
    pub fn is_empty(&self) -> bool {
        self.cmd == Command::Empty
    }

    /// Every node entry: `node`, then the shared ones.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.node
            .iter()
            .chain(self.shared.iter().flat_map(SharedNodes::nodes))
    }

    /// How many node entries it carries, shared ones included.
    pub fn node_count(&self) -> usize {
        self.node.len() + self.shared.as_ref().map_or(0, |s| s.nodes().len())
    }
}

/// The element type of a data frame (`PBMeta.data_type`, one per frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `char`.
    Char = 0,
    /// `int8_t`.
    Int8 = 1,
    /// `int16_t`.
    Int16 = 2,
    /// `int32_t`.
    Int32 = 3,
    /// `int64_t`.
    Int64 = 4,
    /// `uint8_t`.
    UInt8 = 5,
    /// `uint16_t`.
    UInt16 = 6,
    /// `uint32_t`.
    UInt32 = 7,
    /// `uint64_t` (keys).
    UInt64 = 8,
    /// `float`.
    Float = 9,
    /// `double`.
    Double = 10,
    /// Anything else; C++ `KVWorker<char>` (MXNet) types its values this way.
    Other = 11,
}

impl DataType {
    /// The data type with wire number `value`.
    pub fn from_i32(value: i32) -> Option<DataType> {
        Some(match value {
            0 => DataType::Char,
            1 => DataType::Int8,
            2 => DataType::Int16,
            3 => DataType::Int32,
            4 => DataType::Int64,
            5 => DataType::UInt8,
            6 => DataType::UInt16,
            7 => DataType::UInt32,
            8 => DataType::UInt64,
            9 => DataType::Float,
            10 => DataType::Double,
            11 => DataType::Other,
            _ => return None,
        })
    }

    /// Its name as NumPy calls the element type (`float32`, `uint64`);
    /// `char` and `raw bytes` for the two C++ types NumPy has no name for.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Char => "char",
            DataType::Int8 => "int8",
            DataType::Int16 => "int16",
            DataType::Int32 => "int32",
            DataType::Int64 => "int64",
            DataType::UInt8 => "uint8",
            DataType::UInt16 => "uint16",
            DataType::UInt32 => "uint32",
            DataType::UInt64 => "uint64",
            DataType::Float => "float32",
            DataType::Double => "float64",
            DataType::Other => "raw bytes",
        }
    }

    /// Bytes per element (1 for `Char`, `Other`).
    pub fn size(self) -> usize {
        match self {
            DataType::Char | DataType::Int8 | DataType::UInt8 | DataType::Other => 1,
            DataType::Int16 | DataType::UInt16 => 2,
            DataType::Int32 | DataType::UInt32 | DataType::Float => 4,
            DataType::Int64 | DataType::UInt64 | DataType::Double => 8,
        }
    }
}

/// Everything about a message but its data frames (`PBMeta`, plus the sender
/// and receiver ids that travel in ZeroMQ identities rather than in the meta).
///
/// The defaults are C++ ps-lite's: ids, head, app id, customer id and
/// timestamp are [`K_EMPTY`]; flags are false; priority is 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The app's command (SimpleApp head, KV `cmd`); `K_EMPTY` on control messages.
    pub head: i32,
    /// SimpleApp body; empty when absent.
    pub body: Bytes,
    /// Control command and its arguments; empty for data messages.
    pub control: Control,
    /// Request (true) or response (false).
    pub request: bool,
    /// A KV push.
    pub push: bool,
    /// A KV pull.
    pub pull: bool,
    /// A SimpleApp message.
    pub simple_app: bool,
    /// Which app the message is for.
    pub app_id: i32,
    /// Which customer (on a worker) the message is for or from.
    pub customer_id: i32,
    /// Pairs a response with its request.
    pub timestamp: i32,
    /// One entry per data frame.
    pub data_type: Vec<DataType>,
    /// Scheduling priority: what a node sends to a peer goes higher first,
    /// first come first served among equals (see `pslite_van::schedule`).
    pub priority: i32,
    /// pslite-only (field 100): the sender's counters, on a HEARTBEAT.
    pub counters: Option<Box<NodeCounters>>,
    /// pslite-only (field 101): the scheduler's status table, answering STATUS.
    pub status: Vec<NodeStatus>,
    /// pslite-only (field 102): on a response, the request failed because
    /// the responder's handler panicked, with this message.
    pub handler_panic: Option<Box<str>>,
    /// pslite-only (field 103): on a STORE message, the store request, its
    /// answer or a watch event.
    pub store: Option<Box<StoreMsg>>,
    /// pslite-only (field 110): replicated key ranges (the map, a request's
    /// range and id, messages between replicas).
    pub replica: Option<Box<ReplicaMsg>>,
    /// pslite-only (field 111): checkpoints (a request and its answers, an
    /// order to write one, a report, the restore plan, a worker's requests
    /// in flight on its BARRIER).
    pub checkpoint: Option<Box<CheckpointMsg>>,
    /// pslite-only (field 120): on a response, the responder refused the
    /// request (nothing of it was applied), and why.
    pub refusal: Option<Box<Refusal>>,
    /// pslite-only (field 130): which part of a data message cut into
    /// parts this is (priority scheduling, `PS_PARTITION_BYTES`).
    pub partition: Option<Box<Partition>>,
    /// pslite-only (field 131): how the values are compressed, or are to
    /// be in the answer.
    pub compression: Option<Box<CompressionMsg>>,
    /// pslite-only (field 140): bounded staleness, the sending worker's
    /// clock (and a pull's bound), or a tick.
    pub staleness: Option<Box<StalenessMsg>>,
    /// pslite-only (field 150): on a pull request, the answer may leave out
    /// its keys when they are exactly the request's; on the answer, they
    /// were left out (its keys frame is empty).
    pub same_keys: bool,
    /// The sender's node id (from its ZeroMQ identity; not in the meta frame).
    pub sender: NodeId,
    /// The receiver's node id (selects the socket; not in the meta frame).
    pub recver: NodeId,
    /// The key the sender's ZeroMQ identity carried (`ps<id>/<key>`, between
    /// pslite nodes whose table entries both carry a key), if any; from the
    /// transport, not in the meta frame. The receiver checks it against the
    /// sender's node-table entry.
    pub sender_key: Option<u64>,
    /// For a sender with no `ps<id>` identity (an admin client): the
    /// routing id ZeroMQ generated for its connection, on which an answer
    /// goes back; from the transport, not in the meta frame.
    pub route: Option<Bytes>,
}

impl Default for Meta {
    fn default() -> Meta {
        Meta {
            head: K_EMPTY,
            body: Bytes::new(),
            control: Control::default(),
            request: false,
            push: false,
            pull: false,
            simple_app: false,
            app_id: K_EMPTY,
            customer_id: K_EMPTY,
            timestamp: K_EMPTY,
            data_type: Vec::new(),
            priority: 0,
            counters: None,
            status: Vec::new(),
            handler_panic: None,
            store: None,
            replica: None,
            checkpoint: None,
            refusal: None,
            partition: None,
            compression: None,
            staleness: None,
            same_keys: false,
            sender: K_EMPTY,
            recver: K_EMPTY,
            sender_key: None,
            route: None,
        }
    }
}
