//! The demo's model: sparse logistic regression, its minibatch gradient on
//! the workers, and the SGD or AdaGrad update the servers apply per key.
//!
//! A sample with feature keys `K` has margin `m = Σ_{k∈K} w_k` and predicted
//! probability `p = σ(m)`; its log loss is `-log p` for label 1 and
//! `-log(1 - p)` for label 0. The gradient of a minibatch's mean loss is,
//! for each key `k` in the minibatch, `Σ_i (p_i - y_i) / B` over the `B`
//! samples `i` that contain `k`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::data::Sample;

/// How the servers turn a pushed gradient `g` into a weight update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Optimizer {
    /// Plain SGD: `w -= lr * g`.
    Sgd,
    /// AdaGrad: `n += g²; w -= lr * g / (√n + ε)`, a step size per key.
    Adagrad,
}

impl Optimizer {
    /// The learning rate the demo uses unless told otherwise.
    pub fn default_learning_rate(self) -> f32 {
        match self {
            Optimizer::Sgd => 20.0,
            Optimizer::Adagrad => 0.03,
        }
    }

    /// The name for people.
    pub fn title(self) -> &'static str {
        match self {
            Optimizer::Sgd => "SGD",
            Optimizer::Adagrad => "AdaGrad",
        }
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Adagrad => "adagrad",
        }
    }
}

/// Hashes a key by using it as is: the demo's keys are already mixed.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// One key's state on a server.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Slot {
    weight: f32,
    /// AdaGrad's sum of squared gradients.
    sum_sq: f32,
}

/// A server's weights: one slot per key it has seen, with the optimizer's
/// state. Keys never pushed read as weight 0.
pub struct Store {
    optimizer: Optimizer,
    learning_rate: f32,
    slots: HashMap<u64, Slot, BuildHasherDefault<KeyHasher>>,
}

impl Store {
    /// An empty store updating with `optimizer` at `learning_rate`.
    pub fn new(optimizer: Optimizer, learning_rate: f32) -> Store {
        Store {
            optimizer,
            learning_rate,
            slots: HashMap::default(),
        }
    }

    /// Applies the gradient `grads[i]` of `keys[i]` for every `i`.
    pub fn push(&mut self, keys: &[u64], grads: &[f32]) {
        let lr = self.learning_rate;
        for (&key, &g) in keys.iter().zip(grads) {
            if !g.is_finite() {
                continue;
            }
            let slot = self.slots.entry(key).or_default();
            match self.optimizer {
                Optimizer::Sgd => slot.weight -= lr * g,
                Optimizer::Adagrad => {
                    slot.sum_sq += g * g;
                    slot.weight -= lr * g / (slot.sum_sq.sqrt() + 1e-6);
                }
            }
        }
    }

    /// The weights of `keys`, in order.
    pub fn pull(&self, keys: &[u64]) -> Vec<f32> {
        keys.iter()
            .map(|k| self.slots.get(k).map_or(0.0, |s| s.weight))
            .collect()
    }

    /// The state of keys `[begin, end)`: per key, the key (`u64`), its
    /// weight and AdaGrad sum (`f32` each), little-endian (checkpoints).
    pub fn snapshot(&self, begin: u64, end: u64) -> Vec<u8> {
        let mut keys: Vec<u64> = self
            .slots
            .keys()
            .copied()
            .filter(|&k| k >= begin && k < end)
            .collect();
        keys.sort_unstable();
        let mut out = Vec::with_capacity(keys.len() * 16);
        for k in keys {
            let slot = self.slots[&k];
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&slot.weight.to_le_bytes());
            out.extend_from_slice(&slot.sum_sq.to_le_bytes());
        }
        out
    }

    /// Replaces the state of keys `[begin, end)` by `data` (from
    /// [`Store::snapshot`]); on an error nothing changes.
    pub fn restore(&mut self, begin: u64, end: u64, data: &[u8]) -> Result<(), String> {
        if data.len() % 16 != 0 {
            return Err(format!(
                "{} bytes is not a whole number of entries",
                data.len()
            ));
        }
        let mut parsed = Vec::with_capacity(data.len() / 16);
        for entry in data.chunks_exact(16) {
            let word = |at: usize| <[u8; 4]>::try_from(&entry[at..at + 4]).unwrap_or_default();
            let key = u64::from_le_bytes(<[u8; 8]>::try_from(&entry[..8]).unwrap_or_default());
            if key < begin || key >= end {
                return Err(format!("key {key} is outside {begin}..{end}"));
            }
            let slot = Slot {
                weight: f32::from_le_bytes(word(8)),
                sum_sq: f32::from_le_bytes(word(12)),
            };
            parsed.push((key, slot));
        }
        self.slots.retain(|&k, _| k < begin || k >= end);
        self.slots.extend(parsed);
        Ok(())
    }

    /// How many keys have a weight.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no key has a weight yet.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// Log loss of a sample with margin `m` (numerically stable).
pub fn log_loss(margin: f64, label: bool) -> f64 {
    let z = if label { -margin } else { margin };
    // softplus(z) = ln(1 + e^z)
    z.max(0.0) + (-z.abs()).exp().ln_1p()
}

/// The logistic function.
pub fn sigmoid(m: f64) -> f64 {
    1.0 / (1.0 + (-m).exp())
}

/// Margin of `sample` given the weights `weights[i]` of the sorted `keys`.
/// Keys missing from `keys` count as weight 0.
fn margin(sample: &Sample, keys: &[u64], weights: &[f32]) -> f64 {
    sample
        .keys
        .iter()
        .filter_map(|k| keys.binary_search(k).ok())
        .map(|i| f64::from(weights.get(i).copied().unwrap_or(0.0)))
        .sum()
}

/// The gradient of the mean log loss of `samples` with respect to the
/// weights of `keys` (sorted; they hold every key of the samples), given
/// those weights; also the samples' summed loss.
pub fn gradient(samples: &[Sample], keys: &[u64], weights: &[f32]) -> (Vec<f32>, f64) {
    let mut grad = vec![0.0f32; keys.len()];
    let mut loss = 0.0;
    let scale = 1.0 / samples.len().max(1) as f64;
    for s in samples {
        let m = margin(s, keys, weights);
        loss += log_loss(m, s.label);
        let residual = ((sigmoid(m) - if s.label { 1.0 } else { 0.0 }) * scale) as f32;
        for k in &s.keys {
            if let Ok(i) = keys.binary_search(k) {
                grad[i] += residual;
            }
        }
    }
    (grad, loss)
}

/// Mean log loss and accuracy of a model on some samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Mean log loss.
    pub loss: f64,
    /// Fraction of samples whose label is predicted right (p > 0.5).
    pub accuracy: f64,
}

/// Evaluates the weights `weights[i]` of the sorted `keys` on `samples`.
pub fn evaluate(samples: &[Sample], keys: &[u64], weights: &[f32]) -> Metrics {
    let mut loss = 0.0;
    let mut right = 0usize;
    for s in samples {
        let m = margin(s, keys, weights);
        loss += log_loss(m, s.label);
        if (m > 0.0) == s.label {
            right += 1;
        }
    }
    let n = samples.len().max(1) as f64;
    Metrics {
        loss: loss / n,
        accuracy: right as f64 / n,
    }
}

#[cfg(test)]
mod tests {
    use super::super::data::{unique_keys, DataSpec};
    use super::*;

    fn sample(keys: &[u64], label: bool) -> Sample {
        Sample {
            keys: keys.to_vec(),
            label,
        }
    }

    #[test]
    fn log_loss_and_sigmoid() {
        assert!((log_loss(0.0, true) - 2f64.ln()).abs() < 1e-12);
        assert!((log_loss(3.0, true) - (1.0 / sigmoid(3.0)).ln()).abs() < 1e-12);
        assert!((log_loss(3.0, false) - (1.0 / (1.0 - sigmoid(3.0))).ln()).abs() < 1e-12);
        assert!(log_loss(-1000.0, true).is_finite());
        assert!((log_loss(-1000.0, true) - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let samples = [
            sample(&[1, 5, 9], true),
            sample(&[5, 7], false),
            sample(&[1, 7, 9], false),
        ];
        let keys = unique_keys(&samples);
        assert_eq!(keys, [1, 5, 7, 9]);
        let weights = [0.3f32, -0.2, 0.5, 0.1];
        let (grad, loss) = gradient(&samples, &keys, &weights);
        let mean_loss = |w: &[f32]| evaluate(&samples, &keys, w).loss;
        assert!((loss / 3.0 - mean_loss(&weights)).abs() < 1e-9);
        for i in 0..keys.len() {
            let h = 1e-3f32;
            let mut plus = weights;
            plus[i] += h;
            let mut minus = weights;
            minus[i] -= h;
            let numeric = (mean_loss(&plus) - mean_loss(&minus)) / (2.0 * f64::from(h));
            assert!(
                (numeric - f64::from(grad[i])).abs() < 1e-4,
                "key {}: numeric {numeric} analytic {}",
                keys[i],
                grad[i]
            );
        }
    }

    #[test]
    fn the_store_applies_sgd_and_adagrad() {
        let mut sgd = Store::new(Optimizer::Sgd, 0.5);
        assert!(sgd.is_empty());
        sgd.push(&[3, 8], &[1.0, -2.0]);
        sgd.push(&[3], &[1.0]);
        assert_eq!(sgd.pull(&[3, 4, 8]), [-1.0, 0.0, 1.0]);
        assert_eq!(sgd.len(), 2);

        let mut ada = Store::new(Optimizer::Adagrad, 0.1);
        ada.push(&[3], &[2.0]); // n = 4: step 0.1 * 2 / 2
        ada.push(&[3], &[0.0]);
        let w = ada.pull(&[3])[0];
        assert!((w + 0.1).abs() < 1e-6, "{w}");
        ada.push(&[3], &[f32::NAN]); // ignored
        assert!((ada.pull(&[3])[0] + 0.1).abs() < 1e-6);
    }

    /// Trains in-process exactly as the workers and servers do, without the
    /// network: the loss on held-out data must fall and accuracy rise.
    #[test]
    fn training_a_tiny_problem_learns() {
        let spec = DataSpec {
            samples: 4_000,
            features: 2_000,
            nnz: 10,
            label_noise: 0.0,
            test_fraction: 0.25,
            seed: 9,
        };
        let train = spec.shard(0, 1);
        let test = spec.test_set();
        let test_keys = unique_keys(&test);
        for optimizer in [Optimizer::Sgd, Optimizer::Adagrad] {
            let mut store = Store::new(optimizer, optimizer.default_learning_rate());
            let before = evaluate(&test, &test_keys, &store.pull(&test_keys));
            let mut epoch_losses = Vec::new();
            for _ in 0..3 {
                let mut loss = 0.0;
                for batch in train.chunks(100) {
                    let keys = unique_keys(batch);
                    let (grad, l) = gradient(batch, &keys, &store.pull(&keys));
                    loss += l;
                    store.push(&keys, &grad);
                }
                epoch_losses.push(loss / train.len() as f64);
            }
            let after = evaluate(&test, &test_keys, &store.pull(&test_keys));
            assert!(
                epoch_losses.windows(2).all(|w| w[1] < w[0]),
                "{optimizer:?}: training loss {epoch_losses:?}"
            );
            assert!(
                after.loss < before.loss,
                "{optimizer:?}: {before:?} -> {after:?}"
            );
            assert!(
                after.accuracy > 0.75,
                "{optimizer:?}: {before:?} -> {after:?}"
            );
        }
    }
}
