use std::time::{Duration, Instant};

use super::*;
use bytes::Bytes;
use pslite_proto::store::{OverLimit, StoreLimit, StoreStatus};

fn t0() -> Instant {
    Instant::now()
}

fn req(op: StoreOp, key: &str) -> StoreMsg {
    StoreMsg::request(op, vec![key.to_string()])
}

fn set(key: &str, value: &str) -> StoreMsg {
    StoreMsg {
        value: Some(Bytes::from(value.to_string())),
        ..req(StoreOp::Set, key)
    }
}

const A: Requester = Requester::Member(9);
const B: Requester = Requester::Member(11);

#[test]
fn set_then_get_answers_at_once() {
    let mut s = StoreHost::new(StoreLimits::default());
    let now = t0();
    let out = s.handle(A, set("k", "v"), now);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].msg.status, StoreStatus::Ok);
    let out = s.handle(B, req(StoreOp::Get, "k"), now);
    assert_eq!(out[0].to, B);
    assert_eq!(out[0].msg.value.as_deref(), Some(&b"v"[..]));
}

#[test]
fn get_waits_for_set_and_times_out_otherwise() {
    let mut s = StoreHost::new(StoreLimits::default());
    let now = t0();
    let mut get = req(StoreOp::Get, "k");
    get.id = 7;
    get.timeout = Some(Duration::from_secs(5));
    assert!(s.handle(B, get.clone(), now).is_empty());
    assert_eq!(s.poll_timeout(), Some(now + Duration::from_secs(5)));
    let out = s.handle(A, set("k", "v"), now + Duration::from_secs(1));
    assert_eq!(out.len(), 2, "the SET's answer and the GET's");
    assert_eq!(out[1].to, B);
    assert_eq!(out[1].msg.id, 7);
    assert_eq!(out[1].msg.value.as_deref(), Some(&b"v"[..]));
    assert!(s.poll_timeout().is_none());

    let mut wait = StoreMsg::request(StoreOp::Wait, vec!["x".into(), "k".into()]);
    wait.timeout = Some(Duration::from_secs(2));
    assert!(s.handle(B, wait, now).is_empty());
    assert!(s.tick(now + Duration::from_secs(1)).is_empty());
    let out = s.tick(now + Duration::from_secs(2));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].msg.status, StoreStatus::Timeout);
    assert_eq!(
        out[0].msg.keys,
        vec!["x".to_string()],
        "names what is missing"
    );
}

#[test]
fn add_counts_and_refuses_non_numbers() {
    let mut s = StoreHost::new(StoreLimits::default());
    let now = t0();
    for i in 1..=5 {
        let mut add = req(StoreOp::Add, "n");
        add.number = 3;
        let out = s.handle(A, add, now);
        assert_eq!(out[0].msg.number, 3 * i);
    }
    assert_eq!(s.value("n").map(|v| &v[..]), Some(&b"15"[..]));
    s.handle(A, set("text", "hello"), now);
    let mut add = req(StoreOp::Add, "text");
    add.number = 1;
    let out = s.handle(A, add, now);
    assert_eq!(out[0].msg.status, StoreStatus::Invalid);
    assert!(out[0]
        .msg
        .error
        .as_deref()
        .unwrap_or("")
        .contains("not a decimal integer"));
    let mut add = req(StoreOp::Add, "n");
    add.number = i64::MAX;
    assert_eq!(s.handle(A, add, now)[0].msg.status, StoreStatus::Invalid);
}

#[test]
fn compare_set_delete_check_num_keys() {
    let mut s = StoreHost::new(StoreLimits::default());
    let now = t0();
    let mut cas = req(StoreOp::CompareSet, "k");
    cas.value = Some(Bytes::from_static(b"1"));
    let out = s.handle(A, cas.clone(), now);
    assert!(out[0].msg.found, "absent key, no expected value: swapped");
    let out = s.handle(A, cas.clone(), now);
    assert!(!out[0].msg.found, "now it exists");
    assert_eq!(out[0].msg.value.as_deref(), Some(&b"1"[..]));
    cas.expected = Some(Bytes::from_static(b"1"));
    cas.value = Some(Bytes::from_static(b"2"));
    assert!(s.handle(A, cas, now)[0].msg.found);
    assert_eq!(s.value("k").map(|v| &v[..]), Some(&b"2"[..]));

    let check = StoreMsg::request(StoreOp::Check, vec!["k".into(), "z".into()]);
    assert!(!s.handle(A, check, now)[0].msg.found);
    let num = req(StoreOp::NumKeys, "").tap_keys(vec![]);
    assert_eq!(s.handle(A, num, now)[0].msg.number, 1);
    assert!(s.handle(A, req(StoreOp::Delete, "k"), now)[0].msg.found);
    assert!(!s.handle(A, req(StoreOp::Delete, "k"), now)[0].msg.found);
    assert!(s.is_empty());
}

trait TapKeys {
    fn tap_keys(self, keys: Vec<String>) -> Self;
}
impl TapKeys for StoreMsg {
    fn tap_keys(mut self, keys: Vec<String>) -> Self {
        self.keys = keys;
        self
    }
}

#[test]
fn watchers_see_every_change_in_order() {
    let mut s = StoreHost::new(StoreLimits::default());
    let now = t0();
    s.handle(B, req(StoreOp::Watch, "k"), now);
    let mut events = Vec::new();
    for msg in [
        set("k", "1"),
        set("k", "2"),
        req(StoreOp::Delete, "k"),
        set("k", "3"),
    ] {
        for r in s.handle(A, msg, now) {
            if r.msg.op == StoreOp::Event {
                assert_eq!(r.to, B);
                events.push((r.msg.version, r.msg.found, r.msg.value));
            }
        }
    }
    assert_eq!(
        events,
        vec![
            (1, true, Some(Bytes::from_static(b"1"))),
            (2, true, Some(Bytes::from_static(b"2"))),
            (3, false, None),
            (4, true, Some(Bytes::from_static(b"3"))),
        ]
    );
    s.handle(B, req(StoreOp::Unwatch, "k"), now);
    assert_eq!(
        s.handle(A, set("k", "4"), now).len(),
        1,
        "no event after UNWATCH"
    );
}

#[test]
fn limits_give_clear_errors() {
    let limits = StoreLimits {
        max_value: 10,
        max_total: 30,
        max_key: 8,
        ..StoreLimits::default()
    };
    let mut s = StoreHost::new(limits);
    let now = t0();
    let out = s.handle(A, set("k", "01234567890"), now);
    assert!(out[0]
        .msg
        .error
        .as_deref()
        .unwrap_or("")
        .contains("over the store's limit of 10"));
    let out = s.handle(A, set("a-very-long-key", "x"), now);
    assert_eq!(out[0].msg.status, StoreStatus::Invalid);
    assert_eq!(
        s.handle(A, set("a", "0123456789"), now)[0].msg.status,
        StoreStatus::Ok
    );
    assert_eq!(
        s.handle(A, set("b", "0123456789"), now)[0].msg.status,
        StoreStatus::Ok
    );
    let out = s.handle(A, set("c", "0123456789"), now);
    assert!(out[0]
        .msg
        .error
        .as_deref()
        .unwrap_or("")
        .contains("delete keys first"));
    assert_eq!(s.len(), 2);
    let out = s.handle(A, StoreMsg::request(StoreOp::Set, vec![]), now);
    assert_eq!(out[0].msg.status, StoreStatus::Invalid, "SET without a key");
}

#[test]
fn forget_drops_waiters_and_watches() {
    let mut s = StoreHost::new(StoreLimits::default());
    let now = t0();
    s.handle(B, req(StoreOp::Watch, "k"), now);
    s.handle(B, req(StoreOp::Watch, "j"), now);
    s.handle(A, req(StoreOp::Watch, "k"), now);
    s.handle(B, req(StoreOp::Get, "k"), now);
    assert_eq!(
        s.forget(&B),
        Forgotten {
            waits: 1,
            watches: 2
        }
    );
    assert!(s.poll_timeout().is_none());
    assert_eq!(s.held_by(&B), Forgotten::default());
    let out = s.handle(A, set("k", "v"), now);
    assert_eq!(out.len(), 2, "the answer and A's event, nothing for B");
    assert!(out.iter().all(|r| r.to == A));
    assert_eq!(s.forget(&B), Forgotten::default(), "twice is harmless");
}

#[test]
fn unwatch_without_a_key_ends_every_watch_of_the_requester() {
    let mut s = StoreHost::new(StoreLimits::default());
    let now = t0();
    for key in ["a", "b", "c"] {
        s.handle(B, req(StoreOp::Watch, key), now);
    }
    s.handle(A, req(StoreOp::Watch, "a"), now);
    let out = s.handle(B, StoreMsg::request(StoreOp::Unwatch, vec![]), now);
    assert_eq!(out[0].msg.status, StoreStatus::Ok);
    assert_eq!(s.watch_count(), 1, "A's watch stays");
}

fn over_limit(out: &[StoreReply]) -> Option<OverLimit> {
    assert_eq!(out[0].msg.status, StoreStatus::Invalid, "{out:?}");
    out[0].msg.limit
}

#[test]
fn every_bound_is_typed_and_names_its_variable() {
    let limits = StoreLimits {
        max_keys: 2,
        max_waits_per_node: 1,
        max_watches_per_node: 2,
        max_keys_per_request: 3,
        ..StoreLimits::default()
    };
    let mut s = StoreHost::new(limits);
    let now = t0();
    s.handle(A, set("a", "1"), now);
    s.handle(A, set("b", "1"), now);
    let o = over_limit(&s.handle(A, set("c", "1"), now)).expect("typed");
    assert_eq!((o.which, o.size, o.limit), (StoreLimit::Keys, 3, 2));
    assert!(o.to_string().contains("PS_STORE_MAX_KEYS"), "{o}");
    assert_eq!(
        s.handle(A, set("a", "2"), now)[0].msg.status,
        StoreStatus::Ok,
        "an existing key may change"
    );

    assert!(s.handle(B, req(StoreOp::Get, "x"), now).is_empty());
    let o = over_limit(&s.handle(B, req(StoreOp::Wait, "y"), now)).expect("typed");
    assert_eq!((o.which, o.limit), (StoreLimit::Waits, 1));
    assert!(o.to_string().contains("PS_STORE_MAX_WAITS"), "{o}");
    assert!(
        s.handle(A, req(StoreOp::Get, "y"), now).is_empty(),
        "the bound is per node"
    );

    s.handle(B, req(StoreOp::Watch, "a"), now);
    s.handle(B, req(StoreOp::Watch, "a"), now);
    s.handle(B, req(StoreOp::Watch, "b"), now);
    let o = over_limit(&s.handle(B, req(StoreOp::Watch, "c"), now)).expect("typed");
    assert_eq!((o.which, o.size, o.limit), (StoreLimit::Watches, 3, 2));
    assert!(o.to_string().contains("PS_STORE_MAX_WATCHES"), "{o}");

    let keys: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
    let o = over_limit(&s.handle(A, StoreMsg::request(StoreOp::Check, keys), now));
    assert_eq!(o.map(|o| o.which), Some(StoreLimit::KeysPerRequest));
}

#[test]
fn admin_watches_get_events_and_end_at_their_lease() {
    let admin = Requester::Admin(Bytes::from_static(&[0, 0, 0, 0, 1]));
    let mut s = StoreHost::new(StoreLimits::default());
    let now = t0();
    let out = s.handle(admin.clone(), req(StoreOp::Watch, "k"), now);
    assert_eq!(out[0].msg.status, StoreStatus::Invalid, "a lease is needed");
    let mut watch = req(StoreOp::Watch, "k");
    watch.timeout = Some(Duration::from_secs(5));
    assert_eq!(
        s.handle(admin.clone(), watch, now)[0].msg.status,
        StoreStatus::Ok
    );
    assert_eq!(s.poll_timeout(), Some(now + Duration::from_secs(5)));
    let out = s.handle(A, set("k", "1"), now + Duration::from_secs(1));
    assert_eq!(out[1].to, admin);
    assert_eq!((out[1].msg.op, out[1].msg.version), (StoreOp::Event, 1));
    s.tick(now + Duration::from_secs(5));
    assert_eq!(s.watch_count(), 0, "the lease ended");
    assert_eq!(
        s.handle(A, set("k", "2"), now).len(),
        1,
        "no event after it"
    );
}

#[test]
fn append_multi_get_multi_set() {
    let limits = StoreLimits {
        max_value: 4,
        ..StoreLimits::default()
    };
    let mut s = StoreHost::new(limits);
    let now = t0();
    let mut mget = StoreMsg::request(StoreOp::MultiGet, vec!["x".into(), "y".into()]);
    mget.id = 3;
    assert!(s.handle(B, mget, now).is_empty(), "waits for both keys");
    let mut mset = StoreMsg::request(StoreOp::MultiSet, vec!["x".into(), "y".into()]);
    mset.values = vec![Bytes::from_static(b"1"), Bytes::from_static(b"2")];
    let out = s.handle(A, mset, now);
    assert_eq!(out.len(), 2, "the MULTI_SET's answer and the MULTI_GET's");
    assert_eq!(out[1].msg.id, 3);
    assert_eq!(
        out[1].msg.values,
        vec![Bytes::from_static(b"1"), Bytes::from_static(b"2")]
    );
    let mut append = req(StoreOp::Append, "x");
    append.value = Some(Bytes::from_static(b"23"));
    assert_eq!(s.handle(A, append.clone(), now)[0].msg.number, 3);
    assert_eq!(s.value("x").map(|v| &v[..]), Some(&b"123"[..]));
    let o = over_limit(&s.handle(A, append, now)).expect("typed");
    assert_eq!((o.which, o.size), (StoreLimit::Value, 5));
    let mut bad = StoreMsg::request(StoreOp::MultiSet, vec!["x".into()]);
    bad.values = vec![];
    assert_eq!(s.handle(A, bad, now)[0].msg.status, StoreStatus::Invalid);
}

#[test]
fn waiting_requests_count_their_keys_against_the_byte_bound() {
    let limits = StoreLimits {
        max_total: 100_000,
        ..StoreLimits::default()
    };
    let mut s = StoreHost::new(limits);
    let now = t0();
    // WAITs of 10 missing 4 KiB keys each (about 41 KB held per request):
    // two fit in 100 KB, the third is refused naming PS_STORE_MAX_BYTES.
    let keys = |n: u8| -> Vec<String> {
        (0..10)
            .map(|i| format!("{n}-{i}-{}", "k".repeat(4090)))
            .collect()
    };
    for n in 0..2 {
        let wait = StoreMsg::request(StoreOp::Wait, keys(n));
        assert!(s.handle(A, wait, now).is_empty(), "waits");
    }
    let wait = StoreMsg::request(StoreOp::Wait, keys(2));
    let o = over_limit(&s.handle(A, wait, now)).expect("refused");
    assert_eq!(o.which, StoreLimit::Bytes);
    assert_eq!(s.waiting(), 2);
    assert!(s.waiting_bytes() <= limits.max_total);
}
