//! Node configuration: the `DMLC_*` / `PS_*` environment variables ps-lite
//! users already set, parsed with errors that name the variable and the fix.

use std::time::Duration;

use pslite_proto::Role;
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
    /// `PS_VERBOSE`: 0 quiet, 1 connections, 2 (or more, as ps-lite reads
    /// 3) every message; stored clamped to 2.
    pub verbose: u8,
    /// `PS_QUEUE_LIMIT`: data messages a customer's queue holds; when it is
    /// full the node stops reading until the customer has taken half
    /// (back-pressure).
    pub queue_limit: usize,
    /// `PS_METRICS_PORT`: serve the counters in Prometheus' text format over
    /// HTTP on this port (the next free one if another node of this machine
    /// has it; 0 = any free port); `None` (the default) is off.
    pub metrics_port: Option<u16>,
}

/// The default `PS_QUEUE_LIMIT`.
pub const DEFAULT_QUEUE_LIMIT: usize = 100_000;

/// Default `PS_RDZV_LAST_CALL`: how long the first elastic round waits for
/// more workers once it has MIN, in seconds.
pub const DEFAULT_RDZV_LAST_CALL_SECS: u64 = 1;

/// Default `PS_RDZV_TIMEOUT`: how long an elastic job may stay below MIN
/// workers before it fails, in seconds.
pub const DEFAULT_RDZV_TIMEOUT_SECS: u64 = 120;

/// The default `PS_RESEND_TIMEOUT`, in milliseconds.
const DEFAULT_RESEND_TIMEOUT_MS: u64 = 1000;

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
        let num_servers = env.positive("DMLC_NUM_SERVER")?;
        let (num_workers, elastic) = env.workers(
            Duration::from_secs(env.number(
                "PS_RDZV_LAST_CALL",
                DEFAULT_RDZV_LAST_CALL_SECS,
                0..=86_400,
                "a number of seconds from 0 to 86400",
            )?),
            Duration::from_secs(env.number(
                "PS_RDZV_TIMEOUT",
                DEFAULT_RDZV_TIMEOUT_SECS,
                1..=86_400 * 7,
                "a number of seconds from 1 to 604800",
            )?),
        )?;
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
        let port_value = env.required("DMLC_PS_ROOT_PORT", "set it to the scheduler's port")?;
        let scheduler_port = parse_port("DMLC_PS_ROOT_PORT", &port_value)?;
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
        let port = env
            .get("PORT")
            .map(|v| parse_port("PORT", &v))
            .transpose()?;
        // ps-lite treats any level above 2 as "everything" (scripts set 3).
        let verbose = env
            .number(
                "PS_VERBOSE",
                0,
                0..=u64::from(u8::MAX),
                "a level from 0 (quiet) to 2 (everything)",
            )?
            .min(2);
        let seconds = |var, default| -> Result<Option<Duration>, ConfigError> {
            let secs = env.number(
                var,
                default,
                0..=u32::MAX as u64,
                "a whole number of seconds",
            )?;
            Ok((secs > 0).then(|| Duration::from_secs(secs)))
        };
        let start_timeout = seconds("PS_START_TIMEOUT", defaults.start_timeout.as_secs())?.ok_or(
            ConfigError::Invalid {
                var: "PS_START_TIMEOUT",
                value: "0".into(),
                expected: "a positive number of seconds",
            },
        )?;
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
        let recovery_timeout = seconds("PS_RECOVERY_TIMEOUT", defaults.recovery_timeout.as_secs())?
            .unwrap_or(defaults.recovery_timeout);
        let resend_timeout = Duration::from_millis(env.number(
            "PS_RESEND_TIMEOUT",
            DEFAULT_RESEND_TIMEOUT_MS,
            1..=3_600_000,
            "a positive number of milliseconds",
        )?);
        let max_message_size = env
            .get("PS_MAX_MESSAGE_SIZE")
            .map(|v| {
                v.parse::<i64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(ConfigError::Invalid {
                        var: "PS_MAX_MESSAGE_SIZE",
                        value: v,
                        expected: "a positive number of bytes",
                    })
            })
            .transpose()?
            .or(defaults.max_message_size);
        let hold_limit = env.number(
            "PS_HOLD_LIMIT",
            defaults.hold_limit as u64,
            1..=u64::from(u32::MAX) * 16,
            "a positive number of bytes",
        )? as usize;
        let queue_limit = env.number(
            "PS_QUEUE_LIMIT",
            DEFAULT_QUEUE_LIMIT as u64,
            1..=u64::from(u32::MAX),
            "a positive number of messages",
        )? as usize;
        Ok(Config {
            van: VanConfig {
                role,
                num_servers,
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
                water_mark: env
                    .get("DMLC_PS_WATER_MARK")
                    .map(|v| parse_positive("DMLC_PS_WATER_MARK", &v))
                    .transpose()?,
                start_timeout,
                heartbeat_interval,
                heartbeat_timeout,
                watch_all,
                recovery_timeout,
                resend_timeout: env.flag("PS_RESEND")?.then_some(resend_timeout),
                max_resends: defaults.max_resends,
                drop_percent: env.number("PS_DROP_MSG", 0, 0..=100, "a percentage from 0 to 100")?
                    as u32,
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
            },
            verbose: verbose as u8,
            queue_limit,
            metrics_port: env
                .get("PS_METRICS_PORT")
                .map(|_| {
                    env.number(
                        "PS_METRICS_PORT",
                        0,
                        0..=65535,
                        "a port number (0 = any free port)",
                    )
                })
                .transpose()?
                .map(|p| p as u16),
        })
    }
}

/// The store's bounds from `PS_STORE_MAX_KEY`, `_VALUE`, `_BYTES` (bytes,
/// with an optional K, M or G suffix: KiB, MiB, GiB), `_KEYS`, `_WAITS`
/// and `_WATCHES` (counts; the last two per node).
fn store_limits(env: &Env, defaults: StoreLimits) -> Result<StoreLimits, ConfigError> {
    const BYTES: &str = "a positive number of bytes, optionally with K, M or G (KiB, MiB, GiB)";
    let bytes = |var: &'static str, default: usize, max: u64| -> Result<usize, ConfigError> {
        let Some(value) = env.get(var) else {
            return Ok(default);
        };
        parse_bytes(&value)
            .filter(|v| (1..=max).contains(v))
            .map(|v| v as usize)
            .ok_or(ConfigError::Invalid {
                var,
                value,
                expected: BYTES,
            })
    };
    let count = |var: &'static str, default: usize| -> Result<usize, ConfigError> {
        env.number(
            var,
            default as u64,
            1..=u64::from(u32::MAX),
            "a positive integer",
        )
        .map(|v| v as usize)
    };
    Ok(StoreLimits {
        max_key: bytes("PS_STORE_MAX_KEY", defaults.max_key, 1 << 20)?,
        // A value travels in one message: ps-lite's sizes are C ints.
        max_value: bytes("PS_STORE_MAX_VALUE", defaults.max_value, i32::MAX as u64)?,
        max_total: bytes("PS_STORE_MAX_BYTES", defaults.max_total, usize::MAX as u64)?,
        max_keys: count("PS_STORE_MAX_KEYS", defaults.max_keys)?,
        max_waits_per_node: count("PS_STORE_MAX_WAITS", defaults.max_waits_per_node)?,
        max_watches_per_node: count("PS_STORE_MAX_WATCHES", defaults.max_watches_per_node)?,
        ..defaults
    })
}

/// `123`, `64K`, `64M`, `1G` (binary multiples, case-insensitive, an
/// optional trailing `B` or `iB`) as bytes.
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

    /// `DMLC_NUM_WORKER`: a positive number, or `MIN:MAX` (elastic mode,
    /// `1 <= MIN <= MAX`). Returns the worker count (MAX when elastic) and
    /// the rounds' configuration.
    fn workers(
        &self,
        last_call: Duration,
        timeout: Duration,
    ) -> Result<(i32, Option<RendezvousConfig>), ConfigError> {
        const VAR: &str = "DMLC_NUM_WORKER";
        let value = self.required(VAR, "set it to a positive integer or MIN:MAX")?;
        let bad = || ConfigError::Invalid {
            var: VAR,
            value: value.clone(),
            expected: "a positive integer or MIN:MAX with 1 <= MIN <= MAX",
        };
        let Some((min, max)) = value.split_once(':') else {
            return Ok((parse_positive(VAR, &value).map_err(|_| bad())?, None));
        };
        let parse = |s: &str| s.trim().parse::<i32>().ok().filter(|&n| n >= 1);
        let (Some(min), Some(max)) = (parse(min), parse(max)) else {
            return Err(bad());
        };
        if min > max {
            return Err(bad());
        }
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

    fn positive(&self, var: &'static str) -> Result<i32, ConfigError> {
        let value = self.required(var, "set it to a positive integer")?;
        parse_positive(var, &value)
    }

    fn number(
        &self,
        var: &'static str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
        expected: &'static str,
    ) -> Result<u64, ConfigError> {
        let Some(value) = self.get(var) else {
            return Ok(default);
        };
        value
            .parse::<u64>()
            .ok()
            .filter(|v| range.contains(v))
            .ok_or(ConfigError::Invalid {
                var,
                value,
                expected,
            })
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

fn parse_positive(var: &'static str, value: &str) -> Result<i32, ConfigError> {
    value
        .parse::<i32>()
        .ok()
        .filter(|&v| v > 0)
        .ok_or(ConfigError::Invalid {
            var,
            value: value.to_string(),
            expected: "a positive integer",
        })
}

fn parse_port(var: &'static str, value: &str) -> Result<i32, ConfigError> {
    value
        .parse::<i32>()
        .ok()
        .filter(|p| (1..=65535).contains(p))
        .ok_or(ConfigError::Invalid {
            var,
            value: value.to_string(),
            expected: "a port number from 1 to 65535",
        })
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
            "PS_STORE_MAX_VALUE must be a positive number of bytes, optionally with K, M or G \
             (KiB, MiB, GiB), got \"lots\""
        );
        // One value travels in one message: over 2 GiB - 1 cannot work.
        assert!(message(&[("PS_STORE_MAX_VALUE", "4G")]).starts_with("PS_STORE_MAX_VALUE must"));
        assert!(message(&[("PS_STORE_MAX_KEY", "0")]).starts_with("PS_STORE_MAX_KEY must"));
        assert_eq!(
            message(&[("PS_STORE_MAX_WATCHES", "-1")]),
            "PS_STORE_MAX_WATCHES must be a positive integer, got \"-1\""
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
        for bad in ["4:2", "0:3", "a:b", "2:", ":2", "1:2:3", "x", "-1"] {
            assert_eq!(
                message(&[("DMLC_NUM_WORKER", bad)]),
                format!(
                    "DMLC_NUM_WORKER must be a positive integer or MIN:MAX with 1 <= MIN <= MAX, \
                     got {bad:?}"
                )
            );
        }
        assert_eq!(
            message(&[("DMLC_NUM_WORKER", "2:4"), ("PS_RDZV_TIMEOUT", "0")]),
            "PS_RDZV_TIMEOUT must be a number of seconds from 1 to 604800, got \"0\""
        );
    }

    #[test]
    fn errors_name_the_variable_and_the_fix() {
        assert_eq!(
            message(&[("DMLC_NUM_SERVER", "x")]),
            "DMLC_NUM_SERVER must be a positive integer, got \"x\""
        );
        assert_eq!(
            message(&[("DMLC_NUM_SERVER", "0")]),
            "DMLC_NUM_SERVER must be a positive integer, got \"0\""
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
        assert!(message(&[("PS_VERBOSE", "x")]).starts_with("PS_VERBOSE must be a level from 0"));
        assert!(message(&[("PS_DROP_MSG", "101")]).starts_with("PS_DROP_MSG must be"));
        assert!(message(&[("PS_METRICS_PORT", "70000")]).starts_with("PS_METRICS_PORT must be"));
        assert!(message(&[("PS_METRICS_PORT", "x")]).starts_with("PS_METRICS_PORT must be"));
        assert!(message(&[("PS_RESEND", "maybe")]).starts_with("PS_RESEND must be 0 or 1"));
        assert!(message(&[("PS_START_TIMEOUT", "0")])
            .starts_with("PS_START_TIMEOUT must be a positive"));
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
}
