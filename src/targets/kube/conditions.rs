//! Reading Cluster API objects (pure: JSON in, values out): conditions in both API versions,
//! rollout progress of a KubeadmControlPlane or MachineDeployment, Machine failure domains.
//!
//! Where conditions live:
//! - a `v1beta2` object: `status.conditions` (metav1.Condition), the old ones in
//!   `status.deprecated.v1beta1.conditions`;
//! - a `v1beta1` object: `status.v1beta2.conditions` (the new ones, when the controllers write
//!   them) and `status.conditions` (Cluster API v1beta1 conditions, with `severity`).
//!
//! The new conditions are preferred; a condition only found in the old place is used as well.

use serde_json::Value;

/// KubeadmControlPlane: every etcd member healthy (v1beta1 and v1beta2 name).
pub const ETCD_CLUSTER_HEALTHY: &[&str] = &["EtcdClusterHealthy"];
/// Control-plane Machine: its etcd member healthy (v1beta1 and v1beta2 name).
pub const ETCD_MEMBER_HEALTHY: &[&str] = &["EtcdMemberHealthy"];
/// Set by Cluster API controllers (1.9 on) once they have seen the pause annotation.
pub const PAUSED: &[&str] = &["Paused"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub type_: String,
    pub status: Status,
    pub reason: String,
    pub message: String,
    /// Only v1beta2 conditions carry it.
    pub observed_generation: Option<i64>,
}

impl Condition {
    pub fn is_true(&self) -> bool {
        self.status == Status::True
    }
    /// `Type=Status (reason: message)`, for messages.
    pub fn text(&self) -> String {
        let mut t = format!("{}={:?}", self.type_, self.status);
        match (self.reason.is_empty(), self.message.is_empty()) {
            (true, true) => {}
            (false, true) => t.push_str(&format!(" ({})", self.reason)),
            (true, false) => t.push_str(&format!(" ({})", self.message)),
            (false, false) => t.push_str(&format!(" ({}: {})", self.reason, self.message)),
        }
        t
    }
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn parse_list(v: Option<&Value>) -> Vec<Condition> {
    let Some(list) = v.and_then(Value::as_array) else { return vec![] };
    list.iter()
        .filter_map(|c| {
            let type_ = c.get("type")?.as_str()?.to_string();
            let status = match c.get("status").and_then(Value::as_str) {
                Some("True") => Status::True,
                Some("False") => Status::False,
                _ => Status::Unknown,
            };
            let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            Some(Condition {
                type_,
                status,
                reason: s("reason"),
                message: s("message"),
                observed_generation: c.get("observedGeneration").and_then(Value::as_i64),
            })
        })
        .collect()
}

/// The API version of an object (`v1beta1`, `v1beta2`, …), from its `apiVersion`.
pub fn api_version(obj: &Value) -> &str {
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    av.rsplit('/').next().unwrap_or(av)
}

/// Every condition of the object, new ones first.
pub fn conditions(obj: &Value) -> Vec<Condition> {
    let (new, old) = if api_version(obj) == "v1beta1" {
        (at(obj, &["status", "v1beta2", "conditions"]), at(obj, &["status", "conditions"]))
    } else {
        (at(obj, &["status", "conditions"]), at(obj, &["status", "deprecated", "v1beta1", "conditions"]))
    };
    let mut all = parse_list(new);
    for c in parse_list(old) {
        if !all.iter().any(|n| n.type_ == c.type_) {
            all.push(c);
        }
    }
    all
}

/// The first condition with one of `names`.
pub fn condition(obj: &Value, names: &[&str]) -> Option<Condition> {
    let all = conditions(obj);
    names.iter().find_map(|n| all.iter().find(|c| c.type_ == *n).cloned())
}

fn int(obj: &Value, path: &[&str]) -> Option<i64> {
    at(obj, path).and_then(Value::as_i64)
}

/// Rollout progress of a KubeadmControlPlane or MachineDeployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    pub generation: i64,
    pub observed_generation: i64,
    pub spec_replicas: i64,
    pub replicas: i64,
    pub up_to_date: i64,
    /// `RollingOut` (v1beta2); for v1beta1-only status, `MachinesSpecUpToDate` False means rolling out.
    pub rolling_out: Option<bool>,
    pub available: Option<bool>,
}

pub fn rollout(obj: &Value) -> Rollout {
    let v1 = api_version(obj) == "v1beta1";
    let up_to_date = if v1 {
        int(obj, &["status", "v1beta2", "upToDateReplicas"]).or_else(|| int(obj, &["status", "updatedReplicas"]))
    } else {
        int(obj, &["status", "upToDateReplicas"])
    };
    let conds = conditions(obj);
    let find = |n: &str| conds.iter().find(|c| c.type_ == n);
    let rolling_out = find("RollingOut").map(|c| c.is_true()).or_else(|| find("MachinesSpecUpToDate").map(|c| !c.is_true()));
    Rollout {
        generation: int(obj, &["metadata", "generation"]).unwrap_or(0),
        observed_generation: int(obj, &["status", "observedGeneration"]).unwrap_or(0),
        spec_replicas: int(obj, &["spec", "replicas"]).unwrap_or(1),
        replicas: int(obj, &["status", "replicas"]).unwrap_or(0),
        up_to_date: up_to_date.unwrap_or(0),
        rolling_out,
        available: find("Available").map(|c| c.is_true()),
    }
}

/// What a rollout still misses before it is complete (see [`Rollout::complete`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", missing.join(", "))]
pub struct Incomplete {
    pub missing: Vec<String>,
}

impl Rollout {
    /// `Ok` when the rollout is complete: `observedGeneration` current,
    /// `upToDateReplicas == replicas == spec.replicas`, `RollingOut` False, `Available` True;
    /// otherwise what is still missing.
    pub fn complete(&self) -> Result<(), Incomplete> {
        let mut missing = Vec::new();
        if self.observed_generation < self.generation {
            missing.push(format!("observedGeneration {} < generation {}", self.observed_generation, self.generation));
        }
        if !(self.up_to_date == self.replicas && self.replicas == self.spec_replicas) {
            missing
                .push(format!("upToDateReplicas {} / replicas {} / spec.replicas {}", self.up_to_date, self.replicas, self.spec_replicas));
        }
        if self.rolling_out != Some(false) {
            missing.push(format!("RollingOut is {}", self.rolling_out.map_or("unknown".into(), |b| b.to_string())));
        }
        if self.available == Some(false) {
            missing.push("Available is False".into());
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Incomplete { missing })
        }
    }
}

/// A Machine's failure domain: `spec.failureDomain`, else `status.failureDomain`.
pub fn failure_domain(machine: &Value) -> Option<String> {
    at(machine, &["spec", "failureDomain"])
        .or_else(|| at(machine, &["status", "failureDomain"]))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Whether the object is being deleted.
pub fn deleting(obj: &Value) -> bool {
    at(obj, &["metadata", "deletionTimestamp"]).is_some_and(|v| !v.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v1beta2_machine(status: &str) -> Value {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "status": {"conditions": [
            {"type": "EtcdMemberHealthy", "status": status, "reason": "Healthy", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2}
        ]}})
    }

    #[test]
    fn reads_v1beta2_conditions() {
        let c = condition(&v1beta2_machine("True"), ETCD_MEMBER_HEALTHY).unwrap();
        assert!(c.is_true());
        assert_eq!(c.observed_generation, Some(2));
        assert_eq!(condition(&v1beta2_machine("False"), ETCD_MEMBER_HEALTHY).unwrap().status, Status::False);
    }

    #[test]
    fn reads_v1beta1_conditions_new_place_first() {
        let obj = json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "status": {
            "conditions": [{"type": "EtcdMemberHealthy", "status": "False", "severity": "Error", "reason": "Unhealthy", "message": "down"}],
            "v1beta2": {"conditions": [{"type": "EtcdMemberHealthy", "status": "True", "reason": "Healthy", "message": ""}]}
        }});
        assert!(condition(&obj, ETCD_MEMBER_HEALTHY).unwrap().is_true());
        let old_only = json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "status": {
            "conditions": [{"type": "EtcdMemberHealthy", "status": "False", "severity": "Error", "reason": "Unhealthy", "message": "down"}]}});
        let c = condition(&old_only, ETCD_MEMBER_HEALTHY).unwrap();
        assert_eq!(c.text(), "EtcdMemberHealthy=False (Unhealthy: down)");
    }

    #[test]
    fn rollout_complete_needs_every_part() {
        let kcp = |gen: i64, obs: i64, up: i64, rolling: &str| {
            json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "metadata": {"generation": gen}, "spec": {"replicas": 3},
                "status": {"observedGeneration": obs, "replicas": 3, "upToDateReplicas": up, "conditions": [
                    {"type": "RollingOut", "status": rolling, "reason": "x", "message": ""},
                    {"type": "Available", "status": "True", "reason": "x", "message": ""}]}})
        };
        assert_eq!(rollout(&kcp(2, 2, 3, "False")).complete(), Ok(()));
        assert!(rollout(&kcp(3, 2, 3, "False")).complete().unwrap_err().to_string().contains("observedGeneration 2 < generation 3"));
        assert!(rollout(&kcp(2, 2, 2, "False")).complete().unwrap_err().to_string().contains("upToDateReplicas 2"));
        assert!(rollout(&kcp(2, 2, 3, "True")).complete().unwrap_err().to_string().contains("RollingOut is true"));
        // v1beta1 status: updatedReplicas and MachinesSpecUpToDate.
        let v1 = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "metadata": {"generation": 1}, "spec": {"replicas": 3},
            "status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "conditions": [{"type": "MachinesSpecUpToDate", "status": "True"}]}});
        assert_eq!(rollout(&v1).complete(), Ok(()));
    }
}
