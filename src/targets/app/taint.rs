//! `taint`: a `NoExecute` taint on the node of a replica (the node must have opted in), the pods
//! that do not tolerate it verified gone, held for the app profile's `[taint] duration`, removed
//! (verified). The node lifecycle controller does the evicting: no eviction API, no
//! PodDisruptionBudget, which is what makes it another fault than a drain.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::api::{Api, Patch, PatchParams};
use shakedown_faults::MemberId;

use super::drain::{pod_ref, removable, PodRef};
use super::{bounded, env, AppTarget, TAINTED_BY};
use crate::targets::TargetError;

/// How many times a taint change is tried again after another writer changed the node between
/// the read and the write (the patch carries the read's resourceVersion).
const CONFLICT_RETRIES: u32 = 5;

/// The run's taint on a node: its key, the run id as its value, `NoExecute`.
pub fn run_taint(run: &str) -> Taint {
    Taint { key: TAINTED_BY.into(), value: Some(run.into()), effect: "NoExecute".into(), time_added: None }
}

/// The run whose taint node `n` carries, if one does.
pub fn tainted_by(n: &Node) -> Option<&str> {
    taints(n).iter().find(|t| t.key == TAINTED_BY).and_then(|t| t.value.as_deref())
}

fn taints(n: &Node) -> &[Taint] {
    n.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default()
}

/// Whether `t` tolerates `taint` (Kubernetes' matching: an empty key with `Exists` tolerates
/// everything; an empty effect every effect; `Equal` — the default — needs the value too).
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
    let exists = t.operator.as_deref() == Some("Exists");
    let key = t.key.as_deref().unwrap_or_default();
    if key.is_empty() {
        return exists && effect;
    }
    effect && key == taint.key && (exists || t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default())
}

/// How pod `p` meets `taint`: `None` — evicted at once; `Some(None)` — tolerated for good;
/// `Some(Some(s))` — tolerated for `s` seconds (the shortest of its matching tolerations).
fn tolerance(p: &Pod, taint: &Taint) -> Option<Option<i64>> {
    let matching: Vec<&Toleration> =
        p.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default().iter().filter(|t| tolerates(t, taint)).collect();
    if matching.is_empty() {
        return None;
    }
    // As the node lifecycle controller reads them: the shortest of the tolerations that name a
    // time (a negative one is 0); none names one: for good.
    Some(matching.iter().filter_map(|t| t.toleration_seconds).map(|s| s.max(0)).min())
}

impl AppTarget {
    /// `taint(m)`: the node of `m`'s pod tainted `NoExecute` with the run's taint; verified: every
    /// pod on it that does not tolerate the taint gone (a pod tolerating it for fewer seconds than
    /// the hold goes later and is not waited for); held for `[taint] duration`; the taint
    /// removed (verified). The pods that tolerate it for good are checked to be there still at
    /// the removal; an `app-taint` note names them all.
    pub(super) async fn taint(&mut self, m: MemberId) -> Result<(), TargetError> {
        let (node_name, node) =
            self.chaos_node(m, "a NoExecute taint evicts every pod on it that does not tolerate it, of every namespace", "taint").await?;
        if let Some(other) = tainted_by(&node) {
            let whose = if other == self.run_id { "this run's, from an earlier step" } else { "another run's" };
            return Err(TargetError::Environment(format!("node {node_name} already carries the taint {TAINTED_BY}={other} ({whose})")));
        }
        let taint = run_taint(&self.run_id);
        let hold = self.spec.app_profile.taint_duration();
        if self.dry_run {
            self.dry_write(|| {
                format!("PATCH /api/v1/nodes/{node_name} (merge patch) spec.taints + {TAINTED_BY}={}:NoExecute", self.run_id)
            });
            self.dry_wait(&format!("the pods of node {node_name} without a toleration gone, then {}s held", hold.as_secs()));
            self.dry_write(|| format!("PATCH /api/v1/nodes/{node_name} (merge patch) spec.taints - {TAINTED_BY}"));
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let (evicted, kept) = self.pods_meeting(&node_name, &taint).await?;
        set_taint(&nodes, &node_name, Some(&taint)).await?;
        let gone = self.wait_gone(&node_name, &evicted).await;
        let gone = match gone {
            Ok(gone) => gone,
            Err(e) => {
                // The taint goes whatever the eviction came to: a node must not stay tainted.
                let _ = set_taint(&nodes, &node_name, None).await;
                return Err(e);
            }
        };
        tokio::time::sleep(hold).await;
        let still = self.pods_on_node(&node_name).await.map(|ps| ps.iter().map(pod_ref).collect::<Vec<_>>());
        let removed = set_taint(&nodes, &node_name, None).await;
        // The taint is off (or its removal failed, said below); a listing that failed has seen
        // nothing of the tolerating pods: the op fails rather than pass them unseen.
        let still = still?;
        let kept_gone: Vec<String> = kept
            .iter()
            .filter(|(_, secs)| secs.is_none())
            .filter(|(id, _)| !still.contains(id))
            .map(|((ns, name, _), _)| format!("{ns}/{name}"))
            .collect();
        self.log.push(crate::targets::Note {
            kind: "app-taint".into(),
            detail: serde_json::json!({
                "node": node_name,
                "evicted-gone-after-ms": gone,
                "tolerating": kept.iter().map(|((ns, name, _), secs)| (format!("{ns}/{name}"), *secs)).collect::<std::collections::BTreeMap<_, _>>(),
                "tolerating-gone": kept_gone,
                "held-ms": hold.as_millis() as u64,
            }),
        });
        removed?;
        self.wait(&format!("node {node_name} without the run's taint"), || {
            let (nodes, node_name, run) = (nodes.clone(), node_name.clone(), self.run_id.clone());
            async move { (tainted_by(&nodes.get(&node_name).await.ok()?) != Some(run.as_str())).then_some(()) }
        })
        .await?;
        if !kept_gone.is_empty() {
            return Err(TargetError::Stack(format!(
                "pods that tolerate the taint for good were gone from node {node_name} while it was tainted: {}",
                kept_gone.join(", ")
            )));
        }
        tracing::info!(
            "taint({m}): node {node_name} tainted, {} pods without a toleration gone, {} tolerating it, held {}s, taint removed",
            evicted.len(),
            kept.len(),
            hold.as_secs()
        );
        Ok(())
    }

    /// The running pods of `node` split by `taint`: the ones it evicts, and the ones that
    /// tolerate it (with their `tolerationSeconds`). Static pods are left out (their mirror is
    /// recreated by the kubelet whatever the taint says).
    async fn pods_meeting(&self, node: &str, taint: &Taint) -> Result<(Vec<PodRef>, Vec<(PodRef, Option<i64>)>), TargetError> {
        let (mut evicted, mut kept) = (vec![], vec![]);
        for p in self.pods_on_node(node).await?.iter().filter(|p| removable(p)) {
            match tolerance(p, taint) {
                None => evicted.push(pod_ref(p)),
                Some(secs) => kept.push((pod_ref(p), secs)),
            }
        }
        Ok((evicted, kept))
    }
}

/// Puts the run's taint `taint` on node `name` (`None`: takes every taint of [`TAINTED_BY`]
/// off), keeping every other taint: read, changed, written back with the read's
/// resourceVersion, tried again on a conflict ([`CONFLICT_RETRIES`]).
pub async fn set_taint(nodes: &Api<Node>, name: &str, taint: Option<&Taint>) -> Result<(), TargetError> {
    for attempt in 0..=CONFLICT_RETRIES {
        let node = bounded(&format!("reading node {name}"), nodes.get(name)).await.map_err(env)?;
        let mut list: Vec<Taint> = taints(&node).iter().filter(|t| t.key != TAINTED_BY).cloned().collect();
        list.extend(taint.cloned());
        if list.len() == taints(&node).len() && taint.is_none() {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": list},
        });
        match tokio::time::timeout(super::REQUEST_BOUND, nodes.patch(name, &PatchParams::default(), &Patch::Merge(patch))).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(kube::Error::Api(r))) if r.code == 409 && attempt < CONFLICT_RETRIES => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Err(e)) => return Err(env(format!("changing the taints of node {name}: {e}"))),
            Err(_) => return Err(env(format!("changing the taints of node {name}: no answer within {}s", super::REQUEST_BOUND.as_secs()))),
        }
    }
    Err(env(format!("changing the taints of node {name}: the node kept changing ({CONFLICT_RETRIES} conflicts)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toleration(key: &str, op: Option<&str>, value: Option<&str>, effect: Option<&str>, secs: Option<i64>) -> Toleration {
        Toleration {
            key: (!key.is_empty()).then(|| key.into()),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: secs,
        }
    }

    #[test]
    fn a_toleration_matches_the_taint_as_kubernetes_matches_it() {
        let taint = run_taint("sd-1");
        assert!(tolerates(&toleration("", Some("Exists"), None, None, None), &taint), "the empty key with Exists tolerates all");
        assert!(!tolerates(&toleration("", None, None, None, None), &taint), "an empty key needs Exists");
        assert!(tolerates(&toleration(TAINTED_BY, Some("Exists"), None, Some("NoExecute"), None), &taint));
        assert!(tolerates(&toleration(TAINTED_BY, None, Some("sd-1"), None, None), &taint), "Equal is the default");
        assert!(!tolerates(&toleration(TAINTED_BY, Some("Equal"), Some("sd-2"), None, None), &taint), "another run's value");
        assert!(!tolerates(&toleration(TAINTED_BY, Some("Exists"), None, Some("NoSchedule"), None), &taint), "another effect");
        assert!(!tolerates(&toleration("node.kubernetes.io/unreachable", Some("Exists"), None, Some("NoExecute"), Some(300)), &taint));
        let pod = |ts: Vec<Toleration>| Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec { tolerations: Some(ts), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(tolerance(&pod(vec![]), &taint), None);
        assert_eq!(tolerance(&pod(vec![toleration("", Some("Exists"), None, None, None)]), &taint), Some(None));
        let both = vec![toleration("", Some("Exists"), None, None, Some(60)), toleration(TAINTED_BY, Some("Exists"), None, None, Some(5))];
        assert_eq!(tolerance(&pod(both), &taint), Some(Some(5)), "the shortest of the matching tolerations");
        let mixed = vec![toleration("", Some("Exists"), None, None, None), toleration(TAINTED_BY, Some("Exists"), None, None, Some(5))];
        assert_eq!(tolerance(&pod(mixed), &taint), Some(Some(5)));
    }
}
