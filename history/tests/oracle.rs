//! The checker against brute force on small random histories: the oracle tries every order of
//! the operations that real time allows.
//!
//! Histories are drawn from a true sequential execution (each operation takes effect at its own
//! instant inside its interval), then some answers are corrupted and some made unknown, so both
//! linearizable and non-linearizable histories come out.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use shakedown_history::format::{CasAnswer, DeleteAnswer, Done, Kv, ReadAnswer, RegisterRead, Then, TxnAnswer, WriteAnswer};
use shakedown_history::search::{linearizable, Model, Search, Timed};
use shakedown_history::{check, History, ModelKind, Operation, Request, Verdict, DEFAULT_BOUND};

/// Every order of `ops` that real time allows (`a` answered before `b` was sent ⇒ `a` first).
fn orders(ops: &[Operation]) -> Vec<Vec<usize>> {
    fn ret(o: &Operation) -> u64 {
        o.ret.filter(|_| o.request.answered()).unwrap_or(u64::MAX)
    }
    fn go(ops: &[Operation], used: &mut Vec<bool>, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == ops.len() {
            out.push(cur.clone());
            return;
        }
        for i in 0..ops.len() {
            // i may come next if no unplaced operation was answered before i was sent.
            if used[i] || (0..ops.len()).any(|j| !used[j] && j != i && ret(&ops[j]) < ops[i].call) {
                continue;
            }
            used[i] = true;
            cur.push(i);
            go(ops, used, cur, out);
            cur.pop();
            used[i] = false;
        }
    }
    let mut out = Vec::new();
    go(ops, &mut vec![false; ops.len()], &mut Vec::new(), &mut out);
    out
}

/// Whether some allowed order takes the nondeterministic `step` from `init` through every op.
fn brute_force<S: Clone>(ops: &[Operation], init: S, step: impl Fn(&S, &Operation) -> Vec<S>) -> bool {
    orders(ops).into_iter().any(|order| {
        let mut states = vec![init.clone()];
        for i in order {
            states = states.iter().flat_map(|s| step(s, &ops[i])).collect();
            if states.is_empty() {
                return false;
            }
        }
        true
    })
}

/// Operation `k`, taking effect at `point`, sent up to 149 before and answered up to 149 after
/// it, on coarse instants: many calls and returns fall on the same one.
fn around(k: usize, point: u64, before: u8, after: u8, request: Request) -> Operation {
    Operation {
        client: k as u64 % 3,
        member: None,
        epoch: 0,
        group: None,
        call: (point - u64::from(before % 150)) / 50 * 50,
        ret: Some((point + u64::from(after % 150)).div_ceil(50) * 50),
        request,
    }
}

// ---- registers ----

type Regs = BTreeMap<String, Option<i64>>;

fn int(s: &shakedown_history::format::Scalar) -> i64 {
    match s {
        shakedown_history::format::Scalar::Int(n) => *n,
        shakedown_history::format::Scalar::Str(_) => unreachable!("the tests write numbers"),
    }
}

fn register_step(s: &Regs, op: &Operation) -> Vec<Regs> {
    let key = op.request.key().to_string();
    let cur = s.get(&key).copied().flatten();
    let with = |v: i64| {
        let mut n = s.clone();
        n.insert(key.clone(), Some(v));
        n
    };
    match &op.request {
        Request::Read { answer: None, .. } => vec![s.clone()],
        Request::Read { answer: Some(a), .. } => (a.value.as_ref().map(int) == cur).then(|| s.clone()).into_iter().collect(),
        Request::Write { value, answer, .. } => {
            if answer.is_some() {
                vec![with(int(value))]
            } else {
                vec![s.clone(), with(int(value))]
            }
        }
        Request::Cas { from, to, answer, .. } => {
            let holds = cur == Some(int(from));
            match answer {
                Some(CasAnswer { ok: true }) => holds.then(|| with(int(to))).into_iter().collect(),
                Some(CasAnswer { ok: false }) => (!holds).then(|| s.clone()).into_iter().collect(),
                None if holds => vec![s.clone(), with(int(to))],
                None => vec![s.clone()],
            }
        }
        _ => unreachable!(),
    }
}

fn register_history(raw: Vec<(u8, u8, u8, u8, u8, u8)>) -> History {
    // (kind, key, value, call slack, return slack, twist)
    let mut truth: BTreeMap<String, Option<i64>> = BTreeMap::new();
    let mut ops = Vec::new();
    for (k, (kind, key, value, before, after, twist)) in raw.into_iter().enumerate() {
        let point = 200 * (k as u64 + 1);
        let key = format!("r{}", key % 2);
        let v = i64::from(value % 3);
        let cur = truth.get(&key).copied().flatten();
        let unknown = twist % 5 == 0;
        let corrupt = twist % 7 == 1;
        let request = match kind % 3 {
            0 => {
                let mut got = cur;
                if corrupt {
                    got = Some(got.map_or(0, |g| g + 1));
                }
                Request::Read { key, answer: (!unknown).then(|| RegisterRead { value: got.map(shakedown_history::format::Scalar::Int) }) }
            }
            1 => {
                if !unknown || twist % 2 == 0 {
                    truth.insert(key.clone(), Some(v));
                }
                Request::Write { key, value: shakedown_history::format::Scalar::Int(v), answer: (!unknown).then_some(Done {}) }
            }
            _ => {
                let to = (v + 1) % 3;
                let holds = cur == Some(v);
                if holds && (!unknown || twist % 2 == 0) {
                    truth.insert(key.clone(), Some(to));
                }
                Request::Cas {
                    key,
                    from: shakedown_history::format::Scalar::Int(v),
                    to: shakedown_history::format::Scalar::Int(to),
                    answer: (!unknown).then_some(CasAnswer { ok: holds != corrupt }),
                }
            }
        };
        ops.push(around(k, point, before, after, request));
    }
    History { model: ModelKind::Register, ops }
}

// ---- etcd ----

/// The whole store: the revision and every key (value, mod, create, version).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Store {
    rev: i64,
    keys: BTreeMap<String, (String, i64, i64, i64)>,
}

impl Store {
    fn kv(&self, key: &str) -> Option<Kv> {
        self.keys.get(key).map(|(v, m, c, n)| Kv { value: v.clone(), mod_revision: *m, create_revision: Some(*c), version: Some(*n) })
    }
    fn put(&self, key: &str, value: &str) -> Store {
        let mut s = self.clone();
        s.rev += 1;
        let (create, version) = self.keys.get(key).map_or((s.rev, 1), |(_, _, c, n)| (*c, n + 1));
        s.keys.insert(key.to_string(), (value.to_string(), s.rev, create, version));
        s
    }
    fn delete(&self, key: &str) -> Store {
        let mut s = self.clone();
        if s.keys.remove(key).is_some() {
            s.rev += 1;
        }
        s
    }
    fn mod_rev(&self, key: &str) -> i64 {
        self.keys.get(key).map_or(0, |k| k.1)
    }
}

/// etcd's semantics over the whole store, revisions included: the global truth the checker's
/// per-key search and revision-order check approximate.
fn store_step(s: &Store, op: &Operation) -> Vec<Store> {
    match &op.request {
        Request::Get { key, answer: Some(a), .. } => (a.revision == s.rev && a.kv == s.kv(key)).then(|| s.clone()).into_iter().collect(),
        Request::Put { key, value, answer: Some(a) } => {
            let n = s.put(key, value);
            (a.revision == n.rev).then_some(n).into_iter().collect()
        }
        Request::Put { key, value, answer: None } => vec![s.clone(), s.put(key, value)],
        Request::Delete { key, answer: Some(a) } => {
            let n = s.delete(key);
            (a.revision == n.rev && a.deleted == i64::from(s.keys.contains_key(key))).then_some(n).into_iter().collect()
        }
        Request::Txn { key, if_mod_revision, then, answer } => {
            let holds = s.mod_rev(key) == *if_mod_revision;
            let applied = || match then {
                Then::Put(v) => s.put(key, v),
                Then::Delete => s.delete(key),
            };
            match answer {
                Some(a) if a.succeeded => {
                    let n = applied();
                    (holds && a.revision == n.rev).then_some(n).into_iter().collect()
                }
                Some(a) => (!holds && a.revision == s.rev && a.kv == s.kv(key)).then(|| s.clone()).into_iter().collect(),
                None if holds => vec![s.clone(), applied()],
                None => vec![s.clone()],
            }
        }
        Request::Delete { key, answer: None } => vec![s.clone(), s.delete(key)],
        Request::Get { answer: None, .. } => vec![s.clone()],
        _ => unreachable!(),
    }
}

fn etcd_history(raw: Vec<(u8, u8, u8, u8, u8, u8)>, keys: u8) -> History {
    let mut truth = Store { rev: 1, keys: BTreeMap::new() };
    let mut ops = Vec::new();
    for (k, (kind, key, value, before, after, twist)) in raw.into_iter().enumerate() {
        let point = 200 * (k as u64 + 1);
        let key = format!("/k{}", key % keys);
        let value = format!("v{}", value % 4);
        let unknown = twist % 6 == 0;
        let corrupt = twist % 7 == 1;
        let applies = !unknown || twist % 2 == 0;
        let request = match kind % 4 {
            0 => {
                let mut a = ReadAnswer { revision: truth.rev, kv: truth.kv(&key) };
                if corrupt {
                    match twist % 3 {
                        0 => a.revision -= 1,
                        1 => a.kv = None,
                        _ => a.kv = Some(Kv { value: "v9".into(), mod_revision: truth.rev, create_revision: None, version: None }),
                    }
                }
                Request::Get { key, serializable: false, answer: (!unknown).then_some(a) }
            }
            1 => {
                let n = truth.put(&key, &value);
                let mut rev = n.rev;
                if applies {
                    truth = n;
                }
                if corrupt {
                    rev -= 1;
                }
                Request::Put { key, value, answer: (!unknown).then_some(WriteAnswer { revision: rev }) }
            }
            2 => {
                let deleted = i64::from(truth.keys.contains_key(&key));
                let n = truth.delete(&key);
                let rev = n.rev;
                if applies {
                    truth = n;
                }
                Request::Delete {
                    key,
                    answer: (!unknown).then_some(DeleteAnswer { revision: rev, deleted: if corrupt { 1 - deleted } else { deleted } }),
                }
            }
            _ => {
                // Guard on the true mod revision most of the time, a stale one otherwise.
                let expect = if value.ends_with('3') { (truth.mod_rev(&key) - 1).max(0) } else { truth.mod_rev(&key) };
                let then = if value.ends_with('2') { Then::Delete } else { Then::Put(value.clone()) };
                let holds = truth.mod_rev(&key) == expect;
                let answer = if holds {
                    let n = match &then {
                        Then::Put(v) => truth.put(&key, v),
                        Then::Delete => truth.delete(&key),
                    };
                    let a = TxnAnswer { succeeded: true, revision: n.rev, kv: None };
                    if applies {
                        truth = n;
                    }
                    a
                } else {
                    TxnAnswer { succeeded: false, revision: truth.rev, kv: truth.kv(&key) }
                };
                let answer = if corrupt {
                    TxnAnswer {
                        succeeded: !answer.succeeded,
                        revision: answer.revision,
                        kv: if answer.succeeded { truth.kv(&key) } else { None },
                    }
                } else {
                    answer
                };
                Request::Txn { key, if_mod_revision: expect, then, answer: (!unknown).then_some(answer) }
            }
        };
        ops.push(around(k, point, before, after, request));
    }
    History { model: ModelKind::Etcd, ops }
}

fn raw_ops(max: usize) -> impl Strategy<Value = Vec<(u8, u8, u8, u8, u8, u8)>> {
    prop::collection::vec(any::<(u8, u8, u8, u8, u8, u8)>(), 1..=max)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    /// Registers are independent objects: the per-key search decides exactly what brute force
    /// over the whole history decides.
    #[test]
    fn registers_agree_with_brute_force(raw in raw_ops(7)) {
        let h = register_history(raw);
        let oracle = brute_force(&h.ops, Regs::new(), register_step);
        let report = check(&h, DEFAULT_BOUND);
        prop_assert_eq!(matches!(report.verdict, Verdict::Linearizable), oracle, "{}\n{}", report.summary(), h.to_jsonl());
    }

    /// One etcd key: the search agrees with brute force over the same per-key model.
    #[test]
    fn one_etcd_key_search_agrees_with_brute_force(raw in raw_ops(7)) {
        let h = etcd_history(raw, 1);
        let model = shakedown_history::kv::Kv;
        let mut names = std::collections::HashMap::new();
        let ops: Vec<shakedown_history::kv::KvOp> = h.ops.iter().map(|o| kv_op(&o.request, &mut names)).collect();
        let init = shakedown_history::kv::State::empty();
        let oracle = brute_force(&h.ops, init.clone(), |s, o| {
            let i = h.ops.iter().position(|x| std::ptr::eq(x, o)).unwrap();
            model.step(s, &ops[i])
        });
        let timed: Vec<Timed<'_, _>> = h.ops.iter().zip(&ops).map(|(o, op)| Timed { call: o.call, ret: o.ret.filter(|_| o.request.answered()), op }).collect();
        let (search, _) = linearizable(&model, init, &timed, DEFAULT_BOUND);
        prop_assert_eq!(search == Search::Ok, oracle, "{:?}\n{}", search, h.to_jsonl());
    }

    /// Several etcd keys against the whole store's semantics: no false alarm (a history the
    /// store can produce always passes), and a history the checker passes that the store could
    /// not produce only when its flaw is one the per-key check cannot see.
    #[test]
    fn etcd_checker_never_flags_what_the_store_allows(raw in raw_ops(6)) {
        let h = etcd_history(raw, 2);
        let oracle = brute_force(&h.ops, Store { rev: 1, keys: BTreeMap::new() }, store_step);
        let report = check(&h, DEFAULT_BOUND);
        if oracle {
            prop_assert!(matches!(report.verdict, Verdict::Linearizable), "false alarm: {}\n{}", report.summary(), h.to_jsonl());
        }
    }
}

/// The checker catches most of what brute force over the whole store rejects (the per-key
/// search and the revision-order check together see nearly every flaw of these histories).
#[test]
fn etcd_checker_catches_what_the_store_forbids() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut forbidden, mut caught) = (0, 0);
    for _ in 0..3000 {
        let raw = raw_ops(6).new_tree(&mut runner).unwrap().current();
        let h = etcd_history(raw, 2);
        if brute_force(&h.ops, Store { rev: 1, keys: BTreeMap::new() }, store_step) {
            continue;
        }
        forbidden += 1;
        if matches!(check(&h, DEFAULT_BOUND).verdict, Verdict::Violation { .. }) {
            caught += 1;
        } else if std::env::var("SHOW_MISSED").is_ok() && forbidden - caught < 4 {
            eprintln!("missed:\n{}", h.to_jsonl());
        }
    }
    eprintln!("caught {caught} of {forbidden} forbidden histories");
    assert!(forbidden > 300, "the generator should make plenty of forbidden histories: {forbidden}");
    assert!(caught * 100 >= forbidden * 95, "caught {caught} of {forbidden} forbidden histories");
}

fn kv_op(r: &Request, names: &mut std::collections::HashMap<String, u32>) -> shakedown_history::kv::KvOp {
    use shakedown_history::kv::{KvOp, Seen, TxnAnswer as T};
    let mut id = |v: &str| {
        let n = names.len() as u32;
        *names.entry(v.to_string()).or_insert(n)
    };
    let mut seen = |kv: &Option<Kv>| {
        kv.as_ref().map(|kv| Seen { value: id(&kv.value), mod_rev: kv.mod_revision, create: kv.create_revision, version: kv.version })
    };
    match r {
        Request::Get { answer, .. } => KvOp::Get(answer.as_ref().map(|a| (a.revision, seen(&a.kv)))),
        Request::Put { value, answer, .. } => {
            let v = seen(&Some(Kv { value: value.clone(), mod_revision: 0, create_revision: None, version: None })).unwrap().value;
            KvOp::Put(v, answer.as_ref().map(|a| a.revision))
        }
        Request::Delete { answer, .. } => KvOp::Delete(answer.as_ref().map(|a| (a.revision, a.deleted))),
        Request::Txn { if_mod_revision, then, answer, .. } => {
            let then = match then {
                Then::Put(v) => {
                    Some(seen(&Some(Kv { value: v.clone(), mod_revision: 0, create_revision: None, version: None })).unwrap().value)
                }
                Then::Delete => None,
            };
            let answer = answer.as_ref().map(|a| {
                if a.succeeded {
                    T::Succeeded { revision: a.revision }
                } else {
                    T::Failed { revision: a.revision, kv: seen(&a.kv) }
                }
            });
            KvOp::Txn { expect: *if_mod_revision, then, answer }
        }
        _ => unreachable!(),
    }
}

/// `h` as it grows: each operation ends at its return instant (an unanswered one too); at
/// `instants`, what a recorder holds — the operations ended so far, in the order they ended, and
/// those in flight, unanswered — with the horizon (the earliest call in flight, or just after
/// the instant).
fn growth(h: &History, instants: &[u64]) -> Vec<(Vec<Operation>, Vec<Operation>, u64)> {
    let end = |o: &Operation| o.ret.unwrap_or(o.call);
    let mut by_end: Vec<&Operation> = h.ops.iter().collect();
    by_end.sort_by_key(|o| end(o));
    instants
        .iter()
        .map(|&t| {
            let ended: Vec<Operation> = by_end.iter().filter(|o| end(o) <= t).map(|o| (*o).clone()).collect();
            let in_flight: Vec<Operation> = h
                .ops
                .iter()
                .filter(|o| o.call <= t && end(o) > t)
                .map(|o| {
                    let mut o = o.clone();
                    o.ret = None;
                    o.request = unanswered(&o.request);
                    o
                })
                .collect();
            let horizon = in_flight.iter().map(|o| o.call).min().unwrap_or(t + 1);
            (ended, in_flight, horizon)
        })
        .collect()
}

fn unanswered(r: &Request) -> Request {
    match r.clone() {
        Request::Get { key, serializable, .. } => Request::Get { key, serializable, answer: None },
        Request::Put { key, value, .. } => Request::Put { key, value, answer: None },
        Request::Delete { key, .. } => Request::Delete { key, answer: None },
        Request::Txn { key, if_mod_revision, then, .. } => Request::Txn { key, if_mod_revision, then, answer: None },
        other => other,
    }
}

fn class(v: &Verdict) -> &'static str {
    match v {
        Verdict::Linearizable => "linearizable",
        Verdict::Violation { .. } => "violation",
        Verdict::Undecided { .. } => "undecided",
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    /// Checked as it grows, after each of a few random instants, a history gets at every
    /// instant the verdict the whole check gives what was recorded by then; and no violation
    /// the incremental checker finds is one the whole check overturns.
    #[test]
    fn incremental_checks_agree_with_the_whole_check(raw in prop::collection::vec(any::<(u8, u8, u8, u8, u8, u8)>(), 1..=24), picks in prop::collection::vec(any::<u16>(), 1..8)) {
        let mut h = etcd_history(raw, 2);
        // Some reads serializable (answered as linearizable ones were, or corrupted: both kinds).
        for (k, o) in h.ops.iter_mut().enumerate() {
            if let Request::Get { serializable, answer: Some(_), .. } = &mut o.request {
                *serializable = k % 3 == 0;
            }
        }
        let last = h.ops.iter().map(|o| o.ret.unwrap_or(o.call)).max().unwrap_or(0);
        let mut instants: Vec<u64> = picks.iter().map(|p| u64::from(*p) % (last + 50)).collect();
        instants.push(last);
        instants.sort_unstable();
        let mut inc = shakedown_history::Incremental::new(DEFAULT_BOUND);
        for (ended, in_flight, horizon) in growth(&h, &instants) {
            inc.feed(ended[inc.fed()..].iter().cloned());
            let got = inc.check(&in_flight, horizon);
            let mut all = ended.clone();
            all.extend(in_flight.iter().cloned());
            let whole = check(&History { model: ModelKind::Etcd, ops: all.clone() }, DEFAULT_BOUND);
            prop_assert_eq!(class(&got.verdict), class(&whole.verdict), "{}\n{}", got.summary(), History { model: ModelKind::Etcd, ops: all }.to_jsonl());
        }
        prop_assert_eq!(inc.overturned(), 0, "{}", h.to_jsonl());
    }
}

/// A register after a restore (epoch 1) holds what the restored store held: its first answer
/// says what, and every later answer in that epoch must agree with it (a key read, then gone
/// with nothing written: lost).
#[test]
fn a_restored_register_is_judged_from_its_first_answer() {
    let text =
        |lines: &[&str]| format!("{{\"format\":\"shakedown-history\",\"version\":1,\"model\":\"register\"}}\n{}\n", lines.join("\n"));
    let write = r#"{"client":0,"call":10,"return":20,"type":"write","key":"a","value":"v1","answer":{}}"#;
    let gone_then = r#"{"client":1,"epoch":1,"call":100,"return":110,"type":"read","key":"a","answer":{"value":null}}"#;
    let there = r#"{"client":1,"epoch":1,"call":200,"return":210,"type":"read","key":"a","answer":{"value":"v1"}}"#;
    let gone = r#"{"client":1,"epoch":1,"call":300,"return":310,"type":"read","key":"a","answer":{"value":null}}"#;
    // Whatever a restored key first reads as is what the backup held.
    for first in [gone_then, there] {
        let h = History::parse(&text(&[write, first])).unwrap();
        assert_eq!(check(&h, DEFAULT_BOUND).verdict, Verdict::Linearizable, "{first}");
    }
    // Read there, then gone, with nothing written in between.
    let h = History::parse(&text(&[write, there, gone])).unwrap();
    let report = check(&h, DEFAULT_BOUND);
    let Verdict::Violation { first, .. } = &report.verdict else { panic!("{report:?}") };
    assert!(first.message.contains("key a (epoch 1)"), "{}", first.message);
    // In the first epoch a key nobody wrote cannot be read.
    let phantom = r#"{"client":1,"call":30,"return":40,"type":"read","key":"b","answer":{"value":"v9"}}"#;
    let h = History::parse(&text(&[write, phantom])).unwrap();
    let report = check(&h, DEFAULT_BOUND);
    let Verdict::Violation { first, .. } = &report.verdict else { panic!("{report:?}") };
    assert!(first.message.contains("never written"), "{}", first.message);
}

/// A member's store never goes back within an epoch: a client's serializable read from the
/// same member, sent after an earlier one was answered, cannot claim a lower revision. A member
/// replaced under the same name (another id), or another member in between, ends the chain.
#[test]
fn a_member_whose_store_goes_back_is_caught_by_its_serializable_reads() {
    let get = |member: &str, call: u64, revision: i64| Operation {
        client: 3,
        member: Some(member.into()),
        epoch: 0,
        group: None,
        call,
        ret: Some(call + 5),
        request: Request::Get { key: "/k".into(), serializable: true, answer: Some(ReadAnswer { revision, kv: None }) },
    };
    let judge = |ops: Vec<Operation>| {
        let h = History { model: ModelKind::Etcd, ops: ops.clone() };
        let whole = check(&h, DEFAULT_BOUND).verdict;
        let mut inc = shakedown_history::Incremental::new(DEFAULT_BOUND);
        inc.feed(ops);
        assert_eq!(inc.check(&[], u64::MAX).verdict, whole, "the incremental check agrees");
        whole
    };
    let back = judge(vec![get("m1 (a1)", 0, 10), get("m1 (a1)", 10, 10), get("m1 (a1)", 20, 8)]);
    let Verdict::Violation { first, .. } = &back else { panic!("{back:?}") };
    assert!(first.message.contains("went back") && first.message.contains("revision 10"), "{}", first.message);
    assert_eq!(judge(vec![get("m1 (a1)", 0, 10), get("m1 (b2)", 10, 8)]), Verdict::Linearizable, "a replaced member");
    assert_eq!(
        judge(vec![get("m1 (a1)", 0, 10), get("m2 (c3)", 10, 6), get("m1 (a1)", 20, 8)]),
        Verdict::Linearizable,
        "another member between"
    );
    assert_eq!(judge(vec![get("m1 (a1)", 0, 10), get("m1 (a1)", 10, 12)]), Verdict::Linearizable, "forward");
    let mut restored = get("m1 (a1)", 10, 8);
    restored.epoch = 1;
    assert_eq!(judge(vec![get("m1 (a1)", 0, 10), restored]), Verdict::Linearizable, "a restore starts again");
}
