//! The admin client's protocol without sockets: answers complete tickets,
//! deadlines at exact virtual times, unknown and repeated answers dropped,
//! the scheduler going away, refused handshakes.

use std::time::{Duration, Instant};

use pslite_proto::checkpoint::{CheckpointMsg, CheckpointOp};
use pslite_proto::stats::NodeStatus;
use pslite_proto::store::{StoreMsg, StoreOp};
use pslite_proto::{Command, Message, Meta, Node, Role};

use super::*;

const SCHED: &str = "tcp://127.0.0.1:9091";
const SEC: Duration = Duration::from_secs(1);

fn client() -> Admin {
    Admin::new(SCHED.to_string(), false, 7)
}

/// The one request `admin` has to send.
fn sent(admin: &mut Admin) -> Message {
    let mut out = admin.take_output();
    assert_eq!(out.len(), 1, "one request: {out:?}");
    let msg = out.remove(0);
    assert!(msg.meta.request);
    assert_eq!(msg.meta.recver, SCHEDULER);
    msg
}

/// The scheduler's answer to `req` (its frames), changed by `fill`.
fn answer(req: &Message, fill: impl FnOnce(&mut Meta)) -> Vec<Vec<u8>> {
    let mut meta = req.meta.clone();
    meta.request = false;
    fill(&mut meta);
    vec![meta.encode()]
}

fn rows() -> Vec<NodeStatus> {
    let mut me = Node::new(Role::Scheduler, "127.0.0.1", 9091);
    me.id = SCHEDULER;
    vec![NodeStatus {
        node: me,
        last_seen: None,
        dead: false,
        counters: None,
        counters_age: None,
        waiting: false,
        round_rank: None,
    }]
}

fn store_call(op: StoreOp, timeout: Option<Duration>) -> Call {
    let mut req = StoreMsg::request(op, vec!["k".into()]);
    req.timeout = timeout;
    Call::Store(req)
}

#[test]
fn an_answer_completes_the_ticket_it_pairs_with() {
    let (mut a, t0) = (client(), Instant::now());
    let ticket = a.call(Call::Status, 2 * SEC, t0).unwrap();
    let req = sent(&mut a);
    assert_eq!(req.meta.control.cmd, Command::Status);
    assert!(a.outcome(ticket).is_none());
    a.handle(answer(&req, |m| m.status = rows()));
    assert_eq!(a.outcome(ticket).unwrap().unwrap(), Done::Status(rows()));
    a.end_wait(ticket);
    assert!(a.outcome(ticket).is_none(), "the wait is forgotten");
}

#[test]
fn a_store_request_carries_its_timestamp_as_id_and_gets_its_answer() {
    let (mut a, t0) = (client(), Instant::now());
    let ticket = a.call(store_call(StoreOp::Set, None), SEC, t0).unwrap();
    let req = sent(&mut a);
    let store = req.meta.store.clone().unwrap();
    assert_eq!(store.id, req.meta.timestamp as u64);
    let mut reply = store.answer();
    reply.found = true;
    a.handle(answer(&req, |m| m.store = Some(Box::new(reply.clone()))));
    assert_eq!(a.outcome(ticket).unwrap().unwrap(), Done::Store(reply));
}

#[test]
fn a_call_times_out_at_its_deadline_exactly() {
    let (mut a, t0) = (client(), Instant::now());
    let ticket = a.call(Call::Status, 2 * SEC, t0).unwrap();
    assert_eq!(a.poll_timeout(), Some(t0 + 2 * SEC));
    a.tick(t0 + 2 * SEC - Duration::from_nanos(1));
    assert!(a.outcome(ticket).is_none());
    a.tick(t0 + 2 * SEC);
    let err = a.outcome(ticket).unwrap().unwrap_err();
    assert!(
        matches!(&err, AdminError::NoAnswer { timeout, connection: Connection::Pending, .. }
            if *timeout == 2 * SEC),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "no answer from the scheduler at tcp://127.0.0.1:9091 within 2.0 s: the connection was \
         not made in that time: is the host reachable and a pslite scheduler running there? \
         (check DMLC_PS_ROOT_URI / DMLC_PS_ROOT_PORT, or --host/--port)"
    );
    assert_eq!(a.poll_timeout(), None, "nothing more to time out");
}

#[test]
fn a_waiting_store_request_gets_the_grace_only_from_a_scheduler_that_is_there() {
    let t0 = Instant::now();
    let wait = || store_call(StoreOp::Get, Some(SEC));
    // Accepted: the deadline moves by the grace, once.
    let mut a = client();
    a.link_event(LinkEvent::Up);
    let ticket = a.call(wait(), SEC, t0).unwrap();
    a.tick(t0 + SEC);
    assert!(a.outcome(ticket).is_none());
    assert_eq!(a.poll_timeout(), Some(t0 + SEC + ANSWER_GRACE));
    a.tick(t0 + SEC + ANSWER_GRACE);
    let err = a.outcome(ticket).unwrap().unwrap_err();
    assert!(
        err.to_string()
            .contains("within 3.0 s, although it accepted"),
        "{err}"
    );
    // Nothing listening: no grace.
    let mut a = client();
    a.link_event(LinkEvent::Unreachable);
    a.link_event(LinkEvent::Unreachable);
    let ticket = a.call(wait(), SEC, t0).unwrap();
    a.tick(t0 + SEC);
    let err = a.outcome(ticket).unwrap().unwrap_err();
    assert!(
        err.to_string()
            .contains("within 1.0 s: nothing accepted the connection (2 attempts)"),
        "{err}"
    );
    // A request that does not wait on the scheduler: no grace either.
    let mut a = client();
    a.link_event(LinkEvent::Up);
    let ticket = a.call(store_call(StoreOp::Get, None), SEC, t0).unwrap();
    a.tick(t0 + SEC);
    assert!(a.outcome(ticket).is_some());
}

#[test]
fn unknown_repeated_late_and_garbled_answers_are_dropped() {
    let (mut a, t0) = (client(), Instant::now());
    let ticket = a.call(Call::Status, SEC, t0).unwrap();
    let req = sent(&mut a);
    let ts = req.meta.timestamp;
    // Another timestamp, another command, a request, garbage, nothing.
    a.handle(answer(&req, |m| m.timestamp = ts.wrapping_add(1)));
    a.handle(answer(&req, |m| m.control.cmd = Command::Store));
    a.handle(answer(&req, |m| m.request = true));
    a.handle(vec![b"not a meta".to_vec()]);
    a.handle(vec![]);
    assert!(a.outcome(ticket).is_none());
    // The first answer wins; a repeat does not replace it.
    a.handle(answer(&req, |m| m.status = rows()));
    a.handle(answer(&req, |_| {}));
    assert_eq!(a.outcome(ticket).unwrap().unwrap(), Done::Status(rows()));
    a.end_wait(ticket);
    // After the wait ended: dropped, nothing kept.
    let late = a.call(Call::Status, SEC, t0).unwrap();
    let next = sent(&mut a);
    a.handle(answer(&req, |m| m.status = rows()));
    assert!(
        a.outcome(late).is_none(),
        "an old answer does not pair with a new call"
    );
    a.handle(answer(&next, |_| {}));
    assert_eq!(a.outcome(late).unwrap().unwrap(), Done::Status(vec![]));
}

#[test]
fn an_answer_without_what_was_asked_fails_as_no_answer() {
    let (mut a, t0) = (client(), Instant::now());
    let ticket = a.call(store_call(StoreOp::Get, None), SEC, t0).unwrap();
    let req = sent(&mut a);
    a.handle(answer(&req, |m| m.store = None));
    let err = a.outcome(ticket).unwrap().unwrap_err();
    assert!(matches!(err, AdminError::NoAnswer { .. }), "{err:?}");
}

#[test]
fn the_scheduler_going_away_fails_the_calls_waiting_only() {
    let (mut a, t0) = (client(), Instant::now());
    // Closed before it was ever up: ZeroMQ tries again, nothing fails.
    let ticket = a.call(Call::Status, SEC, t0).unwrap();
    a.link_event(LinkEvent::Down);
    assert!(a.outcome(ticket).is_none());
    a.link_event(LinkEvent::Up);
    assert_eq!(a.connection(), Connection::Accepted);
    let answered = a.call(Call::Status, SEC, t0).unwrap();
    let req = a.take_output().pop().unwrap();
    a.handle(answer(&req, |_| {}));
    a.link_event(LinkEvent::Down);
    let err = a.outcome(ticket).unwrap().unwrap_err();
    assert_eq!(
        err.to_string(),
        "the scheduler at tcp://127.0.0.1:9091 closed the connection (it stopped or died)"
    );
    assert!(
        a.outcome(answered).unwrap().is_ok(),
        "its answer came first"
    );
    // A call made after it: waits (ZeroMQ connects again).
    let after = a.call(Call::Status, SEC, t0 + SEC).unwrap();
    assert!(a.outcome(after).is_none());
}

#[test]
fn a_refused_handshake_fails_the_waits_and_every_later_call() {
    let (mut a, t0) = (Admin::new(SCHED.into(), true, 1), Instant::now());
    let ticket = a.call(Call::Status, SEC, t0).unwrap();
    a.handshake_failed(Handshake::TokenRefused(400));
    let want = "the scheduler at tcp://127.0.0.1:9091 refused this client's PS_AUTH_TOKEN \
                (status 400): set PS_AUTH_TOKEN to the cluster's token";
    let err = a.outcome(ticket).unwrap().unwrap_err();
    assert_eq!(err.to_string(), want);
    let err = a.call(Call::Status, SEC, t0).unwrap_err();
    assert_eq!(err.to_string(), want);
    assert!(
        a.take_output().len() == 1,
        "only the first request went out"
    );
}

#[test]
fn dropped_handshakes_mean_a_token_only_for_a_client_without_one() {
    let t0 = Instant::now();
    for has_token in [false, true] {
        let mut a = Admin::new(SCHED.into(), has_token, 1);
        let ticket = a.call(Call::Status, SEC, t0).unwrap();
        for _ in 0..4 {
            a.handshake_failed(Handshake::Dropped);
        }
        assert!(a.outcome(ticket).is_none());
        a.handshake_failed(Handshake::Dropped);
        assert_eq!(a.connection(), Connection::Dropped(5));
        match a.outcome(ticket) {
            Some(Err(AdminError::Refused { detail })) => {
                assert!(!has_token);
                assert!(detail.contains("5 times in a row: it requires a PS_AUTH_TOKEN"));
            }
            None => assert!(has_token),
            other => panic!("{other:?}"),
        }
    }
    let mut a = Admin::new(SCHED.into(), false, 1);
    a.handshake_failed(Handshake::MechanismMismatch);
    let err = a.call(Call::Status, SEC, t0).unwrap_err();
    assert!(err
        .to_string()
        .contains("requires a PS_AUTH_TOKEN and this client presented none"));
    let mut a = Admin::new(SCHED.into(), true, 1);
    a.handshake_failed(Handshake::MechanismMismatch);
    let err = a.call(Call::Status, SEC, t0).unwrap_err();
    assert!(err
        .to_string()
        .contains("this client presents one: unset PS_AUTH_TOKEN"));
}

#[test]
fn a_checkpoint_is_accepted_then_its_result_comes_with_the_same_timestamp() {
    let (mut a, t0) = (client(), Instant::now());
    let ticket = a
        .call(Call::Checkpoint { label: "x".into() }, SEC, t0)
        .unwrap();
    let req = sent(&mut a);
    assert_eq!(req.meta.checkpoint.as_ref().unwrap().label, "x");
    let mut accepted = CheckpointMsg::new(CheckpointOp::Accepted, 3);
    accepted.label = "x".into();
    let acceptance = answer(&req, |m| m.checkpoint = Some(Box::new(accepted.clone())));
    a.handle(acceptance.clone());
    let done = a.outcome(ticket).unwrap().unwrap();
    let (request, answer_) = done.checkpoint().unwrap();
    assert_eq!((request, &answer_), (req.meta.timestamp as u64, &accepted));
    a.end_wait(ticket);
    let result = a
        .call(Call::CheckpointResult { request }, 10 * SEC, t0)
        .unwrap();
    assert!(
        a.take_output().is_empty(),
        "the result is waited for, not asked"
    );
    a.handle(acceptance);
    assert!(
        a.outcome(result).is_none(),
        "a repeated acceptance is no result"
    );
    let written = CheckpointMsg::new(CheckpointOp::Result, 3);
    a.handle(answer(&req, |m| {
        m.checkpoint = Some(Box::new(written.clone()))
    }));
    let (_, got) = a.outcome(result).unwrap().unwrap().checkpoint().unwrap();
    assert_eq!(got, written);
    // Not written in time: no result.
    let late = a
        .call(Call::CheckpointResult { request: 9 }, 10 * SEC, t0)
        .unwrap();
    a.tick(t0 + 10 * SEC);
    assert!(matches!(
        a.outcome(late),
        Some(Err(AdminError::NoAnswer { .. }))
    ));
}

#[test]
fn store_events_go_to_a_waiter_or_queue_and_a_wait_for_none_ends_empty() {
    let (mut a, t0) = (client(), Instant::now());
    let event = |version| {
        let mut e = StoreMsg::request(StoreOp::Event, vec!["k".into()]);
        e.version = version;
        let mut msg = Message::control(Command::Store, SCHEDULER);
        msg.meta.store = Some(Box::new(e));
        msg.meta.request = true;
        answer(&msg, |_| {})
    };
    // One came before anyone waited: the next wait has it at once.
    a.handle(event(1));
    let first = a.next_event(SEC, t0);
    let Some(Ok(Done::Store(e))) = a.outcome(first) else {
        panic!("{:?}", a.outcome(first))
    };
    assert_eq!(e.version, 1);
    a.end_wait(first);
    // One comes while a caller waits.
    let second = a.next_event(SEC, t0);
    assert!(a.outcome(second).is_none());
    a.handle(event(2));
    assert!(matches!(a.outcome(second), Some(Ok(Done::Store(e))) if e.version == 2));
    a.end_wait(second);
    // None comes: done, empty, at the deadline.
    let third = a.next_event(SEC, t0);
    a.tick(t0 + SEC);
    assert_eq!(a.outcome(third).unwrap().unwrap(), Done::Ok);
    // An event is no answer to a store request.
    let get = a.call(store_call(StoreOp::Get, None), SEC, t0).unwrap();
    a.handle(event(3));
    assert!(a.outcome(get).is_none());
}

#[test]
fn a_member_call_is_refused_without_sending() {
    let (mut a, t0) = (client(), Instant::now());
    let err = a.call(Call::Leave, SEC, t0).unwrap_err();
    assert!(
        matches!(err, AdminError::Van(VanError::Setup { .. })),
        "{err:?}"
    );
    assert!(a.take_output().is_empty());
}

#[test]
fn an_outcome_of_another_call_is_an_internal_error_not_the_users() {
    let status = Done::Status(Vec::new());
    let err = status
        .store()
        .expect_err("a status table is no store answer");
    assert!(matches!(err, VanError::Internal(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("a store call ended with a status table") && text.contains("a bug in pslite"),
        "{text}"
    );
    assert!(matches!(Done::Ok.status(), Err(VanError::Internal(_))));
    assert!(matches!(Done::Ok.checkpoint(), Err(VanError::Internal(_))));
    assert!(Done::Status(Vec::new()).status().is_ok());
}
