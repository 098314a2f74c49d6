//! `durability`: every acknowledged write is readable with its value; after a restore, the writes
//! before the backup are there and those between the backup and the restore are gone.

use shakedown_faults::Model;

use crate::{Marks, Observation, Verdict};

/// What the current data must say about the write acknowledged at position `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Present,
    Absent,
    Either,
}

/// The expectation for the write at position `i`, following the chain of restores: after a
/// restore from backup B, writes before B's snapshot are what they were expected to be then,
/// writes during the snapshot or the restore may be either, writes between them are gone.
pub fn expect_write(i: usize, marks: &Marks) -> Expect {
    fn at(i: usize, marks: &Marks, restores: usize) -> Expect {
        let Some(&(backup, r_start, r_end)) = marks.restores[..restores].last() else { return Expect::Present };
        if i >= r_end {
            return Expect::Present;
        }
        if i >= r_start {
            return Expect::Either;
        }
        let Some(&(b_start, b_end)) = marks.backups.get(&backup) else { return Expect::Either };
        if i >= b_end {
            return Expect::Absent;
        }
        if i >= b_start {
            return Expect::Either;
        }
        // Before the backup: as expected when the backup was taken, i.e. after the restores that
        // came before this one and had finished by then (strictly earlier: the recursion ends).
        let earlier = marks.restores[..restores - 1].iter().take_while(|(_, _, end)| *end <= b_start).count();
        at(i, marks, earlier)
    }
    at(i, marks, marks.restores.len())
}

pub(crate) fn durability(model: &Model, obs: &Observation) -> Verdict {
    // Without quorum nothing can be read back; the writes are checked once quorum is back.
    if !model.service_expected_up() {
        return Verdict::Pass;
    }
    let Some(d) = &obs.durability else {
        return Verdict::Pass;
    };
    if let Some(err) = &d.read_error {
        return Verdict::Fail(format!("could not read back the acknowledged writes: {err}"));
    }
    let mut lost = Vec::new();
    let mut wrong = Vec::new();
    let mut resurrected = Vec::new();
    for (i, (key, value)) in d.acked.iter().enumerate() {
        match (expect_write(i, &d.marks), d.read.get(key)) {
            (Expect::Present, None) => lost.push(key.as_str()),
            (Expect::Present | Expect::Either, Some(v)) if v != value => wrong.push(key.as_str()),
            (Expect::Absent, Some(_)) => resurrected.push(key.as_str()),
            _ => {}
        }
    }
    if lost.is_empty() && wrong.is_empty() && resurrected.is_empty() {
        return Verdict::Pass;
    }
    let sample = |v: &[&str]| {
        let head = v.iter().take(3).copied().collect::<Vec<_>>().join(", ");
        if v.len() > 3 {
            format!("{head}, …")
        } else {
            head
        }
    };
    let mut parts = Vec::new();
    if !lost.is_empty() {
        let first = d.acked.iter().position(|(k, _)| k == lost[0]).unwrap_or(0);
        parts.push(format!("{} of {} acknowledged writes lost ({}; the first is ack #{first}{})", lost.len(), d.acked.len(), sample(&lost), context(&d.marks)));
    }
    if !wrong.is_empty() {
        parts.push(format!("{} read back with a different value ({})", wrong.len(), sample(&wrong)));
    }
    if !resurrected.is_empty() {
        parts.push(format!("{} written after the restored backup are still there ({}): the restore did not restore", resurrected.len(), sample(&resurrected)));
    }
    Verdict::Definite(parts.join("; "))
}

/// The backup and restore positions, for messages.
fn context(marks: &Marks) -> String {
    let mut parts: Vec<String> = marks.backups.iter().map(|(b, (s, e))| format!("{b} taken during acks #{s}..#{e}")).collect();
    parts.extend(marks.restores.iter().map(|(b, s, e)| match *e {
        usize::MAX => format!("{b} restore begun at ack #{s} and not finished"),
        e => format!("{b} restored during acks #{s}..#{e}"),
    }));
    if parts.is_empty() {
        String::new()
    } else {
        format!("; {}", parts.join(", "))
    }
}
