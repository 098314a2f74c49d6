//! A STAND-IN for the Cluster API controllers (KubeadmControlPlane, Machine, MachineDeployment),
//! test-side only. It is not Cluster API: it moves object statuses the way those controllers
//! would, so that the kube target meets real apiserver semantics (schema validation, the status
//! subresource, resourceVersion conflicts, watches) without a provider:
//! - KCP: scales to `spec.replicas` one Machine at a time into the failure domain with the
//!   fewest Machines; rolls out Machines whose version is not `spec.version`, whose template is
//!   not `spec.machineTemplate`'s, or that were created before `spec.rollout.after` — one at a
//!   time, new Machine first, old one deleted once the new one is healthy; writes
//!   `observedGeneration`, `replicas`, `upToDateReplicas`, `readyReplicas`, and the conditions
//!   `RollingOut`, `Available`, `EtcdClusterHealthy`; leaves a paused KCP alone;
//! - Machines: `EtcdMemberHealthy` Unknown when created, True `health_delay` later;
//! - MachineDeployments: `observedGeneration`, `spec.replicas` up to date (workers are not
//!   rolled), `RollingOut` False, `Available` True;
//! - with `nodes`, the workload cluster's Nodes (on the same apiserver): a Node per Machine,
//!   `status.nodeRef` set, the Node deleted once its Machine is being deleted.
//!
//! Status writes use the resourceVersion read (a conflict is retried on the next pass).
//!
//! Also here: [`attacher`], a stand-in for the attach/detach controller plus a CSI attacher (it
//! keeps one VolumeAttachment of a PersistentVolume attached), and [`velero`], a stand-in for
//! Velero (it moves the phase of Backups and Restores).
//!
//! Planted bugs, to show that shakedown catches a misbehaving controller.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::{reflector, watcher};
use kube::Client;
use serde_json::{json, Value};
use shakedown::targets::kube::capi::{capi, CapiVersion};
use shakedown::targets::kube::conditions::{condition, ETCD_MEMBER_HEALTHY};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// During a rollout the old Machine is never deleted: the stand-in forgets it (and so counts
    /// the rollout complete) while the Machine stays.
    LeaveOldMachine,
    /// Replacement Machines (created after the first three) report EtcdMemberHealthy False,
    /// while KCP claims every member healthy.
    ReplacementUnhealthy,
}

pub struct StandIn {
    task: tokio::task::JoinHandle<()>,
    pub writes: Arc<AtomicU64>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What each control-plane stand-in did last, by `ns/name`: for a test's failure message when a
/// Cluster does not settle (was it running, did its watches see the Machines it created, what
/// did the apiserver answer).
static DIAG: Mutex<BTreeMap<String, Diag>> = Mutex::new(BTreeMap::new());

#[derive(Debug, Default, Clone)]
pub struct Diag {
    pub passes: u64,
    pub watch_events: u64,
    pub watch_errors: u64,
    pub machines_in_cache: usize,
    pub created: u32,
    pub pending: Option<(String, bool)>,
    pub last_error: Option<String>,
    pub last_pass: Option<std::time::Instant>,
}

/// The stand-in's diagnostics for `ns/name` (what it last did, and how long ago).
pub fn diagnostics(ns: &str, name: &str) -> String {
    let d = DIAG.lock().unwrap_or_else(|e| e.into_inner()).get(&format!("{ns}/{name}")).cloned().unwrap_or_default();
    format!(
        "stand-in {ns}/{name}: {} passes (last {:?} ago), {} watch events, {} watch errors, {} Machines in its cache, {} created, pending {:?}, last error {:?}",
        d.passes,
        d.last_pass.map(|t| t.elapsed()),
        d.watch_events,
        d.watch_errors,
        d.machines_in_cache,
        d.created,
        d.pending,
        d.last_error
    )
}

fn note_error(key: &str, e: String) {
    eprintln!("{e}");
    DIAG.lock().unwrap_or_else(|e| e.into_inner()).entry(key.to_string()).or_default().last_error = Some(e);
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// A v1beta2 condition. apiserver 1.20's schema validation takes an empty string for null, so
/// `message` is never empty.
fn cond(type_: &str, ok: bool, generation: i64, message: &str) -> Value {
    let message = if message.is_empty() {
        if ok {
            "ok"
        } else {
            "not ok"
        }
    } else {
        message
    };
    json!({"type": type_, "status": if ok { "True" } else { "False" }, "reason": if ok { "Ok" } else { "NotOk" }, "message": message, "lastTransitionTime": now(), "observedGeneration": generation})
}

/// Starts the stand-in for Cluster `name` in `ns`; Machines become healthy `health_delay` after
/// they are created.
pub fn start(client: Client, ns: &str, name: &str, health_delay: Duration, bug: Option<Bug>) -> StandIn {
    start_with(client, ns, name, health_delay, bug, false)
}

/// [`start`], and with `nodes` the workload cluster's Nodes too (the workload cluster being the
/// same apiserver).
pub fn start_with(client: Client, ns: &str, name: &str, health_delay: Duration, bug: Option<Bug>, nodes: bool) -> StandIn {
    let writes = Arc::new(AtomicU64::new(0));
    let w2 = writes.clone();
    let (ns, name) = (ns.to_string(), name.to_string());
    let key = format!("{ns}/{name}");
    let task = tokio::spawn(async move {
        let by_cluster = watcher::Config::default().labels(&format!("cluster.x-k8s.io/cluster-name={name}"));
        let mut stores = vec![];
        let mut streams = vec![];
        for kind in ["KubeadmControlPlane", "Machine", "MachineDeployment"] {
            let ar = capi(kind, CapiVersion::V1Beta2);
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            let writer = reflector::store::Writer::new(ar.clone());
            let reader = writer.as_reader();
            stores.push(reader);
            let key = key.clone();
            streams.push(
                reflector::reflector(writer, watcher(api, by_cluster.clone()))
                    .map(move |r| {
                        let mut diag = DIAG.lock().unwrap_or_else(|e| e.into_inner());
                        let d = diag.entry(key.clone()).or_default();
                        d.watch_events += 1;
                        if let Err(e) = r {
                            d.watch_errors += 1;
                            d.last_error = Some(format!("watching {kind}: {e}"));
                            eprintln!("stand-in: watching {kind}: {e}");
                        }
                    })
                    .boxed(),
            );
        }
        let mut events = futures::stream::select_all(streams);
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut born: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
        let mut created = 0u32;
        // The Machine last created or deleted: no new action until the watch shows it.
        let mut pending: Option<(String, bool)> = None;
        let mut made_nodes: BTreeSet<String> = BTreeSet::new();
        loop {
            tokio::select! {
                _ = events.next() => {}
                _ = tick.tick() => {}
            }
            let s = Pass { client: &client, ns: &ns, name: &name, health_delay, bug, writes: &w2, nodes };
            if nodes {
                s.nodes(&stores[1].state(), &mut made_nodes).await;
            }
            s.reconcile(&stores[0].state(), &stores[1].state(), &stores[2].state(), &mut born, &mut created, &mut pending).await;
            let mut diag = DIAG.lock().unwrap_or_else(|e| e.into_inner());
            let d = diag.entry(key.clone()).or_default();
            d.passes += 1;
            d.last_pass = Some(std::time::Instant::now());
            d.machines_in_cache = stores[1].state().len();
            d.created = created;
            d.pending = pending.clone();
        }
    });
    StandIn { task, writes }
}

struct Pass<'a> {
    client: &'a Client,
    ns: &'a str,
    name: &'a str,
    health_delay: Duration,
    bug: Option<Bug>,
    writes: &'a AtomicU64,
    nodes: bool,
}

impl Pass<'_> {
    fn api(&self, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), self.ns, &capi(kind, CapiVersion::V1Beta2))
    }

    /// A Node per Machine (named after it), `status.nodeRef` of worker Machines (control-plane
    /// ones get it with their health), Nodes of Machines being deleted deleted.
    async fn nodes(&self, machines: &[Arc<DynamicObject>], made: &mut BTreeSet<String>) {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        for m in machines.iter().filter(|m| m.metadata.deletion_timestamp.is_none()) {
            let n = m.metadata.name.clone().unwrap_or_default();
            if !made.contains(&n) {
                let node = serde_json::from_value(
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"standin/cluster": self.name}}}),
                )
                .unwrap();
                match nodes.create(&PostParams::default(), &node).await {
                    Ok(_) => {
                        made.insert(n.clone());
                    }
                    Err(kube::Error::Api(r)) if r.code == 409 => {
                        made.insert(n.clone());
                    }
                    Err(e) => eprintln!("stand-in: creating Node {n}: {e}"),
                }
            }
            let cp = m.metadata.labels.as_ref().is_some_and(|l| l.contains_key("cluster.x-k8s.io/control-plane"));
            if !cp && made.contains(&n) && m.data.pointer("/status/nodeRef/name").is_none() {
                let mut status = m.data.get("status").cloned().unwrap_or(json!({}));
                status["nodeRef"] = json!({"name": n});
                status["phase"] = json!("Running");
                self.put_status("Machine", m, status).await;
            }
        }
        for n in made.clone() {
            let alive = machines.iter().any(|m| m.metadata.name.as_deref() == Some(n.as_str()) && m.metadata.deletion_timestamp.is_none());
            if !alive {
                match nodes.delete(&n, &DeleteParams::default()).await {
                    Ok(_) => {
                        made.remove(&n);
                    }
                    Err(kube::Error::Api(r)) if r.code == 404 => {
                        made.remove(&n);
                    }
                    Err(e) => eprintln!("stand-in: deleting Node {n}: {e}"),
                }
            }
        }
    }

    /// Replaces the status (resourceVersion checked: a conflict waits for the next pass).
    async fn put_status(&self, kind: &str, obj: &DynamicObject, status: Value) {
        let mut o = obj.clone();
        if o.data.get("status") == Some(&status) {
            return;
        }
        o.data["status"] = status;
        match self.api(kind).replace_status(o.metadata.name.as_deref().unwrap(), &PostParams::default(), &o).await {
            Ok(_) => {
                self.writes.fetch_add(1, Ordering::Relaxed);
            }
            // A conflict: the next pass works from the newer object.
            Err(kube::Error::Api(r)) if r.code == 409 => {}
            Err(e) => note_error(
                &format!("{}/{}", self.ns, self.name),
                format!("stand-in: status of {kind} {}: {e}", o.metadata.name.as_deref().unwrap_or_default()),
            ),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn reconcile(
        &self,
        kcps: &[Arc<DynamicObject>],
        machines: &[Arc<DynamicObject>],
        mds: &[Arc<DynamicObject>],
        born: &mut BTreeMap<String, tokio::time::Instant>,
        created: &mut u32,
        pending: &mut Option<(String, bool)>,
    ) {
        if let Some((n, exists)) = pending.as_ref() {
            if machines.iter().any(|m| m.metadata.name.as_deref() == Some(n.as_str())) == *exists {
                *pending = None;
            }
        }
        // MachineDeployments: nothing to roll (0 replicas), statuses only.
        for md in mds {
            let gen = md.metadata.generation.unwrap_or(1);
            let r = md.data.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(0);
            let status = json!({"observedGeneration": gen, "replicas": r, "upToDateReplicas": r, "readyReplicas": r, "availableReplicas": r,
                "conditions": [cond("RollingOut", false, gen, ""), cond("Available", true, gen, "")]});
            if md.data.pointer("/status/observedGeneration").and_then(Value::as_i64) != Some(gen) {
                self.put_status("MachineDeployment", md, status).await;
            }
        }
        // Machines: healthy once health_delay has passed since the stand-in first saw them.
        let cp: Vec<&Arc<DynamicObject>> = machines
            .iter()
            .filter(|m| m.metadata.labels.as_ref().is_some_and(|l| l.contains_key("cluster.x-k8s.io/control-plane")))
            .collect();
        for m in &cp {
            let n = m.metadata.name.clone().unwrap_or_default();
            let seen = *born.entry(n.clone()).or_insert_with(tokio::time::Instant::now);
            let v = serde_json::to_value(m.as_ref()).unwrap();
            let healthy = condition(&v, ETCD_MEMBER_HEALTHY).is_some_and(|c| c.is_true());
            let replacement = m.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("standin/replacement"));
            let want_healthy = seen.elapsed() >= self.health_delay && !(self.bug == Some(Bug::ReplacementUnhealthy) && replacement);
            let has_cond = condition(&v, ETCD_MEMBER_HEALTHY).is_some();
            let node_missing = self.nodes && m.metadata.deletion_timestamp.is_none() && v.pointer("/status/nodeRef/name").is_none();
            if healthy != want_healthy || !has_cond || node_missing {
                let gen = m.metadata.generation.unwrap_or(1);
                let c = if want_healthy {
                    cond("EtcdMemberHealthy", true, gen, "")
                } else {
                    json!({"type": "EtcdMemberHealthy", "status": if seen.elapsed() >= self.health_delay { "False" } else { "Unknown" }, "reason": "Provisioning", "message": "etcd member joining", "lastTransitionTime": now(), "observedGeneration": gen})
                };
                let fd = m.data.pointer("/spec/failureDomain").cloned().unwrap_or(Value::Null);
                let mut status = json!({"observedGeneration": gen, "failureDomain": fd, "phase": "Running", "conditions": [c]});
                if self.nodes {
                    status["nodeRef"] = json!({"name": n});
                }
                self.put_status("Machine", m, status).await;
            }
        }
        let Some(kcp) = kcps.first() else { return };
        let gen = kcp.metadata.generation.unwrap_or(1);
        // Like Cluster API's controllers (1.9 on), a `Paused` condition says whether the
        // controller has seen the pause annotation; a paused KCP is otherwise left alone.
        if kcp.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("cluster.x-k8s.io/paused")) {
            let mut status = kcp.data.get("status").cloned().unwrap_or_else(|| json!({}));
            let paused_already = status
                .get("conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Paused" && c["status"] == "True"));
            if !paused_already {
                let mut cs: Vec<Value> = status.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
                cs.retain(|c| c["type"] != "Paused");
                cs.push(cond("Paused", true, gen, "paused"));
                status["conditions"] = Value::Array(cs);
                self.put_status("KubeadmControlPlane", kcp, status).await;
            }
            return;
        }
        let spec = &kcp.data["spec"];
        let replicas = spec["replicas"].as_i64().unwrap_or(1);
        let version = spec["version"].as_str().unwrap_or_default().to_string();
        let template = spec.pointer("/machineTemplate/spec/infrastructureRef/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let after = spec.pointer("/rollout/after").and_then(Value::as_str).and_then(|s| humantime::parse_rfc3339(s).ok());
        // Machines the LeaveOldMachine bug abandoned are forgotten by the stand-in, not deleted.
        let abandoned = |m: &DynamicObject| m.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("standin/abandoned"));
        let live: Vec<&Arc<DynamicObject>> =
            cp.iter().copied().filter(|m| m.metadata.deletion_timestamp.is_none() && !abandoned(m)).collect();
        let outdated = |m: &DynamicObject| {
            let created: Option<std::time::SystemTime> = m.metadata.creation_timestamp.as_ref().map(|t| t.0.into());
            m.data.pointer("/spec/version").and_then(Value::as_str) != Some(version.as_str())
                || m.metadata.annotations.as_ref().and_then(|a| a.get("standin/template")).map(String::as_str) != Some(template.as_str())
                || matches!((after, created), (Some(a), Some(c)) if c < a && a <= std::time::SystemTime::now())
        };
        let healthy = |m: &DynamicObject| condition(&serde_json::to_value(m).unwrap(), ETCD_MEMBER_HEALTHY).is_some_and(|c| c.is_true());
        let all_healthy = live.iter().all(|m| healthy(m));
        let fd_of = |m: &DynamicObject| m.data.pointer("/spec/failureDomain").and_then(Value::as_str).unwrap_or_default().to_string();
        let fds: Vec<String> = {
            let cl = self.api("Cluster").get(self.name).await.ok();
            let mut v: Vec<String> = cl
                .and_then(|c| c.data.pointer("/status/failureDomains").and_then(Value::as_array).cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|f| f.get("name").and_then(Value::as_str).map(str::to_string))
                .collect();
            v.sort();
            v
        };
        let fewest = |exclude: Option<&str>| {
            fds.iter().filter(|f| Some(f.as_str()) != exclude).min_by_key(|f| live.iter().filter(|m| fd_of(m) == **f).count()).cloned()
        };
        let stale: Vec<&&Arc<DynamicObject>> = live.iter().filter(|m| outdated(m)).collect();
        let leave_old = self.bug == Some(Bug::LeaveOldMachine);
        if all_healthy && pending.is_none() {
            if (live.len() as i64) < replicas {
                *pending = self.create_machine(fewest(None), &version, &template, created).await.map(|n| (n, true));
            } else if (live.len() as i64) == replicas && !stale.is_empty() {
                // Roll: a new Machine in the old one's failure domain first.
                let old = stale[0];
                *pending = self.create_machine(Some(fd_of(old)), &version, &template, created).await.map(|n| (n, true));
            } else if (live.len() as i64) > replicas {
                let victim = stale.first().map(|m| (**m).clone()).unwrap_or_else(|| live[0].clone());
                let n = victim.metadata.name.clone().unwrap();
                if leave_old {
                    // The bug: the old Machine is forgotten instead of deleted.
                    let body = json!({"metadata": {"annotations": {"standin/abandoned": "true"}}});
                    if self.api("Machine").patch(&n, &Default::default(), &kube::api::Patch::Merge(&body)).await.is_ok() {
                        self.writes.fetch_add(1, Ordering::Relaxed);
                    }
                } else if self.api("Machine").delete(&n, &DeleteParams::default()).await.is_ok() {
                    self.writes.fetch_add(1, Ordering::Relaxed);
                    *pending = Some((n, false));
                }
            }
        }
        let up_to_date = live.iter().filter(|m| !outdated(m)).count() as i64;
        let count = live.len() as i64;
        let rolling = !stale.is_empty() || count != replicas;
        let ready = live.iter().filter(|m| healthy(m)).count() as i64;
        let etcd_ok = all_healthy || self.bug == Some(Bug::ReplacementUnhealthy);
        let status = json!({
            "observedGeneration": gen, "replicas": count, "upToDateReplicas": up_to_date.min(count), "readyReplicas": ready, "availableReplicas": ready,
            "version": version, "selector": format!("cluster.x-k8s.io/cluster-name={}", self.name),
            "conditions": [
                cond("RollingOut", rolling, gen, if rolling { "rolling out" } else { "" }),
                cond("Available", ready > replicas / 2, gen, ""),
                cond("EtcdClusterHealthy", etcd_ok, gen, if etcd_ok { "" } else { "some members unhealthy" }),
                cond("Paused", false, gen, ""),
            ]
        });
        let mut cur = kcp.data.get("status").cloned().unwrap_or(Value::Null);
        // Compare without timestamps.
        let strip = |v: &mut Value| {
            if let Some(cs) = v.get_mut("conditions").and_then(Value::as_array_mut) {
                cs.iter_mut().for_each(|c| {
                    c.as_object_mut().map(|o| o.remove("lastTransitionTime"));
                });
            }
        };
        let mut want = status.clone();
        strip(&mut cur);
        strip(&mut want);
        if cur != want {
            self.put_status("KubeadmControlPlane", kcp, status).await;
        }
    }

    async fn create_machine(&self, fd: Option<String>, version: &str, template: &str, created: &mut u32) -> Option<String> {
        *created += 1;
        let n = format!("{}-cp-{}", self.name, random_suffix());
        let mut annotations = json!({"standin/template": template});
        if *created > 3 {
            annotations["standin/replacement"] = json!("true");
        }
        let body = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": n, "namespace": self.ns, "annotations": annotations,
                         "labels": {"cluster.x-k8s.io/cluster-name": self.name, "cluster.x-k8s.io/control-plane": ""}},
            "spec": {"clusterName": self.name, "version": version, "failureDomain": fd,
                     "bootstrap": {"dataSecretName": format!("{n}-bootstrap")},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachine", "name": n}}});
        let obj: DynamicObject = serde_json::from_value(body).unwrap();
        match self.api("Machine").create(&PostParams::default(), &obj).await {
            Ok(_) => {
                self.writes.fetch_add(1, Ordering::Relaxed);
                Some(n)
            }
            Err(e) => {
                note_error(&format!("{}/{}", self.ns, self.name), format!("stand-in: creating Machine {n}: {e}"));
                None
            }
        }
    }
}

fn random_suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    let x = t ^ N.fetch_add(0x9e37_79b9, Ordering::Relaxed).wrapping_mul(31);
    (0..5).map(|i| (b'a' + ((x >> (i * 5)) % 26) as u8) as char).collect()
}

/// A STAND-IN for the attach/detach controller and a CSI attacher, test-side only: while it runs,
/// PersistentVolume `pv` has a VolumeAttachment on `node`; one that disappears is recreated
/// `delay` later (as the attach/detach controller does while a pod uses the volume) and marked
/// `status.attached: true` through the status subresource (as the CSI attacher does).
pub fn attacher(client: Client, pv: &str, node: &str, delay: Duration) -> StandIn {
    let writes = Arc::new(AtomicU64::new(0));
    let w2 = writes.clone();
    let (pv, node) = (pv.to_string(), node.to_string());
    let task = tokio::spawn(async move {
        let api: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = Api::all(client.clone());
        let mut missing_since: Option<tokio::time::Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let Ok(list) = api.list(&ListParams::default()).await else { continue };
            let mine: Vec<_> = list
                .items
                .into_iter()
                .filter(|va| {
                    va.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str()) && va.metadata.deletion_timestamp.is_none()
                })
                .collect();
            if mine.is_empty() {
                let since = *missing_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() < delay {
                    continue;
                }
                let va = serde_json::from_value(json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                    "metadata": {"name": format!("csi-{}", random_suffix())},
                    "spec": {"attacher": "standin.csi.example", "nodeName": node, "source": {"persistentVolumeName": pv}}}))
                .unwrap();
                match api.create(&PostParams::default(), &va).await {
                    Ok(_) => {
                        w2.fetch_add(1, Ordering::Relaxed);
                        missing_since = None;
                    }
                    Err(e) => eprintln!("stand-in attacher: creating a VolumeAttachment of {pv}: {e}"),
                }
                continue;
            }
            for mut va in mine {
                if va.status.as_ref().is_some_and(|s| s.attached) {
                    continue;
                }
                va.status = Some(k8s_openapi::api::storage::v1::VolumeAttachmentStatus { attached: true, ..Default::default() });
                let name = va.metadata.name.clone().unwrap_or_default();
                match api.replace_status(&name, &PostParams::default(), &va).await {
                    Ok(_) => {
                        w2.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => eprintln!("stand-in attacher: status of VolumeAttachment {name}: {e}"),
                }
            }
        }
    });
    StandIn { task, writes }
}

/// How the Velero stand-in ends Backups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VeleroEnd {
    Completed,
    /// Backups end PartiallyFailed (Restores still complete).
    BackupsPartiallyFailed,
}

/// A STAND-IN for Velero, test-side only: every Backup and Restore in `ns` without a phase goes
/// to `InProgress`, then (next pass) to `Completed` (or as `end` says), through the status
/// subresource. `seen` collects every object it moved (as read when first seen).
pub fn velero(client: Client, ns: &str, end: VeleroEnd) -> (StandIn, Arc<Mutex<Vec<Value>>>) {
    let writes = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (w2, s2) = (writes.clone(), seen.clone());
    let ns = ns.to_string();
    let task = tokio::spawn(async move {
        let gvk = |k: &str| kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("velero.io", "v1", k));
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for kind in ["Backup", "Restore"] {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &gvk(kind));
                let Ok(list) = api.list(&ListParams::default()).await else { continue };
                for o in list.items {
                    let phase = o.data.pointer("/status/phase").and_then(Value::as_str).unwrap_or("").to_string();
                    let next = match (phase.as_str(), kind, end) {
                        ("", _, _) => {
                            s2.lock().unwrap().push(serde_json::to_value(&o).unwrap());
                            "InProgress"
                        }
                        ("InProgress", "Backup", VeleroEnd::BackupsPartiallyFailed) => "PartiallyFailed",
                        ("InProgress", _, _) => "Completed",
                        _ => continue,
                    };
                    let mut o2 = o.clone();
                    o2.data["status"] = json!({"phase": next});
                    let name = o.metadata.name.clone().unwrap_or_default();
                    match api.replace_status(&name, &PostParams::default(), &o2).await {
                        Ok(_) => {
                            w2.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => eprintln!("stand-in velero: status of {kind} {name}: {e}"),
                    }
                }
            }
        }
    });
    (StandIn { task, writes }, seen)
}
