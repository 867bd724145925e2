//! The `pslite` command: launch a local cluster, or run a standalone
//! scheduler. A library so that the same command runs from the Rust binary
//! (`src/main.rs`) and from the Python package (`pip install ./python`
//! puts a `pslite` script on the venv's PATH that calls [`main_with`]).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap::{Parser, Subcommand};
mod add_worker;
mod checkpoint;
mod demo;
mod exec;
mod launcher;
mod status;
mod store;
mod supervisor;

use launcher::{launch, LaunchOptions, Outcome};
use pslite::{Config, Postoffice, Role};

#[derive(Parser)]
#[command(
    name = "pslite",
    version,
    about = "A parameter-server runtime compatible with ps-lite"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run 1 scheduler, S servers and W workers of PROGRAM on this machine.
    ///
    /// Every node gets DMLC_ROLE, DMLC_NUM_SERVER, DMLC_NUM_WORKER,
    /// DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT and DMLC_NODE_HOST (and
    /// PSLITE_LAUNCH_UNIX_NS, the launch time in ns since 1970) and, unless
    /// GLIBC_TUNABLES is set, GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (huge
    /// pages for large buffers: big pushes and pulls run faster); other variables
    /// (PS_VERBOSE, DMLC_LOCAL, ...) pass through, checked once before any node
    /// starts. DMLC_INTERFACE and PORT are refused (use --host; each server
    /// and worker gets a PORT of its own, by which the launcher finds its
    /// node id in the scheduler's table).
    ///
    /// First it prints the scheduler's address and the `pslite status`
    /// command that shows the job. Output lines are prefixed with the node
    /// by role and rank, its node id in parentheses once the scheduler
    /// assigned it: [scheduler], [server 0 (node 8)], [worker 1 (node 11)]
    /// (elastic workers change rank every round and go by node id:
    /// [worker (node 13)]). A node's lines are held for up to 3 s until
    /// its id is known.
    ///
    /// Exits 0 only if every node exits 0 (with --workers MIN:MAX, a worker
    /// that fails or is killed is only named: the job goes on and the
    /// others' exits decide). When a node fails, the launcher
    /// waits up to 2 s for the scheduler to end on its own (its error says who
    /// never registered, and is printed last), stops the others and exits with
    /// the failed node's code (128 + signal if killed), after a table of the
    /// nodes that failed (node, rank, exit, time, first error line). A node
    /// that exits 0
    /// while others keep running is named after 3 s and fails the job after
    /// --exit-grace. Exits 124 on --timeout and 128 + signal on SIGINT, SIGTERM
    /// or SIGHUP (saying so; a second one kills the nodes at once). The
    /// nodes, and whatever they started, die with the launcher even when it
    /// is killed with SIGKILL.
    #[command(after_long_help = pslite::settings::help())]
    Launch {
        /// Number of servers [default: 1; with --add-worker, what the cluster
        /// recorded].
        #[arg(long, short = 's')]
        servers: Option<usize>,
        /// Number of workers (DMLC_NUM_WORKER) [default: 1], or MIN:MAX for
        /// elastic workers: every node gets DMLC_NUM_WORKER=MIN:MAX, MIN
        /// workers are started (--start-workers), more can join
        /// (--add-worker), and a worker that dies or leaves does not fail
        /// the job (its round ends; the scheduler's and the other nodes'
        /// exits decide the job's).
        #[arg(long, short = 'w', value_parser = worker_count)]
        workers: Option<WorkerCount>,
        /// With --workers MIN:MAX, start this many workers [default: MIN].
        #[arg(long, value_name = "N")]
        start_workers: Option<usize>,
        /// Start one more worker of PROGRAM for the running elastic cluster
        /// whose scheduler is at --host/--port (default DMLC_PS_ROOT_URI,
        /// else 127.0.0.1, and DMLC_PS_ROOT_PORT), and follow it like any
        /// node: exits with its code. The cluster must have been started by
        /// `pslite launch --workers MIN:MAX` (it records its shape in the
        /// scheduler's store, key pslite.launch), or give --workers MIN:MAX
        /// and --servers yourself.
        #[arg(long)]
        add_worker: bool,
        /// Run the workers in this many processes, each hosting
        /// workers/worker-procs workers (PSLITE_WORKERS_PER_PROCESS tells the
        /// program how many); e.g. --workers 2 --worker-procs 1.
        #[arg(long)]
        worker_procs: Option<usize>,
        /// Host to advertise and listen on [default: 127.0.0.1; with
        /// --add-worker, DMLC_PS_ROOT_URI if set].
        #[arg(long)]
        host: Option<String>,
        /// Scheduler port (default: a free one, held by the launcher until
        /// the job ends; the scheduler binds it with SO_REUSEADDR, as
        /// ZeroMQ does).
        #[arg(long)]
        port: Option<u16>,
        /// Stop every node after this many seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// Also write each node's output (stdout and stderr, unprefixed) to
        /// a file of its own in DIR: scheduler.log, server-0.log,
        /// worker-1.log, ... (elastic workers: worker-node-13.log).
        #[arg(long, value_name = "DIR")]
        log_dir: Option<std::path::PathBuf>,
        /// After a node exits 0, stop the job as failed if the others still
        /// run this many seconds later (a server that forgot to finalize).
        #[arg(long, default_value_t = 30.0, value_name = "SECS")]
        exit_grace: f64,
        /// Restart a failed node of this role with the same program and
        /// environment (e.g. server, with PS_HEARTBEAT_* and PS_RESEND=1 so
        /// the replacement takes over the dead node's id: kv_recovery).
        #[arg(long, value_name = "ROLE")]
        restart_on_failure: Option<RestartRole>,
        /// At most this many restarts in all (--restart-on-failure).
        #[arg(long, default_value_t = 3, value_name = "N")]
        max_restarts: u32,
        /// A `pslite.torch` job: the scheduler and the servers run natively
        /// (this command's `pslite scheduler` and `pslite torch-server`) and
        /// only the workers run PROGRAM, so they start in well under a
        /// second and never import torch. For jobs whose servers are
        /// `pslite.torch.init()`'s (DistributedOptimizer, broadcasts), not
        /// ones that serve apps of their own.
        #[arg(long, conflicts_with_all = ["scheduler_program", "server_program"])]
        torch: bool,
        /// A `pslite.torch` job with its servers inside the workers'
        /// processes: no server process runs, each worker also serves a
        /// slice of the keys (--servers is the number of workers), so that
        /// slice never crosses its host's link (PSLITE_COLOCATE=1).
        #[arg(long, conflicts_with_all = ["server_program", "worker_procs", "add_worker"])]
        colocate: bool,
        /// The scheduler's program instead of PROGRAM; `pslite` runs this
        /// binary's `pslite scheduler` (e.g. for mxnet_server and mxnet_worker).
        #[arg(long, value_name = "PROGRAM")]
        scheduler_program: Option<OsString>,
        /// The servers' program instead of PROGRAM (no arguments).
        #[arg(long, value_name = "PROGRAM")]
        server_program: Option<OsString>,
        /// The workers' program instead of PROGRAM (no arguments).
        #[arg(long, value_name = "PROGRAM")]
        worker_program: Option<OsString>,
        /// The program every node runs (unless its role has its own) and its
        /// arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<OsString>,
    },
    /// Train a sparse logistic-regression model on a local cluster of this
    /// program: the main job.
    ///
    /// Starts 1 scheduler, the servers and the workers (each this program
    /// again) on 127.0.0.1. Workers generate a deterministic synthetic data
    /// set, pull the weights of each minibatch's keys and push gradients;
    /// servers apply them with SGD or AdaGrad. Prints the test loss and
    /// accuracy after each epoch, then the final accuracy, the wall time and
    /// the bytes moved; exits 1 if the accuracy is below --threshold.
    Demo(demo::DemoArgs),
    /// Run a standalone scheduler configured from the environment
    /// (DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT),
    /// for a cluster of any ps-lite programs. DMLC_ROLE may be unset.
    Scheduler,
    /// Run one server of a `pslite.torch` job natively, configured from the
    /// environment (DMLC_ROLE=server and the rest, as `pslite launch` sets
    /// them): the apps `pslite.torch.init()` serves on a server (float32
    /// app 0, raw bytes app 1, float64 app 2, each summing or averaging a
    /// round of every worker's pushes in rank order), until every node
    /// finalizes. `pslite launch --torch` runs it on every server.
    TorchServer,
    /// Run PROGRAM as one node of a cluster started by mpirun, srun or
    /// Kubernetes: the role and cluster size come from the launcher.
    ///
    /// Rank 0 is the scheduler, ranks 1..=SERVERS are servers, the rest are
    /// workers. Reads Open MPI (OMPI_COMM_WORLD_RANK/SIZE), PMI
    /// (PMI_RANK/SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS, the first host of
    /// SLURM_JOB_NODELIST as the scheduler) or Kubernetes (the pod's
    /// StatefulSet ordinal or JOB_COMPLETION_INDEX, PSLITE_WORLD_SIZE pods,
    /// PSLITE_SERVICE the headless Service; POD_IP advertised). Sets
    /// DMLC_ROLE, DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI and
    /// DMLC_PS_ROOT_PORT, except those already set, then runs PROGRAM in
    /// place of itself.
    Exec {
        /// Number of servers (default: DMLC_NUM_SERVER, else 1).
        #[arg(long, short = 's')]
        servers: Option<u32>,
        /// The scheduler's port (default: DMLC_PS_ROOT_PORT, else derived
        /// from SLURM_JOB_ID under Slurm, else 9091).
        #[arg(long)]
        port: Option<u16>,
        /// Print the variables PROGRAM would get and exit.
        #[arg(long)]
        dry_run: bool,
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<OsString>,
    },
    /// Show a running cluster: the scheduler's node table (id, role, rank,
    /// address, last heard, alive/dead, recovered) and every node's counters
    /// (messages, bytes, requests in flight, resends, drops, handler time).
    ///
    /// Asks the scheduler at --host/--port (default DMLC_PS_ROOT_URI and
    /// DMLC_PS_ROOT_PORT); it must be a pslite scheduler. Nodes send their
    /// counters with their heartbeats (every second by default, PS_HEARTBEAT_INTERVAL).
    Status(status::StatusArgs),
    /// Read or change a running cluster's key-value store (hosted by its
    /// scheduler): get (waits until the key is set), set, add, wait, keys,
    /// delete.
    ///
    /// Asks the scheduler at --host/--port (default DMLC_PS_ROOT_URI and
    /// DMLC_PS_ROOT_PORT); it must be a pslite scheduler. Exits 1 if the
    /// keys are not set before --timeout, or the scheduler does not answer.
    Store(store::StoreArgs),
    /// Take a checkpoint of a running cluster: every server writes its key
    /// ranges to the scheduler's PS_CHECKPOINT_DIR at the workers' next
    /// barrier (consistent across servers); prints where once complete.
    ///
    /// A job started again with the same PS_CHECKPOINT_DIR restores the
    /// newest complete checkpoint before serving. Exits 1 if the checkpoint
    /// is refused or fails, 2 if the scheduler does not answer. `pslite
    /// checkpoint export DIR --out OUT` writes a pslite.torch job's
    /// embedding tables from a checkpoint as NumPy files for serving.
    Checkpoint(checkpoint::CheckpointArgs),
}

/// How this command runs itself again (the scheduler of `--scheduler-program
/// pslite`, the demo's nodes), and the Python its Python children use.
#[derive(Clone, Debug, Default)]
pub struct Invocation {
    /// The program and leading arguments that run this command: e.g.
    /// `[/venv/bin/python, -m, pslite]`. Empty: this executable.
    pub program: Vec<OsString>,
    /// The Python interpreter the command runs in (`sys.executable`): its
    /// directory goes first on the nodes' PATH (a venv's `bin/`, so
    /// `python` and the venv's scripts are the venv's), and a node program
    /// that is a `.py` file runs under it.
    pub python: Option<PathBuf>,
}

static INVOCATION: OnceLock<Invocation> = OnceLock::new();

/// The invocation set by [`main_with`] (default: this executable, no Python).
pub fn invocation() -> Invocation {
    INVOCATION.get().cloned().unwrap_or_default()
}

/// The program and leading arguments that run this command again.
pub fn self_program() -> std::io::Result<Vec<OsString>> {
    let inv = invocation();
    if !inv.program.is_empty() {
        return Ok(inv.program);
    }
    Ok(vec![std::env::current_exe()?.into_os_string()])
}

/// The `pslite` command with the process's own arguments.
pub fn main() -> ExitCode {
    main_with(std::env::args_os(), Invocation::default())
}

/// The `pslite` command with arguments `args` (the first is the program's
/// name), run as `invocation` says.
pub fn main_with(args: impl IntoIterator<Item = OsString>, invocation: Invocation) -> ExitCode {
    let _ = INVOCATION.set(invocation);
    pslite::init_logging();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match cli.command {
        Commands::Launch {
            servers,
            workers,
            start_workers,
            add_worker,
            worker_procs,
            host,
            port,
            timeout,
            log_dir,
            exit_grace,
            restart_on_failure,
            max_restarts,
            torch,
            colocate,
            scheduler_program,
            server_program,
            worker_program,
            program,
        } => {
            let timeout = match timeout {
                Some(t) if !(t > 0.0 && t.is_finite()) => {
                    eprintln!("pslite launch: --timeout must be a positive number of seconds");
                    return ExitCode::from(2);
                }
                t => t.map(Duration::from_secs_f64),
            };
            if !(exit_grace >= 0.0 && exit_grace.is_finite()) {
                eprintln!("pslite launch: --exit-grace must be a number of seconds, 0 or more");
                return ExitCode::from(2);
            }
            // --torch conflicts with both programs (clap refuses the pair).
            let native_scheduler = torch || scheduler_program.as_deref() == Some("pslite".as_ref());
            let scheduler_program = if native_scheduler {
                match self_command("scheduler") {
                    Ok(me) => Some(me),
                    Err(code) => return code,
                }
            } else {
                scheduler_program.map(|p| vec![p])
            };
            let server_program = if torch {
                match self_command("torch-server") {
                    Ok(me) => Some(me),
                    Err(code) => return code,
                }
            } else {
                server_program.map(|p| vec![p])
            };
            let mut program = program.into_iter();
            let shape = match launch_shape(servers, workers, start_workers, add_worker)
                .and_then(|shape| colocated_shape(shape, servers, colocate))
            {
                Ok(shape) => shape,
                Err(e) => {
                    eprintln!("pslite launch: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut opts = LaunchOptions {
                servers: shape.servers,
                workers: shape.workers,
                elastic: shape.elastic,
                worker_procs,
                host: host.clone().unwrap_or_else(|| "127.0.0.1".into()),
                port,
                timeout,
                program: program.next().unwrap_or_default(),
                args: program.collect(),
                scheduler_program,
                server_program,
                worker_program: worker_program.map(|p| vec![p]),
                python: crate::invocation().python,
                exit_grace: Duration::from_secs_f64(exit_grace),
                restart_role: restart_on_failure.map(|r| match r {
                    RestartRole::Server => Role::Server,
                    RestartRole::Worker => Role::Worker,
                }),
                max_restarts,
                log_dir,
                colocate,
                ..LaunchOptions::default()
            };
            if add_worker {
                return add_worker::run(&mut opts, host, servers, workers);
            }
            run_launch(&opts)
        }
        Commands::Demo(args) => demo::main(&args),
        Commands::Scheduler => pslite::exit_code(run_scheduler()),
        Commands::TorchServer => pslite::exit_code(run_torch_server()),
        Commands::Exec {
            servers,
            port,
            dry_run,
            program,
        } => exec::run(&exec::ExecOptions { servers, port }, dry_run, &program),
        Commands::Status(args) => status::main(&args),
        Commands::Store(args) => store::main(&args),
        Commands::Checkpoint(args) => checkpoint::main(&args),
    }
}

/// This command with `subcommand` (`pslite scheduler`), for a node to run;
/// the exit code to return when this program cannot be found.
fn self_command(subcommand: &str) -> Result<Vec<OsString>, ExitCode> {
    match self_program() {
        Ok(mut me) => {
            me.push(subcommand.into());
            Ok(me)
        }
        Err(e) => {
            eprintln!("pslite launch: cannot find this program to run `pslite {subcommand}`: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// `--workers`: a number, or elastic bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerCount {
    /// Exactly this many workers.
    Fixed(usize),
    /// Elastic workers, MIN:MAX.
    Elastic(usize, usize),
}

fn worker_count(s: &str) -> Result<WorkerCount, String> {
    if s.contains(':') {
        return launcher::parse_bounds(s)
            .map(|(min, max)| WorkerCount::Elastic(min, max))
            .ok_or_else(|| format!("expected MIN:MAX with 1 <= MIN <= MAX, got {s:?}"));
    }
    match s.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(WorkerCount::Fixed(n)),
        _ => Err(format!(
            "expected a positive number of workers, or MIN:MAX, got {s:?}"
        )),
    }
}

/// Servers, workers to start and elastic bounds, from the options.
struct Shape {
    servers: usize,
    workers: usize,
    elastic: Option<(usize, usize)>,
}

fn launch_shape(
    servers: Option<usize>,
    workers: Option<WorkerCount>,
    start_workers: Option<usize>,
    add_worker: bool,
) -> Result<Shape, String> {
    let servers = servers.unwrap_or(1);
    match (workers, start_workers) {
        (Some(WorkerCount::Elastic(min, max)), start) => {
            let start = start.unwrap_or(min);
            if start == 0 || start > max {
                return Err(format!(
                    "--start-workers {start} must be from 1 to MAX ({max}) of --workers {min}:{max}"
                ));
            }
            Ok(Shape {
                servers,
                workers: if add_worker { 1 } else { start },
                elastic: Some((min, max)),
            })
        }
        (_, Some(_)) => Err("--start-workers goes with --workers MIN:MAX".into()),
        (Some(WorkerCount::Fixed(_)), None) if add_worker => Err(
            "--add-worker joins an elastic cluster: give its --workers as MIN:MAX, or leave \
             it out to read it from the cluster"
                .into(),
        ),
        (Some(WorkerCount::Fixed(n)), None) => Ok(Shape {
            servers,
            workers: n,
            elastic: None,
        }),
        (None, None) => Ok(Shape {
            servers,
            workers: 1,
            elastic: None,
        }),
    }
}

/// With --colocate, a server per worker: --servers, if given, must say so.
fn colocated_shape(shape: Shape, servers: Option<usize>, colocate: bool) -> Result<Shape, String> {
    if !colocate {
        return Ok(shape);
    }
    if shape.elastic.is_some() {
        return Err("--colocate needs a fixed number of workers, not MIN:MAX".into());
    }
    match servers {
        Some(s) if s != shape.workers => Err(format!(
            "--colocate runs one server in each worker's process: leave out --servers, or give \
             --servers {} (the number of workers), not {s}",
            shape.workers
        )),
        _ => Ok(Shape {
            servers: shape.workers,
            ..shape
        }),
    }
}

/// Which nodes `--restart-on-failure` restarts.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum RestartRole {
    /// Servers.
    Server,
    /// Workers.
    Worker,
}

fn run_launch(opts: &LaunchOptions) -> ExitCode {
    match launch(opts) {
        Ok(Outcome::Success) => ExitCode::SUCCESS,
        Ok(outcome) => {
            for line in outcome.lines() {
                eprintln!("pslite launch: {line}");
            }
            ExitCode::from(outcome.exit_code())
        }
        Err(e) => {
            eprintln!("pslite launch: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_scheduler() -> Result<(), pslite::Error> {
    let env = pslite::settings::environment();
    let config = Config::from_lookup(|name| match (name, env(name)) {
        ("DMLC_ROLE", None) => Some("scheduler".into()),
        (_, value) => value,
    })?;
    if config.role() != Role::Scheduler {
        return Err(pslite::ConfigError::Invalid {
            var: "DMLC_ROLE",
            value: config.role().to_string(),
            expected: "scheduler (or unset) for `pslite scheduler`",
        }
        .into());
    }
    let po = Postoffice::new(config);
    po.start(0, true)?;
    println!(
        "scheduler: cluster of {} servers and {} workers formed",
        po.num_servers(),
        po.num_workers()
    );
    po.finalize(0, true)?;
    println!("scheduler: every node finalized");
    Ok(())
}

fn run_torch_server() -> Result<(), pslite::Error> {
    let po = Postoffice::from_env()?;
    if !po.is_server() {
        return Err(pslite::ConfigError::Invalid {
            var: "DMLC_ROLE",
            value: po.role().to_string(),
            expected: "server for `pslite torch-server` (`pslite launch --torch` runs it)",
        }
        .into());
    }
    po.start(0, true)?;
    pslite::serve_all_reduce(&po)
}
