use super::*;

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
    s.handle(B, req(StoreOp::Get, "k"), now);
    s.forget(&B);
    assert!(s.poll_timeout().is_none());
    assert_eq!(s.handle(A, set("k", "v"), now).len(), 1);
}
