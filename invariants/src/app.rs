//! The application target's invariants: the application converges (`app-ready`) and keeps what
//! it acknowledged (`app-durability`).

use shakedown_faults::Model;

use crate::durability::{expect_write, Expect};
use crate::observation::Observation;
use crate::Verdict;

/// Every named workload has all its replicas Ready (the StatefulSet's partitioned replicas, and
/// those in the groups of a group partition, excepted: cut off, they may not be) and every probe passes. Converging: a failure is retried
/// until the profile's bound.
pub(crate) fn app_ready(model: &Model, obs: &Observation) -> Verdict {
    let Some(app) = &obs.app else { return Verdict::Unobserved("no application observation".into()) };
    let cut = model.partitioned.len() as i32 + if model.groups_partitioned.is_some() { app.in_cut_groups } else { 0 };
    let excused = |name: &str| if name.starts_with("statefulset/") { cut } else { 0 };
    let mut parts: Vec<String> = app
        .workloads
        .iter()
        .filter(|w| w.ready < w.desired - excused(&w.name))
        .map(|w| format!("{}: {}/{} Ready", w.name, w.ready, w.desired))
        .collect();
    parts.extend(app.probes.iter().filter_map(|(name, why)| why.as_ref().map(|w| format!("probe {name}: {w}"))));
    match parts.is_empty() {
        true => Verdict::Pass,
        false => Verdict::Fail(parts.join("; ")),
    }
}

/// Every acknowledged write is read back with its value; nothing is read that was never
/// written (a write of unknown outcome may be either). After a restore, the rule of
/// `durability` ([`expect_write`]): the writes acknowledged before the restored backup began are
/// there, those sent after it ended are gone (one still there: the restore did not restore), and
/// those in flight during the backup or the restore may be either. A missing, changed or
/// resurrected write in a successful read is definite: waiting does not change data. A failed
/// read converges.
pub(crate) fn app_durability(obs: &Observation) -> Verdict {
    let Some(app) = &obs.app else { return Verdict::Unobserved("no application observation".into()) };
    let Some(data) = &app.data else { return Verdict::Unobserved("no read-back of the data workload".into()) };
    let read = match &data.read {
        Ok(r) => r,
        Err(e) => return Verdict::Fail(format!("the read command failed: {e}")),
    };
    let mut lost = vec![];
    let mut changed = vec![];
    let mut resurrected = vec![];
    let mut expected = 0;
    for (i, (k, v, start)) in data.acked.iter().enumerate() {
        let expect = expect_write(i, *start, &data.marks);
        expected += usize::from(expect == Expect::Present);
        match (expect, read.get(k)) {
            (Expect::Present, None) => lost.push(k.as_str()),
            (Expect::Present, Some(got)) if got != v => changed.push(format!("{k} = {got:?}, acknowledged {v:?}")),
            (Expect::Absent, Some(_)) => resurrected.push(k.as_str()),
            _ => {}
        }
    }
    let written: std::collections::BTreeSet<&str> = data.acked.iter().map(|(k, ..)| k.as_str()).collect();
    let unexplained: Vec<&str> =
        read.keys().filter(|k| !written.contains(k.as_str()) && !data.unknown.contains(*k)).map(String::as_str).collect();
    if lost.is_empty() && changed.is_empty() && unexplained.is_empty() && resurrected.is_empty() {
        return Verdict::Pass;
    }
    let first = |v: &[&str]| v.iter().take(5).copied().collect::<Vec<_>>().join(", ");
    let mut parts = vec![];
    if !lost.is_empty() {
        parts.push(format!("{} of {expected} acknowledged writes lost (first: {})", lost.len(), first(&lost)));
    }
    if !changed.is_empty() {
        parts.push(format!("{} changed ({})", changed.len(), changed.iter().take(3).cloned().collect::<Vec<_>>().join("; ")));
    }
    if !resurrected.is_empty() {
        parts.push(format!(
            "{} written after the restored backup (or instant) are still there ({}): the restore did not restore",
            resurrected.len(),
            first(&resurrected)
        ));
    }
    if !unexplained.is_empty() {
        parts.push(format!("{} keys read that were never written ({})", unexplained.len(), first(&unexplained)));
    }
    Verdict::Definite(parts.join("; ") + &crate::durability::context(&data.marks))
}
