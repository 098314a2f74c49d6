//! The application target's invariants: the application converges (`app-ready`) and keeps what
//! it acknowledged (`app-durability`).

use shakedown_faults::Model;

use crate::observation::Observation;
use crate::Verdict;

/// Every named workload has all its replicas Ready (the StatefulSet's partitioned replicas
/// excepted: cut off, they may not be) and every probe passes. Converging: a failure is retried
/// until the profile's bound.
pub(crate) fn app_ready(model: &Model, obs: &Observation) -> Verdict {
    let Some(app) = &obs.app else { return Verdict::Pass };
    let excused = |name: &str| if name.starts_with("statefulset/") { model.partitioned.len() as i32 } else { 0 };
    let mut parts: Vec<String> = app.workloads.iter().filter(|w| w.ready < w.desired - excused(&w.name)).map(|w| format!("{}: {}/{} Ready", w.name, w.ready, w.desired)).collect();
    parts.extend(app.probes.iter().filter_map(|(name, why)| why.as_ref().map(|w| format!("probe {name}: {w}"))));
    match parts.is_empty() {
        true => Verdict::Pass,
        false => Verdict::Fail(parts.join("; ")),
    }
}

/// Every acknowledged write is read back with its value; nothing is read that was never
/// written (a write of unknown outcome may be either). A missing or changed acknowledged write
/// in a successful read is definite: waiting does not bring data back. A failed read converges.
pub(crate) fn app_durability(obs: &Observation) -> Verdict {
    let Some(data) = obs.app.as_ref().and_then(|a| a.data.as_ref()) else { return Verdict::Pass };
    let read = match &data.read {
        Ok(r) => r,
        Err(e) => return Verdict::Fail(format!("the read command failed: {e}")),
    };
    let mut lost = vec![];
    let mut changed = vec![];
    for (k, v) in &data.acked {
        match read.get(k) {
            None => lost.push(k.as_str()),
            Some(got) if got != v => changed.push(format!("{k} = {got:?}, acknowledged {v:?}")),
            Some(_) => {}
        }
    }
    let unexplained: Vec<&str> = read.keys().filter(|k| !data.acked.contains_key(*k) && !data.unknown.contains(*k)).map(String::as_str).collect();
    if lost.is_empty() && changed.is_empty() && unexplained.is_empty() {
        return Verdict::Pass;
    }
    let mut parts = vec![];
    if !lost.is_empty() {
        parts.push(format!("{} of {} acknowledged writes lost (first: {})", lost.len(), data.acked.len(), lost.iter().take(5).copied().collect::<Vec<_>>().join(", ")));
    }
    if !changed.is_empty() {
        parts.push(format!("{} changed ({})", changed.len(), changed.iter().take(3).cloned().collect::<Vec<_>>().join("; ")));
    }
    if !unexplained.is_empty() {
        parts.push(format!("{} keys read that were never written ({})", unexplained.len(), unexplained.iter().take(5).copied().collect::<Vec<_>>().join(", ")));
    }
    Verdict::Definite(parts.join("; "))
}
