//! Bounded staleness (stale-synchronous parallel, the OSDI'14 parameter
//! server's bounded delay), as a socket-free state machine with no clock:
//! what a server must hold back so that no worker runs more than `s`
//! iterations ahead of the slowest.
//!
//! A worker counts its iterations (`KVWorker::clock()`): at clock `c` it is
//! in iteration `c` (from 0). Its pushes and pulls carry its clock, its
//! pulls its bound `s` too. When it ends an iteration it tells every server
//! its new clock and how many pushes it has sent that server so far
//! ([`Gate::tick`]).
//!
//! Rules (server side, [`Gate`]):
//! - Worker `w` has *finished* clock `k` here once it announced a clock
//!   above `k` and this server applied as many of `w`'s pushes of clocks up
//!   to `k` as `w` had sent it by then (the app answered them:
//!   [`Gate::push_applied`]). Counting by the clock each push carries keeps
//!   this true when a push is resent and arrives after later ones (a later
//!   clock's push never stands in for an earlier one's).
//! - A pull from a worker at clock `c` with bound `s` is admitted once every
//!   worker of the bound finished clock `c - s - 1`; until then it is held
//!   ([`Gate::pull`]) and comes out of the call that makes it admissible.
//!   `s = 0` is synchronous (everyone finished the previous iteration); a
//!   pull without a bound is never held (today's asynchronous behaviour).
//! - The workers of the bound are the live members ([`Gate::set_workers`]):
//!   a dead or departed worker no longer holds anyone back; a worker that
//!   has announced nothing is at clock 0 (a job starts with every worker
//!   there; a worker that joins later sets its clock to the others' first,
//!   or it holds them until it catches up, as the bound says).
//! - Pushes are never held: the slowest worker's pulls are always
//!   admissible once its own earlier pushes are applied, so the gate cannot
//!   deadlock.
//!
//! The core composes it as a component (`component.rs`: the held pulls
//! are data requests held as `Reason::Stale`, the ticks and clocks a
//! pslite-only meta field, `PBMeta.staleness`); it is
//! tested here alone, under reordering, loss and deaths.

use std::collections::BTreeMap;

use pslite_proto::NodeId;

/// What the server knows of one worker's progress.
#[derive(Clone, Debug, Default)]
struct Progress {
    /// Ticks not yet finished here: (the clock announced, the pushes sent
    /// to this server by then), in clock order.
    ticks: Vec<(u64, u64)>,
    /// Clocks this worker finished here (the highest finished, plus one).
    finished: u64,
    /// Its pushes applied here of clocks below `finished`.
    applied_before: u64,
    /// Its pushes applied here of clocks from `finished` on, by clock.
    applied: BTreeMap<u64, u64>,
}

impl Progress {
    /// Pushes applied of clocks below `clock`.
    fn applied_below(&self, clock: u64) -> u64 {
        self.applied_before + self.applied.range(..clock).map(|(_, n)| n).sum::<u64>()
    }

    /// Moves `finished` past every tick whose pushes are all applied.
    fn settle(&mut self) -> bool {
        let before = self.finished;
        while let Some(&(clock, pushes)) = self.ticks.first() {
            if self.applied_below(clock) < pushes {
                break;
            }
            self.ticks.remove(0);
            // A tick to clock `clock` finishes every clock below it.
            self.finished = self.finished.max(clock);
            let later = self.applied.split_off(&self.finished);
            self.applied_before += self.applied.values().sum::<u64>();
            self.applied = later;
        }
        self.finished != before
    }
}

/// A pull held back, with what admits it.
#[derive(Debug)]
struct Held<R> {
    /// Every worker must have finished this many clocks (`c - s`).
    needs: u64,
    request: R,
}

/// A server's gate for one app (see the module docs). `R` is what a held
/// pull is (a message, in the core).
#[derive(Debug)]
pub struct Gate<R> {
    /// Every worker seen, live or not (one that comes back, a false death,
    /// keeps its count of pushes).
    workers: BTreeMap<NodeId, Progress>,
    /// The workers of the bound.
    live: std::collections::BTreeSet<NodeId>,
    held: Vec<Held<R>>,
}

impl<R> Default for Gate<R> {
    fn default() -> Self {
        Gate {
            workers: BTreeMap::new(),
            live: std::collections::BTreeSet::new(),
            held: Vec::new(),
        }
    }
}

impl<R> Gate<R> {
    /// A gate for `workers` (the live members).
    pub fn new(workers: impl IntoIterator<Item = NodeId>) -> Self {
        let mut gate = Gate::default();
        gate.set_workers(workers);
        gate
    }

    /// The workers of the bound are now `live` (a round changed, a worker
    /// died or left, one joined): returns the pulls this admits.
    pub fn set_workers(&mut self, live: impl IntoIterator<Item = NodeId>) -> Vec<R> {
        self.live = live.into_iter().collect();
        for &id in &self.live {
            self.workers.entry(id).or_default();
        }
        self.release()
    }

    /// A new process took `worker`'s id: it starts again at clock 0 (this
    /// admits nothing).
    pub fn restart(&mut self, worker: NodeId) {
        if let Some(p) = self.workers.get_mut(&worker) {
            *p = Progress::default();
        }
    }

    /// Worker `worker` reached clock `clock`, having sent this server
    /// `pushes` pushes in all: returns the pulls this admits. A tick from a
    /// worker outside the bound, or not newer than one already taken, is
    /// ignored. A worker outside the bound that was in it once keeps
    /// counting (it may come back).
    pub fn tick(&mut self, worker: NodeId, clock: u64, pushes: u64) -> Vec<R> {
        let Some(p) = self.workers.get_mut(&worker) else {
            return Vec::new();
        };
        let newest = p.ticks.last().map_or(p.finished, |t| t.0);
        if clock <= newest {
            return Vec::new();
        }
        p.ticks.push((clock, pushes));
        if p.settle() {
            self.release()
        } else {
            Vec::new()
        }
    }

    /// The app answered a push (or push-pull) `worker` sent at `clock`:
    /// returns the pulls this admits.
    pub fn push_applied(&mut self, worker: NodeId, clock: u64) -> Vec<R> {
        let Some(p) = self.workers.get_mut(&worker) else {
            return Vec::new();
        };
        if clock < p.finished {
            p.applied_before += 1;
        } else {
            *p.applied.entry(clock).or_default() += 1;
        }
        if p.settle() {
            self.release()
        } else {
            Vec::new()
        }
    }

    /// A pull from a worker at `clock` with bound `bound` (`None`: no
    /// bound): `Some(request)` to deliver now, `None` if it is held (it
    /// comes out of a later call).
    pub fn pull(&mut self, clock: u64, bound: Option<u64>, request: R) -> Option<R> {
        let Some(s) = bound else {
            return Some(request);
        };
        // Clock c - s - 1 finished: c - s clocks finished.
        let needs = clock.saturating_sub(s);
        if self.floor() >= needs {
            return Some(request);
        }
        self.held.push(Held { needs, request });
        None
    }

    /// Clocks every worker of the bound has finished here (the slowest's).
    pub fn floor(&self) -> u64 {
        self.live
            .iter()
            .filter_map(|id| self.workers.get(id))
            .map(|p| p.finished)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Pulls held back.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The held pulls the floor now admits, in arrival order.
    fn release(&mut self) -> Vec<R> {
        let floor = self.floor();
        if self.held.iter().all(|h| h.needs > floor) {
            return Vec::new();
        }
        let (go, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.needs <= floor);
        self.held = wait;
        go.into_iter().map(|h| h.request).collect()
    }
}

/// A worker's side: its clock, and the pushes it sent each server (for its
/// ticks).
#[derive(Clone, Debug, Default)]
pub struct WorkerClock {
    clock: u64,
    pushes: BTreeMap<NodeId, u64>,
}

impl WorkerClock {
    /// The clock a worker starts at (a worker joining a running job starts
    /// at the others' clock).
    pub fn starting_at(clock: u64) -> Self {
        WorkerClock {
            clock,
            pushes: BTreeMap::new(),
        }
    }

    /// The current clock (what its pulls carry).
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// A push (or push-pull) goes to `server`.
    pub fn pushed(&mut self, server: NodeId) {
        *self.pushes.entry(server).or_default() += 1;
    }

    /// Ends the iteration: the new clock, and for each of `servers` the
    /// tick to send it (its new clock and the pushes sent to it so far).
    pub fn advance(&mut self, servers: &[NodeId]) -> Vec<(NodeId, u64, u64)> {
        self.clock += 1;
        servers
            .iter()
            .map(|&s| (s, self.clock, self.pushes.get(&s).copied().unwrap_or(0)))
            .collect()
    }
}

pub mod component;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn s0_is_synchronous_and_no_bound_never_waits() {
        let mut g = Gate::new([9, 11]);
        // Both at clock 0: pulls of iteration 0 go at once.
        assert_eq!(g.pull(0, Some(0), "a"), Some("a"));
        // Worker 9 pushes, ticks to 1, and pulls at clock 1: it waits for
        // worker 11 to finish iteration 0.
        assert!(g.push_applied(9, 0).is_empty());
        assert!(g.tick(9, 1, 1).is_empty());
        assert_eq!(g.pull(1, Some(0), "b"), None);
        assert_eq!(g.pull(1, None, "async"), Some("async"));
        // Worker 11's tick arrives before its push is applied: not yet.
        assert!(g.tick(11, 1, 1).is_empty());
        assert_eq!(g.held(), 1);
        assert_eq!(g.push_applied(11, 0), vec!["b"]);
        assert_eq!(g.floor(), 1);
    }

    #[test]
    fn a_bound_of_two_lets_a_worker_run_two_iterations_ahead() {
        let mut g = Gate::new([9, 11]);
        for clock in 1..=2 {
            g.push_applied(9, clock - 1);
            g.tick(9, clock, clock);
            // Worker 11 never moves: pulls at clocks 1 and 2 need nothing.
            assert_eq!(g.pull(clock, Some(2), clock), Some(clock));
        }
        g.push_applied(9, 2);
        g.tick(9, 3, 3);
        assert_eq!(g.pull(3, Some(2), 3), None, "clock 0 of worker 11 not done");
        g.push_applied(11, 0);
        assert_eq!(g.tick(11, 1, 1), vec![3]);
    }

    #[test]
    fn a_dead_worker_no_longer_holds_anyone_and_a_newcomer_counts() {
        let mut g = Gate::new([9, 11]);
        g.tick(9, 1, 0);
        assert_eq!(g.pull(1, Some(0), "x"), None);
        assert_eq!(g.set_workers([9]), vec!["x"], "11 died");
        // A newcomer at clock 0 holds pulls beyond the bound until it moves.
        g.set_workers([9, 13]);
        g.tick(9, 2, 0);
        assert_eq!(g.pull(2, Some(0), "y"), None);
        assert_eq!(g.tick(13, 2, 0), vec!["y"]);
        assert_eq!(g.set_workers([9, 13]), Vec::<&str>::new(), "not twice");
        assert_eq!(g.floor(), 2);
        assert_eq!(g.pull(2, Some(0), "z"), Some("z"));
        assert_eq!(g.held(), 0);
    }

    #[test]
    fn a_worker_out_of_the_bound_and_back_keeps_its_count() {
        let mut g = Gate::new([9, 11]);
        // 11 is declared dead: 9 goes on alone.
        g.set_workers([9]);
        g.push_applied(9, 0);
        g.tick(9, 1, 1);
        assert_eq!(g.pull(1, Some(0), "a"), Some("a"));
        // 11 was only slow: its push and tick still count while it is out.
        g.push_applied(11, 0);
        g.tick(11, 1, 1);
        assert_eq!(g.set_workers([9, 11]), Vec::<&str>::new());
        assert_eq!(g.floor(), 1, "11 finished clock 0 while out of the bound");
        // A new process on 11's id starts again.
        g.restart(11);
        assert_eq!(g.floor(), 0);
    }

    #[test]
    fn old_or_foreign_ticks_are_ignored() {
        let mut g = Gate::<()>::new([9]);
        g.tick(9, 3, 0);
        assert_eq!(g.floor(), 3);
        g.tick(9, 2, 0);
        assert_eq!(g.floor(), 3);
        g.tick(77, 10, 0);
        assert_eq!(g.floor(), 3);
    }

    #[test]
    fn a_worker_clock_counts_pushes_per_server() {
        let mut w = WorkerClock::starting_at(5);
        w.pushed(8);
        w.pushed(8);
        w.pushed(10);
        assert_eq!(
            w.advance(&[8, 10, 12]),
            vec![(8, 6, 2), (10, 6, 1), (12, 6, 0)]
        );
        assert_eq!(w.clock(), 6);
    }

    /// One step of a simulated job: which worker acts, and how.
    #[derive(Clone, Debug)]
    enum Step {
        /// Worker `w` (index) takes its next action.
        Act(usize),
        /// The server handles the oldest (or, with `late`, the newest)
        /// message in flight from worker `w`.
        Deliver { w: usize, late: bool },
        /// Worker `w` dies.
        Die(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..4usize).prop_map(Step::Act),
            6 => (0..4usize, any::<bool>()).prop_map(|(w, late)| Step::Deliver { w, late }),
            1 => (0..4usize).prop_map(Step::Die),
        ]
    }

    /// Messages from a worker to the server.
    #[derive(Clone, Debug)]
    enum Msg {
        Push { clock: u64 },
        Tick { clock: u64, pushes: u64 },
        Pull { clock: u64 },
    }

    proptest! {
        /// Four workers iterate (push, pull, tick) against one server under
        /// a bound `s`; messages of one worker are reordered (a resent push
        /// arriving after the tick that follows it) and workers die. Every
        /// pull the gate admits finds every live worker's pushes of clocks
        /// up to `c - s - 1` applied, and once the survivors keep going
        /// every pull is admitted (no deadlock).
        #[test]
        fn the_bound_is_never_exceeded(
            s in 0u64..3,
            steps in proptest::collection::vec(step(), 1..400),
        ) {
            const N: usize = 4;
            let ids: Vec<NodeId> = (0..N as i32).map(|i| 9 + 2 * i).collect();
            let mut gate: Gate<(usize, u64)> = Gate::new(ids.clone());
            let mut alive = [true; N];
            let mut clocks = [WorkerClock::default(), WorkerClock::default(),
                              WorkerClock::default(), WorkerClock::default()];
            // Each worker cycles: push, pull (waits for the admission), tick.
            let mut phase = [0u8; N];
            let mut waiting = [false; N];
            let mut in_flight: Vec<Vec<Msg>> = vec![Vec::new(); N];
            // Ground truth: pushes applied per worker and clock.
            let mut applied: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); N];
            let mut sent: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); N];
            let check = |admitted: &[(usize, u64)], alive: &[bool; N], clocks: &[WorkerClock],
                         applied: &Vec<BTreeMap<u64, u64>>, sent: &Vec<BTreeMap<u64, u64>>| {
                for &(_, c) in admitted {
                    let Some(upto) = c.checked_sub(s + 1) else { continue };
                    for w in 0..N {
                        if !alive[w] { continue; }
                        prop_assert!(clocks[w].clock() > upto, "pull at clock {} admitted with \
                            worker {} still at clock {}", c, w, clocks[w].clock());
                        for k in 0..=upto {
                            let a = applied[w].get(&k).copied().unwrap_or(0);
                            let t = sent[w].get(&k).copied().unwrap_or(0);
                            prop_assert_eq!(a, t, "pull at clock {} admitted with worker {} \
                                missing pushes of clock {}", c, w, k);
                        }
                    }
                }
                Ok(())
            };
            let mut admitted_now = Vec::new();
            let run_steps = steps.into_iter().chain((0..4000).map(|i| {
                // Then everyone alive keeps going, in order, no reordering.
                if i % 2 == 0 { Step::Act(i / 2 % N) } else { Step::Deliver { w: i / 2 % N, late: false } }
            }));
            for st in run_steps {
                match st {
                    Step::Die(w) if alive[w] && alive.iter().filter(|a| **a).count() > 1 => {
                        alive[w] = false;
                        in_flight[w].clear();
                        let live: Vec<NodeId> = (0..N).filter(|&i| alive[i]).map(|i| ids[i]).collect();
                        admitted_now.extend(gate.set_workers(live));
                    }
                    Step::Die(_) => {}
                    Step::Act(w) if alive[w] && !waiting[w] => {
                        let c = clocks[w].clock();
                        match phase[w] {
                            0 => {
                                clocks[w].pushed(8);
                                *sent[w].entry(c).or_default() += 1;
                                in_flight[w].push(Msg::Push { clock: c });
                            }
                            1 => {
                                in_flight[w].push(Msg::Pull { clock: c });
                                waiting[w] = true;
                            }
                            _ => {
                                let ticks = clocks[w].advance(&[8]);
                                in_flight[w].push(Msg::Tick { clock: ticks[0].1, pushes: ticks[0].2 });
                            }
                        }
                        phase[w] = (phase[w] + 1) % 3;
                    }
                    Step::Act(_) => {}
                    Step::Deliver { w, late } if alive[w] && !in_flight[w].is_empty() => {
                        let msg = if late { in_flight[w].pop() } else { Some(in_flight[w].remove(0)) };
                        match msg {
                            Some(Msg::Push { clock }) => {
                                *applied[w].entry(clock).or_default() += 1;
                                admitted_now.extend(gate.push_applied(ids[w], clock));
                            }
                            Some(Msg::Tick { clock, pushes }) => {
                                admitted_now.extend(gate.tick(ids[w], clock, pushes));
                            }
                            Some(Msg::Pull { clock }) => {
                                if let Some(r) = gate.pull(clock, Some(s), (w, clock)) {
                                    admitted_now.push(r);
                                }
                            }
                            None => {}
                        }
                    }
                    Step::Deliver { .. } => {}
                }
                check(&admitted_now, &alive, &clocks, &applied, &sent)?;
                for (w, _) in admitted_now.drain(..) {
                    waiting[w] = false;
                }
            }
            // Liveness: once nothing is reordered and nobody dies, the
            // survivors keep going (no deadlock).
            for w in 0..N {
                prop_assert!(!alive[w] || clocks[w].clock() >= 50,
                    "worker {} is stuck at clock {}", w, clocks[w].clock());
            }
        }
    }
}
