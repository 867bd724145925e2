//! The row-wise optimizers ([`step`]): one pushed gradient applied to one
//! row and its state, as [`Optimizer`]'s doc writes them. Elementwise
//! arithmetic is float32 in the order written there; the row's mean of
//! `g²` is summed in float64 and rounded once, so a NumPy reference
//! (`python/tests/test_torch_embedding.py`) can follow it exactly.

use super::config::Optimizer;

/// The mean of `g²` over the row, summed in float64, as float32.
pub fn mean_square(g: &[f32]) -> f32 {
    let sum: f64 = g.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    (sum / g.len().max(1) as f64) as f32
}

/// The state of a new row (`state` of [`Optimizer::state_words`] words,
/// float32 values or, for Adam's step count, a `u32`).
pub fn init_state(opt: &Optimizer, state: &mut [u32]) {
    state.fill(0);
    if let Optimizer::AdaGrad {
        initial_accumulator,
        ..
    } = *opt
    {
        state[0] = initial_accumulator.to_bits();
    }
}

/// Applies gradient `g` to row `w` with its `state`.
pub fn step(opt: &Optimizer, w: &mut [f32], state: &mut [u32], g: &[f32]) {
    match *opt {
        Optimizer::Sgd { lr } => {
            for (w, &g) in w.iter_mut().zip(g) {
                *w -= lr * g;
            }
        }
        Optimizer::AdaGrad { lr, eps, .. } => {
            let acc = f32::from_bits(state[0]) + mean_square(g);
            state[0] = acc.to_bits();
            let s = lr / (acc.sqrt() + eps);
            for (w, &g) in w.iter_mut().zip(g) {
                *w -= s * g;
            }
        }
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => {
            let dim = w.len();
            let (m, rest) = state.split_at_mut(dim);
            let t = rest[1].saturating_add(1);
            rest[1] = t;
            let v = beta2 * f32::from_bits(rest[0]) + (1.0 - beta2) * mean_square(g);
            rest[0] = v.to_bits();
            let t = i32::try_from(t).unwrap_or(i32::MAX);
            let bc1 = (1.0 - f64::from(beta1).powi(t)) as f32;
            let bc2 = (1.0 - f64::from(beta2).powi(t)) as f32;
            let s = lr / (bc1 * ((v / bc2).sqrt() + eps));
            for ((w, m), &g) in w.iter_mut().zip(m.iter_mut()).zip(g) {
                let mi = beta1 * f32::from_bits(*m) + (1.0 - beta1) * g;
                *m = mi.to_bits();
                *w -= s * mi;
            }
        }
    }
}
