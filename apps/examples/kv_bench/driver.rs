//! Driver mode: launches clusters of this program through `pslite launch`, measures raw ZeroMQ at
//! the same sizes in the same run, and prints the tables and `RESULT` lines.

use std::process::Command;

use pslite::Error;

use crate::node::{iterations, sweep_sizes};
use crate::raw::{Raw, RawLayout};
use crate::Args;

/// Keys per request of the `replicas` part.
pub(crate) const REPLICA_SIZES: [usize; 3] = [1, 1_000, 100_000];

/// Launches of each cluster behind a `RESULT replicas` line, alternating
/// `PS_REPLICAS=1` and `2`.
pub(crate) const REPLICA_RUNS: usize = 3;

/// The `replicas` part: push and pull medians at 2 servers + 2 workers with
/// every range on one server (`PS_REPLICAS=1`, ps-lite) and on two (`2`: a
/// push is answered once the backup applied it too), launched alternately.
pub(crate) fn replicas(args: &Args, results: &mut Vec<String>) -> Result<(), Error> {
    println!("## Replicated key ranges: PS_REPLICAS=2 against 1 at 1+2+2 (medians)\n");
    println!(
        "| keys | push µs, k=1 | push µs, k=2 | k=1 / k=2, push | pull µs, k=1 | pull µs, k=2 |"
    );
    println!("|---|---|---|---|---|---|");
    // (k, keys) -> medians of each launch.
    let mut push: std::collections::BTreeMap<(usize, usize), Vec<f64>> = Default::default();
    let mut pull: std::collections::BTreeMap<(usize, usize), Vec<f64>> = Default::default();
    for _ in 0..REPLICA_RUNS {
        for k in [1usize, 2] {
            let k_str = k.to_string();
            let run = launch_with(2, 2, "replicas", args, &[("PS_REPLICAS", &k_str)])?;
            for line in run.lines.iter().filter(|l| l.starts_with("sweep")) {
                let Some(n) = field(line, "keys").and_then(|v| v.parse::<usize>().ok()) else {
                    continue;
                };
                let get = |f| field(line, f).and_then(|v| v.parse::<f64>().ok());
                if let (Some(p), Some(q)) = (get("push_us"), get("pull_us")) {
                    push.entry((k, n)).or_default().push(p);
                    pull.entry((k, n)).or_default().push(q);
                }
            }
        }
    }
    for n in REPLICA_SIZES.into_iter().filter(|&n| n <= args.keys) {
        let m = |map: &mut std::collections::BTreeMap<(usize, usize), Vec<f64>>, k| {
            median(map.entry((k, n)).or_default())
        };
        let (p1, p2, q1, q2) = (
            m(&mut push, 1),
            m(&mut push, 2),
            m(&mut pull, 1),
            m(&mut pull, 2),
        );
        println!(
            "| {n} | {p1:.1} | {p2:.1} | {:.2} | {q1:.1} | {q2:.1} |",
            p1 / p2
        );
        results.push(format!(
            "RESULT replicas 2+2 keys={n} k1_push_us={p1:.1} k2_push_us={p2:.1} \
             push_ratio={:.2} k1_pull_us={q1:.1} k2_pull_us={q2:.1}",
            p1 / p2
        ));
    }
    println!();
    Ok(())
}

/// Launches of each cluster (and raw runs) behind a `RESULT rtt` line.
pub(crate) const RTT_RUNS: usize = 5;

pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub(crate) struct Launched {
    pub(crate) lines: Vec<String>,
}

pub(crate) fn launch(
    servers: usize,
    workers: usize,
    mode: &str,
    args: &Args,
) -> Result<Launched, Error> {
    launch_with(servers, workers, mode, args, &[])
}

/// [`launch`] with extra environment variables for every node.
pub(crate) fn launch_with(
    servers: usize,
    workers: usize,
    mode: &str,
    args: &Args,
    env: &[(&str, &str)],
) -> Result<Launched, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::App(format!("cannot find this program: {e}")))?;
    let output = Command::new(pslite_binary()?)
        .envs(env.iter().copied())
        .args(["launch", "--timeout", "600"])
        .args(["--servers", &servers.to_string()])
        .args(["--workers", &workers.to_string()])
        .arg("--")
        .arg(&exe)
        .args(["--mode", mode])
        .args(["--keys", &args.keys.to_string()])
        .args(["--repeat", &args.repeat.to_string()])
        .args(["--window", &args.window.to_string()])
        .args(["--threads-keys", &args.threads_keys.to_string()])
        .args(args.inline_server.then_some("--inline-server"))
        .output()
        .map_err(|e| Error::App(format!("cannot run pslite launch: {e}")))?;
    if !output.status.success() {
        return Err(Error::App(format!(
            "the {servers}+{workers} {mode} cluster failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_once("BENCH ").map(|(_, rest)| rest.to_string()))
        .collect();
    Ok(Launched { lines })
}

/// The `pslite` binary next to the examples directory.
pub(crate) fn pslite_binary() -> Result<std::path::PathBuf, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::App(format!("cannot find this program: {e}")))?;
    exe.parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("pslite"))
        .filter(|p| p.exists())
        .ok_or_else(|| {
            Error::App(
                "cannot find the pslite binary next to the examples directory; run \
                 `cargo build --release --bins --examples` first"
                    .into(),
            )
        })
}

/// `key=value` fields of a BENCH line.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

pub(crate) fn numbers(s: &str) -> Vec<f64> {
    s.split(',').filter_map(|x| x.parse().ok()).collect()
}

pub(crate) fn driver(args: &Args) -> Result<(), Error> {
    // The raw baseline runs in this process: give it the malloc tuning the
    // launcher gives the nodes, so both sides are measured alike.
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        let status = Command::new(
            std::env::current_exe()
                .map_err(|e| Error::App(format!("cannot find this program: {e}")))?,
        )
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
        .status()
        .map_err(|e| Error::App(format!("cannot re-run this program: {e}")))?;
        return if status.success() {
            Ok(())
        } else {
            Err(Error::App(format!("kv_bench failed: {status}")))
        };
    }
    let only = args.only.as_deref();
    let want = |part: &str| only.is_none_or(|o| o == part);
    println!("# pslite kv_bench\n");
    println!(
        "{} cores, keys {} (12 bytes each on a push), {} rounds, window {}, servers answer on {}, \
         GLIBC_TUNABLES={}\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.keys,
        args.repeat,
        args.window,
        if args.inline_server {
            "the receive thread"
        } else {
            "the app's thread"
        },
        std::env::var("GLIBC_TUNABLES").unwrap_or_default()
    );
    let mut raw = Raw::new(args.raw_layout);
    let mut raw_ipc = Raw::new(args.raw_layout);
    raw_ipc.ipc = true;
    let mut results = Vec::new();
    if want("cxx") {
        println!(
            "## C++ ps-lite's workload: {} keys, push then pull\n",
            args.keys
        );
        println!(
            "Raw ZeroMQ: the same bytes over the same sockets (a DEALER per peer to each node's \
             ROUTER, requests split over the servers, a pull answered with its keys echoed and \
             the values), as many workers and servers, {}.\n",
            match args.raw_layout {
                RawLayout::Processes => "each a process",
                RawLayout::Threads => "as threads of this process",
            }
        );
        println!("| cluster | push ms | pull ms | push GB/s | raw push ms | raw pull ms | ours / raw, push | ours / raw, pull | misaligned frames copied |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for (s, w) in [(1, 1), (2, 2)] {
            let run = launch(s, w, "cxx", args)?;
            let rounds = args.repeat.max(3);
            let raw_push = raw.round_trip_us(s, w, s, args.keys * 12, 16, rounds)? / 1e3;
            let raw_pull = raw.pull_us(s, w, s, args.keys * 8, args.keys * 4, rounds)? / 1e3;
            for (name, label) in [("cxx", ""), ("cxx_fresh", ", fresh values")] {
                let mut push = Vec::new();
                let mut pull = Vec::new();
                let mut misaligned = 0.0f64;
                let mine = run
                    .lines
                    .iter()
                    .filter(|l| l.split_whitespace().next() == Some(name));
                for line in mine {
                    push.extend(field(line, "push_ms").map(numbers).unwrap_or_default());
                    pull.extend(field(line, "pull_ms").map(numbers).unwrap_or_default());
                    misaligned += field(line, "misaligned")
                        .and_then(|m| m.parse::<f64>().ok())
                        .unwrap_or(0.0);
                }
                let (p, q) = (median(&mut push), median(&mut pull));
                println!(
                    "| 1+{s}+{w}{label} | {p:.1} | {q:.1} | {:.2} | {raw_push:.1} | {raw_pull:.1} | {:.2} | {:.2} | {misaligned} |",
                    (args.keys * 12) as f64 / (p / 1e3) / 1e9,
                    p / raw_push,
                    q / raw_pull,
                );
                results.push(format!(
                    "RESULT {name} {s}+{w} push_ms={p:.1} pull_ms={q:.1} raw_push_ms={raw_push:.1} \
                     raw_pull_ms={raw_pull:.1}"
                ));
            }
        }
        println!();
    }
    if want("sweep") {
        for (s, w) in [(1, 1), (2, 2)] {
            println!("## Sweep at 1+{s}+{w} (per worker, medians)\n");
            println!(
                "| keys | push µs | pull µs | push GB/s | raw push µs | ours / raw, push | pushes/s, {} in flight |",
                args.window
            );
            println!("|---|---|---|---|---|---|---|");
            let run = launch(s, w, "sweep", args)?;
            for n in sweep_sizes(args.keys) {
                let mut push = Vec::new();
                let mut pull = Vec::new();
                let mut rps = Vec::new();
                for line in run
                    .lines
                    .iter()
                    .filter(|l| l.starts_with("sweep") && field(l, "keys") == Some(&n.to_string()))
                {
                    push.extend(field(line, "push_us").and_then(|v| v.parse::<f64>().ok()));
                    pull.extend(field(line, "pull_us").and_then(|v| v.parse::<f64>().ok()));
                    rps.extend(field(line, "rps").and_then(|v| v.parse::<f64>().ok()));
                }
                let (p, q) = (median(&mut push), median(&mut pull));
                let raw_us = raw.round_trip_us(s, w, s.min(n), n * 12, 16, iterations(n))?;
                let rps = median(&mut rps);
                println!(
                    "| {n} | {p:.1} | {q:.1} | {:.3} | {raw_us:.1} | {:.2} | {} |",
                    (n * 12) as f64 / (p / 1e6) / 1e9,
                    p / raw_us,
                    if rps > 0.0 {
                        format!("{rps:.0}")
                    } else {
                        "-".into()
                    }
                );
            }
            println!();
        }
    }
    if want("rtt") {
        let ipc_off = ["PS_IPC", "PS_SHM"]
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|x| x.trim() == "0"));
        println!(
            "## 1-key push round trip (µs; pslite, raw ZeroMQ over TCP and raw ZeroMQ over \
             ipc alternating, {RTT_RUNS} runs each, medians of 2000 round trips per run; \
             pslite's nodes talk over {})\n",
            if ipc_off {
                "TCP (PS_IPC=0 or PS_SHM=0)"
            } else {
                "ipc (same host)"
            }
        );
        println!(
            "| cluster | pslite, runs | raw TCP, runs | raw ipc, runs | pslite median | raw TCP median | raw ipc median | ours / raw TCP | ours / raw ipc | Rust allocations per round trip, worker / server |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for (s, w) in [(1, 1), (2, 2)] {
            let (mut ours, mut raws, mut ipcs) = (Vec::new(), Vec::new(), Vec::new());
            let mut allocs = String::from("-");
            for _ in 0..RTT_RUNS {
                let run = launch(s, w, "rtt", args)?;
                let count = |prefix: &str| {
                    run.lines
                        .iter()
                        .filter(|l| l.starts_with(prefix))
                        .find_map(|l| field(l, "push_allocs"))
                        .unwrap_or("-")
                        .to_string()
                };
                allocs = format!("{} / {}", count("sweep"), count("server"));
                let mut push: Vec<f64> = run
                    .lines
                    .iter()
                    .filter(|l| l.starts_with("sweep"))
                    .filter_map(|l| field(l, "push_us").and_then(|v| v.parse().ok()))
                    .collect();
                ours.push(median(&mut push));
                raws.push(raw.round_trip_us(s, w, 1, 12, 16, iterations(1))?);
                ipcs.push(raw_ipc.round_trip_us(s, w, 1, 12, 16, iterations(1))?);
            }
            let show = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (o_runs, r_runs, i_runs) = (show(&ours), show(&raws), show(&ipcs));
            let (o, r, i) = (median(&mut ours), median(&mut raws), median(&mut ipcs));
            println!(
                "| 1+{s}+{w} | {o_runs} | {r_runs} | {i_runs} | {o:.1} | {r:.1} | {i:.1} | {:.2} | \
                 {:.2} | {allocs} |",
                o / r,
                o / i
            );
            results.push(format!("RESULT rtt {s}+{w} ours_us={o:.1} raw_us={r:.1}"));
        }
        println!();
    }
    if want("replicas") {
        replicas(args, &mut results)?;
    }
    if want("startup") {
        println!("## Start-up: launch to every node past the start barrier\n");
        println!("| cluster | median of 5 launches (ms) | slowest launch (ms) |");
        println!("|---|---|---|");
        for (s, w) in [(2, 2), (32, 32), (100, 100)] {
            let mut samples = Vec::new();
            for _ in 0..5 {
                let run = launch(s, w, "startup", args)?;
                let last = run
                    .lines
                    .iter()
                    .filter_map(|l| field(l, "ready_us").and_then(|v| v.parse::<f64>().ok()))
                    .fold(0.0f64, f64::max);
                samples.push(last / 1e3);
            }
            let slowest = samples.iter().copied().fold(0.0f64, f64::max);
            println!("| 1+{s}+{w} | {:.1} | {slowest:.1} |", median(&mut samples));
        }
        println!();
    }
    if only == Some("scale") {
        crate::scale::scale(args, &mut results)?;
    }
    if only == Some("server_threads") {
        crate::threads::server_threads(args, &mut results)?;
    }
    if !results.is_empty() {
        println!(
            "## Machine-readable\n\n```text\n{}\n```\n",
            results.join("\n")
        );
    }
    if only == Some("raw") {
        println!("## Raw ZeroMQ round trips (one pair)\n");
        println!("| bytes | µs |\n|---|---|");
        for n in sweep_sizes(args.keys) {
            println!(
                "| {} | {:.1} |",
                n * 12,
                raw.round_trip_us(1, 1, 1, n * 12, 16, iterations(n))?
            );
        }
    }
    Ok(())
}
