//! The shared-memory data path between pslite nodes of one host, as real
//! processes: exact data across it at many sizes (and the same results
//! with `PS_SHM=0`, which turns it off), no segment left behind when a
//! worker or a server is killed with SIGKILL mid-transfer, and forged
//! descriptors from a raw ZeroMQ peer dropped without harm.

use std::time::Duration;

use pslite_tests::{
    assert_all_ok, free_port, kv_push, node_command, node_env, spawn, spawn_with_stdin, within,
    Launch, Run, Spawned,
};

/// The numbers of the nodes' exit lines "shared memory: sent N frames (B
/// bytes), received M, F sent over ZeroMQ for want of a free segment, R
/// descriptors rejected; S bytes of segments, H frames sent again without a
/// copy", summed over the nodes: (N, M, F, R, H).
fn shm_totals(output: &str) -> (u64, u64, u64, u64, u64) {
    let mut t = (0, 0, 0, 0, 0);
    for line in output.lines() {
        let Some((_, rest)) = line.split_once("shared memory: sent") else {
            continue;
        };
        let n: Vec<u64> = rest
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        assert_eq!(n.len(), 7, "unexpected exit line {line:?}");
        t = (t.0 + n[0], t.1 + n[2], t.2 + n[3], t.3 + n[4], t.4 + n[6]);
    }
    t
}

fn kv_app(servers: usize, workers: usize, keys: usize, shm: Option<&str>) -> Run {
    let mut launch = Launch::example("kv_app", servers, workers)
        .env("KV_APP_KEYS", &keys.to_string())
        .env("KV_APP_REPEAT", "12")
        .env("PS_VERBOSE", "1")
        .timeout(Duration::from_secs(90));
    if let Some(v) = shm {
        launch = launch.env("PS_SHM", v);
    }
    launch.run()
}

fn assert_exact(run: &Run, workers: usize) {
    run.assert_ok();
    let exact = run.stdout.matches("sums exact").count();
    assert_eq!(exact, workers, "{}", run.output());
    assert!(!run.output().contains("panicked"), "{}", run.output());
}

#[test]
fn frames_of_every_size_cross_shared_memory_exact_and_ps_shm_0_gives_the_same() {
    // Keys per server and request: 500 (all frames small, over ZeroMQ),
    // 10 000 (80 KB of keys in shared memory, 40 KB of values over ZeroMQ),
    // 75 000 and 150 000 (every frame in shared memory).
    for (servers, workers, keys) in [
        (2, 2, 1_000),
        (2, 2, 20_000),
        (1, 1, 75_000),
        (2, 2, 300_000),
    ] {
        let run = kv_app(servers, workers, keys, None);
        assert_exact(&run, workers);
        let out = run.output();
        assert!(out.contains("shares this host"), "{out}");
        let (sent, received, _, rejected, _) = shm_totals(&out);
        assert_eq!(rejected, 0, "{out}");
        if keys == 1_000 {
            assert_eq!(sent, 0, "small frames stay on ZeroMQ:\n{out}");
        } else {
            assert!(
                sent > 0,
                "{keys} keys: nothing went through shared memory:\n{out}"
            );
            assert_eq!(sent, received, "{out}");
        }
    }
    // Resent and dropped messages (PS_RESEND, PS_DROP_MSG): a dropped
    // message frees its segment, a resent one takes a new one.
    let run = Launch::example("kv_app", 2, 2)
        .env("KV_APP_KEYS", "300000")
        .env("KV_APP_REPEAT", "12")
        .env("PS_VERBOSE", "1")
        .env("PS_RESEND", "1")
        .env("PS_RESEND_TIMEOUT", "300")
        .env("PS_DROP_MSG", "10")
        .timeout(Duration::from_secs(90))
        .run();
    assert_exact(&run, 2);
    let (sent, _, _, rejected, _) = shm_totals(&run.output());
    assert!(sent > 0 && rejected == 0, "{}", run.output());

    let run = kv_app(2, 2, 300_000, Some("0"));
    assert_exact(&run, 2);
    let out = run.output();
    assert!(!out.contains("shares this host"), "{out}");
    assert!(!out.contains("shared memory:"), "{out}");
}

#[test]
fn one_key_array_pushed_again_with_fresh_values_is_sent_once_and_sums_stay_exact() {
    // 150 000 keys per server and request: keys (1.2 MB) and values
    // (600 KB) in shared memory. Each worker pushes its one key array 12
    // times with fresh values, then pulls: the keys go to each server
    // without a copy after the first time, the values are copied every
    // time. Then the same with dropped and resent messages.
    for resend in [false, true] {
        let mut launch = Launch::example("kv_app", 2, 2)
            .env("KV_APP_KEYS", "300000")
            .env("KV_APP_REPEAT", "12")
            .env("KV_APP_SAME_KEYS", "1")
            .env("PS_VERBOSE", "1")
            .timeout(Duration::from_secs(90));
        if resend {
            launch = launch
                .env("PS_RESEND", "1")
                .env("PS_RESEND_TIMEOUT", "300")
                .env("PS_DROP_MSG", "10");
        }
        let run = launch.run();
        assert_exact(&run, 2);
        let out = run.output();
        assert_eq!(
            run.stdout
                .matches("same keys, fresh values: sums exact")
                .count(),
            2,
            "{out}"
        );
        let (sent, received, _, rejected, again) = shm_totals(&out);
        assert_eq!(rejected, 0, "{out}");
        // 2 workers x 2 servers x (12 pushes + 1 pull - the first copy).
        assert!(
            again >= 48,
            "keys sent again {again} times without a copy:\n{out}"
        );
        assert!(again < sent, "values are copied every time:\n{out}");
        if !resend {
            assert_eq!(sent, received, "{out}");
        }
    }
}

/// A 2 + 2 job with 30 000 keys (120 KB of keys per server and request in
/// shared memory) run with `ulimit -n` set to `open_files`.
fn kv_app_with_open_files(open_files: u64) -> Run {
    use std::os::unix::process::CommandExt;
    let launch = Launch::example("kv_app", 2, 2)
        .env("KV_APP_KEYS", "30000")
        .env("PS_VERBOSE", "1")
        .timeout(Duration::from_secs(90));
    let mut cmd = launch.command();
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the
    // child between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: open_files,
                rlim_max: open_files,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    pslite_tests::run(cmd, launch.timeout + Duration::from_secs(15))
}

#[test]
fn descriptors_are_bounded_and_a_job_is_exact_under_ulimit_n_1024_and_128() {
    // At 128, pools without a descriptor bound took every descriptor they
    // could: receivers could not open segments, dropped data frames ("Too
    // many open files") and the job hung.
    for open_files in [1024, 128] {
        let run = kv_app_with_open_files(open_files);
        assert_exact(&run, 2);
        let output = run.output();
        let (sent, received, _fallbacks, rejected, _) = shm_totals(&output);
        assert!(sent > 0, "shared memory was used:\n{output}");
        assert_eq!(received, sent, "every frame arrived:\n{output}");
        assert_eq!(rejected, 0, "{output}");
        for line in ["Too many open files", "bad shared-memory descriptor"] {
            assert!(
                !output.contains(line),
                "{line:?} at ulimit -n {open_files}:\n{output}"
            );
        }
    }
}

#[test]
fn shm_totals_reads_the_exit_line() {
    let line = "[worker 0] 2026-11-23T12:00:00.000Z INFO  shared memory: sent 12 frames (999 \
                bytes), received 7, 3 sent over ZeroMQ for want of a free segment, 2 \
                descriptors rejected; 4096 bytes of segments, 5 frames sent again without a copy";
    assert_eq!(
        shm_totals(&format!("{line}\n{line}\nother")),
        (24, 14, 6, 4, 10)
    );
}

/// Processes that map a segment created by process `pid`.
fn mapping_holders(pid: u32) -> Vec<u32> {
    let needle = format!("pslite-shm-{pid}-");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/maps"))
                .is_ok_and(|maps| maps.contains(&needle))
        })
        .collect()
}

/// Entries of /dev/shm whose name mentions pslite.
fn dev_shm_pslite() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("pslite"))
                .collect()
        })
        .unwrap_or_default()
}

/// A 1 + 1 kv_bench cluster pushing and pulling 400 000 keys over and
/// over, the same arrays every time (both directions in shared memory, sent
/// once and then as descriptors of cached segments that the receiver holds
/// views of when the kill comes); kills `victim` with SIGKILL
/// once each side maps the other's segments and checks that no process
/// maps the victim's segments afterwards, that the survivors end, and that
/// nothing of ours is in /dev/shm.
fn kill_mid_transfer(victim: &str) {
    let before = dev_shm_pslite();
    let port = free_port();
    let node = |role: &str| {
        let mut env = node_env(role, 1, 1, port);
        env.push(("PS_HEARTBEAT_TIMEOUT".into(), "3".into()));
        env.push(("PS_RECOVERY_TIMEOUT".into(), "2".into()));
        let mut cmd = node_command("kv_bench", &env);
        cmd.args(["--mode", "cxx", "--keys", "400000", "--repeat", "1000000"]);
        spawn(cmd)
    };
    let scheduler = node("scheduler");
    let server = node("server");
    let worker = node("worker");
    let (s, w) = (server.pid(), worker.pid());
    assert!(
        within(Duration::from_secs(60), || mapping_holders(w).contains(&s)
            && mapping_holders(s).contains(&w)),
        "the server and the worker never mapped each other's segments"
    );
    let (killed, survivors): (Spawned, Vec<Spawned>) = if victim == "worker" {
        (worker, vec![scheduler, server])
    } else {
        (server, vec![scheduler, worker])
    };
    let dead = killed.pid();
    killed.signal(libc::SIGKILL);
    drop(killed.wait(Duration::from_secs(10)));
    assert!(
        within(Duration::from_secs(10), || mapping_holders(dead).is_empty()),
        "processes {:?} still map segments of the killed {victim}",
        mapping_holders(dead)
    );
    let pids: Vec<u32> = survivors.iter().map(Spawned::pid).collect();
    for node in survivors {
        let run = node.wait(Duration::from_secs(60));
        assert!(!run.timed_out, "a survivor hung:\n{}", run.output());
        assert!(!run.output().contains("panicked"), "{}", run.output());
        // What the victim sent before it died names segments that went with
        // it: dropped, one line, never taken for a forged descriptor.
        assert!(
            !run.output().contains("bad shared-memory descriptor"),
            "{}",
            run.output()
        );
        assert!(
            run.output().matches("sent before its process").count() <= 1,
            "{}",
            run.output()
        );
    }
    for pid in pids.into_iter().chain([s, w]) {
        assert!(
            mapping_holders(pid).is_empty(),
            "segments of {pid} outlive it"
        );
    }
    let after = dev_shm_pslite();
    assert_eq!(before, after, "/dev/shm gained entries of ours");
}

#[test]
fn a_worker_killed_mid_transfer_leaves_no_segment_behind() {
    kill_mid_transfer("worker");
}

#[test]
fn a_server_killed_mid_transfer_leaves_no_segment_behind() {
    kill_mid_transfer("server");
}

/// A raw ZeroMQ peer connected to `port` as `identity`.
fn attacker(identity: &str, port: u16) -> (zmq::Context, zmq::Socket) {
    let ctx = zmq::Context::new();
    let socket = ctx.socket(zmq::DEALER).unwrap();
    socket.set_identity(identity.as_bytes()).unwrap();
    socket.set_sndtimeo(10_000).unwrap();
    socket.set_linger(5_000).unwrap();
    socket.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    (ctx, socket)
}

#[test]
fn forged_shared_memory_descriptors_are_dropped_and_the_job_stays_exact() {
    use pslite::proto::shm::ShmFrame;
    let port = free_port();
    // Servers get ids 8 and 10 in port order; 8 is attacked.
    let (a, b) = loop {
        let (a, b) = (free_port(), free_port());
        if a != b {
            break (a.min(b), a.max(b));
        }
    };
    let env = |role: &str, extra: Option<u16>| {
        let mut e = node_env(role, 2, 2, port);
        e.push(("KV_APP_WAIT_STDIN".into(), "1".into()));
        e.push(("KV_APP_REPEAT".into(), "10".into()));
        e.push(("KV_APP_KEYS".into(), "40000".into()));
        e.push(("PS_VERBOSE".into(), "1".into()));
        if let Some(p) = extra {
            e.push(("PORT".into(), p.to_string()));
        }
        e
    };
    let scheduler = spawn(node_command("kv_app", &env("scheduler", None)));
    let servers = [a, b].map(|p| spawn(node_command("kv_app", &env("server", Some(p)))));
    let mut workers: Vec<Spawned> = (0..2)
        .map(|_| spawn_with_stdin(node_command("kv_app", &env("worker", None))))
        .collect();
    for w in &workers {
        w.wait_for_line("ready", Duration::from_secs(60))
            .expect("the cluster did not form");
    }
    // From ps10 (the other server: a same-host pslite node, so its pid is
    // in the table) and from ps77 (no node): pushes whose frames claim to
    // be in shared memory, naming fds that are not segments, wrong tokens,
    // generations and bounds, and frames that do not exist.
    let keys: Vec<u8> = (0..10_000u64).flat_map(|k| (k * 7).to_le_bytes()).collect();
    let push = |ts: i32| kv_push(ts, keys.clone(), Vec::new());
    let mut forged = Vec::new();
    for fd in [-1, 0, 1, 2, 3, 5, 8, 13, 21, 34, 1 << 20] {
        forged.push(ShmFrame {
            index: 1,
            fd,
            token: 0x5eed,
            generation: 1,
            offset: 0,
            length: 40_000,
        });
    }
    for (index, offset, length, generation) in [
        (7, 0, 10, 1),
        (0, 0, 10, 1),
        (1, u64::MAX, 2, 1),
        (1, 0, u64::MAX, 1),
        (1, 0, 10, 0),
    ] {
        forged.push(ShmFrame {
            index,
            fd: 3,
            token: 1,
            generation,
            offset,
            length,
        });
    }
    let mut sent = 0;
    for identity in ["ps10", "ps77"] {
        let (_ctx, socket) = attacker(identity, a);
        for (ts, frame) in forged.iter().enumerate() {
            let msg = push(ts as i32);
            let mut frames = vec![msg.meta.encode_with_shm(std::slice::from_ref(frame))];
            frames.extend(msg.data.iter().map(|d| d.to_vec()));
            socket
                .send_multipart(frames, 0)
                .expect("the server stopped reading");
            sent += 1;
        }
    }
    for w in &mut workers {
        w.write_stdin("go\n");
    }
    let mut runs = vec![scheduler.wait(Duration::from_secs(120))];
    runs.extend(servers.map(|s| s.wait(Duration::from_secs(120))));
    runs.extend(
        workers
            .into_iter()
            .map(|w| w.wait(Duration::from_secs(120))),
    );
    assert_all_ok(&runs);
    for run in &runs {
        assert!(!run.output().contains("panicked"), "{}", run.output());
    }
    for worker in &runs[3..] {
        assert!(worker.stdout.contains("sums exact"), "{}", worker.output());
    }
    let attacked = runs[1].output();
    assert!(
        attacked.contains("bad shared-memory descriptor"),
        "{attacked}"
    );
    assert_eq!(shm_totals(&attacked).3, sent, "{attacked}");
    // One warning per forging sender: a peer cannot flood the log.
    assert_eq!(
        attacked
            .lines()
            .filter(|l| l.contains("bad shared-memory descriptor")
                && l.contains("(further ones are logged at debug level)"))
            .count(),
        2,
        "{attacked}"
    );
}
