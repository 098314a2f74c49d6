//! The kube target's part of `shakedown reap --kube` ([`crate::targets::reap`]): besides its
//! ConfigMap (labelled with the run id), a killed kube-target run can leave, if killed between a
//! crash and its restart, a KubeadmControlPlane paused by it (annotated with the run id), the
//! Velero Backups and Restores it created (labelled with the run id), and its API workload's
//! namespace (or ConfigMaps) in the workload cluster (labelled with the run id).

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use super::capi::{capi, discover_capi};
use super::{velero_ar, KubeError, CAPI_PAUSED, PAUSED_BY};
use crate::k8s::{client, RUN_LABEL};
use crate::targets::reap::Reaped;

/// The dead runs of the kube target a `reap --kube` found (their ConfigMaps already deleted by
/// [`crate::targets::reap::reap_kube`]), and what of them this removes.
pub(crate) struct DeadRuns<'a> {
    pub client: &'a Client,
    pub namespace: Option<&'a str>,
    pub all: bool,
    /// Their run ids.
    pub runs: &'a [String],
    /// (run, the Cluster's namespace, the Cluster's name): where each one's API workload wrote.
    pub clusters: &'a [(String, String, String)],
}

/// What a dead kube-target run can leave besides its ConfigMap, removed: a KubeadmControlPlane
/// it paused, its Velero objects, its API workload's namespace or ConfigMaps.
pub(crate) async fn reap_dead(d: DeadRuns<'_>, server: &str, out: &mut Reaped) -> Result<(), KubeError> {
    let DeadRuns { client, namespace, all, runs: dead_runs, clusters: dead_clusters } = d;
    let client = client.clone();
    let env = |what: &str, e: kube::Error| KubeError::Environment(format!("{what} on {server}: {e}"));
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
        let Ok((wc, wserver, _)) = super::workload::client_from_secret(&client, &counter, ns, cluster).await else { continue };
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
    Ok(())
}
