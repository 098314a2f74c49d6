//! `shakedown reap --kube`: what killed runs of the Kubernetes-facing targets left behind. Every
//! such run has a ConfigMap labelled with its run id naming its process ([`RunOwner`]); a run
//! whose process is gone is dead. A dead application-target run's ConfigMap also holds its
//! [`RunRecord`], and [`app::clean_up`] undoes what its teardown would have; a dead kube-target
//! run's leftovers are the kube target's to remove ([`kube::reap::reap_dead`]). Each target's
//! reap lives with the target; this dispatches between them, so neither imports the other.

use std::path::Path;

use ::kube::api::{Api, DeleteParams, ListParams};
use k8s_openapi::api::core::v1::ConfigMap;

use super::app::{self, RunRecord};
use super::kube::{self, KubeError};
use crate::k8s::{bounded, client, delete_if_present, RunOwner, RUN_LABEL};

/// Each request of a reap: a management cluster that does not answer in this long is reported,
/// not waited for.
const REAP_REQUEST_BOUND: std::time::Duration = std::time::Duration::from_secs(30);

/// What a reap removed.
#[derive(Debug, Default)]
pub struct Reaped {
    pub configmaps: Vec<String>,
    pub resumed: Vec<String>,
    /// Velero objects deleted, as `Kind ns/name`.
    pub velero: Vec<String>,
    /// The API workload's namespaces and ConfigMaps deleted in workload clusters.
    pub api: Vec<String>,
    /// What dead application-target runs left, undone (`app::Cleaned::done`): NetworkPolicies
    /// and Jobs deleted, operators scaled back, failed pods' images put back, nodes uncordoned,
    /// backup and restore objects deleted.
    pub app: Vec<String>,
}

/// Removes the objects of every run in `namespace` (all namespaces when `None`) whose process is
/// gone (a run on another host, or one that looks alive, only with `all`).
pub async fn reap_kube(kubeconfig: Option<&Path>, context: Option<&str>, namespace: Option<&str>, all: bool) -> Result<Reaped, KubeError> {
    let (client, _, server) = client::connect(kubeconfig, context).await?;
    let env = |e: crate::k8s::CallError| KubeError::Environment(format!("{e} (on {server})"));
    let cms: Api<ConfigMap> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut out = Reaped::default();
    let mut dead_runs = Vec::new();
    let mut dead_clusters = Vec::new();
    let listed = bounded("listing run ConfigMaps", REAP_REQUEST_BOUND, cms.list(&ListParams::default().labels(RUN_LABEL))).await;
    for cm in listed.map_err(env)?.items {
        let data = cm.data.clone().unwrap_or_default();
        if !all && RunOwner::read(&data).may_be_alive() {
            continue;
        }
        let (ns, name) = (cm.metadata.namespace.clone().unwrap_or_default(), cm.metadata.name.clone().unwrap_or_default());
        let Some(run) = cm.metadata.labels.as_ref().and_then(|l| l.get(RUN_LABEL)).cloned() else { continue };
        match RunRecord::read(&data) {
            // A dead application-target run: the same cleanup as its teardown, from its record.
            Some(record) => {
                let cleaned = app::clean_up(&client, &ns, &run, &record).await;
                out.app.extend(cleaned.done);
                if !cleaned.errors.is_empty() {
                    // Its ConfigMap stays, so that a later reap can finish the job.
                    return Err(KubeError::Environment(format!("{} on {server}", cleaned.errors.join("; "))));
                }
            }
            None => {
                if let Some(cluster) = data.get("cluster") {
                    dead_clusters.push((run.clone(), ns.clone(), cluster.clone()));
                }
                dead_runs.push(run.clone());
            }
        }
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let what = format!("deleting ConfigMap {ns}/{name}");
        if delete_if_present(&api, &name, &DeleteParams::background(), &what, REAP_REQUEST_BOUND).await.map_err(env)? {
            out.configmaps.push(format!("{ns}/{name}"));
        }
    }
    let dead = kube::reap::DeadRuns { client: &client, namespace, all, runs: &dead_runs, clusters: &dead_clusters };
    kube::reap::reap_dead(dead, &server, &mut out).await?;
    Ok(out)
}
