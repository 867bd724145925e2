//! Checkpoints (`PS_CHECKPOINT_DIR`) with real processes on 127.0.0.1: a
//! job pushes, `pslite checkpoint` writes its state at a barrier, the whole
//! job is killed with SIGKILL, and a new job with the same directory
//! restores it and continues exactly (`kv_checkpoint` checks every key),
//! also with `PS_REPLICAS=2`;
//! a truncated or corrupt checkpoint file is refused with an error naming
//! the file and the job stops; `PS_CHECKPOINT_INTERVAL` writes checkpoints
//! by itself; a cluster without a directory refuses `pslite checkpoint`;
//! checkpoints failing on a full disk (a 64 KiB tmpfs) leave nothing and
//! the next job starts fresh, as does one on a directory of only
//! checkpoints that never completed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pslite_tests::{free_port, pslite_command, run, spawn_node, Run, Spawned, TempDir};

const LIMIT: Duration = Duration::from_secs(60);
const SERVERS: usize = 2;
const WORKERS: usize = 2;
/// Rounds each worker pushes per job: every key gains ROUNDS x WORKERS.
const ROUNDS: u64 = 50;

/// One job at a time: five processes each on a 2-core machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `kv_checkpoint` job: scheduler, servers, workers.
struct Job {
    port: u16,
    scheduler: Spawned,
    servers: Vec<Spawned>,
    workers: Vec<Spawned>,
}

impl Job {
    /// Starts a job whose workers expect every key to hold `start` first,
    /// and with `idle`, meet at barriers after their pushes until killed.
    fn start(dir: Option<&Path>, start: u64, idle: bool, extra: &[(&str, &str)]) -> Job {
        let port = free_port();
        let start = start.to_string();
        let rounds = ROUNDS.to_string();
        let dir = dir.map(|d| d.display().to_string());
        let mut env: Vec<(&str, &str)> = vec![
            ("RUST_LOG", "info"),
            ("KV_START", &start),
            ("KV_ROUNDS", &rounds),
            ("KV_IDLE", if idle { "1" } else { "0" }),
        ];
        if let Some(dir) = &dir {
            env.push(("PS_CHECKPOINT_DIR", dir));
        }
        env.extend_from_slice(extra);
        let node = |role| spawn_node("kv_checkpoint", role, SERVERS, WORKERS, port, &env);
        Job {
            port,
            scheduler: node("scheduler"),
            servers: (0..SERVERS).map(|_| node("server")).collect(),
            workers: (0..WORKERS).map(|_| node("worker")).collect(),
        }
    }

    /// Waits until every worker has pushed and checked its keys and meets
    /// at barriers; if one does not, kills the job and shows its output.
    fn wait_idle(self) -> Job {
        if self
            .workers
            .iter()
            .all(|w| w.wait_for_line("idle", LIMIT).is_some())
        {
            return self;
        }
        let all = self.all();
        for p in &all {
            p.signal(libc::SIGKILL);
        }
        let runs: Vec<Run> = all.into_iter().map(|p| p.wait(LIMIT)).collect();
        panic!("a worker never finished its pushes:\n{}", outputs(&runs));
    }

    /// `pslite checkpoint` against this job.
    fn checkpoint(&self) -> Run {
        let mut cmd = pslite_command("checkpoint");
        cmd.args(["--port", &self.port.to_string(), "--label", "test"]);
        cmd.args(["--timeout", "30"]);
        run(cmd, LIMIT)
    }

    /// Every process, scheduler first.
    fn all(self) -> Vec<Spawned> {
        let mut all = vec![self.scheduler];
        all.extend(self.servers);
        all.extend(self.workers);
        all
    }

    /// Kills every process with SIGKILL at once and reaps them.
    fn kill(self) {
        let all = self.all();
        for p in &all {
            p.signal(libc::SIGKILL);
        }
        for p in all {
            p.wait(LIMIT);
        }
    }

    /// Waits for every process to exit (killed at `LIMIT`).
    fn wait(self) -> Vec<Run> {
        self.all().into_iter().map(|p| p.wait(LIMIT)).collect()
    }
}

fn outputs(runs: &[Run]) -> String {
    runs.iter()
        .enumerate()
        .map(|(i, r)| format!("--- process {i} ({:?}):\n{}", r.code(), r.output()))
        .collect()
}

/// The files of checkpoint `id` in `dir`.
fn checkpoint_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("checkpoint-{id:06}"))
}

/// Server rank `rank`'s file of checkpoint `id` in `dir` (its name says the
/// checkpoint, server, ranges and job: `ckpt-000001.server-0.ranges-0.job-....ckpt`).
fn server_file(dir: &Path, id: u64, rank: usize) -> PathBuf {
    let files = checkpoint_dir(dir, id);
    let prefix = format!("ckpt-{id:06}.server-{rank}.ranges-");
    std::fs::read_dir(&files)
        .expect("the checkpoint's directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .unwrap_or_else(|| panic!("no file of server {rank} in {files:?}"))
}

/// Runs a job (with `extra` variables) in `dir` that pushes ROUNDS rounds,
/// takes checkpoint 1 with `pslite checkpoint` and is killed whole with
/// SIGKILL.
fn checkpointed_job(dir: &Path, extra: &[(&str, &str)]) {
    let job = Job::start(Some(dir), 0, true, extra).wait_idle();
    let result = job.checkpoint();
    let expected = format!(
        "checkpoint 1 written to {}",
        checkpoint_dir(dir, 1).display()
    );
    assert!(
        result.ok() && result.stdout.contains(&expected),
        "pslite checkpoint did not report {expected:?}:\n{}",
        result.output()
    );
    job.kill();
    let files = checkpoint_dir(dir, 1);
    assert!(files.join("MANIFEST").is_file(), "no MANIFEST in {files:?}");
    for rank in 0..SERVERS {
        let file = server_file(dir, 1, rank);
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.contains(".job-") && name.ends_with(".ckpt"), "{name}");
    }
}

#[test]
fn checkpoint_kill_whole_job_resume_exact() {
    kill_and_resume(&[]);
}

/// With `PS_REPLICAS=2` every replica writes its ranges (each file holds
/// both ranges here) and restores them.
#[test]
fn checkpoint_with_two_replicas_resumes_exact() {
    kill_and_resume(&[("PS_REPLICAS", "2")]);
}

fn kill_and_resume(extra: &[(&str, &str)]) {
    let _one = one_at_a_time();
    let dir = TempDir::new("checkpoint");
    checkpointed_job(dir.path(), extra);
    // Every key held ROUNDS x WORKERS when the checkpoint was taken; the
    // new job must read exactly that first, then end exact after its own
    // pushes.
    let held = ROUNDS * WORKERS as u64;
    let runs = Job::start(Some(dir.path()), held, false, extra).wait();
    let all = outputs(&runs);
    assert!(runs.iter().all(Run::ok), "the resumed job failed:\n{all}");
    for w in &runs[1 + SERVERS..] {
        assert!(
            w.stdout.contains(&format!("resumed at {held}"))
                && w.stdout
                    .contains(&format!("hold {}", held + ROUNDS * WORKERS as u64)),
            "a worker did not resume exactly:\n{all}"
        );
    }
    for s in &runs[1..=SERVERS] {
        assert!(
            s.output().contains("from checkpoint 1 in") && s.output().contains("serving"),
            "a server did not restore checkpoint 1:\n{all}"
        );
    }
    assert!(
        runs[0].output().contains("resuming job"),
        "the scheduler did not say which checkpoint it resumes:\n{all}"
    );
}

/// Starts a job on a checkpoint damaged by `damage` (a file of checkpoint
/// 1 and the bytes it holds), and checks it is refused: the server
/// restoring that file fails naming it and `why`, the scheduler stops the
/// job with the same error, every process exits non-zero, no worker reads
/// a value.
fn refused(damage: impl FnOnce(&Path), rank: usize, why: &str) {
    let _one = one_at_a_time();
    let dir = TempDir::new("checkpoint-bad");
    checkpointed_job(dir.path(), &[]);
    let path = server_file(dir.path(), 1, rank);
    damage(&path);
    let runs = Job::start(Some(dir.path()), ROUNDS * WORKERS as u64, false, &[]).wait();
    let all = outputs(&runs);
    let named = format!("checkpoint file {}", path.display());
    assert!(
        runs.iter().all(|r| !r.ok() && !r.timed_out),
        "every process should exit non-zero, in time:\n{all}"
    );
    let scheduler = runs[0].output();
    assert!(
        scheduler.contains(&named) && scheduler.contains(why),
        "the scheduler did not stop the job naming {named:?} and {why:?}:\n{all}"
    );
    assert!(
        runs[1..=SERVERS]
            .iter()
            .any(|s| s.output().contains(&named) && s.output().contains("nothing of it")),
        "no server refused {named:?}:\n{all}"
    );
    assert!(
        runs[1 + SERVERS..]
            .iter()
            .all(|w| !w.stdout.contains("resumed at")),
        "a worker read values from a refused checkpoint:\n{all}"
    );
}

#[test]
fn truncated_checkpoint_file_refused() {
    refused(
        |path| {
            let bytes = std::fs::read(path).expect("read the checkpoint file");
            std::fs::write(path, &bytes[..bytes.len() / 2]).expect("truncate it");
        },
        1,
        "(truncated, or another checkpoint's)",
    );
}

#[test]
fn corrupt_checkpoint_file_refused() {
    refused(
        |path| {
            let mut bytes = std::fs::read(path).expect("read the checkpoint file");
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            std::fs::write(path, &bytes).expect("corrupt it");
        },
        0,
        "its content's CRC-32",
    );
}

/// A server file of another job (same shape, same values, same size: two
/// runs of one program) put in place of a job's own is refused, naming it:
/// the manifest's checksum of a file is of its content, and each file names
/// its job.
#[test]
fn a_file_of_another_job_swapped_in_is_refused() {
    let other = TempDir::new("checkpoint-other");
    {
        let _one = one_at_a_time();
        checkpointed_job(other.path(), &[]);
    }
    let theirs = server_file(other.path(), 1, 1);
    refused(
        |ours| {
            let bytes = std::fs::read(&theirs).expect("read the other job's file");
            assert_eq!(
                bytes.len() as u64,
                std::fs::metadata(ours).expect("our file").len(),
                "the two jobs' files should have one size"
            );
            std::fs::write(ours, &bytes).expect("swap it in");
        },
        1,
        "another job's or checkpoint's file",
    );
}

/// A whole job started on a checkpoint directory its scheduler refuses
/// (`damage` makes it so) ends at once: the scheduler tells every node
/// that registers why, and every process exits non-zero saying `why`
/// (before, the servers and workers waited for their start timeout, 300 s,
/// saying nothing).
fn refused_at_start(damage: impl FnOnce(&Path) -> PathBuf, why: &str) {
    let _one = one_at_a_time();
    let dir = TempDir::new("checkpoint-refused");
    let path = damage(dir.path());
    let started = std::time::Instant::now();
    let runs = Job::start(Some(&path), 0, false, &[]).wait();
    let took = started.elapsed();
    let all = outputs(&runs);
    assert!(
        runs.iter().all(|r| !r.ok() && !r.timed_out),
        "every process should exit non-zero, in time:\n{all}"
    );
    for (i, r) in runs.iter().enumerate() {
        assert!(
            r.output().contains(why),
            "process {i} did not say {why:?}:\n{all}"
        );
    }
    for r in &runs[1..] {
        assert!(
            r.output().contains("the scheduler stopped the job"),
            "{all}"
        );
    }
    eprintln!(
        "the whole job ended {:.1} s after it started",
        took.as_secs_f64()
    );
}

/// (A path that is a file is refused by every node's configuration check
/// already, at once.)
#[test]
fn a_deleted_manifest_stops_every_node_at_start() {
    refused_at_start(
        |dir| {
            checkpointed_job(dir, &[]);
            std::fs::remove_file(checkpoint_dir(dir, 1).join("MANIFEST"))
                .expect("delete the manifest");
            dir.to_path_buf()
        },
        "MANIFEST is missing",
    );
}

#[test]
fn a_corrupt_manifest_stops_every_node_at_start() {
    refused_at_start(
        |dir| {
            checkpointed_job(dir, &[]);
            let manifest = checkpoint_dir(dir, 1).join("MANIFEST");
            let mut bytes = std::fs::read(&manifest).expect("read the manifest");
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            std::fs::write(&manifest, &bytes).expect("corrupt it");
            dir.to_path_buf()
        },
        "cannot resume checkpoint 1",
    );
}

/// Starts only the scheduler of a `kv_checkpoint` job on `dir` (with
/// `extra`) and returns how it ended: it must refuse to start.
fn scheduler_alone(dir: &Path, extra: &[(&str, &str)]) -> Run {
    let dir = dir.display().to_string();
    // Alone, it waits for no registration long (it would tell each node
    // why it refuses the job).
    let mut env = vec![
        ("PS_CHECKPOINT_DIR", dir.as_str()),
        ("PS_START_TIMEOUT", "3"),
    ];
    env.extend_from_slice(extra);
    let port = free_port();
    spawn_node("kv_checkpoint", "scheduler", SERVERS, WORKERS, port, &env).wait(LIMIT)
}

/// Two jobs given one directory at once: the second is refused at start,
/// naming the directory and the first job's scheduler, and the first job's
/// checkpoints are untouched.
#[test]
fn a_second_job_on_one_directory_is_refused() {
    let _one = one_at_a_time();
    let dir = TempDir::new("checkpoint-shared");
    let job = Job::start(Some(dir.path()), 0, true, &[]).wait_idle();
    let first = job.checkpoint();
    assert!(first.ok(), "{}", first.output());
    let second = scheduler_alone(dir.path(), &[("PS_CHECKPOINT_FRESH", "1")]);
    let again = job.checkpoint();
    let pid = job.scheduler.pid();
    job.kill();
    assert!(
        !second.ok() && !second.timed_out,
        "the second job's scheduler did not stop at once:\n{}",
        second.output()
    );
    assert!(
        second.output().contains("is in use by another job")
            && second.output().contains(&format!("pid {pid}")),
        "{}",
        second.output()
    );
    assert!(
        again.ok() && again.stdout.contains("checkpoint 2 written"),
        "{}",
        again.output()
    );
}

/// The newest checkpoint's manifest deleted: the next job stops at start
/// naming it, instead of resuming an older checkpoint or starting from
/// zero; with PS_CHECKPOINT_FRESH=1 it starts a new job, saying so.
#[test]
fn a_deleted_newest_manifest_stops_the_next_job() {
    let _one = one_at_a_time();
    let dir = TempDir::new("checkpoint-no-manifest");
    let job = Job::start(Some(dir.path()), 0, true, &[]).wait_idle();
    for id in [1, 2] {
        let result = job.checkpoint();
        assert!(
            result.ok() && result.stdout.contains(&format!("checkpoint {id} written")),
            "{}",
            result.output()
        );
    }
    job.kill();
    let manifest = checkpoint_dir(dir.path(), 2).join("MANIFEST");
    std::fs::remove_file(&manifest).expect("delete the newest manifest");
    let run = scheduler_alone(dir.path(), &[]);
    assert!(!run.ok() && !run.timed_out, "{}", run.output());
    assert!(
        run.output()
            .contains(&format!("{} is missing", manifest.display())),
        "{}",
        run.output()
    );
    // Asked for, a fresh start is a new job, said at the default level.
    let runs = Job::start(
        Some(dir.path()),
        0,
        false,
        &[("PS_CHECKPOINT_FRESH", "1"), ("RUST_LOG", "warn")],
    )
    .wait();
    let all = outputs(&runs);
    assert!(runs.iter().all(Run::ok), "{all}");
    assert!(
        runs[0].output().contains("starts without a checkpoint"),
        "{all}"
    );
}

#[test]
fn interval_checkpoint_appears() {
    let _one = one_at_a_time();
    let dir = TempDir::new("checkpoint-interval");
    let job = Job::start(
        Some(dir.path()),
        0,
        true,
        &[("PS_CHECKPOINT_INTERVAL", "1")],
    )
    .wait_idle();
    // The scheduler logs each checkpoint once its manifest is written.
    let line = job
        .scheduler
        .wait_for_line("checkpoint 1 complete", LIMIT)
        .expect("no checkpoint was taken by PS_CHECKPOINT_INTERVAL");
    assert!(line.contains("2 files"), "{line}");
    assert!(checkpoint_dir(dir.path(), 1).join("MANIFEST").is_file());
    job.kill();
}

#[test]
fn checkpoint_without_dir_is_refused() {
    let _one = one_at_a_time();
    let job = Job::start(None, 0, true, &[]).wait_idle();
    let result = job.checkpoint();
    job.kill();
    assert_eq!(result.code(), Some(1), "{}", result.output());
    assert!(
        result.stderr.contains("no PS_CHECKPOINT_DIR"),
        "{}",
        result.output()
    );
}

/// `pslite demo --checkpoint-dir DIR` writes a checkpoint per epoch; a run
/// with `--resume` says which one it starts from and evaluates the restored
/// model exactly as the first run did after that epoch.
#[test]
fn demo_checkpoints_and_resumes() {
    let _one = one_at_a_time();
    let dir = TempDir::new("checkpoint-demo");
    let demo = |epochs: &str, resume: bool| {
        let mut cmd = pslite_command("demo");
        cmd.args([
            "--samples",
            "20000",
            "--features",
            "10000",
            "--epochs",
            epochs,
        ]);
        cmd.arg("--checkpoint-dir").arg(dir.path());
        if resume {
            cmd.arg("--resume");
        }
        let run = run(cmd, LIMIT);
        assert!(run.ok(), "{}", run.output());
        run.stdout
    };
    let first = demo("2", false);
    let second = demo("3", true);
    assert!(
        second.contains(&format!(
            "resuming from checkpoint 2 (written after epoch 2) in {}",
            dir.path().display()
        )),
        "{second}"
    );
    // The first run's evaluation after epoch 2 is the second run's first.
    let line = |out: &str, prefix: &str| {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .map(|l| l.split("accuracy").next().unwrap_or_default().to_string())
    };
    let after_2 = line(&first, "epoch 2/2");
    assert!(after_2.is_some(), "{first}");
    assert_eq!(
        after_2.map(|l| l.replace("2/2", "")),
        line(&second, "epoch 2/3").map(|l| l.replace("2/3", "")),
        "{first}\n{second}"
    );
    assert!(second.contains("epoch 3/3"), "{second}");
    assert!(checkpoint_dir(dir.path(), 3).join("MANIFEST").is_file());
}

/// A tmpfs of a given size mounted on a directory of its own, unmounted
/// when dropped (lazily if busy), even when the test fails.
struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    /// `mount -t tmpfs -o size=SIZE`, or why it cannot be (not root, no
    /// mount(8)).
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = TempDir::new("checkpoint-tmpfs");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            let mut cmd = std::process::Command::new("umount");
            if lazy {
                cmd.arg("-l");
            }
            cmd.arg(self.dir.path()).status().is_ok_and(|s| s.success())
        };
        if !umount(false) && !umount(true) {
            eprintln!("cannot unmount {}", self.dir.path().display());
        }
    }
}

/// The `checkpoint-*` entries in `dir`.
fn checkpoint_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("the checkpoint directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint-"))
        .collect();
    names.sort();
    names
}

/// Issue 43: two checkpoints failing with ENOSPC left `checkpoint-000001/`
/// and `checkpoint-000002/` behind (the scheduler deleted each while a
/// server still wrote into it), and the next job stopped ("no complete
/// checkpoint to resume"). Now each is deleted once both servers ended,
/// and the next job on the directory starts fresh.
#[test]
fn checkpoints_failing_on_a_full_disk_leave_nothing_and_the_next_job_starts_fresh() {
    let _one = one_at_a_time();
    let tmpfs = match Tmpfs::mount("64k") {
        Ok(t) => t,
        Err(why) => {
            eprintln!("skipped: a 64 KiB tmpfs is needed ({why})");
            return;
        }
    };
    let dir = tmpfs.path();
    // Each server's file (10 000 keys of 12 bytes) is bigger than the disk.
    let big = [("KV_KEYS", "10000")];
    let job = Job::start(Some(dir), 0, true, &big).wait_idle();
    let mut problems = Vec::new();
    for id in [1, 2] {
        let result = job.checkpoint();
        if result.ok() || !result.output().contains("No space left on device") {
            problems.push(format!(
                "checkpoint {id} did not fail with ENOSPC:\n{}",
                result.output()
            ));
        }
        // Its directory goes once both servers ended (reported).
        let files = checkpoint_dir(dir, id);
        if !pslite_tests::within(LIMIT, || !files.exists()) {
            problems.push(format!("{} is still there", files.display()));
        }
    }
    let runs = {
        let all = job.all();
        for p in &all {
            p.signal(libc::SIGKILL);
        }
        all.into_iter().map(|p| p.wait(LIMIT)).collect::<Vec<Run>>()
    };
    assert!(problems.is_empty(), "{problems:?}\n{}", outputs(&runs));
    assert_eq!(
        checkpoint_entries(dir),
        Vec::<String>::new(),
        "a failed checkpoint left something:\n{}",
        outputs(&runs)
    );
    let runs = Job::start(Some(dir), 0, false, &big).wait();
    let all = outputs(&runs);
    assert!(runs.iter().all(Run::ok), "the next job failed:\n{all}");
    assert!(
        runs[0].output().contains(&format!(
            "PS_CHECKPOINT_DIR {} holds no checkpoint",
            dir.display()
        )) && runs[0].output().contains("starts fresh"),
        "{all}"
    );
}

/// A directory holding only checkpoints that never completed (no MANIFEST,
/// no LATEST: made here by hand, as a failed or interrupted job leaves
/// them) starts a fresh job that says what it ignored, and deletes them.
#[test]
fn a_directory_of_only_incomplete_checkpoints_starts_fresh_saying_so() {
    let _one = one_at_a_time();
    let dir = TempDir::new("checkpoint-incomplete");
    std::fs::create_dir_all(checkpoint_dir(dir.path(), 1)).expect("checkpoint 1's directory");
    let partial =
        checkpoint_dir(dir.path(), 2).join("ckpt-000002.server-0.ranges-0.job-0123abcd.ckpt.tmp");
    std::fs::create_dir_all(partial.parent().expect("its directory")).expect("mkdir");
    std::fs::write(&partial, b"half a file").expect("a partial file");
    let runs = Job::start(Some(dir.path()), 0, false, &[("RUST_LOG", "warn")]).wait();
    let all = outputs(&runs);
    assert!(runs.iter().all(Run::ok), "{all}");
    let notice = format!(
        "PS_CHECKPOINT_DIR {} holds only checkpoints that never completed (1, 2",
        dir.path().display()
    );
    assert!(
        runs[0].output().contains(&notice) && runs[0].output().contains("starts fresh"),
        "no notice {notice:?}:\n{all}"
    );
    assert_eq!(
        checkpoint_entries(dir.path()),
        Vec::<String>::new(),
        "{all}"
    );
}
