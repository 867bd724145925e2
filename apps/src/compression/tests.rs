//! The compressors and error feedback as pure code: round trips, the
//! feedback's sums, the message transforms, and hostile input.

use proptest::prelude::*;
use pslite_proto::compression::{CompressionKind, CompressionMsg};
use pslite_proto::{DataType, Message};

use super::*;
use crate::kv_pairs::KVPairs;
use crate::sarray::SArray;

fn gradient() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-100.0f32..100.0, MIN_VALUES..400)
}

fn kinds() -> Vec<Compression> {
    vec![
        Compression::onebit(),
        Compression::topk(0.1).unwrap(),
        Compression::topk(7.0).unwrap(),
        Compression::randomk(0.25).unwrap(),
        Compression::two_bit(0.5).unwrap(),
        // The casts keep no feedback unless asked: here they are asked.
        Compression::fp16().error_feedback(true),
        Compression::bf16().error_feedback(true),
    ]
}

proptest! {
    #[test]
    fn round_trips_keep_what_each_compressor_promises(values in gradient(), seed in any::<u64>()) {
        let n = values.len();
        for c in kinds() {
            let Some(e) = encode(&c, &values, seed) else {
                prop_assert!(false, "{c} did not compress {n} values");
                unreachable!()
            };
            prop_assert!(e.payload.len() < n * 4, "{c}: not smaller");
            let back = decode(&e.msg, &e.payload).unwrap();
            prop_assert_eq!(back.len(), n);
            prop_assert_eq!(&back, &e.sent());
            match c.kind() {
                CompressionKind::OneBit => {
                    let scale = values.iter().map(|v| f64::from(v.abs())).sum::<f64>() / n as f64;
                    for (x, y) in values.iter().zip(&back) {
                        prop_assert!((f64::from(y.abs()) - scale).abs() <= 1e-4 * scale.max(1.0));
                        prop_assert_eq!(*x >= 0.0, *y >= 0.0);
                    }
                }
                CompressionKind::TwoBit => {
                    for (x, y) in values.iter().zip(&back) {
                        let want = if *x >= 0.5 { 0.5 } else if *x <= -0.5 { -0.5 } else { 0.0 };
                        prop_assert_eq!(*y, want);
                    }
                }
                CompressionKind::TopK => {
                    let k = e.msg.k as usize;
                    let kept: Vec<usize> = (0..n).filter(|&i| back[i] != 0.0).collect();
                    prop_assert!(kept.len() <= k);
                    let smallest_kept = kept.iter().map(|&i| values[i].abs()).fold(f32::INFINITY, f32::min);
                    for i in 0..n {
                        if back[i] != 0.0 {
                            prop_assert_eq!(back[i], values[i]);
                        } else if values[i] != 0.0 && kept.len() == k {
                            prop_assert!(values[i].abs() <= smallest_kept);
                        }
                    }
                }
                CompressionKind::RandomK => {
                    let k = e.msg.k as usize;
                    let at = randomk::positions(n, k, e.msg.seed);
                    for i in 0..n {
                        let want = if at.binary_search(&i).is_ok() { values[i] } else { 0.0 };
                        prop_assert_eq!(back[i], want);
                    }
                }
                CompressionKind::Fp16 | CompressionKind::Bf16 => {
                    prop_assert_eq!(e.payload.len(), n * 2);
                    // Rounded to nearest: within half a unit of the last place
                    // (11 and 8 significant bits; these values are normal).
                    let bits = if c.kind() == CompressionKind::Fp16 { 11 } else { 8 };
                    for (x, y) in values.iter().zip(&back) {
                        let tolerance = x.abs().max(6.2e-5) * 2f32.powi(-bits);
                        prop_assert!((x - y).abs() <= tolerance, "{}: {} -> {}", c, x, y);
                    }
                }
            }
        }
    }

    /// With error feedback, what the server reads over many pushes plus
    /// what the worker still holds is what the worker pushed.
    #[test]
    fn error_feedback_loses_nothing(steps in prop::collection::vec(gradient(), 1..8)) {
        let n = steps.iter().map(Vec::len).min().unwrap_or(0);
        let keys: Vec<u64> = (0..n as u64).map(|k| k * 3 + 1).collect();
        for c in kinds() {
            let state = WorkerState::default();
            let mut received = vec![0.0f64; n];
            let mut pushed = vec![0.0f64; n];
            for g in &steps {
                let g = &g[..n];
                let (msg, vals) = push_through(&state, &c, &keys, g);
                for (r, v) in received.iter_mut().zip(&vals) {
                    *r += f64::from(*v);
                }
                for (p, v) in pushed.iter_mut().zip(g) {
                    *p += f64::from(*v);
                }
                prop_assert!(msg.meta.compression.is_some(), "{c}: compressed");
            }
            for (i, key) in keys.iter().enumerate() {
                let held = state.residual(*key).map_or(0.0, |r| f64::from(r[0]));
                let total = received[i] + held;
                prop_assert!(
                    (total - pushed[i]).abs() <= 1e-3 * (1.0 + pushed[i].abs()),
                    "{c}: key {key}: received {} + held {held} != pushed {}", received[i], pushed[i]
                );
            }
        }
    }

    /// Whatever a peer sends as compressed values, the receiver refuses it
    /// with an error or reads the count it claims; it never panics.
    #[test]
    fn hostile_compressed_values_never_panic(
        kind in 1i32..7,
        param in any::<f32>(),
        count in prop_oneof![0u64..2000, Just(MAX_VALUES + 1), any::<u64>()],
        k in prop_oneof![0u64..300, any::<u64>()],
        seed in any::<u64>(),
        payload in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let msg = CompressionMsg {
            kind: CompressionKind::try_from(kind).unwrap(),
            param,
            count: Some(count),
            k,
            seed,
            answer: false,
            answer_feedback: false,
        };
        if let Ok(v) = decode(&msg, &payload) {
            prop_assert_eq!(v.len() as u64, count);
        }
        let mut m = kv_message(&[1, 2], Bytes::from(payload));
        m.meta.compression = Some(Box::new(msg));
        let _ = expand::<f32>(&mut m);
    }
}

/// One push of `g` for `keys` (one value each) through `state`, read back
/// as a server reads it: the message and the values it got.
fn push_through(
    state: &WorkerState,
    c: &Compression,
    keys: &[u64],
    g: &[f32],
) -> (Message, Vec<f32>) {
    let slice = KVPairs::new(keys.to_vec(), g.to_vec());
    let (mut frames, types) = slice.to_frames();
    let mut msg = Message::default();
    msg.meta.data_type = types;
    state.prepare(c, true, false, &slice, &mut msg.meta, &mut frames);
    msg.data = frames;
    let sent = msg.clone();
    expand::<f32>(&mut msg).unwrap();
    let got = KVPairs::<f32>::from_message(&msg).unwrap();
    (sent, got.vals.to_vec())
}

fn kv_message(keys: &[u64], vals: Bytes) -> Message {
    let mut m = Message {
        data: vec![SArray::from_vec(keys.to_vec()).bytes().clone(), vals],
        ..Message::default()
    };
    m.meta.data_type = vec![DataType::UInt64, DataType::Other];
    m
}

#[test]
fn names_parse_and_print() {
    for (s, shown) in [
        ("onebit", "onebit"),
        ("topk", "topk:0.01"),
        ("topk:0.2", "topk:0.2"),
        ("topk:100", "topk:100"),
        ("randomk:0.05", "randomk:0.05"),
        ("2bit", "2bit:0.5"),
        ("2bit:0.1", "2bit:0.1"),
        (" TopK:0.3 ", "topk:0.3"),
        ("fp16", "fp16"),
        ("float16", "fp16"),
        ("BF16", "bf16"),
        ("bfloat16", "bf16"),
    ] {
        let c: Compression = s.parse().unwrap();
        assert_eq!(c.to_string(), shown);
        assert_eq!(shown.parse::<Compression>().unwrap(), c);
    }
    for bad in [
        "",
        "zip",
        "topk:0",
        "topk:-1",
        "topk:1.5",
        "topk:x",
        "randomk:nan",
        "2bit:0",
        "2bit:-1",
        "onebit:3",
        "fp16:1",
        "bf16:",
    ] {
        assert!(bad.parse::<Compression>().is_err(), "{bad:?} accepted");
    }
    assert_eq!(parse_compression("none").unwrap(), None);
    assert!(parse_compression("onebit").unwrap().is_some());
}

#[test]
fn small_messages_go_uncompressed_with_their_residuals() {
    let state = WorkerState::default();
    let c = Compression::topk(1.0).unwrap();
    let keys: Vec<u64> = (0..20).collect();
    let g: Vec<f32> = (0..20).map(|i| i as f32).collect();
    let (msg, _) = push_through(&state, &c, &keys, &g);
    assert!(msg.meta.compression.is_some());
    // Key 19 went; key 18's value waits.
    assert_eq!(state.residual(18), Some(vec![18.0]));
    // A push of key 18 alone is too small to compress: it carries the
    // residual, which is cleared.
    let (msg, got) = push_through(&state, &c, &[18], &[1.0]);
    assert!(msg.meta.compression.is_none());
    assert_eq!(got, vec![19.0]);
    assert_eq!(state.residual(18), None);
}

#[test]
fn answers_are_compressed_only_when_asked_and_read_back() {
    let state = WorkerState::default();
    let c = Compression::onebit().compress_answers(true);
    let slice = KVPairs::<f32>::new(vec![1u64, 2], Vec::<f32>::new());
    let (mut frames, types) = slice.to_frames();
    let mut req = Message::default();
    req.meta.data_type = types;
    state.prepare(&c, false, true, &slice, &mut req.meta, &mut frames);
    let asked = req.meta.compression.as_deref().unwrap();
    assert!(asked.answer && asked.count.is_none());
    let answer_with = Compression::for_answer(asked).unwrap();
    // The server's answer of 40 values, compressed, and read back.
    let vals: Vec<f32> = (0..40).map(|i| i as f32 - 20.0).collect();
    let mut answer = kv_message(&[1, 2], SArray::from_vec(vals.clone()).bytes().clone());
    answer.meta.data_type[1] = DataType::Float;
    assert!(
        !asked.answer_feedback,
        "the servers' error feedback is off by default"
    );
    compress_answer::<f32>(
        &answer_with.error_feedback(false),
        &mut answer,
        &[1, 2],
        &[],
        None,
    );
    assert_eq!(answer.data[1].len(), 4 + 5);
    assert_eq!(answer.meta.data_type[1], DataType::Other);
    expand::<f32>(&mut answer).unwrap();
    let got = KVPairs::<f32>::from_message(&answer).unwrap();
    assert_eq!(got.vals.len(), 40);
    assert!(got
        .vals
        .iter()
        .zip(&vals)
        .all(|(g, v)| (*g >= 0.0) == (*v >= 0.0)));
    // Not asked: nothing.
    let plain = Compression::onebit();
    let mut req = Message::default();
    let (mut frames, types) = slice.to_frames();
    req.meta.data_type = types;
    state.prepare(&plain, false, true, &slice, &mut req.meta, &mut frames);
    assert!(req.meta.compression.is_none());
}

#[test]
fn f64_values_compress_and_expand() {
    let state = WorkerState::default();
    let c = Compression::two_bit(0.25).unwrap();
    let slice = KVPairs::<f64>::new(vec![5u64], vec![1.0f64; 32]);
    let (mut frames, types) = slice.to_frames();
    let mut msg = Message::default();
    msg.meta.data_type = types;
    state.prepare(&c, true, false, &slice, &mut msg.meta, &mut frames);
    msg.data = frames;
    assert_eq!(msg.data[1].len(), 8);
    expand::<f64>(&mut msg).unwrap();
    let got = KVPairs::<f64>::from_message(&msg).unwrap();
    assert_eq!(&got.vals[..], &[0.25f64; 32][..]);
    // Integer apps are refused.
    let mut m = kv_message(&[1], Bytes::from_static(&[0u8; 8]));
    m.meta.compression = Some(Box::new(CompressionMsg {
        kind: CompressionKind::TwoBit,
        param: 0.5,
        count: Some(32),
        k: 0,
        seed: 0,
        answer: false,
        answer_feedback: false,
    }));
    assert!(expand::<i32>(&mut m).is_err());
    assert!(expand::<f32>(&mut m).is_ok());
}

#[test]
fn randomk_workers_in_step_draw_the_same_positions() {
    let c = Compression::randomk(0.1).unwrap();
    let (a, b) = (WorkerState::default(), WorkerState::default());
    let keys: Vec<u64> = (100..200).collect();
    for step in 0..3 {
        let g: Vec<f32> = (0..100).map(|i| (i * (step + 1)) as f32).collect();
        let (ma, _) = push_through(&a, &c, &keys, &g);
        let (mb, _) = push_through(&b, &c, &keys, &g);
        let (sa, sb) = (
            ma.meta.compression.as_ref().unwrap().seed,
            mb.meta.compression.as_ref().unwrap().seed,
        );
        assert_eq!(sa, sb, "step {step}");
    }
    let other = Compression::randomk(0.1).unwrap().seed(1);
    let (mc, _) = push_through(&WorkerState::default(), &other, &keys, &[1.0; 100]);
    let (md, _) = push_through(&WorkerState::default(), &c, &keys, &[1.0; 100]);
    assert_ne!(
        mc.meta.compression.as_ref().unwrap().seed,
        md.meta.compression.as_ref().unwrap().seed
    );
}

#[test]
fn a_server_keeps_error_feedback_per_worker_on_its_compressed_answers() {
    let state = WorkerState::default();
    let slice = KVPairs::<f32>::new(vec![1u64, 2], Vec::<f32>::new());
    let ask = |c: Compression| {
        let (mut frames, types) = slice.to_frames();
        let mut req = Message::default();
        req.meta.data_type = types;
        state.prepare(&c, false, true, &slice, &mut req.meta, &mut frames);
        Compression::for_answer(req.meta.compression.as_deref().unwrap()).unwrap()
    };
    // 2bit at threshold 1: answers of 0.3 per value are all below it.
    let with = ask(Compression::two_bit(1.0)
        .unwrap()
        .compress_answers(true)
        .answer_feedback(true));
    let without = ask(Compression::two_bit(1.0).unwrap().compress_answers(true));
    assert!(with.has_error_feedback() && !without.has_error_feedback());
    let vals = vec![0.3f32; 32];
    let server = AnswerFeedback::default();
    let answer = |c: &Compression, worker| {
        let mut m = kv_message(&[1, 2], SArray::from_vec(vals.clone()).bytes().clone());
        m.meta.data_type[1] = DataType::Float;
        server.compress::<f32>(c, worker, &mut m, &[1, 2], &[]);
        assert_eq!(m.meta.data_type[1], DataType::Other, "compressed");
        expand::<f32>(&mut m).unwrap();
        KVPairs::<f32>::from_message(&m).unwrap().vals.to_vec()
    };
    // Without feedback every answer is zeros: the values are lost.
    for _ in 0..4 {
        assert!(answer(&without, 9).iter().all(|&v| v == 0.0));
    }
    assert_eq!(server.residual(9, 1), None);
    // With it, worker 9's answers add up to what the server had, less the
    // residual it keeps for each key (16 values each).
    let mut sum = vec![0.0f32; 32];
    for _ in 0..4 {
        for (s, v) in sum.iter_mut().zip(answer(&with, 9)) {
            *s += v;
        }
    }
    assert!(
        sum.iter().all(|&v| v == 1.0),
        "the fourth answer carries 1.2: {sum:?}"
    );
    let r = server.residual(9, 1).unwrap();
    assert_eq!(r.len(), 16);
    assert!(r.iter().all(|&e| (e - 0.2).abs() < 1e-5), "{r:?}");
    // Worker 11's answers start from no residual of their own.
    assert!(answer(&with, 11).iter().all(|&v| v == 0.0));
    assert!(server
        .residual(11, 2)
        .is_some_and(|r| (r[0] - 0.3).abs() < 1e-6));
}

/// Deep Gradient Compression's worker, written out: velocity, accumulated
/// velocity, and (for sparsifiers) both cleared where a value went.
struct Dgc {
    u: Vec<f32>,
    v: Vec<f32>,
}

impl Dgc {
    fn step(&mut self, g: &[f32], m: f32, nesterov: bool, top: usize, mask: bool) -> Vec<f32> {
        for ((u, v), g) in self.u.iter_mut().zip(&mut self.v).zip(g) {
            *u = m * *u + g;
            *v += if nesterov { g + m * *u } else { *u };
        }
        // The `top` largest magnitudes go (distinct magnitudes here).
        let mut order: Vec<usize> = (0..g.len()).collect();
        order.sort_by(|&a, &b| self.v[b].abs().total_cmp(&self.v[a].abs()));
        let mut sent = vec![0.0; g.len()];
        for &i in &order[..top] {
            sent[i] = self.v[i];
            self.v[i] = 0.0;
            if mask {
                self.u[i] = 0.0;
            }
        }
        sent
    }
}

fn steps_of_gradients(n: usize) -> Vec<Vec<f32>> {
    (0..3)
        .map(|t| {
            (0..n)
                .map(|i| ((i * 7 + t * 5) % 11) as f32 * 0.25 - 1.3 + 0.01 * i as f32)
                .collect()
        })
        .collect()
}

#[test]
fn momentum_correction_with_topk_is_dgc() {
    let n = 20;
    let keys: Vec<u64> = (100..100 + n as u64).collect();
    for (nesterov, mask) in [(false, true), (true, true), (false, false), (true, false)] {
        let c = Compression::topk(3.0)
            .unwrap()
            .momentum(0.9)
            .unwrap()
            .nesterov(nesterov)
            .momentum_masking(mask);
        let state = WorkerState::default();
        let mut dgc = Dgc {
            u: vec![0.0; n],
            v: vec![0.0; n],
        };
        for g in steps_of_gradients(n) {
            let (msg, got) = push_through(&state, &c, &keys, &g);
            assert!(msg.meta.compression.is_some());
            let want = dgc.step(&g, 0.9, nesterov, 3, mask);
            for i in 0..n {
                assert!((got[i] - want[i]).abs() < 1e-5, "{i}: {got:?} != {want:?}");
                let u = state.velocity(keys[i]).unwrap()[0];
                assert!(
                    (u - dgc.u[i]).abs() < 1e-5,
                    "velocity {i}: {u} != {}",
                    dgc.u[i]
                );
                let v = state.residual(keys[i]).unwrap()[0];
                assert!(
                    (v - dgc.v[i]).abs() < 1e-5,
                    "accumulated {i}: {v} != {}",
                    dgc.v[i]
                );
            }
            // Masking cleared the velocity of exactly the values sent.
            let cleared = (0..n)
                .filter(|&i| state.velocity(keys[i]).unwrap()[0] == 0.0)
                .count();
            assert_eq!(cleared, if mask { 3 } else { 0 });
        }
    }
}

#[test]
fn momentum_correction_with_2bit_keeps_the_velocity() {
    let n = 16;
    let keys: Vec<u64> = (0..n as u64).collect();
    let c = Compression::two_bit(0.5)
        .unwrap()
        .momentum(0.5)
        .unwrap()
        .momentum_masking(true);
    let state = WorkerState::default();
    let (mut u, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
    for g in steps_of_gradients(n) {
        let (msg, got) = push_through(&state, &c, &keys, &g);
        assert!(msg.meta.compression.is_some());
        for i in 0..n {
            u[i] = 0.5 * u[i] + g[i];
            v[i] += u[i];
            let want = if v[i] >= 0.5 {
                0.5
            } else if v[i] <= -0.5 {
                -0.5
            } else {
                0.0
            };
            assert_eq!(got[i], want, "{i}");
            v[i] -= want;
            // Not masked: the velocity is momentum's, whatever was sent.
            let held = state.velocity(keys[i]).unwrap()[0];
            assert!(
                (held - u[i]).abs() < 1e-6,
                "velocity {i}: {held} != {}",
                u[i]
            );
        }
    }
}

#[test]
fn momentum_correction_of_an_uncompressed_push_is_momentum_sgd() {
    // Too small to compress: the velocity goes whole every push and is kept.
    let c = Compression::randomk(0.5)
        .unwrap()
        .momentum(0.5)
        .unwrap()
        .momentum_masking(true);
    let state = WorkerState::default();
    let (_, got) = push_through(&state, &c, &[1, 2], &[1.0, -2.0]);
    assert_eq!(got, vec![1.0, -2.0]);
    let (msg, got) = push_through(&state, &c, &[1, 2], &[1.0, 1.0]);
    assert!(msg.meta.compression.is_none());
    assert_eq!(got, vec![1.5, 0.0]);
    assert_eq!(state.velocity(1), Some(vec![1.5]));
    // To a server that does not read compressed values: the same.
    let slice = KVPairs::new(vec![1u64, 2], vec![0.0f32, 0.0]);
    let (mut frames, _) = slice.to_frames();
    state.prepare_plain(&c, true, &slice, &mut frames);
    let got = SArray::<f32>::from_bytes(frames[1].clone())
        .unwrap()
        .to_vec();
    assert_eq!(got, vec![0.75, 0.0]);
    // Without momentum, a plain push is left as it is.
    let before = frames[1].clone();
    state.prepare_plain(&Compression::onebit(), true, &slice, &mut frames);
    assert_eq!(frames[1], before);
}

#[test]
fn momentum_must_be_below_one() {
    for bad in [-0.1, 1.0, 1.5, f32::NAN, f32::INFINITY] {
        assert!(Compression::onebit().momentum(bad).is_err(), "{bad}");
    }
    let c = Compression::onebit().momentum(0.0).unwrap();
    assert_eq!(c, Compression::onebit());
    let c = Compression::onebit().momentum(0.9).unwrap().nesterov(true);
    assert_ne!(c, Compression::onebit());
    assert_eq!(c.momentum_factor(), 0.9);
    assert!(c.is_nesterov());
    assert!(!c.has_momentum_masking());
    assert_ne!(c, c.momentum_masking(true));
}

#[test]
fn a_restored_key_state_carries_on_the_velocity_and_residual() {
    let c = Compression::topk(0.1).unwrap().momentum(0.9).unwrap();
    for keys in [vec![7u64], (100..150).collect::<Vec<u64>>()] {
        let grad = |step: usize| -> Vec<f32> {
            (0..50)
                .map(|i| ((i * 7 + step * 3) % 11) as f32 - 5.0)
                .collect()
        };
        let before = WorkerState::default();
        for step in 0..3 {
            push_through(&before, &c, &keys, &grad(step));
        }
        let saved: Vec<KeyState> = keys.iter().map(|&k| before.key_state(k)).collect();
        assert!(saved
            .iter()
            .all(|s| s.velocity.is_some() && s.residual.is_some()));
        let restored = WorkerState::default();
        for (&k, s) in keys.iter().zip(&saved) {
            restored.restore(k, s);
        }
        let (_, carried_on) = push_through(&before, &c, &keys, &grad(3));
        let (_, after_restore) = push_through(&restored, &c, &keys, &grad(3));
        let (_, fresh) = push_through(&WorkerState::default(), &c, &keys, &grad(3));
        assert_eq!(after_restore, carried_on, "{} keys", keys.len());
        assert_ne!(
            fresh, carried_on,
            "a fresh state must differ for the test to mean anything"
        );
        // Restoring nothing clears the key.
        restored.restore(keys[0], &KeyState::default());
        assert_eq!(restored.key_state(keys[0]), KeyState::default());
    }
}

#[test]
fn casts_keep_no_feedback_unless_asked_and_half_values_cross_exactly() {
    assert!(!Compression::fp16().has_error_feedback());
    assert!(!"bf16".parse::<Compression>().unwrap().has_error_feedback());
    assert!(Compression::onebit().has_error_feedback());
    let state = WorkerState::default();
    let keys: Vec<u64> = (0..64).collect();
    // float16 numbers (k / 1024 for small k) and a value it must round.
    let mut g: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 1024.0).collect();
    g[5] = 0.1;
    let (msg, got) = push_through(&state, &Compression::fp16(), &keys, &g);
    assert_eq!(msg.data[1].len(), 64 * 2, "two bytes a value");
    assert_eq!(state.residual(5), None, "no feedback kept");
    for (i, (x, y)) in g.iter().zip(&got).enumerate() {
        if i == 5 {
            assert_eq!(*y, 0.099975586, "0.1 rounded to the nearest float16");
        } else {
            assert_eq!(x, y, "a float16 value crosses exactly");
        }
    }
}

/// Two workers push float16 gradients as fp16; the server sums them in
/// f32 and takes the mean, and its fp16 answer is that mean rounded once.
#[test]
fn an_fp16_mean_is_summed_in_f32_and_rounded_once() {
    for c in [Compression::fp16(), Compression::bf16()] {
        let keys: Vec<u64> = (0..100).collect();
        let a: Vec<f32> = (0..100).map(|i| 1.0 + i as f32 / 128.0).collect();
        let b: Vec<f32> = (0..100).map(|i| 3.0 / 1024.0 * i as f32).collect();
        let (_, ga) = push_through(&WorkerState::default(), &c, &keys, &a);
        let (_, gb) = push_through(&WorkerState::default(), &c, &keys, &b);
        let mean: Vec<f32> = ga.iter().zip(&gb).map(|(x, y)| (x + y) / 2.0).collect();
        let mut answer = kv_message(&[0], SArray::from_vec(mean.clone()).bytes().clone());
        answer.meta.data_type[1] = DataType::Float;
        let answer_with = Compression::for_answer(&c.compress_answers(true).msg(0)).unwrap();
        compress_answer::<f32>(&answer_with, &mut answer, &[0], &[], None);
        assert_eq!(answer.data[1].len(), 200, "{c}: compressed");
        expand::<f32>(&mut answer).unwrap();
        let got = KVPairs::<f32>::from_message(&answer).unwrap();
        let half = if c.kind() == CompressionKind::Fp16 {
            cast::Half::F16
        } else {
            cast::Half::Bf16
        };
        let once = cast::decompress(&cast::compress(&mean, half), 100, half).unwrap();
        assert_eq!(&got.vals[..], &once[..], "{c}");
        if c.kind() == CompressionKind::Fp16 {
            // Here the inputs are float16 numbers: nothing rounded before
            // the mean (a sum in float16 would have rounded, e.g. at 99).
            assert_eq!(ga, a);
            assert_eq!(gb, b);
        }
    }
}
