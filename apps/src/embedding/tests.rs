//! The store and its optimizers, without a cluster.

use super::*;

fn meta(cmd: i32, push: bool, pull: bool) -> KVMeta {
    KVMeta {
        cmd,
        push,
        pull,
        sender: 9,
        timestamp: 0,
        customer_id: 0,
        app_id: 0,
        priority: 0,
        compression: None,
        same_keys: None,
    }
}

fn config(name: &str, dim: u32, optimizer: Optimizer, init: Init) -> TableConfig {
    TableConfig {
        table: table_id(name),
        name: name.into(),
        dim,
        init,
        seed: 7,
        optimizer,
        expire_after: 0,
        admit_after: 0,
    }
}

const ADAGRAD: Optimizer = Optimizer::AdaGrad {
    lr: 0.1,
    eps: 1e-8,
    initial_accumulator: 0.0,
};

/// Tables with `c` configured through a request, as a worker does.
fn with(c: &TableConfig) -> Tables {
    let mut t = Tables::new();
    let words: Vec<f32> = c.to_words().into_iter().map(f32::from_bits).collect();
    let cmd = EMBEDDING | CONFIG | c.table as i32;
    let req = KVPairs::new(vec![0u64, 1 << 63], [words.clone(), words].concat());
    t.apply(&meta(cmd, true, false), &req).unwrap();
    t
}

fn pull(t: &mut Tables, table: u32, keys: &[u64]) -> Vec<f32> {
    let cmd = EMBEDDING | table as i32;
    let out = t
        .apply(
            &meta(cmd, false, true),
            &KVPairs::new(keys.to_vec(), Vec::new()),
        )
        .unwrap();
    out.vals.to_vec()
}

fn push(t: &mut Tables, table: u32, keys: &[u64], g: &[f32]) -> Result<(), Refusal> {
    let cmd = EMBEDDING | table as i32;
    t.apply(
        &meta(cmd, true, false),
        &KVPairs::new(keys.to_vec(), g.to_vec()),
    )
    .map(|_| ())
}

#[test]
fn keys_and_table_ids_are_the_ones_python_computes() {
    // python/pslite/_torch_embedding.py computes the same in NumPy
    // (test_torch_embedding.py checks these numbers too).
    assert_eq!(table_id("user"), 178_895_559);
    assert_eq!(key_of(table_id("user"), 0), 0xc6ac_7471_900e_ccf3);
    assert_eq!(key_of(table_id("user"), u64::MAX), 0xba04_9972_d3c8_ab45);
    assert_ne!(key_of(1, 5), key_of(2, 5));
}

#[test]
fn ids_come_back_from_their_keys() {
    for x in [0, 1, 5, u64::MAX, 1 << 63, 0x0123_4567_89ab_cdef] {
        assert_eq!(unmix(mix(x)), x);
        for table in [1, 7, table_id("user"), TABLE_MASK as u32] {
            assert_eq!(id_of(table, key_of(table, x)), x);
        }
    }
}

#[test]
fn an_initial_row_is_the_row_a_first_touch_makes() {
    let c = config("t", 6, ADAGRAD, Init::Normal { std: 0.3 });
    let mut t = with(&c);
    let keys = [key_of(c.table, 3), key_of(c.table, 9)];
    let mut sorted = keys;
    sorted.sort_unstable();
    let made = pull(&mut t, c.table, &sorted);
    for (i, &k) in sorted.iter().enumerate() {
        assert_eq!(initial_row(&c, k), made[i * 6..(i + 1) * 6]);
    }
}

#[test]
fn a_configuration_round_trips_and_bad_ones_are_refused() {
    let c = config(
        "item émb",
        33,
        Optimizer::Adam {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        Init::Normal { std: 0.5 },
    );
    assert_eq!(TableConfig::from_words(&c.to_words()).unwrap(), c);
    let mut w = c.to_words();
    w[0] = 9;
    assert!(TableConfig::from_words(&w)
        .unwrap_err()
        .contains("version 9"));
    let mut w = c.to_words();
    w[3] = 7;
    assert!(TableConfig::from_words(&w)
        .unwrap_err()
        .contains("unknown optimizer"));
    let mut w = c.to_words();
    w[2] = 0;
    assert!(TableConfig::from_words(&w).unwrap_err().contains("dim"));
    assert!(TableConfig::from_words(&w[..5]).is_err());
    let mut w = c.to_words();
    w[16] = 1000;
    assert!(TableConfig::from_words(&w).is_err());
}

#[test]
fn the_same_configuration_is_accepted_again_and_another_refused_naming_the_table() {
    let c = config("user", 4, ADAGRAD, Init::Zeros);
    let mut t = with(&c);
    assert!(t.configure(c.clone()).is_ok());
    let mut other = c.clone();
    other.dim = 8;
    let e = t.configure(other).unwrap_err();
    assert!(
        e.contains("\"user\"") && e.contains("dim 4") && e.contains("dim 8"),
        "{e}"
    );
    let mut clash = c.clone();
    clash.name = "item".into();
    let e = t.configure(clash).unwrap_err();
    assert!(e.contains("same id"), "{e}");
    // Through a request: refused with the reason.
    let words: Vec<f32> = {
        let mut c = c.clone();
        c.seed = 8;
        c.to_words().into_iter().map(f32::from_bits).collect()
    };
    let cmd = EMBEDDING | CONFIG | c.table as i32;
    let r = t.apply(&meta(cmd, true, false), &KVPairs::new(vec![0u64], words));
    assert!(matches!(r, Err(Refusal::Other { reason, .. }) if reason.contains("seed 8")));
}

#[test]
fn rows_are_made_on_first_touch_from_the_seed_and_key_only() {
    let keys: Vec<u64> = (0..2000u64).map(|i| key_of(3, i)).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    for (init, check) in [
        (Init::Zeros, (0.0, 0.0)),
        (
            Init::Uniform {
                low: -0.5,
                high: 1.5,
            },
            (0.5, (4.0f64 / 12.0).sqrt()),
        ),
        (Init::Normal { std: 0.2 }, (0.0, 0.2)),
    ] {
        let c = config("t", 5, ADAGRAD, init);
        let mut a = with(&c);
        let vals = pull(&mut a, c.table, &sorted);
        assert_eq!(a.table(c.table).unwrap().len(), sorted.len());
        let n = vals.len() as f64;
        let mean = vals.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = vals
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!((mean - check.0).abs() < 0.02, "{init}: mean {mean}");
        assert!(
            (var.sqrt() - check.1).abs() < 0.02,
            "{init}: std {}",
            var.sqrt()
        );
        if let Init::Uniform { low, high } = init {
            assert!(vals.iter().all(|&v| v >= low && v < high));
        }
        // Another server, touched in another order: the same rows.
        let mut b = with(&c);
        let mut rev = sorted.clone();
        rev.reverse();
        for k in rev.iter().step_by(7) {
            pull(&mut b, c.table, &[*k]);
        }
        assert_eq!(pull(&mut b, c.table, &sorted), vals);
        // Pulled again: unchanged, no new row.
        assert_eq!(pull(&mut a, c.table, &sorted), vals);
        assert_eq!(a.table(c.table).unwrap().len(), sorted.len());
    }
}

/// One step of each optimizer, written out in float64 where the store
/// rounds once, else float32.
fn reference(opt: Optimizer, w: &mut [f32], state: &mut [f32], t: &mut i32, g: &[f32]) {
    let ms = (g.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / g.len() as f64) as f32;
    match opt {
        Optimizer::Sgd { lr } => w.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g),
        Optimizer::AdaGrad { lr, eps, .. } => {
            state[0] += ms;
            let s = lr / (state[0].sqrt() + eps);
            w.iter_mut().zip(g).for_each(|(w, g)| *w -= s * g);
        }
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => {
            *t += 1;
            let v = &mut state[w.len()];
            *v = beta2 * *v + (1.0 - beta2) * ms;
            let bc1 = (1.0 - f64::from(beta1).powi(*t)) as f32;
            let bc2 = (1.0 - f64::from(beta2).powi(*t)) as f32;
            let s = lr / (bc1 * ((*v / bc2).sqrt() + eps));
            for i in 0..w.len() {
                state[i] = beta1 * state[i] + (1.0 - beta1) * g[i];
                w[i] -= s * state[i];
            }
        }
    }
}

#[test]
fn each_optimizer_follows_its_formula_over_several_steps() {
    let opts = [
        Optimizer::Sgd { lr: 0.5 },
        Optimizer::AdaGrad {
            lr: 0.3,
            eps: 1e-3,
            initial_accumulator: 0.25,
        },
        Optimizer::Adam {
            lr: 0.01,
            beta1: 0.8,
            beta2: 0.95,
            eps: 1e-6,
        },
    ];
    for opt in opts {
        let c = config(
            "opt",
            3,
            opt,
            Init::Uniform {
                low: -1.0,
                high: 1.0,
            },
        );
        let mut t = with(&c);
        let keys = [key_of(c.table, 1), key_of(c.table, 2)];
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        let mut w = pull(&mut t, c.table, &keys);
        let acc = if let Optimizer::AdaGrad {
            initial_accumulator,
            ..
        } = opt
        {
            initial_accumulator
        } else {
            0.0
        };
        let mut states = [vec![acc; 4], vec![acc; 4]];
        let mut steps = [0, 0];
        for step in 0..5 {
            let g: Vec<f32> = (0..6)
                .map(|i| ((i * 7 + step * 3) % 5) as f32 - 1.7)
                .collect();
            push(&mut t, c.table, &keys, &g).unwrap();
            for r in 0..2 {
                let (w, g) = (&mut w[r * 3..r * 3 + 3], &g[r * 3..r * 3 + 3]);
                reference(opt, w, &mut states[r], &mut steps[r], g);
            }
            assert_eq!(pull(&mut t, c.table, &keys), w, "{opt} step {step}");
        }
    }
}

#[test]
fn bad_requests_are_refused_and_apply_nothing() {
    let c = config("bad", 2, Optimizer::Sgd { lr: 1.0 }, Init::Zeros);
    let mut t = with(&c);
    let e = push(&mut t, c.table, &[1, 2], &[1.0; 3]).unwrap_err();
    assert!(e.to_string().contains("must send 4 values"), "{e}");
    assert!(t.table(c.table).unwrap().is_empty());
    let e = push(&mut t, 77, &[1], &[1.0; 2]).unwrap_err();
    assert!(e.to_string().contains("not configured"), "{e}");
    let cmd = EMBEDDING | CONFIG;
    assert!(t
        .apply(
            &meta(cmd, true, false),
            &KVPairs::new(vec![1u64], vec![0.0])
        )
        .is_err());
}

#[test]
fn a_copy_of_a_range_restores_exactly_and_only_that_range() {
    let c = config("copy", 4, ADAGRAD, Init::Normal { std: 1.0 });
    let mut a = with(&c);
    let mut keys: Vec<u64> = (0..500u64).map(|i| key_of(c.table, i)).collect();
    keys.sort_unstable();
    push(&mut a, c.table, &keys, &vec![0.5; keys.len() * 4]).unwrap();
    let want = pull(&mut a, c.table, &keys);
    let half = 1u64 << 63;
    let (lo, hi) = (a.snapshot(0, half), a.snapshot(half, u64::MAX));
    // A fresh server restores both ranges: every row and its state.
    let mut b = Tables::new();
    b.restore(0, half, &lo).unwrap();
    b.restore(half, u64::MAX, &hi).unwrap();
    assert_eq!(b.table(c.table).unwrap().len(), keys.len());
    assert_eq!(pull(&mut b, c.table, &keys), want);
    push(&mut a, c.table, &keys, &vec![0.25; keys.len() * 4]).unwrap();
    push(&mut b, c.table, &keys, &vec![0.25; keys.len() * 4]).unwrap();
    assert_eq!(pull(&mut b, c.table, &keys), pull(&mut a, c.table, &keys));
    // Restoring one range replaces it and keeps the other.
    let mut e = with(&c);
    e.restore(0, half, &lo).unwrap();
    let below = keys.iter().filter(|&&k| k < half).count();
    assert_eq!(e.table(c.table).unwrap().len(), below);
    // Damaged or conflicting copies change nothing.
    let before = b.snapshot(0, u64::MAX);
    assert!(b.restore(0, half, &lo[..lo.len() - 3]).is_err());
    assert!(b.restore(0, half, &hi).unwrap_err().contains("outside"));
    let mut other = c.clone();
    other.dim = 5;
    let mut conflicting = with(&other);
    pull(&mut conflicting, other.table, &[1]);
    let e = b
        .restore(0, half, &conflicting.snapshot(0, half))
        .unwrap_err();
    assert!(e.contains("\"copy\""), "{e}");
    assert_eq!(b.snapshot(0, u64::MAX), before);
}

#[test]
fn a_row_costs_its_bytes_plus_the_key_state_and_a_compact_index() {
    // dim 16, row-wise AdaGrad: 64 bytes of values, 4 of state, 8 of key.
    let c = config("mem", 16, ADAGRAD, Init::Zeros);
    let mut t = with(&c);
    let n = 200_000u64;
    let mut keys: Vec<u64> = (0..n).map(|i| key_of(c.table, i)).collect();
    keys.sort_unstable();
    for part in keys.chunks(10_000) {
        pull(&mut t, c.table, part);
    }
    let table = t.table(c.table).unwrap();
    assert_eq!(table.len(), n as usize);
    let per_row = table.bytes() as f64 / n as f64;
    let used = table.used_bytes() as f64 / n as f64;
    let target = 1.2 * 64.0 + 16.0;
    assert!(per_row <= target, "{per_row} bytes a row (target {target})");
    assert!(used <= per_row);
    let stats = t.stats();
    assert_eq!(stats[0], 1);
    assert_eq!(u64::from(stats[1]) | (u64::from(stats[2]) << 32), n);
    // Every key is found after the index grew many times.
    for &k in keys.iter().step_by(997) {
        assert!(table.find(k).is_some());
    }
    assert!(table.find(key_of(c.table, n + 1)).is_none());
}

/// Tables of a job of `workers` workers whose servers' key ranges start
/// at `begins`, with `c` configured.
fn job_with(c: &TableConfig, workers: usize, begins: Vec<u64>) -> Tables {
    let mut t = Tables::for_job(workers, begins);
    t.configure(c.clone()).unwrap();
    t
}

fn stat(t: &Tables, i: usize) -> u64 {
    let s = t.stats();
    u64::from(s[1 + 2 * i]) | (u64::from(s[2 + 2 * i]) << 32)
}
const EXPIRED: usize = 4;
const ADMITTED: usize = 5;
const CANDIDATES: usize = 6;
const DROPPED: usize = 7;

fn initial(c: &TableConfig, key: u64) -> Vec<f32> {
    let mut out = vec![0.0; c.dim as usize];
    Table::new(c.clone()).initial_values(key, &mut out);
    out
}

#[test]
fn expiry_and_admission_round_trip_in_the_configuration_and_bad_values_are_refused() {
    let mut c = config("life", 3, ADAGRAD, Init::Zeros);
    c.expire_after = 100;
    c.admit_after = 5;
    assert_eq!(TableConfig::from_words(&c.to_words()).unwrap(), c);
    // A version 1 record (an older checkpoint's): neither.
    let mut v1 = c.to_words();
    v1.drain(14..16);
    v1[0] = 1;
    let old = TableConfig::from_words(&v1).unwrap();
    assert_eq!((old.expire_after, old.admit_after), (0, 0));
    assert_eq!(old.name, "life");
    for (expire, admit, says) in [
        (MAX_EXPIRE_AFTER + 1, 0, "expire_after"),
        (0, MAX_ADMIT_AFTER + 1, "admit_after"),
    ] {
        let mut bad = c.clone();
        (bad.expire_after, bad.admit_after) = (expire, admit);
        let mut w = bad.to_words();
        assert!(TableConfig::from_words(&w).unwrap_err().contains(says));
        w[14] = 0;
        w[15] = 0;
        assert!(TableConfig::from_words(&w).is_ok());
    }
    // Workers that disagree: refused, naming the setting.
    let mut t = with(&c);
    let mut other = c.clone();
    other.expire_after = 7;
    let e = t.configure(other).unwrap_err();
    assert!(
        e.contains("expire_after 100") && e.contains("expire_after 7"),
        "{e}"
    );
}

#[test]
fn rows_untouched_for_n_steps_expire_and_come_back_as_new_rows() {
    // 2 workers, expire_after 3: a row expires after 6 pushes without it.
    let mut c = config(
        "exp",
        2,
        Optimizer::Sgd { lr: 1.0 },
        Init::Uniform {
            low: -1.0,
            high: 1.0,
        },
    );
    c.expire_after = 3;
    let mut t = job_with(&c, 2, vec![0]);
    let (a, b, e) = (key_of(c.table, 1), key_of(c.table, 2), key_of(c.table, 3));
    let one = [1.0f32, 1.0];
    // A pull makes no row (pulls are not replicated): it answers the
    // initial row.
    assert_eq!(pull(&mut t, c.table, &[b]), initial(&c, b));
    assert_eq!(t.table(c.table).unwrap().len(), 0);
    push(&mut t, c.table, &[b], &one).unwrap(); // push 1: b's last
    push(&mut t, c.table, &[e], &one).unwrap(); // push 2: e's last
    let trained: Vec<f32> = initial(&c, b).iter().map(|v| v - 1.0).collect();
    for _ in 0..4 {
        push(&mut t, c.table, &[a], &one).unwrap(); // pushes 3..=6
    }
    // 5 pushes without b: still held.
    assert_eq!(pull(&mut t, c.table, &[b]), trained);
    // e, pushed at 2 then at 8 (5 pushes without it, 3..=7): kept.
    push(&mut t, c.table, &[a], &one).unwrap(); // push 7: b expires
    assert_eq!(pull(&mut t, c.table, &[b]), initial(&c, b));
    push(&mut t, c.table, &[e], &one).unwrap(); // push 8
    let e_trained: Vec<f32> = initial(&c, e).iter().map(|v| v - 2.0).collect();
    assert_eq!(pull(&mut t, c.table, &[e]), e_trained);
    // The sweep (every 3 pushes) removed b: its memory is reused.
    push(&mut t, c.table, &[a], &one).unwrap(); // push 9
    assert_eq!(t.table(c.table).unwrap().len(), 2);
    assert_eq!(stat(&t, EXPIRED), 1);
    // Pushed again: a new row from the initializer, this push applied.
    push(&mut t, c.table, &[b], &[0.5, 0.5]).unwrap();
    let fresh: Vec<f32> = initial(&c, b).iter().map(|v| v - 0.5).collect();
    assert_eq!(pull(&mut t, c.table, &[b]), fresh);
    // An expired row pushed before a sweep removed it is made anew too
    // (e: last pushed at 8, expired from clock 14, swept at 15).
    for _ in 0..4 {
        push(&mut t, c.table, &[a], &one).unwrap();
    }
    push(&mut t, c.table, &[e], &one).unwrap();
    let e_fresh: Vec<f32> = initial(&c, e).iter().map(|v| v - 1.0).collect();
    assert_eq!(pull(&mut t, c.table, &[e]), e_fresh);
    assert_eq!(stat(&t, EXPIRED), 2);
}

#[test]
fn expired_rows_give_their_memory_to_new_ones() {
    let mut c = config("reuse", 8, ADAGRAD, Init::Zeros);
    c.expire_after = 2;
    let mut t = job_with(&c, 1, vec![0]);
    let mut most = 0;
    for epoch in 0..20u64 {
        // Each step pushes 5 000 ids never seen before.
        let mut keys: Vec<u64> = (0..5000)
            .map(|i| key_of(c.table, epoch * 5000 + i))
            .collect();
        keys.sort_unstable();
        push(&mut t, c.table, &keys, &vec![0.1; keys.len() * 8]).unwrap();
        most = most.max(t.table(c.table).unwrap().bytes());
    }
    let table = t.table(c.table).unwrap();
    assert!(table.len() <= 10_000, "{} rows held", table.len());
    assert!(stat(&t, EXPIRED) >= 80_000, "{}", stat(&t, EXPIRED));
    // Never more than 4 steps' rows of memory (chunks and index).
    let row = table.stride() * 4;
    assert!(
        most <= 4 * 5000 * row + 8 * 4 * 5000,
        "{most} bytes at most"
    );
}

#[test]
fn ids_get_a_row_at_their_kth_push_and_answer_zeros_before() {
    let mut c = config(
        "adm",
        2,
        Optimizer::Sgd { lr: 1.0 },
        Init::Uniform {
            low: -1.0,
            high: 1.0,
        },
    );
    c.admit_after = 3;
    let mut t = job_with(&c, 1, vec![0]);
    let (x, y) = (key_of(c.table, 10), key_of(c.table, 11));
    for n in 1..=2 {
        push(&mut t, c.table, &[x, y], &[1.0, 1.0, 9.0, 9.0]).unwrap();
        assert_eq!(
            pull(&mut t, c.table, &[x]),
            vec![0.0, 0.0],
            "after {n} pushes"
        );
    }
    assert_eq!(t.table(c.table).unwrap().len(), 0);
    assert_eq!((stat(&t, CANDIDATES), stat(&t, DROPPED)), (2, 4));
    // Pulls do not count.
    pull(&mut t, c.table, &[x, y]);
    push(&mut t, c.table, &[x], &[0.5, 0.5]).unwrap();
    let admitted: Vec<f32> = initial(&c, x).iter().map(|v| v - 0.5).collect();
    assert_eq!(pull(&mut t, c.table, &[x]), admitted);
    assert_eq!(pull(&mut t, c.table, &[y]), vec![0.0, 0.0]);
    assert_eq!((stat(&t, ADMITTED), stat(&t, CANDIDATES)), (1, 1));
    // Admitted: every later push applies.
    push(&mut t, c.table, &[x], &[0.5, 0.5]).unwrap();
    let twice: Vec<f32> = admitted.iter().map(|v| v - 0.5).collect();
    assert_eq!(pull(&mut t, c.table, &[x]), twice);
}

#[test]
fn expired_rows_must_be_admitted_again_and_old_candidates_are_forgotten() {
    let mut c = config("both", 1, Optimizer::Sgd { lr: 1.0 }, Init::Zeros);
    (c.expire_after, c.admit_after) = (4, 2);
    let mut t = job_with(&c, 1, vec![0]);
    let (x, y, z) = (key_of(c.table, 1), key_of(c.table, 2), key_of(c.table, 3));
    push(&mut t, c.table, &[x, y], &[1.0, 1.0]).unwrap(); // 1: counted
    push(&mut t, c.table, &[x], &[1.0]).unwrap(); // 2: admitted
    assert_eq!(pull(&mut t, c.table, &[x]), vec![-1.0]);
    for _ in 0..4 {
        push(&mut t, c.table, &[z], &[0.0]).unwrap(); // 3..=6
    }
    // x expired (4 pushes without it), y's count forgotten.
    assert_eq!(pull(&mut t, c.table, &[x]), vec![0.0]);
    push(&mut t, c.table, &[x, y], &[1.0, 1.0]).unwrap();
    assert_eq!(pull(&mut t, c.table, &[x, y]), vec![0.0, 0.0]);
    push(&mut t, c.table, &[x, y], &[2.0, 2.0]).unwrap();
    assert_eq!(pull(&mut t, c.table, &[x, y]), vec![-2.0, -2.0]);
}

/// The replicas of a range apply its pushes in order, among other ranges'
/// pushes that differ from server to server: every decision is the same.
#[test]
fn replicas_holding_other_ranges_decide_alike_and_copies_carry_the_state() {
    let mut c = config("rep", 2, ADAGRAD, Init::Normal { std: 0.1 });
    (c.expire_after, c.admit_after) = (3, 2);
    let half = 1u64 << 63;
    // `a` holds both ranges (primary of one, backup of the other), `b`
    // only the upper one.
    let mut a = job_with(&c, 2, vec![0, half]);
    let mut b = job_with(&c, 2, vec![0, half]);
    let mut rng = 0x1234_5678u64;
    let mut upper_keys = Vec::new();
    for step in 0..400 {
        rng = mix(rng);
        let mut keys: Vec<u64> = (0..6)
            .map(|i| key_of(c.table, (rng >> (8 * i)) % 40))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let (lo, hi): (Vec<u64>, Vec<u64>) = keys.iter().partition(|&&k| k < half);
        let g = |n: usize| vec![0.25 + step as f32 * 1e-3; n * 2];
        if !lo.is_empty() && step % 3 != 0 {
            push(&mut a, c.table, &lo, &g(lo.len())).unwrap();
        }
        if !hi.is_empty() {
            push(&mut a, c.table, &hi, &g(hi.len())).unwrap();
            push(&mut b, c.table, &hi, &g(hi.len())).unwrap();
            upper_keys.extend(hi);
        }
    }
    upper_keys.sort_unstable();
    upper_keys.dedup();
    assert_eq!(
        pull(&mut a, c.table, &upper_keys),
        pull(&mut b, c.table, &upper_keys)
    );
    assert!(stat(&a, EXPIRED) > 0 && stat(&a, ADMITTED) > 0);
    // A copy of the upper range, restored on a third server, goes on alike.
    let mut d = job_with(&c, 2, vec![0, half]);
    d.restore(half, u64::MAX, &a.snapshot(half, u64::MAX))
        .unwrap();
    for step in 0..50 {
        let keys: Vec<u64> = upper_keys
            .iter()
            .copied()
            .skip(step % 5)
            .step_by(4)
            .collect();
        let g = vec![0.5; keys.len() * 2];
        push(&mut b, c.table, &keys, &g).unwrap();
        push(&mut d, c.table, &keys, &g).unwrap();
        assert_eq!(
            pull(&mut b, c.table, &upper_keys),
            pull(&mut d, c.table, &upper_keys)
        );
    }
}

#[test]
fn a_copy_leaves_expired_rows_out() {
    // 1 worker, expire_after 4: a row expires after 4 pushes without it;
    // the sweep runs every 2 pushes, so copy right after the expiring push.
    let mut c = config("gone", 2, Optimizer::Sgd { lr: 1.0 }, Init::Zeros);
    c.expire_after = 4;
    let mut t = job_with(&c, 1, vec![0]);
    let (a, b) = (key_of(c.table, 1), key_of(c.table, 2));
    push(&mut t, c.table, &[b], &[1.0, 1.0]).unwrap(); // push 1: b's last
    for _ in 0..4 {
        push(&mut t, c.table, &[a], &[1.0, 1.0]).unwrap(); // pushes 2..=5
    }
    // b expired at push 5; the sweep (every 2 pushes) has not removed it.
    assert_eq!(t.table(c.table).unwrap().len(), 2, "held until a sweep");
    let copy = super::decode_copy(&t.snapshot(0, u64::MAX)).unwrap();
    let keys: Vec<u64> = copy[0]
        .1
        .chunks_exact(copy[0].0.stride())
        .map(|row| u64::from(row[0]) | (u64::from(row[1]) << 32))
        .collect();
    assert_eq!(keys, vec![a], "only the live row is copied");
}
