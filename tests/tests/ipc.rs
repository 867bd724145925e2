//! Same-host pslite peers over ZeroMQ `ipc://` (`PS_IPC`), as real
//! processes: nodes of one host reach each other over their abstract Unix
//! sockets and the job is exact; `PS_IPC=0` (or `PS_SHM=0`) keeps TCP, and
//! a peer that runs with `PS_IPC=0` is reached over TCP by the others; a
//! node killed with SIGKILL leaves no socket name behind, and none is ever
//! a file.

use std::time::Duration;

use pslite_tests::{
    free_port, node_command, node_env_with, spawn_node, spawn_with_stdin, wait_all_ok, within,
    Launch, Run,
};

/// The endpoints of the "connecting to node N at ENDPOINT" lines (PS_VERBOSE=1)
/// of `output`, as (N, ENDPOINT), without the first contact with the
/// scheduler (always TCP: its process is not known yet).
fn connections(output: &str) -> Vec<(i32, String)> {
    output
        .lines()
        .filter_map(|l| l.split_once("connecting to node ").map(|(_, r)| r))
        .filter_map(|r| {
            let (id, endpoint) = r.split_once(" at ")?;
            Some((id.parse().ok()?, endpoint.trim().to_string()))
        })
        .filter(|(id, endpoint)| !(*id == 1 && endpoint.starts_with("tcp://")))
        .collect()
}

fn kv_app(extra: &[(&str, &str)]) -> Run {
    let mut launch = Launch::example("kv_app", 2, 2)
        .env("KV_APP_KEYS", "20000")
        .env("KV_APP_REPEAT", "5")
        .env("PS_VERBOSE", "1")
        .timeout(Duration::from_secs(90));
    for (k, v) in extra {
        launch = launch.env(k, v);
    }
    launch.run()
}

fn assert_exact(run: &Run, workers: usize) {
    run.assert_ok();
    assert_eq!(
        run.stdout.matches("sums exact").count(),
        workers,
        "{}",
        run.output()
    );
}

#[test]
fn same_host_peers_connect_over_ipc_and_ps_ipc_0_or_ps_shm_0_keeps_tcp() {
    let run = kv_app(&[]);
    assert_exact(&run, 2);
    let out = run.output();
    let conns = connections(&out);
    // Scheduler to 4 nodes, each node to the scheduler, workers to both
    // servers, servers to both workers, at least.
    assert!(conns.len() >= 4 + 4 + 4 + 4, "{conns:?}\n{out}");
    for (id, endpoint) in &conns {
        assert!(
            endpoint.starts_with("ipc://@pslite-"),
            "node {id} reached at {endpoint}, not over ipc:\n{out}"
        );
    }

    for off in [("PS_IPC", "0"), ("PS_SHM", "0")] {
        let run = kv_app(&[off]);
        assert_exact(&run, 2);
        let out = run.output();
        assert!(!out.contains("ipc://"), "{off:?}:\n{out}");
        assert!(connections(&out).len() >= 12, "{off:?}:\n{out}");
    }
}

#[test]
fn a_peer_with_ps_ipc_0_is_reached_over_tcp() {
    let port = free_port();
    let verbose = [("PS_VERBOSE", "1")];
    let scheduler = spawn_node("kv_app", "scheduler", 1, 1, port, &verbose);
    let server = spawn_node(
        "kv_app",
        "server",
        1,
        1,
        port,
        &[("PS_VERBOSE", "1"), ("PS_IPC", "0")],
    );
    let worker = spawn_node("kv_app", "worker", 1, 1, port, &verbose);
    let runs = wait_all_ok([scheduler, server, worker], Duration::from_secs(90));
    let (sched, server, worker) = (runs[0].output(), runs[1].output(), runs[2].output());
    assert!(worker.contains("sums exact"), "{worker}");
    let worker_conns = connections(&worker);
    let to = |conns: &[(i32, String)], id: i32| -> Vec<String> {
        conns
            .iter()
            .filter(|(n, _)| *n == id)
            .map(|(_, e)| e.clone())
            .collect()
    };
    // The server (id 8) listens on TCP only: the others reach it there.
    let w8 = to(&worker_conns, 8);
    assert!(
        !w8.is_empty() && w8.iter().all(|e| e.starts_with("tcp://")),
        "{worker}"
    );
    let s8 = to(&connections(&sched), 8);
    assert!(
        !s8.is_empty() && s8.iter().all(|e| e.starts_with("tcp://")),
        "{sched}"
    );
    // The worker (9) and the scheduler (1) reach each other over ipc.
    assert!(
        to(&worker_conns, 1)
            .iter()
            .all(|e| e.starts_with("ipc://@")),
        "{worker}"
    );
    // The server does not use ipc at all.
    assert!(!server.contains("ipc://"), "{server}");
}

/// Unix socket names in use (`/proc/net/unix`, abstract ones with a
/// leading `@`) that mention pslite.
fn pslite_socket_names() -> Vec<String> {
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|name| name.contains("pslite-"))
        .map(str::to_string)
        .collect()
}

/// Whether a socket name of process `pid` is in use.
fn has_name(pid: u32) -> bool {
    let needle = format!("-{pid}-");
    pslite_socket_names().iter().any(|n| n.contains(&needle))
}

#[test]
fn a_node_killed_with_sigkill_leaves_no_socket_name_behind() {
    let port = free_port();
    let env = |role: &str| {
        node_env_with(
            role,
            1,
            1,
            port,
            &[("PS_VERBOSE", "1"), ("KV_APP_WAIT_STDIN", "1")],
        )
    };
    let scheduler = spawn_with_stdin(node_command("kv_app", &env("scheduler")));
    let server = spawn_with_stdin(node_command("kv_app", &env("server")));
    let worker = spawn_with_stdin(node_command("kv_app", &env("worker")));
    worker
        .wait_for_line("ready", Duration::from_secs(60))
        .expect("the cluster did not form");
    let pids = [scheduler.pid(), server.pid(), worker.pid()];
    for pid in pids {
        assert!(
            has_name(pid),
            "no socket name of {pid}: {:?}",
            pslite_socket_names()
        );
    }
    // Abstract names only: nothing on the filesystem.
    let names = pslite_socket_names();
    assert!(names.iter().all(|n| n.starts_with("@pslite-")), "{names:?}");

    let dead = server.pid();
    server.signal(libc::SIGKILL);
    let run = server.wait(Duration::from_secs(10));
    assert!(!run.timed_out);
    assert!(
        within(Duration::from_secs(10), || !has_name(dead)),
        "the killed server's socket name outlived it: {:?}",
        pslite_socket_names()
    );
    assert!(has_name(worker.pid()) && has_name(scheduler.pid()));
    for node in [worker, scheduler] {
        let pid = node.pid();
        node.signal(libc::SIGKILL);
        assert!(!node.wait(Duration::from_secs(10)).timed_out);
        assert!(
            within(Duration::from_secs(10), || !has_name(pid)),
            "{:?}",
            pslite_socket_names()
        );
    }
}

/// The ports of the "ROLE listening on HOST:PORT" lines of `output`.
fn listening_ports(output: &str) -> Vec<u16> {
    output
        .lines()
        .filter_map(|l| l.split_once(" listening on ").map(|(_, r)| r))
        .filter_map(|r| r.trim().rsplit(':').next()?.parse().ok())
        .collect()
}

#[test]
fn dmlc_local_nodes_remove_their_socket_files_when_they_exit() {
    let run = kv_app(&[("DMLC_LOCAL", "1")]);
    assert_exact(&run, 2);
    let ports = listening_ports(&run.output());
    assert_eq!(ports.len(), 5, "{}", run.output());
    let left: Vec<String> = ports
        .iter()
        .map(|p| format!("/tmp/{p}"))
        .filter(|path| std::path::Path::new(path).exists())
        .collect();
    assert!(
        left.is_empty(),
        "socket files left after a clean exit: {left:?}"
    );
}
