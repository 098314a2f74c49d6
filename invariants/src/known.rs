//! Known etcd behaviour that a leaderless verdict names: what shakedown has met and root-caused
//! (`docs/findings.md`), told to the user beside the symptom instead of a check turned off.

use crate::{MemberStatus, Observation, Verdict};

/// For a verdict that found no leader: names raft without pre-vote when a reachable member runs
/// an etcd release where `--pre-vote` is off by default (before 3.5), with every reachable
/// member's raft term as the evidence of the elections. Empty when none does.
///
/// Without pre-vote, a member that was cut off (an isolated site, a paused member) campaigns at
/// ever higher terms; when it is back its answer to the leader's heartbeat carries that term and
/// the leader steps down. Its log is behind, so it cannot win, and its next campaigns reset the
/// others' election timers: the cluster can stay leaderless for several election timeouts
/// (etcd-io/etcd#9333, #12959). etcd 3.5 turns pre-vote on by default.
pub(crate) fn leaderless(members: &[MemberStatus]) -> String {
    let reachable: Vec<&MemberStatus> = members.iter().filter(|m| m.reachable).collect();
    let without: Vec<String> = reachable
        .iter()
        .filter_map(|m| m.version.as_deref().filter(|v| pre_vote_off_by_default(v)).map(|v| format!("{} runs etcd {v}", m.name)))
        .collect();
    if without.is_empty() {
        return String::new();
    }
    let terms: Vec<String> = reachable.iter().filter_map(|m| m.raft_term.map(|t| format!("{} {t}", m.name))).collect();
    let terms = if terms.is_empty() {
        String::new()
    } else {
        format!(" Raft term of each member's last applied entry (what etcd's status reports: campaigns that elected nobody do not show in it): {}.", terms.join(", "))
    };
    format!(
        ". Known etcd behaviour: {} — raft without pre-vote (--pre-vote is off by default before 3.5): a member back from isolation or a pause returns at a higher term, the leader steps down, and the returning member's campaigns can keep the cluster leaderless for several election timeouts (etcd-io/etcd#9333, #12959; docs/findings.md, finding 3); etcd 3.5, or --pre-vote=true, avoids it.{terms}",
        without.join(", ")
    )
}

/// For a verdict on stores that diverged, or on what a diverged store shows (answers no order
/// explains, a watch or a read-back with other writes than were acknowledged): names
/// etcd-io/etcd#18667 when the workload sent transactions with writes that a member refused for a
/// range at a revision it had compacted away (or not reached), or such transactions that got no
/// answer after a compaction passed their range's revision. Empty when it sent none. The
/// verdict still fails: the members hold different data.
///
/// A member applies a transaction it did not receive from the client with its ranges stripped
/// (they answer nobody there), so the revision check of those ranges happens only on the member
/// that did: it refuses the transaction, the others apply its writes. Every etcd release
/// installed here has it (3.4.23, 3.5.16; the fix, etcd-io/etcd#21432, is not in a release
/// here).
pub(crate) fn txn_range_refused(obs: &Observation) -> String {
    let Some(d) = &obs.durability else { return String::new() };
    let (refused, unanswered) = (&d.refused_write_txns, &d.unanswered_compacted_txns);
    let sent = match (refused.first(), unanswered.first()) {
        (None, None) => return String::new(),
        (Some(first), None) => format!(
            "{} transaction(s) with writes that a member refused for a range at a revision it no longer (or not yet) had, the first {first}",
            refused.len()
        ),
        (None, Some(first)) => format!(
            "{} transaction(s) with writes and a range at a revision since compacted that got no answer (so no refusal reached the client; applied after the compaction, the member that received one refuses it), the first {first}",
            unanswered.len()
        ),
        (Some(first), Some(other)) => format!(
            "{} transaction(s) with writes that a member refused for a range at a revision it no longer (or not yet) had, the first {first}; and {} more with such a range that got no answer, the first {other}",
            refused.len(),
            unanswered.len()
        ),
    };
    format!(
        ". Known etcd defect: the workload sent {sent}; the members that did not receive such a transaction from the client skip its ranges and apply its writes, so the stores diverge by a revision each time (etcd-io/etcd#18667; docs/findings.md, finding 7)"
    )
}

/// `v` with [`txn_range_refused`]'s note when it fails.
pub(crate) fn with_txn_range_refused(v: Verdict, obs: &Observation) -> Verdict {
    let note = txn_range_refused(obs);
    match v {
        Verdict::Definite(m) if !note.is_empty() => Verdict::Definite(m + &note),
        Verdict::Fail(m) if !note.is_empty() => Verdict::Fail(m + &note),
        v => v,
    }
}

/// An etcd release `3.minor.patch` as (minor, patch); `None` for anything else.
fn release(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(3)), Some(Some(minor)), Some(Some(patch))) => Some((minor, patch)),
        _ => None,
    }
}

/// etcd releases before 3.5 default `--pre-vote` to false (3.5.0 turned it on).
fn pre_vote_off_by_default(version: &str) -> bool {
    release(version).is_some_and(|(minor, _)| minor < 5)
}

/// etcd releases whose compaction removes a tombstone at exactly the compaction revision, so a
/// watch from that revision misses the delete (etcd-io/etcd#18089). Measured here: 3.4.23 and
/// 3.5.1 have it, 3.5.16 does not (`docs/findings/experiments/watch-compacted-tombstone.sh`); the
/// fix, etcd-io/etcd#18274, reached 3.5 between the two.
pub(crate) fn compaction_drops_tombstone(version: &str) -> bool {
    release(version).is_some_and(|(minor, patch)| minor < 5 || (minor == 5 && patch < 16))
}

/// etcd releases whose requested progress notifications are not synchronised with the watch
/// stream (etcd-io/etcd#15220; fixed in 3.4.25 and 3.5.8).
pub(crate) fn progress_ahead_of_events(version: &str) -> bool {
    release(version).is_some_and(|(minor, patch)| minor < 4 || (minor == 4 && patch < 25) || (minor == 5 && patch < 8))
}

/// For a watch that delivered a revision again or went back: names etcd-io/etcd#15271 when the
/// member that sent it runs a release with it (3.4 before 3.4.25, 3.5 before 3.5.8; the same
/// releases as etcd-io/etcd#15220). Empty otherwise. The verdict still fails: a watcher is told
/// events it has seen, and a cache built from it (kube-apiserver's) goes back in time.
///
/// A watch that has caught up with the store moves to etcd's "synced" group, where a sent event
/// does not advance the revision the watch is known to have reached. When the member installs a
/// snapshot from the leader, every synced watch is moved back to the "unsynced" group and replayed
/// from that stale revision: events the watch delivered are delivered again.
pub(crate) fn watch_back_after_snapshot(member: &str, version: &str) -> String {
    if !progress_ahead_of_events(version) {
        return String::new();
    }
    format!(
        ". Known etcd defect: {member} runs etcd {version} — a member that catches up through the leader's snapshot (back from a partition, or far behind) replays its watches from an older revision than they reached, so a watch delivers events again (etcd-io/etcd#15271, fixed in 3.4.25 and 3.5.8; docs/findings.md, finding 6). Run etcd ≥ 3.4.25 or ≥ 3.5.8"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str, version: &str, term: u64) -> MemberStatus {
        MemberStatus {
            reachable: true,
            version: Some(version.into()),
            raft_term: Some(term),
            ..MemberStatus::without_status(name.into(), None)
        }
    }

    #[test]
    fn pre_vote_is_named_for_3_4_members_with_their_terms() {
        let said = leaderless(&[status("m0", "3.4.23", 9), status("m1", "3.5.16", 9)]);
        assert!(said.contains("m0 runs etcd 3.4.23") && !said.contains("m1 runs"), "{said}");
        assert!(
            said.contains("etcd-io/etcd#9333") && said.contains("campaigns that elected nobody do not show in it): m0 9, m1 9."),
            "{said}"
        );
    }

    #[test]
    fn the_progress_defect_is_named_on_the_releases_before_its_fix() {
        for v in ["3.4.23", "3.4.24", "3.5.1", "3.5.7", "3.3.27"] {
            assert!(progress_ahead_of_events(v), "{v}");
        }
        for v in ["3.4.25", "3.5.8", "3.5.16", "3.6.0", "garbage", "3.5"] {
            assert!(!progress_ahead_of_events(v), "{v}");
        }
    }

    #[test]
    fn the_snapshot_watch_replay_is_named_on_the_releases_before_its_fix() {
        let said = watch_back_after_snapshot("m0", "3.4.23");
        assert!(said.contains("m0 runs etcd 3.4.23") && said.contains("etcd-io/etcd#15271"), "{said}");
        assert_eq!(watch_back_after_snapshot("m0", "3.5.16"), "");
        assert_eq!(watch_back_after_snapshot("m0", "3.4.25"), "");
    }

    #[test]
    fn nothing_is_named_on_3_5_or_an_unknown_version() {
        assert_eq!(leaderless(&[status("m0", "3.5.16", 3), status("m1", "3.5.1", 3)]), "");
        let mut unknown = status("m0", "x", 3);
        unknown.version = None;
        assert_eq!(leaderless(&[unknown, status("m1", "garbage", 1)]), "");
        // An unreachable member's version is not what answered.
        let mut gone = status("m2", "3.4.23", 1);
        gone.reachable = false;
        assert_eq!(leaderless(&[gone]), "");
    }
}
