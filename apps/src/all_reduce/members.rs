//! Workers that run out of data ([`JOIN`]) or end ([`FINISHED`]): the
//! servers' side of `pslite.torch.join()` and of a worker's shutdown.
//!
//! A joined worker pushes nothing until every worker has joined: the
//! rounds complete without it (a mean still divides by every worker, as if
//! it had pushed zeros), and its join is answered once the last worker has
//! joined. A worker that finished never pushes again: the rounds that wait
//! for it are refused at once, naming its rank, instead of waiting forever.
//!
//! Joins are counted per key range: a join carries the first and the last
//! key of the server's range it is sent for, and counts for the rounds of
//! that range only. With replicated ranges (`PS_REPLICAS`) one handle holds
//! the range it is primary of and the ranges it backs up, and sees every
//! worker join each of them: each range's joins are its own, as on the
//! range's other replicas.

use super::{AllReduceHandle, Round};
use crate::ids::id_to_rank;
use crate::kv_pairs::{KVMeta, KVPairs, Key, Val};
use crate::Refusal;

/// The command (`cmd`) of a worker's join: a push-pull of the first and
/// the last key of the server's range (or one key: the whole key space),
/// answered once every worker has joined that range, with the values the
/// last worker to join pushed (`pslite.torch.join()` pushes its rank).
pub const JOIN: i32 = 100;

/// The command (`cmd`) of a worker that ends: a push of one key of the
/// server's range, answered at once; every round that waits for that
/// worker, open or later, is refused with its rank.
pub const FINISHED: i32 = 101;

/// The joins of one key range `[first, last]`: who joined, in order, with
/// their held requests.
struct Joins<V: Val> {
    first: Key,
    last: Key,
    held: Vec<(i32, KVMeta, KVPairs<V>)>,
}

impl<V: Val> Joins<V> {
    fn has(&self, rank: i32) -> bool {
        self.held.iter().any(|(r, _, _)| *r == rank)
    }
}

/// The joins of each key range, and who finished.
pub(super) struct Members<V: Val> {
    ranges: Vec<Joins<V>>,
    finished: Vec<i32>,
}

impl<V: Val> Default for Members<V> {
    fn default() -> Self {
        Members {
            ranges: Vec::new(),
            finished: Vec::new(),
        }
    }
}

/// Why a round of `key` that waits for finished worker `rank` is refused.
fn finished_reason(rank: i32, key: Key) -> String {
    format!(
        "worker rank {rank} has finished (its script ended) and will not push key {key} again: \
         every worker must run as many steps, or a worker out of data calls \
         pslite.torch.join()"
    )
}

impl<V: Val> Members<V> {
    /// The joins of the range that holds `key`, if any worker joined it.
    fn of(&self, key: Key) -> Option<&Joins<V>> {
        self.ranges.iter().find(|j| j.first <= key && key <= j.last)
    }

    /// Parts that complete a round of `key` among `workers` workers.
    pub(super) fn needed(&self, workers: usize, key: Key) -> usize {
        let joined = self.of(key).map_or(0, |j| j.held.len());
        workers.saturating_sub(joined).max(1)
    }

    /// Why a push of `sender` to the round of `key` (None: a new round)
    /// is refused: the sender joined, or a finished worker has no part in
    /// the round.
    pub(super) fn refuses(
        &self,
        sender: i32,
        key: Key,
        round: Option<&Round<V>>,
    ) -> Option<String> {
        let rank = id_to_rank(sender);
        if self.of(key).is_some_and(|j| j.has(rank)) {
            return Some(format!(
                "worker rank {rank} pushed key {key} after it joined (pslite.torch.join()): a \
                 joined worker pushes nothing until every worker has joined"
            ));
        }
        let has_part = |r: i32| {
            round.is_some_and(|round| round.waiting.iter().any(|m| id_to_rank(m.sender) == r))
        };
        self.finished
            .iter()
            .find(|&&r| !has_part(r))
            .map(|&r| finished_reason(r, key))
    }
}

impl<V: Val> AllReduceHandle<V> {
    /// Worker `meta.sender` joins: the open rounds that no longer wait for
    /// anyone complete; once every worker has joined, every join is answered
    /// (with the values of the last one) and the next rounds need everyone
    /// again.
    pub(super) fn join(
        &mut self,
        meta: &KVMeta,
        req: KVPairs<V>,
    ) -> Result<Vec<(KVMeta, KVPairs<V>)>, Refusal> {
        let rank = id_to_rank(meta.sender);
        let refuse = |reason: String| Refusal::Other {
            app: meta.app_id,
            reason,
        };
        if let Some(&gone) = self.members.finished.first() {
            return Err(refuse(format!(
                "worker rank {gone} has finished without joining (pslite.torch.join()), so the \
                 join of worker rank {rank} can never complete"
            )));
        }
        let (Some(&first), Some(&last)) = (req.keys.first(), req.keys.last()) else {
            return Err(refuse(format!(
                "the join of worker rank {rank} carries no key: it names the first and the last \
                 key of the server's range"
            )));
        };
        // One key: the whole key space (a join sent before ranges counted).
        let last = if req.keys.len() == 1 { Key::MAX } else { last };
        let first = if req.keys.len() == 1 { 0 } else { first };
        let members = &mut self.members;
        let index = match members
            .ranges
            .iter()
            .position(|j| j.first == first && j.last == last)
        {
            Some(i) => i,
            None => {
                if members
                    .ranges
                    .iter()
                    .any(|j| j.first <= last && first <= j.last)
                {
                    return Err(refuse(format!(
                        "the join of worker rank {rank} names keys {first}..={last}, which \
                         overlap the range another join named: every worker joins each \
                         server's range as a whole"
                    )));
                }
                members.ranges.push(Joins {
                    first,
                    last,
                    held: Vec::new(),
                });
                members.ranges.len() - 1
            }
        };
        let joins = &mut members.ranges[index];
        if joins.has(rank) {
            return Err(refuse(format!("worker rank {rank} joined twice")));
        }
        joins.held.push((rank, meta.clone(), req));
        let complete = joins.held.len() >= self.workers;
        let mut ready: Vec<Key> = self
            .rounds
            .iter()
            .filter(|(&key, round)| {
                first <= key
                    && key <= last
                    && round.waiting.len() >= self.members.needed(self.workers, key)
            })
            .map(|(&key, _)| key)
            .collect();
        ready.sort_unstable();
        let mut answers = Vec::new();
        for key in ready {
            answers.extend(self.complete(key));
        }
        if complete {
            let joins = self.members.ranges.swap_remove(index);
            let values = joins
                .held
                .last()
                .map(|(_, _, pairs)| pairs.clone())
                .unwrap_or_default();
            answers.extend(joins.held.into_iter().map(|(_, m, own)| {
                let pairs = if m.pull {
                    // Its own keys, the last join's values.
                    KVPairs {
                        keys: own.keys,
                        vals: values.vals.clone(),
                        lens: own.lens,
                    }
                } else {
                    KVPairs::default()
                };
                (m, pairs)
            }));
        }
        Ok(answers)
    }

    /// Worker `meta.sender` ended: the refusals of every request that
    /// waits for it (rounds without its part, and held joins).
    pub(super) fn finish(&mut self, meta: &KVMeta) -> Vec<(KVMeta, Refusal)> {
        let rank = id_to_rank(meta.sender);
        if !self.members.finished.contains(&rank) {
            self.members.finished.push(rank);
        }
        let mut out = Vec::new();
        // A held join can no longer complete: its worker is told, and is
        // no longer joined.
        let held = std::mem::take(&mut self.members.ranges);
        for (_, m, _) in held.into_iter().flat_map(|j| j.held) {
            let reason = format!(
                "worker rank {rank} has finished without joining (pslite.torch.join()), so this \
                 join can never complete"
            );
            out.push((
                m.clone(),
                Refusal::Other {
                    app: m.app_id,
                    reason,
                },
            ));
        }
        let mut waiting: Vec<Key> = self
            .rounds
            .iter()
            .filter(|(_, round)| !round.waiting.iter().any(|m| id_to_rank(m.sender) == rank))
            .map(|(&key, _)| key)
            .collect();
        waiting.sort_unstable();
        for key in waiting {
            if let Some(round) = self.rounds.remove(&key) {
                for m in round.waiting {
                    let reason = finished_reason(rank, key);
                    out.push((
                        m.clone(),
                        Refusal::Other {
                            app: m.app_id,
                            reason,
                        },
                    ));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::all_reduce::AVERAGE;
    use crate::ids::worker_rank_to_id;

    fn meta(rank: i32, cmd: i32) -> KVMeta {
        KVMeta {
            cmd,
            push: true,
            pull: true,
            sender: worker_rank_to_id(rank),
            timestamp: rank,
            customer_id: 0,
            app_id: 2,
            priority: 0,
            compression: None,
            same_keys: None,
        }
    }

    fn push(rank: i32, cmd: i32, key: Key, v: f64) -> (KVMeta, KVPairs<f64>) {
        (meta(rank, cmd), KVPairs::new(vec![key], vec![v]))
    }

    fn reason(r: &Refusal) -> &str {
        match r {
            Refusal::Other { reason, .. } => reason,
            _ => "",
        }
    }

    #[test]
    fn joined_workers_count_as_zeros_until_the_last_joins() {
        let mut h = AllReduceHandle::<f64>::new(3).averaging();
        let (m, p) = push(2, JOIN, 8, 2.0);
        assert!(
            h.apply(&m, p).unwrap().is_empty(),
            "a join waits for the others"
        );
        // Ranks 0 and 1 complete a round without rank 2: the mean over 3.
        let (m, p) = push(0, AVERAGE, 5, 3.0);
        assert!(h.apply(&m, p).unwrap().is_empty());
        let (m, p) = push(1, AVERAGE, 5, 6.0);
        let done = h.apply(&m, p).unwrap();
        assert_eq!(done.len(), 2);
        assert_eq!(&done[0].1.vals[..], &[3.0]);
        // A round open when rank 1 joins completes with rank 0's part.
        let (m, p) = push(0, AVERAGE, 5, 9.0);
        assert!(h.apply(&m, p).unwrap().is_empty());
        let (m, p) = push(1, JOIN, 8, 1.0);
        let done = h.apply(&m, p).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].0.timestamp, done[0].1.vals[0]), (0, 3.0));
        // A joined worker that pushes is refused.
        let (m, p) = push(1, 0, 6, 1.0);
        assert!(reason(&h.apply(&m, p).unwrap_err()).contains("after it joined"));
        // The last join answers every join with its values.
        let (m, p) = push(0, JOIN, 8, 0.0);
        let done = h.apply(&m, p).unwrap();
        let mut got: Vec<(i32, f64)> = done.iter().map(|(m, p)| (m.timestamp, p.vals[0])).collect();
        got.sort_by_key(|g| g.0);
        assert_eq!(got, vec![(0, 0.0), (1, 0.0), (2, 0.0)]);
        // Then rounds need every worker again.
        for rank in 0..2 {
            let (m, p) = push(rank, 0, 5, 1.0);
            assert!(h.apply(&m, p).unwrap().is_empty());
        }
        let (m, p) = push(2, 0, 5, 1.0);
        assert_eq!(h.apply(&m, p).unwrap()[0].1.vals[0], 3.0);
    }

    #[test]
    fn joins_count_per_key_range_as_on_each_replica_of_it() {
        // One handle holds ranges [0, 99] and [100, 199] (a primary and a
        // backup with PS_REPLICAS=2): rank 0 joins both, rank 1 only the
        // first, so far.
        let mut h = AllReduceHandle::<f64>::new(2);
        let join = |rank: i32, first: Key, last: Key| {
            (
                meta(rank, JOIN),
                KVPairs::new(vec![first, last], vec![rank as f64; 2]),
            )
        };
        for (rank, first, last) in [(0, 0, 99), (0, 100, 199)] {
            let (m, p) = join(rank, first, last);
            assert!(h.apply(&m, p).unwrap().is_empty());
        }
        // Joining the other range is not joining twice; the same one is.
        let (m, p) = join(0, 100, 199);
        assert!(reason(&h.apply(&m, p).unwrap_err()).contains("joined twice"));
        // Rank 1's push to the second range completes without rank 0.
        let (m, p) = push(1, 0, 150, 4.0);
        assert_eq!(h.apply(&m, p).unwrap()[0].1.vals[0], 4.0);
        // Its join of the first range answers both joins of that range,
        // each with its own keys and the last join's values.
        let (m, p) = join(1, 0, 99);
        let done = h.apply(&m, p).unwrap();
        assert_eq!(done.len(), 2);
        for (_, pairs) in &done {
            assert_eq!(
                (&pairs.keys[..], &pairs.vals[..]),
                (&[0, 99][..], &[1.0, 1.0][..])
            );
        }
        // The first range needs everyone again; the second still not rank 0.
        let (m, p) = push(1, 0, 50, 1.0);
        assert!(h.apply(&m, p).unwrap().is_empty());
        let (m, p) = push(0, 0, 160, 1.0);
        assert!(reason(&h.apply(&m, p).unwrap_err()).contains("after it joined"));
        // A join naming part of a range another join named is refused.
        let (m, p) = join(1, 100, 150);
        assert!(reason(&h.apply(&m, p).unwrap_err()).contains("overlap"));
    }

    #[test]
    fn a_finished_worker_fails_the_rounds_that_wait_for_it() {
        let mut h = AllReduceHandle::<f64>::new(3);
        // Key 5's round holds rank 1's part; key 6's does not.
        for (rank, key) in [(0, 5), (1, 5), (0, 6)] {
            let (m, p) = push(rank, 0, key, 1.0);
            assert!(h.apply(&m, p).unwrap().is_empty());
        }
        let refused = h.finish(&meta(1, FINISHED));
        assert_eq!(refused.len(), 1, "rank 0's push of key 6");
        let (m, r) = &refused[0];
        assert_eq!(m.timestamp, 0);
        for part in ["worker rank 1 has finished", "key 6", "pslite.torch.join()"] {
            assert!(reason(r).contains(part), "{r}");
        }
        // A new round waits for rank 1: refused at once.
        let (m, p) = push(0, 0, 7, 1.0);
        assert!(reason(&h.apply(&m, p).unwrap_err()).contains("worker rank 1 has finished"));
        // Key 5's round has rank 1's part: it completes.
        let (m, p) = push(2, 0, 5, 1.0);
        assert_eq!(h.apply(&m, p).unwrap().len(), 3);
        // A join can no longer complete.
        let (m, p) = push(0, JOIN, 8, 0.0);
        assert!(reason(&h.apply(&m, p).unwrap_err()).contains("finished without joining"));
        // A join held when a worker finishes is refused.
        let mut h = AllReduceHandle::<f64>::new(2);
        let (m, p) = push(0, JOIN, 8, 0.0);
        assert!(h.apply(&m, p).unwrap().is_empty());
        let refused = h.finish(&meta(1, FINISHED));
        assert_eq!(refused.len(), 1);
        assert!(reason(&refused[0].1).contains("finished without joining"));
    }
}
