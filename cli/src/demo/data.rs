//! The demo's synthetic data set: sparse binary samples labelled by hidden
//! true weights, generated deterministically from a seed.
//!
//! Sample `i` is a function of `(seed, i)` alone, so every worker generates
//! just its own shard and the held-out split without reading files or
//! talking to anyone, and all workers agree on every sample.
//!
//! - Feature ids follow a power law over `0..features`: id `j` is drawn with
//!   probability proportional to `1 / (HEAD + j)`, like the words or ad ids
//!   of real sparse data. With a million features, half of all occurrences
//!   fall on the first 10 000 ids and most ids are seen only a few times.
//! - Feature `j` has a hidden true weight drawn from
//!   `N(0, (WEIGHT_SCALE / (WEIGHT_SCALE + j))²)`: every feature matters,
//!   frequent ones most.
//! - A sample has `nnz` distinct features, each with value 1; its label is 1
//!   when the sum of their true weights is positive, flipped with
//!   probability `label_noise`. So no model beats `1 - label_noise`.
//! - The last `test_fraction` of the samples are held out for testing.
//!
//! Features travel as keys `mix64(id)`: a bijection of `u64` that spreads
//! the ids evenly over the servers' key ranges (ps-lite splits the key space
//! `0..2^64` into equal ranges, so raw small ids would all land on server 0).

/// Offset of the feature ids' power law: id `j` has probability
/// proportional to `1 / (HEAD + j)`.
pub const HEAD: f64 = 100.0;

/// Feature `j`'s true weight has standard deviation
/// `WEIGHT_SCALE / (WEIGHT_SCALE + j)`.
pub const WEIGHT_SCALE: f64 = 1000.0;

/// SplitMix64's finalizer: a bijection of `u64` that mixes every input bit
/// into every output bit.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A small deterministic random generator (SplitMix64): the same seed gives
/// the same numbers on every machine and every version of this program.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(mix64(seed ^ 0x5851_f42d_4c95_7f2d))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.uniform(); // in (0, 1]
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// What data set to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct DataSpec {
    /// Samples in total, training and test.
    pub samples: usize,
    /// Feature ids are `0..features` (at least 1).
    pub features: u64,
    /// Non-zero features per sample.
    pub nnz: usize,
    /// Probability that a label is flipped.
    pub label_noise: f64,
    /// Fraction of the samples, at the end, held out for testing.
    pub test_fraction: f64,
    /// The seed of everything.
    pub seed: u64,
}

/// One sample: its feature keys (sorted, unique; each feature has value 1)
/// and its label.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Keys of the non-zero features, ascending.
    pub keys: Vec<u64>,
    /// The label.
    pub label: bool,
}

impl DataSpec {
    /// The number of training samples: the first ones; the rest are held out.
    pub fn train_len(&self) -> usize {
        let test = (self.samples as f64 * self.test_fraction).round() as usize;
        self.samples - test.min(self.samples)
    }

    /// The key of feature `id`.
    pub fn key(id: u64) -> u64 {
        mix64(id)
    }

    /// The hidden true weight of feature `id`.
    pub fn true_weight(&self, id: u64) -> f64 {
        let scale = WEIGHT_SCALE / (WEIGHT_SCALE + id as f64);
        scale * Rng::new(mix64(self.seed ^ 0x7f4a_7c15_9e37_79b9).wrapping_add(id)).normal()
    }

    /// A random feature id: log-uniform over `HEAD + id`, a power law.
    fn feature_id(&self, rng: &mut Rng) -> u64 {
        let f = self.features as f64;
        let id = HEAD * ((1.0 + f / HEAD).powf(rng.uniform()) - 1.0);
        (id as u64).min(self.features.saturating_sub(1))
    }

    /// Sample number `index` (`0..samples`).
    pub fn sample(&self, index: usize) -> Sample {
        let mut rng = Rng::new(mix64(self.seed).wrapping_add(index as u64));
        let nnz = self.nnz.min(self.features as usize).max(1);
        let mut ids = Vec::with_capacity(nnz);
        for _ in 0..64 * nnz {
            let id = self.feature_id(&mut rng);
            if !ids.contains(&id) {
                ids.push(id);
                if ids.len() == nnz {
                    break;
                }
            }
        }
        // Only when nnz is close to the number of features: fill up with
        // the most frequent ids not drawn.
        let mut next = 0;
        while ids.len() < nnz {
            if !ids.contains(&next) {
                ids.push(next);
            }
            next += 1;
        }
        let margin: f64 = ids.iter().map(|&id| self.true_weight(id)).sum();
        let flip = rng.uniform() < self.label_noise;
        let mut keys: Vec<u64> = ids.into_iter().map(DataSpec::key).collect();
        keys.sort_unstable();
        Sample {
            keys,
            label: (margin > 0.0) != flip,
        }
    }

    /// The training samples of worker `rank` of `workers`: a contiguous
    /// block of the training split.
    pub fn shard(&self, rank: usize, workers: usize) -> Vec<Sample> {
        let train = self.train_len();
        let workers = workers.max(1);
        let begin = train * rank / workers;
        let end = train * (rank + 1) / workers;
        (begin..end).map(|i| self.sample(i)).collect()
    }

    /// The held-out samples.
    pub fn test_set(&self) -> Vec<Sample> {
        (self.train_len()..self.samples)
            .map(|i| self.sample(i))
            .collect()
    }
}

/// The sorted, unique keys of `samples`.
pub fn unique_keys(samples: &[Sample]) -> Vec<u64> {
    let mut keys: Vec<u64> = samples
        .iter()
        .flat_map(|s| s.keys.iter().copied())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seed: u64) -> DataSpec {
        DataSpec {
            samples: 2_000,
            features: 10_000,
            nnz: 20,
            label_noise: 0.05,
            test_fraction: 0.1,
            seed,
        }
    }

    #[test]
    fn samples_are_a_function_of_the_seed_and_index() {
        let a = spec(1);
        assert_eq!(a.sample(17), a.sample(17));
        assert_eq!(a.sample(17), a.clone().sample(17));
        assert_ne!(a.sample(17), a.sample(18));
        assert_ne!(a.sample(17), spec(2).sample(17));
        // Pinned: the data set must not change between versions.
        let first = spec(1).sample(0);
        let positive = (0..100).filter(|&i| spec(1).sample(i).label).count();
        assert_eq!(
            (first.keys[0], first.label, positive),
            (0x05dc_5a10_bf25_ffcd, true, 46)
        );
    }

    #[test]
    fn samples_have_nnz_sorted_unique_keys_and_mixed_labels() {
        let spec = spec(3);
        let samples: Vec<Sample> = (0..spec.samples).map(|i| spec.sample(i)).collect();
        for s in &samples {
            assert_eq!(s.keys.len(), spec.nnz);
            assert!(s.keys.windows(2).all(|w| w[0] < w[1]));
        }
        let positive = samples.iter().filter(|s| s.label).count() as f64 / samples.len() as f64;
        assert!((0.3..0.7).contains(&positive), "{positive}");
    }

    #[test]
    fn shards_partition_the_training_split() {
        let spec = spec(4);
        assert_eq!(spec.train_len(), 1_800);
        for workers in [1, 2, 3, 7] {
            let all: Vec<Sample> = (0..workers).flat_map(|r| spec.shard(r, workers)).collect();
            let expected: Vec<Sample> = (0..spec.train_len()).map(|i| spec.sample(i)).collect();
            assert_eq!(all, expected, "{workers} workers");
        }
        assert_eq!(spec.test_set().len(), 200);
        assert_eq!(spec.test_set()[0], spec.sample(1_800));
    }

    #[test]
    fn few_features_still_give_nnz_distinct_ones() {
        let spec = DataSpec {
            features: 5,
            nnz: 5,
            ..spec(5)
        };
        let s = spec.sample(0);
        let mut expected: Vec<u64> = (0..5).map(DataSpec::key).collect();
        expected.sort_unstable();
        assert_eq!(s.keys, expected);
    }

    #[test]
    fn keys_spread_over_the_key_space() {
        // Half of the first 1000 feature ids land in each half of the keys.
        let high = (0..1000u64)
            .filter(|&id| DataSpec::key(id) >= u64::MAX / 2)
            .count();
        assert!((400..600).contains(&high), "{high}");
        assert_eq!(
            unique_keys(&[spec(1).sample(0), spec(1).sample(0)]).len(),
            20
        );
    }
}
