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
            return Verdict::Fail(format!("members disagree on the KV hash at revision {rev}: {}", detail.join("; ")));
        }
    }
    Verdict::Pass
}
