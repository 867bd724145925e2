//! A node's configuration ([`Config`]), built from the settings table
//! ([`crate::settings`]: every `DMLC_*`/`PS_*` variable, its range, default
//! and doc) or in code, and the errors that name the variable and the fix.

use std::time::Duration;

use pslite_proto::Role;
use pslite_van::checkpoint::CheckpointConfig;
use pslite_van::rendezvous::RendezvousConfig;
use pslite_van::store::StoreLimits;
use pslite_van::{resolve, Transport, VanConfig};

use crate::settings::{self as s, Lookup, NodeCount, Numeric};

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
    /// rule every numeric variable follows, see [`Numeric`]).
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
/// [`Config::new`] and the public fields. What each field means, its
/// variable and its default are in the settings table ([`crate::settings`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The transport and control plane (the settings the Van and its core
    /// read).
    pub van: VanConfig,
    /// `PS_VERBOSE` (3 is stored as 2).
    pub verbose: u8,
    /// `PS_QUEUE_LIMIT`.
    pub queue_limit: usize,
    /// `PS_METRICS_PORT`; `None` is off.
    pub metrics_port: Option<u16>,
    /// `PS_REQUEST_WARN`.
    pub request_warn: Duration,
    /// `PS_SERVER_THREADS`.
    pub server_threads: usize,
    /// `PS_APP_WAIT`.
    pub app_wait: Duration,
    /// `PS_STALENESS` (workers); `None` is asynchronous.
    pub staleness: Option<u64>,
    /// `PS_MALLOC_TUNE` (unset: on for servers and workers, off for the
    /// scheduler; see `pslite_van::heap`).
    pub malloc_tune: bool,
}

impl Config {
    /// A configuration with the table's defaults for a cluster of
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
            queue_limit: s::PS_QUEUE_LIMIT.kind.default as usize,
            metrics_port: None,
            request_warn: Duration::from_secs(s::PS_REQUEST_WARN.kind.default),
            server_threads: s::PS_SERVER_THREADS.kind.default as usize,
            app_wait: Duration::from_millis(s::PS_APP_WAIT.kind.default),
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
        Config::from_lookup(s::environment())
    }

    /// Reads configuration through `lookup` (a variable name to its value).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let env: Lookup = &lookup;
        let role = s::DMLC_ROLE.read(env)?;
        let (num_servers, min_servers) = match s::DMLC_NUM_SERVER.read(env)? {
            NodeCount::Fixed(n) => (n as i32, None),
            NodeCount::Elastic { min, max } => (max as i32, Some(min as i32)),
        };
        let last_call = Duration::from_secs(s::PS_RDZV_LAST_CALL.read(env)?);
        let timeout = Duration::from_secs(s::PS_RDZV_TIMEOUT.read(env)?);
        let (num_workers, elastic) = match s::DMLC_NUM_WORKER.read(env)? {
            NodeCount::Fixed(n) => (n as i32, None),
            NodeCount::Elastic { min, max } => (
                max as i32,
                Some(RendezvousConfig {
                    min: min as usize,
                    max: max as usize,
                    last_call,
                    timeout,
                }),
            ),
        };
        if min_servers.is_some() && elastic.is_some() {
            return Err(ConfigError::Invalid {
                var: "DMLC_NUM_SERVER",
                value: lookup(s::DMLC_NUM_SERVER.name)
                    .unwrap_or_default()
                    .trim()
                    .into(),
                expected: "a plain number when DMLC_NUM_WORKER is MIN:MAX (elastic workers and \
                           servers that join and leave do not mix yet)",
            });
        }
        let scheduler_host = resolvable(&s::DMLC_PS_ROOT_URI, s::DMLC_PS_ROOT_URI.read(env)?)?;
        let scheduler_port = s::DMLC_PS_ROOT_PORT.read(env)? as i32;
        let host = match (s::DMLC_NODE_HOST.read(env)?, s::DMLC_INTERFACE.read(env)?) {
            (Some(host), _) => resolvable(&s::DMLC_NODE_HOST, host)?,
            (None, Some(interface)) => {
                resolve::interface_ipv4(&interface).ok_or(ConfigError::Interface(interface))?
            }
            (None, None) => default_host(&scheduler_host),
        };
        let bind_host = s::PS_BIND_HOST.read(env)?;
        if let Some(bind) = &bind_host {
            if resolve::bind_ip(bind).is_none() {
                return Err(ConfigError::Unresolvable {
                    var: "PS_BIND_HOST",
                    value: bind.clone(),
                });
            }
        }
        let seconds = |secs: u64| (secs > 0).then(|| Duration::from_secs(secs));
        let heartbeat_interval = seconds(s::PS_HEARTBEAT_INTERVAL.read(env)?);
        let heartbeat_timeout = seconds(s::PS_HEARTBEAT_TIMEOUT.read(env)?);
        // Set, the timeout applies to every node, as in ps-lite; by default
        // only to nodes that send heartbeats (see VanConfig::watch_all).
        let watch_all = s::PS_HEARTBEAT_TIMEOUT.is_set(env);
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
        let partition_bytes = s::PS_PARTITION_BYTES.read(env)? as usize;
        if partition_bytes > 0 && partition_bytes < 4096 {
            return Err(ConfigError::Invalid {
                var: "PS_PARTITION_BYTES",
                value: partition_bytes.to_string(),
                expected: "0 (off) or at least 4K: parts of a few bytes would cost a message each",
            });
        }
        let replicas = s::PS_REPLICAS.read(env)?;
        if replicas > num_servers.max(1) as u64 {
            return Err(ConfigError::Invalid {
                var: "PS_REPLICAS",
                value: replicas.to_string(),
                expected: "at most DMLC_NUM_SERVER (each copy of a range lives on another server)",
            });
        }
        let size = |var: &s::Var<s::Num>| var.read(env).map(|n| n as usize);
        let defaults = VanConfig::default();
        let resend_timeout = Duration::from_millis(s::PS_RESEND_TIMEOUT.read(env)?);
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
                port: s::PORT.read(env)?.map(|p| p as i32),
                transport: match s::DMLC_LOCAL.read(env)? {
                    true => Transport::Ipc,
                    false => Transport::Tcp,
                },
                water_mark: s::DMLC_PS_WATER_MARK.read(env)?.map(|n| n as i32),
                start_timeout: Duration::from_secs(s::PS_START_TIMEOUT.read(env)?),
                heartbeat_interval,
                heartbeat_timeout,
                watch_all,
                recovery_timeout: Duration::from_secs(s::PS_RECOVERY_TIMEOUT.read(env)?),
                resend_timeout: s::PS_RESEND.read(env)?.then_some(resend_timeout),
                max_resends: defaults.max_resends,
                drop_percent: s::PS_DROP_MSG.read(env)? as u32,
                replicas: replicas as u32,
                max_message_size: Some(s::PS_MAX_MESSAGE_SIZE.read(env)? as i64),
                hold_limit: size(&s::PS_HOLD_LIMIT)?,
                partition_bytes,
                store_limits: StoreLimits {
                    max_key: size(&s::PS_STORE_MAX_KEY)?,
                    max_value: size(&s::PS_STORE_MAX_VALUE)?,
                    max_total: size(&s::PS_STORE_MAX_BYTES)?,
                    max_keys: size(&s::PS_STORE_MAX_KEYS)?,
                    max_waits_per_node: size(&s::PS_STORE_MAX_WAITS)?,
                    max_watches_per_node: size(&s::PS_STORE_MAX_WATCHES)?,
                    ..defaults.store_limits
                },
                auth_token: s::PS_AUTH_TOKEN.read(env)?,
                shm: s::PS_SHM.read(env)?,
                shm_identity: None,
                ipc: s::PS_IPC.read(env)?,
                checkpoint: checkpoint(env)?,
            },
            // ps-lite scripts set 3: it means what 2 means, everything.
            verbose: s::PS_VERBOSE.read(env)?.min(2) as u8,
            queue_limit: size(&s::PS_QUEUE_LIMIT)?,
            metrics_port: s::PS_METRICS_PORT.read(env)?.map(|p| p as u16),
            request_warn: Duration::from_secs(s::PS_REQUEST_WARN.read(env)?),
            server_threads: size(&s::PS_SERVER_THREADS)?,
            app_wait: Duration::from_millis(s::PS_APP_WAIT.read(env)?),
            staleness: s::PS_STALENESS.read(env)?,
            // The scheduler moves no large data and holds the store: it
            // keeps malloc as it is (returning what it frees) unless asked.
            malloc_tune: s::PS_MALLOC_TUNE
                .read(env)?
                .unwrap_or(role != Role::Scheduler),
        })
    }
}

/// `host`, if it resolves; else an error naming `var`.
fn resolvable<K>(var: &s::Var<K>, host: String) -> Result<String, ConfigError> {
    if resolve::resolves(&host) {
        Ok(host)
    } else {
        Err(ConfigError::Unresolvable {
            var: var.name,
            value: host,
        })
    }
}

/// `PS_CHECKPOINT_DIR` and its companions, which without the directory are
/// an error (they would do nothing).
fn checkpoint(env: Lookup) -> Result<Option<CheckpointConfig>, ConfigError> {
    let interval = s::PS_CHECKPOINT_INTERVAL.read(env)?;
    let timeout = s::PS_CHECKPOINT_TIMEOUT.read(env)?;
    let keep = s::PS_CHECKPOINT_KEEP.read(env)?;
    let fresh = s::PS_CHECKPOINT_FRESH.read(env)?;
    let Some(dir) = s::PS_CHECKPOINT_DIR.read(env)? else {
        let companions = [
            (s::PS_CHECKPOINT_FRESH.name, fresh.then_some(1)),
            (s::PS_CHECKPOINT_INTERVAL.name, interval),
            (
                s::PS_CHECKPOINT_TIMEOUT.name,
                s::PS_CHECKPOINT_TIMEOUT.is_set(env).then_some(timeout),
            ),
            (
                s::PS_CHECKPOINT_KEEP.name,
                s::PS_CHECKPOINT_KEEP.is_set(env).then_some(keep),
            ),
        ];
        if let Some((var, Some(value))) = companions.into_iter().find(|(_, v)| v.is_some()) {
            return Err(ConfigError::Invalid {
                var,
                value: value.to_string(),
                expected: "set only with PS_CHECKPOINT_DIR (the directory checkpoints are \
                           written to)",
            });
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
    Ok(Some(CheckpointConfig {
        interval: interval.map(Duration::from_secs),
        timeout: Duration::from_secs(timeout),
        keep: keep as usize,
        fresh,
        ..CheckpointConfig::new(path)
    }))
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

#[cfg(test)]
mod tests;
