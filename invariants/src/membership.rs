//! `membership`: the etcd member list equals the model's members, nothing stale, nothing missing.

use std::collections::{BTreeMap, BTreeSet};

use shakedown_faults::Model;

use crate::{ListedMember, Observation, Verdict};

pub(crate) fn membership(model: &Model, obs: &Observation) -> Verdict {
    let Some(list) = &obs.member_list else {
        if model.quorum_expected() {
            return Verdict::Fail("no member answered the member list request".into());
        }
        return Verdict::Pass;
    };
    let listed: BTreeMap<String, &ListedMember> = list.iter().map(|m| (m.name.clone(), m)).collect();
    let expected: BTreeSet<String> = model.members.keys().map(|id| id.to_string()).collect();
    // A member added but not started yet has an empty name; list it by peer URL.
    let stale: Vec<String> = listed
        .iter()
        .filter(|(name, _)| !expected.contains(*name))
        .map(|(name, m)| {
            let id = m.id.map(|id| format!(" {id:x}")).unwrap_or_default();
            if name.is_empty() {
                format!("unstarted member{id} ({})", m.peer_urls.join(","))
            } else if id.is_empty() {
                format!("{name} ({})", m.peer_urls.join(","))
            } else {
                format!("{name} ({})", id.trim())
            }
        })
        .collect();
    let missing: Vec<&String> = expected.iter().filter(|n| !listed.contains_key(*n)).collect();
    if stale.is_empty() && missing.is_empty() {
        return Verdict::Pass;
    }
    let mut parts = Vec::new();
    if !stale.is_empty() {
        parts.push(format!("stale member(s) not in the model: {}", stale.join(", ")));
    }
    if !missing.is_empty() {
        parts.push(format!("missing member(s): {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")));
    }
    Verdict::Fail(format!("member list differs from the model: {}", parts.join("; ")))
}
