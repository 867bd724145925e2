//! Checkpoints in the in-memory network (virtual time, the harness's disk):
//! the cut at a barrier over the workers, complete = manifest written before
//! the barrier is released, a new job restoring exactly before serving, a
//! truncated file refused with nothing loaded and the job stopped, a pending
//! checkpoint waiting for a barrier with nothing in flight,
//! `PS_CHECKPOINT_INTERVAL`, and failed checkpoints leaving nothing: their
//! directory deleted only after every writer ended (reported, died, or
//! missed the deadline), on a disk whose writes fail or wait.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use pslite_proto::checkpoint::CheckpointMsg;
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

/// The worker asks for a checkpoint labelled `label`: the ticket of its
/// result, once the scheduler accepted it.
fn accepted(net: &mut Network, label: &str) -> Ticket {
    let asked = net.call(
        3,
        Call::Checkpoint {
            label: label.into(),
        },
        None,
    );
    assert!(net.run_until(SECOND, |n| n.answer(3, asked).is_some()));
    let Some(Ok(Done::Checkpoint { request, .. })) = net.answer(3, asked) else {
        panic!("the scheduler did not accept the checkpoint");
    };
    net.nodes[3].core.end_wait(asked);
    net.call(3, Call::CheckpointResult { request }, None)
}

/// The worker asks for a checkpoint and meets at a barrier: the barrier
/// is released only once the manifest is written.
fn checkpoint_at_barrier(net: &mut Network, label: &str) -> Ticket {
    let ticket = accepted(net, label);
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
    let Some(Ok(Done::Checkpoint { answer: result, .. })) = net.answer(3, ticket) else {
        panic!("the requester got no result");
    };
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
    let ticket = accepted(&mut net, "later");
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
    assert!(matches!(
        net.answer(3, ticket),
        Some(Ok(Done::Checkpoint { .. }))
    ));
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

/// What a full disk says.
const ENOSPC: &str = "No space left on device (os error 28)";

/// The directory of checkpoint `id`, as the harness's log shows it.
fn shown(id: u64) -> String {
    disk::checkpoint_dir(&dir(), id).display().to_string()
}

/// Whether anything of checkpoint `id` is on the disk.
fn holds_any(net: &Network, id: u64) -> bool {
    let cdir = disk::checkpoint_dir(&dir(), id);
    net.disk.keys().any(|p| p.starts_with(&cdir))
}

/// The worker asks for a checkpoint and meets at a barrier, which is
/// released; returns the requester's result (a failed checkpoint's
/// error says why).
fn checkpoint_result(net: &mut Network, label: &str) -> Result<CheckpointMsg, String> {
    let ticket = accepted(net, label);
    let token = net.barrier(3, ids::WORKER_GROUP);
    assert!(
        net.run_until(SECOND * 5, |n| n.outcome(3, token).is_some()
            && n.answer(3, ticket).is_some()),
        "the barrier was not released, or the requester not answered"
    );
    match net.answer(3, ticket) {
        Some(Ok(Done::Checkpoint { answer, .. })) => Ok(answer),
        Some(Err(e)) => Err(e.to_string()),
        other => panic!("not a checkpoint's result: {other:?}"),
    }
}

/// A job whose server rank 0 finds its disk full and whose server rank 1
/// writes slowly (its write waits until the test ends it), after pushes.
fn full_disk_job(seed: u64, hold: &str) -> Network {
    let mut net = job(&BTreeMap::new(), None, seed);
    assert!(net.form(SECOND * 10));
    push(&mut net, 1, 5);
    net.run_for(SECOND);
    net.disk_faults.fail = vec![(".server-0.".into(), ENOSPC.into())];
    net.disk_faults.hold = vec![hold.into()];
    let result = checkpoint_result(&mut net, "full").unwrap_err();
    assert!(
        result.contains("checkpoint 1 failed") && result.contains(ENOSPC),
        "{result}"
    );
    assert_eq!(net.disk_faults.held(), 1, "{:?}", net.disk_faults.log);
    net
}

/// The regression of issue 43: the scheduler deleted a failed checkpoint's
/// directory at once, while another server still wrote into it, which left
/// its file (or an empty directory) behind and stopped the next job.
#[test]
fn a_failed_checkpoint_is_deleted_only_after_every_writer_ended() {
    let mut net = full_disk_job(7, ".server-1.");
    // The requester knows, the barrier went on; server 1 still writes.
    net.run_for(SECOND * 3);
    assert_eq!(
        net.disk_faults.position("remove", &shown(1)),
        None,
        "deleted while server 1 writes into it: {:?}",
        net.disk_faults.log
    );
    net.end_held_writes();
    assert!(
        net.run_until(SECOND, |n| n
            .disk_faults
            .position("remove", &shown(1))
            .is_some()),
        "not deleted once every writer ended: {:?}",
        net.disk_faults.log
    );
    let log = &net.disk_faults;
    assert!(
        log.position("write", &shown(1)) < log.position("remove", &shown(1)),
        "{:?}",
        log.log
    );
    assert!(!holds_any(&net, 1), "{:?}", net.disk.keys());
    assert!(!has(&net, &dir().join(disk::LATEST)));
    // The next job finds nothing: a first start.
    assert!(net.scan_checkpoints(&dir()).is_empty());
    // And the job goes on: the next checkpoint completes.
    net.disk_faults.fail.clear();
    net.disk_faults.hold.clear();
    let result = checkpoint_result(&mut net, "after").expect("the checkpoint");
    assert_eq!(result.id, 2, "{result:?}");
    assert!(has(
        &net,
        &disk::checkpoint_dir(&dir(), 2).join(disk::MANIFEST)
    ));
}

/// A writer that never reports counts as ended after another
/// PS_CHECKPOINT_TIMEOUT (10 s here); what it writes later is deleted when
/// it reports.
#[test]
fn a_writer_that_never_reports_counts_as_ended_at_the_deadline() {
    let mut net = full_disk_job(8, ".server-1.");
    let failed_at = net.now;
    assert!(net.run_until(SECOND * 30, |n| n
        .disk_faults
        .position("remove", &shown(1))
        .is_some()));
    let waited = net.now.saturating_duration_since(failed_at);
    assert!(waited >= SECOND * 9, "deleted after {waited:?}");
    // The write ends late: its file lands, its report deletes it again.
    net.end_held_writes();
    assert!(net.run_until(SECOND, |n| !holds_any(n, 1)));
    let removes = net
        .disk_faults
        .log
        .iter()
        .filter(|l| l.starts_with("remove") && l.contains(&shown(1)))
        .count();
    assert_eq!(removes, 2, "{:?}", net.disk_faults.log);
}

/// A writer that dies counts as ended; if its file landed before it died,
/// the next job deletes it at start and starts fresh (nothing completed).
#[test]
fn a_writer_that_dies_counts_as_ended_and_the_next_job_starts_fresh() {
    let mut net = full_disk_job(9, ".server-1.");
    net.kill(2);
    assert!(
        net.run_until(SECOND * 5, |n| n
            .disk_faults
            .position("remove", &shown(1))
            .is_some()),
        "not deleted once the writer died: {:?}",
        net.disk_faults.log
    );
    // The dead server's write landed after all (as a killed process's
    // last write may): nobody reports it.
    net.end_held_writes();
    assert!(holds_any(&net, 1));
    let found = net.scan_checkpoints(&dir());
    let c = catalog(
        &dir(),
        &found,
        None,
        &crate::replica::key_ranges(2),
        false,
        "new".into(),
    )
    .expect("a directory of only incomplete checkpoints starts fresh");
    assert_eq!((c.restore, c.leftovers.clone()), (None, vec![1]));
    assert!(c.said.contains("never completed"), "{}", c.said);
}

/// A server told to write a newer checkpoint while its write of a failed
/// one is under way reports the old one once that write ended, so its
/// directory is deleted then (not at the deadline).
#[test]
fn a_write_abandoned_for_a_newer_checkpoint_is_reported_when_it_ends() {
    let mut net = full_disk_job(10, "ckpt-000001.server-1");
    // Checkpoint 2 is taken while server 1 still writes checkpoint 1's file.
    let result = checkpoint_result(&mut net, "next").unwrap_err();
    assert!(
        result.contains("checkpoint 2 failed") && result.contains(ENOSPC),
        "{result}"
    );
    assert!(net.run_until(SECOND, |n| n
        .disk_faults
        .position("remove", &shown(2))
        .is_some()));
    assert_eq!(net.disk_faults.position("remove", &shown(1)), None);
    net.end_held_writes();
    assert!(
        net.run_until(SECOND, |n| n
            .disk_faults
            .position("remove", &shown(1))
            .is_some()),
        "{:?}",
        net.disk_faults.log
    );
    assert!(
        !holds_any(&net, 1) && !holds_any(&net, 2),
        "{:?}",
        net.disk.keys()
    );
}
