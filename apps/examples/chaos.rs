//! The node program of the chaos soak (`tests/soak/chaos.py`): a replicated
//! job whose workers keep a history of what they were told was applied.
//!
//! - The scheduler starts and finalizes.
//! - A server serves the sum store (f64) as a replicated handle and says
//!   which node it is (`chaos server node N`).
//! - A pusher (`CHAOS_ROLE=pusher`, an elastic worker) pushes small
//!   integers to `CHAOS_KEYS` keys of every key range (default 8), one push
//!   per epoch, then meets the other workers at a barrier (where waiting
//!   workers are admitted) and pauses `CHAOS_PAUSE_MS` (default 20). Each
//!   push is written to its history (`CHAOS_HISTORY`, JSON lines) before it
//!   is sent (`{"id":N,"s":SEED,"t":T}`) and once its wait returns
//!   (`{"id":N,"ok":true,"t":T}`, or `"ok":false` with the error). Push N
//!   adds `(SEED + i) % 4 + 1` to the i-th key, so a checker can add up the
//!   acknowledged pushes exactly. A push waits at most `CHAOS_WAIT_S`
//!   seconds (default 60), a barrier twice that; on any error (a timeout
//!   too: that push may or may not be applied) it writes it and exits 1
//!   (the soak starts a replacement). Once the file `CHAOS_STOP` exists it leaves
//!   the job (`finalize(0, false)`) between epochs.
//! - The reader (`CHAOS_ROLE=reader`, also an elastic worker, never pushes)
//!   takes part in the barriers until `CHAOS_STOP` exists and it is the
//!   round's only worker (every pusher has left, so every acknowledged push
//!   is in), then pulls every key twice, 2 s apart (each within
//!   `CHAOS_WAIT_S`), writes the values to
//!   `CHAOS_FINAL` as JSON (`{"keys":[..],"vals":[..],"again":[..]}`) and
//!   finalizes with the servers.
//!
//! The soak gives every node the same `DMLC_*`/`PS_*` environment
//! (`DMLC_NUM_WORKER=MIN:MAX`, `PS_REPLICAS=2`, `PS_RESEND=1`, heartbeats).

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pslite::{
    env_or, DefaultHandle, Error, KVOptions, KVServer, KVWorker, Postoffice, WORKER_GROUP,
};

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

fn run() -> Result<(), Error> {
    let po = Postoffice::from_env()?;
    po.start(0, true)?;
    if po.is_scheduler() {
        return po.finalize(0, true);
    }
    if po.is_server() {
        let server = KVServer::<f64>::new(&po, 0)?;
        server.set_replicated_handle(DefaultHandle::new());
        let me = po.my_node()?;
        println!(
            "chaos server node {}{}",
            me.id,
            if me.is_recovery { " (replacement)" } else { "" }
        );
        let result = po.finalize(0, true);
        drop(server);
        return result;
    }
    let role = std::env::var("CHAOS_ROLE").unwrap_or_default();
    match role.as_str() {
        "pusher" => pusher(&po),
        "reader" => reader(&po),
        _ => Err(Error::App(format!(
            "CHAOS_ROLE must be pusher or reader, got {role:?}"
        ))),
    }
}

fn path_var(name: &str) -> Result<PathBuf, Error> {
    match std::env::var(name) {
        Ok(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(Error::App(format!("{name} must name a file"))),
    }
}

/// The keys every pusher pushes to and the reader reads: the first
/// `per_range` keys of every server's key range.
fn chaos_keys(po: &Postoffice) -> Result<Vec<u64>, Error> {
    let per_range = env_or("CHAOS_KEYS", 8u64, "a whole number")?;
    Ok(po
        .server_key_ranges()
        .iter()
        .flat_map(|r| (0..per_range).map(move |i| r.begin + i))
        .collect())
}

/// How long a push or a pull may take (`CHAOS_WAIT_S`).
fn wait_limit() -> Result<Duration, Error> {
    Ok(Duration::from_secs(env_or(
        "CHAOS_WAIT_S",
        60u64,
        "a whole number of seconds",
    )?))
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A JSON string literal of `s`.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The history file: one write per line, so a process killed at any point
/// leaves whole lines (the kernel keeps what was written).
struct History(File);

impl History {
    fn line(&mut self, text: String) -> Result<(), Error> {
        self.0
            .write_all((text + "\n").as_bytes())
            .map_err(|e| Error::App(format!("cannot write the history: {e}")))
    }
}

fn pusher(po: &Postoffice) -> Result<(), Error> {
    let pause = Duration::from_millis(env_or("CHAOS_PAUSE_MS", 20u64, "milliseconds")?);
    let limit = wait_limit()?;
    let stop = path_var("CHAOS_STOP")?;
    let path = path_var("CHAOS_HISTORY")?;
    let file = File::create(&path)
        .map_err(|e| Error::App(format!("cannot create {}: {e}", path.display())))?;
    let mut history = History(file);
    let kv = KVWorker::<f64>::new(po, 0, 0)?;
    let keys = chaos_keys(po)?;
    let me = po.my_id()?;
    println!(
        "chaos pusher node {me} joined round {:?}",
        po.joined_round()
    );
    history.line(format!(
        "{{\"node\":{me},\"keys\":{},\"t\":{}}}",
        keys.len(),
        now()
    ))?;
    // Seeds differ between processes so that two pushers' histories are
    // not the same sequence.
    let mut seed = (std::process::id() as u64).wrapping_mul(2_654_435_761) % 1000;
    let mut id = 0u64;
    while !stop.exists() {
        id += 1;
        seed = (seed * 31 + 7) % 1000;
        let vals: Vec<f64> = (0..keys.len() as u64)
            .map(|i| ((seed + i) % 4 + 1) as f64)
            .collect();
        history.line(format!("{{\"id\":{id},\"s\":{seed},\"t\":{}}}", now()))?;
        let result = kv
            .push(&keys, &vals, KVOptions::new())
            .and_then(|request| request.wait_timeout(limit));
        match result {
            Ok(()) => history.line(format!("{{\"id\":{id},\"ok\":true,\"t\":{}}}", now()))?,
            Err(e) => {
                history.line(format!(
                    "{{\"id\":{id},\"ok\":false,\"t\":{},\"err\":{}}}",
                    now(),
                    json_str(&e.to_string())
                ))?;
                return Err(e);
            }
        }
        if let Err(e) = po.barrier_with_timeout(0, WORKER_GROUP, Some(2 * limit)) {
            history.line(format!(
                "{{\"barrier\":false,\"t\":{},\"err\":{}}}",
                now(),
                json_str(&e.to_string())
            ))?;
            return Err(e);
        }
        std::thread::sleep(pause);
    }
    history.line(format!("{{\"left\":true,\"t\":{}}}", now()))?;
    println!("chaos pusher node {me} leaves after {id} pushes");
    po.finalize(0, false)
}

fn reader(po: &Postoffice) -> Result<(), Error> {
    let stop = path_var("CHAOS_STOP")?;
    let out = path_var("CHAOS_FINAL")?;
    let limit = wait_limit()?;
    let kv = KVWorker::<f64>::new(po, 0, 0)?;
    let keys = chaos_keys(po)?;
    let me = po.my_id()?;
    println!("chaos reader node {me}");
    loop {
        if stop.exists() && po.membership().workers == [me] {
            break;
        }
        po.barrier(0, WORKER_GROUP)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("chaos reader node {me}: every pusher left, reading");
    let first = kv.pull(&keys, KVOptions::new())?.take_timeout(limit)?;
    std::thread::sleep(Duration::from_secs(2));
    let again = kv.pull(&keys, KVOptions::new())?.take_timeout(limit)?;
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:?}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let keys_text = first
        .keys
        .iter()
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let text = format!(
        "{{\"keys\":[{keys_text}],\"vals\":[{}],\"again\":[{}]}}\n",
        list(&first.vals),
        list(&again.vals)
    );
    std::fs::write(&out, text)
        .map_err(|e| Error::App(format!("cannot write {}: {e}", out.display())))?;
    println!("chaos reader node {me}: wrote {}", out.display());
    po.finalize(0, true)
}
