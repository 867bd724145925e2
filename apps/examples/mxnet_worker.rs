//! A worker of MXNet 1.9.1's `dist_sync` KVStore, in Rust: it speaks to MXNet
//! servers (or `mxnet_server`) exactly as `mx.kv.create('dist_sync')` does, and
//! runs the same checks as `tests/interop/mx_node.py`'s worker, so it can
//! replace any MXNet worker of a job (ranks may be mixed).
//!
//! On the wire (see docs/PROTOCOL.md, "MXNet's KVStore"):
//! - values are raw bytes (`KVWorker<MxByte>`: a one-byte value type whose
//!   frames are typed OTHER, as those of MXNet's `KVWorker<char>`; `u8` would
//!   be typed UINT8), lens count bytes, exactly one key per message;
//! - `head` is the Cantor pair of (request type 0, dtype): float32 0, float16 5;
//! - keys are encoded like MXNet's `EncodeDefaultKey`: an array of fewer than
//!   `MXNET_KVSTORE_BIGARRAY_BOUND` (default 1 000 000) elements goes whole to
//!   server `(key * 9973) % n` as ps key `range[s].begin + key`; a bigger one is
//!   split over every server, part i holding `round(N/n*(i+1)) - round(N/n*i)`
//!   elements under ps key `range[i].begin + key`;
//! - SimpleApp commands on app 0: rank 0 sends head 3 (sync mode) to the
//!   servers after start-up and head 2 (stop server) before finalizing. Like
//!   MXNet (whose `KVWorker<char>` is also a `SimpleApp`) they go from the KV
//!   customer itself (`KVWorker::request`), so commands and KV requests share
//!   one timestamp counter: C++ ps-lite's `PS_RESEND` drops a message whose
//!   (app, sender, receiver, timestamp, request) it has seen before, whatever
//!   the customer, so a second customer of app 0 would collide.
//!
//! Checks (all values small integers, so float sums are exact and compared
//! with ==), with `b = arange(n) % m`, W workers, rank r:
//! keys 3 f32 (2x3, m 97), 5 f32 (4x5x6, m 97), 7 f32 (`MX_NODE_BIG` elements,
//! default 1 200 000, m 1000: split over all servers), 11 f16 (8, m 16),
//! 9 f32 (10, m 10, push-pull). Rank 0 initialises every key with b+100, then a
//! worker barrier; every key is pulled and must equal b+100; `MX_NODE_ROUNDS`
//! (default 2) rounds t of pushes of b*(r+1)+t and pulls that must equal
//! b*W(W+1)/2 + W*t; the same rounds as push-pulls on key 9; a worker barrier;
//! then MXNet's KVStore destructor: a worker barrier, rank 0 sends "stop
//! server", finalize. `MX_NODE_SKIP_F16=1` / `MX_NODE_SKIP_PUSHPULL=1` leave
//! out keys 11 / 9 (use the same settings for every worker of a job).
//!
//! Prints `PASS ...` / `FAIL ...` lines and `PASS [rust-worker rank r] all checks`
//! at the end; exits 0 only if every check passed.
//!
//! It is not a scheduler (nor is its counterpart): under `pslite launch`, run
//! pslite's:
//! `pslite launch -s 1 -w 2 --scheduler-program pslite --server-program
//! target/release/examples/mxnet_server -- target/release/examples/mxnet_worker`.

use std::process::ExitCode;
use std::time::Duration;

use pslite::{env_or, Error, KVOptions, KVRequest, KVWorker, Key, KeyRange, Postoffice};
use pslite::{SERVER_GROUP, WORKER_GROUP};

/// How long any single request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

#[path = "shared/mxnet.rs"]
mod mxnet;
use mxnet::*;

fn main() -> ExitCode {
    pslite::init_logging();
    pslite::exit_code(run())
}

/// One MXNet key of the test, as `mx_node.py` defines it.
struct Spec {
    key: i32,
    dtype: Dtype,
    elems: usize,
    modulo: usize,
}

impl Spec {
    fn base(&self) -> Vec<f32> {
        (0..self.elems).map(|i| (i % self.modulo) as f32).collect()
    }
    fn init_val(&self) -> Vec<f32> {
        self.base().into_iter().map(|b| b + 100.0).collect()
    }
    /// What worker `rank` pushes in round `t`.
    fn push_val(&self, rank: usize, t: usize) -> Vec<f32> {
        self.base()
            .into_iter()
            .map(|b| b * (rank + 1) as f32 + t as f32)
            .collect()
    }
    /// The sum over all `w` workers of their round-`t` pushes.
    fn sum_val(&self, w: usize, t: usize) -> Vec<f32> {
        let f = (w * (w + 1) / 2) as f32;
        self.base()
            .into_iter()
            .map(|b| b * f + (w * t) as f32)
            .collect()
    }
}

/// MXNet's ps keys and byte lens for one array (`EncodeDefaultKey`).
#[derive(Clone, Debug)]
struct PsKv {
    keys: Vec<Key>,
    /// Bytes per ps key.
    lens: Vec<i32>,
}

fn encode_default_key(
    key: i32,
    elems: usize,
    elem_bytes: usize,
    ranges: &[KeyRange],
    bigarray_bound: usize,
) -> PsKv {
    let n = ranges.len();
    if elems < bigarray_bound {
        // C int arithmetic in MXNet; keys here are small and non-negative.
        let server = (i64::from(key) * 9973).rem_euclid(n as i64) as usize;
        PsKv {
            keys: vec![ranges[server].begin + key as u64],
            lens: vec![(elems * elem_bytes) as i32],
        }
    } else {
        let part = |i: usize| (elems as f64 / n as f64 * i as f64).round() as usize;
        PsKv {
            keys: (0..n).map(|i| ranges[i].begin + key as u64).collect(),
            lens: (0..n)
                .map(|i| ((part(i + 1) - part(i)) * elem_bytes) as i32)
                .collect(),
        }
    }
}

struct Checker {
    who: String,
    failures: Vec<String>,
}

impl Checker {
    fn check(&mut self, name: &str, got: &[f32], want: &[f32]) {
        if got == want {
            println!("PASS [{}] {name} ({} values)", self.who, want.len());
            return;
        }
        let detail = if got.len() != want.len() {
            format!("{} values, expected {}", got.len(), want.len())
        } else {
            let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
            format!(
                "{} of {} differ, first at {}: got {} want {}",
                bad.len(),
                want.len(),
                bad[0],
                got[bad[0]],
                want[bad[0]]
            )
        };
        println!("FAIL [{}] {name}: {detail}", self.who);
        self.failures.push(name.to_string());
    }
}

struct Store<'a> {
    kv: &'a KVWorker<MxByte>,
    pskv: Vec<(i32, PsKv)>,
}

impl Store<'_> {
    fn pskv(&self, key: i32) -> &PsKv {
        &self
            .pskv
            .iter()
            .find(|(k, _)| *k == key)
            .expect("known key")
            .1
    }

    /// Starts a push (or push-pull) of `vals` for MXNet key `key`.
    fn push(&self, spec: &Spec, vals: &[f32], pull: bool) -> Result<KVRequest<MxByte>, Error> {
        let p = self.pskv(spec.key);
        let bytes = spec.dtype.encode(vals);
        let opts = KVOptions::new().cmd(spec.dtype.head()).lens(&p.lens);
        if pull {
            self.kv.push_pull(&p.keys, &bytes, opts)
        } else {
            self.kv.push(&p.keys, &bytes, opts)
        }
    }

    /// Starts a pull of MXNet key `key`.
    fn pull(&self, spec: &Spec) -> Result<KVRequest<MxByte>, Error> {
        let p = self.pskv(spec.key);
        self.kv
            .pull(&p.keys, KVOptions::new().cmd(spec.dtype.head()))
    }

    /// Waits for pull (or push-pull) `request` of `spec` and decodes the
    /// values, checking keys and byte lens as MXNet's worker does.
    fn take(&self, spec: &Spec, request: KVRequest<MxByte>) -> Result<Vec<f32>, Error> {
        let p = self.pskv(spec.key);
        let got = request.take_timeout(REQUEST_TIMEOUT)?;
        if got.keys.as_slice() != p.keys.as_slice() {
            return Err(Error::App(format!(
                "key {}: answered ps keys {:?}, requested {:?}",
                spec.key,
                got.keys.as_slice(),
                p.keys
            )));
        }
        if got.lens.as_slice() != p.lens.as_slice() {
            return Err(Error::App(format!(
                "key {}: answered lens {:?} bytes, expected {:?}",
                spec.key,
                got.lens.as_slice(),
                p.lens
            )));
        }
        Ok(spec.dtype.decode(got.vals.bytes()))
    }
}

/// pslite's key-value store beside MXNet nodes (`MX_NODE_STORE`): with `1`
/// (a pslite scheduler) an `add` must work; with `0` (a C++ scheduler) the
/// store must refuse at once without sending anything; unset: not tried.
fn check_store(po: &Postoffice, who: &str) -> Result<(), Error> {
    let expect = match std::env::var("MX_NODE_STORE").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => return Ok(()),
    };
    let store = po.store()?.with_timeout(Duration::from_secs(20));
    match (expect, store.add("interop/workers", 1)) {
        (true, Ok(n)) if n >= 1 => println!("PASS [{who}] store add on the pslite scheduler: {n}"),
        (false, Err(e @ Error::StoreUnsupported)) => {
            println!("PASS [{who}] store refused by a C++ scheduler: {e}")
        }
        (_, other) => {
            println!(
                "FAIL [{who}] store (MX_NODE_STORE={}): {other:?}",
                expect as u8
            );
            return Err(Error::App(format!("store check failed: {other:?}")));
        }
    }
    Ok(())
}

fn run() -> Result<(), Error> {
    let rounds: usize = env_or("MX_NODE_ROUNDS", 2, "a whole number")?;
    let big: usize = env_or("MX_NODE_BIG", 1_200_000, "a whole number")?;
    let skip_f16 = std::env::var("MX_NODE_SKIP_F16").as_deref() == Ok("1");
    let skip_pp = std::env::var("MX_NODE_SKIP_PUSHPULL").as_deref() == Ok("1");
    let bound: usize = env_or("MXNET_KVSTORE_BIGARRAY_BOUND", 1_000_000, "a whole number")?;

    let po = Postoffice::from_env()?;
    if !po.is_worker() {
        return Err(Error::InvalidInput(format!(
            "mxnet_worker runs as a worker only (DMLC_ROLE={})",
            po.role()
        )));
    }
    // KVStoreDist: StartAsync, then Barrier(customer, 7): on the wire the same as start(0, true).
    po.start(0, true)?;
    let kv = KVWorker::<MxByte>::new(&po, 0, 0)?;
    let rank = po.my_rank()? as usize;
    let num_workers = po.num_workers() as usize;
    let who = format!("rust-worker rank {rank}");
    println!(
        "INFO [{who}] node {} of {} servers and {num_workers} workers",
        po.my_id()?,
        po.num_servers()
    );
    let send_command = |head: i32| -> Result<(), Error> {
        kv.request(head, b"", SERVER_GROUP)?
            .wait_timeout(REQUEST_TIMEOUT)
    };

    check_store(&po, &who)?;

    // kvstore.cc: rank 0 of a dist_sync store puts the servers in sync mode.
    if rank == 0 {
        send_command(CMD_SYNC_MODE)?;
        println!("INFO [{who}] servers in sync mode");
    }

    let mut specs = vec![
        Spec {
            key: 3,
            dtype: Dtype::F32,
            elems: 6,
            modulo: 97,
        },
        Spec {
            key: 5,
            dtype: Dtype::F32,
            elems: 120,
            modulo: 97,
        },
        Spec {
            key: 7,
            dtype: Dtype::F32,
            elems: big,
            modulo: 1000,
        },
    ];
    if !skip_f16 {
        specs.push(Spec {
            key: 11,
            dtype: Dtype::F16,
            elems: 8,
            modulo: 16,
        });
    }
    let pp_key = if skip_pp { None } else { Some(9) };
    if pp_key.is_some() {
        specs.push(Spec {
            key: 9,
            dtype: Dtype::F32,
            elems: 10,
            modulo: 10,
        });
    }
    specs.sort_by_key(|s| s.key);
    let ranges = po.server_key_ranges();
    let store = Store {
        kv: &kv,
        pskv: specs
            .iter()
            .map(|s| {
                let p = encode_default_key(s.key, s.elems, s.dtype.size(), &ranges, bound);
                (s.key, p)
            })
            .collect(),
    };
    for s in &specs {
        let p = store.pskv(s.key);
        println!(
            "INFO [{who}] key {} ({:?} x {}, head {}): ps keys {:?}, byte lens {:?}",
            s.key,
            s.dtype,
            s.elems,
            s.dtype.head(),
            p.keys,
            p.lens
        );
    }
    let mut checker = Checker {
        who: who.clone(),
        failures: Vec::new(),
    };

    // 1. init: rank 0 pushes the initial values (answered at once), then a worker barrier.
    if rank == 0 {
        let ts = specs
            .iter()
            .map(|s| store.push(s, &s.init_val(), false))
            .collect::<Result<Vec<_>, _>>()?;
        for t in ts {
            t.wait_timeout(REQUEST_TIMEOUT)?;
        }
    }
    po.barrier(0, WORKER_GROUP)?;
    println!("INFO [{who}] init done");

    // 2. pull the initial values.
    let ts = specs
        .iter()
        .map(|s| store.pull(s))
        .collect::<Result<Vec<_>, _>>()?;
    for (s, t) in specs.iter().zip(ts) {
        let got = store.take(s, t)?;
        checker.check(
            &format!("pull-after-init key {}", s.key),
            &got,
            &s.init_val(),
        );
    }

    // 3. rounds of push + pull (each push is answered once every worker pushed).
    let rk: Vec<&Spec> = specs.iter().filter(|s| Some(s.key) != pp_key).collect();
    for t in 1..=rounds {
        let pushes = rk
            .iter()
            .map(|s| store.push(s, &s.push_val(rank, t), false))
            .collect::<Result<Vec<_>, _>>()?;
        for p in pushes {
            p.wait_timeout(REQUEST_TIMEOUT)?;
        }
        let pulls = rk
            .iter()
            .map(|s| store.pull(s))
            .collect::<Result<Vec<_>, _>>()?;
        for (s, p) in rk.iter().zip(pulls) {
            let got = store.take(s, p)?;
            checker.check(
                &format!("round {t} push+pull key {}", s.key),
                &got,
                &s.sum_val(num_workers, t),
            );
        }
    }

    // 4. push-pull rounds (one request with push and pull).
    if let Some(k) = pp_key {
        let s = specs.iter().find(|s| s.key == k).expect("pushpull key");
        for t in 1..=rounds {
            let request = store.push(s, &s.push_val(rank, t), true)?;
            let got = store.take(s, request)?;
            checker.check(
                &format!("round {t} pushpull key {k}"),
                &got,
                &s.sum_val(num_workers, t),
            );
        }
    }

    // 5. kv._barrier(): a worker barrier.
    po.barrier(0, WORKER_GROUP)?;
    println!("PASS [{who}] worker barrier");

    // 6. ~KVStoreDist: worker barrier, rank 0 stops the servers, finalize (barrier 7).
    po.barrier(0, WORKER_GROUP)?;
    if rank == 0 {
        send_command(CMD_STOP_SERVER)?;
        println!("INFO [{who}] servers stopped");
    }
    drop(kv);
    po.finalize(0, true)?;

    if !checker.failures.is_empty() {
        println!(
            "FAIL [{who}] {} check(s) failed: {}",
            checker.failures.len(),
            checker.failures.join(", ")
        );
        return Err(Error::App("checks failed".into()));
    }
    println!("PASS [{who}] all checks");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_match_mxnet() {
        assert_eq!(Dtype::F32.head(), 0);
        assert_eq!(Dtype::F16.head(), 5);
    }

    #[test]
    fn half_round_trip() {
        for i in 0..2048 {
            let h = f32_to_f16(i as f32);
            assert_eq!(f16_to_f32(h), i as f32);
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(100.0), 0x5640);
    }

    #[test]
    fn keys_match_observed_mxnet_traffic() {
        let r2 = pslite::key_ranges(2);
        // Key 3 with 2 servers: server (3*9973)%2 = 1, ps key 9223372036854775810.
        let p = encode_default_key(3, 6, 4, &r2, 1_000_000);
        assert_eq!(p.keys, vec![9223372036854775810]);
        assert_eq!(p.lens, vec![24]);
        // Key 7 with 1001 elements and bound 1000: 501 + 500 elements.
        let p = encode_default_key(7, 1001, 4, &r2, 1000);
        assert_eq!(p.keys, vec![7, 9223372036854775814]);
        assert_eq!(p.lens, vec![501 * 4, 500 * 4]);
        let r1 = pslite::key_ranges(1);
        assert_eq!(
            encode_default_key(7, 1_200_000, 4, &r1, 1_000_000).keys,
            vec![7]
        );
    }
}
