//! A server's engine threads (`PS_SERVER_THREADS`, [`KVServer::set_threads`]):
//! a concurrent request handle runs on `n` threads, each owning the keys
//! that hash to it.
//!
//! Rules:
//! - Every key belongs to one thread ([`shard_of`]). A request whose keys
//!   all belong to one thread goes to it whole (no copy); any other is cut
//!   into one part per thread it touches, each part holding that thread's
//!   keys in their order with their values (and lens). Parts are queued in
//!   arrival order, so the requests on one key are handled in arrival order
//!   and requests on disjoint keys in parallel.
//! - The handle answers each part with [`KVServer::response`] as it would a
//!   whole request; the engine puts the answers of a cut request back
//!   together, in the request's key order (values, and lens where keys hold
//!   different numbers of values), and sends one response, as one thread
//!   would have: the worker cannot tell.
//! - A push cut into parts is all or nothing: before any part is applied,
//!   each thread checks its part with the handle's
//!   [`ConcurrentHandle::check`] (on the thread that owns the keys, so
//!   every earlier request on them has been applied) and waits at the
//!   request's [`Gate`] until every part has been checked. If one part is
//!   refused, no part runs and the worker is told once (the refusal of the
//!   request's first key among them, as one thread would name it). Parts are
//!   queued under one lock (the server's handles), so every thread meets the
//!   gates in the same order and a thread waits only for the others to
//!   reach the same request: no cycle. Pulls are not gated (they apply
//!   nothing).
//! - A part whose handle panics fails the whole request once (the worker is
//!   told, as for any panic); the other parts' answers are dropped.
//!
//! [`ConcurrentHandle::check`]: crate::ConcurrentHandle::check
//! [`KVServer::set_threads`]: crate::KVServer::set_threads
//! [`KVServer::response`]: crate::KVServer::response

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};

use crossbeam_channel::Sender;
use pslite_proto::lock;
use pslite_proto::refusal::Refusal;

use crate::kv_pairs::{KVMeta, KVPairs, Key, Val};
use crate::sarray::SArray;

/// What the engine threads run: a concurrent handle, with its check and
/// the way to tell a worker its request was refused.
pub(crate) trait Runs<V: Val>: Send + Sync + 'static {
    /// Whether the handle would take `part` (applies nothing).
    fn check(&self, meta: &KVMeta, part: &KVPairs<V>) -> Result<(), Refusal>;
    /// Runs the handle on one request or part.
    fn run(&self, meta: &KVMeta, part: KVPairs<V>);
    /// Tells the worker that request `meta` was refused (nothing applied).
    fn refuse(&self, meta: &KVMeta, refusal: Refusal);
}

/// One item of a thread's queue: a request or part, and the gate of a cut
/// push.
type Item<V> = (KVMeta, KVPairs<V>, Option<Arc<Gate>>);

/// Where the parts of a cut push wait for each other's checks.
pub(crate) struct Gate {
    state: Mutex<GateState>,
    all_checked: Condvar,
}

struct GateState {
    /// Parts not yet checked.
    unchecked: usize,
    /// The refusal of the request's first refused key so far.
    refusal: Option<Refusal>,
    /// Whether a thread has taken the refusal to tell the worker.
    told: bool,
}

/// What a part does once every part of its request was checked.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Every part may be applied.
    Go,
    /// A part was refused: this thread tells the worker (one does).
    Tell(Refusal),
    /// A part was refused and another thread tells the worker.
    Drop,
}

impl Gate {
    pub(crate) fn new(parts: usize) -> Gate {
        Gate {
            state: Mutex::new(GateState {
                unchecked: parts,
                refusal: None,
                told: false,
            }),
            all_checked: Condvar::new(),
        }
    }

    /// Reports one part's check and waits until every part was checked.
    pub(crate) fn pass(&self, checked: Result<(), Refusal>) -> Verdict {
        let mut state = lock(&self.state);
        if let Err(refusal) = checked {
            let first = match (&state.refusal, &refusal) {
                (None, _) => true,
                (Some(Refusal::Lengths { key: had, .. }), Refusal::Lengths { key, .. }) => {
                    key < had
                }
                _ => false,
            };
            if first {
                state.refusal = Some(refusal);
            }
        }
        state.unchecked = state.unchecked.saturating_sub(1);
        if state.unchecked == 0 {
            self.all_checked.notify_all();
        }
        while state.unchecked > 0 {
            state = match self.all_checked.wait(state) {
                Ok(state) => state,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
        match state.refusal.clone() {
            None => Verdict::Go,
            Some(_) if state.told => Verdict::Drop,
            Some(refusal) => {
                state.told = true;
                Verdict::Tell(refusal)
            }
        }
    }
}

/// The engine thread that owns `key` of `n`: a multiplicative hash of the
/// key, so that neighbouring keys (a range, MXNet's `begin + key`) spread
/// over the threads.
pub fn shard_of(key: Key, n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let mixed = (key ^ (key >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed >> 32) % n as u64) as usize
}

/// What a request is known by while its parts are handled: sender,
/// customer and timestamp (unique among a server's requests in flight).
type RequestKey = (i32, i32, i32);

fn request_key(meta: &KVMeta) -> RequestKey {
    (meta.sender, meta.customer_id, meta.timestamp)
}

/// One part of a cut request: its thread, and the positions of its keys
/// in the request.
struct PartOf {
    shard: usize,
    positions: Vec<u32>,
}

/// A cut request whose parts are being handled.
struct Split<V: Val> {
    keys: SArray<Key>,
    parts: Vec<PartOf>,
    answers: Vec<Option<KVPairs<V>>>,
    left: usize,
    failed: bool,
}

/// What [`Engine::collect`] made of an answer.
pub(crate) enum Collected<V: Val> {
    /// The answer of a request that was not cut: send it.
    Whole(KVPairs<V>),
    /// The last part's answer: send the request's response.
    Complete(KVPairs<V>),
    /// A part's answer, kept until the others are in (or dropped: the
    /// request failed).
    Kept,
}

/// The engine of one server app: its threads' queues and its cut requests.
pub(crate) struct Engine<V: Val> {
    queues: Vec<Sender<Item<V>>>,
    splits: Mutex<HashMap<RequestKey, Split<V>>>,
}

impl<V: Val> Engine<V> {
    /// Starts `threads` threads running `run` on what is submitted. They
    /// end when the engine is dropped (after what is queued).
    pub(crate) fn start(
        threads: usize,
        app_id: i32,
        runs: Arc<dyn Runs<V>>,
    ) -> std::io::Result<Arc<Engine<V>>> {
        let mut queues = Vec::with_capacity(threads);
        let mut receivers = Vec::with_capacity(threads);
        for _ in 0..threads.max(1) {
            let (tx, rx) = crossbeam_channel::unbounded::<Item<V>>();
            queues.push(tx);
            receivers.push(rx);
        }
        let engine = Arc::new(Engine {
            queues,
            splits: Mutex::new(HashMap::new()),
        });
        for (i, rx) in receivers.into_iter().enumerate() {
            let runs = Arc::clone(&runs);
            // The threads hold the engine weakly: it ends (its queues close)
            // when the server drops it.
            let engine = Arc::downgrade(&engine);
            std::thread::Builder::new()
                .name(format!("pslite-engine-{app_id}-{i}"))
                .spawn(move || {
                    for (meta, kvs, gate) in rx {
                        let Some(gate) = gate else {
                            runs.run(&meta, kvs);
                            continue;
                        };
                        let checked = catch_unwind(AssertUnwindSafe(|| runs.check(&meta, &kvs)))
                            .unwrap_or_else(|_| {
                                Err(Refusal::Other {
                                    app: meta.app_id,
                                    reason: "the request handle's check panicked".into(),
                                })
                            });
                        match gate.pass(checked) {
                            Verdict::Go => runs.run(&meta, kvs),
                            Verdict::Tell(refusal) => {
                                if let Some(engine) = engine.upgrade() {
                                    lock(&engine.splits).remove(&request_key(&meta));
                                }
                                runs.refuse(&meta, refusal);
                            }
                            Verdict::Drop => {}
                        }
                    }
                })?;
        }
        Ok(engine)
    }

    /// Threads of this engine.
    pub(crate) fn threads(&self) -> usize {
        self.queues.len()
    }

    /// Queues request `kvs` on the threads that own its keys (cut if it
    /// touches several).
    pub(crate) fn submit(&self, meta: &KVMeta, kvs: KVPairs<V>) {
        let n = self.queues.len();
        let parts = match split(&kvs, n) {
            Cut::Whole(shard) => {
                let _ = self.queues[shard].send((meta.clone(), kvs, None));
                return;
            }
            Cut::Parts(parts) => parts,
        };
        let split = Split {
            keys: kvs.keys.clone(),
            answers: (0..parts.len()).map(|_| None).collect(),
            left: parts.len(),
            parts: parts
                .iter()
                .map(|(shard, _, positions)| PartOf {
                    shard: *shard,
                    positions: positions.clone(),
                })
                .collect(),
            failed: false,
        };
        // Recorded before any part can be answered.
        let gate = meta.push.then(|| Arc::new(Gate::new(parts.len())));
        lock(&self.splits).insert(request_key(meta), split);
        for (shard, part, _) in parts {
            let _ = self.queues[shard].send((meta.clone(), part, gate.clone()));
        }
    }

    /// Takes the answer `res` a handle gave to `meta` (see [`Collected`]).
    pub(crate) fn collect(&self, meta: &KVMeta, res: KVPairs<V>) -> Collected<V> {
        let key = request_key(meta);
        let mut splits = lock(&self.splits);
        let Some(split) = splits.get_mut(&key) else {
            return Collected::Whole(res);
        };
        // Which part: the thread of its first key (a push's empty answers
        // fill the parts in turn).
        let n = self.queues.len();
        let slot = res
            .keys
            .first()
            .and_then(|&k| {
                let shard = shard_of(k, n);
                split
                    .parts
                    .iter()
                    .position(|p| p.shard == shard)
                    .filter(|&i| split.answers[i].is_none())
            })
            .or_else(|| split.answers.iter().position(Option::is_none));
        if let Some(i) = slot {
            split.answers[i] = Some(res);
        }
        split.left = split.left.saturating_sub(1);
        if split.left > 0 {
            return Collected::Kept;
        }
        let Some(split) = splits.remove(&key) else {
            return Collected::Kept;
        };
        drop(splits);
        if split.failed {
            return Collected::Kept;
        }
        Collected::Complete(merge(split))
    }

    /// Whether `meta`'s request was cut and has parts not yet answered.
    pub(crate) fn is_cut(&self, meta: &KVMeta) -> bool {
        lock(&self.splits).contains_key(&request_key(meta))
    }

    /// A part of `meta`'s request panicked: whether it is the first (the
    /// caller tells the worker once; the request's other answers are then
    /// dropped).
    pub(crate) fn part_failed(&self, meta: &KVMeta) -> bool {
        let mut splits = lock(&self.splits);
        let key = request_key(meta);
        let Some(split) = splits.get_mut(&key) else {
            return true; // not cut: its one failure
        };
        let first = !split.failed;
        split.failed = true;
        split.left = split.left.saturating_sub(1);
        if split.left == 0 {
            splits.remove(&key);
        }
        first
    }
}

/// How [`split`] cuts a request.
enum Cut<V: Val> {
    /// Every key is thread `shard`'s.
    Whole(usize),
    /// One part per thread touched: the thread, its pairs, and the
    /// positions of its keys in the request.
    Parts(Vec<(usize, KVPairs<V>, Vec<u32>)>),
}

/// Cuts `kvs` by the thread each key belongs to (of `n`).
fn split<V: Val>(kvs: &KVPairs<V>, n: usize) -> Cut<V> {
    let shards: Vec<usize> = kvs.keys.iter().map(|&k| shard_of(k, n)).collect();
    let first = shards.first().copied().unwrap_or(0);
    if shards.iter().all(|&s| s == first) {
        return Cut::Whole(first);
    }
    let per_key = kvs.values_per_key();
    let with_lens = !kvs.lens.is_empty();
    let mut keys: Vec<Vec<Key>> = vec![Vec::new(); n];
    let mut vals: Vec<Vec<V>> = vec![Vec::new(); n];
    let mut lens: Vec<Vec<i32>> = vec![Vec::new(); n];
    let mut positions: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut offset = 0;
    for (i, (&key, &s)) in kvs.keys.iter().zip(&shards).enumerate() {
        let count = per_key[i];
        keys[s].push(key);
        positions[s].push(i as u32);
        if let Some(v) = kvs.vals.get(offset..offset + count) {
            vals[s].extend_from_slice(v);
        }
        if with_lens {
            lens[s].push(count as i32);
        }
        offset += count;
    }
    let touched: Vec<usize> = (0..n).filter(|&s| !keys[s].is_empty()).collect();
    let parts = touched
        .into_iter()
        .map(|s| {
            let pairs = KVPairs {
                keys: SArray::from_vec(std::mem::take(&mut keys[s])),
                vals: SArray::from_vec(std::mem::take(&mut vals[s])),
                lens: SArray::from_vec(std::mem::take(&mut lens[s])),
            };
            (s, pairs, std::mem::take(&mut positions[s]))
        })
        .collect();
    Cut::Parts(parts)
}

/// The response of a cut request from its parts' answers: the values back
/// in the request's key order. Answers that do not hold their part's keys
/// (a handle that answers with other keys) are joined as they are, for the
/// worker to refuse as it would from one thread.
fn merge<V: Val>(split: Split<V>) -> KVPairs<V> {
    let answers: Vec<KVPairs<V>> = split
        .answers
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect();
    if answers
        .iter()
        .all(|a| a.keys.is_empty() && a.vals.is_empty())
    {
        return KVPairs::default();
    }
    let fits = answers
        .iter()
        .zip(&split.parts)
        .all(|(a, p)| a.keys.len() == p.positions.len());
    if !fits {
        return KVPairs {
            keys: SArray::concat(&answers.iter().map(|a| a.keys.clone()).collect::<Vec<_>>()),
            vals: SArray::concat(&answers.iter().map(|a| a.vals.clone()).collect::<Vec<_>>()),
            lens: SArray::new(),
        };
    }
    let total = split.keys.len();
    let mut counts = vec![0usize; total];
    for (answer, part) in answers.iter().zip(&split.parts) {
        for (&pos, count) in part.positions.iter().zip(answer.values_per_key()) {
            counts[pos as usize] = count;
        }
    }
    let uniform = counts.windows(2).all(|w| w[0] == w[1]);
    let mut starts = Vec::with_capacity(total);
    let mut at = 0;
    for &c in &counts {
        starts.push(at);
        at += c;
    }
    let mut vals = vec![V::default(); at];
    for (answer, part) in answers.iter().zip(&split.parts) {
        let mut from = 0;
        for &pos in &part.positions {
            let (start, count) = (starts[pos as usize], counts[pos as usize]);
            if let Some(src) = answer.vals.get(from..from + count) {
                vals[start..start + count].copy_from_slice(src);
            }
            from += count;
        }
    }
    KVPairs {
        keys: split.keys,
        vals: SArray::from_vec(vals),
        lens: if uniform {
            SArray::new()
        } else {
            SArray::from_vec(counts.into_iter().map(|c| c as i32).collect())
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ts: i32) -> KVMeta {
        KVMeta {
            cmd: 0,
            push: false,
            pull: true,
            sender: 9,
            timestamp: ts,
            customer_id: 0,
            app_id: 0,
            priority: 0,
            compression: None,
            same_keys: None,
        }
    }

    #[test]
    fn keys_spread_over_the_threads_and_stay_with_theirs() {
        let n = 4;
        let mut seen = vec![0; n];
        for k in 0..1000u64 {
            let s = shard_of(k, n);
            assert_eq!(s, shard_of(k, n));
            seen[s] += 1;
        }
        assert!(seen.iter().all(|&c| c > 150), "{seen:?}");
        assert_eq!(shard_of(12345, 1), 0);
    }

    /// A pull cut into parts and answered in any order comes back as one
    /// response in key order, with lens exactly when keys differ.
    #[test]
    fn answers_of_the_parts_make_the_response_one_thread_gives() {
        let n = 3;
        let keys: Vec<Key> = (0..50).map(|k| k * 7).collect();
        for lens in [None, Some((0..50).map(|i| 1 + i % 3).collect::<Vec<i32>>())] {
            let counts: Vec<usize> = match &lens {
                Some(l) => l.iter().map(|&c| c as usize).collect(),
                None => vec![2; 50],
            };
            let vals: Vec<f32> = counts
                .iter()
                .enumerate()
                .flat_map(|(i, &c)| (0..c).map(move |j| (i * 10 + j) as f32))
                .collect();
            let req = KVPairs {
                keys: SArray::from_vec(keys.clone()),
                vals: SArray::from_vec(vals.clone()),
                lens: lens.clone().map(SArray::from_vec).unwrap_or_default(),
            };
            let Cut::Parts(parts) = split(&req, n) else {
                panic!("50 keys over 3 threads are cut");
            };
            assert_eq!(parts.len(), 3);
            let engine = Engine::<f32> {
                queues: Vec::new(),
                splits: Mutex::new(HashMap::new()),
            };
            // As submit records it, with 3 queues.
            let engine = Engine {
                queues: (0..n).map(|_| crossbeam_channel::unbounded().0).collect(),
                ..engine
            };
            let m = meta(1);
            lock(&engine.splits).insert(
                request_key(&m),
                Split {
                    keys: req.keys.clone(),
                    answers: vec![None, None, None],
                    left: 3,
                    parts: parts
                        .iter()
                        .map(|(s, _, p)| PartOf {
                            shard: *s,
                            positions: p.clone(),
                        })
                        .collect(),
                    failed: false,
                },
            );
            // Each part answered with its own pairs (an echo), last first.
            let mut done = None;
            for (_, part, _) in parts.into_iter().rev() {
                match engine.collect(&m, part) {
                    Collected::Kept => {}
                    Collected::Complete(res) => done = Some(res),
                    Collected::Whole(_) => panic!("the request was cut"),
                }
            }
            let res = done.expect("complete after the third answer");
            assert_eq!(res.keys.as_slice(), &keys[..]);
            assert_eq!(res.vals.as_slice(), &vals[..]);
            assert_eq!(res.lens.is_empty(), lens.is_none());
            if let Some(l) = lens {
                assert_eq!(res.lens.as_slice(), &l[..]);
            }
            assert!(lock(&engine.splits).is_empty());
            // Another request is not one of them.
            assert!(matches!(
                engine.collect(&meta(2), KVPairs::default()),
                Collected::Whole(_)
            ));
        }
    }

    #[test]
    fn a_request_of_one_threads_keys_is_not_cut() {
        let n = 4;
        let key = 77u64;
        let req = KVPairs::<f32> {
            keys: SArray::from_vec(vec![key]),
            vals: SArray::from_vec(vec![1.0]),
            lens: SArray::new(),
        };
        assert!(matches!(split(&req, n), Cut::Whole(s) if s == shard_of(key, n)));
    }

    /// What the engine under test tells the workers: a request's outcome.
    #[derive(Debug, PartialEq)]
    enum Outcome {
        Done(i32),
        Refused(i32, Refusal),
    }

    /// The sum store on engine threads, answering into a channel as a
    /// server would (the parts' answers through `collect`).
    struct SumStore {
        store: crate::DefaultHandle<f32>,
        engine: std::sync::OnceLock<std::sync::Weak<Engine<f32>>>,
        told: crossbeam_channel::Sender<Outcome>,
    }

    impl Runs<f32> for SumStore {
        fn check(&self, meta: &KVMeta, part: &KVPairs<f32>) -> Result<(), Refusal> {
            self.store.check_lengths(meta, part)
        }

        fn run(&self, meta: &KVMeta, part: KVPairs<f32>) {
            let Some(engine) = self.engine.get().and_then(|e| e.upgrade()) else {
                return;
            };
            match self.store.apply(meta, &part) {
                Ok(res) => match engine.collect(meta, res) {
                    Collected::Whole(_) | Collected::Complete(_) => {
                        let _ = self.told.send(Outcome::Done(meta.timestamp));
                    }
                    Collected::Kept => {}
                },
                Err(refusal) => {
                    if engine.part_failed(meta) {
                        let _ = self.told.send(Outcome::Refused(meta.timestamp, refusal));
                    }
                }
            }
        }

        fn refuse(&self, meta: &KVMeta, refusal: Refusal) {
            let _ = self.told.send(Outcome::Refused(meta.timestamp, refusal));
        }
    }

    fn push_meta(ts: i32) -> KVMeta {
        KVMeta {
            push: true,
            pull: false,
            ..meta(ts)
        }
    }

    /// One push of the property below: which of 64 keys it sends, and the
    /// keys (if any) it sends 1 or 3 values instead of the 2 they hold.
    #[derive(Debug, Clone)]
    struct Push {
        keys: Vec<bool>,
        wrong: Vec<(usize, usize)>,
    }

    fn pushes() -> impl proptest::strategy::Strategy<Value = Vec<Push>> {
        use proptest::prelude::*;
        let one = (
            proptest::collection::vec(any::<bool>(), 64),
            proptest::collection::vec((0..64usize, prop_oneof![Just(1usize), Just(3usize)]), 0..3),
        )
            .prop_map(|(keys, wrong)| Push { keys, wrong });
        proptest::collection::vec(one, 1..40)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Pushes on 1, 2 and 4 engine threads, some sending a key (on any
        /// thread) a wrong number of values, all in flight at once: each
        /// push is either applied whole and answered, or refused once
        /// (naming its first wrong key) with nothing of it applied.
        #[test]
        fn a_refused_push_applies_nothing_on_any_number_of_threads(plan in pushes()) {
            for threads in [1usize, 2, 4] {
                let (told, outcomes) = crossbeam_channel::unbounded();
                let sum = Arc::new(SumStore {
                    store: crate::DefaultHandle::new(),
                    engine: std::sync::OnceLock::new(),
                    told,
                });
                let engine = Engine::start(threads, 0, sum.clone()).expect("threads start");
                let _ = sum.engine.set(Arc::downgrade(&engine));
                let all: Vec<Key> = (0..64u64).map(|k| k * 0x0101_0101_0101).collect();
                // Every key holds 2 values.
                engine.submit(&push_meta(0), KVPairs {
                    keys: SArray::from_vec(all.clone()),
                    vals: SArray::from_vec(vec![1.0; 128]),
                    lens: SArray::new(),
                });
                let mut expected = vec![1.0f32; 128];
                let mut refused = HashMap::new();
                for (i, push) in plan.iter().enumerate() {
                    let ts = i as i32 + 1;
                    let chosen: Vec<usize> = (0..64).filter(|&k| push.keys[k]).collect();
                    if chosen.is_empty() {
                        continue;
                    }
                    let wrong: HashMap<usize, usize> = push.wrong.iter()
                        .filter(|(k, _)| push.keys[*k])
                        .cloned()
                        .collect();
                    let lens: Vec<i32> = chosen.iter()
                        .map(|k| wrong.get(k).copied().unwrap_or(2) as i32)
                        .collect();
                    let total: usize = lens.iter().map(|&l| l as usize).sum();
                    let value = ts as f32;
                    engine.submit(&push_meta(ts), KVPairs {
                        keys: SArray::from_vec(chosen.iter().map(|&k| all[k]).collect()),
                        vals: SArray::from_vec(vec![value; total]),
                        lens: SArray::from_vec(lens),
                    });
                    match chosen.iter().find(|k| wrong.contains_key(k)) {
                        Some(&first) => {
                            refused.insert(ts, (all[first], wrong[&first] as u64));
                        }
                        None => {
                            for &k in &chosen {
                                expected[2 * k] += value;
                                expected[2 * k + 1] += value;
                            }
                        }
                    }
                }
                let sent = 1 + plan.iter().filter(|p| p.keys.iter().any(|&b| b)).count();
                let mut seen = HashMap::new();
                for _ in 0..sent {
                    let outcome = outcomes
                        .recv_timeout(std::time::Duration::from_secs(10))
                        .expect("every push is answered or refused");
                    let ts = match &outcome {
                        Outcome::Done(ts) | Outcome::Refused(ts, _) => *ts,
                    };
                    proptest::prop_assert!(seen.insert(ts, outcome).is_none(), "told twice: {ts}");
                }
                for (ts, outcome) in &seen {
                    match (refused.get(ts), outcome) {
                        (None, Outcome::Done(_)) => {}
                        (Some(&(key, sent)), Outcome::Refused(_, Refusal::Lengths { key: k, held, sent: s, .. })) => {
                            proptest::prop_assert_eq!((key, 2, sent), (*k, *held, *s));
                        }
                        (want, got) => proptest::prop_assert!(false, "push {ts}: wanted refusal {want:?}, got {got:?}"),
                    }
                }
                let pulled = sum.store.apply(&meta(-1), &KVPairs {
                    keys: SArray::from_vec(all.clone()),
                    vals: SArray::new(),
                    lens: SArray::new(),
                }).expect("a pull");
                proptest::prop_assert_eq!(pulled.vals.as_slice(), &expected[..], "at {} threads", threads);
                proptest::prop_assert!(lock(&engine.splits).is_empty());
            }
        }
    }
}
