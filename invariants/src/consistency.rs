//! `consistency`: members agree on the KV hash at a common revision, and no store falls far
//! behind the most advanced one.

use std::collections::BTreeMap;

use crate::{Observation, Verdict, MAX_REVISION_LAG};

pub(crate) fn consistency(obs: &Observation) -> Verdict {
    let reachable = obs.members.iter().filter(|m| m.reachable && m.revision > 0);
    if let Some(newest) = reachable.clone().map(|m| m.revision).max() {
        let stalled: Vec<String> = reachable
            .filter(|m| newest - m.revision > MAX_REVISION_LAG)
            .map(|m| format!("{} at revision {} ({} behind)", m.name, m.revision, newest - m.revision))
            .collect();
        if !stalled.is_empty() {
            return Verdict::Fail(format!("store(s) trailing the newest revision {newest} by more than {MAX_REVISION_LAG}: {}", stalled.join(", ")));
        }
    }
    let mut by_rev: BTreeMap<i64, BTreeMap<u32, Vec<&str>>> = BTreeMap::new();
    for m in &obs.members {
        if let Some((rev, hash)) = m.hash {
            by_rev.entry(rev).or_default().entry(hash).or_default().push(&m.name);
        }
    }
    for (rev, hashes) in by_rev {
        if hashes.len() > 1 {
            let detail: Vec<String> = hashes.iter().map(|(h, who)| format!("{h:08x} on {}", who.join(","))).collect();
            // Where each member stands: a replica that applied the same raft log as the others
            // but holds other data diverged from the log (etcd 3.5.0–3.5.2 after a crash under
            // load: etcd-io/etcd#13766, docs/findings.md).
            let hashed: Vec<&crate::MemberStatus> = obs.members.iter().filter(|m| m.hash.is_some_and(|(r, _)| r == rev)).collect();
            let states: Vec<String> = hashed.iter().map(|m| format!("{} at revision {}, raft index {}", m.name, m.revision, m.raft_index)).collect();
            let same_index = hashed.windows(2).all(|w| w[0].raft_index == w[1].raft_index);
            let text = format!("members disagree on the KV hash at revision {rev}: {} ({}", detail.join("; "), states.join(", "));
            // Every member has applied revision `rev`, so their histories up to it must be equal
            // whatever else is in flight. With the same raft index on every member nothing can
            // still converge: the verdict is definite and names the divergence (it is the cause;
            // a lost write found by `durability` in the same check is its consequence).
            if same_index {
                return Verdict::Definite(format!("{text}; same raft index on every member: a replica diverged from the replicated log)"));
            }
            return Verdict::Fail(format!("{text})"));
        }
    }
    Verdict::Pass
}
