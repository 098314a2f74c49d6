//! `reachability`: a linearizable read through the endpoint succeeds within the deadline
//! whenever the model says the service is up.

use shakedown_faults::Model;

use crate::{Observation, Probe, Verdict};

pub(crate) fn reachability(model: &Model, obs: &Observation) -> Verdict {
    if !model.service_expected_up() {
        return Verdict::Pass;
    }
    if obs.probes.is_empty() {
        return Verdict::Fail("no probe ran".into());
    }
    let failed: Vec<&Probe> = obs.probes.iter().filter(|p| p.error.is_some()).collect();
    if failed.is_empty() {
        return Verdict::Pass;
    }
    let detail: Vec<String> = failed.iter().map(|p| format!("{} after {}ms", p.error.as_deref().unwrap_or_default(), p.latency_ms)).collect();
    Verdict::Fail(format!(
        "{} of {} linearizable reads through the endpoint failed although the model says the service is up: {}",
        failed.len(),
        obs.probes.len(),
        detail.join("; ")
    ))
}
