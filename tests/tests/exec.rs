//! `pslite exec` as a launcher's child: a cluster whose processes only know
//! their PMI rank and size (what MPICH's mpirun gives them), the plan it
//! prints, and the errors when no launcher can be found.

use std::process::Command;
use std::time::Duration;

use pslite_tests::{assert_all_ok, example, free_port, pslite_bin, run, spawn};

/// `pslite exec` with a clean environment plus `vars`.
fn exec(vars: &[(&str, String)], args: &[&str]) -> Command {
    let mut cmd = Command::new(pslite_bin());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .arg("exec")
        .args(args);
    cmd
}

#[test]
fn pmi_ranks_form_a_kv_app_cluster() {
    let port = free_port().to_string();
    let kv_app = example("kv_app");
    let kv_app = kv_app.to_str().unwrap_or_default();
    let nodes: Vec<_> = (0..5)
        .map(|rank| {
            let vars = [
                ("PMI_RANK", rank.to_string()),
                ("PMI_SIZE", "5".into()),
                ("MPI_LOCALNRANKS", "5".into()),
                ("KV_APP_REPEAT", "5".into()),
            ];
            spawn(exec(
                &vars,
                &["--servers", "2", "--port", &port, "--", kv_app],
            ))
        })
        .collect();
    let runs: Vec<_> = nodes
        .into_iter()
        .map(|n| n.wait(Duration::from_secs(90)))
        .collect();
    assert_all_ok(&runs);
    // Ranks 3 and 4 are the workers.
    for run in &runs[3..] {
        assert!(run.stdout.contains("sums exact"), "{}", run.output());
    }
}

#[test]
fn dry_run_prints_the_plan() {
    let vars = [
        ("SLURM_PROCID", "2".to_string()),
        ("SLURM_NTASKS", "4".into()),
        ("SLURM_JOB_NODELIST", "gpu[3-4]".into()),
        ("DMLC_PS_ROOT_PORT", "9999".into()),
    ];
    let out = run(exec(&vars, &["--dry-run"]), Duration::from_secs(30));
    out.assert_ok();
    assert!(out.stdout.contains("DMLC_ROLE=worker"), "{}", out.output());
    assert!(out.stdout.contains("DMLC_NUM_WORKER=2"), "{}", out.output());
    assert!(
        out.stdout.contains("DMLC_PS_ROOT_URI=gpu3"),
        "{}",
        out.output()
    );
    // Set by hand: kept, not printed.
    assert!(
        !out.stdout.contains("DMLC_PS_ROOT_PORT="),
        "{}",
        out.output()
    );
    assert!(
        out.stdout.contains("scheduler gpu3:9999"),
        "{}",
        out.output()
    );
}

#[test]
fn without_a_launcher_it_says_what_to_do() {
    let out = run(exec(&[], &["--", "true"]), Duration::from_secs(30));
    assert_eq!(out.code(), Some(2), "{}", out.output());
    assert!(out.stderr.contains("no launcher found"), "{}", out.output());
    let small = [
        ("OMPI_COMM_WORLD_RANK", "0".to_string()),
        ("OMPI_COMM_WORLD_SIZE", "2".into()),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
    ];
    let out = run(
        exec(&small, &["--servers", "2", "--", "true"]),
        Duration::from_secs(30),
    );
    assert_eq!(out.code(), Some(2), "{}", out.output());
    assert!(
        out.stderr.contains("start at least 4 processes"),
        "{}",
        out.output()
    );
}

#[test]
fn bad_or_disagreeing_sizes_fail_before_the_program_runs() {
    let job = |extra: (&'static str, &str)| {
        vec![
            ("OMPI_COMM_WORLD_RANK", "1".to_string()),
            ("OMPI_COMM_WORLD_SIZE", "4".into()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4".into()),
            (extra.0, extra.1.into()),
        ]
    };
    for (extra, args, expected) in [
        (
            ("DMLC_NUM_WORKER", "abc"),
            &["--dry-run"][..],
            "pslite exec: DMLC_NUM_WORKER must be a whole number from 1 to 1000000",
        ),
        (
            ("DMLC_NUM_WORKER", "5"),
            &["--dry-run"][..],
            "pslite exec: DMLC_NUM_WORKER=5 disagrees with the job: the Open MPI job has 4 \
             processes: 1 scheduler, 1 server and 2 workers",
        ),
        (
            ("DMLC_NUM_SERVER", "1"),
            &["--servers", "2", "--", "echo", "ran"][..],
            "pslite exec: DMLC_NUM_SERVER=1 disagrees with the job: --servers 2",
        ),
    ] {
        let out = run(exec(&job(extra), args), Duration::from_secs(30));
        assert_eq!(out.code(), Some(2), "{}", out.output());
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.output());
        assert!(out.stderr.starts_with(expected), "{}", out.output());
        assert!(
            out.stdout.is_empty(),
            "nothing planned or run:\n{}",
            out.output()
        );
    }
}
