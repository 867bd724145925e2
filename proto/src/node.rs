//! Roles and nodes: who is in the cluster and where to reach them.

use std::fmt;
use std::str::FromStr;

use crate::ids::{NodeId, K_EMPTY};

/// The role of a node, with ps-lite's wire numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Holds a range of the key space and answers pushes and pulls.
    Server = 0,
    /// Pushes and pulls.
    Worker = 1,
    /// Assigns ids, runs barriers, watches heartbeats.
    Scheduler = 2,
}

impl Role {
    /// The role with wire number `value`.
    pub fn from_i32(value: i32) -> Option<Role> {
        match value {
            0 => Some(Role::Server),
            1 => Some(Role::Worker),
            2 => Some(Role::Scheduler),
            _ => None,
        }
    }

    /// The lower-case name ps-lite uses in `DMLC_ROLE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Worker => "worker",
            Role::Scheduler => "scheduler",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `DMLC_ROLE` value that is not `scheduler`, `server` or `worker`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}: expected scheduler, server or worker")]
pub struct ParseRoleError(pub String);

impl FromStr for Role {
    type Err = ParseRoleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "server" => Ok(Role::Server),
            "worker" => Ok(Role::Worker),
            "scheduler" => Ok(Role::Scheduler),
            _ => Err(ParseRoleError(s.to_string())),
        }
    }
}

/// One entry of the cluster table (`PBNode`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The node's role.
    pub role: Role,
    /// Its id, or [`K_EMPTY`] before the scheduler assigned one.
    pub id: NodeId,
    /// The host other nodes connect to (an IP address or a resolvable name).
    pub hostname: String,
    /// The port of its ROUTER socket.
    pub port: i32,
    /// Set by the scheduler when this node replaced a dead one.
    pub is_recovery: bool,
    /// Which customer of the process registered this entry.
    pub customer_id: i32,
    /// pslite-only (field 100): the entry is a pslite node's, so it
    /// understands pslite-only control fields. C++ schedulers drop it.
    pub pslite: bool,
    /// pslite-only (field 101): the node's host identity, set when it may
    /// use shared memory with same-host peers (`PS_SHM`); empty otherwise.
    pub host: String,
    /// pslite-only (field 102): the node's process id, with `host`; 0 if
    /// not sent.
    pub pid: u32,
    /// pslite-only (field 103): the random key the node's process presents
    /// in its ZeroMQ identity to pslite peers (`ps<id>/<key>`); 0 if none.
    pub key: u64,
    /// pslite-only (field 130): what the node can receive beyond ps-lite's
    /// messages ([`FEATURE_PARTITION`], [`FEATURE_COMPRESSION`],
    /// [`FEATURE_STALENESS`]); 0 for C++
    /// nodes and under a C++ scheduler.
    pub features: u32,
}

/// [`Node::features`]: the node reassembles messages cut into parts
/// (`PBMeta.partition`).
pub const FEATURE_PARTITION: u32 = 1;
/// [`Node::features`]: the node reads compressed values
/// (`PBMeta.compression`).
pub const FEATURE_COMPRESSION: u32 = 2;
/// [`Node::features`]: the node reads a worker's clock and holds pulls to
/// its bound (`PBMeta.staleness`).
pub const FEATURE_STALENESS: u32 = 4;

impl Node {
    /// A node that has no id yet.
    pub fn new(role: Role, hostname: impl Into<String>, port: i32) -> Node {
        Node {
            role,
            id: K_EMPTY,
            hostname: hostname.into(),
            port,
            is_recovery: false,
            customer_id: 0,
            pslite: false,
            host: String::new(),
            pid: 0,
            key: 0,
            features: 0,
        }
    }

    /// `hostname:port`, the key ps-lite uses to recognise a process.
    pub fn address(&self) -> String {
        format!("{}:{}", self.hostname, self.port)
    }

    /// Whether `other` is the same process (same hostname and port).
    pub fn same_process(&self, other: &Node) -> bool {
        self.hostname == other.hostname && self.port == other.port
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.id == K_EMPTY {
            write!(f, "{} at {}", self.role, self.address())?;
        } else {
            write!(f, "{} {} at {}", self.role, self.id, self.address())?;
        }
        if self.is_recovery {
            f.write_str(" (recovered)")?;
        }
        Ok(())
    }
}
