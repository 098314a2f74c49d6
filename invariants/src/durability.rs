//! `durability` over the history: every acknowledged create, update and delete is reflected —
//! per key, the last acknowledged write (its value, or the key's absence after a delete), or a
//! later write whose outcome is unknown; a refused compare is not a write, so not a loss. After a
//! restore, the writes before the backup are there and those between the backup and the restore
//! are gone.

use shakedown_faults::Model;

use std::collections::HashMap;

use crate::observation::{Ack, BackupMark, Durability, RestoreMark, Unknown};
use crate::{Marks, Observation, Verdict};

/// What the current data must say about the write acknowledged at position `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Present,
    Absent,
    Either,
}

/// The expectation for the write acknowledged at position `i` and sent at position `start` (how
/// many writes had been acknowledged when it was sent), following the chain of restores: after a
/// restore from backup B, writes acknowledged before B's snapshot began are what they were
/// expected to be then, writes sent after the snapshot ended are gone, and the rest — in flight
/// while the snapshot was taken (with concurrent clients, several may be, and acknowledged after
/// it ended), or during the restore — may be either.
pub fn expect_write(i: usize, start: usize, marks: &Marks) -> Expect {
    fn at(i: usize, start: usize, marks: &Marks, restores: usize) -> Expect {
        let Some(&RestoreMark { backup, start: r_start, end: r_end, point }) = marks.restores[..restores].last() else {
            return Expect::Present;
        };
        if i >= r_end {
            return Expect::Present;
        }
        if i >= r_start {
            return Expect::Either;
        }
        // A point-in-time restore is the restore of a backup taken at that instant.
        let Some(BackupMark { start: b_start, end: b_end, after_restores }) = point.or_else(|| marks.backups.get(&backup).copied()) else {
            return Expect::Either;
        };
        if start >= b_end {
            return Expect::Absent;
        }
        if i >= b_start {
            return Expect::Either;
        }
        // Before the backup: as expected when the backup was taken, i.e. after the restores that
        // came before it in op order — not by ack counts, which tie when nothing was acknowledged
        // between a restore and a later backup (the seed-11 nightly false alarm). A restore
        // always comes after its backup, so this is strictly earlier and the recursion ends.
        at(i, start, marks, after_restores.min(restores - 1))
    }
    at(i, start.min(i), marks, marks.restores.len())
}

/// The values a key may hold now: `None` is "absent".
#[derive(Debug, Default)]
struct Allowed<'a> {
    /// The last write expected to be reflected (`None`: nothing yet, the key is absent).
    last: Option<&'a Ack>,
    /// Values of writes that may or may not be reflected (during a backup or a restore, or of
    /// unknown outcome).
    either: Vec<Option<&'a str>>,
}

impl Allowed<'_> {
    fn admits(&self, v: Option<&str>) -> bool {
        self.last.and_then(|a| a.value.as_deref()) == v || self.either.contains(&v)
    }
}

pub(crate) fn durability(model: &Model, obs: &Observation) -> Verdict {
    // Without quorum nothing can be read back; the writes are checked once quorum is back.
    if !model.service_expected_up() {
        return Verdict::Pass;
    }
    match &obs.durability {
        // A read served by a member whose store diverged shows other values than were written.
        Some(d) => match history(d) {
            Verdict::Definite(m) => {
                crate::known::with_txn_range_refused(Verdict::Definite(m + &crate::consistency::possible_defect(obs)), obs)
            }
            v => crate::known::with_txn_range_refused(v, obs),
        },
        None => Verdict::Unobserved("no read-back of the workload's writes".into()),
    }
}

/// `api-durability`: the same rule over the Kubernetes API workload's objects.
pub(crate) fn api_durability(model: &Model, obs: &Observation) -> Verdict {
    if !model.service_expected_up() {
        return Verdict::Pass;
    }
    match &obs.api {
        None => Verdict::Unobserved("no Kubernetes API observation".into()),
        Some(api) => match &api.durability {
            Some(d) => history(d),
            None => Verdict::Unobserved("no read-back of the API workload's writes".into()),
        },
    }
}

fn history(d: &Durability) -> Verdict {
    let mut parts = Vec::new();
    if !d.list_anomalies.is_empty() {
        parts.push(format!(
            "a paginated read at a pinned revision was inconsistent: {}",
            sample(&d.list_anomalies.iter().map(String::as_str).collect::<Vec<_>>())
        ));
    }
    if let Some(err) = &d.read_error {
        if parts.is_empty() {
            return Verdict::Fail(format!("could not read back the acknowledged writes: {err}"));
        }
        return Verdict::Definite(parts.join("; "));
    }
    // Per key, the writes in the order etcd applied them: by restore epoch (revisions start
    // again from the backup's after a restore), then revision. Acknowledgement order is not
    // application order when concurrent clients write the same key.
    let epoch = |i: usize| d.marks.restores.iter().filter(|r| r.end <= i).count();
    let now_epoch = d.marks.restores.iter().filter(|r| r.end <= d.acked.len()).count();
    let acks: Vec<&Ack> = d.acked.iter().collect();
    let mut per_key: HashMap<&str, Vec<(usize, i64, usize, Expect)>> = HashMap::new();
    for (i, a) in acks.iter().enumerate() {
        let e = epoch(i);
        // Applied after the read was served (a higher revision): not visible to it.
        if d.read_revision > 0 && e == now_epoch && a.revision > d.read_revision {
            continue;
        }
        let mut expect = expect_write(i, a.start, &d.marks);
        // Acknowledged after the read was sent, at a revision not known: it may be in the read.
        if a.revision == 0 && d.read_sent_at.is_some_and(|r| i >= r) && expect == Expect::Present {
            expect = Expect::Either;
        }
        per_key.entry(a.key.as_str()).or_default().push((e, a.revision, i, expect));
    }
    let mut unknown: HashMap<&str, Vec<&Unknown>> = HashMap::new();
    for u in &d.unknown {
        unknown.entry(u.key.as_str()).or_default().push(u);
    }
    let (mut lost, mut wrong, mut resurrected, mut deleted_back) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut first_lost = usize::MAX;
    for (key, mut writes) in per_key {
        if writes.iter().any(|w| w.1 == 0) {
            // A write of the key without a known revision: acknowledgement order, which is
            // application order for a key with one writer (the API workload's objects each
            // have one client; the unique-key writer never writes a key twice).
            writes.sort_unstable_by_key(|w| (w.0, w.2));
        } else {
            writes.sort_unstable_by_key(|w| (w.0, w.1, w.2));
        }
        let mut allowed = Allowed::default();
        let mut absent_expected = Vec::new();
        let mut last_at = 0;
        for &(_, _, i, expect) in &writes {
            let a = acks[i];
            match expect {
                Expect::Present => {
                    allowed = Allowed { last: Some(a), either: vec![] };
                    absent_expected.clear();
                    last_at = i;
                }
                Expect::Either => allowed.either.push(a.value.as_deref()),
                Expect::Absent => absent_expected.push(a),
            }
        }
        let start = allowed.last.map_or(0, |a| a.start);
        for u in unknown.get(key).into_iter().flatten() {
            // Compare-guarded: a write applied after the last acknowledged one compared against
            // its revision, so it was sent after that one was; a create may apply after any
            // delete, and an unguarded write after any write, whenever it was sent.
            if u.any_time || u.start >= start {
                allowed.either.push(u.value.as_deref());
            }
        }
        let now = d.read.get(key).map(String::as_str);
        if allowed.admits(now) {
            continue;
        }
        match (allowed.last, now) {
            (Some(a), None) if a.value.is_some() => {
                lost.push(key.to_string());
                first_lost = first_lost.min(last_at);
            }
            (Some(a), Some(_)) if a.value.is_none() => deleted_back.push(key.to_string()),
            (_, Some(v)) if absent_expected.iter().any(|a| a.value.as_deref() == Some(v)) => resurrected.push(key.to_string()),
            _ => wrong.push(key.to_string()),
        }
    }
    for v in [&mut lost, &mut wrong, &mut resurrected, &mut deleted_back] {
        v.sort();
    }
    let s = |v: &[String]| sample(&v.iter().map(String::as_str).collect::<Vec<_>>());
    if !lost.is_empty() {
        parts.push(format!(
            "{} of {} acknowledged writes lost ({}; the first is ack #{first_lost}{})",
            lost.len(),
            d.acked.len(),
            s(&lost),
            context(&d.marks)
        ));
    }
    if !wrong.is_empty() {
        parts.push(format!("{} read back with a value no acknowledged or in-doubt write explains ({})", wrong.len(), s(&wrong)));
    }
    if !deleted_back.is_empty() {
        parts.push(format!("{} deleted (acknowledged) but present again ({})", deleted_back.len(), s(&deleted_back)));
    }
    if !resurrected.is_empty() {
        parts.push(format!(
            "{} written after the restored backup are still there ({}): the restore did not restore",
            resurrected.len(),
            s(&resurrected)
        ));
    }
    if parts.is_empty() {
        return Verdict::Pass;
    }
    Verdict::Definite(parts.join("; "))
}

fn sample(v: &[&str]) -> String {
    let head = v.iter().take(3).copied().collect::<Vec<_>>().join(", ");
    if v.len() > 3 {
        format!("{head}, …")
    } else {
        head
    }
}

/// The backup and restore positions, for messages.
pub(crate) fn context(marks: &Marks) -> String {
    let mut parts: Vec<String> = marks.backups.iter().map(|(b, m)| format!("{b} taken during acks #{}..#{}", m.start, m.end)).collect();
    parts.extend(marks.restores.iter().map(|r| {
        let what = match r.point {
            Some(p) => format!("{} recovered to the instant after ack #{}", r.backup, p.start),
            None => format!("{} restored", r.backup),
        };
        match r.end {
            usize::MAX => format!("{what}: begun at ack #{} and not finished", r.start),
            e => format!("{what} during acks #{}..#{e}", r.start),
        }
    }));
    if parts.is_empty() {
        String::new()
    } else {
        format!("; {}", parts.join(", "))
    }
}
