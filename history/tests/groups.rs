//! Requests over several keys (etcd's ranges, delete-ranges and multi-key transactions),
//! recorded as one line per key with a shared group, and reads at a given revision: what the
//! whole check and the incremental one make of them.

use shakedown_history::format::{DeleteAnswer, Kv, ReadAnswer, WriteAnswer};
use shakedown_history::{check, FindingKind, History, Incremental, ModelKind, Operation, Request, Verdict, DEFAULT_BOUND};

fn line(client: u64, group: Option<u64>, call: u64, ret: u64, request: Request) -> Operation {
    Operation { client, member: None, epoch: 0, group, call, ret: Some(ret), request }
}

fn put(key: &str, value: &str, revision: i64) -> Request {
    Request::Put { key: key.into(), value: value.into(), answer: Some(WriteAnswer { revision }) }
}

fn kv(value: &str, mod_revision: i64) -> Option<Kv> {
    Some(Kv { value: value.into(), mod_revision, create_revision: None, version: None })
}

fn get(key: &str, revision: i64, kv: Option<Kv>) -> Request {
    Request::Get { key: key.into(), serializable: false, answer: Some(ReadAnswer { revision, kv }) }
}

fn get_at(key: &str, at: i64, revision: i64, kv: Option<Kv>, keys_only: bool) -> Request {
    Request::GetAt { key: key.into(), at, keys_only, answer: Some(ReadAnswer { revision, kv }) }
}

/// The whole check's verdict, and the incremental check's on the same lines fed in the order
/// they ended: they must agree.
fn judge(ops: Vec<Operation>) -> Verdict {
    let h = History { model: ModelKind::Etcd, ops };
    let whole = check(&h, DEFAULT_BOUND);
    let mut inc = Incremental::new(DEFAULT_BOUND);
    let mut ended = h.ops.clone();
    ended.sort_by_key(|o| o.ret);
    inc.feed(ended);
    let incremental = inc.check(&[], u64::MAX);
    assert_eq!(
        std::mem::discriminant(&whole.verdict),
        std::mem::discriminant(&incremental.verdict),
        "whole {whole:?} incremental {incremental:?}"
    );
    whole.verdict
}

fn kind(v: &Verdict) -> Option<FindingKind> {
    match v {
        Verdict::Violation { first, .. } => Some(first.kind),
        _ => None,
    }
}

#[test]
fn a_transaction_writing_two_keys_at_one_revision_is_not_two_writes_at_one_revision() {
    // One transaction puts /a and /b at revision 2; a range afterwards sees both.
    let ops = vec![
        line(0, Some(7), 10, 20, put("/a", "a1", 2)),
        line(0, Some(7), 10, 20, put("/b", "b1", 2)),
        line(1, Some(8), 30, 40, get("/a", 2, kv("a1", 2))),
        line(1, Some(8), 30, 40, get("/b", 2, kv("b1", 2))),
    ];
    assert_eq!(judge(ops), Verdict::Linearizable);
}

#[test]
fn two_requests_at_one_revision_are_still_caught() {
    let ops = vec![line(0, Some(7), 10, 20, put("/a", "a1", 2)), line(1, Some(9), 10, 20, put("/b", "b1", 2))];
    assert_eq!(kind(&judge(ops)), Some(FindingKind::DuplicateRevision));
    let ops = vec![line(0, Some(7), 10, 20, put("/a", "a1", 2)), line(1, None, 10, 20, put("/b", "b1", 2))];
    assert_eq!(kind(&judge(ops)), Some(FindingKind::DuplicateRevision));
}

#[test]
fn a_range_that_sees_half_of_a_transaction_is_caught() {
    // The transaction wrote /a and /b at revision 2, answered before the range was sent; the
    // range at revision 2 shows /a written and /b absent: no state of the store is that.
    let ops = vec![
        line(0, Some(7), 10, 20, put("/a", "a1", 2)),
        line(0, Some(7), 10, 20, put("/b", "b1", 2)),
        line(1, Some(8), 30, 40, get("/a", 2, kv("a1", 2))),
        line(1, Some(8), 30, 40, get("/b", 2, None)),
    ];
    assert_eq!(kind(&judge(ops)), Some(FindingKind::NotLinearizable));
}

#[test]
fn a_delete_range_deletes_every_key_at_its_one_revision() {
    let del = |key: &str, deleted| Request::Delete { key: key.into(), answer: Some(DeleteAnswer { revision: 4, deleted }) };
    let ok = vec![
        line(0, None, 10, 20, put("/a", "a1", 2)),
        line(0, None, 30, 40, put("/b", "b1", 3)),
        // Its prev_kvs: each key's state just before it, at revision 3.
        line(1, Some(5), 50, 60, get_at("/a", 3, 4, kv("a1", 2), false)),
        line(1, Some(5), 50, 60, del("/a", 1)),
        line(1, Some(5), 50, 60, get_at("/b", 3, 4, kv("b1", 3), false)),
        line(1, Some(5), 50, 60, del("/b", 1)),
        line(2, None, 70, 80, get("/a", 4, None)),
    ];
    assert_eq!(judge(ok.clone()), Verdict::Linearizable);
    // A prev_kv that is not the key's state before the delete.
    let mut wrong = ok.clone();
    wrong[2] = line(1, Some(5), 50, 60, get_at("/a", 3, 4, kv("a0", 2), false));
    assert_eq!(kind(&judge(wrong)), Some(FindingKind::SerializableRead));
    // A key still there after the delete-range was answered.
    let mut back = ok;
    back[6] = line(2, None, 70, 80, get("/a", 4, kv("a1", 2)));
    assert_eq!(kind(&judge(back)), Some(FindingKind::NotLinearizable));
}

#[test]
fn a_read_at_a_revision_must_be_the_state_at_that_revision() {
    let writes = vec![line(0, None, 10, 20, put("/a", "a1", 2)), line(0, None, 30, 40, put("/a", "a2", 5))];
    let with = |read: Request| {
        let mut ops = writes.clone();
        ops.push(line(1, None, 50, 60, read));
        judge(ops)
    };
    // Revision 3 and 4 still hold a1, though a2 was written before the read was sent.
    assert_eq!(with(get_at("/a", 4, 5, kv("a1", 2), false)), Verdict::Linearizable);
    assert_eq!(with(get_at("/a", 5, 5, kv("a2", 5), false)), Verdict::Linearizable);
    assert_eq!(with(get_at("/a", 1, 5, None, false)), Verdict::Linearizable, "before the first write");
    assert_eq!(kind(&with(get_at("/a", 5, 5, kv("a1", 2), false))), Some(FindingKind::SerializableRead), "stale at 5");
    assert_eq!(kind(&with(get_at("/a", 3, 5, None, false))), Some(FindingKind::SerializableRead), "absent at 3");
    // Keys only: the mod revision must be a put's.
    assert_eq!(with(get_at("/a", 4, 5, kv("", 2), true)), Verdict::Linearizable);
    assert_eq!(kind(&with(get_at("/a", 4, 5, kv("", 3), true))), Some(FindingKind::SerializableRead), "no put at 3");
}

#[test]
fn groups_and_reads_at_a_revision_round_trip_through_the_file() {
    let ops = vec![line(0, Some(7), 10, 20, put("/a", "a1", 2)), line(1, None, 30, 40, get_at("/a", 2, 2, kv("", 2), true))];
    let h = History { model: ModelKind::Etcd, ops };
    let text = h.to_jsonl();
    assert!(text.contains("\"group\":7") && text.contains("\"type\":\"get-at\"") && text.contains("\"keys_only\":true"), "{text}");
    assert_eq!(History::parse(&text).unwrap(), h);
}
