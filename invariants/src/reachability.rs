//! `reachability`: a linearizable read through the endpoint succeeds within the deadline
//! whenever the model says the service is up.

use shakedown_faults::{Answers, Model};

use crate::{Observation, Probe, Verdict};

pub(crate) fn reachability(model: &Model, obs: &Observation) -> Verdict {
    if !model.service_expected_up() {
        return Verdict::Pass;
    }
    if obs.probes.is_empty() {
        return Verdict::Unobserved("no probe through the endpoint ran".into());
    }
    let failed: Vec<&Probe> = obs.probes.iter().filter(|p| p.error.is_some()).collect();
    if failed.is_empty() {
        return Verdict::Pass;
    }
    let detail: Vec<String> =
        failed.iter().map(|p| format!("{} after {}ms", p.error.as_deref().unwrap_or_default(), p.latency_ms)).collect();
    Verdict::Fail(format!(
        "{} of {} linearizable reads through the endpoint failed although the model says the service is up: {}",
        failed.len(),
        obs.probes.len(),
        detail.join("; ")
    ))
}

/// `api-reachability`: whenever the model says the control plane is up, every request through
/// the API load balancer succeeds, and every apiserver whose machine the model says answers is
/// ready (`/readyz`); an apiserver whose machine is down (crashed, paused, cut off) answers
/// nothing — if it does, the fault did not take effect.
pub(crate) fn api_reachability(model: &Model, obs: &Observation) -> Verdict {
    let Some(api) = &obs.api else { return Verdict::Unobserved("no Kubernetes API observation".into()) };
    let mut parts = Vec::new();
    for a in &api.apiservers {
        let Some(m) = a.member.and_then(|id| model.members.get(&id)) else { continue };
        let detail = a.detail.as_deref().unwrap_or("no detail");
        match model.answers(m) {
            Answers::No if a.answered => parts.push(format!(
                "{} answered /readyz ({}) although its machine {} is down in the model",
                a.name,
                if a.ready { "ready" } else { detail },
                m.id
            )),
            Answers::Yes if model.service_expected_up() && !a.ready => {
                parts.push(format!("{} is not ready although its machine {} is up and etcd has quorum: {detail}", a.name, m.id))
            }
            _ => {}
        }
    }
    if model.service_expected_up() {
        let failed: Vec<&Probe> = api.endpoint.iter().filter(|p| p.error.is_some()).collect();
        if api.endpoint.is_empty() {
            parts.push("no request through the API load balancer ran".into());
        } else if !failed.is_empty() {
            let detail: Vec<String> =
                failed.iter().map(|p| format!("{} after {}ms", p.error.as_deref().unwrap_or_default(), p.latency_ms)).collect();
            parts.push(format!(
                "{} of {} requests through the API load balancer failed although the model says the control plane is up: {}",
                failed.len(),
                api.endpoint.len(),
                detail.join("; ")
            ));
        }
    }
    if parts.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(parts.join("; "))
    }
}
