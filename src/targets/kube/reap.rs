//! `shakedown reap --kube`: what killed kube runs left behind. A run leaves at most its
//! ConfigMap (labelled with the run id) and, if killed between a crash and its restart, a
//! KubeadmControlPlane paused by it (annotated with the run id), the Velero Backups and
//! Restores it created (labelled with the run id), and its API workload's namespace (or
//! ConfigMaps) in the workload cluster (labelled with the run id). An application-target run
//! leaves its ConfigMap in the application's namespace and what its teardown would have undone:
//! `app::clean_up` undoes it, from the record in the ConfigMap (`app::RunRecord`).

use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use super::client::{self, capi, discover_capi};
use super::{velero_ar, KubeError, CAPI_PAUSED, PAUSED_BY, RUN_LABEL};
use crate::targets::app::{clean_up, RunRecord};

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

fn alive(host: &str, pid: &str) -> bool {
    let me = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    host == me.trim()
        && pid.parse::<u32>().is_ok_and(|p| p != std::process::id())
        && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("shakedown"))
}

/// Removes the objects of every run in `namespace` (all namespaces when `None`) whose process is
/// gone (a run on another host counts as gone only with `all`).
pub async fn reap(kubeconfig: Option<&Path>, context: Option<&str>, namespace: Option<&str>, all: bool) -> Result<Reaped, KubeError> {
    let (client, _, server) = client::connect(kubeconfig, context).await?;
    let env = |what: &str, e: kube::Error| KubeError::Environment(format!("{what} on {server}: {e}"));
    let cms: Api<ConfigMap> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut out = Reaped::default();
    let mut dead_runs = Vec::new();
    // (run, the Cluster's namespace, the Cluster's name): where its API workload wrote.
    let mut dead_clusters = Vec::new();
    for cm in cms.list(&ListParams::default().labels(RUN_LABEL)).await.map_err(|e| env("listing run ConfigMaps", e))?.items {
        let data = cm.data.clone().unwrap_or_default();
        let (host, pid) = (data.get("host").cloned().unwrap_or_default(), data.get("pid").cloned().unwrap_or_default());
        if !all && alive(&host, &pid) {
            continue;
        }
        let (ns, name) = (cm.metadata.namespace.clone().unwrap_or_default(), cm.metadata.name.clone().unwrap_or_default());
        if let Some(run) = cm.metadata.labels.as_ref().and_then(|l| l.get(RUN_LABEL)) {
            dead_runs.push(run.clone());
            if let Some(cluster) = data.get("cluster") {
                dead_clusters.push((run.clone(), ns.clone(), cluster.clone()));
            }
        }
        // A dead application-target run: the same cleanup as its teardown, from its record.
        if let (Some(run), Some(record)) = (cm.metadata.labels.as_ref().and_then(|l| l.get(RUN_LABEL)), RunRecord::read(&data)) {
            let cleaned = clean_up(&client, &ns, run, &record).await;
            out.app.extend(cleaned.done);
            if !cleaned.errors.is_empty() {
                return Err(KubeError::Environment(format!("{} on {server}", cleaned.errors.join("; "))));
            }
        }
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        // In the background: a Job's pods go with it.
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => out.configmaps.push(format!("{ns}/{name}")),
            Err(kube::Error::Api(r)) if r.code == 404 => {}
            Err(e) => return Err(env(&format!("deleting ConfigMap {ns}/{name}"), e)),
        }
    }
    // A KubeadmControlPlane paused by a dead run is resumed (none when no Cluster API version
    // shakedown speaks is served here).
    if let Ok(capi_version) = discover_capi(&client).await {
        let ar = capi("KubeadmControlPlane", capi_version);
        let kcps: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let list = match kcps.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(kube::Error::Api(r)) if r.code == 404 => vec![],
            Err(e) => return Err(env("listing KubeadmControlPlanes", e)),
        };
        for k in list {
            let Some(by) = k.metadata.annotations.as_ref().and_then(|a| a.get(PAUSED_BY)) else { continue };
            if !dead_runs.contains(by) && !all {
                // Its run is alive, or left no ConfigMap: resume only when the run is known dead.
                continue;
            }
            let (ns, name) = (k.metadata.namespace.clone().unwrap_or_default(), k.metadata.name.clone().unwrap_or_default());
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            let body = json!({"metadata": {"annotations": {CAPI_PAUSED: null, PAUSED_BY: null}}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .map_err(|e| env(&format!("resuming KubeadmControlPlane {ns}/{name}"), e))?;
            out.resumed.push(format!("{ns}/{name}"));
        }
    }
    // Velero Backups and Restores of dead runs, in any namespace (Velero's, not the Cluster's).
    let velero_kinds: &[&str] = if super::probe_velero(&client).await.is_ok() { &["Restore", "Backup"] } else { &[] };
    for &kind in velero_kinds {
        let ar = velero_ar(kind);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let list = match api.list(&ListParams::default().labels(RUN_LABEL)).await {
            Ok(l) => l.items,
            // No Velero here, or no permission for it (then no run of this identity used it).
            Err(kube::Error::Api(r)) if r.code == 404 || r.code == 403 => vec![],
            Err(e) => return Err(env(&format!("listing Velero {kind}s"), e)),
        };
        for o in list {
            let run = o.metadata.labels.as_ref().and_then(|l| l.get(RUN_LABEL)).cloned().unwrap_or_default();
            if !all && !dead_runs.contains(&run) {
                continue;
            }
            let (ns, name) = (o.metadata.namespace.clone().unwrap_or_default(), o.metadata.name.clone().unwrap_or_default());
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            // In the background: a Job's pods go with it.
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => out.velero.push(format!("{kind} {ns}/{name}")),
                Err(kube::Error::Api(r)) if r.code == 404 => {}
                Err(e) => return Err(env(&format!("deleting Velero {kind} {ns}/{name}"), e)),
            }
        }
    }
    // The API workload's namespace or ConfigMaps in each dead run's workload cluster.
    let counter = client::RequestCounter::default();
    for (run, ns, cluster) in dead_clusters {
        let Ok((wc, wserver, _)) = super::workload::client_from_secret(&client, &counter, &ns, &cluster).await else { continue };
        let selector = format!("{RUN_LABEL}={run}");
        let namespaces: Api<Namespace> = Api::all(wc.clone());
        // The run's own namespaces: deleted with what is in them.
        let mut run_namespaces = Vec::new();
        if let Ok(list) = namespaces.list(&ListParams::default().labels(&selector)).await {
            run_namespaces = list.items.iter().filter_map(|n| n.metadata.name.clone()).collect();
            // A namespace already being deleted needs nothing more (a second DELETE is refused).
            for n in list.items.into_iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
                let name = n.metadata.name.clone().unwrap_or_default();
                match namespaces.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => out.api.push(format!("namespace {name} (workload cluster {wserver})")),
                    Err(kube::Error::Api(r)) if r.code == 404 => {}
                    Err(e) => {
                        return Err(KubeError::Environment(format!("deleting namespace {name} in the workload cluster {wserver}: {e}")))
                    }
                }
            }
        }
        let cms: Api<ConfigMap> = Api::all(wc.clone());
        if let Ok(list) = cms.list(&ListParams::default().labels(&selector)).await {
            // Those in a namespace the kube profile named (not in the run's own).
            for cm in list.items.into_iter().filter(|c| !c.metadata.namespace.as_ref().is_some_and(|n| run_namespaces.contains(n))) {
                let (cns, name) = (cm.metadata.namespace.clone().unwrap_or_default(), cm.metadata.name.clone().unwrap_or_default());
                let api: Api<ConfigMap> = Api::namespaced(wc.clone(), &cns);
                // In the background: a Job's pods go with it.
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => out.api.push(format!("ConfigMap {cns}/{name} (workload cluster {wserver})")),
                    Err(kube::Error::Api(r)) if r.code == 404 => {}
                    Err(e) => {
                        return Err(KubeError::Environment(format!(
                            "deleting ConfigMap {cns}/{name} in the workload cluster {wserver}: {e}"
                        )))
                    }
                }
            }
        }
    }
    Ok(out)
}
