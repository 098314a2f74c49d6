//! `members`: every member answers as the model expects: running members answer and see a
//! leader; paused, crashed and cut-off members do not answer.

use shakedown_faults::{Answers, Model};

use crate::{Observation, Verdict};

pub(crate) fn members(model: &Model, obs: &Observation) -> Verdict {
    if obs.members.is_empty() {
        return Verdict::Unobserved("no member statuses".into());
    }
    let mut wrong = Vec::new();
    for m in model.members.values() {
        let seen = obs.members.iter().find(|s| s.member == Some(m.id));
        let answers = seen.is_some_and(|s| s.reachable);
        match model.answers(m) {
            Answers::Yes if !answers => {
                let why = seen.and_then(|s| s.error.clone()).unwrap_or_else(|| "not running".into());
                wrong.push(format!("{} is expected running but does not answer ({why})", m.id));
            }
            Answers::Yes if model.quorum_expected() && seen.is_some_and(|s| s.leader.is_none()) => {
                wrong.push(format!("{} is expected running but sees no leader", m.id));
            }
            Answers::No if answers => {
                let why = match model.outages.get(&m.site) {
                    Some(mode) => format!("its site {} is out ({mode})", m.site),
                    None => format!("it is {:?}", m.state).to_lowercase(),
                };
                wrong.push(format!("{} answers although {why}", m.id));
            }
            _ => {}
        }
    }
    if wrong.is_empty() {
        return Verdict::Pass;
    }
    let leaderless =
        if wrong.iter().any(|w| w.ends_with("sees no leader")) { crate::known::leaderless(&obs.members) } else { String::new() };
    Verdict::Fail(wrong.join("; ") + &leaderless)
}
