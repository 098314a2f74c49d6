//! `quorum`: exactly one leader among reachable members; members serving ≥ quorum whenever the
//! model says quorum holds, at the end of a step and at every instant during it.

use std::collections::BTreeSet;

use shakedown_faults::Model;

use crate::{names, Leader, MemberStatus, Observation, ServingSample, Verdict, MIN_LOSS_WINDOW_MS};

pub(crate) fn quorum(model: &Model, obs: &Observation) -> Verdict {
    // During the step: a majority of the membership kept serving at every instant, when the
    // model says quorum holds throughout the step. Windows shorter than MIN_LOSS_WINDOW_MS are
    // below the samplers' resolution (a member's answer and another's refusal a few ms apart).
    if obs.quorum_throughout {
        let lost = |s: &ServingSample| s.serving.len() < s.cluster_size / 2 + 1;
        let samples = &obs.serving_samples;
        let mut i = 0;
        while i < samples.len() {
            if !lost(&samples[i]) {
                i += 1;
                continue;
            }
            let start = &samples[i];
            let end = samples[i..].iter().find(|l| !lost(l));
            let end_ms = end.map_or(obs.samples_until_ms, |e| e.at_ms);
            let long_enough = end_ms.saturating_sub(start.at_ms) >= MIN_LOSS_WINDOW_MS;
            if long_enough {
                let until = end.map(|l| format!("until +{}ms", l.at_ms)).unwrap_or_else(|| format!("until at least +{end_ms}ms"));
                return Verdict::Definite(format!(
                    "quorum lost during the step: from +{}ms {until} only {} of {} were serving ({})",
                    start.at_ms,
                    start.serving.len(),
                    shakedown_faults::counted(start.cluster_size as u64, "member"),
                    names(&start.serving),
                ));
            }
            i += samples[i..].iter().position(|l| !lost(l)).unwrap_or(samples.len() - i);
        }
    }
    if obs.members.is_empty() {
        return Verdict::Unobserved("no member statuses".into());
    }
    let reachable: Vec<&MemberStatus> = obs.members.iter().filter(|m| m.reachable).collect();
    let leaders: BTreeSet<u64> = reachable
        .iter()
        .filter_map(|m| match m.leader {
            Some(Leader::Id(id)) => Some(id),
            _ => None,
        })
        .collect();
    if leaders.len() > 1 {
        let who: Vec<String> = reachable
            .iter()
            .map(|m| {
                format!(
                    "{} sees {}",
                    m.name,
                    match m.leader {
                        Some(Leader::Id(l)) => format!("{l:x}"),
                        Some(Leader::Unnamed) => "a leader".into(),
                        None => "none".into(),
                    }
                )
            })
            .collect();
        return Verdict::Fail(format!("{} different leaders among reachable members: {}", leaders.len(), who.join(", ")));
    }
    if !model.quorum_expected() {
        return Verdict::Pass;
    }
    // Members that see the leader: the one named, or any when the target cannot name it.
    let named = leaders.iter().next().copied();
    let sees_it = |m: &MemberStatus| match m.leader {
        Some(Leader::Id(l)) => Some(l) == named,
        Some(Leader::Unnamed) => true,
        None => false,
    };
    if !reachable.iter().any(|m| sees_it(m)) {
        return Verdict::Fail(format!(
            "no leader, although {} of {} are expected up (quorum {}){}",
            model.up(),
            shakedown_faults::counted(model.size() as u64, "member"),
            model.quorum(),
            crate::known::leaderless(&obs.members)
        ));
    };
    let healthy: Vec<&str> = reachable
        .iter()
        .filter(|m| sees_it(m) && m.member.is_some_and(|id| model.members.contains_key(&id)))
        .map(|m| m.name.as_str())
        .collect();
    if healthy.len() < model.quorum() {
        return Verdict::Fail(format!(
            "only {} healthy voting members ({}) of {}; quorum is {}",
            healthy.len(),
            healthy.join(", "),
            model.size(),
            model.quorum()
        ));
    }
    Verdict::Pass
}
