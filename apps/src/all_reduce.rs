//! [`AllReduceHandle`]: a server request handle that sums each key's pushes
//! over one round of every worker and then answers them all with the sum:
//! an all-reduce through the servers, as BytePS's servers do for
//! data-parallel training (`pslite.torch.DistributedOptimizer` runs on it),
//! and [`serve_all_reduce`]: the apps of such a job's servers, served by
//! `pslite.torch.init()` and by the native `pslite torch-server` alike.
//! Workers that run out of data join ([`JOIN`]) or say they finished
//! ([`FINISHED`]): see `all_reduce/members.rs`.
//!
//! A round's sum is the same bits whatever order its parts arrived in: the
//! parts are held until the round is complete (as before: one pass over
//! memory) and added in the order of their senders' node ids, which for
//! workers is their rank order (worker r is node 9 + 2r). Float addition
//! is not associative, so adding in arrival order made two runs of one job
//! differ in the last bit at 3 workers or more.

use std::collections::HashMap;

use log::warn;

use pslite_postoffice::Postoffice;

use crate::embedding::TorchServerHandle;
use crate::kv_pairs::{KVMeta, KVPairs, Key, RawByte, Val};
use crate::kv_server::KVServer;
use crate::sarray::SArray;
use crate::{Error, Refusal};

mod colocated;
mod members;
pub use colocated::ColocatedServer;
pub use members::{FINISHED, JOIN};

/// One key set's round: the values pushed so far with their senders
/// (summed once all are in, in sender order: one pass over memory) and
/// the requests waiting for the sum.
struct Round<V: Val> {
    keys: SArray<Key>,
    lens: SArray<i32>,
    parts: Vec<(i32, SArray<V>)>,
    waiting: Vec<KVMeta>,
}

/// The command (`cmd`) of a request whose round's sum is divided by the
/// number of workers (the mean), for value types that can be divided
/// ([`AllReduceHandle::averaging`]).
pub const AVERAGE: i32 = 1;

/// Value types whose sums [`AllReduceHandle`] can turn into means.
pub trait Mean: Val {
    /// Multiplies every value by `by`.
    fn scale(values: &mut [Self], by: f64);
}

impl Mean for f32 {
    fn scale(values: &mut [f32], by: f64) {
        let by = by as f32;
        values.iter_mut().for_each(|v| *v *= by);
    }
}

impl Mean for f64 {
    fn scale(values: &mut [f64], by: f64) {
        values.iter_mut().for_each(|v| *v *= by);
    }
}

/// Elements summed per block: the block of the sum stays in cache while
/// every part is added and it is scaled.
const BLOCK: usize = 16 * 1024;

/// Multiplies values by a factor ([`Mean::scale`]), and the factor.
type Scale<V> = (fn(&mut [V], f64), f64);

/// The sum of `parts` (all of one length), added in the order given,
/// times the scale if given.
fn sum<V: Val>(parts: &[SArray<V>], scale: Option<Scale<V>>) -> Vec<V> {
    let n = parts.first().map_or(0, |p| p.len());
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    while at < n {
        let end = (at + BLOCK).min(n);
        let start = out.len();
        out.extend_from_slice(&parts[0][at..end]);
        let block = &mut out[start..];
        for part in &parts[1..] {
            for (s, v) in block.iter_mut().zip(&part[at..end]) {
                *s += *v;
            }
        }
        if let Some((f, by)) = scale {
            f(block, by);
        }
        at = end;
    }
    out
}

/// Sums a round of pushes per key set: each of `workers` workers pushes (or
/// push-pulls) the same keys once per round; when the last one is in, every
/// request of the round is answered (a push-pull with the sum, a push
/// empty) and the next round starts from zero. The parts are added in the
/// order of their senders' node ids (rank order), never in arrival order,
/// so the sum's bits do not depend on timing. A round is named by its
/// first key: a request whose keys or value counts differ from its round's
/// is refused ([`Refusal::Lengths`]), and so is a pull alone (there is
/// nothing to pull between rounds). Every answer of a round shares one
/// buffer (no copies).
///
/// A worker out of data sends [`JOIN`]: until every worker has joined, the
/// rounds complete without the joined ones (their parts count as zeros: a
/// mean still divides by `workers`), and then every join is answered. A
/// worker that ends without joining sends [`FINISHED`]: the rounds that
/// wait for it, then and later, are refused, naming its rank.
///
/// ```no_run
/// # fn demo(po: &pslite::Postoffice) -> Result<(), pslite::Error> {
/// let server = pslite::KVServer::<f32>::new(po, 0)?;
/// server.set_request_handle(pslite::AllReduceHandle::new(po.num_workers() as usize).into_handle());
/// # Ok(()) }
/// ```
pub struct AllReduceHandle<V: Val> {
    workers: usize,
    rounds: HashMap<Key, Round<V>>,
    /// Set by [`AllReduceHandle::averaging`].
    mean: Option<fn(&mut [V], f64)>,
    /// The workers that joined or finished.
    members: members::Members<V>,
}

impl<V: Val> AllReduceHandle<V> {
    /// Rounds of `workers` pushes (at least 1).
    pub fn new(workers: usize) -> Self {
        AllReduceHandle {
            workers: workers.max(1),
            rounds: HashMap::new(),
            mean: None,
            members: members::Members::default(),
        }
    }

    /// Also answers rounds whose requests carry `cmd` [`AVERAGE`] with the
    /// mean instead of the sum (summed and divided in one pass).
    pub fn averaging(mut self) -> Self
    where
        V: Mean,
    {
        self.mean = Some(V::scale);
        self
    }

    /// Adds request `req` to its round; when the round is complete, the
    /// answers to send (each request's meta and pairs).
    pub fn apply(
        &mut self,
        meta: &KVMeta,
        req: KVPairs<V>,
    ) -> Result<Vec<(KVMeta, KVPairs<V>)>, Refusal> {
        let refuse = |reason: String| Refusal::Other {
            app: meta.app_id,
            reason,
        };
        if !meta.push {
            return Err(refuse(
                "an all-reduce server answers pushes and push-pulls, not pulls alone".into(),
            ));
        }
        if meta.cmd == JOIN {
            return self.join(meta, req);
        }
        let Some(&first) = req.keys.first() else {
            return Ok(vec![(meta.clone(), KVPairs::default())]);
        };
        if let Some(reason) = self
            .members
            .refuses(meta.sender, first, self.rounds.get(&first))
        {
            return Err(refuse(reason));
        }
        if meta.cmd == AVERAGE && self.mean.is_none() {
            return Err(refuse(
                "this all-reduce server sums only: it cannot average values of this type".into(),
            ));
        }
        let round = self.rounds.entry(first).or_insert_with(|| Round {
            keys: req.keys.clone(),
            lens: req.lens.clone(),
            parts: Vec::new(),
            waiting: Vec::new(),
        });
        if round.keys[..] != req.keys[..] {
            return Err(refuse(format!(
                "the round of key {first} sums {} keys and this request sends {}: every worker \
                 must push the same keys",
                round.keys.len(),
                req.keys.len()
            )));
        }
        if let Some(held) = round.parts.first().map(|(_, p)| p.len()) {
            if held != req.vals.len() {
                return Err(Refusal::Lengths {
                    app: meta.app_id,
                    key: first,
                    held: held as u64,
                    sent: req.vals.len() as u64,
                });
            }
        } else {
            round.lens = req.lens.clone();
        }
        round.parts.push((meta.sender, req.vals));
        round.waiting.push(meta.clone());
        if round.waiting.len() < self.members.needed(self.workers, first) {
            return Ok(Vec::new());
        }
        Ok(self.complete(first))
    }

    /// Round `first`'s answers (the round ends): its sum, or its mean over
    /// every worker (joined workers count, as zeros).
    fn complete(&mut self, first: Key) -> Vec<(KVMeta, KVPairs<V>)> {
        let Some(mut round) = self.rounds.remove(&first) else {
            return Vec::new();
        };
        // Stable: a sender's own parts (a worker that pushed twice) keep
        // their order.
        round.parts.sort_by_key(|(sender, _)| *sender);
        let parts: Vec<SArray<V>> = round.parts.into_iter().map(|(_, p)| p).collect();
        let mean = match (self.mean, round.waiting.iter().any(|m| m.cmd == AVERAGE)) {
            (Some(f), true) => Some((f, 1.0 / self.workers as f64)),
            _ => None,
        };
        let sum = KVPairs {
            keys: round.keys,
            vals: SArray::from_vec(sum(&parts, mean)),
            lens: round.lens,
        };
        round
            .waiting
            .into_iter()
            .map(|m| {
                let pairs = if m.pull {
                    sum.clone()
                } else {
                    KVPairs::default()
                };
                (m, pairs)
            })
            .collect()
    }

    /// Handles one request as [`AllReduceHandle::into_handle`]'s closure
    /// does: adds it to its round (or takes a worker's [`FINISHED`]) and
    /// sends the answers that are due.
    pub fn handle(&mut self, meta: &KVMeta, req: KVPairs<V>, server: &KVServer<V>) {
        let answers = if meta.cmd == FINISHED {
            for (m, refusal) in self.finish(meta) {
                server.refuse(&m, refusal);
            }
            vec![(meta.clone(), KVPairs::default())]
        } else {
            match self.apply(meta, req) {
                Ok(answers) => answers,
                Err(refusal) => return server.refuse(meta, refusal),
            }
        };
        for (m, pairs) in answers {
            if let Err(e) = server.response(&m, pairs) {
                warn!("cannot answer node {}: {e}", m.sender);
            }
        }
    }

    /// The handle as a closure for [`KVServer::set_request_handle`].
    pub fn into_handle(mut self) -> impl FnMut(&KVMeta, KVPairs<V>, &KVServer<V>) + Send + 'static {
        move |meta, req, server| self.handle(meta, req, server)
    }
}

/// The app ids of a data-parallel job's servers ([`serve_all_reduce`]):
/// what `pslite.torch`'s workers push to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllReduceApps {
    /// float32 gradients, averaged (`cmd` [`AVERAGE`]) or summed.
    pub float32: i32,
    /// Raw bytes, summed with wrap-around (broadcasts: every worker but
    /// the root sends zeros).
    pub raw: i32,
    /// float64 gradients, averaged or summed.
    pub float64: i32,
}

/// The one layout of a data-parallel job's apps, read by the servers
/// ([`serve_all_reduce`]) and by `pslite.torch`'s workers
/// (`pslite._pslite.ALL_REDUCE_APPS`).
pub const ALL_REDUCE_APPS: AllReduceApps = AllReduceApps {
    float32: 0,
    raw: 1,
    float64: 2,
};

/// Serves a data-parallel job as one of its servers until every node has
/// finalized: the [`ALL_REDUCE_APPS`], each an [`AllReduceHandle`] over the
/// job's workers (averaging where the type can be divided), the float32
/// app also the job's embedding tables ([`crate::embedding`]: a
/// [`TorchServerHandle`], replicated and checkpointed). `po` must be a
/// started server. `pslite.torch.init()` on a server and the native
/// `pslite torch-server` (what `pslite launch --torch` runs) both call it.
pub fn serve_all_reduce(po: &Postoffice) -> Result<(), Error> {
    let workers = usize::try_from(po.num_workers()).unwrap_or(1);
    let float32 = KVServer::<f32>::new(po, ALL_REDUCE_APPS.float32)?;
    let begins = po.server_key_ranges().iter().map(|r| r.begin).collect();
    float32.set_replicated_handle(TorchServerHandle::new(workers, begins));
    let raw = KVServer::<RawByte>::new(po, ALL_REDUCE_APPS.raw)?;
    raw.set_request_handle(AllReduceHandle::new(workers).into_handle());
    let float64 = KVServer::<f64>::new(po, ALL_REDUCE_APPS.float64)?;
    float64.set_request_handle(AllReduceHandle::new(workers).averaging().into_handle());
    po.finalize(0, true)?;
    drop((float32, raw, float64));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(sender: i32, pull: bool) -> KVMeta {
        KVMeta {
            cmd: 0,
            push: true,
            pull,
            sender,
            timestamp: 0,
            customer_id: 0,
            app_id: 0,
            priority: 0,
            compression: None,
            same_keys: None,
        }
    }

    #[test]
    fn a_round_answers_every_worker_with_the_sum_then_starts_again() {
        let mut h = AllReduceHandle::<f32>::new(2);
        let a = h.apply(&meta(9, true), KVPairs::new(vec![5, 6], vec![1.0, 2.0]));
        assert!(a.unwrap().is_empty());
        let done = h
            .apply(&meta(11, false), KVPairs::new(vec![5, 6], vec![10.0, 20.0]))
            .unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(&done[0].1.vals[..], &[11.0, 22.0]);
        assert!(done[1].1.vals.is_empty()); // a push alone gets no values
                                            // The next round starts from zero.
        assert!(h
            .apply(&meta(9, true), KVPairs::new(vec![5, 6], vec![1.0, 1.0]))
            .unwrap()
            .is_empty());
        // The mean, summed and scaled in one pass.
        let mut h = AllReduceHandle::<f64>::new(2).averaging();
        let mut m = meta(9, true);
        m.cmd = AVERAGE;
        let big: Vec<f64> = (0..40_000).map(f64::from).collect();
        assert!(h
            .apply(&m, KVPairs::new(vec![1], big.clone()))
            .unwrap()
            .is_empty());
        let done = h
            .apply(&m, KVPairs::new(vec![1], vec![1.0; 40_000]))
            .unwrap();
        assert_eq!(done[0].1.vals[39_999], (39_999.0 + 1.0) / 2.0);
        assert_eq!(
            done[0].1.vals[..],
            big.iter().map(|v| (v + 1.0) * 0.5).collect::<Vec<_>>()[..]
        );
        let mut h = AllReduceHandle::<f32>::new(2);
        assert!(h.apply(&m, KVPairs::new(vec![1], vec![1.0])).is_err());
        let mut h = AllReduceHandle::<f32>::new(2);
        assert!(h
            .apply(&meta(9, true), KVPairs::new(vec![5, 6], vec![1.0, 1.0]))
            .unwrap()
            .is_empty());
        // Other keys under the same first key, or other lengths: refused.
        assert!(h
            .apply(&meta(11, true), KVPairs::new(vec![5], vec![1.0]))
            .is_err());
        assert!(matches!(
            h.apply(&meta(11, true), KVPairs::new(vec![5, 6], vec![1.0; 4])),
            Err(Refusal::Lengths {
                key: 5,
                held: 2,
                sent: 4,
                ..
            })
        ));
        let mut pull = meta(11, true);
        pull.push = false;
        assert!(h
            .apply(&pull, KVPairs::new(vec![5, 6], Vec::new()))
            .is_err());
    }

    /// Every order of `items` (Heap's algorithm).
    fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
        fn go<T: Clone>(k: usize, a: &mut Vec<T>, out: &mut Vec<Vec<T>>) {
            if k <= 1 {
                out.push(a.clone());
                return;
            }
            for i in 0..k {
                go(k - 1, a, out);
                let j = if k % 2 == 0 { i } else { 0 };
                a.swap(j, k - 1);
            }
        }
        let mut out = Vec::new();
        go(items.len(), &mut items.to_vec(), &mut out);
        out
    }

    #[test]
    fn a_round_sums_in_sender_order_whatever_the_arrival_order() {
        // Five workers (nodes 9, 11, .., 17) whose values differ in scale,
        // so that float addition in another order rounds differently.
        let parts: Vec<(i32, Vec<f64>)> = (0..5)
            .map(|r| {
                let vals = (0..64)
                    .map(|i| {
                        let x = f64::from(i * 7 + r * 13 + 1).sin();
                        x * 10f64.powi(4 * r - 8) * if r % 2 == 0 { 1.0 } else { -1.0 }
                    })
                    .collect();
                (9 + 2 * r, vals)
            })
            .collect();
        let in_rank_order: Vec<f64> = (0..64)
            .map(|i| {
                let mut s = parts[0].1[i];
                for (_, p) in &parts[1..] {
                    s += p[i];
                }
                s * 0.2
            })
            .collect();
        let mut arrival_order_differs = false;
        for order in permutations(&parts) {
            let mut h = AllReduceHandle::<f64>::new(5).averaging();
            let mut answers = Vec::new();
            for (sender, vals) in &order {
                let mut m = meta(*sender, true);
                m.cmd = AVERAGE;
                answers = h.apply(&m, KVPairs::new(vec![3], vals.clone())).unwrap();
            }
            assert_eq!(answers.len(), 5);
            for (_, pairs) in &answers {
                let bits: Vec<u64> = pairs.vals.iter().map(|v| v.to_bits()).collect();
                let want: Vec<u64> = in_rank_order.iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    bits,
                    want,
                    "arrival order {:?}",
                    order.iter().map(|p| p.0).collect::<Vec<_>>()
                );
            }
            // What summing in arrival order would have given.
            let arrival: Vec<f64> = (0..64)
                .map(|i| order.iter().skip(1).fold(order[0].1[i], |s, p| s + p.1[i]) * 0.2)
                .collect();
            arrival_order_differs |= arrival
                .iter()
                .zip(&in_rank_order)
                .any(|(a, b)| a.to_bits() != b.to_bits());
        }
        assert!(
            arrival_order_differs,
            "the values must make the order matter"
        );
    }
}
