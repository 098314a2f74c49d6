//! `leases`: a key whose lease expired or was revoked is gone; a key whose lease is alive is not.
//!
//! The target reads in this order: the workload's leases (grants acknowledged), then etcd's live
//! leases, then the lease-attached keys. So a lease granted by the workload and not alive at the
//! second read had expired or been revoked before the third, and etcd deletes a lease's keys in
//! the same revision that removes the lease. And a lease cannot expire before its grant, or the
//! last keep-alive etcd answered, was sent + its TTL (a leader change only extends leases).

use shakedown_faults::Model;

use crate::observation::Revoke;
use crate::{Observation, Verdict};

pub(crate) fn leases(model: &Model, obs: &Observation) -> Verdict {
    if !model.service_expected_up() {
        return Verdict::Pass;
    }
    let Some(l) = &obs.leases else { return Verdict::Unobserved("no lease records of the workload".into()) };
    if let Some(e) = &l.error {
        return Verdict::Fail(format!("could not read the leases: {e}"));
    }
    let mut problems = Vec::new();
    for r in &l.records {
        let alive = l.alive.contains(&r.id);
        if r.revoke == Revoke::Acked && alive {
            problems.push(format!("lease {:x} was revoked (acknowledged) but etcd still lists it", r.id));
        }
        let attached: Vec<&String> = l.read.iter().filter(|(_, id)| **id == r.id).map(|(k, _)| k).collect();
        if !alive && !attached.is_empty() {
            let why = if r.revoke == Revoke::Acked { "revoked" } else { "expired or revoked" };
            problems.push(format!("lease {:x} is gone ({why}) but {} of its keys are still there ({})", r.id, attached.len(), attached[0]));
        }
        // Not due yet: granted (or kept alive) less than its TTL before the read returned, never
        // revoked.
        let due = r.granted_at_ms.max(r.kept_alive_at_ms) + r.ttl_ms;
        if r.revoke == Revoke::No && !l.revoking.contains(&r.id) && l.read_done_ms < due {
            if !alive {
                let renewed = if r.kept_alive_at_ms > 0 {
                    format!(", kept alive {} ms before the read", l.read_done_ms.saturating_sub(r.kept_alive_at_ms))
                } else {
                    String::new()
                };
                problems.push(format!(
                    "lease {:x} (TTL {} ms, granted {} ms before the read{renewed}) is gone before its TTL ran out and without a revoke",
                    r.id,
                    r.ttl_ms,
                    l.read_done_ms.saturating_sub(r.granted_at_ms)
                ));
            }
            let missing: Vec<&String> = r.keys.iter().filter(|k| l.read.get(*k) != Some(&r.id)).collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "{} acknowledged key(s) of live lease {:x} missing or attached elsewhere ({}; TTL {} ms, granted {} ms before the read)",
                    missing.len(),
                    r.id,
                    missing[0],
                    r.ttl_ms,
                    l.read_done_ms.saturating_sub(r.granted_at_ms)
                ));
            }
        }
    }
    if problems.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Definite(problems.join("; "))
    }
}
