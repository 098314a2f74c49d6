//! `node-drain`: the node of a replica cordoned with the run's annotation (the node must have
//! opted in), its pods evicted through the eviction API, verified gone, held cordoned until
//! their controllers' replacements are scheduled on another node (when there is one), uncordoned.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use shakedown_faults::MemberId;

use super::{bounded, env, opted_in, AppTarget, CORDONED_BY, REQUEST_BOUND};
use crate::k8s::OPT_IN;
use crate::targets::TargetError;

/// A pod on a node (one a drain or a taint evicts, say): its namespace, name and UID.
pub(super) type PodRef = (String, String, Option<String>);

pub(super) fn pod_ref(p: &Pod) -> PodRef {
    (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default(), p.metadata.uid.clone())
}

/// A pod a drain or a taint can remove: not a static pod (its mirror cannot be evicted, and the
/// kubelet recreates it whatever a taint says), not finished.
pub(super) fn removable(p: &Pod) -> bool {
    !p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
        && !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

impl AppTarget {
    /// `node-drain(m)`: the node of `m`'s pod cordoned (annotated with the run), every pod on it
    /// but DaemonSets' and static ones evicted through the eviction API — an eviction a
    /// PodDisruptionBudget refuses (429) is tried again every second until the op's bound, then
    /// the op fails naming it — verified drained (those pods gone), held cordoned until the
    /// evicted pods' controllers have scheduled their replacements elsewhere (when another node
    /// can take them; bounded), then uncordoned (verified).
    pub(super) async fn node_drain(&mut self, m: MemberId) -> Result<(), TargetError> {
        let (node_name, node) = self.chaos_node(m, "a drain evicts every pod on it, of every namespace", "node-drain").await?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
            return Err(TargetError::Environment(format!(
                "node {node_name} is already cordoned, not by this run: draining it is someone else's maintenance"
            )));
        }
        if self.dry_run {
            let url = format!("/api/v1/nodes/{node_name}");
            self.dry_write(|| format!("PATCH {url} (merge patch) {}", cordon_patch(Some(&self.run_id))));
            for (ns, name, _) in self.evictable(&node_name).await?.iter().map(pod_ref) {
                self.dry_write(|| {
                    format!("POST /api/v1/namespaces/{ns}/pods/{name}/eviction (retried while a PodDisruptionBudget refuses it)")
                });
            }
            self.dry_wait(&format!("node {node_name} drained (the evicted pods gone)"));
            self.dry_write(|| format!("PATCH {url} (merge patch) {}", cordon_patch(None)));
            self.dry_wait(&format!("node {node_name} schedulable again"));
            return Ok(());
        }
        bounded("cordon", nodes.patch(&node_name, &PatchParams::default(), &Patch::Merge(cordon_patch(Some(&self.run_id)))))
            .await
            .map_err(env)?;
        let drained = self.evict_all(&node_name).await;
        // Uncordoned whatever the drain came to (a blocked drain must not leave the node out).
        let uncordoned =
            bounded("uncordon", nodes.patch(&node_name, &PatchParams::default(), &Patch::Merge(cordon_patch(None)))).await.map_err(env);
        let evicted = drained?;
        uncordoned?;
        // Verified: schedulable again.
        self.wait(&format!("node {node_name} schedulable again"), || {
            let (nodes, node_name) = (nodes.clone(), node_name.clone());
            async move {
                let node = nodes.get(&node_name).await.ok()?;
                (node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)).then_some(())
            }
        })
        .await?;
        let (evicted, last) = evicted;
        let last =
            last.map(|(pod, ms)| format!("; the last gone {:.1}s after its eviction: {pod}", ms as f64 / 1000.0)).unwrap_or_default();
        tracing::info!("node-drain({m}): node {node_name} drained ({} pods evicted{last}) and uncordoned", evicted.len());
        Ok(())
    }

    /// The node of `m`'s pod (name and object), which must have opted in to chaos: otherwise an
    /// environment error saying what `op` would do to it (`why`) and how to opt in.
    pub(super) async fn chaos_node(&self, m: MemberId, why: &str, op: &str) -> Result<(String, Node), TargetError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let pod = self.pod_name(m);
        let node_name = bounded("get pod", pods.get(&pod))
            .await
            .map_err(env)?
            .spec
            .and_then(|s| s.node_name)
            .ok_or_else(|| TargetError::Stack(format!("pod {pod} is not on a node")))?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = bounded("get node", nodes.get(&node_name)).await.map_err(env)?;
        if !opted_in(node.metadata.annotations.as_ref()) {
            return Err(TargetError::Environment(format!(
                "node {node_name} (of {pod}) has not opted in to chaos: {why}; annotate it \
                with {OPT_IN}=\"true\" (kubectl annotate node {node_name} {OPT_IN}=true) or leave {op} out of the profile"
            )));
        }
        Ok((node_name, node))
    }

    /// Evicts every pod of `node` a drain evicts and waits until they are gone: the pods, or why not.
    /// With the pods, the one that took longest to go after the evictions, and how long (ms).
    async fn evict_all(&mut self, node: &str) -> Result<(Vec<String>, Option<(String, u64)>), TargetError> {
        let pods = self.evictable(node).await?;
        let evictable: Vec<PodRef> = pods.iter().map(pod_ref).collect();
        let names: Vec<String> = evictable.iter().map(|(ns, n, _)| format!("{ns}/{n}")).collect();
        // Every pod of the evicted pods' namespaces now: their replacements are the pods that
        // appear after this, of the same controllers.
        let before = self.pod_uids(&pods).await?;
        let (refused, result) = self.evict(node, &evictable).await;
        self.log.push(crate::targets::Note {
            kind: "app-drain".into(),
            detail: serde_json::json!({
                "node": node,
                "evictable": names,
                "refused-evictions": refused,
                "error": result.as_ref().err().map(|e| e.to_string()),
            }),
        });
        result?;
        let gone = self.wait_gone(node, &evictable).await?;
        let last = gone.iter().max_by_key(|(_, ms)| **ms).map(|(p, ms)| (p.clone(), *ms));
        let rescheduled = self.wait_rescheduled(node, &pods, &before).await?;
        self.log.push(crate::targets::Note {
            kind: "app-drained".into(),
            detail: serde_json::json!({"node": node, "gone-after-ms": gone, "rescheduled": rescheduled}),
        });
        Ok((names, last))
    }

    /// Every pod on `node` now, of every namespace.
    pub(super) async fn pods_on_node(&self, node: &str) -> Result<Vec<Pod>, TargetError> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let listed = bounded("pods on the node", all.list(&ListParams::default().fields(&format!("spec.nodeName={node}")))).await;
        Ok(listed.map_err(env)?.items)
    }

    /// The pods of `node` a drain evicts: what `kubectl drain --ignore-daemonsets` evicts, so
    /// not a DaemonSet's pod either (its controller ignores the cordon).
    async fn evictable(&self, node: &str) -> Result<Vec<Pod>, TargetError> {
        let on_node = self.pods_on_node(node).await?;
        Ok(on_node
            .into_iter()
            .filter(|p| !p.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|o| o.kind == "DaemonSet")))
            .filter(removable)
            .collect())
    }

    /// The UIDs of every pod in the namespaces of `pods`.
    async fn pod_uids(&self, pods: &[Pod]) -> Result<std::collections::BTreeSet<String>, TargetError> {
        let mut uids = std::collections::BTreeSet::new();
        for ns in pods.iter().filter_map(|p| p.metadata.namespace.clone()).collect::<std::collections::BTreeSet<_>>() {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let listed = bounded("pods of the drained pods' namespaces", api.list(&ListParams::default())).await.map_err(env)?;
            uids.extend(listed.items.into_iter().filter_map(|p| p.metadata.uid));
        }
        Ok(uids)
    }

    /// Holds the drain (the node still cordoned) until each evicted pod that a controller owns
    /// has a replacement — a pod of the same controller that was not there at the eviction —
    /// scheduled on another node, as a drain in a cluster of several nodes leaves them. Bounded
    /// by the op's bound; a replacement that finds no node by then is named, not failed (where a
    /// workload goes is the app's and the scheduler's, judged by `app-ready`). When no other node
    /// could take a pod (a single node, or every other one cordoned or NotReady), nothing is
    /// waited for and the event says so. What it found: `{pods: {replacement: node}, after-ms,
    /// unscheduled: [controller…], nowhere: why}`.
    async fn wait_rescheduled(
        &self,
        node: &str,
        evicted: &[Pod],
        before: &std::collections::BTreeSet<String>,
    ) -> Result<serde_json::Value, TargetError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let listed = bounded("nodes", nodes.list(&ListParams::default())).await.map_err(env)?;
        let elsewhere = listed.items.iter().filter(|n| n.metadata.name.as_deref() != Some(node)).any(|n| {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            ready && n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
        });
        if !elsewhere {
            return Ok(
                serde_json::json!({"nowhere": "no other node is Ready and schedulable: the evicted pods' replacements wait for the uncordon"}),
            );
        }
        // How many replacements each controller owes (by its UID), in which namespace.
        let mut owed: BTreeMap<(String, String), usize> = BTreeMap::new();
        for p in evicted {
            if let (Some(ns), Some(owner)) = (&p.metadata.namespace, controller_of(p)) {
                *owed.entry((ns.clone(), owner)).or_default() += 1;
            }
        }
        let t0 = Instant::now();
        let deadline = t0 + self.spec.app_profile.op_timeout;
        let mut placed: BTreeMap<String, String> = BTreeMap::new();
        loop {
            placed.clear();
            let mut short = vec![];
            // Each namespace listed once a round, whatever number of controllers it holds.
            for ns in owed.keys().map(|(ns, _)| ns.clone()).collect::<std::collections::BTreeSet<_>>() {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                let listed = tokio::time::timeout(REQUEST_BOUND, api.list(&ListParams::default())).await;
                for ((_, owner), n) in owed.iter().filter(|((o_ns, _), _)| *o_ns == ns) {
                    let Ok(Ok(now)) = &listed else {
                        short.push(owner.clone());
                        continue;
                    };
                    let new: Vec<(String, String)> = now
                        .items
                        .iter()
                        .filter(|p| {
                            controller_of(p).as_ref() == Some(owner) && p.metadata.uid.as_ref().is_some_and(|u| !before.contains(u))
                        })
                        .filter_map(|p| Some((format!("{ns}/{}", p.metadata.name.clone()?), p.spec.as_ref()?.node_name.clone()?)))
                        .filter(|(_, on)| on != node)
                        .collect();
                    if new.len() < *n {
                        short.push(owner.clone());
                    }
                    placed.extend(new);
                }
            }
            if short.is_empty() || Instant::now() > deadline {
                return Ok(serde_json::json!({"pods": placed, "after-ms": t0.elapsed().as_millis() as u64, "unscheduled": short}));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Evicts the pods one after the other through the eviction API (on the client without
    /// kube-rs's retry), an eviction a PodDisruptionBudget refuses (429) tried again every second
    /// until the op's bound: how many times one was refused, and whether all were evicted.
    async fn evict(&self, node: &str, pods: &[PodRef]) -> (u32, Result<(), TargetError>) {
        let deadline = Instant::now() + self.spec.app_profile.op_timeout;
        let mut refused = 0u32;
        for (ns, name, _) in pods {
            let api: Api<Pod> = Api::namespaced(self.evict_client.clone(), ns);
            loop {
                match tokio::time::timeout(REQUEST_BOUND, api.evict(name, &EvictParams::default())).await {
                    Ok(Ok(_)) => break,
                    Ok(Err(kube::Error::Api(r))) if r.code == 404 => break,
                    // A PodDisruptionBudget would be violated: what `kubectl drain` retries.
                    Ok(Err(kube::Error::Api(r))) if r.code == 429 => {
                        refused += 1;
                        if Instant::now() > deadline {
                            let blocked = TargetError::Stack(format!(
                                "the drain of node {node} is blocked: evicting {ns}/{name} was refused for {}s ({}) — a \
                                PodDisruptionBudget that the pods already evicted cannot satisfy again while the node is cordoned",
                                self.spec.app_profile.op_timeout.as_secs(),
                                r.message
                            ));
                            return (refused, Err(blocked));
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Ok(Err(e)) => return (refused, Err(env(format!("evicting {ns}/{name}: {e}")))),
                    Err(_) => return (refused, Err(env(format!("evicting {ns}/{name}: no answer within {}s", REQUEST_BOUND.as_secs())))),
                }
            }
        }
        (refused, Ok(()))
    }

    /// Verified: every evicted pod is gone from the node (its replacement, if any, is another
    /// pod). When each went (ms after the evictions) is kept: a pod whose kubelet takes long to
    /// remove it holds the whole drain, and the event log names it.
    pub(super) async fn wait_gone(&self, node: &str, evicted: &[PodRef]) -> Result<BTreeMap<String, u64>, TargetError> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let wanted = evicted.to_vec();
        let evicted_at = Instant::now();
        let gone: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u64>>> = Default::default();
        self.wait(&format!("node {node} drained ({} pods evicted)", wanted.len()), || {
            let (all, wanted, gone) = (all.clone(), wanted.clone(), gone.clone());
            let node = node.to_string();
            async move {
                let now = all.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await.ok()?.items;
                let mut gone = gone.lock().unwrap();
                for (ns, name, uid) in &wanted {
                    if !now.iter().any(|p| {
                        p.metadata.namespace.as_ref() == Some(ns) && p.metadata.name.as_ref() == Some(name) && p.metadata.uid == *uid
                    }) {
                        gone.entry(format!("{ns}/{name}")).or_insert(evicted_at.elapsed().as_millis() as u64);
                    }
                }
                (gone.len() == wanted.len()).then_some(())
            }
        })
        .await?;
        let gone = gone.lock().unwrap().clone();
        Ok(gone)
    }
}

/// The UID of the controller that owns `p` (its ReplicaSet, StatefulSet, Job …), if one does.
fn controller_of(p: &Pod) -> Option<String> {
    p.metadata.owner_references.as_ref()?.iter().find(|o| o.controller == Some(true)).map(|o| o.uid.clone())
}

/// The merge patch that cordons a node for run `run` (annotated with it), or with `None`
/// uncordons it (and drops the annotation).
pub fn cordon_patch(run: Option<&str>) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {CORDONED_BY: run}}, "spec": {"unschedulable": run.map(|_| true)}})
}

/// The run that cordoned node `n` for a drain, if one did.
pub fn cordoned_by(n: &Node) -> Option<&str> {
    n.metadata.annotations.as_ref().and_then(|a| a.get(CORDONED_BY)).map(String::as_str)
}
