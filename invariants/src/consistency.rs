//! `consistency`: etcd is a deterministic state machine, so replicas that applied the same log
//! hold the same store.
//!
//! - **Revision against applied index.** Each member's status answer reads the store revision
//!   before the applied raft index, and a second status request after it reads the revision
//!   again: on a correct replica `revision ≤ rev(applied + 1)` in the first answer and
//!   `revision_after ≥ rev(applied)`, where `rev(i)` — the revision after applying entry `i` — is
//!   the same on every replica, and one entry adds at most one revision. So a member that applied
//!   at least as much of the log as another (`applied_m ≥ applied_n`) holds `revision_after_m ≥
//!   rev(applied_n) ≥ revision_n − 1`; reporting less holds a store that did not apply what its
//!   raft index says it did (or started from another store: a restore from mixed backups). No
//!   lag tolerance: a follower that is merely behind has applied less.
//! - **At a quiet point, exactly.** Status is read again until two answers in a row agree and
//!   report nothing committed beyond the applied index (an entry in the applier's hands may have
//!   bumped the revision before it is counted as applied); such
//!   a member's store holds exactly the entries up to its applied index, so two of them with the
//!   same applied index hold the same revision, and more applied entries never mean fewer
//!   revisions or more revisions than entries (a revision-numbering shift between members, as in
//!   etcd-io/etcd#13766, is named as a divergence with no tolerance).
//! - **Hash at a common revision.** HashKV at a revision every reachable member has reached
//!   must be equal: their histories up to it are the same log applied in the same order.

use std::collections::BTreeMap;

use crate::{MemberStatus, Observation, Verdict};

pub(crate) fn consistency(obs: &Observation) -> Verdict {
    crate::known::with_txn_range_refused(stores(obs), obs)
}

fn stores(obs: &Observation) -> Verdict {
    if obs.members.is_empty() {
        return Verdict::Unobserved("no member statuses".into());
    }
    let reachable: Vec<&MemberStatus> = obs.members.iter().filter(|m| m.reachable && m.revision > 0 && m.applied_index > 0).collect();
    for m in &reachable {
        let Some(after) = m.revision_after else { continue };
        if let Some(n) = reachable
            .iter()
            .filter(|n| n.name != m.name && n.applied_index <= m.applied_index && n.revision > after + 1)
            .max_by_key(|n| n.revision)
        {
            return Verdict::Definite(format!(
                "{} applied the log up to raft index {} but its store is at revision {after}, behind {} at revision {} with raft index {}: {}'s store did not apply what its raft index says ({})",
                m.name,
                m.applied_index,
                n.name,
                n.revision,
                n.applied_index,
                m.name,
                states(&reachable)
            ) + &odd_one_out(&reachable)
                + &known_defect(&[m]));
        }
    }
    if let Some(v) = quiet_points(&reachable) {
        return v;
    }
    // By (revision, compacted revision): HashKV hashes the history between the two, so members
    // that have applied a compaction and members that have not yet hash different ranges.
    let mut by_rev: BTreeMap<(i64, i64), BTreeMap<u32, Vec<&str>>> = BTreeMap::new();
    for m in &obs.members {
        if let Some((rev, hash)) = m.hash {
            by_rev.entry((rev, m.hash_from)).or_default().entry(hash).or_default().push(&m.name);
        }
    }
    for ((rev, from), hashes) in by_rev {
        if hashes.len() > 1 {
            let detail: Vec<String> = hashes.iter().map(|(h, who)| format!("{h:08x} on {}", who.join(","))).collect();
            let hashed: Vec<&MemberStatus> =
                obs.members.iter().filter(|m| m.hash.is_some_and(|(r, _)| r == rev) && m.hash_from == from).collect();
            let rev = if from > 0 { format!("{rev} (from the compaction at {from})") } else { rev.to_string() };
            // Every member has applied revision `rev`, so their stores up to it must be equal
            // whatever else is in flight: the verdict is definite (for members at the same
            // compacted revision: compaction is what changes what HashKV covers). It names each member's state: a
            // replica that applied the same raft log as the others but holds other data diverged
            // from the log (etcd 3.5.0–3.5.2 after a crash under load: etcd-io/etcd#13766,
            // docs/findings.md); a lost write found by `durability` in the same check is its
            // consequence.
            let same_index = hashed.windows(2).all(|w| w[0].raft_index == w[1].raft_index);
            let tail = if same_index { "; same raft index on every member: a replica diverged from the replicated log" } else { "" };
            return Verdict::Definite(
                format!("members disagree on the KV hash at revision {rev}: {} ({}{tail})", detail.join("; "), states(&hashed))
                    + &known_defect(&hashed),
            );
        }
    }
    Verdict::Pass
}

/// At quiet points no tolerance is needed: a member whose two status answers in a row agreed
/// holds exactly `rev(applied)`, so for two such members with `applied_m ≥ applied_n`,
/// `0 ≤ revision_m − revision_n ≤ applied_m − applied_n`. The same applied index with different
/// revisions is a divergence, named at the check where it first shows.
fn quiet_points(reachable: &[&MemberStatus]) -> Option<Verdict> {
    let quiet: Vec<(&MemberStatus, i64, u64)> = reachable.iter().filter_map(|m| m.settled.map(|(r, a)| (*m, r, a))).collect();
    for &(m, rm, am) in &quiet {
        for &(n, rn, an) in &quiet {
            if m.name == n.name || am < an || (am == an && m.name > n.name) {
                continue;
            }
            let entries = (am - an) as i64;
            let said = if am == an && rm != rn {
                format!("{} and {} applied the same log up to raft index {am} but their stores are at revisions {rm} and {rn}: a replica diverged from the replicated log", m.name, n.name)
            } else if am == an {
                continue;
            } else if rm < rn {
                format!("{} applied the log up to raft index {am} but its store is at revision {rm}, behind {} at revision {rn} with raft index {an}: {}'s store did not apply what its raft index says", m.name, n.name, m.name)
            } else if rm - rn > entries {
                format!("{} is at revision {rm} with raft index {am}, {} revisions ahead of {} at revision {rn} with raft index {an}, though one entry adds at most one revision: the stores diverged", m.name, rm - rn, n.name)
            } else {
                continue;
            };
            let quiet_states: Vec<String> =
                quiet.iter().map(|(m, r, a)| format!("{} at revision {r}, applied index {a}", m.name)).collect();
            return Some(Verdict::Definite(
                format!("{said} (each read at a quiet point, two status answers in a row agreeing: {})", quiet_states.join(", "))
                    + &odd_one_out(reachable)
                    + &known_defect(&[m, n]),
            ));
        }
    }
    None
}

/// Which store is out of line, when it shows: among members read at a quiet point with the same
/// applied index, a revision that a strict majority of them hold, and the members that hold
/// another. A pairwise rule names two members; this names the one whose store differs from the
/// rest (a member restored from an old backup, a replica that skipped an entry). Empty when no
/// such majority exists.
fn odd_one_out(reachable: &[&MemberStatus]) -> String {
    let mut by_index: BTreeMap<u64, BTreeMap<i64, Vec<&str>>> = BTreeMap::new();
    for m in reachable {
        if let Some((rev, applied)) = m.settled {
            by_index.entry(applied).or_default().entry(rev).or_default().push(&m.name);
        }
    }
    for (applied, revs) in by_index.into_iter().filter(|(_, revs)| revs.len() > 1) {
        let total: usize = revs.values().map(Vec::len).sum();
        let Some((&rev, most)) = revs.iter().find(|(_, who)| who.len() * 2 > total) else { continue };
        let others: Vec<String> =
            revs.iter().filter(|(r, _)| **r != rev).map(|(r, who)| format!("{} at revision {r}", who.join(", "))).collect();
        return format!(
            ". At raft index {applied}, {} agree on revision {rev} and {} not: the store out of line is {}'s",
            most.join(", "),
            others.join(", "),
            revs.iter().filter(|(r, _)| **r != rev).flat_map(|(_, who)| who.iter().copied()).collect::<Vec<_>>().join(", ")
        );
    }
    String::new()
}

/// The etcd releases that persist a member's consistent index ahead of the data it covers, so
/// that a member that crashes under load — killed, or its disk lost — can skip an applied entry
/// for good (etcd-io/etcd#13766; fixed in 3.5.3).
const CONSISTENT_INDEX_DEFECT: [&str; 3] = ["3.5.0", "3.5.1", "3.5.2"];

/// Names the known etcd defect behind a diverged replica when one of `ms` runs an affected
/// release (its status answer's version): a run on such a binary that fails here has most
/// likely rediscovered it, and its verdict says so.
fn known_defect(ms: &[&MemberStatus]) -> String {
    let affected = on_affected_release(ms.iter().copied());
    if affected.is_empty() {
        return String::new();
    }
    format!(
        ". Known etcd defect: {affected} — etcd 3.5.0–3.5.2 can persist a member's consistent index ahead of its data, so a member that crashed under load (killed, or its disk lost) skips an applied entry for good, and under compare-guarded updates the gap then grows (etcd-io/etcd#13766, fixed in 3.5.3; docs/findings.md, finding 1). Run the 3.5 members on etcd ≥ 3.5.3 (--etcd 3.5=PATH)"
    )
}

/// "m1 runs etcd 3.5.1, …" for the members of `ms` on a release with the defect; empty if none.
fn on_affected_release<'a>(ms: impl Iterator<Item = &'a MemberStatus>) -> String {
    ms.filter_map(|m| m.version.as_deref().filter(|v| CONSISTENT_INDEX_DEFECT.contains(v)).map(|v| format!("{} runs etcd {v}", m.name)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// For other invariants' verdicts (a lost write): the members of `obs` on an affected release,
/// named as a possible cause — a lost write has other causes, so it is only a pointer.
pub(crate) fn possible_defect(obs: &Observation) -> String {
    let affected = on_affected_release(obs.members.iter());
    if affected.is_empty() {
        return String::new();
    }
    format!(
        " — possibly the known etcd defect: {affected} (etcd-io/etcd#13766: a member that crashed under load can skip an applied entry and serve reads without it; fixed in 3.5.3); a `consistency` failure in the same check confirms it"
    )
}

fn states(ms: &[&MemberStatus]) -> String {
    ms.iter()
        .map(|m| format!("{} at revision {}, raft index {} (applied {})", m.name, m.revision, m.raft_index, m.applied_index))
        .collect::<Vec<_>>()
        .join(", ")
}
