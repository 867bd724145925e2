//! What a node's Van needs to know: the cluster it joins, where it listens,
//! and the clocks of the control plane. [`VanConfig::default`] holds every
//! default once; `pslite_postoffice::Config` reads the environment into it.

use std::path::PathBuf;
use std::time::Duration;

use pslite_proto::Role;

use crate::address::Transport;

/// What the Van needs to know to join (or, as scheduler, to form) a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct VanConfig {
    /// This node's role.
    pub role: Role,
    /// Servers in the cluster.
    pub num_servers: i32,
    /// Servers that join and leave (`DMLC_NUM_SERVER=MIN:MAX`,
    /// pslite-only): MIN, the fewest the job forms and runs with;
    /// `num_servers` is then MAX, the number of key ranges. Turns on the
    /// range map (`crate::replica`) even with `replicas` 1. `None`: a fixed
    /// number of servers.
    pub min_servers: Option<i32>,
    /// Workers in the cluster; in elastic mode, the most at once (MAX).
    pub num_workers: i32,
    /// Elastic mode (`DMLC_NUM_WORKER=MIN:MAX`, pslite-only): worker rounds
    /// of MIN to MAX workers, with `PS_RDZV_LAST_CALL` and
    /// `PS_RDZV_TIMEOUT`. `None` (a plain number) is ps-lite's fixed job.
    pub elastic: Option<crate::rendezvous::RendezvousConfig>,
    /// The scheduler's host (`DMLC_PS_ROOT_URI`).
    pub scheduler_host: String,
    /// The scheduler's port (`DMLC_PS_ROOT_PORT`).
    pub scheduler_port: i32,
    /// The host this node advertises to the others (`DMLC_NODE_HOST`);
    /// the scheduler advertises `scheduler_host`.
    pub host: String,
    /// Where to bind the ROUTER; `None` binds the advertised host's address.
    pub bind_host: Option<String>,
    /// The ROUTER's port (`PORT`); `None` picks a free one. The scheduler
    /// always uses `scheduler_port`.
    pub port: Option<i32>,
    /// TCP, or IPC under `/tmp` (`DMLC_LOCAL=1`).
    pub transport: Transport,
    /// Send high-water mark of each DEALER (`DMLC_PS_WATER_MARK`).
    pub water_mark: Option<i32>,
    /// How long joining the cluster may take (`PS_START_TIMEOUT`).
    pub start_timeout: Duration,
    /// How often to send heartbeats (`PS_HEARTBEAT_INTERVAL`; default 1 s,
    /// `None` is off).
    pub heartbeat_interval: Option<Duration>,
    /// When a silent node counts as dead (`PS_HEARTBEAT_TIMEOUT`; default
    /// 10 s); a node that hears nothing from the scheduler for this long
    /// fails.
    pub heartbeat_timeout: Option<Duration>,
    /// The heartbeat timeout applies to every node (`PS_HEARTBEAT_TIMEOUT`
    /// was set, as in ps-lite). By default (false) it applies only to nodes
    /// that send heartbeats, and a node watches the scheduler only once it
    /// has answered one: C++ nodes that send none are never declared dead.
    pub watch_all: bool,
    /// How long a node declared dead may stay unreplaced before barriers and
    /// requests waiting for it fail (`PS_RECOVERY_TIMEOUT`).
    pub recovery_timeout: Duration,
    /// Acknowledge messages and resend unacknowledged ones after this long
    /// (`PS_RESEND=1`, `PS_RESEND_TIMEOUT`); `None` is off.
    pub resend_timeout: Option<Duration>,
    /// Resends before a message is given up on.
    pub max_resends: u32,
    /// Percentage of received messages to drop once joined (`PS_DROP_MSG`).
    pub drop_percent: u32,
    /// The largest message accepted, in bytes (`PS_MAX_MESSAGE_SIZE`;
    /// default 2 GiB - 1, the most C++ ps-lite can send, as its sizes are
    /// C `int`s); ZeroMQ drops the connection of a peer that sends a larger
    /// one. `None` is no limit.
    pub max_message_size: Option<i64>,
    /// Bytes of data messages held before this node joined, in total and
    /// per sender (`PS_HOLD_LIMIT`).
    pub hold_limit: usize,
    /// On the scheduler: the bounds of the key-value store it hosts
    /// (`PS_STORE_MAX_*`); on a node, the largest value its `Store` handle
    /// sends.
    pub store_limits: StoreLimits,
    /// The cluster's shared secret (`PS_AUTH_TOKEN`); `None` keeps ps-lite's
    /// unauthenticated wire (the driver's `auth` module).
    pub auth_token: Option<AuthToken>,
    /// Send large data frames to same-host pslite peers through shared
    /// memory (`PS_SHM`, default on; the driver's `shm` module).
    pub shm: bool,
    /// This node's host identity and process id as advertised in its
    /// node-table entry (`PBNode.host`, `pid`): filled in by
    /// the driver (`Van::start`) when `shm` is on and the host supports it;
    /// `None` advertises nothing (the entry is as C++ writes it).
    pub shm_identity: Option<(String, u32)>,
    /// Reach same-host pslite peers over an abstract Unix socket instead of
    /// loopback TCP (`PS_IPC`, default on; needs the host identity `shm`
    /// advertises, so `PS_SHM=0` turns it off too; see
    /// [`crate::address::local_endpoint`]).
    pub ipc: bool,
    /// Replicas of each key range (`PS_REPLICAS`, pslite-only; default 1,
    /// ps-lite's one copy, nothing replicated and the wire unchanged). Read
    /// by the scheduler, which hands the range map to the others.
    pub replicas: u32,
    /// Checkpoints (`PS_CHECKPOINT_DIR` and its companions; `None`: this
    /// node has no directory). On the scheduler it turns checkpoints on for
    /// the cluster; a server writes to its own directory if it has one,
    /// else to the scheduler's.
    pub checkpoint: Option<CheckpointConfig>,
}

impl Default for VanConfig {
    /// A worker of a 1 + 1 cluster around a scheduler on 127.0.0.1:9091,
    /// with ps-lite's defaults.
    fn default() -> Self {
        VanConfig {
            role: Role::Worker,
            num_servers: 1,
            min_servers: None,
            num_workers: 1,
            elastic: None,
            scheduler_host: "127.0.0.1".into(),
            scheduler_port: 9091,
            host: "127.0.0.1".into(),
            bind_host: None,
            port: None,
            transport: Transport::Tcp,
            water_mark: None,
            start_timeout: Duration::from_secs(300),
            heartbeat_interval: Some(Duration::from_secs(1)),
            heartbeat_timeout: Some(Duration::from_secs(10)),
            watch_all: false,
            recovery_timeout: Duration::from_secs(30),
            resend_timeout: None,
            max_resends: 10,
            drop_percent: 0,
            max_message_size: Some(i64::from(i32::MAX)),
            hold_limit: 256 << 20,
            store_limits: StoreLimits::default(),
            auth_token: None,
            shm: true,
            shm_identity: None,
            ipc: true,
            replicas: 1,
            checkpoint: None,
        }
    }
}

impl VanConfig {
    /// A loopback TCP config with defaults, for tests and examples.
    pub fn local(role: Role, num_servers: i32, num_workers: i32, scheduler_port: i32) -> Self {
        VanConfig {
            role,
            num_servers,
            num_workers,
            scheduler_port,
            ..VanConfig::default()
        }
    }
}

/// The shared secret of a cluster (`PS_AUTH_TOKEN`). Its `Debug` output
/// hides the value, so configurations can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(String);

impl AuthToken {
    /// A token, if `value` is usable as one: 1 to 255 bytes (PLAIN's
    /// limit), no NUL byte.
    pub fn new(value: &str) -> Option<AuthToken> {
        (!value.is_empty() && value.len() <= 255 && !value.contains('\0'))
            .then(|| AuthToken(value.to_string()))
    }

    /// Whether `offered` is this token, compared in time independent of
    /// where they differ.
    pub fn matches(&self, offered: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        if mine.len() != offered.len() {
            return false;
        }
        mine.iter()
            .zip(offered)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// The secret itself (the password of ZeroMQ's PLAIN handshake).
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(<hidden>)")
    }
}

/// Bounds on what the store holds. The scheduler reads the configurable ones
/// from `PS_STORE_MAX_*` (see `pslite_postoffice::Config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    /// The longest key, in bytes (`PS_STORE_MAX_KEY`).
    pub max_key: usize,
    /// The largest value, in bytes (`PS_STORE_MAX_VALUE`).
    pub max_value: usize,
    /// All keys and values together, in bytes (`PS_STORE_MAX_BYTES`).
    pub max_total: usize,
    /// Keys the store holds (`PS_STORE_MAX_KEYS`).
    pub max_keys: usize,
    /// Keys one request may name (CHECK, WAIT, MULTI_GET, MULTI_SET).
    pub max_keys_per_request: usize,
    /// Requests of one requester waiting at once (GET, WAIT, MULTI_GET;
    /// `PS_STORE_MAX_WAITS`).
    pub max_waits_per_node: usize,
    /// Watches of one requester (`PS_STORE_MAX_WATCHES`).
    pub max_watches_per_node: usize,
    /// Requests waiting at once, over all requesters.
    pub max_waiting: usize,
    /// Watches at once, over all requesters.
    pub max_watches: usize,
    /// The longest a request may wait, and an admin client's watch last.
    pub max_timeout: Duration,
}

impl Default for StoreLimits {
    fn default() -> StoreLimits {
        StoreLimits {
            max_key: 4096,
            max_value: DEFAULT_MAX_VALUE,
            max_total: 1 << 30,
            max_keys: 1_000_000,
            max_keys_per_request: 10_000,
            max_waits_per_node: 10_000,
            max_watches_per_node: 10_000,
            max_waiting: 100_000,
            max_watches: 100_000,
            max_timeout: Duration::from_secs(24 * 3600),
        }
    }
}

/// The default largest value: 64 MiB.
pub const DEFAULT_MAX_VALUE: usize = 64 << 20;

/// The default `PS_CHECKPOINT_TIMEOUT`: how long a checkpoint may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// The default `PS_CHECKPOINT_KEEP`: complete checkpoints kept.
pub const DEFAULT_KEEP: usize = 3;

/// How a scheduler (or a server writing its own files) checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// `PS_CHECKPOINT_DIR`.
    pub dir: PathBuf,
    /// `PS_CHECKPOINT_INTERVAL`: a checkpoint at the first qualifying
    /// barrier after each interval (`None`: on demand only).
    pub interval: Option<Duration>,
    /// `PS_CHECKPOINT_TIMEOUT`: a checkpoint not complete this long after
    /// its barrier fails; a restore not done this long after the node
    /// table fails the server.
    pub timeout: Duration,
    /// `PS_CHECKPOINT_KEEP`: complete checkpoints kept.
    pub keep: usize,
    /// `PS_CHECKPOINT_FRESH=1`: start a new job even where the directory
    /// holds checkpoints (see [`crate::checkpoint::catalog`]).
    pub fresh: bool,
}

impl CheckpointConfig {
    /// Checkpoints in `dir`, on demand only, with the default timeout and
    /// number kept.
    pub fn new(dir: impl Into<PathBuf>) -> CheckpointConfig {
        CheckpointConfig {
            dir: dir.into(),
            interval: None,
            timeout: DEFAULT_TIMEOUT,
            keep: DEFAULT_KEEP,
            fresh: false,
        }
    }
}
