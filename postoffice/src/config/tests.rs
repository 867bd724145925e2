//! Tests of `config`.

use super::*;
use crate::settings::{bytes_text, parse_bytes, Unit, SETTINGS};
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
    assert!(message(&[("PS_CHECKPOINT_DIR", &file)]).contains("a directory (this path is a file)"));
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
    assert_eq!(c.queue_limit, 100_000);
    assert_eq!(c.request_warn, Duration::from_secs(30));
    // The table's defaults are those of a config built in code.
    let d = VanConfig {
        role: Role::Worker,
        num_servers: 2,
        num_workers: 3,
        ..VanConfig::default()
    };
    assert_eq!(*v, d);
    let n = Config::new(Role::Worker, 2, 3, "127.0.0.1", 9091);
    assert_eq!(c, n);
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
        ("PS_PARTITION_BYTES", "256K"),
        ("PS_QUEUE_LIMIT", "17"),
        ("PS_REQUEST_WARN", "2"),
        ("PS_AUTH_TOKEN", "s3cret"),
        ("PS_METRICS_PORT", "9900"),
        ("PS_SHM", "0"),
        ("PS_IPC", "0"),
        ("PS_MALLOC_TUNE", "0"),
    ])
    .unwrap();
    assert!(!c.van.shm);
    assert!(!c.malloc_tune);
    assert!(parse(&[]).unwrap().malloc_tune);
    assert!(parse(&[("DMLC_ROLE", "server")]).unwrap().malloc_tune);
    // The scheduler returns what it frees (its store stays bounded in
    // memory) unless asked to tune.
    assert!(!parse(&[("DMLC_ROLE", "scheduler")]).unwrap().malloc_tune);
    assert!(
        parse(&[("DMLC_ROLE", "scheduler"), ("PS_MALLOC_TUNE", "1")])
            .unwrap()
            .malloc_tune
    );
    assert!(parse(&[("PS_MALLOC_TUNE", "sometimes")]).is_err());
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
    assert_eq!(c.partition_bytes, 256 << 10);
    assert_eq!(
        parse(&[("PS_PARTITION_BYTES", "0")])
            .unwrap()
            .van
            .partition_bytes,
        0
    );
    assert!(parse(&[("PS_PARTITION_BYTES", "100")]).is_err());
    assert!(parse(&[("PS_PARTITION_BYTES", "2G")]).is_err());
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
    // Set but empty (an unset shell variable) is not "no authentication".
    let with_empty = |token: &str| {
        let token = token.to_string();
        Config::from_lookup(move |k| match k {
            "PS_AUTH_TOKEN" => Some(token.clone()),
            "DMLC_ROLE" => Some("worker".into()),
            "DMLC_NUM_SERVER" | "DMLC_NUM_WORKER" => Some("1".into()),
            "DMLC_PS_ROOT_URI" => Some("127.0.0.1".into()),
            "DMLC_PS_ROOT_PORT" => Some("9091".into()),
            _ => None,
        })
    };
    for empty in ["", "  "] {
        let text = with_empty(empty).unwrap_err().to_string();
        assert!(
            text.starts_with(
                "PS_AUTH_TOKEN must be a secret of 1 to 255 bytes (it is set but empty"
            ),
            "{text}"
        );
    }
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
            timeout: Duration::from_secs(120),
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
    assert!(
        message(&[("DMLC_PS_ROOT_PORT", "70000")]).starts_with("DMLC_PS_ROOT_PORT must be a port")
    );
    assert!(message(&[("DMLC_PS_ROOT_URI", "no-such-host.invalid")])
        .starts_with("DMLC_PS_ROOT_URI \"no-such-host.invalid\" does not resolve"));
    assert!(message(&[("DMLC_NODE_HOST", "no-such-host.invalid")]).starts_with("DMLC_NODE_HOST"));
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
    assert!(
        message(&[("PS_HEARTBEAT_INTERVAL", "1.5")]).starts_with("PS_HEARTBEAT_INTERVAL must be")
    );
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
    let numeric = SETTINGS.iter().filter_map(|s| Some((s.name(), s.range()?)));
    // PSLITE_* are read by the launcher and examples, not by Config.
    for (var, range) in numeric.filter(|(var, _)| !var.starts_with("PSLITE_")) {
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
            assert_eq!(range.parse(var, &value), Err(expected.clone()));
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
            assert_eq!(range.parse(var, &format!(" {ok} ")), Ok(ok), "{var}");
        }
    }
    // Sizes take suffixes; other units do not.
    let hold = crate::settings::PS_HOLD_LIMIT;
    assert_eq!(hold.read(&|_| Some("64K".into())), Ok(64 << 10));
    let queue = crate::settings::PS_QUEUE_LIMIT;
    assert!(queue.read(&|_| Some("64K".into())).is_err());
}

fn bytes_or_number(range: Numeric, n: u64) -> String {
    if range.unit == Unit::Bytes {
        bytes_text(n)
    } else {
        n.to_string()
    }
}
