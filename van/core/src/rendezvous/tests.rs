use super::*;

const SECOND: Duration = Duration::from_secs(1);

fn rdzv(min: usize, max: usize, now: Instant) -> Rendezvous {
    Rendezvous::new(
        RendezvousConfig {
            min,
            max,
            last_call: SECOND * 5,
            timeout: SECOND * 60,
        },
        now,
    )
}

fn began(number: u64, members: &[NodeId]) -> RendezvousEvent {
    RendezvousEvent::RoundBegan {
        number,
        members: members.to_vec(),
    }
}

#[test]
fn the_first_round_begins_at_once_with_max_workers() {
    let t = Instant::now();
    let mut r = rdzv(2, 3, t);
    assert!(r.join(9, t).is_empty());
    assert!(
        r.join(11, t).is_empty(),
        "min reached: the last call starts"
    );
    assert_eq!(r.join(13, t), vec![began(0, &[9, 11, 13])]);
    assert_eq!(r.rank(13), Some(2));
    assert_eq!(r.poll_timeout(), None);
}

#[test]
fn with_min_workers_the_round_begins_after_the_last_call_and_takes_late_joiners() {
    let t = Instant::now();
    let mut r = rdzv(2, 4, t);
    r.join(9, t);
    r.join(11, t + SECOND);
    assert_eq!(r.poll_timeout(), Some(t + SECOND * 6));
    assert!(r.tick(t + SECOND * 5).is_empty());
    assert!(
        r.join(13, t + SECOND * 5).is_empty(),
        "in the last call: in the round"
    );
    assert_eq!(r.tick(t + SECOND * 6), vec![began(0, &[9, 11, 13])]);
}

#[test]
fn a_worker_joining_a_running_round_waits_and_enters_the_next() {
    let t = Instant::now();
    let mut r = rdzv(2, 4, t);
    r.join(9, t);
    r.join(11, t);
    r.tick(t + SECOND * 5);
    assert_eq!(r.round(), Some((0, &[9, 11][..])));
    assert!(r.join(13, t + SECOND * 10).is_empty());
    assert_eq!(r.waiting(), &[13]);
    assert_eq!(r.round(), Some((0, &[9, 11][..])), "the round goes on");
    let now = t + SECOND * 20;
    let events = r.admit_waiting(now);
    assert_eq!(
        events,
        vec![
            RendezvousEvent::RoundEnded {
                number: 0,
                reason: EndReason::Joiners(vec![13]),
            },
            began(1, &[9, 11, 13]),
        ],
        "later rounds have no last call"
    );
    assert!(r.admit_waiting(now).is_empty(), "nobody waits");
}

#[test]
fn a_dead_member_ends_the_round_and_the_survivors_are_re_ranked() {
    let t = Instant::now();
    let mut r = rdzv(2, 3, t);
    for id in [9, 11, 13] {
        r.join(id, t);
    }
    let events = r.leave(9, t + SECOND);
    assert_eq!(
        events,
        vec![
            RendezvousEvent::RoundEnded {
                number: 0,
                reason: EndReason::Left(9),
            },
            began(1, &[11, 13]),
        ]
    );
    assert_eq!((r.rank(11), r.rank(13)), (Some(0), Some(1)));
}

#[test]
fn a_death_leaves_joiners_waiting_unless_below_min() {
    let t = Instant::now();
    let mut r = rdzv(2, 3, t);
    for id in [9, 11, 13] {
        r.join(id, t);
    }
    r.join(15, t);
    let events = r.leave(11, t);
    assert_eq!(events[1], began(1, &[9, 13]), "enough survivors: 15 waits");
    assert_eq!(r.waiting(), &[15]);
    let events = r.leave(9, t);
    assert_eq!(
        events[1],
        began(2, &[13, 15]),
        "below min: the joiner is taken in"
    );
}

#[test]
fn below_min_the_job_fails_at_the_deadline_unless_someone_joins() {
    let t = Instant::now();
    let mut r = rdzv(2, 4, t);
    r.join(9, t);
    assert_eq!(r.poll_timeout(), Some(t + SECOND * 60));
    assert!(r.tick(t + SECOND * 59).is_empty());
    assert_eq!(
        r.tick(t + SECOND * 60),
        vec![RendezvousEvent::Failed {
            have: 1,
            min: 2,
            waited: SECOND * 60,
        }]
    );
    assert!(r.has_failed());
    assert!(r.join(11, t + SECOND * 61).is_empty(), "too late");

    // After a death below min, the deadline counts from the round's end.
    let mut r = rdzv(2, 2, t);
    r.join(9, t);
    r.join(11, t);
    r.leave(9, t + SECOND * 100);
    assert!(r.tick(t + SECOND * 159).is_empty());
    r.join(13, t + SECOND * 159);
    assert_eq!(r.tick(t + SECOND * 159), Vec::new());
    assert_eq!(r.round(), Some((1, &[11, 13][..])));
}

#[test]
fn waiting_workers_that_die_leave_no_trace_and_extra_joiners_wait() {
    let t = Instant::now();
    let mut r = rdzv(1, 2, t);
    r.join(9, t);
    r.join(11, t);
    r.join(13, t);
    r.join(15, t);
    assert!(r.leave(13, t).is_empty(), "a waiting worker leaves quietly");
    assert_eq!(r.waiting(), &[15]);
    assert!(r.join(9, t).is_empty(), "joining twice changes nothing");
    let events = r.leave(9, t);
    assert_eq!(events[1], began(1, &[11]));
    assert_eq!(r.waiting(), &[15], "admitted at the next safe point");
    // More joiners than max when a round forms: the last wait.
    let mut r = rdzv(1, 2, t);
    r.join(9, t);
    r.tick(t + SECOND * 5);
    r.join(11, t);
    r.join(13, t);
    r.join(15, t);
    let events = r.admit_waiting(t);
    assert_eq!(events[1], began(1, &[9, 11]));
    assert_eq!(r.waiting(), &[13, 15]);
    // The round is full: later safe points leave it alone (no new round
    // of the same members at every barrier) until a place frees up.
    assert!(r.admit_waiting(t).is_empty());
    assert_eq!(r.round(), Some((1, &[9, 11][..])));
    let events = r.leave(11, t);
    assert_eq!(events[1], began(2, &[9]));
    assert_eq!(r.admit_waiting(t)[1], began(3, &[9, 13]));
    assert_eq!(r.waiting(), &[15]);
}

#[derive(Clone, Debug)]
enum Step {
    Join(NodeId),
    Leave(NodeId),
    Admit,
    Wait(u64),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let id = (0..8i32).prop_map(|i| 9 + 2 * i);
    prop_oneof![
        id.clone().prop_map(Step::Join),
        id.prop_map(Step::Leave),
        Just(Step::Admit),
        (0..8000u64).prop_map(Step::Wait),
    ]
}

proptest::proptest! {
    /// Whatever joins, leaves and waits happen: a running round has between
    /// min and max distinct members, none of them waiting; rounds are
    /// numbered 0, 1, 2... and each one after the first begins only after
    /// the previous one ended; nothing happens after a failure.
    #[test]
    fn rounds_keep_their_bounds_and_order(
        min in 1usize..4,
        extra in 0usize..3,
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let t = Instant::now();
        let max = min + extra;
        let mut r = rdzv(min, max, t);
        let mut now = t;
        let mut next_round = 0;
        let mut running = false;
        let mut failed = false;
        for s in steps {
            let events = match s {
                Step::Join(id) => r.join(id, now),
                Step::Leave(id) => r.leave(id, now),
                Step::Admit => r.admit_waiting(now),
                Step::Wait(ms) => {
                    now += Duration::from_millis(ms * 10);
                    r.tick(now)
                }
            };
            for e in events {
                proptest::prop_assert!(!failed, "an event after the failure: {e:?}");
                match e {
                    RendezvousEvent::RoundBegan { number, members } => {
                        proptest::prop_assert!(!running);
                        proptest::prop_assert_eq!(number, next_round);
                        next_round += 1;
                        running = true;
                        proptest::prop_assert!((min..=max).contains(&members.len()));
                        let mut unique = members.clone();
                        unique.sort_unstable();
                        unique.dedup();
                        proptest::prop_assert_eq!(unique.len(), members.len());
                    }
                    RendezvousEvent::RoundEnded { number, .. } => {
                        proptest::prop_assert!(running);
                        proptest::prop_assert_eq!(number + 1, next_round);
                        running = false;
                    }
                    RendezvousEvent::Failed { have, .. } => {
                        proptest::prop_assert!(!running && have < min);
                        failed = true;
                    }
                }
            }
            if let Some((_, members)) = r.round() {
                proptest::prop_assert!(members.iter().all(|m| !r.waiting().contains(m)));
            }
            proptest::prop_assert_eq!(r.round().is_some(), running);
        }
    }
}
