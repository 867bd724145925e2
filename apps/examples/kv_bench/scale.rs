//! The `scale` part: ps-lite's `test_connection` job (every node starts with
//! a barrier and finalizes with a barrier) at 1+100+100, 1+250+250 and
//! 1+500+500 processes on this machine, under `pslite launch`, beside C++
//! ps-lite running the same job (`tests/bench/cxx_kv_bench.cc`'s
//! `connection` mode, given with `--cxx`; built by `tests/bench/summary.py
//! --build-only`), and beside C++ ps-lite's nodes under pslite's scheduler
//! (`--scheduler-program pslite`: C++ peers at every size).
//!
//! Each node prints `BENCH ready_us=T fds=N` once past the start barrier
//! (T since the launch, `PSLITE_LAUNCH_UNIX_NS`; N descriptors open) and
//! `BENCH exit role=R rss_kb=M fds=N` before it exits (M its peak resident
//! memory). The driver prints, per cluster and library, the time from
//! launch to every node past the start barrier and to the launcher's exit,
//! and per role the mean and largest peak memory and descriptors, then
//!
//! ```text
//! RESULT scale 1+100+100 ours_ms=.. cxx_ms=.. ours_exit_ms=.. cxx_exit_ms=.. mixed_ms=.. ...
//! ```
//!
//! (`ours_ms`, `cxx_ms`: launch to every node past the start barrier; `-`
//! where a run failed, with why in the table.) The launcher and the nodes
//! raise their descriptor limits as the job needs (they say so at
//! `PS_VERBOSE=1`); the driver checks the hard limit and the memory first
//! and says what a size needs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pslite::{Error, Postoffice};

use crate::driver::{field, median};
use crate::Args;

/// Servers (and as many workers) of each cluster, by default.
pub(crate) const SIZES: [usize; 3] = [100, 250, 500];

/// About the peak memory of a node that holds nothing yet (either library's,
/// in a cluster of 1+10+10 on this machine: 7-10 MB), in kB.
const BARE_PROCESS_KB: f64 = 8.0 * 1024.0;

/// A small cluster run first (also when sizes are given), so that the
/// memory each library's nodes need is known at two sizes before a large
/// one is tried.
const CALIBRATION: usize = 10;

/// How long one job may take before it is stopped (C++ ps-lite's eager
/// connections take about a minute at 1+250+250 on this machine).
const JOB_TIMEOUT: Duration = Duration::from_secs(900);

/// Node mode `--mode scale`: start, say when past the start barrier,
/// finalize, say the peak memory.
pub(crate) fn node() -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    let fds = open_descriptors();
    println!("BENCH ready_us={} fds={fds}", since_launch_us());
    let role = po.my_node()?.role;
    po.finalize(0, true)?;
    println!(
        "BENCH exit role={role} rss_kb={} fds={fds}",
        peak_rss_kb().unwrap_or(0)
    );
    Ok(())
}

/// Microseconds since the launcher started the job (`PSLITE_LAUNCH_UNIX_NS`).
fn since_launch_us() -> u128 {
    let launched: u128 = std::env::var("PSLITE_LAUNCH_UNIX_NS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    now.saturating_sub(launched) / 1000
}

/// Descriptors this process has open.
fn open_descriptors() -> usize {
    // The directory's own descriptor is among the entries.
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// This process's peak resident memory (`VmHWM`), in kB.
fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Who runs the nodes of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Library {
    /// pslite everywhere (`kv_bench --mode scale`).
    Ours,
    /// C++ ps-lite everywhere.
    Cxx,
    /// C++ ps-lite's servers and workers, pslite's scheduler.
    Mixed,
}

impl Library {
    fn label(self) -> &'static str {
        match self {
            Library::Ours => "pslite",
            Library::Cxx => "C++ ps-lite",
            Library::Mixed => "C++ nodes, pslite scheduler",
        }
    }
}

/// What one job showed.
#[derive(Default)]
struct Job {
    /// Launch to every node past the start barrier, ms.
    ready_ms: Option<f64>,
    /// Launch to the launcher's exit, ms.
    exit_ms: f64,
    /// Peak resident memory (kB) and descriptors, per role.
    per_role: BTreeMap<String, Vec<(u64, u64)>>,
    /// Why it failed, if it did.
    failed: Option<String>,
    /// How it was launched, when not as asked.
    note: Option<String>,
    /// The launcher's last line, when it failed.
    launcher_said: String,
}

/// The `scale` part of the driver.
pub(crate) fn scale(args: &Args, results: &mut Vec<String>) -> Result<(), Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::App(format!("cannot find this program: {e}")))?;
    let pslite = crate::driver::pslite_binary()?;
    let mut sizes: Vec<usize> = if args.scale_sizes.is_empty() {
        SIZES.to_vec()
    } else {
        args.scale_sizes.clone()
    };
    if sizes.first() != Some(&CALIBRATION) {
        sizes.insert(0, CALIBRATION);
    }
    let cxx = args.cxx.as_ref().filter(|p| p.exists());
    if let Some(p) = &args.cxx {
        if cxx.is_none() {
            println!(
                "(no C++ program at {}: build it with tests/bench/summary.py --build-only \
                 --ps-lite DIR)\n",
                p.display()
            );
        }
    }
    println!("## Scale: the connection job (start barrier, finalize barrier)\n");
    println!(
        "Every node a process on this machine ({} cores, {:.1} GB of memory, hard descriptor \
         limit {}); times from launch, {} run(s) each, medians.\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        total_memory_gb().unwrap_or(0.0),
        hard_descriptor_limit().map_or_else(|| "unlimited".to_string(), |l| l.to_string()),
        args.scale_runs
    );
    println!(
        "| cluster | library | all past the start barrier, ms | exit, ms | runs | peak memory per \
         node, MB (mean / max) | descriptors per node (mean / max) |"
    );
    println!("|---|---|---|---|---|---|---|");
    // (size, mean peak memory per node in kB) of the sizes run so far, per
    // library: what the next size is expected to need.
    let mut seen: BTreeMap<&str, Vec<(usize, f64)>> = BTreeMap::new();
    let mut skipped = Vec::new();
    for &n in &sizes {
        let mut figures: BTreeMap<&str, (Option<f64>, Option<f64>)> = BTreeMap::new();
        let mut memory: BTreeMap<&str, String> = BTreeMap::new();
        let mut libraries = vec![Library::Ours];
        if cxx.is_some() {
            libraries.extend([Library::Cxx, Library::Mixed]);
        }
        for lib in libraries {
            if let Some(why) = too_big(n, seen.get(key(lib)).map(Vec::as_slice)) {
                println!("| 1+{n}+{n} | {} | not run: {why} | | 0 | | |", lib.label());
                skipped.push(format!("{} at 1+{n}+{n}: {why}", lib.label()));
                continue;
            }
            let mut jobs = Vec::new();
            for _ in 0..args.scale_runs.max(1) {
                let job = match lib {
                    Library::Ours => {
                        launch(&pslite, n, None, &exe, &["--mode", "scale"], 2 * n + 1)
                    }
                    Library::Cxx => launch_cxx(&pslite, n, cxx.map(PathBuf::as_path)),
                    Library::Mixed => launch(
                        &pslite,
                        n,
                        Some(Path::new("pslite")),
                        cxx.map(PathBuf::as_path).unwrap_or(Path::new("")),
                        &["connection"],
                        2 * n,
                    ),
                };
                let failed = job.failed.is_some();
                jobs.push(job);
                if failed {
                    break; // a size that fails once is not run again
                }
            }
            if let Some(mean) = jobs.last().and_then(Job::mean_rss_kb) {
                seen.entry(key(lib)).or_default().push((n, mean));
            }
            let row = summarize(n, lib, &jobs);
            println!("{}", row.line);
            figures.insert(key(lib), (row.ready, row.exit));
            memory.insert(key(lib), row.memory);
        }
        let show = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
        let get = |k: &str| figures.get(k).copied().unwrap_or((None, None));
        let (ours, cxx_f, mixed) = (get("ours"), get("cxx"), get("mixed"));
        results.push(format!(
            "RESULT scale 1+{n}+{n} ours_ms={} cxx_ms={} ours_exit_ms={} cxx_exit_ms={} \
             mixed_ms={} mixed_exit_ms={} {} {}",
            show(ours.0),
            show(cxx_f.0),
            show(ours.1),
            show(cxx_f.1),
            show(mixed.0),
            show(mixed.1),
            memory.get("ours").cloned().unwrap_or_default(),
            memory
                .get("cxx")
                .map(|m| m.replace("ours_", "cxx_"))
                .unwrap_or_default(),
        ));
    }
    println!();
    for line in skipped {
        println!("- Not run: {line}.");
    }
    Ok(())
}

/// Why a job of 1+`n`+`n` would not fit in this machine's memory, from the
/// mean peak memory per node at the smaller sizes run so far (a straight
/// line through the last two: C++ ps-lite's nodes hold a connection to
/// every node of the other role, so theirs grows with the job); `None` if
/// it fits in 80% of the memory available now, or nothing is known yet.
fn too_big(n: usize, seen: Option<&[(usize, f64)]>) -> Option<String> {
    let seen = seen?;
    let per_node_kb = match seen {
        [] => return None,
        [.., (n0, m0), (n1, m1)] if n1 > n0 => m1 + (m1 - m0) / (n1 - n0) as f64 * (n - n1) as f64,
        // One size known: as if what its nodes hold above a bare process's
        // memory grew in proportion to the job.
        [.., (n1, m1)] => {
            let base = BARE_PROCESS_KB.min(*m1);
            base + (m1 - base) * (n as f64 / *n1 as f64).max(1.0)
        }
    };
    let need_gb = per_node_kb * (2 * n + 1) as f64 / 1024.0 / 1024.0;
    let available_gb = available_memory_gb()?;
    (need_gb > 0.8 * available_gb).then(|| {
        format!(
            "about {need_gb:.0} GB of memory ({:.0} MB per node, extrapolated from the smaller \
             clusters), {available_gb:.0} GB available",
            per_node_kb / 1024.0
        )
    })
}

impl Job {
    /// The mean peak memory of its nodes, kB.
    fn mean_rss_kb(&self) -> Option<f64> {
        let all: Vec<u64> = self
            .per_role
            .values()
            .flat_map(|v| v.iter().map(|x| x.0))
            .collect();
        (!all.is_empty()).then(|| all.iter().sum::<u64>() as f64 / all.len() as f64)
    }
}

fn key(lib: Library) -> &'static str {
    match lib {
        Library::Ours => "ours",
        Library::Cxx => "cxx",
        Library::Mixed => "mixed",
    }
}

struct Row {
    line: String,
    ready: Option<f64>,
    exit: Option<f64>,
    /// `ours_rss_mb=.. ours_fds=..` (the largest per role), for the RESULT line.
    memory: String,
}

fn summarize(n: usize, lib: Library, jobs: &[Job]) -> Row {
    let cluster = format!("1+{n}+{n}");
    let ok: Vec<&Job> = jobs.iter().filter(|j| j.failed.is_none()).collect();
    let notes: Vec<&str> = jobs.iter().filter_map(|j| j.note.as_deref()).collect();
    let note = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes[0])
    };
    if let Some(failed) = jobs.iter().find_map(|j| j.failed.as_deref()) {
        return Row {
            line: format!(
                "| {cluster} | {}{note} | failed: {failed} | | {} | | |",
                lib.label(),
                jobs.len()
            ),
            ready: None,
            exit: None,
            memory: String::new(),
        };
    }
    let mut ready: Vec<f64> = ok.iter().filter_map(|j| j.ready_ms).collect();
    let mut exit: Vec<f64> = ok.iter().map(|j| j.exit_ms).collect();
    let (ready, exit) = (median(&mut ready), median(&mut exit));
    // Memory and descriptors of the last run, per role.
    let mut memory = Vec::new();
    let mut summary = Vec::new();
    if let Some(job) = ok.last() {
        for (role, nodes) in &job.per_role {
            let mean = |f: fn(&(u64, u64)) -> u64| {
                nodes.iter().map(f).sum::<u64>() as f64 / nodes.len().max(1) as f64
            };
            let max = |f: fn(&(u64, u64)) -> u64| nodes.iter().map(f).max().unwrap_or(0);
            let (rss_mean, rss_max) = (mean(|x| x.0) / 1024.0, max(|x| x.0) as f64 / 1024.0);
            let (fd_mean, fd_max) = (mean(|x| x.1), max(|x| x.1));
            memory.push(format!("{role} {rss_mean:.1} / {rss_max:.1}"));
            summary.push(format!("{role} {fd_mean:.0} / {fd_max}"));
        }
    }
    let largest = |role: &str| {
        ok.last().and_then(|j| j.per_role.get(role)).map(|v| {
            (
                v.iter().map(|x| x.0).max().unwrap_or(0) as f64 / 1024.0,
                v.iter().map(|x| x.1).max().unwrap_or(0),
            )
        })
    };
    let mut result = Vec::new();
    for role in ["scheduler", "server", "worker"] {
        if let Some((rss, fds)) = largest(role) {
            result.push(format!("ours_{role}_rss_mb={rss:.1} ours_{role}_fds={fds}"));
        }
    }
    Row {
        line: format!(
            "| {cluster} | {}{note} | {} | {exit:.0} | {} | {} | {} |",
            lib.label(),
            if ready.is_nan() {
                "-".to_string()
            } else {
                format!("{ready:.0}")
            },
            ok.len(),
            memory.join("; "),
            summary.join("; ")
        ),
        ready: (!ready.is_nan()).then_some(ready),
        exit: Some(exit),
        memory: if lib == Library::Mixed {
            String::new()
        } else {
            result.join(" ")
        },
    }
}

/// One job under `pslite launch`: `n` servers and `n` workers of `program
/// args`, the scheduler `scheduler` if given.
fn launch(
    pslite: &Path,
    n: usize,
    scheduler: Option<&Path>,
    program: &Path,
    args: &[&str],
    nodes: usize,
) -> Job {
    let mut cmd = Command::new(pslite);
    // --exit-grace: C++ nodes of 1+250+250 under a loaded machine took
    // more than the default 30 s to exit after the first one did, which the
    // launcher counts as a failure (a server that forgot to finalize).
    cmd.args(["launch", "--timeout", &JOB_TIMEOUT.as_secs().to_string()])
        .args(["--exit-grace", &JOB_TIMEOUT.as_secs().to_string()])
        .args(["--servers", &n.to_string(), "--workers", &n.to_string()]);
    if let Some(s) = scheduler {
        cmd.arg("--scheduler-program").arg(s);
    }
    cmd.arg("--").arg(program).args(args);
    run(cmd, nodes)
}

/// C++ ps-lite's job under `pslite launch`, or, when the launcher's request
/// for node ids crashes C++ ps-lite's scheduler (it takes the unknown
/// command, then dies on SIGSEGV; fixed on the `reliab` branch, not yet on
/// main), its processes started directly, as a shell would.
fn launch_cxx(pslite: &Path, n: usize, cxx: Option<&Path>) -> Job {
    let Some(cxx) = cxx else {
        return Job {
            failed: Some("no C++ program".into()),
            ..Job::default()
        };
    };
    let job = launch(pslite, n, None, cxx, &["connection"], 2 * n + 1);
    match &job.failed {
        Some(_)
            if job
                .launcher_said
                .contains("scheduler was killed by signal 11") =>
        {
            let mut direct = direct(cxx, n);
            direct.note = Some(
                "started directly: the launcher's node-id request crashes C++ ps-lite's \
                 scheduler"
                    .into(),
            );
            direct
        }
        _ => job,
    }
}

/// Runs `cmd` (`pslite launch`) to completion, reading the `BENCH` lines of
/// its `nodes` nodes.
fn run(mut cmd: Command, nodes: usize) -> Job {
    let started = Instant::now();
    let output = match cmd.stdin(Stdio::null()).output() {
        Ok(o) => o,
        Err(e) => {
            return Job {
                failed: Some(format!("cannot run pslite launch: {e}")),
                ..Job::default()
            }
        }
    };
    let exit_ms = started.elapsed().as_secs_f64() * 1e3;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut job = read_lines(stdout.lines(), nodes, exit_ms);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("pslite launch:"))
            .collect();
        job.launcher_said = said.join("\n");
        let why = said
            .iter()
            .rev()
            .find(|l| !l.contains("failed nodes") && !l.contains("  "))
            .copied()
            .unwrap_or("no reason given");
        job.failed = Some(format!("{} ({})", shorten(why), output.status));
    }
    job
}

/// The job's figures from its nodes' `BENCH` lines.
fn read_lines<'a>(lines: impl Iterator<Item = &'a str>, nodes: usize, exit_ms: f64) -> Job {
    let mut job = Job {
        exit_ms,
        ..Job::default()
    };
    let mut ready = Vec::new();
    for line in lines {
        let Some((_, rest)) = line.split_once("BENCH ") else {
            continue;
        };
        if let Some(us) = field(rest, "ready_us").and_then(|v| v.parse::<f64>().ok()) {
            ready.push(us / 1e3);
        }
        if let (Some(role), Some(rss), Some(fds)) = (
            field(rest, "role"),
            field(rest, "rss_kb").and_then(|v| v.parse().ok()),
            field(rest, "fds").and_then(|v| v.parse().ok()),
        ) {
            if rest.starts_with("exit") {
                job.per_role
                    .entry(role.to_string())
                    .or_default()
                    .push((rss, fds));
            }
        }
    }
    if ready.len() == nodes {
        job.ready_ms = ready.into_iter().reduce(f64::max);
    } else {
        job.failed = Some(format!(
            "{} of {nodes} nodes got past the start barrier",
            ready.len()
        ));
    }
    job
}

fn shorten(line: &str) -> String {
    let line = line.trim_start_matches("pslite launch: ");
    if line.len() > 160 {
        let mut end = 160;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &line[..end])
    } else {
        line.to_string()
    }
}

/// C++ ps-lite's job started without the launcher: a scheduler, `n`
/// servers and `n` workers with the `DMLC_*` variables, each process's
/// output to a file; stopped at [`JOB_TIMEOUT`].
fn direct(cxx: &Path, n: usize) -> Job {
    let dir = std::env::temp_dir().join(format!("kv-bench-scale-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return Job {
            failed: Some(format!("cannot create {}: {e}", dir.display())),
            ..Job::default()
        };
    }
    let port = free_port().unwrap_or(9091);
    let launched_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let started = Instant::now();
    let roles = std::iter::once("scheduler")
        .chain(std::iter::repeat_n("server", n))
        .chain(std::iter::repeat_n("worker", n));
    let mut children = Vec::new();
    let mut failed = None;
    for (i, role) in roles.enumerate() {
        let out = match std::fs::File::create(dir.join(format!("{i}.out"))) {
            Ok(f) => f,
            Err(e) => {
                failed = Some(format!("cannot create an output file: {e}"));
                break;
            }
        };
        let spawned = Command::new(cxx)
            .arg("connection")
            .env("DMLC_ROLE", role)
            .env("DMLC_NUM_SERVER", n.to_string())
            .env("DMLC_NUM_WORKER", n.to_string())
            .env("DMLC_PS_ROOT_URI", "127.0.0.1")
            .env("DMLC_PS_ROOT_PORT", port.to_string())
            .env("DMLC_NODE_HOST", "127.0.0.1")
            .env("PSLITE_LAUNCH_UNIX_NS", launched_ns.to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::null())
            .spawn();
        match spawned {
            Ok(child) => children.push(child),
            Err(e) => {
                failed = Some(format!("cannot start node {i}: {e}"));
                break;
            }
        }
    }
    let deadline = started + JOB_TIMEOUT;
    let mut codes = Vec::new();
    for child in &mut children {
        let code = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline && failed.is_none() => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        codes.push(code);
    }
    let exit_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut text = String::new();
    for i in 0..children.len() {
        text.push_str(&std::fs::read_to_string(dir.join(format!("{i}.out"))).unwrap_or_default());
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut job = read_lines(text.lines(), 2 * n + 1, exit_ms);
    if failed.is_none() {
        let bad = codes
            .iter()
            .filter(|c| !c.is_some_and(|s| s.success()))
            .count();
        if bad > 0 {
            failed = Some(format!(
                "{bad} of {} processes failed or were stopped",
                codes.len()
            ));
        }
    }
    if failed.is_some() {
        job.failed = failed;
    }
    job
}

/// A free TCP port on 127.0.0.1 (a race, as for any launcher without
/// reservations; the job fails visibly if another process takes it).
fn free_port() -> Option<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    listener.local_addr().ok().map(|a| a.port())
}

/// A `/proc/meminfo` figure, in GB.
fn meminfo_gb(what: &str) -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix(what))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0 / 1024.0)
}

fn total_memory_gb() -> Option<f64> {
    meminfo_gb("MemTotal:")
}

fn available_memory_gb() -> Option<f64> {
    meminfo_gb("MemAvailable:")
}

fn hard_descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `limit` is.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_max != libc::RLIM_INFINITY).then_some(limit.rlim_max)
}
