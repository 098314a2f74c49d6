//! One cleanup of an application-target run, for its teardown and for `reap --kube` after a
//! kill -9: the run's NetworkPolicies and checker Jobs, the operator's scale, its failed pods'
//! images, its cordons and taints, the operator's objects it created (backups, restores).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::Client;

use super::connect::RunRecord;
use super::drain::{cordon_patch, cordoned_by};
use super::pods::{failed_by, failure_patch};
use super::resources::resource_api_of;
use super::taint::{set_taint, tainted_by};
use super::{bounded, AppTarget, OWN_IMAGES, REQUEST_BOUND};
use crate::k8s::{delete_if_present, RUN_LABEL};

/// What a cleanup undid (each as `reap --kube` prints it) and what it could not.
#[derive(Debug, Default)]
pub struct Cleaned {
    pub done: Vec<String>,
    pub errors: Vec<String>,
}

impl Cleaned {
    fn add(&mut self, step: Result<String, impl std::fmt::Display>) {
        match step {
            Ok(done) => self.done.push(done),
            Err(e) => self.errors.push(e.to_string()),
        }
    }
}

/// Undoes what application-target run `run` made or changed in namespace `ns` and on the nodes,
/// whether the run is tearing down (its record from its own state) or dead (`reap --kube`: the
/// record read from its ConfigMap). Every step is tried whatever came of the others, every
/// request bounded ([`REQUEST_BOUND`]); an object already gone is no error. In order: the run's
/// NetworkPolicies and checker Jobs deleted (in the background: a Job's pods go with it), the
/// operator scaled back to the recorded replicas when it is below them, the pods a `pod-failure`
/// of the run left failed given their own images back, the nodes annotated as cordoned by the
/// run uncordoned, the run's taint taken off the nodes that carry it, the run's objects of the recorded kinds (backups, restores) deleted. The
/// run's ConfigMap is the caller's to delete, last: it is what finds the run again.
pub async fn clean_up(client: &Client, ns: &str, run: &str, record: &RunRecord) -> Cleaned {
    let mut out = Cleaned::default();
    delete_run_objects(&Api::<NetworkPolicy>::namespaced(client.clone(), ns), "NetworkPolicy", ns, run, &mut out).await;
    // A checker Job a stop interrupted (with its pods).
    delete_run_objects(&Api::<Job>::namespaced(client.clone(), ns), "Job", ns, run, &mut out).await;
    if let Some((op, replicas)) = &record.operator {
        scale_back(client, ns, op, *replicas, &mut out).await;
    }
    restore_failed_pods(client, ns, run, &mut out).await;
    undo_nodes(client, run, &mut out).await;
    for gvk in &record.resources {
        let discovered = tokio::time::timeout(REQUEST_BOUND, resource_api_of(client, ns, gvk)).await;
        match discovered
            .map_err(|_| format!("{gvk}: no answer within {}s", REQUEST_BOUND.as_secs()))
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            Ok(api) => delete_run_objects(&api, gvk, ns, run, &mut out).await,
            Err(e) => out.errors.push(e.to_string()),
        }
    }
    out
}

/// Deletes the objects of `api` labelled with run `run`, each named in `out`.
async fn delete_run_objects<K>(api: &Api<K>, what: &str, ns: &str, run: &str, out: &mut Cleaned)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let listed = bounded(&format!("listing {what} in {ns}"), api.list(&ListParams::default().labels(&format!("{RUN_LABEL}={run}")))).await;
    let list = match listed {
        Ok(l) => l.items,
        Err(e) => return out.errors.push(e.to_string()),
    };
    for o in list {
        let name = o.meta().name.clone().unwrap_or_default();
        // In the background: a Job's pods go with it.
        let deleting = format!("deleting {what} {ns}/{name}");
        match delete_if_present(api, &name, &DeleteParams::background(), &deleting, REQUEST_BOUND).await {
            Ok(true) => out.done.push(format!("deleted {what} {ns}/{name}")),
            Ok(false) => {}
            Err(e) => out.errors.push(e.to_string()),
        }
    }
}

/// The operator's Deployment `op` scaled back to `replicas` if the run left it below them.
async fn scale_back(client: &Client, ns: &str, op: &str, replicas: i32, out: &mut Cleaned) {
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    match bounded(&format!("reading Deployment {ns}/{op}"), deps.get_opt(op)).await {
        Ok(Some(d)) if d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) < replicas => {
            let patch = Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}}));
            let scaled = bounded(&format!("scaling Deployment {ns}/{op} back"), deps.patch(op, &PatchParams::default(), &patch)).await;
            out.add(scaled.map(|_| format!("scaled the operator {ns}/{op} back to {replicas}")));
        }
        Ok(_) => {}
        Err(e) => out.errors.push(e.to_string()),
    }
}

/// The own images a failed pod's annotation recorded.
fn recorded_images(p: &Pod) -> BTreeMap<String, String> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(OWN_IMAGES)).and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default()
}

/// Gives every pod of `ns` that a `pod-failure` of run `run` left failed its own images back.
async fn restore_failed_pods(client: &Client, ns: &str, run: &str, out: &mut Cleaned) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let listed = match bounded(&format!("listing pods in {ns}"), pods.list(&ListParams::default())).await {
        Ok(l) => l.items,
        Err(e) => return out.errors.push(e.to_string()),
    };
    for p in listed.iter().filter(|p| failed_by(p) == Some(run)) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let patch = Patch::Strategic(failure_patch(None, &recorded_images(p), None));
        let put_back =
            bounded(&format!("giving pod {ns}/{name} its images back"), pods.patch(&name, &PatchParams::default(), &patch)).await;
        out.add(put_back.map(|_| format!("gave pod {ns}/{name} its own images back")));
    }
}

/// Uncordons the nodes annotated as cordoned by run `run` (the annotation goes too), and takes
/// the run's taint off every node that carries it: one listing of the nodes for both.
async fn undo_nodes(client: &Client, run: &str, out: &mut Cleaned) {
    let nodes: Api<Node> = Api::all(client.clone());
    // A listing refused to a namespaced account: the run could not have changed a node either.
    let listed = bounded("nodes", nodes.list(&ListParams::default())).await.map(|l| l.items).unwrap_or_default();
    for n in listed.iter().filter(|n| cordoned_by(n) == Some(run)) {
        let name = n.metadata.name.clone().unwrap_or_default();
        let patch = Patch::Merge(cordon_patch(None));
        let uncordoned = bounded(&format!("uncordoning node {name}"), nodes.patch(&name, &PatchParams::default(), &patch)).await;
        out.add(uncordoned.map(|_| format!("uncordoned node {name}")));
    }
    for n in listed.iter().filter(|n| tainted_by(n) == Some(run)) {
        let name = n.metadata.name.clone().unwrap_or_default();
        out.add(set_taint(&nodes, &name, None).await.map(|_| format!("took the run's taint off node {name}")));
    }
}

impl AppTarget {
    /// The run's teardown (idempotent): the data workload stopped, the run undone by
    /// [`clean_up`] from its own record, then its ConfigMap deleted — unless something could
    /// not be undone: then the ConfigMap stays (it is what lets `reap --kube` find the run and
    /// finish once this process is gone) and each leftover is a warning.
    pub(super) async fn teardown_run(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        if self.dry_run {
            // Nothing was made or changed: nothing to undo, and no request to undo it with.
            println!("dry run: {} write request(s) printed, none sent", self.dry_run_writes().len());
            return;
        }
        if let Some(w) = &self.writer {
            w.stop();
            w.write_history(&self.run_dir.join("app-history.jsonl"));
        }
        let record = RunRecord::of(&self.spec.app_profile, self.operator_replicas);
        let cleaned = clean_up(&self.client, self.ns(), &self.run_id, &record).await;
        let name = format!("shakedown-{}", self.run_id);
        if !cleaned.errors.is_empty() {
            for e in &cleaned.errors {
                tracing::warn!("teardown could not undo: {e}");
            }
            tracing::warn!(
                "teardown left ConfigMap {}/{name} in place so that `shakedown reap --kube` can finish the cleanup once this run has exited",
                self.ns()
            );
            return;
        }
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.ns());
        let _ = bounded("delete the run's ConfigMap", cms.delete(&name, &DeleteParams::default())).await;
    }
}
