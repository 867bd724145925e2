//! `kv_bench`: how fast pslite moves keys and values, next to raw ZeroMQ.
//!
//! Run without `DMLC_ROLE` it is the driver: it launches clusters of itself
//! through `pslite launch` (found next to the examples directory), collects
//! what the workers measure, measures raw ZeroMQ at the same message sizes
//! in the same run, and prints markdown tables:
//!
//! ```text
//! cargo build --release --bins --examples
//! target/release/examples/kv_bench                 # everything below
//! target/release/examples/kv_bench --only cxx      # one part: cxx, sweep, rtt, startup, replicas
//! target/release/examples/kv_bench --only scale --cxx target/cxxbench/cxx_kv_bench
//! ```
//!
//! - `cxx`: C++ ps-lite's benchmark workload: 10 M `u64` keys with `f32`
//!   values (120 MB) pushed once then pulled once per round, empty server
//!   handler, at 1 server + 1 worker and 2 + 2; the same arrays every
//!   round (as C++ ps-lite's benchmark), then again with a fresh value
//!   array per push (`cxx_fresh`: gradients change every step, keys do not;
//!   the array is made before the timer starts), each pull answered with
//!   values never sent before (the server makes them before the timer
//!   starts, as a server whose values changed since the last pull). Shared
//!   memory sends an array it already holds without a copy, so only the
//!   fresh figures say what a training step's push and pull cost.
//! - `sweep`: keys per request 1 .. 10 M, median round trip of a push (of
//!   values never sent before, made before the timer starts) and a pull
//!   (µs) and GB/s (12 bytes per key), plus requests per second with a
//!   window of requests in flight. The workers start each phase together
//!   (a barrier), as the raw clients do.
//! - `rtt`: the 1-key push round trip at 1+1 and 2+2, pslite, raw ZeroMQ
//!   over TCP and raw ZeroMQ over ipc (abstract Unix sockets, the path
//!   same-host pslite nodes take unless `PS_IPC=0`) alternating, 5 times
//!   each (medians of 2000 round trips per run), and
//!   the Rust heap allocations per round trip on the worker and the server
//!   (a counting global allocator; ZeroMQ's own are not seen).
//! - `startup`: launch to every node past the start barrier, 1+2+2, 1+32+32
//!   and 1+100+100.
//! - `replicas`: push and pull medians at 1, 1 000 and 100 000 keys, 2+2,
//!   with `PS_REPLICAS=1` (ps-lite) and `2` (each push applied by the
//!   range's backup before it is answered), 3 launches of each, alternating.
//! - `server_threads` (only when asked): 8 workers against 1 and 2 servers
//!   running the sum store on `PS_SERVER_THREADS` = 1, 2 and 4 engine
//!   threads, exact sums checked (`threads.rs`).
//! - `scale` (only when asked: it starts up to 1 001 processes): the
//!   connection job at 1+100+100, 1+250+250 and 1+500+500 beside C++
//!   ps-lite, with each node's peak memory and descriptors (`scale.rs`).
//!
//! Run with `DMLC_ROLE` (as `pslite launch` does) it is one node of such a
//! cluster; the worker prints `BENCH ...` lines for the driver. The raw
//! baseline's servers and clients are processes too (this program with the
//! hidden `--raw-server` and `--raw-client` options), S + W of them as a
//! pslite cluster has; `--raw-layout threads` runs them as threads of the
//! driver instead.
//!
//! The driver ends with machine-readable lines, one per cluster (raw is raw
//! ZeroMQ over TCP loopback, the path C++ ps-lite takes):
//!
//! ```text
//! RESULT cxx 1+1 push_ms=.. pull_ms=.. raw_push_ms=.. raw_pull_ms=..
//! RESULT cxx_fresh 1+1 push_ms=.. pull_ms=.. raw_push_ms=.. raw_pull_ms=..
//! RESULT rtt 1+1 ours_us=.. raw_us=..
//! RESULT replicas 2+2 keys=1000 k1_push_us=.. k2_push_us=.. push_ratio=.. k1_pull_us=.. k2_pull_us=..
//! ```

mod alloc;
mod driver;
mod layers;
mod node;
mod raw;
mod scale;
mod threads;

use std::process::ExitCode;

use clap::Parser;

use driver::driver;
use node::node;
use raw::{raw_client_process, raw_server_process, RawLayout};

#[derive(Parser, Clone, Debug)]
#[command(about = "pslite benchmarks (see the module docs)")]
pub(crate) struct Args {
    /// Keys of the C++-equivalent workload (and the largest sweep size).
    #[arg(long, default_value_t = 10_000_000)]
    keys: usize,
    /// Rounds of the C++-equivalent workload.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Requests in flight for the pipelined measurement.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Run only one part: cxx, sweep, rtt, startup, replicas, raw, scale,
    /// server_threads.
    #[arg(long)]
    only: Option<String>,
    /// (server_threads) keys of each worker's pushes.
    #[arg(long, default_value_t = 1_000_000)]
    threads_keys: usize,
    /// (server_threads) launches of each cluster and thread count.
    #[arg(long, default_value_t = 3)]
    threads_runs: usize,
    /// (scale) servers (and as many workers) of each cluster, comma-separated
    /// [default: 100,250,500].
    #[arg(long, value_delimiter = ',')]
    scale_sizes: Vec<usize>,
    /// (scale) launches of each cluster and library.
    #[arg(long, default_value_t = 1)]
    scale_runs: usize,
    /// (scale) C++ ps-lite's benchmark program (tests/bench/cxx_kv_bench.cc,
    /// built by `tests/bench/summary.py --build-only --ps-lite DIR`).
    #[arg(long)]
    cxx: Option<std::path::PathBuf>,
    /// (node mode) what the worker measures: cxx, cxx_fresh, sweep, rtt, startup,
    /// layers (see layers.rs).
    #[arg(long, default_value = "cxx")]
    mode: String,
    /// Servers answer on the receive thread (KVServer::set_request_handle_inline)
    /// instead of the app's thread, as ps-lite does.
    #[arg(long)]
    inline_server: bool,
    /// (raw mode) serve as raw ZeroMQ server `RANK` for the clients whose
    /// ROUTERs listen at `--raw-clients`; prints its own endpoint first.
    #[arg(long, hide = true)]
    raw_server: Option<usize>,
    /// (raw mode) the clients' endpoints, comma-separated.
    #[arg(long, hide = true, default_value = "")]
    raw_clients: String,
    /// (raw mode) listen on an abstract Unix socket instead of TCP.
    #[arg(long, hide = true)]
    raw_ipc: bool,
    /// (raw mode) serve as raw ZeroMQ client `RANK`: prints its endpoint,
    /// then takes commands on stdin.
    #[arg(long, hide = true)]
    raw_client: Option<usize>,
    /// How the raw ZeroMQ baseline's servers and clients run: each a
    /// process of its own, as pslite's nodes (the default), or all threads
    /// of this program (the layout before 2026-11-23, to compare with).
    #[arg(long, value_enum, default_value = "processes")]
    raw_layout: RawLayout,
}

fn main() -> ExitCode {
    pslite::init_logging();
    let args = Args::parse();
    if let Some(rank) = args.raw_server {
        pslite::exit_code(raw_server_process(rank, &args.raw_clients, args.raw_ipc))
    } else if let Some(rank) = args.raw_client {
        pslite::exit_code(raw_client_process(rank, args.raw_ipc))
    } else if std::env::var_os("DMLC_ROLE").is_some() && args.mode == "scale" {
        pslite::exit_code(scale::node())
    } else if std::env::var_os("DMLC_ROLE").is_some() && args.mode == "threads" {
        pslite::exit_code(threads::node(&args))
    } else if std::env::var_os("DMLC_ROLE").is_some() {
        pslite::exit_code(node(&args))
    } else {
        pslite::exit_code(driver(&args))
    }
}
