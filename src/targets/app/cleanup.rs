//! Teardown: the run's NetworkPolicies and checker Jobs, its backup and restore objects, its
//! cordons, its failed pods' images, the operator's scale and the run's ConfigMap.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::Client;
use std::collections::BTreeMap;

use super::drain::cordon_patch;
use super::pods::{failed_by, failure_patch};
use super::{bounded, AppTarget, OWN_IMAGES};
use crate::targets::kube::RUN_LABEL;

impl AppTarget {
    /// The run's teardown (idempotent): the data workload stopped, then what the run made or
    /// changed undone, best effort.
    pub(super) async fn teardown_run(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        if let Some(w) = &self.writer {
            w.stop();
        }
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        let _ = bounded(
            "delete the run's NetworkPolicies",
            api.delete_collection(&DeleteParams::default(), &ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id))),
        )
        .await;
        // A checker Job a stop interrupted (with its pods).
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), self.ns());
        let _ = bounded(
            "delete the run's checker Jobs",
            jobs.delete_collection(&DeleteParams::background(), &ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id))),
        )
        .await;
        if let (Some(name), Some(replicas)) = (self.spec.app_profile.operator.clone(), self.operator_replicas) {
            let deps: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
            if let Ok(d) = bounded("operator", deps.get(&name)).await {
                if d.spec.and_then(|s| s.replicas).unwrap_or(1) < replicas {
                    let _ = bounded(
                        "scale the operator back",
                        deps.patch(&name, &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}}))),
                    )
                    .await;
                }
            }
        }
        let _ = bounded("give failed pods their images back", restore_failed_pods(&self.client, self.ns(), &self.run_id)).await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        for n in self.cordoned_nodes().await {
            let _ = bounded("uncordon", nodes.patch(&n, &PatchParams::default(), &Patch::Merge(cordon_patch(None)))).await;
        }
        for (r, section) in [(self.spec.app_profile.backup.clone(), "backup"), (self.spec.app_profile.restore.clone(), "restore")] {
            if let Some(r) = r.filter(|_| !self.backups.is_empty()) {
                if let Ok(api) = self.resource_api(&r, section).await {
                    let _ = bounded(
                        "delete the run's objects",
                        api.delete_collection(
                            &DeleteParams::default(),
                            &ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id)),
                        ),
                    )
                    .await;
                }
            }
        }
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.ns());
        let _ = bounded("delete the run's ConfigMap", cms.delete(&format!("shakedown-{}", self.run_id), &DeleteParams::default())).await;
    }
}

/// The own images a failed pod's annotation recorded.
fn recorded_images(p: &Pod) -> BTreeMap<String, String> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(OWN_IMAGES)).and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default()
}

/// Gives every pod of `ns` that a `pod-failure` of run `run` left failed its own images back
/// (teardown, `reap --kube`); returns their names.
pub async fn restore_failed_pods(client: &Client, ns: &str, run: &str) -> Result<Vec<String>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut done = vec![];
    for p in pods.list(&ListParams::default()).await.map_err(|e| format!("listing pods in {ns}: {e}"))?.items {
        if failed_by(&p) == Some(run) {
            let name = p.metadata.name.clone().unwrap_or_default();
            let patch = failure_patch(None, &recorded_images(&p), None);
            pods.patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .map_err(|e| format!("giving pod {ns}/{name} its images back: {e}"))?;
            done.push(name);
        }
    }
    Ok(done)
}
