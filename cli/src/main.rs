//! The `pslite` command: launch a local cluster, or run a standalone scheduler.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
mod demo;
mod launcher;

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
    /// (PS_VERBOSE, DMLC_LOCAL, ...) pass through. Output lines are prefixed
    /// with the node ([scheduler], [server 0], [worker 1]; numbered in launch
    /// order, not by rank). Exits 0 only if every node exits 0; otherwise stops
    /// the others and exits with the failed node's code (124 on timeout).
    Launch {
        /// Number of servers.
        #[arg(long, short = 's', default_value_t = 1)]
        servers: usize,
        /// Number of workers (DMLC_NUM_WORKER).
        #[arg(long, short = 'w', default_value_t = 1)]
        workers: usize,
        /// Run the workers in this many processes, each hosting
        /// workers/worker-procs workers (PSLITE_WORKERS_PER_PROCESS tells the
        /// program how many); e.g. --workers 2 --worker-procs 1.
        #[arg(long)]
        worker_procs: Option<usize>,
        /// Host to advertise and listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Scheduler port (default: a free one).
        #[arg(long)]
        port: Option<u16>,
        /// Stop every node after this many seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
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
}

fn main() -> ExitCode {
    pslite::init_logging();
    let cli = Cli::parse();
    match cli.command {
        Commands::Launch {
            servers,
            workers,
            worker_procs,
            host,
            port,
            timeout,
            program,
        } => {
            let timeout = match timeout {
                Some(t) if !(t > 0.0 && t.is_finite()) => {
                    eprintln!("pslite launch: --timeout must be a positive number of seconds");
                    return ExitCode::from(2);
                }
                t => t.map(Duration::from_secs_f64),
            };
            let mut program = program.into_iter();
            let opts = LaunchOptions {
                servers,
                workers,
                worker_procs,
                host,
                port,
                timeout,
                program: program.next().unwrap_or_default(),
                args: program.collect(),
                env: Vec::new(),
            };
            run_launch(&opts)
        }
        Commands::Demo(args) => demo::main(&args),
        Commands::Scheduler => pslite::exit_code(run_scheduler()),
    }
}

fn run_launch(opts: &LaunchOptions) -> ExitCode {
    match launch(opts) {
        Ok(Outcome::Success) => ExitCode::SUCCESS,
        Ok(Outcome::Failed { node, how, code }) => {
            eprintln!("pslite launch: {node} failed with {how}; stopped the other nodes");
            ExitCode::from(code.clamp(1, 255) as u8)
        }
        Ok(Outcome::TimedOut { running }) => {
            eprintln!(
                "pslite launch: timed out after {:.0} s; stopped {}",
                opts.timeout.unwrap_or_default().as_secs_f64(),
                running.join(", ")
            );
            ExitCode::from(124)
        }
        Err(e) => {
            eprintln!("pslite launch: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_scheduler() -> Result<(), pslite::Error> {
    let config = Config::from_lookup(|name| match (name, std::env::var(name).ok()) {
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
