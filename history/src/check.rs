//! The whole check of a history: etcd's revisions against real time, then one search per key and
//! epoch (P-compositionality: requests that touch one key each are linearisable together
//! exactly when each key's are).

use std::collections::{BTreeMap, HashMap};

use crate::format::{History, ModelKind, Operation, Request, Scalar, Then, TxnAnswer as TxnA};
use crate::kv::{answered_at, Kv, KvOp, Seen, State, TxnAnswer};
use crate::register::{Reg, RegOp, Register};
use crate::search::{linearizable, Search, Timed};
use crate::serializable::{misread, KeyWrites};

/// The search's default bound: steps per key and epoch.
pub const DEFAULT_BOUND: u64 = 2_000_000;
/// Operations named in a finding besides the one that could not be placed.
const NAMED: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Operations in the history.
    pub ops: usize,
    /// Partitions searched (key and epoch).
    pub partitions: usize,
    /// Steps the searches took in all.
    pub steps: u64,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// The first violation found, and how many more there were.
    Violation {
        first: Finding,
        more: usize,
    },
    /// No violation found, but some partitions' searches ran out of their bound.
    Undecided {
        message: String,
        partitions: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindingKind {
    /// No order of one key's operations explains their answers.
    NotLinearizable,
    /// A request answered at a revision below one another request had been answered at before
    /// it was sent (a stale read, or a write ordered before one that finished earlier).
    RevisionOrder,
    /// Two writes acknowledged at the same revision.
    DuplicateRevision,
    /// A serializable read whose answer is not the key's state at the revision it claims.
    SerializableRead,
}

impl std::fmt::Display for FindingKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FindingKind::NotLinearizable => "not linearizable",
            FindingKind::RevisionOrder => "revision order",
            FindingKind::DuplicateRevision => "duplicate revision",
            FindingKind::SerializableRead => "serializable read",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub kind: FindingKind,
    pub message: String,
    /// The operations involved (indices into the history), the one that broke first.
    pub ops: Vec<usize>,
}

impl Report {
    /// One line: the verdict and what it covered.
    pub fn summary(&self) -> String {
        match &self.verdict {
            Verdict::Linearizable => format!("linearizable: one order explains every answer ({})", self.covered()),
            Verdict::Violation { .. } => format!("VIOLATION {}", self.detail()),
            Verdict::Undecided { .. } => format!("UNDECIDED: {}", self.detail()),
        }
    }

    /// What was found and what was covered, without the verdict's word: for a verdict that
    /// names it already.
    pub fn detail(&self) -> String {
        match &self.verdict {
            Verdict::Linearizable => self.covered(),
            Verdict::Violation { first, more } => {
                let more = if *more > 0 { format!(" (and {more} more)") } else { String::new() };
                format!("{}: {}{more} ({})", first.kind, first.message, self.covered())
            }
            Verdict::Undecided { message, .. } => format!("{message} ({})", self.covered()),
        }
    }

    fn covered(&self) -> String {
        format!("{} operations, {} keys and epochs, {} search steps", self.ops, self.partitions, self.steps)
    }
}

/// Checks `h`, each search bounded by `bound` steps.
pub fn check(h: &History, bound: u64) -> Report {
    let mut parts: BTreeMap<(u32, &str), Vec<usize>> = BTreeMap::new();
    for (i, op) in h.ops.iter().enumerate() {
        if op.request.at_claimed_revision() {
            continue;
        }
        parts.entry((op.epoch, op.request.key())).or_default().push(i);
    }
    let mut findings = Vec::new();
    if h.model == ModelKind::Etcd {
        findings.extend(revision_order(h));
        findings.extend(serializable_reads(h));
        findings.extend(members_going_back(h));
    }
    let mut names = Names::default();
    let mut steps = 0u64;
    let mut undecided = Vec::new();
    for (&(epoch, key), idxs) in &parts {
        let times: Vec<(u64, Option<u64>)> =
            idxs.iter().map(|&i| (h.ops[i].call, h.ops[i].ret.filter(|_| h.ops[i].request.answered()))).collect();
        let outcome = match h.model {
            ModelKind::Etcd => {
                let ops: Vec<(usize, KvOp)> = idxs.iter().map(|&i| (i, names.kv(&h.ops[i].request))).collect();
                let timed: Vec<Timed<'_, KvOp>> = ops.iter().zip(&times).map(|((_, o), &(call, ret))| Timed { call, ret, op: o }).collect();
                let init = if epoch == 0 { State::empty() } else { State::unseen() };
                let (search, taken) = linearizable(&Kv, init, &timed, bound);
                steps += taken;
                match search {
                    Search::Ok => Ok(()),
                    Search::Impossible { linearized, blocked, state } => {
                        Err(Ok((linearized, idxs[blocked], state.key.describe(&|v| names.value(v)))))
                    }
                    Search::Undecided { steps, deepest } => Err(Err((steps, deepest))),
                }
            }
            ModelKind::Register => {
                let ops: Vec<(usize, RegOp)> = idxs.iter().map(|&i| (i, names.reg(&h.ops[i].request))).collect();
                let timed: Vec<Timed<'_, RegOp>> =
                    ops.iter().zip(&times).map(|((_, o), &(call, ret))| Timed { call, ret, op: o }).collect();
                let init = if epoch == 0 { Reg::Is(None) } else { Reg::Unseen };
                let (search, taken) = linearizable(&Register, init, &timed, bound);
                steps += taken;
                match search {
                    Search::Ok => Ok(()),
                    Search::Impossible { linearized, blocked, state } => {
                        Err(Ok((linearized, idxs[blocked], state.describe(&|v| names.value(v)))))
                    }
                    Search::Undecided { steps, deepest } => Err(Err((steps, deepest))),
                }
            }
        };
        let name = if key.is_empty() { "the register".to_string() } else { format!("key {key}") };
        let place = if epoch > 0 { format!("{name} (epoch {epoch})") } else { name };
        match outcome {
            Ok(()) => {}
            Err(Ok((linearized, blocked, state))) => {
                let b = &h.ops[blocked];
                let mut ops = vec![blocked];
                ops.extend(idxs.iter().copied().filter(|&j| j != blocked && overlaps(&h.ops[j], b)).take(NAMED));
                let others: Vec<String> = ops[1..].iter().map(|&j| describe(j, &h.ops[j])).collect();
                let concurrent = if others.is_empty() {
                    "nothing ran concurrently with it".into()
                } else {
                    format!("concurrent with it: {}", others.join("; "))
                };
                findings.push(Finding {
                    kind: FindingKind::NotLinearizable,
                    message: format!(
                        "{place}: no order of its {} operations explains every answer: after {linearized} of them, with the key {state}, {} cannot come next, nor can any operation sent before it was answered; {concurrent}",
                        idxs.len(),
                        describe(blocked, b)
                    ),
                    ops,
                });
            }
            Err(Err((s, deepest))) => {
                undecided.push(format!("{place}: {deepest} of {} operations placed after {s} steps", idxs.len()));
            }
        }
    }
    let verdict = if !findings.is_empty() {
        findings.sort_by_key(|f| f.ops.first().map(|&i| (h.ops[i].call, i)));
        let more = findings.len() - 1;
        Verdict::Violation { first: findings.swap_remove(0), more }
    } else if !undecided.is_empty() {
        let partitions = undecided.len();
        let shown: Vec<String> = undecided.into_iter().take(3).collect();
        Verdict::Undecided {
            message: format!("{partitions} key(s) not decided within {bound} steps each: {}", shown.join("; ")),
            partitions,
        }
    } else {
        Verdict::Linearizable
    };
    Report { ops: h.ops.len(), partitions: parts.len(), steps, verdict }
}

fn interval(op: &Operation) -> (u64, u64) {
    (op.call, op.ret.filter(|_| op.request.answered()).unwrap_or(u64::MAX))
}

fn overlaps(a: &Operation, b: &Operation) -> bool {
    let (a0, a1) = interval(a);
    let (b0, b1) = interval(b);
    a0 <= b1 && b0 <= a1
}

/// A request's revision for the order check: the write's own revision, or the header
/// revision a read (or a refused transaction) was answered at; the model's rule
/// ([`answered_at`]), serializable reads left out (they are not held to real time).
pub(crate) fn revision_of(op: &Operation) -> Option<(i64, bool)> {
    // The request's shape in the model's terms; values do not matter here.
    let shape = match &op.request {
        Request::Get { serializable: true, .. }
        | Request::GetAt { .. }
        | Request::Read { .. }
        | Request::Write { .. }
        | Request::Cas { .. } => return None,
        Request::Get { answer, .. } => KvOp::Get(answer.as_ref().map(|a| (a.revision, None))),
        Request::Put { answer, .. } => KvOp::Put(0, answer.as_ref().map(|a| a.revision)),
        Request::Delete { answer, .. } => KvOp::Delete(answer.as_ref().map(|a| (a.revision, a.deleted))),
        Request::Txn { if_mod_revision, then, answer, .. } => KvOp::Txn {
            expect: *if_mod_revision,
            then: match then {
                Then::Put(_) => Some(0),
                Then::Delete => None,
            },
            answer: answer.as_ref().map(|a| {
                if a.succeeded {
                    TxnAnswer::Succeeded { revision: a.revision }
                } else {
                    TxnAnswer::Failed { revision: a.revision, kv: None }
                }
            }),
        },
    };
    answered_at(&shape)
}

/// etcd's revisions against real time, per epoch: a request sent after another was answered is
/// answered at a revision at least as high (higher, if it writes); no two writes share a revision.
fn revision_order(h: &History) -> Vec<Finding> {
    let mut findings = Vec::new();
    /// (index, call, return, revision, writes)
    type Answered = (usize, u64, u64, i64, bool);
    let mut epochs: BTreeMap<u32, Vec<Answered>> = BTreeMap::new();
    for (i, op) in h.ops.iter().enumerate() {
        if let (Some((rev, writes)), Some(ret)) = (revision_of(op), op.ret) {
            epochs.entry(op.epoch).or_default().push((i, op.call, ret, rev, writes));
        }
    }
    for ops in epochs.values() {
        let mut writes: HashMap<i64, usize> = HashMap::new();
        for &(i, _, _, rev, w) in ops {
            if !w {
                continue;
            }
            if let Some(&j) = writes.get(&rev) {
                if same_group(&h.ops[i], &h.ops[j]) {
                    continue;
                }
                findings.push(Finding {
                    kind: FindingKind::DuplicateRevision,
                    message: format!(
                        "two writes acknowledged at revision {rev}: {} and {}",
                        describe(j, &h.ops[j]),
                        describe(i, &h.ops[i])
                    ),
                    ops: vec![i, j],
                });
            } else {
                writes.insert(rev, i);
            }
        }
        let mut by_ret: Vec<&Answered> = ops.iter().collect();
        by_ret.sort_by_key(|o| o.2);
        let mut by_call: Vec<&Answered> = ops.iter().collect();
        by_call.sort_by_key(|o| o.1);
        let mut done = 0;
        let mut max: Option<(i64, usize)> = None;
        for &&(i, call, _, rev, w) in &by_call {
            while done < by_ret.len() && by_ret[done].2 < call {
                let o = by_ret[done];
                if max.is_none_or(|(m, _)| o.3 > m) {
                    max = Some((o.3, o.0));
                }
                done += 1;
            }
            let Some((m, j)) = max else { continue };
            if rev < m || (w && rev == m) {
                let what = if w { "a write acknowledged at a revision not above" } else { "answered at a revision below" };
                findings.push(Finding {
                    kind: FindingKind::RevisionOrder,
                    message: format!(
                        "{} was sent after {} had been answered, and was {what} it ({rev} {} {m}){}",
                        describe(i, &h.ops[i]),
                        describe(j, &h.ops[j]),
                        if w { "≤" } else { "<" },
                        if w { "" } else { ": a stale read" }
                    ),
                    ops: vec![i, j],
                });
            }
        }
    }
    findings
}

/// Whether two lines are parts of one request over several keys (whose writes share a revision).
pub(crate) fn same_group(a: &Operation, b: &Operation) -> bool {
    a.group.is_some() && a.group == b.group && a.epoch == b.epoch
}

/// Every serializable read, and every read at a revision, against its key's writes at the
/// revision it claims.
fn serializable_reads(h: &History) -> Vec<Finding> {
    let mut writes: HashMap<(u32, &str), KeyWrites> = HashMap::new();
    for (i, op) in h.ops.iter().enumerate() {
        writes.entry((op.epoch, op.request.key())).or_default().add(i, op);
    }
    h.ops
        .iter()
        .enumerate()
        .filter(|(_, op)| op.request.at_claimed_revision() && op.request.answered())
        .filter_map(|(i, op)| {
            let w = writes.get(&(op.epoch, op.request.key()))?;
            misread(op, w, op.epoch == 0).map(|(why, j)| serializable_finding(h, i, &why, j))
        })
        .collect()
}

/// A client's serializable reads from one member, in the order it sent them: the member's store
/// never goes back (within an epoch), so neither does the revision they claim. A read sent after
/// another was answered, by the same member, at a lower revision is a member whose store went
/// back (a restart that lost applied writes). Reads from another member in between end the
/// chain: serializable reads may be behind, and a client that changed member may see less.
fn members_going_back(h: &History) -> Vec<Finding> {
    let mut by_client: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, op) in h.ops.iter().enumerate() {
        if matches!(op.request, Request::Get { serializable: true, answer: Some(_), .. }) {
            by_client.entry(op.client).or_default().push(i);
        }
    }
    let mut findings = Vec::new();
    for reads in by_client.values_mut() {
        reads.sort_by_key(|&i| (h.ops[i].call, i));
        let mut chain = MemberChain::default();
        for &i in reads.iter() {
            if let Some(j) = chain.next(i, &h.ops[i], |j| h.ops[j].ret) {
                findings.push(member_went_back(h, i, j));
            }
        }
    }
    findings
}

/// One client's run of serializable reads from one member (see [`members_going_back`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct MemberChain {
    /// Epoch, member, the highest revision so far and the read that claimed it.
    at: Option<(u32, String, i64, usize)>,
}

impl MemberChain {
    /// Read `i` (a serializable get with an answer), the client's next: the earlier read of the
    /// chain it contradicts (one answered, `ret`, before `i` was sent, at a higher revision).
    pub(crate) fn next(&mut self, i: usize, op: &Operation, ret: impl Fn(usize) -> Option<u64>) -> Option<usize> {
        let Request::Get { answer: Some(a), .. } = &op.request else { return None };
        let Some(member) = &op.member else {
            self.at = None;
            return None;
        };
        match &mut self.at {
            Some((epoch, m, top, j)) if *epoch == op.epoch && m == member => {
                if a.revision < *top && ret(*j).is_some_and(|r| r < op.call) {
                    return Some(*j);
                }
                if a.revision > *top {
                    (*top, *j) = (a.revision, i);
                }
                None
            }
            _ => {
                self.at = Some((op.epoch, member.clone(), a.revision, i));
                None
            }
        }
    }
}

/// The finding for serializable read `i` answered below read `j` of the same member.
pub(crate) fn member_went_back(h: &History, i: usize, j: usize) -> Finding {
    let rev = |k: usize| match &h.ops[k].request {
        Request::Get { answer: Some(a), .. } => a.revision,
        _ => 0,
    };
    Finding {
        kind: FindingKind::SerializableRead,
        message: format!(
            "{} claims revision {}, below the revision {} the same member claimed for the same client's earlier read, answered before it was sent ({}): the member's store went back",
            describe(i, &h.ops[i]),
            rev(i),
            rev(j),
            describe(j, &h.ops[j])
        ),
        ops: vec![i, j],
    }
}

/// The finding for serializable read `i`, `why` its answer is wrong, `j` the write it contradicts.
pub(crate) fn serializable_finding(h: &History, i: usize, why: &str, j: Option<usize>) -> Finding {
    let against = j.map(|j| format!(": {}", describe(j, &h.ops[j]))).unwrap_or_default();
    Finding {
        kind: FindingKind::SerializableRead,
        message: format!("{} is not the key's state at the revision it claims: {why}{against}", describe(i, &h.ops[i])),
        ops: std::iter::once(i).chain(j).collect(),
    }
}

/// Interned values.
#[derive(Default)]
pub(crate) struct Names {
    ids: HashMap<String, u32>,
    values: Vec<String>,
}

impl Names {
    fn id(&mut self, v: String) -> u32 {
        if let Some(&i) = self.ids.get(&v) {
            return i;
        }
        let i = self.values.len() as u32;
        self.values.push(v.clone());
        self.ids.insert(v, i);
        i
    }
    pub(crate) fn value(&self, v: u32) -> String {
        self.values.get(v as usize).map_or_else(|| "?".into(), |s| s.clone())
    }
    fn scalar(&mut self, s: &Scalar) -> u32 {
        self.id(s.to_string())
    }
    fn seen(&mut self, kv: &Option<crate::format::Kv>) -> Option<Seen> {
        kv.as_ref().map(|kv| Seen {
            value: self.id(format!("{:?}", kv.value)),
            mod_rev: kv.mod_revision,
            create: kv.create_revision,
            version: kv.version,
        })
    }
    pub(crate) fn kv(&mut self, r: &Request) -> KvOp {
        match r {
            Request::Get { answer, .. } => KvOp::Get(answer.as_ref().map(|a| (a.revision, self.seen(&a.kv)))),
            // Judged against the state at its revision, never searched: a read that constrains
            // nothing.
            Request::GetAt { .. } => KvOp::Get(None),
            Request::Put { value, answer, .. } => KvOp::Put(self.id(format!("{value:?}")), answer.as_ref().map(|a| a.revision)),
            Request::Delete { answer, .. } => KvOp::Delete(answer.as_ref().map(|a| (a.revision, a.deleted))),
            Request::Txn { if_mod_revision, then, answer, .. } => KvOp::Txn {
                expect: *if_mod_revision,
                then: match then {
                    Then::Put(v) => Some(self.id(format!("{v:?}"))),
                    Then::Delete => None,
                },
                answer: answer.as_ref().map(|a: &TxnA| {
                    if a.succeeded {
                        TxnAnswer::Succeeded { revision: a.revision }
                    } else {
                        TxnAnswer::Failed { revision: a.revision, kv: self.seen(&a.kv) }
                    }
                }),
            },
            Request::Read { .. } | Request::Write { .. } | Request::Cas { .. } => unreachable!("History::parse keeps one model's requests"),
        }
    }
    fn reg(&mut self, r: &Request) -> RegOp {
        match r {
            Request::Read { answer, .. } => RegOp::Read(answer.as_ref().map(|a| a.value.as_ref().map(|v| self.scalar(v)))),
            Request::Write { value, answer, .. } => RegOp::Write(self.scalar(value), answer.is_some()),
            Request::Cas { from, to, answer, .. } => RegOp::Cas(Some(self.scalar(from)), self.scalar(to), answer.as_ref().map(|a| a.ok)),
            Request::Get { .. } | Request::GetAt { .. } | Request::Put { .. } | Request::Delete { .. } | Request::Txn { .. } => {
                unreachable!("History::parse keeps one model's requests")
            }
        }
    }
}

/// A register's key as a word of a sentence (none for the single unnamed register).
fn named(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!(" {key}")
    }
}

fn secs(us: u64) -> String {
    format!("{}.{:06} s", us / 1_000_000, us % 1_000_000)
}

fn kv_text(kv: &Option<crate::format::Kv>, keys_only: bool) -> String {
    match kv {
        Some(kv) if keys_only => format!("present at mod revision {}", kv.mod_revision),
        Some(kv) => format!("{:?} at mod revision {}", kv.value, kv.mod_revision),
        None => "nothing".into(),
    }
}

/// One operation in words: who, when, what, and what it got.
pub fn describe(i: usize, op: &Operation) -> String {
    let via = op.member.as_deref().map(|m| format!(" via {m}")).unwrap_or_default();
    let when = match op.ret.filter(|_| op.request.answered()) {
        Some(r) => format!("{}–{}", secs(op.call), secs(r)),
        None => format!("{}–?", secs(op.call)),
    };
    let what = match &op.request {
        Request::Get { key, serializable, answer } => {
            let kind = if *serializable { "serializable get" } else { "get" };
            match answer {
                Some(a) => format!("{kind} {key} → {} (revision {})", kv_text(&a.kv, false), a.revision),
                None => format!("{kind} {key} → no answer"),
            }
        }
        Request::GetAt { key, at, keys_only, answer } => {
            let kind = if *keys_only { "keys-only get" } else { "get" };
            match answer {
                Some(a) => format!("{kind} {key} at revision {at} → {} (answered at revision {})", kv_text(&a.kv, *keys_only), a.revision),
                None => format!("{kind} {key} at revision {at} → no answer"),
            }
        }
        Request::Put { key, value, answer } => match answer {
            Some(a) => format!("put {key} = {value:?} → revision {}", a.revision),
            None => format!("put {key} = {value:?} → no answer"),
        },
        Request::Delete { key, answer } => match answer {
            Some(a) => format!("delete {key} → deleted {} at revision {}", a.deleted, a.revision),
            None => format!("delete {key} → no answer"),
        },
        Request::Txn { key, if_mod_revision, then, answer } => {
            let then = match then {
                Then::Put(v) => format!("put {v:?}"),
                Then::Delete => "delete".into(),
            };
            let got = match answer {
                Some(a) if a.succeeded => format!("succeeded at revision {}", a.revision),
                Some(a) => format!("refused at revision {}, the key holding {}", a.revision, kv_text(&a.kv, false)),
                None => "no answer".into(),
            };
            format!("txn {key} if mod revision = {if_mod_revision} then {then} → {got}")
        }
        Request::Read { key, answer } => match answer {
            Some(a) => format!("read{} → {}", named(key), a.value.as_ref().map_or("nothing".into(), |v| v.to_string())),
            None => format!("read{} → no answer", named(key)),
        },
        Request::Write { key, value, answer } => {
            format!("write{} {value}{}", named(key), if answer.is_some() { "" } else { " → no answer" })
        }
        Request::Cas { key, from, to, answer } => match answer {
            Some(a) => format!("cas{} {from} → {to}: {}", named(key), if a.ok { "swapped" } else { "refused" }),
            None => format!("cas{} {from} → {to}: no answer", named(key)),
        },
    };
    let group = op.group.map(|g| format!(", part of request {g}")).unwrap_or_default();
    format!("op {i} (client {}{via}{group}, {when}): {what}", op.client)
}
