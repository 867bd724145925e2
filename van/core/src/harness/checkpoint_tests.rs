//! Checkpoints in the in-memory network (virtual time, the harness's disk):
//! the cut at a barrier over the workers, complete = manifest written before
//! the barrier is released, a new job restoring exactly before serving, a
//! truncated file refused with nothing loaded and the job stopped, a pending
//! checkpoint waiting for a barrier with nothing in flight, and
//! `PS_CHECKPOINT_INTERVAL`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use pslite_proto::DataType;

use super::*;
use crate::checkpoint::{catalog, disk, CheckpointConfig};

const SECOND: Duration = Duration::from_secs(1);

fn dir() -> PathBuf {
    PathBuf::from("/checkpoints")
}

fn config(interval: Option<Duration>) -> VanConfig {
    let mut ck = CheckpointConfig::new(dir());
    ck.interval = interval;
    ck.timeout = SECOND * 10;
    VanConfig {
        heartbeat_interval: Some(Duration::from_millis(100)),
        heartbeat_timeout: Some(Duration::from_millis(500)),
        watch_all: true,
        checkpoint: Some(ck),
        ..VanConfig::default()
    }
}

/// A cluster of 2 servers (sum apps) and 1 worker over `disk`; its
/// scheduler found there what a real one's scan finds.
fn job(disk: &BTreeMap<PathBuf, Bytes>, interval: Option<Duration>, seed: u64) -> Network {
    let mut net = Network::cluster(2, 1, config(interval), seed);
    net.disk = disk.clone();
    for i in 1..=2 {
        net.nodes[i].app = Some(SumApp::default());
    }
    let found = net.scan_checkpoints(&dir());
    let latest = net.disk.get(&dir().join(disk::LATEST)).map(|text| {
        let text = String::from_utf8_lossy(text);
        let words: Vec<&str> = text.split_whitespace().collect();
        (words[1].to_string(), words[3].parse().unwrap())
    });
    let ranges = crate::replica::key_ranges(2);
    let job = format!("{seed:032x}");
    let catalog = catalog(&dir(), &found, latest, &ranges, false, job)
        .expect("the checkpoint directory is readable");
    net.nodes[0].core.set_checkpoint_catalog(catalog);
    net
}

/// Keys in both key ranges.
fn keys() -> Vec<u64> {
    let ranges = crate::replica::key_ranges(2);
    vec![ranges[0].0 + 1, ranges[0].0 + 2, ranges[1].0 + 1]
}

/// Worker 3 pushes `value` to every key of [`keys`] (one message per range).
fn push(net: &mut Network, ts: i32, value: i64) {
    let ranges = crate::replica::key_ranges(2);
    for (r, &(begin, end)) in ranges.iter().enumerate() {
        let ks: Vec<u64> = keys()
            .into_iter()
            .filter(|&k| k >= begin && (k < end || end == u64::MAX))
            .collect();
        let mut msg = Message::default();
        msg.meta.request = true;
        msg.meta.push = true;
        msg.meta.timestamp = ts;
        msg.meta.recver = ids::server_rank_to_id(r as i32);
        msg.data = vec![
            ks.iter()
                .flat_map(|k| k.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
            ks.iter()
                .flat_map(|_| value.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        ];
        msg.meta.data_type = vec![DataType::UInt64, DataType::Int64];
        net.send(3, msg);
    }
}

/// Every key's sum on the servers.
fn sums(net: &Network) -> Vec<i64> {
    keys()
        .into_iter()
        .map(|k| {
            (1..=2)
                .filter_map(|i| net.nodes[i].app.as_ref())
                .map(|a| a.sum(k))
                .sum()
        })
        .collect()
}

fn has(net: &Network, path: &Path) -> bool {
    net.disk.contains_key(path)
}

/// The worker asks for a checkpoint and meets at a barrier: the barrier
/// is released only once the manifest is written.
fn checkpoint_at_barrier(net: &mut Network, label: &str) -> u64 {
    let now = net.now;
    let ticket = net.nodes[3]
        .core
        .checkpoint_request(label, now)
        .expect("checkpoint request");
    net.flush(3);
    let accepted = net.run_until(SECOND, |n| {
        n.nodes[3]
            .core
            .checkpoint_answer(ticket)
            .is_ok_and(|(a, _)| a.is_some())
    });
    assert!(accepted, "the scheduler did not accept the checkpoint");
    let token = net.barrier(3, ids::WORKER_GROUP);
    let manifest = disk::checkpoint_dir(&dir(), 1).join(disk::MANIFEST);
    let released = net.run_until(SECOND * 5, |n| n.outcome(3, token).is_some());
    assert!(released, "the barrier was not released");
    assert!(
        has(net, &manifest),
        "the barrier was released before the manifest was written"
    );
    ticket
}

#[test]
fn checkpoint_is_taken_at_a_barrier_and_a_new_job_restores_it_exactly() {
    let mut net = job(&BTreeMap::new(), None, 1);
    assert!(net.form(SECOND * 10));
    push(&mut net, 1, 5);
    push(&mut net, 2, 7);
    net.run_for(SECOND);
    let before = sums(&net);
    assert_eq!(before, vec![12, 12, 12]);
    let ticket = checkpoint_at_barrier(&mut net, "first");
    let (_, result) = net.nodes[3]
        .core
        .checkpoint_answer(ticket)
        .expect("answers");
    let result = result.expect("the requester got the result");
    assert!(result.error.is_empty(), "{}", result.error);
    assert_eq!((result.id, result.files.len()), (1, 2));
    // Pushes after the barrier are not in it.
    push(&mut net, 3, 100);
    net.run_for(SECOND);

    let mut resumed = job(&net.disk, None, 2);
    assert!(resumed.form(SECOND * 10));
    assert!(resumed.run_until(SECOND * 5, |n| sums(n) == before));
    // Nothing was served before the restore: the apps applied no request.
    for i in 1..=2 {
        let app = resumed.nodes[i].app.as_ref().expect("a server app");
        assert!(
            app.trace.iter().all(|t| t.starts_with("restore")),
            "{:?}",
            app.trace
        );
    }
    push(&mut resumed, 1, 1);
    resumed.run_for(SECOND);
    assert_eq!(sums(&resumed), vec![13, 13, 13]);
}

#[test]
fn a_truncated_file_is_refused_and_stops_the_job_with_nothing_loaded() {
    let mut net = job(&BTreeMap::new(), None, 3);
    assert!(net.form(SECOND * 10));
    push(&mut net, 1, 5);
    net.run_for(SECOND);
    checkpoint_at_barrier(&mut net, "t");
    let mut damaged = net.disk.clone();
    let file = damaged
        .keys()
        .find(|p| p.to_string_lossy().contains(".server-1."))
        .cloned()
        .expect("server 1's file");
    let bytes = damaged[&file].clone();
    damaged.insert(file.clone(), bytes.slice(..bytes.len() / 2));

    let mut resumed = job(&damaged, None, 4);
    assert!(resumed.form(SECOND * 10));
    let all_failed = resumed.run_until(SECOND * 10, |n| {
        (0..4).all(|i| n.nodes[i].core.failure().is_some())
    });
    assert!(all_failed, "the job did not stop");
    for i in 0..4 {
        let failure = resumed.nodes[i].core.failure().map(ToString::to_string);
        let text = failure.unwrap_or_default();
        assert!(
            text.contains(&file.display().to_string()) && text.contains("truncated"),
            "node {i}: {text}"
        );
    }
    let refusing = resumed.nodes[2].app.as_ref().expect("a server app");
    assert!(refusing.store.is_empty(), "{:?}", refusing.trace);
}

#[test]
fn a_pending_checkpoint_waits_for_a_barrier_with_nothing_in_flight() {
    let mut net = job(&BTreeMap::new(), None, 5);
    assert!(net.form(SECOND * 10));
    let now = net.now;
    let ticket = net.nodes[3]
        .core
        .checkpoint_request("later", now)
        .expect("request");
    net.flush(3);
    net.run_for(SECOND);
    // A worker that says it has requests in flight does not qualify.
    net.nodes[3].core.counters().request_started();
    let token = net.barrier(3, ids::WORKER_GROUP);
    assert!(net.run_until(SECOND * 5, |n| n.outcome(3, token).is_some()));
    let manifest = disk::checkpoint_dir(&dir(), 1).join(disk::MANIFEST);
    assert!(!has(&net, &manifest), "taken while a request was in flight");
    net.nodes[3].core.counters().request_done();
    let token = net.barrier(3, ids::WORKER_GROUP);
    assert!(net.run_until(SECOND * 5, |n| n.outcome(3, token).is_some()));
    assert!(
        has(&net, &manifest),
        "not taken at a barrier with nothing in flight"
    );
    let (_, result) = net.nodes[3]
        .core
        .checkpoint_answer(ticket)
        .expect("answers");
    assert!(result.is_some_and(|r| r.error.is_empty()));
}

#[test]
fn the_interval_takes_checkpoints_by_itself() {
    let mut net = job(&BTreeMap::new(), Some(SECOND * 2), 6);
    assert!(net.form(SECOND * 10));
    let manifest = |id| disk::checkpoint_dir(&dir(), id).join(disk::MANIFEST);
    let mut barriers = 0;
    while barriers < 100 && !has(&net, &manifest(2)) {
        let token = net.barrier(3, ids::WORKER_GROUP);
        assert!(net.run_until(SECOND * 5, |n| n.outcome(3, token).is_some()));
        net.run_for(Duration::from_millis(100));
        barriers += 1;
    }
    assert!(
        has(&net, &manifest(1)) && has(&net, &manifest(2)),
        "after {barriers} barriers"
    );
    // About one every 2 s of barriers every 100 ms.
    assert!((30..=60).contains(&barriers), "{barriers} barriers");
}
