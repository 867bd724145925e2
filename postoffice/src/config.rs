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
    /// `PS_MAX_MESSAGE_SIZE`, `PS_HOLD_LIMIT`, `PS_SHM`, `PS_IPC`, `PS_STORE_MAX_KEY`/
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
                store_limits: store_limits(&env, defaults.store_limits)?,
                auth_token: env
                    .get("PS_AUTH_TOKEN")
                    .map(|v| {
                        AuthToken::new(&v).ok_or(ConfigError::Invalid {
                            var: "PS_AUTH_TOKEN",
                            value: format!("<{} bytes>", v.len()),
                            expected: "a secret of 1 to 255 bytes",
                        })
                    })
                    .transpose()?,
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
/// scheduler its manifests; a job started with it restores the newest
/// complete checkpoint there), `PS_CHECKPOINT_INTERVAL` (seconds between
/// automatic checkpoints; unset: on demand only), `PS_CHECKPOINT_TIMEOUT`
/// and `PS_CHECKPOINT_KEEP`. The companions without the directory are an
/// error (they would do nothing).
fn checkpoint(env: &Env) -> Result<Option<CheckpointConfig>, ConfigError> {
    let interval = env.optional_number("PS_CHECKPOINT_INTERVAL")?;
    let timeout = env.optional_number("PS_CHECKPOINT_TIMEOUT")?;
    let keep = env.optional_number("PS_CHECKPOINT_KEEP")?;
    let Some(dir) = env.get("PS_CHECKPOINT_DIR") else {
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
    Ok(Some(cfg))
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
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let base = [
            ("DMLC_ROLE", "worker"),
            ("DMLC_NUM_SERVER", "2"),
            ("DMLC_NUM_WORKER", "3"),
            ("DMLC_PS_ROOT_URI", "127.0.0.1"),
            ("DMLC_PS_ROOT_PORT", "9091"),
        ];
        let mut env: HashMap<String, String> = base
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in vars {
            if v.is_empty() {
                env.remove(*k);
            } else {
                env.insert(k.to_string(), v.to_string());
            }
        }
        Config::from_lookup(|k| env.get(k).cloned())
    }

    fn message(vars: &[(&str, &str)]) -> String {
        parse(vars).unwrap_err().to_string()
    }

    #[test]
    fn checkpoint_variables() {
        assert_eq!(parse(&[]).unwrap().van.checkpoint, None);
        let c = parse(&[
            ("PS_CHECKPOINT_DIR", "/tmp/ck"),
            ("PS_CHECKPOINT_INTERVAL", "60"),
            ("PS_CHECKPOINT_KEEP", "5"),
        ])
        .unwrap();
        let ck = c.van.checkpoint.expect("checkpoints on");
        assert_eq!(ck.dir, std::path::PathBuf::from("/tmp/ck"));
        assert_eq!(ck.interval, Some(Duration::from_secs(60)));
        assert_eq!(ck.keep, 5);
        assert_eq!(
            message(&[("PS_CHECKPOINT_INTERVAL", "60")]),
            "PS_CHECKPOINT_INTERVAL must be set only with PS_CHECKPOINT_DIR (the directory \
             checkpoints are written to), got \"60\""
        );
        assert!(message(&[
            ("PS_CHECKPOINT_DIR", "/tmp/ck"),
            ("PS_CHECKPOINT_INTERVAL", "0")
        ])
        .starts_with("PS_CHECKPOINT_INTERVAL must be "));
        let file = std::env::current_exe().unwrap();
        let file = file.to_string_lossy();
        assert!(
            message(&[("PS_CHECKPOINT_DIR", &file)]).contains("a directory (this path is a file)")
        );
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.role(), Role::Worker);
        let v = &c.van;
        assert_eq!((v.num_servers, v.num_workers), (2, 3));
        assert_eq!(v.host, "127.0.0.1");
        assert_eq!(v.start_timeout, Duration::from_secs(300));
        assert_eq!(v.heartbeat_interval, Some(Duration::from_secs(1)));
        assert_eq!(v.heartbeat_timeout, Some(Duration::from_secs(10)));
        assert!(!v.watch_all);
        assert_eq!(v.resend_timeout, None);
        assert_eq!(v.transport, Transport::Tcp);
        assert_eq!(v.port, None);
        assert_eq!(c.queue_limit, DEFAULT_QUEUE_LIMIT);
        assert_eq!(c.request_warn, Duration::from_secs(30));
        // The defaults are the Van's, written once.
        let d = VanConfig::default();
        assert_eq!(v.recovery_timeout, d.recovery_timeout);
        assert_eq!(v.hold_limit, d.hold_limit);
        assert_eq!(v.max_resends, d.max_resends);
        assert!(v.shm && d.shm, "shared memory is on by default");
    }

    #[test]
    fn every_variable_is_read() {
        let c = parse(&[
            ("DMLC_ROLE", " Scheduler "),
            ("DMLC_NODE_HOST", "localhost"),
            ("PORT", "9100"),
            ("DMLC_LOCAL", "1"),
            ("DMLC_PS_WATER_MARK", "500"),
            ("PS_VERBOSE", "2"),
            ("PS_HEARTBEAT_INTERVAL", "1"),
            ("PS_HEARTBEAT_TIMEOUT", "5"),
            ("PS_RESEND", "1"),
            ("PS_RESEND_TIMEOUT", "200"),
            ("PS_DROP_MSG", "10"),
            ("PS_START_TIMEOUT", "7"),
            ("PS_BIND_HOST", "0.0.0.0"),
            ("PS_RECOVERY_TIMEOUT", "9"),
            ("PS_MAX_MESSAGE_SIZE", "1000000"),
            ("PS_HOLD_LIMIT", "5000"),
            ("PS_QUEUE_LIMIT", "17"),
            ("PS_REQUEST_WARN", "2"),
            ("PS_AUTH_TOKEN", "s3cret"),
            ("PS_METRICS_PORT", "9900"),
            ("PS_SHM", "0"),
            ("PS_IPC", "0"),
        ])
        .unwrap();
        assert!(!c.van.shm);
        assert!(!c.van.ipc);
        assert!(parse(&[]).unwrap().van.ipc);
        assert!(parse(&[("PS_SHM", "maybe")]).is_err());
        assert!(parse(&[("PS_IPC", "maybe")]).is_err());
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "the token must not be logged"
        );
        assert_eq!(c.metrics_port, Some(9900));
        assert_eq!(c.role(), Role::Scheduler);
        assert_eq!(c.verbose, 2);
        assert_eq!(c.queue_limit, 17);
        assert_eq!(c.request_warn, Duration::from_secs(2));
        let c = c.van;
        assert_eq!(c.auth_token, pslite_van::AuthToken::new("s3cret"));
        assert_eq!(c.host, "localhost");
        assert_eq!(c.port, Some(9100));
        assert_eq!(c.transport, Transport::Ipc);
        assert_eq!(c.water_mark, Some(500));
        assert_eq!(c.heartbeat_interval, Some(Duration::from_secs(1)));
        assert_eq!(c.heartbeat_timeout, Some(Duration::from_secs(5)));
        assert_eq!(c.resend_timeout, Some(Duration::from_millis(200)));
        assert_eq!(c.drop_percent, 10);
        assert_eq!(c.start_timeout, Duration::from_secs(7));
        assert_eq!(c.bind_host.as_deref(), Some("0.0.0.0"));
        assert_eq!(c.recovery_timeout, Duration::from_secs(9));
        assert_eq!(c.max_message_size, Some(1_000_000));
        assert_eq!(c.hold_limit, 5000);
    }

    #[test]
    fn store_bounds_are_read_with_size_suffixes() {
        let c = parse(&[
            ("PS_STORE_MAX_KEY", "100"),
            ("PS_STORE_MAX_VALUE", "1M"),
            ("PS_STORE_MAX_BYTES", "2GiB"),
            ("PS_STORE_MAX_KEYS", "50"),
            ("PS_STORE_MAX_WAITS", "7"),
            ("PS_STORE_MAX_WATCHES", "8"),
        ])
        .unwrap();
        let l = c.van.store_limits;
        assert_eq!(
            (l.max_key, l.max_value, l.max_total),
            (100, 1 << 20, 2 << 30)
        );
        assert_eq!(
            (l.max_keys, l.max_waits_per_node, l.max_watches_per_node),
            (50, 7, 8)
        );
        assert_eq!(parse(&[]).unwrap().van.store_limits, StoreLimits::default());
        assert_eq!(parse_bytes("64k"), Some(64 << 10));
        assert_eq!(parse_bytes("12 MB"), Some(12 << 20));
        assert_eq!(
            message(&[("PS_STORE_MAX_VALUE", "lots")]),
            "PS_STORE_MAX_VALUE must be a number of bytes from 1 to 2147483647, optionally with \
             K, M or G (KiB, MiB, GiB), got \"lots\""
        );
        assert_eq!(
            message(&[("PS_HOLD_LIMIT", "2048G")]),
            "PS_HOLD_LIMIT must be a number of bytes from 1 to 1024G, optionally with K, M or G \
             (KiB, MiB, GiB), got \"2048G\""
        );
        assert_eq!(
            parse(&[("PS_HOLD_LIMIT", "1M")]).unwrap().van.hold_limit,
            1 << 20
        );
        // One value travels in one message: over 2 GiB - 1 cannot work.
        assert!(message(&[("PS_STORE_MAX_VALUE", "4G")]).starts_with("PS_STORE_MAX_VALUE must"));
        assert!(message(&[("PS_STORE_MAX_KEY", "0")]).starts_with("PS_STORE_MAX_KEY must"));
        assert_eq!(
            message(&[("PS_STORE_MAX_WATCHES", "-1")]),
            "PS_STORE_MAX_WATCHES must be a whole number from 1 to 1000000000, got \"-1\""
        );
    }

    #[test]
    fn auth_token_is_checked() {
        assert_eq!(parse(&[]).unwrap().van.auth_token, None);
        assert_eq!(
            message(&[("PS_AUTH_TOKEN", &"x".repeat(300))]),
            "PS_AUTH_TOKEN must be a secret of 1 to 255 bytes, got \"<300 bytes>\""
        );
    }

    #[test]
    fn interface_gives_the_host() {
        let c = parse(&[("DMLC_INTERFACE", "lo")]).unwrap();
        assert_eq!(c.van.host, "127.0.0.1");
        assert_eq!(
            message(&[("DMLC_INTERFACE", "nope0")]),
            "DMLC_INTERFACE \"nope0\" is not a network interface with an IPv4 address (try lo or eth0)"
        );
    }

    #[test]
    fn replicas_are_read_and_bounded_by_the_servers() {
        assert_eq!(parse(&[]).unwrap().van.replicas, 1);
        assert_eq!(parse(&[("PS_REPLICAS", "2")]).unwrap().van.replicas, 2);
        assert!(message(&[("PS_REPLICAS", "3")]).contains("at most DMLC_NUM_SERVER"));
        assert!(message(&[("PS_REPLICAS", "0")]).starts_with("PS_REPLICAS must be"));
    }

    #[test]
    fn min_max_workers_turn_on_elastic_mode() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.van.elastic, None, "a plain number: no rounds");
        let c = parse(&[("DMLC_NUM_WORKER", "2:4"), ("PS_RDZV_LAST_CALL", "3")]).unwrap();
        assert_eq!(c.van.num_workers, 4);
        assert_eq!(
            c.van.elastic,
            Some(RendezvousConfig {
                min: 2,
                max: 4,
                last_call: Duration::from_secs(3),
                timeout: Duration::from_secs(DEFAULT_RDZV_TIMEOUT_SECS),
            })
        );
        let c = parse(&[("DMLC_NUM_WORKER", "3:3"), ("PS_RDZV_TIMEOUT", "9")]).unwrap();
        let e = c.van.elastic.unwrap();
        assert_eq!((e.min, e.max, e.timeout), (3, 3, Duration::from_secs(9)));
        for bad in [
            "4:2",
            "0:3",
            "a:b",
            "2:",
            ":2",
            "1:2:3",
            "x",
            "-1",
            "1:2000000",
        ] {
            assert_eq!(
                message(&[("DMLC_NUM_WORKER", bad)]),
                format!(
                    "DMLC_NUM_WORKER must be a whole number from 1 to 1000000 (or MIN:MAX for \
                     elastic workers, MIN <= MAX), got {bad:?}"
                )
            );
        }
        assert_eq!(
            message(&[("DMLC_NUM_WORKER", "2:4"), ("PS_RDZV_TIMEOUT", "0")]),
            "PS_RDZV_TIMEOUT must be a whole number of seconds from 1 to 604800, got \"0\""
        );
    }

    #[test]
    fn min_max_servers_let_servers_join_and_leave() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.van.min_servers, None, "a plain number: a fixed job");
        let c = parse(&[("DMLC_NUM_SERVER", "1:3"), ("PS_REPLICAS", "3")]).unwrap();
        assert_eq!((c.van.num_servers, c.van.min_servers), (3, Some(1)));
        assert_eq!(c.van.replicas, 3, "up to MAX copies");
        for bad in ["3:1", "0:2", "a:b", "2:", "1:2:3", "1:2000000"] {
            assert_eq!(
                message(&[("DMLC_NUM_SERVER", bad)]),
                format!(
                    "DMLC_NUM_SERVER must be a whole number from 1 to 1000000 (or MIN:MAX for \
                     servers that join and leave, MIN <= MAX), got {bad:?}"
                )
            );
        }
        assert!(
            message(&[("DMLC_NUM_SERVER", "1:2"), ("DMLC_NUM_WORKER", "1:2")])
                .contains("elastic workers and servers that join and leave do not mix yet"),
            "{}",
            message(&[("DMLC_NUM_SERVER", "1:2"), ("DMLC_NUM_WORKER", "1:2")])
        );
    }

    #[test]
    fn errors_name_the_variable_and_the_fix() {
        assert_eq!(
            message(&[("DMLC_NUM_SERVER", "x")]),
            "DMLC_NUM_SERVER must be a whole number from 1 to 1000000 (or MIN:MAX for servers \
             that join and leave, MIN <= MAX), got \"x\""
        );
        assert_eq!(
            message(&[("DMLC_NUM_SERVER", "0")]),
            "DMLC_NUM_SERVER must be a whole number from 1 to 1000000 (or MIN:MAX for servers \
             that join and leave, MIN <= MAX), got \"0\""
        );
        assert_eq!(
            message(&[("DMLC_NUM_WORKER", "")]),
            "DMLC_NUM_WORKER is not set: set it to a positive integer or MIN:MAX"
        );
        assert_eq!(
            message(&[("DMLC_ROLE", "boss")]),
            "DMLC_ROLE must be scheduler, server or worker, got \"boss\""
        );
        assert!(message(&[("DMLC_ROLE", "")]).starts_with("DMLC_ROLE is not set"));
        assert!(message(&[("DMLC_PS_ROOT_PORT", "70000")])
            .starts_with("DMLC_PS_ROOT_PORT must be a port"));
        assert!(message(&[("DMLC_PS_ROOT_URI", "no-such-host.invalid")])
            .starts_with("DMLC_PS_ROOT_URI \"no-such-host.invalid\" does not resolve"));
        assert!(
            message(&[("DMLC_NODE_HOST", "no-such-host.invalid")]).starts_with("DMLC_NODE_HOST")
        );
        assert!(message(&[("PORT", "-1")]).starts_with("PORT must be"));
        assert_eq!(parse(&[("PS_VERBOSE", "3")]).unwrap().verbose, 2);
        for bad in ["x", "9", "-1"] {
            assert_eq!(
                message(&[("PS_VERBOSE", bad)]),
                format!(
                    "PS_VERBOSE must be a whole number from 0 to 3 (0 warnings, 1 connections, \
                     2 every message; 3, which ps-lite scripts set, is 2), got {bad:?}"
                )
            );
        }
        assert!(message(&[("PS_DROP_MSG", "101")]).starts_with("PS_DROP_MSG must be"));
        assert!(message(&[("PS_METRICS_PORT", "70000")]).starts_with("PS_METRICS_PORT must be"));
        assert!(message(&[("PS_METRICS_PORT", "x")]).starts_with("PS_METRICS_PORT must be"));
        assert!(message(&[("PS_RESEND", "maybe")]).starts_with("PS_RESEND must be 0 or 1"));
        for bad in ["0", "-1", "1.5", "soon", "604801"] {
            assert_eq!(
                message(&[("PS_REQUEST_WARN", bad)]),
                format!(
                    "PS_REQUEST_WARN must be a whole number of seconds from 1 to 604800, got \
                     {bad:?}"
                )
            );
        }
        assert_eq!(
            message(&[("PS_START_TIMEOUT", "0")]),
            "PS_START_TIMEOUT must be a whole number of seconds from 1 to 604800, got \"0\""
        );
        assert!(message(&[("PS_RECOVERY_TIMEOUT", "0")]).starts_with("PS_RECOVERY_TIMEOUT must"));
        assert!(message(&[("PS_HEARTBEAT_INTERVAL", "1.5")])
            .starts_with("PS_HEARTBEAT_INTERVAL must be"));
        assert!(message(&[
            ("PS_HEARTBEAT_TIMEOUT", "5"),
            ("PS_HEARTBEAT_INTERVAL", "0")
        ])
        .starts_with(
            "PS_HEARTBEAT_TIMEOUT must be larger than PS_HEARTBEAT_INTERVAL, which must be set"
        ));
        let c = parse(&[("PS_HEARTBEAT_TIMEOUT", "5")]).unwrap();
        assert!(c.van.watch_all, "a timeout set applies to every node");
        let c = parse(&[
            ("PS_HEARTBEAT_INTERVAL", "0"),
            ("PS_HEARTBEAT_TIMEOUT", "0"),
        ])
        .unwrap();
        assert_eq!(
            (c.van.heartbeat_interval, c.van.heartbeat_timeout),
            (None, None)
        );
        assert!(message(&[
            ("PS_HEARTBEAT_TIMEOUT", "5"),
            ("PS_HEARTBEAT_INTERVAL", "5")
        ])
        .starts_with("PS_HEARTBEAT_TIMEOUT must be larger"));
    }

    /// One rule for every numeric variable: a whole number in its range,
    /// else an error naming the variable, the range and the value.
    #[test]
    fn every_numeric_variable_follows_one_rule() {
        for &(var, range) in NUMERIC_VARIABLES {
            let mut bad = vec!["abc".to_string(), "1.5".into(), "-1".into()];
            if range.max < u64::MAX {
                bad.push((range.max + 1).to_string());
            }
            if range.min > 0 {
                bad.push((range.min - 1).to_string());
            }
            for value in bad {
                let expected = ConfigError::OutOfRange {
                    var,
                    value: value.clone(),
                    range,
                };
                assert_eq!(parse_numeric(var, &value), Err(expected.clone()));
                // Read by Config the same way, whatever else it checks.
                assert_eq!(message(&[(var, &value)]), expected.to_string(), "{var}");
                let text = expected.to_string();
                assert!(
                    text.starts_with(&format!("{var} must be "))
                        && text.contains(&format!("from {}", bytes_or_number(range, range.min)))
                        && text.contains(&format!("to {}", bytes_or_number(range, range.max))),
                    "{text}"
                );
            }
            for ok in [range.min, range.max] {
                assert_eq!(parse_numeric(var, &format!(" {ok} ")), Ok(ok), "{var}");
            }
        }
        // Sizes take suffixes; other units do not.
        assert_eq!(parse_numeric("PS_HOLD_LIMIT", "64K"), Ok(64 << 10));
        assert!(parse_numeric("PS_QUEUE_LIMIT", "64K").is_err());
    }

    fn bytes_or_number(range: Numeric, n: u64) -> String {
        if range.unit == Unit::Bytes {
            bytes_text(n)
        } else {
            n.to_string()
        }
    }
}
