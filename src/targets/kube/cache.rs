//! The watch caches of the Cluster's objects, and the serving samples taken from the Machine
//! watch during a step.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::DynamicObject;
use serde_json::Value;
use shakedown_invariants::ServingSample;
use tokio::sync::watch;

use super::conditions::{condition, deleting, failure_domain, ETCD_MEMBER_HEALTHY};
use super::workload::Workload;
use super::*;
use crate::k8s::client::Watched;

/// Serving samples taken from the Machine watch during a step.
#[derive(Default)]
pub(super) struct Sampler {
    pub(super) start: Option<std::time::Instant>,
    pub(super) samples: Vec<ServingSample>,
}

/// A control-plane Machine as observed.
#[derive(Debug, Clone)]
pub(super) struct CpMachine {
    pub(super) name: String,
    pub(super) fd: Option<String>,
    pub(super) healthy: bool,
    pub(super) why: String,
    pub(super) deleting: bool,
    pub(super) created: String,
    pub(super) version: Option<String>,
    /// The workload cluster's Node of the Machine (`status.nodeRef.name`), once it has one.
    pub(super) node: Option<String>,
}

pub(super) fn cp_machines(store: &[Arc<DynamicObject>]) -> Vec<CpMachine> {
    let mut v: Vec<CpMachine> = store
        .iter()
        .filter(|m| m.metadata.labels.as_ref().is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL)))
        .map(|m| {
            let obj = serde_json::to_value(m.as_ref()).unwrap_or_default();
            let c = condition(&obj, ETCD_MEMBER_HEALTHY);
            CpMachine {
                name: m.metadata.name.clone().unwrap_or_default(),
                fd: failure_domain(&obj),
                healthy: c.as_ref().is_some_and(|c| c.is_true()),
                why: c.map(|c| c.text()).unwrap_or_else(|| "no EtcdMemberHealthy condition".into()),
                deleting: deleting(&obj),
                created: m.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
                version: obj.pointer("/spec/version").and_then(Value::as_str).map(str::to_string),
                node: obj.pointer("/status/nodeRef/name").and_then(Value::as_str).map(str::to_string),
            }
        })
        .collect();
    v.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
    v
}

/// The watch caches of the Cluster's objects.
pub(super) struct Cache {
    pub(super) cluster: Watched,
    pub(super) kcp: Watched,
    pub(super) machines: Watched,
    pub(super) deployments: Watched,
    pub(super) infra: Vec<Watched>,
    /// The run's Velero Backups and Restores (when Velero is installed).
    pub(super) velero: Vec<Watched>,
    /// The objects of the kube profile's condition checks, one watch per check (in order).
    pub(super) conditions: Vec<Watched>,
    /// The workload cluster (when its kubeconfig Secret is there).
    pub(super) workload: Option<Workload>,
    pub(super) changed: watch::Receiver<u64>,
    pub(super) errors: Arc<Mutex<Option<String>>>,
}

impl Cache {
    /// The management cluster's watches.
    pub(super) fn management(&self) -> impl Iterator<Item = &Watched> {
        [&self.cluster, &self.kcp, &self.machines, &self.deployments]
            .into_iter()
            .chain(self.infra.iter())
            .chain(self.velero.iter())
            .chain(self.conditions.iter())
    }
    pub(super) fn all(&self) -> impl Iterator<Item = &Watched> {
        self.management().chain(self.workload.iter().flat_map(|w| w.all()))
    }
    /// `Some(why)` when a watch of the Cluster's own objects (Cluster, KCP, Machines,
    /// MachineDeployments) has failed for longer than `bound` without a success in between: the
    /// management cluster is gone. (Other kinds' watches failing do not end a run.)
    pub(super) fn lost(&self, bound: Duration) -> Option<String> {
        [&self.cluster, &self.kcp, &self.machines, &self.deployments]
            .into_iter()
            .filter_map(|w| w.failing_for())
            .find(|(d, _)| *d >= bound)
            .map(|(d, e)| format!("no answer from the management cluster for {}s: {e}", d.as_secs()))
    }
    pub(super) fn kcp(&self) -> Option<Value> {
        self.kcp.objects().first().and_then(|o| serde_json::to_value(o.as_ref()).ok())
    }
    pub(super) fn last_error(&self) -> Option<String> {
        self.errors.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
