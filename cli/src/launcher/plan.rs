//! Which processes a launch starts, with their programs and environments.
//!
//! [`plan`] is a function of the options and the launcher's environment: it
//! checks them once (so a bad value is one line, not one per node) and
//! returns one [`NodeSpec`] per process, in launch order: the scheduler, the
//! servers, the workers.

use std::ffi::OsString;
use std::path::Path;

use pslite::settings;
use pslite_proto::Role;

use super::{LaunchError, LaunchOptions, MALLOC_TUNABLES};

/// One process to run: a node, or (with `--worker-procs`) several workers.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Its name in launch order: `scheduler`, `server 0`, `worker 1`.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The variables it gets, on top of the launcher's environment.
    pub env: Vec<(String, String)>,
    /// Whether it hosts one server or worker, so the launcher gives it a
    /// port of its own (`PORT`, held by a reservation until it binds it):
    /// the node advertises that port, which is how the launcher finds its
    /// node id in the scheduler's table.
    pub own_port: bool,
    /// The rank a ps-lite scheduler gives it, as far as the launcher can
    /// tell before the scheduler says: its launch index among the nodes of
    /// its role, for a process of one node in a job of fixed size (its
    /// port increases with that index, and the scheduler assigns ranks in
    /// port order).
    pub expected_rank: Option<usize>,
}

impl NodeSpec {
    /// Sets `PORT`, replacing an earlier one.
    pub fn set_port(&mut self, port: u16) {
        self.env.retain(|(k, _)| k != "PORT");
        self.env.push(("PORT".into(), port.to_string()));
    }

    /// The `PORT` it was given.
    pub fn port(&self) -> Option<u16> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == "PORT")
            .and_then(|(_, v)| v.parse().ok())
    }
}

/// The name (and output prefix) of the worker `--add-worker` starts.
pub const ADDED_WORKER: &str = "added worker";

/// Which nodes to start, with their programs and environments.
pub fn plan(opts: &LaunchOptions, port: u16) -> Result<Vec<NodeSpec>, LaunchError> {
    if opts.servers == 0 || opts.workers == 0 {
        return Err(LaunchError::Invalid(
            "--servers and --workers must be at least 1".into(),
        ));
    }
    if let Some((min, max)) = opts.elastic {
        if min == 0 || min > max {
            return Err(LaunchError::Invalid(format!(
                "--workers {min}:{max}: MIN:MAX needs 1 <= MIN <= MAX"
            )));
        }
        if opts.workers > max {
            return Err(LaunchError::Invalid(format!(
                "--start-workers {} is more than MAX in --workers {min}:{max}",
                opts.workers
            )));
        }
        if opts.worker_procs.is_some() {
            return Err(LaunchError::Invalid(
                "--worker-procs does not go with elastic workers (--workers MIN:MAX): \
                 each elastic worker is a process of its own"
                    .into(),
            ));
        }
    } else if opts.join {
        return Err(LaunchError::Invalid(
            "--add-worker needs the cluster's elastic bounds (--workers MIN:MAX)".into(),
        ));
    }
    let worker_procs = opts.worker_procs.unwrap_or(opts.workers);
    if worker_procs == 0 || opts.workers % worker_procs != 0 {
        return Err(LaunchError::Invalid(format!(
            "--worker-procs {worker_procs} must divide --workers {}",
            opts.workers
        )));
    }
    let advertised = opts.node_host.as_deref().unwrap_or(&opts.host);
    // The launcher sets DMLC_NODE_HOST, which a node prefers to
    // DMLC_INTERFACE: refuse rather than silently override.
    if let Ok(Some(interface)) = settings::DMLC_INTERFACE.get() {
        return Err(LaunchError::Invalid(format!(
            "DMLC_INTERFACE is set ({interface}), but pslite launch gives every node \
             DMLC_NODE_HOST={advertised} (--host), which takes precedence: unset \
             DMLC_INTERFACE, or pass that interface's address as --host",
        )));
    }
    if let Ok(Some(node_host)) = settings::DMLC_NODE_HOST.get() {
        if node_host != advertised {
            return Err(LaunchError::Invalid(format!(
                "DMLC_NODE_HOST is set ({node_host}), but pslite launch gives every node \
                 DMLC_NODE_HOST={advertised} (--host): unset it, or pass --host {node_host}"
            )));
        }
    }
    if let Some(port) = settings::environment()(settings::PORT.name).filter(|v| !v.is_empty()) {
        return Err(LaunchError::Invalid(format!(
            "PORT is set ({port}), but pslite launch gives every server and worker a port of its \
             own (PORT): unset it"
        )));
    }
    // Nodes can measure their start-up from this instant.
    let launched_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let num_worker = match opts.elastic {
        Some((min, max)) => format!("{min}:{max}"),
        None => opts.workers.to_string(),
    };
    let common = |role: Role| {
        let mut env = vec![
            ("DMLC_ROLE".to_string(), role.as_str().to_string()),
            ("DMLC_NUM_SERVER".into(), opts.servers.to_string()),
            ("DMLC_NUM_WORKER".into(), num_worker.clone()),
            ("DMLC_PS_ROOT_URI".into(), opts.host.clone()),
            ("DMLC_PS_ROOT_PORT".into(), port.to_string()),
            ("DMLC_NODE_HOST".into(), advertised.to_string()),
            ("PSLITE_LAUNCH_UNIX_NS".into(), launched_ns.to_string()),
        ];
        env.extend(opts.env.iter().cloned());
        if settings::foreign("GLIBC_TUNABLES").is_none() {
            env.push(("GLIBC_TUNABLES".into(), MALLOC_TUNABLES.into()));
        }
        env.extend(python_env(opts.python.as_deref()));
        if role == Role::Worker && opts.colocate {
            env.push(("PSLITE_COLOCATE".into(), "1".into()));
        }
        if role == Role::Worker && opts.worker_procs.is_some() {
            env.push((
                "PSLITE_WORKERS_PER_PROCESS".into(),
                (opts.workers / worker_procs).to_string(),
            ));
        }
        env
    };
    // Check once what every node would check, so a bad value is one line,
    // not one per node.
    let env = common(Role::Worker);
    pslite::Config::from_lookup(settings::overlay(&env))?;
    let command = |own: &Option<Vec<OsString>>| {
        let (program, args) = match own.as_deref() {
            Some([program, args @ ..]) => (program.clone(), args.to_vec()),
            _ => (opts.program.clone(), opts.args.clone()),
        };
        python_program(opts.python.as_deref(), program, args)
    };
    let mut nodes = Vec::new();
    let mut add = |name: String, role: Role, own: &Option<Vec<OsString>>, rank: Option<usize>| {
        let (program, args) = command(own);
        if program.is_empty() {
            return Err(LaunchError::Invalid(format!(
                "no program for the {name}: give PROGRAM after --, or --{}-program",
                role.as_str()
            )));
        }
        // A process of one node gets a PORT of its own (see NodeSpec::own_port).
        let own_port = match role {
            Role::Scheduler => false,
            Role::Server => true,
            Role::Worker => opts.workers / worker_procs == 1,
        };
        let expected_rank = rank.filter(|_| own_port && opts.elastic.is_none());
        let mut env = common(role);
        if role == Role::Worker && opts.elastic.is_none() && !opts.join {
            env.extend(torchrun_env(opts, expected_rank));
        }
        nodes.push(NodeSpec {
            name,
            role,
            program,
            args,
            env,
            own_port,
            expected_rank,
        });
        Ok(())
    };
    if opts.join {
        add(
            ADDED_WORKER.into(),
            Role::Worker,
            &opts.worker_program,
            None,
        )?;
        return Ok(nodes);
    }
    add(
        "scheduler".into(),
        Role::Scheduler,
        &opts.scheduler_program,
        None,
    )?;
    // Colocated servers start inside the workers' processes.
    for i in (0..opts.servers).filter(|_| !opts.colocate) {
        add(
            format!("server {i}"),
            Role::Server,
            &opts.server_program,
            Some(i),
        )?;
    }
    for i in 0..worker_procs {
        let name = if opts.workers / worker_procs == 1 {
            format!("worker {i}")
        } else {
            format!("worker process {i}")
        };
        add(name, Role::Worker, &opts.worker_program, Some(i))?;
    }
    Ok(nodes)
}

/// torchrun's variables for a worker of a job of fixed size (every worker
/// of one launch runs on this machine): `WORLD_SIZE` and `LOCAL_WORLD_SIZE`,
/// and for a process of one worker `RANK` and `LOCAL_RANK`, the rank the
/// scheduler will give it (its launch index: see [`NodeSpec::expected_rank`]).
/// `pslite.torch.init()` sets them again from the job once it has started.
/// A variable given with `--env` is left as given.
fn torchrun_env(opts: &LaunchOptions, rank: Option<usize>) -> Vec<(String, String)> {
    let mut vars = vec![
        ("WORLD_SIZE", opts.workers.to_string()),
        ("LOCAL_WORLD_SIZE", opts.workers.to_string()),
    ];
    if let Some(rank) = rank {
        vars.push(("RANK", rank.to_string()));
        vars.push(("LOCAL_RANK", rank.to_string()));
    }
    vars.into_iter()
        .filter(|(k, _)| opts.env.iter().all(|(given, _)| given != k))
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// The variables that make a node's `python` the launcher's: its
/// interpreter's directory first on PATH (a venv's `bin/`, where pip put
/// `pslite` and the venv's scripts), and `VIRTUAL_ENV` when that is a venv.
fn python_env(python: Option<&Path>) -> Vec<(String, String)> {
    let Some(bin) = python
        .and_then(Path::parent)
        .filter(|b| !b.as_os_str().is_empty())
    else {
        return Vec::new();
    };
    let mut dirs = vec![bin.to_path_buf()];
    if let Some(path) = pslite::settings::foreign("PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|d| d != bin));
    }
    let mut env = Vec::new();
    if let Ok(path) = std::env::join_paths(dirs) {
        env.push(("PATH".to_string(), path.to_string_lossy().into_owned()));
    }
    if let Some(venv) = bin.parent().filter(|v| v.join("pyvenv.cfg").is_file()) {
        env.push(("VIRTUAL_ENV".to_string(), venv.display().to_string()));
    }
    env
}

/// A node's program and arguments: a `.py` file runs under the launcher's
/// Python (else `python3` from the PATH), whatever its first line says.
fn python_program(
    python: Option<&Path>,
    program: OsString,
    args: Vec<OsString>,
) -> (OsString, Vec<OsString>) {
    if Path::new(&program).extension().is_none_or(|e| e != "py") {
        return (program, args);
    }
    let interpreter =
        python.map_or_else(|| OsString::from("python3"), |p| p.as_os_str().to_owned());
    (interpreter, std::iter::once(program).chain(args).collect())
}

/// Whether the nodes log connections (`PS_VERBOSE` 1 or more, in the
/// launcher's environment or `opts.env`): then the launcher says which
/// process is which node, too.
pub fn connections_logged(opts: &LaunchOptions) -> bool {
    settings::PS_VERBOSE
        .read(&settings::overlay(&opts.env))
        .is_ok_and(|v| v >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> LaunchOptions {
        LaunchOptions {
            program: "true".into(),
            ..LaunchOptions::default()
        }
    }

    #[test]
    fn python_programs_run_under_the_launchers_python_with_its_bin_first_on_path() {
        let dir = std::env::temp_dir().join(format!("pslite-venv-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        let python = dir.join("bin").join("python");
        let mut o = opts();
        o.program = "train.py".into();
        o.args = vec!["--epochs".into(), "3".into()];
        o.python = Some(python.clone());
        o.worker_program = Some(vec!["python".into(), "-c".into(), "pass".into()]);
        let nodes = plan(&o, 9000).unwrap();
        let server = &nodes[1];
        assert_eq!(server.program, python.as_os_str());
        assert_eq!(
            server.args,
            ["train.py", "--epochs", "3"].map(OsString::from)
        );
        // Not a .py file: as given (found on the node's PATH).
        assert_eq!(nodes[2].program, "python");
        let var = |k: &str| {
            server
                .env
                .iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        let path = var("PATH").unwrap();
        assert!(
            path.starts_with(&format!("{}:", dir.join("bin").display())),
            "{path}"
        );
        assert_eq!(var("VIRTUAL_ENV").unwrap(), dir.display().to_string());
        // Without a known Python: python3 from the PATH, and PATH untouched.
        o.python = None;
        let nodes = plan(&o, 9000).unwrap();
        assert_eq!(nodes[1].program, "python3");
        assert!(nodes[1].env.iter().all(|(k, _)| k != "PATH"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn colocated_jobs_start_no_server_process_and_tell_the_workers() {
        let mut o = opts();
        o.servers = 3;
        o.workers = 3;
        o.colocate = true;
        let nodes = plan(&o, 9000).unwrap();
        let roles: Vec<Role> = nodes.iter().map(|n| n.role).collect();
        assert_eq!(
            roles,
            [Role::Scheduler, Role::Worker, Role::Worker, Role::Worker]
        );
        let has = |n: &NodeSpec, k: &str, v: &str| n.env.iter().any(|(a, b)| a == k && b == v);
        assert!(nodes.iter().all(|n| has(n, "DMLC_NUM_SERVER", "3")));
        assert!(nodes[1..].iter().all(|n| has(n, "PSLITE_COLOCATE", "1")));
        assert!(!nodes[0].env.iter().any(|(k, _)| k == "PSLITE_COLOCATE"));
    }

    #[test]
    fn workers_of_a_fixed_job_get_torchruns_variables() {
        let var = |n: &NodeSpec, k: &str| {
            n.env
                .iter()
                .rev()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.clone())
        };
        let mut o = opts();
        o.servers = 2;
        o.workers = 3;
        let nodes = plan(&o, 9000).unwrap();
        for (i, worker) in nodes[3..].iter().enumerate() {
            let i = i.to_string();
            assert_eq!(var(worker, "RANK").as_deref(), Some(i.as_str()));
            assert_eq!(var(worker, "LOCAL_RANK").as_deref(), Some(i.as_str()));
            assert_eq!(var(worker, "WORLD_SIZE").as_deref(), Some("3"));
            assert_eq!(var(worker, "LOCAL_WORLD_SIZE").as_deref(), Some("3"));
        }
        // Not for the scheduler and servers; not RANK for a process of
        // several workers; none for elastic workers; --env wins.
        assert!(nodes[..3].iter().all(|n| var(n, "WORLD_SIZE").is_none()));
        o.worker_procs = Some(1);
        let nodes = plan(&o, 9000).unwrap();
        assert_eq!(var(&nodes[3], "RANK"), None);
        assert_eq!(var(&nodes[3], "WORLD_SIZE").as_deref(), Some("3"));
        o.worker_procs = None;
        o.elastic = Some((1, 3));
        let nodes = plan(&o, 9000).unwrap();
        assert!(nodes.iter().all(|n| var(n, "WORLD_SIZE").is_none()));
        o.elastic = None;
        o.env = vec![("RANK".into(), "7".into())];
        let nodes = plan(&o, 9000).unwrap();
        assert_eq!(var(&nodes[3], "RANK").as_deref(), Some("7"));
    }

    #[test]
    fn elastic_plans_give_every_node_min_max_and_start_the_asked_workers() {
        let plan_of = |o: &LaunchOptions| {
            plan(o, 9000).map(|nodes| {
                nodes
                    .iter()
                    .map(|n| {
                        let w = n.env.iter().find(|(k, _)| k == "DMLC_NUM_WORKER");
                        (
                            n.name.clone(),
                            w.map(|(_, v)| v.clone()).unwrap_or_default(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
        };
        let mut o = opts();
        o.elastic = Some((2, 4));
        o.workers = 3;
        let nodes = plan_of(&o).unwrap();
        assert_eq!(
            nodes.iter().map(|n| n.0.as_str()).collect::<Vec<_>>(),
            ["scheduler", "server 0", "worker 0", "worker 1", "worker 2"]
        );
        assert!(nodes.iter().all(|n| n.1 == "2:4"), "{nodes:?}");
        // One worker only, for a running cluster.
        o.join = true;
        o.workers = 1;
        let nodes = plan_of(&o).unwrap();
        assert_eq!(nodes, [(ADDED_WORKER.to_string(), "2:4".to_string())]);
        // More than MAX, or per-process workers: refused.
        let mut o = opts();
        o.elastic = Some((2, 4));
        o.workers = 5;
        assert!(plan_of(&o).is_err());
        o.workers = 2;
        o.worker_procs = Some(1);
        assert!(plan_of(&o).is_err());
        // Plain mode is unchanged.
        let mut o = opts();
        o.workers = 3;
        assert!(plan_of(&o).unwrap().iter().all(|n| n.1 == "3"));
    }
}
