//! Jobs past ZeroMQ's default limits: the context's 1 023 sockets and the
//! usual 1 024 file descriptors (issue 33). `kv_bench --only scale` measures
//! 1+100+100 to 1+500+500 beside C++ ps-lite (docs/BENCHMARKS.md).

use std::os::unix::process::CommandExt;
use std::time::Duration;

use pslite_tests::{example, run, Launch};

/// `cmd` with its soft descriptor limit set to `soft` (the hard one kept).
fn with_soft_limit(mut cmd: std::process::Command, soft: u64) -> std::process::Command {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = soft.min(limit.rlim_max) as libc::rlim_t;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// The hard descriptor limit of this process.
fn hard_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    limit.rlim_max
}

/// 1+200+200 under the usual soft limit of 1 024 descriptors: the job
/// needed more ZeroMQ sockets than a context holds by default (the
/// scheduler then logged "Too many open files" and every node waited for
/// its start timeout) and more descriptors than 1 024. The launcher and the
/// scheduler raise their soft limits (said), and the job forms and ends.
#[test]
fn a_job_past_the_default_socket_and_descriptor_limits_forms() {
    if hard_limit() < 8_192 {
        eprintln!("skipped: the hard descriptor limit is below what 1+200+200 needs");
        return;
    }
    let launch = Launch::example("connection", 200, 200)
        .env("PS_VERBOSE", "1")
        .timeout(Duration::from_secs(240));
    let run = run(
        with_soft_limit(launch.command(), 1024),
        Duration::from_secs(255),
    );
    run.assert_ok();
    assert_eq!(
        run.stdout.matches("finalized").count(),
        401,
        "{}",
        run.output()
    );
    assert!(
        !run.stderr.contains("ERROR") && !run.stderr.contains("Too many open files"),
        "{}",
        run.output()
    );
    let raised = run
        .stderr
        .lines()
        .find(|l| l.starts_with("[scheduler]") && l.contains("raised this process's file"))
        .unwrap_or_else(|| panic!("the scheduler says it raised its limit:\n{}", run.output()));
    assert!(raised.contains("200 servers and 200 workers"), "{raised}");
}

/// A scheduler that may open too few descriptors for its job (here 600 for
/// 1+100+100, and a hard limit it cannot raise) stops the job within
/// seconds, saying which connection it could not open and which limit to
/// raise, instead of an ERROR line and every node waiting for its start
/// timeout. (`PS_IPC=0`: libzmq 4.3.4 aborts when an `ipc://` listener runs
/// out of descriptors, see `pslite_van::context`.)
#[test]
fn a_scheduler_short_of_descriptors_stops_the_job_naming_the_limit() {
    let dir = std::env::temp_dir().join(format!("pslite-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wrapper = dir.join("scheduler.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit -n 600\nexec {}\n",
            example("connection").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let run = Launch::example("connection", 100, 100)
        .env("PS_IPC", "0")
        .arg("--scheduler-program")
        .arg(&wrapper.to_string_lossy())
        .timeout(Duration::from_secs(120))
        .run();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!run.timed_out, "{}", run.output());
    assert_eq!(run.code(), Some(1), "{}", run.output());
    let said = run
        .stderr
        .lines()
        .find(|l| l.starts_with("pslite launch: the scheduler said"))
        .unwrap_or_else(|| panic!("the scheduler's error comes last:\n{}", run.output()));
    for needle in [
        "cannot open a connection to",
        "Too many open files",
        "may open 600 file descriptors",
        "ulimit -n",
    ] {
        assert!(said.contains(needle), "{needle:?} in {said}");
    }
    assert!(
        run.elapsed < Duration::from_secs(60),
        "stopped after {:?}",
        run.elapsed
    );
}
