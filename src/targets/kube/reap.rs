//! `shakedown reap --kube`: what killed kube runs left behind. A run leaves at most its
//! ConfigMap (labelled with the run id) and, if killed between a crash and its restart, a
//! KubeadmControlPlane paused by it (annotated with the run id), and the Velero Backups and
//! Restores it created (labelled with the run id).

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use super::client::{self, capi};
use super::{velero_ar, KubeError, CAPI_PAUSED, PAUSED_BY, RUN_LABEL};

/// What a reap removed.
#[derive(Debug, Default)]
pub struct Reaped {
    pub configmaps: Vec<String>,
    pub resumed: Vec<String>,
    /// Velero objects deleted, as `Kind ns/name`.
    pub velero: Vec<String>,
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
    for cm in cms.list(&ListParams::default().labels(RUN_LABEL)).await.map_err(|e| env("listing run ConfigMaps", e))?.items {
        let data = cm.data.clone().unwrap_or_default();
        let (host, pid) = (data.get("host").cloned().unwrap_or_default(), data.get("pid").cloned().unwrap_or_default());
        if !all && alive(&host, &pid) {
            continue;
        }
        let (ns, name) = (cm.metadata.namespace.clone().unwrap_or_default(), cm.metadata.name.clone().unwrap_or_default());
        if let Some(run) = cm.metadata.labels.as_ref().and_then(|l| l.get(RUN_LABEL)) {
            dead_runs.push(run.clone());
        }
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => out.configmaps.push(format!("{ns}/{name}")),
            Err(kube::Error::Api(r)) if r.code == 404 => {}
            Err(e) => return Err(env(&format!("deleting ConfigMap {ns}/{name}"), e)),
        }
    }
    let kcp_ar = capi("KubeadmControlPlane");
    let kcps: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &kcp_ar),
        None => Api::all_with(client.clone(), &kcp_ar),
    };
    let list = match kcps.list(&ListParams::default()).await {
        Ok(l) => l.items,
        // No Cluster API here: nothing to resume.
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
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kcp_ar);
        let body = json!({"metadata": {"annotations": {CAPI_PAUSED: null, PAUSED_BY: null}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await.map_err(|e| env(&format!("resuming KubeadmControlPlane {ns}/{name}"), e))?;
        out.resumed.push(format!("{ns}/{name}"));
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
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => out.velero.push(format!("{kind} {ns}/{name}")),
                Err(kube::Error::Api(r)) if r.code == 404 => {}
                Err(e) => return Err(env(&format!("deleting Velero {kind} {ns}/{name}"), e)),
            }
        }
    }
    Ok(out)
}
