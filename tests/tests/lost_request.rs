//! A request that no server answers is not a silent hang (real processes):
//! after `PS_REQUEST_WARN` the worker logs the request's timestamp and the
//! server that owes the answer, and again each time the wait doubles.

use std::time::Duration;

use pslite_tests::{free_port, spawn_node as node};

#[test]
fn a_request_no_server_answers_is_logged_naming_the_server_and_timestamp() {
    let port = free_port();
    let env = [
        ("PS_REQUEST_WARN", "1"),
        ("KV_APP_UNANSWERED", "1"),
        ("KV_APP_KEYS", "10"),
        ("KV_APP_REPEAT", "3"),
    ];
    let n = |role| node("kv_app", role, 1, 1, port, &env);
    let nodes = [n("scheduler"), n("server"), n("worker")];
    let [_, server, worker] = &nodes;
    let limit = Duration::from_secs(60);
    let dropped = server.wait_for_line("unanswered", limit);
    let first = worker.wait_for_line("request 0 has waited", limit);
    let again = worker.wait_for_line("request 0 has waited 2 s", Duration::from_secs(10));
    let runs: Vec<_> = nodes
        .into_iter()
        .map(|p| {
            p.signal(libc::SIGKILL);
            p.wait(Duration::from_secs(10))
        })
        .collect();
    let output = || {
        runs.iter()
            .map(|r| r.output())
            .collect::<Vec<_>>()
            .join("\n")
    };
    // The server left the worker's first request (timestamp 0) unanswered.
    let dropped =
        dropped.unwrap_or_else(|| panic!("the server answered everything:\n{}", output()));
    assert!(dropped.contains("request 0 of node 9"), "{dropped}");
    let first = first.unwrap_or_else(|| panic!("no warning within {limit:?}:\n{}", output()));
    assert!(first.contains("WARN"), "{first}");
    assert!(first.contains("app 0 customer 0"), "{first}");
    assert!(first.contains("request 0 has waited 1 s"), "{first}");
    assert!(first.contains("no answer yet from server 8"), "{first}");
    assert!(first.contains("PS_REQUEST_WARN"), "{first}");
    again.unwrap_or_else(|| panic!("the warning was not repeated:\n{}", output()));
}
