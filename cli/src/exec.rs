//! `pslite exec`: runs one node of a cluster started by another launcher
//! (mpirun, srun, a Kubernetes StatefulSet or indexed Job), deriving the
//! node's role and the cluster's size from the launcher's environment.
//!
//! The rule, for a job of `size` processes and `--servers S`: rank 0 is the
//! scheduler, ranks 1..=S are servers, the other `size - 1 - S` ranks are
//! workers. Every `DMLC_*` variable already set wins over what is derived,
//! so any part of the rule can be overridden. [`plan`] is the whole decision,
//! a pure function of the environment; [`run`] then replaces this process
//! with the program.
//!
//! | launcher | rank, size | scheduler host |
//! |---|---|---|
//! | Open MPI | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE` | 127.0.0.1 when every rank is on one host, else `DMLC_PS_ROOT_URI` |
//! | MPICH / Intel MPI (PMI) | `PMI_RANK`, `PMI_SIZE` | the same (`MPI_LOCALNRANKS`) |
//! | Slurm | `SLURM_PROCID`, `SLURM_NTASKS` | first host of `SLURM_STEP_NODELIST` / `SLURM_JOB_NODELIST`; port [`slurm_port`] |
//! | Kubernetes | `JOB_COMPLETION_INDEX` or the pod's StatefulSet ordinal; `PSLITE_WORLD_SIZE` | `<set>-0.<PSLITE_SERVICE>` (the headless Service) |

use std::ffi::OsString;
use std::fmt;
use std::time::{Duration, Instant};

use pslite::settings::{self as s, NodeCount, Numeric, Unit};
use pslite::ConfigError;

/// The scheduler port when neither `--port`, `DMLC_PS_ROOT_PORT` nor a
/// Slurm job id says otherwise.
pub const DEFAULT_PORT: u16 = 9091;

/// The launcher a process runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// A PMI launcher (MPICH's Hydra, Intel MPI).
    Pmi,
    /// Slurm's `srun`.
    Slurm,
    /// A Kubernetes pod of a StatefulSet or an indexed Job.
    Kubernetes,
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Engine::OpenMpi => "Open MPI",
            Engine::Pmi => "PMI",
            Engine::Slurm => "Slurm",
            Engine::Kubernetes => "Kubernetes",
        })
    }
}

/// Why no node could be derived from the environment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// A `DMLC_*`/`PS_*` variable (or a launcher's number) is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A cluster size set by hand disagrees with the job: the cluster
    /// would never form.
    #[error(
        "{var}={value} disagrees with the job: {detail}; unset {var} (pslite exec derives \
         it from the job), or change the job"
    )]
    Disagrees {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What the job has instead.
        detail: String,
    },
    /// No launcher variables and no `DMLC_ROLE`.
    #[error(
        "no launcher found: run under mpirun (Open MPI or PMI), srun (Slurm) or in a \
         Kubernetes StatefulSet/indexed Job, or set DMLC_ROLE and the other DMLC_* variables"
    )]
    NoEngine,
    /// A launcher variable is not a usable number.
    #[error("{var} must be {expected}, got {value:?}")]
    Invalid {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A variable the engine needs is not set.
    #[error("{var} is not set: {hint}")]
    Missing {
        /// The variable.
        var: &'static str,
        /// What to set it to.
        hint: &'static str,
    },
    /// The job is too small for the servers asked for.
    #[error(
        "a job of {size} processes cannot hold 1 scheduler, {servers} servers and at least \
         1 worker: start at least {} processes or lower --servers",
        servers + 2
    )]
    TooSmall {
        /// Processes in the job.
        size: u32,
        /// Servers asked for.
        servers: u32,
    },
}

/// What `pslite exec` was asked for on its command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// `--servers`: servers in the cluster (default: `DMLC_NUM_SERVER`, else 1).
    pub servers: Option<u32>,
    /// `--port`: the scheduler's port.
    pub port: Option<u16>,
}

/// The decision for this process: its place in the job and the variables to
/// give the program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The launcher detected (`None` when `DMLC_ROLE` was set by hand).
    pub engine: Option<Engine>,
    /// This process's rank in the job.
    pub rank: Option<u32>,
    /// The variables to set (only the ones not already set).
    pub env: Vec<(String, String)>,
}

impl Plan {
    /// The value this plan gives `var`, if it sets it.
    pub fn get(&self, var: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == var)
            .map(|(_, v)| v.as_str())
    }

    /// One line saying what this process is, for logs.
    pub fn summary(&self, lookup: &dyn Fn(&str) -> Option<String>) -> String {
        let value = |var: &str| {
            self.get(var)
                .map(str::to_string)
                .or_else(|| lookup(var))
                .unwrap_or_else(|| "?".into())
        };
        let from = match (self.engine, self.rank) {
            (Some(engine), Some(rank)) => format!("{engine} rank {rank}"),
            _ => "DMLC_ROLE".into(),
        };
        format!(
            "{from}: {} of 1 scheduler, {} servers, {} workers; scheduler {}:{}",
            value("DMLC_ROLE"),
            value("DMLC_NUM_SERVER"),
            value("DMLC_NUM_WORKER"),
            value("DMLC_PS_ROOT_URI"),
            value("DMLC_PS_ROOT_PORT"),
        )
    }
}

/// The role of `rank` in a job of 1 scheduler and `servers` servers: rank 0
/// schedules, the next `servers` ranks serve, the rest are workers.
pub fn role_of(rank: u32, servers: u32) -> &'static str {
    if rank == 0 {
        "scheduler"
    } else if rank <= servers {
        "server"
    } else {
        "worker"
    }
}

/// The launcher whose variables are set, most specific first (mpirun inside
/// a Slurm allocation sets both; its ranks are the ones that count).
pub fn detect(lookup: &dyn Fn(&str) -> Option<String>) -> Option<Engine> {
    let set = |var: &str| lookup(var).is_some_and(|v| !v.trim().is_empty());
    if set("OMPI_COMM_WORLD_RANK") {
        Some(Engine::OpenMpi)
    } else if set("PMI_RANK") {
        Some(Engine::Pmi)
    } else if set("SLURM_PROCID") {
        Some(Engine::Slurm)
    } else if set("KUBERNETES_SERVICE_HOST") {
        Some(Engine::Kubernetes)
    } else {
        None
    }
}

/// A launcher's rank, size or job id: numbers pslite does not define,
/// read by the same rule as its own (a whole number in range).
const LAUNCHER_NUMBER: Numeric = Numeric::new(Unit::Count, 0, u32::MAX as u64);

/// Launcher variable `var` as a number, if set (and not blank).
fn number(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<u32>, ExecError> {
    let Some(value) = lookup(var).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    Ok(Some(LAUNCHER_NUMBER.parse(var, &value)? as u32))
}

fn required(
    lookup: &dyn Fn(&str) -> Option<String>,
    var: &'static str,
    hint: &'static str,
) -> Result<u32, ExecError> {
    number(lookup, var)?.ok_or(ExecError::Missing { var, hint })
}

/// The Slurm job's scheduler port: 10000 + job id mod 20000, so jobs
/// sharing a host get different ports, all below Linux's ephemeral range
/// (32768-60999), where a port may be taken by any outgoing connection.
pub fn slurm_port(job_id: u32) -> u16 {
    10_000 + (job_id % 20_000) as u16
}

/// Refuses cluster sizes set by hand that disagree with a job of `size`
/// processes with `servers` servers (from `--servers`, or else from
/// `DMLC_NUM_SERVER`): the cluster would wait for nodes that never come.
fn check_sizes(
    lookup: &dyn Fn(&str) -> Option<String>,
    engine: Engine,
    size: u32,
    servers: u32,
) -> Result<(), ExecError> {
    let job = |workers: u32| {
        format!(
            "the {engine} job has {size} processes: 1 scheduler, {servers} server{} and \
             {workers} worker{}",
            if servers == 1 { "" } else { "s" },
            if workers == 1 { "" } else { "s" }
        )
    };
    let workers = size - 1 - servers;
    if let Some(value) = s::DMLC_NUM_SERVER.if_set(lookup)? {
        let fits = match value {
            NodeCount::Fixed(n) => n == u64::from(servers),
            // Servers that join and leave: no more than MAX may start.
            NodeCount::Elastic { max, .. } => u64::from(servers) <= max,
        };
        if !fits {
            return Err(ExecError::Disagrees {
                var: "DMLC_NUM_SERVER",
                value: value.to_string(),
                detail: format!("--servers {servers}"),
            });
        }
    }
    if let Some(value) = s::DMLC_NUM_WORKER.if_set(lookup)? {
        let fits = match value {
            NodeCount::Fixed(n) => n == u64::from(workers),
            // Elastic: more may join later, no more than MAX may start.
            NodeCount::Elastic { max, .. } => u64::from(workers) <= max,
        };
        if !fits {
            return Err(ExecError::Disagrees {
                var: "DMLC_NUM_WORKER",
                value: value.to_string(),
                detail: job(workers),
            });
        }
    }
    Ok(())
}

/// The first host of a Slurm host list: `node[03-05,9],gpu1` gives
/// `node03`, `a,b` gives `a`.
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    // The first entry ends at the first comma outside brackets.
    let mut depth = 0;
    let end = list
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let entry = &list[..end];
    let host = match entry.find('[') {
        None => entry.to_string(),
        Some(open) => {
            let close = entry[open..].find(']')? + open;
            let first = entry[open + 1..close].split([',', '-']).next()?;
            format!("{}{}{}", &entry[..open], first, &entry[close + 1..])
        }
    };
    (!host.is_empty()).then_some(host)
}

/// Rank, size and scheduler host (if the engine knows it) under `engine`.
fn locate(
    engine: Engine,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(u32, u32, Option<String>), ExecError> {
    let local_host = |local_var: &'static str, size: u32| -> Result<Option<String>, ExecError> {
        Ok((number(lookup, local_var)? == Some(size)).then(|| "127.0.0.1".to_string()))
    };
    match engine {
        Engine::OpenMpi => {
            let rank = required(lookup, "OMPI_COMM_WORLD_RANK", "run under mpirun")?;
            let size = required(lookup, "OMPI_COMM_WORLD_SIZE", "run under mpirun")?;
            Ok((rank, size, local_host("OMPI_COMM_WORLD_LOCAL_SIZE", size)?))
        }
        Engine::Pmi => {
            let rank = required(lookup, "PMI_RANK", "run under mpirun")?;
            let size = required(lookup, "PMI_SIZE", "run under mpirun")?;
            Ok((rank, size, local_host("MPI_LOCALNRANKS", size)?))
        }
        Engine::Slurm => {
            let rank = required(lookup, "SLURM_PROCID", "run under srun")?;
            let size = match number(lookup, "SLURM_NTASKS")? {
                Some(n) => n,
                None => required(lookup, "SLURM_NPROCS", "run under srun -n N")?,
            };
            let host = [
                "SLURM_STEP_NODELIST",
                "SLURM_JOB_NODELIST",
                "SLURM_NODELIST",
            ]
            .iter()
            .find_map(|var| lookup(var).and_then(|list| first_slurm_host(&list)));
            Ok((rank, size, host))
        }
        Engine::Kubernetes => {
            let hostname = lookup("HOSTNAME").unwrap_or_default();
            let ordinal = hostname
                .rsplit_once('-')
                .and_then(|(_, n)| n.parse::<u32>().ok());
            let rank = match number(lookup, "JOB_COMPLETION_INDEX")? {
                Some(index) => index,
                None => ordinal.ok_or(ExecError::Invalid {
                    var: "HOSTNAME".into(),
                    value: hostname.clone(),
                    expected:
                        "a StatefulSet pod name <set>-<ordinal> (or set JOB_COMPLETION_INDEX)",
                })?,
            };
            let size = s::PSLITE_WORLD_SIZE
                .read(lookup)?
                .ok_or(ExecError::Missing {
                    var: s::PSLITE_WORLD_SIZE.name,
                    hint: "set it to the number of pods (1 scheduler + servers + workers)",
                })? as u32;
            let host = match s::PSLITE_SERVICE.read(lookup)? {
                None => None,
                Some(service) => {
                    // A StatefulSet's pod 0, or an indexed Job's pod 0 with
                    // the pod's subdomain set to the Service.
                    let set = s::PSLITE_POD_PREFIX
                        .read(lookup)?
                        .or_else(|| hostname.rsplit_once('-').map(|(set, _)| set.to_string()))
                        .ok_or(ExecError::Missing {
                            var: "PSLITE_POD_PREFIX",
                            hint: "set it to the pods' name without the ordinal",
                        })?;
                    Some(format!("{set}-0.{service}"))
                }
            };
            Ok((rank, size, host))
        }
    }
}

/// Decides this process's node from the environment (`lookup`) and the
/// options. Variables already set are left alone.
pub fn plan(
    lookup: &dyn Fn(&str) -> Option<String>,
    opts: &ExecOptions,
) -> Result<Plan, ExecError> {
    let set = |var: &str| lookup(var).is_some_and(|v| !v.trim().is_empty());
    let mut env = Vec::new();
    let mut give = |var: &str, value: String| {
        if !set(var) {
            env.push((var.to_string(), value));
        }
    };
    // Every variable already set, by the rule every node applies: a bad
    // value fails here, once, not in the program (or a dry run's plan).
    s::check(lookup)?;
    let Some(engine) = detect(lookup) else {
        if set("DMLC_ROLE") {
            return Ok(Plan {
                engine: None,
                rank: None,
                env,
            });
        }
        return Err(ExecError::NoEngine);
    };
    let (rank, size, scheduler_host) = locate(engine, lookup)?;
    if rank >= size {
        return Err(ExecError::Invalid {
            var: "rank".into(),
            value: rank.to_string(),
            expected: "below the job size",
        });
    }
    let servers = match (opts.servers, s::DMLC_NUM_SERVER.if_set(lookup)?) {
        (Some(s), _) => s,
        // Servers that join and leave: the job starts with MIN.
        (None, Some(NodeCount::Fixed(n) | NodeCount::Elastic { min: n, .. })) => n as u32,
        (None, None) => 1,
    };
    if servers == 0 || size < servers + 2 {
        return Err(ExecError::TooSmall { size, servers });
    }
    check_sizes(lookup, engine, size, servers)?;
    give("DMLC_ROLE", role_of(rank, servers).into());
    give("DMLC_NUM_SERVER", servers.to_string());
    give("DMLC_NUM_WORKER", (size - 1 - servers).to_string());
    match scheduler_host {
        Some(host) => give("DMLC_PS_ROOT_URI", host),
        None if set("DMLC_PS_ROOT_URI") => {}
        None => {
            return Err(ExecError::Missing {
                var: "DMLC_PS_ROOT_URI",
                hint: match engine {
                    Engine::OpenMpi | Engine::Pmi => {
                        "the ranks span several hosts: pass the host of rank 0, e.g. \
                         mpirun -x DMLC_PS_ROOT_URI=<host> (Open MPI) or -genv (MPICH)"
                    }
                    Engine::Slurm => {
                        "SLURM_JOB_NODELIST is not set either: set it to the first host"
                    }
                    Engine::Kubernetes => {
                        "set PSLITE_SERVICE to the headless Service's name, or \
                         DMLC_PS_ROOT_URI to the scheduler's host"
                    }
                },
            })
        }
    }
    let port = match (opts.port, engine) {
        (Some(port), _) => port,
        // Jobs sharing a host get different ports.
        (None, Engine::Slurm) => match number(lookup, "SLURM_JOB_ID")? {
            Some(id) => slurm_port(id),
            None => DEFAULT_PORT,
        },
        (None, _) => DEFAULT_PORT,
    };
    give("DMLC_PS_ROOT_PORT", port.to_string());
    if engine == Engine::Kubernetes {
        if let Some(ip) = lookup("POD_IP").filter(|ip| !ip.trim().is_empty()) {
            give("DMLC_NODE_HOST", ip);
        }
    }
    Ok(Plan {
        engine: Some(engine),
        rank: Some(rank),
        env,
    })
}

/// Waits until `host` resolves (a Kubernetes Service record appears some
/// time after the pods start), up to `timeout`.
fn wait_resolvable(host: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        use std::net::ToSocketAddrs;
        if (host, 0)
            .to_socket_addrs()
            .is_ok_and(|mut a| a.next().is_some())
        {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        // Nothing to wait on but the resolver: ask again shortly.
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Plans this process's node, prints the plan (`dry_run`) or replaces this
/// process with `program`. Returns only on failure (or after a dry run).
pub fn run(opts: &ExecOptions, dry_run: bool, program: &[OsString]) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;
    let lookup = s::environment();
    let plan = match plan(&lookup, opts) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("pslite exec: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if dry_run {
        println!("# pslite exec: {}", plan.summary(&lookup));
        for (var, value) in &plan.env {
            println!("{var}={value}");
        }
        return std::process::ExitCode::SUCCESS;
    }
    // plan() checked the numbers.
    let verbose = s::PS_VERBOSE.read(&lookup).is_ok_and(|v| v >= 1);
    if verbose {
        eprintln!("pslite exec: {}", plan.summary(&lookup));
    }
    if plan.engine == Some(Engine::Kubernetes) {
        if let Some(host) = plan.get("DMLC_PS_ROOT_URI") {
            let secs = s::PS_START_TIMEOUT
                .read(&lookup)
                .unwrap_or(s::PS_START_TIMEOUT.kind.default);
            if !wait_resolvable(host, Duration::from_secs(secs)) {
                eprintln!(
                    "pslite exec: the scheduler's host {host} did not resolve within {secs} s \
                     (PS_START_TIMEOUT): check PSLITE_SERVICE and the headless Service"
                );
                return std::process::ExitCode::from(2);
            }
        }
    }
    let Some((program, args)) = program.split_first() else {
        eprintln!("pslite exec: no program given");
        return std::process::ExitCode::from(2);
    };
    let err = std::process::Command::new(program)
        .args(args)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .exec();
    eprintln!("pslite exec: cannot run {program:?}: {err}");
    std::process::ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn plan_of(vars: &[(&str, &str)], servers: Option<u32>) -> Result<Plan, ExecError> {
        let env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        plan(
            &|k: &str| env.get(k).cloned(),
            &ExecOptions {
                servers,
                port: None,
            },
        )
    }

    #[test]
    fn ranks_map_to_roles() {
        let roles: Vec<_> = (0..6).map(|r| role_of(r, 2)).collect();
        assert_eq!(
            roles,
            [
                "scheduler",
                "server",
                "server",
                "worker",
                "worker",
                "worker"
            ]
        );
    }

    #[test]
    fn open_mpi_on_one_host() {
        let vars = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "6"),
        ];
        let p = plan_of(&vars, Some(2)).unwrap();
        assert_eq!(p.engine, Some(Engine::OpenMpi));
        assert_eq!(p.get("DMLC_ROLE"), Some("worker"));
        assert_eq!(p.get("DMLC_NUM_SERVER"), Some("2"));
        assert_eq!(p.get("DMLC_NUM_WORKER"), Some("3"));
        assert_eq!(p.get("DMLC_PS_ROOT_URI"), Some("127.0.0.1"));
        assert_eq!(p.get("DMLC_PS_ROOT_PORT"), Some("9091"));
    }

    #[test]
    fn mpi_across_hosts_needs_the_scheduler_host() {
        let vars = [
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALNRANKS", "2"),
        ];
        let e = plan_of(&vars, None).unwrap_err().to_string();
        assert!(e.starts_with("DMLC_PS_ROOT_URI is not set"), "{e}");
        let mut vars = vars.to_vec();
        vars.push(("DMLC_PS_ROOT_URI", "head"));
        let p = plan_of(&vars, None).unwrap();
        assert_eq!(p.engine, Some(Engine::Pmi));
        assert_eq!(p.get("DMLC_ROLE"), Some("scheduler"));
        assert_eq!(p.get("DMLC_PS_ROOT_URI"), None, "the user's value stays");
        assert_eq!(p.get("DMLC_NUM_WORKER"), Some("2"));
    }

    #[test]
    fn slurm() {
        let vars = [
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "5"),
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_JOB_NODELIST", "gpu[07-09,12],cpu1"),
        ];
        let p = plan_of(&vars, None).unwrap();
        assert_eq!(p.engine, Some(Engine::Slurm));
        assert_eq!(p.get("DMLC_ROLE"), Some("server"));
        assert_eq!(p.get("DMLC_NUM_SERVER"), Some("1"));
        assert_eq!(p.get("DMLC_NUM_WORKER"), Some("3"));
        assert_eq!(p.get("DMLC_PS_ROOT_URI"), Some("gpu07"));
        assert_eq!(p.get("DMLC_PS_ROOT_PORT"), Some("13456"));
    }

    #[test]
    fn slurm_ports_stay_below_the_ephemeral_range() {
        for id in [0, 1, 19_999, 20_000, 123_456, u32::MAX] {
            let port = slurm_port(id);
            assert!((10_000..32_768).contains(&port), "job {id}: port {port}");
        }
        assert_ne!(slurm_port(7), slurm_port(8), "jobs side by side differ");
    }

    #[test]
    fn sizes_set_by_hand_must_match_the_job() {
        let job = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "6"),
        ];
        let with = |extra: &[(&'static str, &'static str)], servers| {
            let mut vars = job.to_vec();
            vars.extend_from_slice(extra);
            plan_of(&vars, servers)
        };
        let e = with(&[("DMLC_NUM_WORKER", "4")], Some(2))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "DMLC_NUM_WORKER=4 disagrees with the job: the Open MPI job has 6 processes: 1 \
             scheduler, 2 servers and 3 workers; unset DMLC_NUM_WORKER (pslite exec derives it \
             from the job), or change the job"
        );
        // Agreeing values are fine, and kept.
        let p = with(&[("DMLC_NUM_WORKER", "3")], Some(2)).unwrap();
        assert_eq!(p.get("DMLC_NUM_WORKER"), None);
        // DMLC_NUM_SERVER alone decides the servers; against --servers it
        // must agree.
        let p = with(&[("DMLC_NUM_SERVER", "2")], None).unwrap();
        assert_eq!(p.get("DMLC_ROLE"), Some("worker"));
        let e = with(&[("DMLC_NUM_SERVER", "1")], Some(2))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("DMLC_NUM_SERVER=1 disagrees with the job: --servers 2"),
            "{e}"
        );
        // Elastic workers: no more than MAX may start.
        assert!(with(&[("DMLC_NUM_WORKER", "2:4")], Some(2)).is_ok());
        assert!(with(&[("DMLC_NUM_WORKER", "1:2")], Some(2)).is_err());
    }

    #[test]
    fn numbers_are_checked_by_the_nodes_rule() {
        let job = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "6"),
        ];
        for (var, value, expected) in [
            (
                "DMLC_NUM_WORKER",
                "abc",
                "DMLC_NUM_WORKER must be a whole number from 1 to 1000000 (or MIN:MAX for \
                 elastic workers, MIN <= MAX), got \"abc\"",
            ),
            (
                "DMLC_NUM_SERVER",
                "two",
                "DMLC_NUM_SERVER must be a whole number from 1 to 1000000 (or MIN:MAX for servers \
                 that join and leave, MIN <= MAX), got \"two\"",
            ),
            (
                "PS_VERBOSE",
                "9",
                "PS_VERBOSE must be a whole number from 0 to 3 (0 warnings, 1 connections, 2 \
                 every message; 3, which ps-lite scripts set, is 2), got \"9\"",
            ),
            (
                "DMLC_ROLE",
                "chef",
                "DMLC_ROLE must be scheduler, server or worker, got \"chef\"",
            ),
        ] {
            let mut vars = job.to_vec();
            vars.push((var, value));
            assert_eq!(plan_of(&vars, None).unwrap_err().to_string(), expected);
            // Without a launcher too (DMLC_ROLE by hand).
            let by_hand = [("DMLC_ROLE", "worker"), (var, value)];
            assert_eq!(plan_of(&by_hand, None).unwrap_err().to_string(), expected);
        }
    }

    #[test]
    fn slurm_host_lists() {
        assert_eq!(first_slurm_host("node1").as_deref(), Some("node1"));
        assert_eq!(first_slurm_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_slurm_host("n[003-010]").as_deref(), Some("n003"));
        assert_eq!(first_slurm_host("n[5,7]-ib").as_deref(), Some("n5-ib"));
        assert_eq!(first_slurm_host("n[1-2],m[3-4]").as_deref(), Some("n1"));
        assert_eq!(first_slurm_host("n[1-2").as_deref(), None);
        assert_eq!(first_slurm_host("").as_deref(), None);
    }

    #[test]
    fn kubernetes_statefulset() {
        let vars = [
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("HOSTNAME", "pslite-0"),
            ("PSLITE_WORLD_SIZE", "4"),
            ("PSLITE_SERVICE", "pslite"),
            ("POD_IP", "10.1.2.3"),
        ];
        let p = plan_of(&vars, None).unwrap();
        assert_eq!(p.engine, Some(Engine::Kubernetes));
        assert_eq!(p.get("DMLC_ROLE"), Some("scheduler"));
        assert_eq!(p.get("DMLC_PS_ROOT_URI"), Some("pslite-0.pslite"));
        assert_eq!(p.get("DMLC_NODE_HOST"), Some("10.1.2.3"));
        let mut vars = vars.to_vec();
        vars[1] = ("HOSTNAME", "pslite-3");
        assert_eq!(
            plan_of(&vars, None).unwrap().get("DMLC_ROLE"),
            Some("worker")
        );
        vars.push(("JOB_COMPLETION_INDEX", "1"));
        assert_eq!(
            plan_of(&vars, None).unwrap().get("DMLC_ROLE"),
            Some("server")
        );
        vars.retain(|(k, _)| *k != "PSLITE_WORLD_SIZE");
        let e = plan_of(&vars, None).unwrap_err().to_string();
        assert!(e.starts_with("PSLITE_WORLD_SIZE is not set"), "{e}");
    }

    #[test]
    fn env_overrides_the_rule() {
        let vars = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("DMLC_ROLE", "worker"),
            ("DMLC_PS_ROOT_PORT", "9000"),
        ];
        let p = plan_of(&vars, None).unwrap();
        assert_eq!(p.get("DMLC_ROLE"), None);
        assert_eq!(p.get("DMLC_PS_ROOT_PORT"), None);
        assert_eq!(p.get("DMLC_NUM_WORKER"), Some("2"));
    }

    #[test]
    fn bad_environments_say_what_to_fix() {
        assert_eq!(plan_of(&[], None), Err(ExecError::NoEngine));
        assert!(plan_of(&[("DMLC_ROLE", "worker")], None)
            .unwrap()
            .env
            .is_empty());
        let e = plan_of(
            &[("OMPI_COMM_WORLD_RANK", "x"), ("OMPI_COMM_WORLD_SIZE", "2")],
            None,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "OMPI_COMM_WORLD_RANK must be a whole number from 0 to 4294967295, got \"x\""
        );
        let small = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
        ];
        let e = plan_of(&small, Some(2)).unwrap_err().to_string();
        assert!(e.contains("start at least 4 processes"), "{e}");
        assert_eq!(
            plan_of(&small, Some(0)),
            Err(ExecError::TooSmall {
                size: 3,
                servers: 0
            })
        );
    }
}
