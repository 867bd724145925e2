//! Bad configuration fails at once, with one line naming the variable and the
//! fix, and a missing node fails the cluster at the start deadline instead of
//! hanging it.

use std::time::Duration;

use pslite_tests::{free_port, node_command, node_env, run, spawn, Run};

/// Runs one `connection` node with `env` changed by `edits` (empty value =
/// unset) and returns the run; it must end within 10 s.
fn node(role: &str, edits: &[(&str, &str)]) -> Run {
    let mut env = node_env(role, 1, 1, free_port());
    for (key, value) in edits {
        env.retain(|(k, _)| k != key);
        if !value.is_empty() {
            env.push((key.to_string(), value.to_string()));
        }
    }
    run(node_command("connection", &env), Duration::from_secs(10))
}

fn assert_config_error(run: &Run, expected: &str) {
    assert_eq!(run.code(), Some(2), "{}", run.output());
    let lines: Vec<_> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{}", run.output());
    assert!(
        lines[0].contains(expected),
        "{expected:?} not in:\n{}",
        run.output()
    );
    assert!(
        run.elapsed < Duration::from_secs(5),
        "took {:?}",
        run.elapsed
    );
}

#[test]
fn missing_num_server() {
    let run = node("worker", &[("DMLC_NUM_SERVER", "")]);
    assert_config_error(
        &run,
        "DMLC_NUM_SERVER is not set: set it to a positive integer",
    );
}

/// `PS_AUTH_TOKEN=` (set but empty, as `PS_AUTH_TOKEN=$UNSET` gives) is
/// refused, not taken as "no authentication".
#[test]
fn an_empty_auth_token_is_refused() {
    let mut env = node_env("worker", 1, 1, free_port());
    env.retain(|(k, _)| k != "PS_AUTH_TOKEN");
    env.push(("PS_AUTH_TOKEN".into(), String::new()));
    let run = run(node_command("connection", &env), Duration::from_secs(10));
    assert_config_error(
        &run,
        "PS_AUTH_TOKEN must be a secret of 1 to 255 bytes (it is set but empty",
    );
}

#[test]
fn unusable_store_bound() {
    let run = node("scheduler", &[("PS_STORE_MAX_VALUE", "64 megs")]);
    assert_config_error(
        &run,
        "PS_STORE_MAX_VALUE must be a number of bytes from 1 to 2147483647, optionally with \
         K, M or G (KiB, MiB, GiB), got \"64 megs\"",
    );
}

#[test]
fn non_numeric_num_server() {
    let run = node("server", &[("DMLC_NUM_SERVER", "two")]);
    assert_config_error(
        &run,
        "DMLC_NUM_SERVER must be a whole number from 1 to 1000000 (or MIN:MAX for servers that \
         join and leave, MIN <= MAX), got \"two\"",
    );
}

#[test]
fn zero_num_server() {
    let run = node("scheduler", &[("DMLC_NUM_SERVER", "0")]);
    assert_config_error(
        &run,
        "DMLC_NUM_SERVER must be a whole number from 1 to 1000000 (or MIN:MAX for servers that \
         join and leave, MIN <= MAX), got \"0\"",
    );
}

/// Every numeric variable is range-checked by one rule: a level above
/// ps-lite's is refused like a word is, naming the range.
#[test]
fn out_of_range_numbers_are_refused_like_words() {
    for (var, value, range) in [
        (
            "PS_VERBOSE",
            "9",
            "a whole number from 0 to 3 (0 warnings, 1 connections, 2 every message; 3, which \
             ps-lite scripts set, is 2)",
        ),
        (
            "PS_VERBOSE",
            "abc",
            "a whole number from 0 to 3 (0 warnings, 1 connections, 2 every message; 3, which \
             ps-lite scripts set, is 2)",
        ),
        ("PS_DROP_MSG", "101", "a percentage from 0 to 100"),
        (
            "PS_HEARTBEAT_INTERVAL",
            "999999999",
            "a whole number of seconds from 0 to 604800 (0 = no heartbeats)",
        ),
        ("PORT", "70000", "a port number from 1 to 65535"),
    ] {
        let run = node("worker", &[(var, value)]);
        assert_config_error(&run, &format!("{var} must be {range}, got {value:?}"));
    }
}

#[test]
fn unknown_role() {
    let run = node("chef", &[]);
    assert_config_error(
        &run,
        "DMLC_ROLE must be scheduler, server or worker, got \"chef\"",
    );
}

#[test]
fn unresolvable_scheduler_host() {
    let run = node("worker", &[("DMLC_PS_ROOT_URI", "no-such-host.invalid")]);
    assert_config_error(
        &run,
        "DMLC_PS_ROOT_URI \"no-such-host.invalid\" does not resolve",
    );
}

#[test]
fn unresolvable_node_host() {
    let run = node("server", &[("DMLC_NODE_HOST", "no-such-host.invalid")]);
    assert_config_error(
        &run,
        "DMLC_NODE_HOST \"no-such-host.invalid\" does not resolve",
    );
}

#[test]
fn scheduler_port_in_use() {
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let run = node("scheduler", &[("DMLC_PS_ROOT_PORT", &port)]);
    assert_eq!(run.code(), Some(1), "{}", run.output());
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.output());
    assert!(
        run.stderr
            .contains(&format!("DMLC_PS_ROOT_PORT {port} is taken")),
        "{}",
        run.output()
    );
    assert!(run.elapsed < Duration::from_secs(5));
}

#[test]
fn missing_node_fails_at_the_start_deadline() {
    // One server and one worker expected; only the server comes.
    let port = free_port();
    let with_timeout = |role| {
        let mut env = node_env(role, 1, 1, port);
        env.push(("PS_START_TIMEOUT".into(), "2".into()));
        // Shows the first "waiting for" line of each node.
        env.push(("PS_VERBOSE".into(), "1".into()));
        spawn(node_command("connection", &env))
    };
    let scheduler = with_timeout("scheduler");
    let server = with_timeout("server");
    let scheduler = scheduler.wait(Duration::from_secs(20));
    let server = server.wait(Duration::from_secs(20));
    assert_eq!(scheduler.code(), Some(1), "{}", scheduler.output());
    assert!(
        scheduler
            .stderr
            .contains("0 of 1 servers and 1 of 1 workers never registered"),
        "{}",
        scheduler.output()
    );
    assert_eq!(server.code(), Some(1), "{}", server.output());
    assert!(
        server.stderr.contains("no node table from the scheduler"),
        "{}",
        server.output()
    );
    // Each names what it waits for: the scheduler the registrations, the
    // server the node table (the scheduler is up: "waiting for the
    // scheduler" would send the user the wrong way).
    assert!(
        scheduler
            .stderr
            .contains("waiting for 1 server and 1 worker to register"),
        "{}",
        scheduler.output()
    );
    assert!(
        server.stderr.contains(&format!(
            "waiting for the node table from the scheduler at 127.0.0.1:{port} (sent once 1 \
             server and 1 worker have registered)"
        )),
        "{}",
        server.output()
    );
    assert!(
        !server.stderr.contains("waiting for the scheduler"),
        "{}",
        server.output()
    );
    for r in [&scheduler, &server] {
        assert!(r.elapsed < Duration::from_secs(10), "took {:?}", r.elapsed);
    }
}

#[test]
fn unreachable_scheduler_fails_at_the_start_deadline() {
    let run = node("worker", &[("PS_START_TIMEOUT", "1")]);
    assert_eq!(run.code(), Some(1), "{}", run.output());
    assert!(
        run.stderr
            .contains("check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT"),
        "{}",
        run.output()
    );
}
