//! Gradient compression end to end on in-process clusters (real ZeroMQ
//! over 127.0.0.1): what each compressor delivers to the server's handle,
//! the bytes it saves on the wire, error feedback over many pushes,
//! compressed answers, and refusals.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pslite::{
    Compression, DefaultHandle, KVMeta, KVOptions, KVPairs, KVServer, KVWorker, Key, SArray,
};
use pslite_tests::LocalCluster;

const T: Duration = Duration::from_secs(20);

/// What a recording server saw: each push's keys and values.
type Seen = Arc<Mutex<Vec<(Vec<Key>, Vec<f32>)>>>;

/// Servers that record every push (values as their handle gets them) and
/// answer from a sum store.
fn recording_servers(c: &LocalCluster) -> (Vec<KVServer<f32>>, Seen) {
    let seen: Seen = Arc::default();
    let servers = c
        .servers
        .iter()
        .map(|po| {
            let s = KVServer::<f32>::new(po, 0).unwrap();
            let seen = Arc::clone(&seen);
            let store = DefaultHandle::<f32>::new();
            s.set_request_handle(move |meta: &KVMeta, req: KVPairs<f32>, server| {
                if meta.push {
                    seen.lock()
                        .unwrap()
                        .push((req.keys.to_vec(), req.vals.to_vec()));
                }
                let res = store.apply(meta, &req);
                server.answer(meta, res).unwrap();
            });
            s
        })
        .collect();
    (servers, seen)
}

/// `n` keys spread over the key space (every server gets some).
fn spread(n: u64) -> Vec<Key> {
    (0..n).map(|i| u64::MAX / n * i + 3).collect()
}

/// Bytes the worker `po` has sent to servers.
fn sent_to_servers(po: &pslite::Postoffice) -> u64 {
    po.counters()
        .peers
        .iter()
        .filter(|p| p.peer >= 8 && p.peer % 2 == 0)
        .map(|p| p.bytes_sent)
        .sum()
}

#[test]
fn each_compressor_reaches_the_handle_decompressed_and_saves_bytes() {
    let c = LocalCluster::start(2, 1);
    let (_servers, seen) = recording_servers(&c);
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    // 8 keys of 500 values each: 4 keys (2000 values) per server.
    let keys = spread(8);
    let vals: Vec<f32> = (0..4000)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    let lens = [500; 8];
    let before = sent_to_servers(&c.workers[0]);
    w.push(&keys, &vals, KVOptions::new().lens(&lens).compression(None))
        .unwrap()
        .wait_timeout(T)
        .unwrap();
    let plain = sent_to_servers(&c.workers[0]) - before;
    assert!(plain > 16_000, "{plain} bytes");
    seen.lock().unwrap().clear();
    for (spec, at_most) in [
        ("onebit", plain / 20),
        ("2bit:1", plain / 10),
        ("topk:0.05", plain / 5),
        ("randomk:0.05", plain / 5),
        ("fp16", plain * 11 / 20),
        ("bf16", plain * 11 / 20),
    ] {
        let compression: Compression = spec.parse().unwrap();
        // Without error feedback: each push is judged on its own.
        let compression = compression.error_feedback(false);
        w.set_compression(Some(compression)).unwrap();
        let before = sent_to_servers(&c.workers[0]);
        w.push(&keys, &vals, KVOptions::new().lens(&lens))
            .unwrap()
            .wait_timeout(T)
            .unwrap();
        let sent = sent_to_servers(&c.workers[0]) - before;
        // Keys and meta travel as they are; the values shrink.
        assert!(
            sent < at_most + 2 * 8 * 8 + 400,
            "{spec}: {sent} bytes on the wire, {plain} uncompressed"
        );
        let got = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(got.len(), 2, "{spec}: one message per server");
        for (k, v) in &got {
            assert_eq!(v.len(), k.len() * 500, "{spec}: every value is there");
            let first = keys.iter().position(|x| x == &k[0]).unwrap();
            let original = &vals[first * 500..first * 500 + v.len()];
            match compression.kind() {
                pslite::CompressionKind::OneBit => {
                    let scale = v[0].abs();
                    let mean =
                        original.iter().map(|x| x.abs()).sum::<f32>() / original.len() as f32;
                    assert!((scale - mean).abs() < 1e-3 * mean.max(1.0), "{spec}");
                    for (g, o) in v.iter().zip(original) {
                        assert_eq!(g.abs(), scale);
                        assert_eq!(*g >= 0.0, *o >= 0.0, "{spec}");
                    }
                }
                pslite::CompressionKind::TwoBit => {
                    for (g, o) in v.iter().zip(original) {
                        let want = if *o >= 1.0 {
                            1.0
                        } else if *o <= -1.0 {
                            -1.0
                        } else {
                            0.0
                        };
                        assert_eq!(*g, want, "{spec}");
                    }
                }
                pslite::CompressionKind::Fp16 | pslite::CompressionKind::Bf16 => {
                    // Every value, rounded to nearest (11 or 8 significant bits).
                    let bits = if spec == "fp16" { 11 } else { 8 };
                    for (g, o) in v.iter().zip(original) {
                        let tolerance = o.abs() * 2f32.powi(-bits);
                        assert!((g - o).abs() <= tolerance, "{spec}: {o} -> {g}");
                    }
                }
                _ => {
                    let kept: Vec<usize> = (0..v.len()).filter(|&i| v[i] != 0.0).collect();
                    assert!(
                        !kept.is_empty() && kept.len() <= v.len() / 20,
                        "{spec}: {}",
                        kept.len()
                    );
                    for i in kept {
                        assert_eq!(v[i], original[i], "{spec}");
                    }
                }
            }
        }
    }
    drop(w);
    c.finalize();
}

/// A constant gradient pushed many times: with error feedback every value
/// gets through (the sum the server holds is close to what was pushed);
/// without, topk keeps sending the same few.
#[test]
fn error_feedback_delivers_every_value_over_many_pushes() {
    let c = LocalCluster::start(1, 1);
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    server.set_request_handle(DefaultHandle::new().into_handle());
    let w = KVWorker::<f32>::new(&c.workers[0], 0, 0).unwrap();
    let g: Vec<f32> = (0..200).map(|i| 1.0 + (i % 7) as f32 / 10.0).collect();
    let steps = 60usize;
    let mut errors = Vec::new();
    for (base, feedback) in [(0u64, true), (1_000, false)] {
        let key = [base + 1];
        let topk = Compression::topk(0.1).unwrap().error_feedback(feedback);
        for _ in 0..steps {
            w.push(&key, &g, KVOptions::new().compression(Some(topk)))
                .unwrap()
                .wait_timeout(T)
                .unwrap();
        }
        let pulled = w
            .pull(&key, KVOptions::new())
            .unwrap()
            .take_timeout(T)
            .unwrap();
        let worst = pulled
            .vals
            .iter()
            .zip(&g)
            .map(|(p, g)| (p - g * steps as f32).abs() / (g * steps as f32))
            .fold(0.0f32, f32::max);
        errors.push(worst);
    }
    // With feedback, what is still held back is at most a few pushes' worth.
    assert!(
        errors[0] < 0.25,
        "with error feedback: worst relative error {}",
        errors[0]
    );
    assert!(
        errors[1] > 0.9,
        "without: values never sent ({})",
        errors[1]
    );
    drop(w);
    c.finalize();
}

#[test]
fn answers_come_back_compressed_when_asked() {
    let c = LocalCluster::start(1, 2);
    let server = KVServer::<f32>::new(&c.servers[0], 0).unwrap();
    server.set_request_handle(DefaultHandle::new().into_handle());
    let workers: Vec<_> = c
        .workers
        .iter()
        .map(|po| KVWorker::<f32>::new(po, 0, 0).unwrap())
        .collect();
    let key = [7u64];
    let g: Vec<f32> = (0..64)
        .map(|i| if i % 2 == 0 { 2.0 } else { -1.0 })
        .collect();
    // Worker 0 pushes plainly; worker 1 push-pulls with onebit answers.
    workers[0]
        .push(&key, &g, KVOptions::new())
        .unwrap()
        .wait_timeout(T)
        .unwrap();
    let onebit = Compression::onebit()
        .error_feedback(false)
        .compress_answers(true);
    let got = workers[1]
        .push_pull(&key, &g, KVOptions::new().compression(Some(onebit)))
        .unwrap()
        .take_timeout(T)
        .unwrap();
    // The store holds 2 g (onebit of g is +-1.5; summed: 3.5 and -2.5);
    // the answer is its signs at its mean magnitude, 3.
    assert_eq!(got.vals.len(), 64);
    for (v, x) in got.vals.iter().zip(&g) {
        assert_eq!(*v, if *x > 0.0 { 3.0 } else { -3.0 });
    }
    // A plain pull reads the store as it is.
    let plain = workers[0]
        .pull(&key, KVOptions::new())
        .unwrap()
        .take_timeout(T)
        .unwrap();
    assert_eq!(plain.vals[0], 3.5);
    assert_eq!(plain.vals[1], -2.5);
    drop(workers);
    c.finalize();
}

#[test]
fn compression_is_refused_for_integer_values() {
    let c = LocalCluster::start(1, 1);
    let w = KVWorker::<i32>::new(&c.workers[0], 0, 0).unwrap();
    assert!(w.set_compression(Some(Compression::onebit())).is_err());
    let err = w
        .push(
            &[1],
            &[1; 32],
            KVOptions::new().compression(Some(Compression::onebit())),
        )
        .unwrap_err();
    assert!(err.to_string().contains("f32 and f64"), "{err}");
    let f = KVWorker::<f64>::new(&c.workers[0], 1, 0).unwrap();
    assert!(f.set_compression(Some(Compression::onebit())).is_ok());
    let _ = SArray::<f32>::new();
    drop((w, f));
    c.finalize();
}
