//! The settings table: every environment variable pslite reads, declared
//! once with its kind (type and range), default, who reads it and its doc.
//! Parsing and its errors (`DMLC_NUM_SERVER must be a whole number from 1
//! to 1000000 (...), got "x"`), the README's table ([`markdown`], checked by
//! a test), `pslite launch --help` ([`help`]) and the launcher's check of
//! everything set ([`check`]) come from it.
//!
//! Nothing else reads the environment (`tests/structure/run.sh` checks it):
//! a reader takes a declared variable, [`Var::get`] for this process's
//! environment or [`Var::read`] through a lookup (the launcher's: the
//! variables it gives a node first). Variables other programs define
//! (`PATH`, `RUST_LOG`, MPI's and Slurm's) are read through [`foreign`].
//!
//! To add a setting: one entry below, and the code that uses its value
//! (for a node's, a field of `Config` or `VanConfig` set in
//! `Config::from_lookup`); then regenerate the README's table
//! (`PSLITE_BLESS=1 cargo test --release -p pslite-postoffice --lib readme`).
//!
//! A hand-written table rather than a crate: clap's `env` attributes and
//! envy read only the process environment (the launcher checks a node's
//! environment before the node exists), and none of them produces our
//! errors or the README's table.

mod kinds;

#[cfg(test)]
pub(crate) use kinds::{bytes_text, parse_bytes};
pub use kinds::{
    Flag, Kind, MaybeFlag, NodeCount, Nodes, Num, Numeric, Required, RoleName, Secret, Text, Unit,
};

use crate::config::ConfigError;
use pslite_van::checkpoint::{DEFAULT_KEEP, DEFAULT_TIMEOUT};
use pslite_van::store::DEFAULT_MAX_VALUE;
use pslite_van::DEFAULT_PARTITION_BYTES;

/// A lookup of variables: a name to its value, if set.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// One declared variable.
#[derive(Debug)]
pub struct Var<K> {
    /// Its name.
    pub name: &'static str,
    /// Its kind: type, range and default.
    pub kind: K,
    /// Who reads it.
    pub readers: &'static str,
    /// What it does.
    pub doc: &'static str,
}

impl<K: Kind> Var<K> {
    /// Its value through `lookup`, by the rule of its kind.
    pub fn read(&self, lookup: Lookup) -> Result<K::Value, ConfigError> {
        self.kind.read(self.name, lookup(self.name))
    }

    /// Its value in this process's environment.
    pub fn get(&self) -> Result<K::Value, ConfigError> {
        self.read(&process)
    }

    /// Whether `lookup` has it set (not blank).
    pub fn is_set(&self, lookup: Lookup) -> bool {
        lookup(self.name).is_some_and(|v| !v.trim().is_empty())
    }
}

impl<T, K: Kind<Value = Option<T>>> Var<Required<K>> {
    /// Its value through `lookup`, `None` when unset (for a reader that
    /// does not need it).
    pub fn if_set(&self, lookup: Lookup) -> Result<Option<T>, ConfigError> {
        self.kind.0.read(self.name, lookup(self.name))
    }
}

/// A declared variable, whatever its kind: what the table shows.
pub trait Setting: Sync {
    /// Its name.
    fn name(&self) -> &'static str;
    /// The values it takes.
    fn values(&self) -> String;
    /// What it is when unset.
    fn default(&self) -> String;
    /// Who reads it.
    fn readers(&self) -> &'static str;
    /// What it does, on one line.
    fn doc(&self) -> String;
    /// Its range, if it is a number.
    fn range(&self) -> Option<Numeric>;
    /// Reads it through `lookup`, keeping only the error.
    fn check(&self, lookup: Lookup) -> Result<(), ConfigError>;
}

impl<K: Kind + Sync> Setting for Var<K> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn values(&self) -> String {
        self.kind.values()
    }
    fn default(&self) -> String {
        self.kind.default()
    }
    fn readers(&self) -> &'static str {
        self.readers
    }
    fn doc(&self) -> String {
        self.doc.split_whitespace().collect::<Vec<_>>().join(" ")
    }
    fn range(&self) -> Option<Numeric> {
        self.kind.range()
    }
    fn check(&self, lookup: Lookup) -> Result<(), ConfigError> {
        self.read(lookup).map(drop)
    }
}

/// Declares each variable once: a constant of its name (a [`Var`]) and
/// its row of [`SETTINGS`].
macro_rules! settings {
    ($( $(#[doc = $doc:literal])* $name:ident: $kind:ty = $value:expr, $readers:literal; )*) => {
        $(
            $(#[doc = $doc])*
            pub const $name: Var<$kind> = Var {
                name: stringify!($name),
                kind: $value,
                readers: $readers,
                doc: concat!($($doc, "\n"),*),
            };
        )*
        /// Every variable, in the README's order.
        pub const SETTINGS: &[&dyn Setting] = &[$(&$name),*];
    };
}

/// The most servers, or workers, a cluster may have (node ids are 32-bit:
/// this is far below where they run out).
pub const MAX_NODES_PER_ROLE: u64 = 1_000_000;
/// The longest time any `*_TIMEOUT`/`*_INTERVAL` variable takes: a week.
const WEEK: u64 = 7 * 86_400;
/// The most any count of messages, keys or requests takes.
const MAX_COUNT: u64 = 1_000_000_000;
/// The largest size any byte variable takes: 1 TiB.
const MAX_BYTES: u64 = 1 << 40;
const SECONDS: Numeric = Numeric::new(Unit::Seconds, 1, WEEK);
const COUNT: Numeric = Numeric::new(Unit::Count, 1, MAX_COUNT);
const BYTES: Numeric = Numeric::new(Unit::Bytes, 1, MAX_BYTES);
const NODES: Numeric = Numeric::new(Unit::Count, 1, MAX_NODES_PER_ROLE);
const PORT_NUMBER: Numeric = Numeric::new(Unit::Port, 1, 65_535);
const ONE_HOUR_MS: u64 = 3_600_000;

settings! {
    /// the node's role
    DMLC_ROLE: Required<RoleName> = Required(RoleName, "set it to scheduler, server or worker"),
        "every node";
    /// servers in the cluster; `MIN:MAX` for servers that join and leave (see "Replicated key
    /// ranges")
    DMLC_NUM_SERVER: Required<Nodes> = Required(
        Nodes(NODES.note("or MIN:MAX for servers that join and leave, MIN <= MAX")),
        "set it to a positive integer or MIN:MAX",
    ), "every node, pslite exec";
    /// workers in the cluster; `MIN:MAX` for elastic workers (see "Elastic workers")
    DMLC_NUM_WORKER: Required<Nodes> = Required(
        Nodes(NODES.note("or MIN:MAX for elastic workers, MIN <= MAX")),
        "set it to a positive integer or MIN:MAX",
    ), "every node, pslite exec";
    /// where the scheduler listens (IPv4, IPv6 like `fd00::10`, or a name in DNS or
    /// `/etc/hosts`)
    DMLC_PS_ROOT_URI: Required<Text> = Required(
        Text("an IP or host name"),
        "set it to the scheduler's IP or host name (e.g. 127.0.0.1)",
    ), "every node, pslite status/store/checkpoint";
    /// the scheduler's port
    DMLC_PS_ROOT_PORT: Required<Numeric> = Required(PORT_NUMBER, "set it to the scheduler's port"),
        "every node, pslite status/store/checkpoint";
    /// the address this node advertises; unset: the address of `DMLC_INTERFACE`, else 127.0.0.1
    /// when the scheduler is on loopback, else this machine's first non-loopback IPv4 address
    /// (`eth0`-like names); `pslite launch` sets it (`--host`)
    DMLC_NODE_HOST: Text = Text("an IP or host name"), "every node";
    /// the interface whose IPv4 address this node advertises (`DMLC_INTERFACE=eth1` on a machine
    /// with several); `pslite launch` refuses it (it sets `DMLC_NODE_HOST`)
    DMLC_INTERFACE: Text = Text("a network interface"), "every node";
    /// this node's port (unset: a free one); `pslite launch` refuses it (it gives every server and
    /// worker its own)
    PORT: Numeric = PORT_NUMBER, "servers and workers";
    /// bind another address than the advertised one, e.g. `0.0.0.0` in containers
    PS_BIND_HOST: Text = Text("an IP or host name"), "every node";
    /// `1`: IPC sockets (`ipc:///tmp/<port>`) instead of TCP (a pslite node removes its socket
    /// file when it stops)
    DMLC_LOCAL: Flag = Flag(false), "every node, pslite status/store/checkpoint";
    /// send high-water mark per peer (unset: ZeroMQ's)
    DMLC_PS_WATER_MARK: Numeric = COUNT, "every node";
    /// 1 logs connections, 2 every message (or `RUST_LOG`: a level, `warn`, or `target=level`
    /// entries, `pslite_van=trace,info`)
    PS_VERBOSE: Num = Numeric::new(Unit::Count, 0, 3)
        .note("0 warnings, 1 connections, 2 every message; 3, which ps-lite scripts set, is 2")
        .or(0), "every node, pslite launch";
    /// seconds to wait for the cluster to form, then fail saying who is missing
    PS_START_TIMEOUT: Num = SECONDS.or(300), "every node, pslite exec";
    /// how often pslite nodes send heartbeats; 0 turns heartbeats (and so deaths) off. See
    /// `PS_HEARTBEAT_TIMEOUT`
    PS_HEARTBEAT_INTERVAL: Num = Numeric::new(Unit::Seconds, 0, WEEK)
        .note("0 = no heartbeats")
        .or(1), "every node";
    /// the scheduler declares a node that stops sending heartbeats for this long dead and tells
    /// the pslite nodes (a restarted node takes a dead node's id); a node that stops hearing the
    /// scheduler for the timeout says so and keeps calling it (four heartbeats per interval) for
    /// `PS_RECOVERY_TIMEOUT` more, carrying on if it answers (a scheduler that declared it dead
    /// meanwhile takes it back), and only then fails every wait with "lost the scheduler"; a
    /// scheduler whose connection closed for good (its process is gone) still ends the nodes at
    /// once. Under `PS_RESEND=1` heartbeats are resent like any message, within milliseconds, so
    /// 10% message loss with a 1 s interval and a 2 s timeout declares nobody dead (`kv_loss`:
    /// 20/20 launches exact, no false death). Left unset, the timeout only watches nodes that send
    /// heartbeats (C++ nodes do not by default, and are never declared dead); set, it applies to
    /// every node, as in ps-lite, and must exceed the interval. A process that is gone is noticed
    /// sooner: its connections close, and when ZeroMQ cannot open a new one within 1 s it is dead,
    /// C++ nodes without heartbeats too (kill -9 of a worker: declared dead after about 1 s, the
    /// others fail 30 s later). A process that is stopped (SIGSTOP, a VM pause, swapping) keeps its
    /// connections: only the timeout notices it, and when it runs again before anything replaced
    /// it, the scheduler takes it back and the job goes on (a server of replicated key ranges
    /// rejoins as a fresh replica); if something did, it is told so and stops
    PS_HEARTBEAT_TIMEOUT: Num = Numeric::new(Unit::Seconds, 0, WEEK)
        .note("0 = nobody is declared dead")
        .or(10), "every node";
    /// seconds a dead node may stay unreplaced: then barriers that wait for it and requests sent to
    /// it fail with "node N is dead" instead of waiting forever; also how long past
    /// `PS_HEARTBEAT_TIMEOUT` a node keeps calling a silent scheduler before it stops
    PS_RECOVERY_TIMEOUT: Num = SECONDS.or(30), "every node";
    /// copies of each key range (1 is ps-lite's; pslite-only above 1): a push is answered once
    /// every live copy has it, a dead server's ranges fail over to their next copy with no
    /// restart, and a server that replaces it gets copies back (see "Replicated key ranges")
    PS_REPLICAS: Num = Numeric::new(Unit::Count, 1, 64)
        .note("copies of each key range, at most DMLC_NUM_SERVER")
        .or(1), "scheduler, pslite launch";
    /// elastic workers (`DMLC_NUM_WORKER=MIN:MAX`): how long the first round waits for more
    /// workers once it has MIN
    PS_RDZV_LAST_CALL: Num = Numeric::new(Unit::Seconds, 0, WEEK).or(1), "scheduler";
    /// elastic workers: how long a job may stay below MIN workers before it fails
    PS_RDZV_TIMEOUT: Num = SECONDS.or(120), "scheduler";
    /// pslite-only: where servers write checkpoints of their key ranges and the scheduler their
    /// manifests (on demand with `pslite checkpoint`); one job at a time (a lock); a job started
    /// with it resumes the checkpoint there its `LATEST` names before serving, says which, and
    /// refuses a damaged, missing or foreign one naming the file (see "Checkpoints")
    PS_CHECKPOINT_DIR: Text = Text("a directory"), "scheduler and servers";
    /// with `PS_CHECKPOINT_DIR`: seconds between automatic checkpoints (unset: on demand only)
    PS_CHECKPOINT_INTERVAL: Numeric = SECONDS.note("needs PS_CHECKPOINT_DIR"),
        "scheduler and servers";
    /// with `PS_CHECKPOINT_DIR`: seconds a checkpoint or a restore may take
    PS_CHECKPOINT_TIMEOUT: Num = SECONDS.or(DEFAULT_TIMEOUT.as_secs()), "scheduler and servers";
    /// with `PS_CHECKPOINT_DIR`: complete checkpoints kept
    PS_CHECKPOINT_KEEP: Num = Numeric::new(Unit::Count, 1, 1_000).or(DEFAULT_KEEP as u64),
        "scheduler";
    /// `1`: start a new job in a `PS_CHECKPOINT_DIR` that holds checkpoints instead of resuming
    /// (without it, complete checkpoints there but none named to resume stop the job at start;
    /// checkpoints that never completed alone do not: the job starts fresh, saying so)
    PS_CHECKPOINT_FRESH: Flag = Flag(false), "scheduler";
    /// `1`: acknowledge every message and resend unacknowledged ones. The first wait follows the
    /// measured round trip to each peer, as TCP's retransmission timeout (smoothed round trip + 4
    /// × its variation, from acknowledgements of messages sent once; at least 5 ms, plus 1 ms per
    /// 100 kB of a large message), never longer than `PS_RESEND_TIMEOUT`; each resend waits twice
    /// as long, up to 8 timeouts. A message is given up on after 10 resends and no sooner than the
    /// timeout alone would give up (1+2+4+8×8 timeouts); a request never acknowledged fails with
    /// an error. On loopback a lost message costs milliseconds
    PS_RESEND: Flag = Flag(false), "every node";
    /// under `PS_RESEND=1`: the longest first wait for an acknowledgement, also the wait before
    /// any round trip is measured
    PS_RESEND_TIMEOUT: Num = Numeric::new(Unit::Milliseconds, 1, ONE_HOUR_MS).or(1000),
        "every node";
    /// drop this percentage of received messages (for testing the resender; warns when
    /// `PS_RESEND` is off)
    PS_DROP_MSG: Num = Numeric::new(Unit::Percent, 0, 100).or(0), "every node";
    /// serve this node's counters in Prometheus text format at `http://host:port/metrics` (unset:
    /// off; the next free port if another node of the machine has it; 0 = any)
    PS_METRICS_PORT: Numeric = Numeric::new(Unit::Port, 0, 65_535).note("0 = any free port"),
        "every node";
    /// data messages an app's queue holds; when it is full the node stops reading until the app
    /// has taken half (back-pressure on the senders, through ZeroMQ's high-water marks), while its
    /// heartbeats go on
    PS_QUEUE_LIMIT: Num = COUNT.or(100_000), "every node";
    /// threads a server runs a concurrent request handle on (`KVServer::set_concurrent_handle`,
    /// e.g. the sum store `DefaultHandle`, or `set_concurrent_request_handle` with a closure;
    /// `KVServer::set_threads` per server): each thread owns the keys that hash to it, requests on
    /// disjoint keys run in parallel, requests on one key in arrival order, and the worker gets
    /// the response one thread would give (see "Writing one")
    PS_SERVER_THREADS: Num = Numeric::new(Unit::Count, 1, 256).or(1), "servers";
    /// bounded staleness `s` (unset: asynchronous, as ps-lite, at no cost). A worker's pulls are
    /// answered only once every live worker's pushes of clocks up to `clock - s - 1` are applied
    /// at that server, so no worker runs more than `s` iterations ahead of the slowest; `0` is
    /// synchronous. End each iteration with `KVWorker::clock()` (Python `kv.clock()`);
    /// `KVWorker::set_staleness` (Python `kv.staleness = s`) per worker. A worker the scheduler
    /// declares dead leaves the bound at once. Needs pslite servers under a pslite scheduler (a
    /// C++ server is refused by name); not applied to replicated key ranges (`PS_REPLICAS >= 2`)
    PS_STALENESS: Numeric = Numeric::new(Unit::Count, 0, MAX_COUNT), "workers";
    /// seconds a request may wait for its answers before the node logs a warning naming the
    /// request's timestamp and the nodes that still owe an answer; repeated each time the wait
    /// doubles (at least hourly), so a handler that never answers cannot hang a job silently
    PS_REQUEST_WARN: Num = SECONDS.or(30), "every node";
    /// milliseconds a request for an app (or customer) this node does not have waits for it to be
    /// created; then it is refused and the requester's wait fails naming the app (C++ ps-lite
    /// waits 5 s, then aborts the node)
    PS_APP_WAIT: Num = Numeric::new(Unit::Milliseconds, 0, ONE_HOUR_MS)
        .note("0 = refuse at once")
        .or(5_000), "every node";
    /// bytes of data held until something is ready (a quarter per sender): before joining, for
    /// apps not yet registered, for requests that wait for an app's handle, (a quarter per peer)
    /// for messages a slow peer has not read yet, and for messages in parts (`PS_PARTITION_BYTES`)
    /// partly received. The messages held before joining, for a range map and from newcomers, the
    /// scheduler's registrations waiting for their address check, and the messages in parts partly
    /// received share one budget across all senders together (a quarter per sender within it):
    /// parts are taken only from members of the node table through the identity it names (a
    /// stranger's are dropped as from an unknown peer, nothing allocated); an incomplete message
    /// counts its whole announced size, checked before anything is allocated, except a sender's
    /// first one, always taken (up to `PS_MAX_MESSAGE_SIZE`, as a whole message would be) and
    /// counting only the bytes arrived; a part that would begin a message beyond the sender's
    /// quarter or the budget is dropped unacknowledged (counted as `hold_limit`, logged once per
    /// sender) and taken when `PS_RESEND` sends it again once there is room. A sender keeps its
    /// quarter per peer: it begins a new message in parts only while those it has begun and not
    /// finished to that peer fit, else it goes on with the highest-priority one it began, so nodes
    /// of the same configuration never meet the quarter, nor the budget while at most four peers
    /// send a node parts at once
    PS_HOLD_LIMIT: Num = BYTES.or(256 << 20), "every node";
    /// pslite-only: data messages larger than this to pslite peers over the network go in parts
    /// (once the node's apps have used a non-zero `priority`), reassembled by the receiver, and
    /// each peer's connection is given about this much at a time, so that what a node sends to a
    /// peer goes higher `priority` first (first come first served among equals; control messages
    /// first; nothing waits more than 2 s behind higher priorities) and a request waits for at
    /// most one part of a lower one; `0` = off (messages whole and straight to ZeroMQ). C++ peers
    /// never get parts (see docs/PROTOCOL.md)
    PS_PARTITION_BYTES: Num = Numeric::new(Unit::Bytes, 0, 1 << 30)
        .note("0 = off; otherwise at least 4K")
        .or(DEFAULT_PARTITION_BYTES as u64), "every node";
    /// `0` turns off the shared-memory path: by default, data frames of 64 KiB and more between
    /// pslite nodes of one host (same boot, user and namespaces) travel through shared memory
    /// instead of loopback TCP (`docs/BENCHMARKS.md`), and an array sent again (the same
    /// `SArray`, e.g. a key array pushed every step) goes without a copy; C++ nodes and other
    /// hosts are never affected
    PS_SHM: Flag = Flag(true), "every node";
    /// `0` keeps loopback TCP between pslite nodes of one host: by default they reach each other
    /// over an abstract Unix socket (`ipc://@pslite-...`, nothing on the filesystem), which saves
    /// 20-40 µs per round trip on a small message; needs the host identity `PS_SHM` exchanges, so
    /// `PS_SHM=0` turns it off too; C++ nodes and other hosts always use TCP
    PS_IPC: Flag = Flag(true), "every node";
    /// `0` leaves glibc's malloc as it is. Unset, a server or a worker (not the scheduler, which
    /// moves no large data and keeps its store's memory bounded; `1` tunes it too) turns off
    /// malloc's `mmap` of large blocks (`M_MMAP_MAX` 0), raises its mmap threshold to 32 MiB and
    /// its trim threshold to 1 GiB and, on a worker, caps its arenas at 2 (unless
    /// `MALLOC_ARENA_MAX` is set),
    /// once per process and only where `GLIBC_TUNABLES` sets none of these, so that the buffers ZeroMQ and the apps allocate for each large message are reused
    /// instead of faulted in and zeroed afresh (40-50% of a node's CPU at 5 Gbit/s; a 120 MB push
    /// at 2+2 from 1.10-1.31x to 1.07-1.14x the wire's limit, median 1.09x,
    /// `docs/BENCHMARKS.md`); a process then keeps the memory it freed (up to 1 GiB above its
    /// heap's top) for reuse
    PS_MALLOC_TUNE: MaybeFlag = MaybeFlag, "every node";
    /// ZeroMQ drops the connection of a peer that sends a larger message (the default, 2 GiB - 1,
    /// is the most C++ ps-lite can send)
    PS_MAX_MESSAGE_SIZE: Num = BYTES.or(i32::MAX as u64), "every node";
    /// the scheduler's key-value store: the largest value (see the store section)
    PS_STORE_MAX_VALUE: Num = Numeric::new(Unit::Bytes, 1, i32::MAX as u64) // one message
        .or(DEFAULT_MAX_VALUE as u64), "every node";
    /// the store: the longest key
    PS_STORE_MAX_KEY: Num = Numeric::new(Unit::Bytes, 1, 1 << 20).or(4096), "scheduler";
    /// the store: all data (the keys of waiting requests count too, and answers admin clients
    /// have not read yet count against a budget of the same size)
    PS_STORE_MAX_BYTES: Num = BYTES.or(1 << 30), "scheduler";
    /// the store: keys held
    PS_STORE_MAX_KEYS: Num = COUNT.or(1_000_000), "scheduler";
    /// the store: requests of one node waiting at once
    PS_STORE_MAX_WAITS: Num = COUNT.or(10_000), "scheduler";
    /// the store: watches of one node
    PS_STORE_MAX_WATCHES: Num = COUNT.or(10_000), "scheduler";
    /// the cluster's secret, the same on every node: only nodes that present it
    /// can connect (see "Authentication"); set but empty is an error, not "off"
    PS_AUTH_TOKEN: Secret = Secret, "every node, pslite status/store/checkpoint";
    /// set by `pslite launch` on the scheduler it starts: the file a pslite scheduler writes
    /// once it listens, so that the launcher asks only a pslite scheduler for node ids
    PSLITE_LAUNCH_MARK: Text = Text("a file path"), "scheduler";
    /// set by `pslite launch` on every node: the launch time in nanoseconds since 1970, from
    /// which nodes can measure their start-up
    PSLITE_LAUNCH_UNIX_NS: Numeric = Numeric::new(Unit::Count, 0, u64::MAX),
        "kv_bench, pslite.torch";
    /// set by `pslite launch --colocate` on workers: a `pslite.torch` worker's process also runs
    /// one of the job's servers (no server process runs)
    PSLITE_COLOCATE: Flag = Flag(false), "pslite.torch";
    /// `pslite.torch`: the most bytes of one gradient part (larger tensors are cut into parts
    /// spread over the servers)
    PSLITE_PARTITION_BYTES: Num = Numeric::new(Unit::Bytes, 64, MAX_BYTES).or(4_096_000),
        "pslite.torch";
    /// set by `pslite launch --worker-procs` on workers: the workers each process runs
    PSLITE_WORKERS_PER_PROCESS: Numeric = NODES, "examples";
    /// Kubernetes: the number of pods (1 scheduler + servers + workers)
    PSLITE_WORLD_SIZE: Numeric = Numeric::new(Unit::Count, 0, u32::MAX as u64), "pslite exec";
    /// Kubernetes: the headless Service; the scheduler is `<name>-0.<PSLITE_SERVICE>`
    PSLITE_SERVICE: Text = Text("a Service name"), "pslite exec";
    /// Kubernetes: the pods' name without the ordinal (unset: from `HOSTNAME`)
    PSLITE_POD_PREFIX: Text = Text("a name"), "pslite exec";
}

/// The one read of this process's environment for pslite's own variables
/// (see the module docs).
fn process(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A variable another program defines (`PATH`, `RUST_LOG`,
/// `GLIBC_TUNABLES`, MPI's, Slurm's, Kubernetes'), from this process's
/// environment (its text, which may not be UTF-8). pslite's own are
/// declared in the table and read with [`Var::get`].
pub fn foreign(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(name)
}

/// A lookup of this process's environment, for code that takes one
/// (`pslite exec`'s plan, tests pass their own).
pub fn environment() -> impl Fn(&str) -> Option<String> {
    process
}

/// A lookup of the variables a node started with `vars` sees: `vars`
/// first (the last of a name wins), then this process's environment.
pub fn overlay(vars: &[(String, String)]) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| process(name))
    }
}

/// Reads every declared variable that `lookup` has set (not blank), by its rule: the
/// first bad value's error (the launcher checks a node's environment once
/// before starting anything).
pub fn check(lookup: Lookup) -> Result<(), ConfigError> {
    SETTINGS
        .iter()
        .filter(|s| lookup(s.name()).is_some_and(|v| !v.trim().is_empty()))
        .try_for_each(|s| s.check(lookup))
}

/// The README's table of variables.
pub fn markdown() -> String {
    let mut out = String::from(
        "| variable | values | default | read by | meaning |\n|---|---|---|---|---|\n",
    );
    for s in SETTINGS {
        let cell = |t: String| t.replace('|', "\\|");
        out += &format!(
            "| `{}` | {} | {} | {} | {} |\n",
            s.name(),
            cell(s.values()),
            cell(s.default()),
            s.readers(),
            cell(s.doc())
        );
    }
    out
}

/// The list `pslite launch --help` ends with: each variable, its values
/// and default.
pub fn help() -> String {
    let mut out = String::from("Environment variables pslite reads (the README explains each):\n");
    for s in SETTINGS {
        out += &format!(
            "  {:<27}{} (default: {})\n",
            s.name(),
            s.values(),
            s.default()
        );
    }
    out
}

#[cfg(test)]
mod tests;
