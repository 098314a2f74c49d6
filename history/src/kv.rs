//! etcd's key-value semantics for one key: what a get, put, delete or mod-revision-guarded
//! transaction may answer, and what it leaves.
//!
//! A key's state is its value with its mod revision, create revision and version, or its
//! absence with the revision of the write that removed it. A write whose outcome is unknown got a
//! revision nobody saw: the state holds "some revision above R" until an answer names it.
//! Values are interned (`u32`) by the caller.

use crate::search::Model;

/// A revision, known or bounded below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rev {
    Known(i64),
    /// Some revision greater than this one.
    Above(i64),
}

impl Rev {
    /// The same revision, if `r` can be it (an `Above` becomes `Known(r)`).
    fn is(self, r: i64) -> Option<Rev> {
        match self {
            Rev::Known(k) => (k == r).then_some(Rev::Known(r)),
            Rev::Above(x) => (r > x).then_some(Rev::Known(r)),
        }
    }
    /// Whether this revision can differ from `r`.
    fn can_differ(self, r: i64) -> bool {
        match self {
            Rev::Known(k) => k != r,
            Rev::Above(_) => true,
        }
    }
    /// The highest revision it is known to be at least.
    pub fn floor(self) -> i64 {
        match self {
            Rev::Known(k) => k,
            Rev::Above(x) => x + 1,
        }
    }
}

impl std::fmt::Display for Rev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rev::Known(k) => write!(f, "{k}"),
            Rev::Above(x) => write!(f, "unknown (> {x})"),
        }
    }
}

/// One key's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// Nothing is known yet (an epoch after a restore): the first answer says what it held.
    Unseen,
    /// Absent; `last` is the revision of the delete that removed it (0: never written).
    Absent {
        last: Rev,
    },
    Present {
        value: u32,
        mod_rev: Rev,
        create: Rev,
        version: Option<i64>,
    },
}

impl Key {
    /// The revision the next write must exceed.
    fn last(&self) -> Rev {
        match self {
            Key::Unseen => Rev::Above(0),
            Key::Absent { last } => *last,
            Key::Present { mod_rev, .. } => *mod_rev,
        }
    }
}

/// A key's value as an answer gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub value: u32,
    pub mod_rev: i64,
    pub create: Option<i64>,
    pub version: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnAnswer {
    Succeeded { revision: i64 },
    Failed { revision: i64, kv: Option<Seen> },
}

/// An operation on one key with its answer (`None`: unknown outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvOp {
    Get(Option<(i64, Option<Seen>)>),
    Put(u32, Option<i64>),
    /// (revision, deleted).
    Delete(Option<(i64, i64)>),
    /// `If(ModRevision == expect) Then(Put(value) | Delete when None) Else(Get)`.
    Txn {
        expect: i64,
        then: Option<u32>,
        answer: Option<TxnAnswer>,
    },
}

pub struct Kv;

/// The value of a key known to be present whose value no answer gave (no interned value is it).
const UNSEEN: u32 = u32::MAX;

/// A read at header revision `rev` that found `kv`, in state `s`.
fn read(s: &Key, rev: i64, kv: Option<Seen>) -> Option<Key> {
    match (s, kv) {
        (_, Some(kv)) if kv.mod_rev > rev || kv.create.is_some_and(|c| c > kv.mod_rev) => None,
        (Key::Unseen, Some(kv)) => Some(Key::Present {
            value: kv.value,
            mod_rev: Rev::Known(kv.mod_rev),
            create: kv.create.map_or(Rev::Above(0), Rev::Known),
            version: kv.version,
        }),
        (Key::Unseen, None) => Some(Key::Absent { last: Rev::Above(0) }),
        (Key::Absent { last }, None) => (rev >= last.floor()).then_some(s.clone()),
        (Key::Absent { .. }, Some(_)) | (Key::Present { .. }, None) => None,
        (Key::Present { value, mod_rev, create, version }, Some(kv)) => {
            if *value != kv.value && *value != UNSEEN {
                return None;
            }
            let mod_rev = mod_rev.is(kv.mod_rev)?;
            let create = match kv.create {
                Some(c) => create.is(c)?,
                None => *create,
            };
            let version = match (version, kv.version) {
                (Some(a), Some(b)) if *a != b => return None,
                (a, b) => a.or(b),
            };
            Some(Key::Present { value: kv.value, mod_rev, create, version })
        }
    }
}

/// A write of `value` (a put) or `None` (a delete of a present key) at revision `rev`.
fn write(s: &Key, value: Option<u32>, rev: Rev) -> Option<Key> {
    if let Rev::Known(r) = rev {
        if r <= s.last().floor() {
            return None;
        }
    }
    Some(match value {
        None => Key::Absent { last: rev },
        Some(v) => match s {
            Key::Present { create, version, .. } => {
                Key::Present { value: v, mod_rev: rev, create: *create, version: version.map(|n| n + 1) }
            }
            Key::Absent { .. } => Key::Present { value: v, mod_rev: rev, create: rev, version: Some(1) },
            Key::Unseen => Key::Present { value: v, mod_rev: rev, create: Rev::Above(0), version: None },
        },
    })
}

/// `s` with its mod revision fixed to `expect`, if the compare `ModRevision == expect` can hold.
fn compare_holds(s: &Key, expect: i64) -> Option<Key> {
    match s {
        Key::Unseen => Some(if expect == 0 {
            Key::Absent { last: Rev::Above(0) }
        } else {
            // Present with a value nobody saw: a read that names it finds it.
            Key::Present { value: UNSEEN, mod_rev: Rev::Known(expect), create: Rev::Above(0), version: None }
        }),
        Key::Absent { .. } => (expect == 0).then(|| s.clone()),
        Key::Present { value, mod_rev, create, version } => {
            let mod_rev = if expect == 0 { None } else { mod_rev.is(expect) }?;
            Some(Key::Present { value: *value, mod_rev, create: *create, version: *version })
        }
    }
}

fn compare_can_fail(s: &Key, expect: i64) -> bool {
    match s {
        Key::Unseen => true,
        Key::Absent { .. } => expect != 0,
        Key::Present { mod_rev, .. } => expect == 0 || mod_rev.can_differ(expect),
    }
}

/// The Then branch, applied at `rev`, from a state where the compare held.
fn then(s: &Key, value: Option<u32>, rev: Rev) -> Option<Key> {
    match (s, value) {
        // A delete of an absent key changes nothing and takes no revision.
        (Key::Absent { .. }, None) => Some(s.clone()),
        _ => write(s, value, rev),
    }
}

/// A key and the highest revision any answer about it was given at: revisions are the store's,
/// so whatever is ordered after an answer at revision R is answered at R or above, and a write
/// ordered after it takes a revision above R.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    pub key: Key,
    pub floor: i64,
}

impl State {
    /// A key of a store that starts empty at revision 1 (writes take 2 and up).
    pub fn empty() -> State {
        State { key: Key::Absent { last: Rev::Known(1) }, floor: 1 }
    }
    /// A key nothing is known of (an epoch after a restore).
    pub fn unseen() -> State {
        State { key: Key::Unseen, floor: 0 }
    }
}

/// The revision an answer was given at, and whether the operation wrote at it.
pub(crate) fn answered_at(op: &KvOp) -> Option<(i64, bool)> {
    match *op {
        KvOp::Get(a) => a.map(|(rev, _)| (rev, false)),
        KvOp::Put(_, rev) => rev.map(|r| (r, true)),
        KvOp::Delete(a) => a.map(|(rev, deleted)| (rev, deleted > 0)),
        KvOp::Txn { expect, then, answer } => answer.map(|a| match a {
            TxnAnswer::Succeeded { revision } => (revision, then.is_some() || expect != 0),
            TxnAnswer::Failed { revision, .. } => (revision, false),
        }),
    }
}

/// Whether an operation of unknown outcome can still change the key after state `s`: a read
/// never does, and a transaction guarded by a mod revision the key has moved past never will
/// (revisions only grow).
pub fn may_still_apply(s: &State, op: &KvOp) -> bool {
    match *op {
        KvOp::Get(_) => false,
        KvOp::Txn { expect, .. } if expect > 0 => s.key.last().floor() <= expect,
        KvOp::Txn { .. } | KvOp::Put(..) | KvOp::Delete(_) => true,
    }
}

impl Model for Kv {
    type State = State;
    type Op = KvOp;

    fn step(&self, s: &State, op: &KvOp) -> Vec<State> {
        let at = answered_at(op);
        if let Some((rev, writes)) = at {
            if rev < s.floor || (writes && rev == s.floor) {
                return vec![];
            }
        }
        let floor = at.map_or(s.floor, |(rev, _)| rev.max(s.floor));
        key_step(&s.key, op, s.floor).into_iter().map(|key| State { key, floor }).collect()
    }
}

/// What `op` can leave of key `s`, `floor` the highest revision answered so far.
fn key_step(s: &Key, op: &KvOp, floor: i64) -> Vec<Key> {
    let unknown_rev = Rev::Above(s.last().floor().max(floor));
    match *op {
        KvOp::Get(None) => vec![s.clone()],
        KvOp::Get(Some((rev, kv))) => read(s, rev, kv).into_iter().collect(),
        KvOp::Put(v, Some(rev)) => write(s, Some(v), Rev::Known(rev)).into_iter().collect(),
        KvOp::Put(v, None) => [Some(s.clone()), write(s, Some(v), unknown_rev)].into_iter().flatten().collect(),
        KvOp::Delete(answer) => match (s, answer) {
            (Key::Present { .. }, Some((rev, 1))) => write(s, None, Rev::Known(rev)).into_iter().collect(),
            (Key::Absent { last }, Some((rev, 0))) => (rev >= last.floor()).then(|| s.clone()).into_iter().collect(),
            (Key::Unseen, Some((rev, 1))) => vec![Key::Absent { last: Rev::Known(rev) }],
            (Key::Unseen, Some((_, 0))) => vec![Key::Absent { last: Rev::Above(0) }],
            (Key::Present { .. }, None) => vec![s.clone(), Key::Absent { last: unknown_rev }],
            (_, None) => vec![s.clone()],
            _ => vec![],
        },
        KvOp::Txn { expect, then: value, answer } => match answer {
            Some(TxnAnswer::Succeeded { revision }) => match (s, value) {
                // An unseen key whose compare held: the write is all there is to know.
                (Key::Unseen, Some(v)) => vec![Key::Present {
                    value: v,
                    mod_rev: Rev::Known(revision),
                    create: if expect == 0 { Rev::Known(revision) } else { Rev::Above(0) },
                    version: (expect == 0).then_some(1),
                }],
                (Key::Unseen, None) => vec![Key::Absent { last: if expect == 0 { Rev::Above(0) } else { Rev::Known(revision) } }],
                _ => compare_holds(s, expect).and_then(|held| then(&held, value, Rev::Known(revision))).into_iter().collect(),
            },
            Some(TxnAnswer::Failed { revision, kv }) => {
                let differs = match kv {
                    Some(kv) => kv.mod_rev != expect,
                    None => expect != 0,
                };
                if !differs || !compare_can_fail(s, expect) {
                    return vec![];
                }
                read(s, revision, kv).into_iter().collect()
            }
            None => {
                let mut out = vec![s.clone()];
                if !matches!(s, Key::Unseen) {
                    if let Some(applied) = compare_holds(s, expect).and_then(|held| then(&held, value, unknown_rev)) {
                        if applied != *s {
                            out.push(applied);
                        }
                    }
                }
                out
            }
        },
    }
}

impl Key {
    /// The state in words, values named by `name`.
    pub fn describe(&self, name: &dyn Fn(u32) -> String) -> String {
        match self {
            Key::Unseen => "not seen yet".into(),
            Key::Absent { last: Rev::Known(r) } if *r <= 1 => "absent (never written)".into(),
            Key::Absent { last } => format!("absent (deleted at revision {last})"),
            Key::Present { value, mod_rev, .. } if *value == UNSEEN => format!("present with an unseen value at mod revision {mod_rev}"),
            Key::Present { value, mod_rev, .. } => format!("{} at mod revision {mod_rev}", name(*value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: Key = Key::Absent { last: Rev::Known(1) };

    fn step(s: &Key, op: &KvOp) -> Vec<Key> {
        key_step(s, op, 0)
    }

    #[test]
    fn answers_about_a_key_never_go_back_in_revisions() {
        let s = State::empty();
        let read = Kv.step(&s, &KvOp::Get(Some((10, None))));
        assert_eq!(read[0].floor, 10);
        assert!(Kv.step(&read[0], &KvOp::Get(Some((9, None)))).is_empty(), "a later read at a lower revision");
        assert!(Kv.step(&read[0], &KvOp::Put(1, Some(10))).is_empty(), "a later write at the revision already read");
        assert_eq!(Kv.step(&read[0], &KvOp::Put(1, Some(11))).len(), 1);
    }

    fn seen(value: u32, mod_rev: i64) -> Option<Seen> {
        Some(Seen { value, mod_rev, create: None, version: None })
    }

    #[test]
    fn a_create_then_a_read_of_it() {
        let created = step(&EMPTY, &KvOp::Txn { expect: 0, then: Some(1), answer: Some(TxnAnswer::Succeeded { revision: 5 }) });
        assert_eq!(created, vec![Key::Present { value: 1, mod_rev: Rev::Known(5), create: Rev::Known(5), version: Some(1) }]);
        assert_eq!(step(&created[0], &KvOp::Get(Some((6, seen(1, 5))))).len(), 1);
        // A read of an older value, another revision, or nothing: impossible.
        assert!(step(&created[0], &KvOp::Get(Some((6, seen(1, 4))))).is_empty());
        assert!(step(&created[0], &KvOp::Get(Some((6, None)))).is_empty());
        // A header revision below the value's mod revision: impossible.
        assert!(step(&created[0], &KvOp::Get(Some((4, seen(1, 5))))).is_empty());
    }

    #[test]
    fn a_guarded_update_succeeds_only_against_the_current_revision() {
        let s = Key::Present { value: 1, mod_rev: Rev::Known(5), create: Rev::Known(5), version: Some(1) };
        let ok = KvOp::Txn { expect: 5, then: Some(2), answer: Some(TxnAnswer::Succeeded { revision: 9 }) };
        assert_eq!(step(&s, &ok), vec![Key::Present { value: 2, mod_rev: Rev::Known(9), create: Rev::Known(5), version: Some(2) }]);
        let stale = KvOp::Txn { expect: 4, then: Some(2), answer: Some(TxnAnswer::Succeeded { revision: 9 }) };
        assert!(step(&s, &stale).is_empty(), "a compare against an overwritten revision cannot succeed");
        let refused = KvOp::Txn { expect: 4, then: Some(2), answer: Some(TxnAnswer::Failed { revision: 7, kv: seen(1, 5) }) };
        assert_eq!(step(&s, &refused), vec![s.clone()]);
        let wrongly_refused = KvOp::Txn { expect: 5, then: Some(2), answer: Some(TxnAnswer::Failed { revision: 7, kv: seen(1, 5) }) };
        assert!(step(&s, &wrongly_refused).is_empty());
        // A write must take a revision above the key's last.
        let backwards = KvOp::Txn { expect: 5, then: Some(2), answer: Some(TxnAnswer::Succeeded { revision: 5 }) };
        assert!(step(&s, &backwards).is_empty());
    }

    #[test]
    fn an_unknown_write_may_or_may_not_have_applied_and_a_read_fixes_its_revision() {
        let s = Key::Present { value: 1, mod_rev: Rev::Known(5), create: Rev::Known(5), version: Some(1) };
        let lost = KvOp::Txn { expect: 5, then: Some(2), answer: None };
        let after = step(&s, &lost);
        assert_eq!(after.len(), 2);
        assert_eq!(step(&after[1], &KvOp::Get(Some((12, seen(2, 11))))).len(), 1);
        assert!(step(&after[1], &KvOp::Get(Some((12, seen(2, 5))))).is_empty());
        assert_eq!(step(&after[0], &KvOp::Get(Some((12, seen(1, 5))))).len(), 1);
    }

    #[test]
    fn an_unseen_key_takes_its_state_from_the_first_answer() {
        let after = step(&Key::Unseen, &KvOp::Get(Some((40, seen(3, 30)))));
        assert_eq!(after.len(), 1);
        assert!(step(&after[0], &KvOp::Get(Some((41, seen(4, 30))))).is_empty());
        let deleted = step(&after[0], &KvOp::Delete(Some((42, 1))));
        assert_eq!(deleted, vec![Key::Absent { last: Rev::Known(42) }]);
        assert!(step(&deleted[0], &KvOp::Get(Some((41, None)))).is_empty(), "a read below the delete's revision");
    }
}
