//! Node configuration: the `DMLC_*` / `PS_*` environment variables ps-lite
//! users already set, parsed with errors that name the variable and the fix.
//! Every numeric variable follows one rule ([`NUMERIC_VARIABLES`],
//! [`parse_numeric`]): a whole number in its range.

use std::time::Duration;

use pslite_proto::Role;
use pslite_van::checkpoint::CheckpointConfig;
use pslite_van::rendezvous::RendezvousConfig;
use pslite_van::store::StoreLimits;
use pslite_van::{resolve, AuthToken, Transport, VanConfig};

/// A configuration value that is missing or unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is not set.
    #[error("{var} is not set: {hint}")]
    Missing {
        /// The variable.
        var: &'static str,
        /// What to set it to.
        hint: &'static str,
    },
    /// A variable is set to something unusable.
    #[error("{var} must be {expected}, got {value:?}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A numeric variable is not a whole number within its range (the one
    /// rule every numeric variable follows, see [`NUMERIC_VARIABLES`]).
    #[error("{var} must be {range}, got {value:?}")]
    OutOfRange {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The values it may take.
        range: Numeric,
    },
    /// A host name that does not resolve.
    #[error(
        "{var} {value:?} does not resolve to an IP address: use an IP or a resolvable host name"
    )]
    Unresolvable {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// `DMLC_INTERFACE` names no interface with an IPv4 address.
    #[error(
        "DMLC_INTERFACE {0:?} is not a network interface with an IPv4 address (try lo or eth0)"
    )]
    Interface(String),
}

/// Everything a node needs to join a cluster.
///
/// Build it from the environment with [`Config::from_env`], or in code with
/// [`Config::new`] and the public fields. The defaults live once, in
/// [`VanConfig::default`].
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The transport and control plane: `DMLC_ROLE`, `DMLC_NUM_SERVER`,
    /// `DMLC_NUM_WORKER`, `DMLC_PS_ROOT_URI`/`_PORT`, `DMLC_NODE_HOST` (else
    /// the address of `DMLC_INTERFACE`, else 127.0.0.1 when the scheduler
    /// is on loopback, else this machine's first non-loopback IPv4
    /// address), `PS_BIND_HOST`, `PORT`, `DMLC_LOCAL`, `DMLC_PS_WATER_MARK`,
    /// `PS_START_TIMEOUT`, `PS_HEARTBEAT_INTERVAL`/`_TIMEOUT`,
    /// `PS_RECOVERY_TIMEOUT`, `PS_RESEND`/`_TIMEOUT`, `PS_DROP_MSG`,
    /// `PS_MAX_MESSAGE_SIZE`, `PS_HOLD_LIMIT`, `PS_PARTITION_BYTES`, `PS_SHM`, `PS_IPC`, `PS_STORE_MAX_KEY`/
    /// `_VALUE`/`_BYTES`/`_KEYS`/`_WAITS`/`_WATCHES`.
    pub van: VanConfig,
    /// `PS_VERBOSE`: 0 quiet, 1 connections, 2 every message (3, which
    /// ps-lite scripts set, is stored as 2; more is refused).
    pub verbose: u8,
    /// `PS_QUEUE_LIMIT`: data messages a customer's queue holds; when it is
    /// full the node stops reading until the customer has taken half
    /// (back-pressure).
    pub queue_limit: usize,
    /// `PS_METRICS_PORT`: serve the counters in Prometheus' text format over
    /// HTTP on this port (the next free one if another node of this machine
    /// has it; 0 = any free port); `None` (the default) is off.
    pub metrics_port: Option<u16>,
    /// `PS_REQUEST_WARN`: a request that has had no answer for this long
    /// is logged as a warning naming the nodes that owe one, and again each
    /// time its wait doubles.
    pub request_warn: Duration,
    /// `PS_SERVER_THREADS`: threads a server runs a concurrent request
    /// handle on (`KVServer::set_concurrent_request_handle`, the sum store
    /// `DefaultHandle`): requests on disjoint keys in parallel, on the same
    /// key in arrival order. Default 1 (the app's thread).
    pub server_threads: usize,
    /// `PS_APP_WAIT` (milliseconds): how long a request for an app (a
    /// customer) this node does not have waits for it to be created; then
    /// it is refused, and the requester's wait fails saying so (C++
    /// ps-lite waits 5 s, then aborts the node).
    pub app_wait: Duration,
    /// `PS_STALENESS` (workers): bounded staleness `s` (see
    /// `KVWorker::clock`); unset: asynchronous, no bound.
    pub staleness: Option<u64>,
    /// `PS_MALLOC_TUNE` (default on for servers and workers, off for the
    /// scheduler): keep large message buffers in the heap for reuse (glibc's
    /// mmap and trim thresholds raised, once per process; see
    /// `pslite_van::heap`); `0` leaves malloc as it is.
    pub malloc_tune: bool,
}

/// The most `PS_SERVER_THREADS`.
pub const MAX_SERVER_THREADS: u64 = 256;

/// The default `PS_QUEUE_LIMIT`.
pub const DEFAULT_QUEUE_LIMIT: usize = 100_000;

/// The default `PS_APP_WAIT`, in milliseconds.
pub const DEFAULT_APP_WAIT_MS: u64 = 5_000;

/// The default `PS_REQUEST_WARN`, in seconds.
pub const DEFAULT_REQUEST_WARN_SECS: u64 = 30;

/// Default `PS_RDZV_LAST_CALL`: how long the first elastic round waits for
/// more workers once it has MIN, in seconds.
pub const DEFAULT_RDZV_LAST_CALL_SECS: u64 = 1;

/// Default `PS_RDZV_TIMEOUT`: how long an elastic job may stay below MIN
/// workers before it fails, in seconds.
pub const DEFAULT_RDZV_TIMEOUT_SECS: u64 = 120;

/// The default `PS_RESEND_TIMEOUT`, in milliseconds.
const DEFAULT_RESEND_TIMEOUT_MS: u64 = 1000;

/// What a number counts, for parsing (bytes take K, M or G) and messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A plain count (nodes, messages, keys, a level).
    Count,
    /// Seconds.
    Seconds,
    /// Milliseconds.
    Milliseconds,
    /// Bytes, optionally with a K, M or G suffix (KiB, MiB, GiB).
    Bytes,
    /// A percentage.
    Percent,
    /// A TCP port.
    Port,
}

/// The values a numeric variable may take: whole numbers from `min` to
/// `max` (inclusive) of a [`Unit`], with a note on what special values
/// mean. Every numeric `DMLC_*`/`PS_*` variable is read with
/// [`Numeric::parse`], so all of them follow one rule and fail with one
/// kind of message: `PS_VERBOSE must be a level from 0 to 3 (...), got "9"`.
///
/// ```
/// use pslite_postoffice::config::{Numeric, Unit};
///
/// const WARN_AFTER: Numeric = Numeric::new(Unit::Seconds, 0, 86_400).note("0 = never");
/// assert_eq!(WARN_AFTER.parse("MY_WARN", " 30 "), Ok(30));
/// assert_eq!(
///     WARN_AFTER.parse("MY_WARN", "99999").unwrap_err().to_string(),
///     "MY_WARN must be a whole number of seconds from 0 to 86400 (0 = never), got \"99999\""
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numeric {
    /// What the number counts.
    pub unit: Unit,
    /// The smallest value allowed.
    pub min: u64,
    /// The largest value allowed.
    pub max: u64,
    /// What special values mean (`"0 = off"`), or `""`.
    pub note: &'static str,
}

impl Numeric {
    /// Whole numbers of `unit` from `min` to `max`.
    pub const fn new(unit: Unit, min: u64, max: u64) -> Numeric {
        Numeric {
            unit,
            min,
            max,
            note: "",
        }
    }

    /// The same range, with a note on what special values mean.
    pub const fn note(self, note: &'static str) -> Numeric {
        Numeric { note, ..self }
    }

    /// `value` (surrounding blanks ignored) as a number in this range, or
    /// an error naming `var`, the range and the value.
    pub fn parse(&self, var: &'static str, value: &str) -> Result<u64, ConfigError> {
        let number = match self.unit {
            Unit::Bytes => parse_bytes(value),
            _ => value.trim().parse::<u64>().ok(),
        };
        number
            .filter(|n| (self.min..=self.max).contains(n))
            .ok_or_else(|| ConfigError::OutOfRange {
                var,
                value: value.to_string(),
                range: *self,
            })
    }
}

impl std::fmt::Display for Numeric {
    /// `a whole number of seconds from 0 to 604800 (0 = off)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, min, max) = match self.unit {
            Unit::Count => ("a whole number".to_string(), self.min, self.max),
            Unit::Seconds => ("a whole number of seconds".to_string(), self.min, self.max),
            Unit::Milliseconds => (
                "a whole number of milliseconds".to_string(),
                self.min,
                self.max,
            ),
            Unit::Percent => ("a percentage".to_string(), self.min, self.max),
            Unit::Port => ("a port number".to_string(), self.min, self.max),
            Unit::Bytes => {
                return write!(
                    f,
                    "a number of bytes from {} to {}, optionally with K, M or G (KiB, MiB, \
                     GiB){}",
                    bytes_text(self.min),
                    bytes_text(self.max),
                    if self.note.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", self.note)
                    }
                );
            }
        };
        write!(f, "{what} from {min} to {max}")?;
        if !self.note.is_empty() {
            write!(f, " ({})", self.note)?;
        }
        Ok(())
    }
}

/// `n` bytes with the largest suffix that divides it (`64M`, `1024G`).
fn bytes_text(n: u64) -> String {
    match n {
        0 => "0".into(),
        n if n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// The most servers, or workers, a cluster may have (node ids are 32-bit:
/// this is far below where they run out).
pub const MAX_NODES_PER_ROLE: u64 = 1_000_000;
/// The longest time any `*_TIMEOUT`/`*_INTERVAL` variable takes: a week.
const MAX_SECONDS: u64 = 7 * 86_400;
/// The most any count of messages, keys or requests takes.
const MAX_COUNT: u64 = 1_000_000_000;
/// The largest size any byte variable takes: 1 TiB.
const MAX_BYTES: u64 = 1 << 40;

/// Every numeric variable [`Config`] reads and the values it may take. One
/// rule for all: a whole number in the range (bytes with an optional K, M
/// or G), anything else fails naming the variable and the range.
/// `DMLC_NUM_WORKER` and `DMLC_NUM_SERVER` also take `MIN:MAX` (elastic
/// workers, elastic servers), each in its range.
pub const NUMERIC_VARIABLES: &[(&str, Numeric)] = &[
    (
        "DMLC_NUM_SERVER",
        Numeric::new(Unit::Count, 1, MAX_NODES_PER_ROLE)
            .note("or MIN:MAX for servers that join and leave, MIN <= MAX"),
    ),
    (
        "DMLC_NUM_WORKER",
        Numeric::new(Unit::Count, 1, MAX_NODES_PER_ROLE)
            .note("or MIN:MAX for elastic workers, MIN <= MAX"),
    ),
    ("DMLC_PS_ROOT_PORT", Numeric::new(Unit::Port, 1, 65_535)),
    ("PORT", Numeric::new(Unit::Port, 1, 65_535)),
    (
        "PS_METRICS_PORT",
        Numeric::new(Unit::Port, 0, 65_535).note("0 = any free port"),
    ),
    (
        "PS_VERBOSE",
        Numeric::new(Unit::Count, 0, 3)
            .note("0 warnings, 1 connections, 2 every message; 3, which ps-lite scripts set, is 2"),
    ),
    (
        "PS_START_TIMEOUT",
        Numeric::new(Unit::Seconds, 1, MAX_SECONDS),
    ),
    (
        "PS_HEARTBEAT_INTERVAL",
        Numeric::new(Unit::Seconds, 0, MAX_SECONDS).note("0 = no heartbeats"),
    ),
    (
        "PS_HEARTBEAT_TIMEOUT",
        Numeric::new(Unit::Seconds, 0, MAX_SECONDS).note("0 = nobody is declared dead"),
    ),
    (
        "PS_RECOVERY_TIMEOUT",
        Numeric::new(Unit::Seconds, 1, MAX_SECONDS),
    ),
    (
        "PS_RDZV_LAST_CALL",
        Numeric::new(Unit::Seconds, 0, MAX_SECONDS),
    ),
    (
        "PS_RDZV_TIMEOUT",
        Numeric::new(Unit::Seconds, 1, MAX_SECONDS),
    ),
    (
        "PS_RESEND_TIMEOUT",
        Numeric::new(Unit::Milliseconds, 1, 3_600_000),
    ),
    ("PS_DROP_MSG", Numeric::new(Unit::Percent, 0, 100)),
    (
        "PS_REPLICAS",
        Numeric::new(Unit::Count, 1, 64).note("copies of each key range, at most DMLC_NUM_SERVER"),
    ),
    (
        "DMLC_PS_WATER_MARK",
        Numeric::new(Unit::Count, 1, MAX_COUNT),
    ),
    ("PS_QUEUE_LIMIT", Numeric::new(Unit::Count, 1, MAX_COUNT)),
    ("PS_STALENESS", Numeric::new(Unit::Count, 0, MAX_COUNT)),
    (
        "PS_SERVER_THREADS",
        Numeric::new(Unit::Count, 1, MAX_SERVER_THREADS),
    ),
    (
        "PS_APP_WAIT",
        Numeric::new(Unit::Milliseconds, 0, 3_600_000).note("0 = refuse at once"),
    ),
    (
        "PS_REQUEST_WARN",
        Numeric::new(Unit::Seconds, 1, MAX_SECONDS),
    ),
    (
        "PS_MAX_MESSAGE_SIZE",
        Numeric::new(Unit::Bytes, 1, MAX_BYTES),
    ),
    ("PS_HOLD_LIMIT", Numeric::new(Unit::Bytes, 1, MAX_BYTES)),
    (
        "PS_PARTITION_BYTES",
        Numeric::new(Unit::Bytes, 0, 1 << 30).note("0 = off; otherwise at least 4K"),
    ),
    ("PS_STORE_MAX_KEY", Numeric::new(Unit::Bytes, 1, 1 << 20)),
    (
        "PS_STORE_MAX_VALUE",
        // A value travels in one message: ps-lite's sizes are C ints.
        Numeric::new(Unit::Bytes, 1, i32::MAX as u64),
    ),
    (
        "PS_STORE_MAX_BYTES",
        Numeric::new(Unit::Bytes, 1, MAX_BYTES),
    ),
    ("PS_STORE_MAX_KEYS", Numeric::new(Unit::Count, 1, MAX_COUNT)),
    (
        "PS_STORE_MAX_WAITS",
        Numeric::new(Unit::Count, 1, MAX_COUNT),
    ),
    (
        "PS_STORE_MAX_WATCHES",
        Numeric::new(Unit::Count, 1, MAX_COUNT),
    ),
    (
        "PS_CHECKPOINT_INTERVAL",
        Numeric::new(Unit::Seconds, 1, MAX_SECONDS).note("needs PS_CHECKPOINT_DIR"),
    ),
    (
        "PS_CHECKPOINT_TIMEOUT",
        Numeric::new(Unit::Seconds, 1, MAX_SECONDS),
    ),
    ("PS_CHECKPOINT_KEEP", Numeric::new(Unit::Count, 1, 1_000)),
];

/// `DMLC_NUM_WORKER` or `DMLC_NUM_SERVER`: a fixed number, or `MIN:MAX`
/// (elastic workers; servers that join and leave a running job).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeCount {
    /// ps-lite's fixed number of nodes.
    Fixed(u64),
    /// From MIN to MAX nodes.
    Elastic {
        /// Fewest nodes the job runs with.
        min: u64,
        /// Most nodes at once.
        max: u64,
    },
}

impl NodeCount {
    /// The most nodes at once.
    pub fn max(self) -> u64 {
        match self {
            NodeCount::Fixed(n) => n,
            NodeCount::Elastic { max, .. } => max,
        }
    }
}

/// Reads a `DMLC_NUM_WORKER` value: a number in its range, or `MIN:MAX`
/// with both in it and `MIN <= MAX`.
pub fn parse_num_workers(value: &str) -> Result<NodeCount, ConfigError> {
    parse_node_count("DMLC_NUM_WORKER", value)
}

/// Reads a `DMLC_NUM_SERVER` value, as [`parse_num_workers`] does.
pub fn parse_num_servers(value: &str) -> Result<NodeCount, ConfigError> {
    parse_node_count("DMLC_NUM_SERVER", value)
}

fn parse_node_count(var: &'static str, value: &str) -> Result<NodeCount, ConfigError> {
    let bad = || ConfigError::OutOfRange {
        var,
        value: value.to_string(),
        range: numeric(var).unwrap_or(Numeric::new(Unit::Count, 1, MAX_NODES_PER_ROLE)),
    };
    let Some((min, max)) = value.split_once(':') else {
        return Ok(NodeCount::Fixed(
            parse_numeric(var, value).map_err(|_| bad())?,
        ));
    };
    let min = parse_numeric(var, min).map_err(|_| bad())?;
    let max = parse_numeric(var, max).map_err(|_| bad())?;
    if min > max {
        return Err(bad());
    }
    Ok(NodeCount::Elastic { min, max })
}

/// The range of numeric variable `var` (see [`NUMERIC_VARIABLES`]).
pub fn numeric(var: &str) -> Option<Numeric> {
    NUMERIC_VARIABLES
        .iter()
        .find(|(name, _)| *name == var)
        .map(|(_, range)| *range)
}

/// Reads `value` of numeric variable `var` by the rule of
/// [`NUMERIC_VARIABLES`] (a variable not listed there takes any whole
/// number).
pub fn parse_numeric(var: &'static str, value: &str) -> Result<u64, ConfigError> {
    numeric(var)
        .unwrap_or(Numeric::new(Unit::Count, 0, u64::MAX))
        .parse(var, value)
}

impl Config {
    /// A configuration with ps-lite's defaults for a cluster of
    /// `num_servers` and `num_workers` around the scheduler at
    /// `scheduler_host:scheduler_port`, advertising 127.0.0.1.
    pub fn new(
        role: Role,
        num_servers: i32,
        num_workers: i32,
        scheduler_host: impl Into<String>,
        scheduler_port: i32,
    ) -> Config {
        Config {
            van: VanConfig {
                role,
                num_servers,
                num_workers,
                scheduler_host: scheduler_host.into(),
                scheduler_port,
                ..VanConfig::default()
            },
            verbose: 0,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            metrics_port: None,
            request_warn: Duration::from_secs(DEFAULT_REQUEST_WARN_SECS),
            server_threads: 1,
            app_wait: Duration::from_millis(DEFAULT_APP_WAIT_MS),
            staleness: None,
            malloc_tune: true,
        }
    }

    /// This node's role.
    pub fn role(&self) -> Role {
        self.van.role
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads configuration through `lookup` (a variable name to its value).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let env = Env(&lookup);
        let defaults = VanConfig::default();
        let role_value = env.required("DMLC_ROLE", "set it to scheduler, server or worker")?;
        let role = role_value.parse().map_err(|_| ConfigError::Invalid {
            var: "DMLC_ROLE",
            value: role_value.clone(),
            expected: "scheduler, server or worker",
        })?;
        let (num_servers, min_servers) = env.servers()?;
        let (num_workers, elastic) = env.workers(
            Duration::from_secs(env.number("PS_RDZV_LAST_CALL", DEFAULT_RDZV_LAST_CALL_SECS)?),
            Duration::from_secs(env.number("PS_RDZV_TIMEOUT", DEFAULT_RDZV_TIMEOUT_SECS)?),
        )?;
        if min_servers.is_some() && elastic.is_some() {
            return Err(ConfigError::Invalid {
                var: "DMLC_NUM_SERVER",
                value: env.get("DMLC_NUM_SERVER").unwrap_or_default(),
                expected: "a plain number when DMLC_NUM_WORKER is MIN:MAX (elastic workers and \
                           servers that join and leave do not mix yet)",
            });
        }
        let scheduler_host = env.required(
            "DMLC_PS_ROOT_URI",
            "set it to the scheduler's IP or host name (e.g. 127.0.0.1)",
        )?;
        if !resolve::resolves(&scheduler_host) {
            return Err(ConfigError::Unresolvable {
                var: "DMLC_PS_ROOT_URI",
                value: scheduler_host,
            });
        }
        let scheduler_port =
            env.required_number("DMLC_PS_ROOT_PORT", "set it to the scheduler's port")? as i32;
        let host = match (env.get("DMLC_NODE_HOST"), env.get("DMLC_INTERFACE")) {
            (Some(host), _) => {
                if !resolve::resolves(&host) {
                    return Err(ConfigError::Unresolvable {
                        var: "DMLC_NODE_HOST",
                        value: host,
                    });
                }
                host
            }
            (None, Some(interface)) => {
                resolve::interface_ipv4(&interface).ok_or(ConfigError::Interface(interface))?
            }
            (None, None) => default_host(&scheduler_host),
        };
        let bind_host = env.get("PS_BIND_HOST");
        if let Some(bind) = &bind_host {
            if resolve::bind_ip(bind).is_none() {
                return Err(ConfigError::Unresolvable {
                    var: "PS_BIND_HOST",
                    value: bind.clone(),
                });
            }
        }
        let port = env.optional_number("PORT")?.map(|p| p as i32);
        // ps-lite scripts set 3: it means what 2 means, everything.
        let verbose = env.number("PS_VERBOSE", 0)?.min(2);
        let seconds = |var, default| -> Result<Option<Duration>, ConfigError> {
            let secs = env.number(var, default)?;
            Ok((secs > 0).then(|| Duration::from_secs(secs)))
        };
        let start_timeout =
            Duration::from_secs(env.number("PS_START_TIMEOUT", defaults.start_timeout.as_secs())?);
        let secs_of = |d: Option<Duration>| d.map_or(0, |d| d.as_secs());
        let heartbeat_interval = seconds(
            "PS_HEARTBEAT_INTERVAL",
            secs_of(defaults.heartbeat_interval),
        )?;
        // Set, the timeout applies to every node, as in ps-lite; by default
        // only to nodes that send heartbeats (see VanConfig::watch_all).
        let watch_all = env.get("PS_HEARTBEAT_TIMEOUT").is_some();
        let heartbeat_timeout =
            seconds("PS_HEARTBEAT_TIMEOUT", secs_of(defaults.heartbeat_timeout))?;
        if let (true, Some(timeout)) = (watch_all, heartbeat_timeout) {
            if heartbeat_interval.is_none_or(|interval| interval >= timeout) {
                return Err(ConfigError::Invalid {
                    var: "PS_HEARTBEAT_TIMEOUT",
                    value: timeout.as_secs().to_string(),
                    expected: "larger than PS_HEARTBEAT_INTERVAL, which must be set (> 0) \
                               for nodes to send heartbeats",
                });
            }
        }
        let recovery_timeout = Duration::from_secs(
            env.number("PS_RECOVERY_TIMEOUT", defaults.recovery_timeout.as_secs())?,
        );
        let resend_timeout =
            Duration::from_millis(env.number("PS_RESEND_TIMEOUT", DEFAULT_RESEND_TIMEOUT_MS)?);
        let max_message_size = env
            .optional_number("PS_MAX_MESSAGE_SIZE")?
            .map(|n| n as i64)
            .or(defaults.max_message_size);
        let hold_limit = env.number("PS_HOLD_LIMIT", defaults.hold_limit as u64)? as usize;
        let partition_bytes =
            env.number("PS_PARTITION_BYTES", defaults.partition_bytes as u64)? as usize;
        if partition_bytes > 0 && partition_bytes < 4096 {
            return Err(ConfigError::Invalid {
                var: "PS_PARTITION_BYTES",
                value: partition_bytes.to_string(),
                expected: "0 (off) or at least 4K: parts of a few bytes would cost a message each",
            });
        }
        let queue_limit = env.number("PS_QUEUE_LIMIT", DEFAULT_QUEUE_LIMIT as u64)? as usize;
        let request_warn =
            Duration::from_secs(env.number("PS_REQUEST_WARN", DEFAULT_REQUEST_WARN_SECS)?);
        let app_wait = Duration::from_millis(env.number("PS_APP_WAIT", DEFAULT_APP_WAIT_MS)?);
        Ok(Config {
            van: VanConfig {
                role,
                num_servers,
                min_servers,
                num_workers,
                elastic,
                scheduler_host,
                scheduler_port,
                host,
                bind_host,
                port,
                transport: if env.flag("DMLC_LOCAL")? {
                    Transport::Ipc
                } else {
                    Transport::Tcp
                },
                water_mark: env.optional_number("DMLC_PS_WATER_MARK")?.map(|n| n as i32),
                start_timeout,
                heartbeat_interval,
                heartbeat_timeout,
                watch_all,
                recovery_timeout,
                resend_timeout: env.flag("PS_RESEND")?.then_some(resend_timeout),
                max_resends: defaults.max_resends,
                drop_percent: env.number("PS_DROP_MSG", 0)? as u32,
                replicas: replicas(&env, num_servers)?,
                max_message_size,
                hold_limit,
                partition_bytes,
                store_limits: store_limits(&env, defaults.store_limits)?,
                auth_token: auth_token(&env)?,
                shm: match env.get("PS_SHM") {
                    None => defaults.shm,
                    Some(_) => env.flag("PS_SHM")?,
                },
                shm_identity: None,
                ipc: match env.get("PS_IPC") {
                    None => defaults.ipc,
                    Some(_) => env.flag("PS_IPC")?,
                },
                checkpoint: checkpoint(&env)?,
            },
            verbose: verbose as u8,
            queue_limit,
            metrics_port: env.optional_number("PS_METRICS_PORT")?.map(|p| p as u16),
            request_warn,
            server_threads: env.number("PS_SERVER_THREADS", 1)? as usize,
            app_wait,
            staleness: env.optional_number("PS_STALENESS")?,
            // The scheduler moves no large data and holds the store: it
            // keeps malloc as it is (returning what it frees) unless asked.
            malloc_tune: match env.get("PS_MALLOC_TUNE") {
                None => role != Role::Scheduler,
                Some(_) => env.flag("PS_MALLOC_TUNE")?,
            },
        })
    }
}

/// The store's bounds from `PS_STORE_MAX_KEY`, `_VALUE`, `_BYTES` (bytes,
/// with an optional K, M or G suffix: KiB, MiB, GiB), `_KEYS`, `_WAITS`
/// and `_WATCHES` (counts; the last two per node).
fn store_limits(env: &Env, defaults: StoreLimits) -> Result<StoreLimits, ConfigError> {
    let read = |var: &'static str, default: usize| -> Result<usize, ConfigError> {
        env.number(var, default as u64).map(|v| v as usize)
    };
    Ok(StoreLimits {
        max_key: read("PS_STORE_MAX_KEY", defaults.max_key)?,
        max_value: read("PS_STORE_MAX_VALUE", defaults.max_value)?,
        max_total: read("PS_STORE_MAX_BYTES", defaults.max_total)?,
        max_keys: read("PS_STORE_MAX_KEYS", defaults.max_keys)?,
        max_waits_per_node: read("PS_STORE_MAX_WAITS", defaults.max_waits_per_node)?,
        max_watches_per_node: read("PS_STORE_MAX_WATCHES", defaults.max_watches_per_node)?,
        ..defaults
    })
}

/// `PS_CHECKPOINT_DIR` (where servers write their key ranges and the
/// scheduler its manifests; a job started with it resumes the checkpoint
/// its `LATEST` names), `PS_CHECKPOINT_INTERVAL` (seconds between
/// automatic checkpoints; unset: on demand only), `PS_CHECKPOINT_TIMEOUT`,
/// `PS_CHECKPOINT_KEEP` and `PS_CHECKPOINT_FRESH` (a new job even where
/// the directory holds checkpoints). The companions without the directory are an
/// error (they would do nothing).
fn checkpoint(env: &Env) -> Result<Option<CheckpointConfig>, ConfigError> {
    let interval = env.optional_number("PS_CHECKPOINT_INTERVAL")?;
    let timeout = env.optional_number("PS_CHECKPOINT_TIMEOUT")?;
    let keep = env.optional_number("PS_CHECKPOINT_KEEP")?;
    let fresh = env.flag("PS_CHECKPOINT_FRESH")?;
    let Some(dir) = env.get("PS_CHECKPOINT_DIR") else {
        if fresh {
            return Err(ConfigError::Invalid {
                var: "PS_CHECKPOINT_FRESH",
                value: "1".into(),
                expected: "set only with PS_CHECKPOINT_DIR (the directory checkpoints are \
                           written to)",
            });
        }
        for (var, value) in [
            ("PS_CHECKPOINT_INTERVAL", interval),
            ("PS_CHECKPOINT_TIMEOUT", timeout),
            ("PS_CHECKPOINT_KEEP", keep),
        ] {
            if let Some(value) = value {
                return Err(ConfigError::Invalid {
                    var,
                    value: value.to_string(),
                    expected: "set only with PS_CHECKPOINT_DIR (the directory checkpoints \
                               are written to)",
                });
            }
        }
        return Ok(None);
    };
    let path = std::path::PathBuf::from(&dir);
    if path.exists() && !path.is_dir() {
        return Err(ConfigError::Invalid {
            var: "PS_CHECKPOINT_DIR",
            value: dir,
            expected: "a directory (this path is a file)",
        });
    }
    let mut cfg = CheckpointConfig::new(path);
    cfg.interval = interval.map(Duration::from_secs);
    if let Some(t) = timeout {
        cfg.timeout = Duration::from_secs(t);
    }
    if let Some(k) = keep {
        cfg.keep = k as usize;
    }
    cfg.fresh = fresh;
    Ok(Some(cfg))
}

/// `PS_AUTH_TOKEN`: set but empty (`=$UNSET`) is an error, not "off".
fn auth_token(env: &Env) -> Result<Option<AuthToken>, ConfigError> {
    let Some(raw) = (env.0)("PS_AUTH_TOKEN") else {
        return Ok(None);
    };
    match raw.trim() {
        "" => Err(ConfigError::Invalid {
            var: "PS_AUTH_TOKEN",
            value: raw,
            expected: "a secret of 1 to 255 bytes (it is set but empty, e.g. from an unset shell \
                       variable: set it on every node, or unset it to run without authentication)",
        }),
        v => AuthToken::new(v).map(Some).ok_or(ConfigError::Invalid {
            var: "PS_AUTH_TOKEN",
            value: format!("<{} bytes>", v.len()),
            expected: "a secret of 1 to 255 bytes",
        }),
    }
}

/// `123`, `64K`, `64M`, `1G` (binary multiples, case-insensitive, an
/// optional trailing `B` or `iB`) as bytes.
/// `PS_REPLICAS`: copies of each key range (pslite-only), 1 (the default:
/// ps-lite's one copy) to the number of servers.
fn replicas(env: &Env, num_servers: i32) -> Result<u32, ConfigError> {
    let k = env.number("PS_REPLICAS", 1)?;
    if k > num_servers.max(1) as u64 {
        return Err(ConfigError::Invalid {
            var: "PS_REPLICAS",
            value: k.to_string(),
            expected: "at most DMLC_NUM_SERVER (each copy of a range lives on another server)",
        });
    }
    Ok(k as u32)
}

fn parse_bytes(value: &str) -> Option<u64> {
    let v = value.trim().to_ascii_lowercase();
    let v = v
        .strip_suffix("ib")
        .or_else(|| v.strip_suffix('b'))
        .unwrap_or(&v);
    let (digits, shift) = match v.char_indices().last()? {
        (i, 'k') => (&v[..i], 10),
        (i, 'm') => (&v[..i], 20),
        (i, 'g') => (&v[..i], 30),
        _ => (v, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The host to advertise when none is configured.
fn default_host(scheduler_host: &str) -> String {
    let loopback = resolve::bind_ip(scheduler_host)
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        .is_some_and(|ip| ip.is_loopback());
    if loopback {
        return "127.0.0.1".into();
    }
    ["eth0", "en0", "ens3", "ens4", "ens5", "eno1", "enp0s3"]
        .iter()
        .find_map(|name| resolve::interface_ipv4(name))
        .unwrap_or_else(|| "127.0.0.1".into())
}

struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    /// A set, non-blank variable.
    fn get(&self, var: &str) -> Option<String> {
        (self.0)(var)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    fn required(&self, var: &'static str, hint: &'static str) -> Result<String, ConfigError> {
        self.get(var).ok_or(ConfigError::Missing { var, hint })
    }

    /// `DMLC_NUM_SERVER`: a positive number, or `MIN:MAX` (servers that
    /// join and leave a running job, `1 <= MIN <= MAX`). Returns the server
    /// count (MAX, the number of key ranges, when elastic) and MIN.
    fn servers(&self) -> Result<(i32, Option<i32>), ConfigError> {
        let value = self.required("DMLC_NUM_SERVER", "set it to a positive integer or MIN:MAX")?;
        Ok(match parse_num_servers(&value)? {
            NodeCount::Fixed(n) => (n as i32, None),
            NodeCount::Elastic { min, max } => (max as i32, Some(min as i32)),
        })
    }

    /// `DMLC_NUM_WORKER`: a positive number, or `MIN:MAX` (elastic mode,
    /// `1 <= MIN <= MAX`). Returns the worker count (MAX when elastic) and
    /// the rounds' configuration.
    fn workers(
        &self,
        last_call: Duration,
        timeout: Duration,
    ) -> Result<(i32, Option<RendezvousConfig>), ConfigError> {
        let value = self.required("DMLC_NUM_WORKER", "set it to a positive integer or MIN:MAX")?;
        let (min, max) = match parse_num_workers(&value)? {
            NodeCount::Fixed(n) => return Ok((n as i32, None)),
            NodeCount::Elastic { min, max } => (min as i32, max as i32),
        };
        Ok((
            max,
            Some(RendezvousConfig {
                min: min as usize,
                max: max as usize,
                last_call,
                timeout,
            }),
        ))
    }

    /// Numeric variable `var` by the rule of [`NUMERIC_VARIABLES`], or
    /// `default` when it is unset.
    fn number(&self, var: &'static str, default: u64) -> Result<u64, ConfigError> {
        Ok(self.optional_number(var)?.unwrap_or(default))
    }

    /// Numeric variable `var`, if set.
    fn optional_number(&self, var: &'static str) -> Result<Option<u64>, ConfigError> {
        self.get(var)
            .map(|value| parse_numeric(var, &value))
            .transpose()
    }

    /// Numeric variable `var`, which must be set (`hint` says to what).
    fn required_number(&self, var: &'static str, hint: &'static str) -> Result<u64, ConfigError> {
        parse_numeric(var, &self.required(var, hint)?)
    }

    fn flag(&self, var: &'static str) -> Result<bool, ConfigError> {
        match self
            .get(var)
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("0") | Some("false") | Some("no") | Some("off") => Ok(false),
            Some("1") | Some("true") | Some("yes") | Some("on") => Ok(true),
            Some(_) => Err(ConfigError::Invalid {
                var,
                value: self.get(var).unwrap_or_default(),
                expected: "0 or 1",
            }),
        }
    }
}

#[cfg(test)]
mod tests;
