//! Bounded staleness in the in-memory network: workers that push, pull
//! under a bound and tick, one of them slow; every pull's answer must show
//! every live worker's pushes of clocks up to `c - s - 1` (the bound never
//! exceeded), under packet loss with resends and a worker's death, and the
//! survivors must keep going (nothing hangs).

use pslite_proto::staleness::StalenessMsg;

use super::*;

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);

fn config(resend: bool) -> VanConfig {
    VanConfig {
        heartbeat_interval: Some(MS * 100),
        heartbeat_timeout: Some(MS * 500),
        recovery_timeout: SECOND,
        resend_timeout: resend.then_some(MS * 50),
        max_resends: 1000,
        ..VanConfig::default()
    }
}

fn words(v: &[u64]) -> bytes::Bytes {
    v.iter()
        .flat_map(|w| w.to_le_bytes())
        .collect::<Vec<u8>>()
        .into()
}

/// One simulated worker: it pushes 1 to its own key, pulls every worker's
/// key under the bound, and ticks once the pull is answered.
#[derive(Debug)]
struct Worker {
    index: usize,
    key: u64,
    clock: u64,
    pushes: u64,
    /// The pull in flight (its timestamp).
    pulling: Option<i32>,
    ts: i32,
    alive: bool,
}

struct Job {
    workers: Vec<Worker>,
    server: usize,
    s: u64,
    /// Whether pulls carry the bound (without: today's asynchronous pulls).
    bounded: bool,
    /// The largest clock gap seen in the answers (clock - fewest pushes).
    max_gap: u64,
}

impl Job {
    fn new(net: &Network, workers: usize, s: u64) -> Job {
        let first = net.nodes.len() - workers;
        Job {
            workers: (0..workers)
                .map(|w| Worker {
                    index: first + w,
                    key: w as u64,
                    clock: 0,
                    pushes: 0,
                    pulling: None,
                    ts: 0,
                    alive: true,
                })
                .collect(),
            server: 1,
            s,
            bounded: true,
            max_gap: 0,
        }
    }

    fn request(&self, net: &Network, w: usize, ts: i32) -> Message {
        let mut msg = Message::default();
        msg.meta.app_id = 0;
        msg.meta.customer_id = 0;
        msg.meta.request = true;
        msg.meta.timestamp = ts;
        msg.meta.recver = net.id(self.server);
        msg.meta.sender = net.id(self.workers[w].index);
        msg
    }

    /// Worker `w` takes its next step, if it is not waiting for a pull.
    fn act(&mut self, net: &mut Network, w: usize) {
        let worker = &self.workers[w];
        if !worker.alive || worker.pulling.is_some() {
            return;
        }
        let clock = worker.clock;
        let all: Vec<u64> = self.workers.iter().map(|w| w.key).collect();
        // Push 1 to its key.
        let mut push = self.request(net, w, self.workers[w].ts);
        push.meta.push = true;
        push.data = vec![words(&[self.workers[w].key]), words(&[1])];
        push.meta.staleness = Some(Box::new(StalenessMsg {
            clock,
            bound: None,
            pushes: None,
        }));
        net.send(self.workers[w].index, push);
        // Pull every key under the bound.
        let mut pull = self.request(net, w, self.workers[w].ts + 1);
        pull.meta.pull = true;
        pull.data = vec![words(&all)];
        pull.meta.staleness = Some(Box::new(StalenessMsg {
            clock,
            bound: self.bounded.then_some(self.s),
            pushes: None,
        }));
        net.send(self.workers[w].index, pull);
        let worker = &mut self.workers[w];
        worker.pushes += 1;
        worker.pulling = Some(worker.ts + 1);
        worker.ts += 3;
    }

    /// Reads answered pulls: checks the bound, then the worker ticks.
    fn answers(&mut self, net: &mut Network) {
        for w in 0..self.workers.len() {
            let Some(ts) = self.workers[w].pulling else {
                continue;
            };
            let i = self.workers[w].index;
            let Some(answer) = net.nodes[i]
                .delivered
                .iter()
                .find(|m| m.meta.timestamp == ts && m.meta.pull)
                .cloned()
            else {
                continue;
            };
            let clock = self.workers[w].clock;
            let keys = app::u64s(&answer.data[0]);
            let sums = app::i64s(&answer.data[1]);
            for (k, sum) in keys.iter().zip(sums) {
                let other = &self.workers[*k as usize];
                if !other.alive {
                    continue;
                }
                if !self.bounded {
                    continue;
                }
                // Pushes of clocks 0..=c-s-1 applied: at least c - s.
                let needed = clock.saturating_sub(self.s);
                assert!(
                    sum as u64 >= needed,
                    "worker {w}'s pull at clock {clock} (s = {}) saw worker {k} with {sum} \
                     pushes applied (needs {needed})",
                    self.s
                );
                assert!(
                    other.clock + self.s >= clock,
                    "worker {w} at clock {clock} got its pull with worker {k} at clock {}",
                    other.clock
                );
                self.max_gap = self.max_gap.max(clock.saturating_sub(sum as u64));
            }
            // Tick.
            let mut tick = self.request(net, w, self.workers[w].ts + 2);
            let worker = &mut self.workers[w];
            worker.clock += 1;
            worker.pulling = None;
            tick.meta.staleness = Some(Box::new(StalenessMsg {
                clock: worker.clock,
                bound: None,
                pushes: Some(worker.pushes),
            }));
            net.nodes[i].delivered.clear();
            net.send(i, tick);
        }
    }

    /// Runs until every live worker reached `clocks`; worker `slow` acts
    /// once every `every` rounds. False if the limit of virtual time
    /// passed first.
    fn run(
        &mut self,
        net: &mut Network,
        clocks: u64,
        slow: usize,
        every: u64,
        limit: Duration,
    ) -> bool {
        let end = net.now + limit;
        let mut round = 0u64;
        while net.now < end {
            if self.workers.iter().all(|w| !w.alive || w.clock >= clocks) {
                return true;
            }
            for w in 0..self.workers.len() {
                if (w != slow || round % every == 0) && self.workers[w].clock < clocks {
                    self.act(net, w);
                }
            }
            net.run_for(MS * 2);
            self.answers(net);
            round += 1;
        }
        false
    }
}

fn cluster(workers: i32, resend: bool, seed: u64) -> Network {
    let mut net = Network::cluster(1, workers, config(resend), seed);
    net.nodes[1].app = Some(SumApp::default());
    assert!(net.form(SECOND * 10), "the cluster did not form");
    net
}

/// The server's counters: pulls held, the largest gap let through.
fn server_staleness(net: &Network) -> (u64, u64) {
    net.nodes[1].core.counters().staleness()
}

#[test]
fn s0_is_synchronous_and_a_slow_worker_holds_the_others_within_the_bound() {
    for s in [0, 2] {
        let mut net = cluster(3, false, 1);
        let mut job = Job::new(&net, 3, s);
        assert!(job.run(&mut net, 20, 0, 5, SECOND * 60), "the job hung");
        let (held, gap) = server_staleness(&net);
        assert!(held > 0, "s = {s}: the slow worker never held anyone back");
        assert_eq!(gap, s, "s = {s}: the fast workers run exactly s ahead");
        assert!(job.max_gap <= s);
    }
}

#[test]
fn the_bound_holds_under_loss_with_resends() {
    for seed in 0..4 {
        let mut net = cluster(3, true, seed);
        net.faults = Faults {
            drop: 0.1,
            duplicate: 0.05,
            max_delay: MS * 20,
        };
        let mut job = Job::new(&net, 3, 1);
        assert!(
            job.run(&mut net, 15, 2, 3, SECOND * 120),
            "seed {seed}: hung"
        );
        assert!(server_staleness(&net).1 <= 1);
    }
}

#[test]
fn a_dead_worker_leaves_the_bound_and_the_others_go_on() {
    let mut cfg = config(false);
    // A long recovery window: the survivors must not wait it out.
    cfg.recovery_timeout = SECOND * 30;
    let mut net = Network::cluster(1, 3, cfg, 7);
    net.nodes[1].app = Some(SumApp::default());
    assert!(net.form(SECOND * 10), "the cluster did not form");
    let mut job = Job::new(&net, 3, 1);
    assert!(job.run(&mut net, 5, 0, 1, SECOND * 30));
    // Worker 0 dies: the others are held until the scheduler declares it
    // dead, then go on without it (before its recovery window ends).
    let killed_at = net.now;
    net.kill(job.workers[0].index);
    job.workers[0].alive = false;
    assert!(
        job.run(&mut net, 30, 0, 1, SECOND * 20),
        "the survivors hung"
    );
    assert!(job.workers[1].clock >= 30 && job.workers[2].clock >= 30);
    assert!(net.now.duration_since(killed_at) < SECOND * 20);
    assert!(server_staleness(&net).1 <= 1);
}

#[test]
fn a_job_without_a_bound_is_never_held() {
    let mut net = cluster(2, false, 3);
    let mut job = Job::new(&net, 2, 0);
    job.bounded = false;
    assert!(job.run(&mut net, 10, 0, 4, SECOND * 30));
    assert_eq!(server_staleness(&net).0, 0);
}
