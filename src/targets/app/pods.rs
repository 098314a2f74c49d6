//! The ops on the application's pods: `pod-kill`, `pod-kill-selected`, `pod-failure` (the
//! replica's containers on the `[pod_failure]` image for its duration, the pod annotated with the
//! run and its own images) and `pvc-loss`.

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use shakedown_faults::MemberId;

use super::data::is_ready;
use super::{bounded, env, AppTarget, FAILED_BY, OWN_IMAGES};
use crate::targets::TargetError;

impl AppTarget {
    pub(super) async fn pod_kill(&mut self, m: MemberId) -> Result<(), TargetError> {
        let name = self.pod_name(m);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let old = bounded("get pod", pods.get_opt(&name))
            .await
            .map_err(env)?
            .ok_or_else(|| TargetError::Stack(format!("pod {name} does not exist")))?;
        let old_uid = old.metadata.uid.clone();
        if self.dry_write(|| format!("DELETE {}/{name} (grace period 0)", pods.resource_url())) {
            self.dry_wait(&format!("pod {name} recreated after its kill (another UID than {})", old_uid.unwrap_or_default()));
            return Ok(());
        }
        bounded("delete pod", pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }))
            .await
            .map_err(env)?;
        // Verified: the controller made a new pod of that name (another UID).
        self.wait(&format!("pod {name} recreated after its kill"), || {
            let pods = pods.clone();
            let (name, old_uid) = (name.clone(), old_uid.clone());
            async move { pods.get_opt(&name).await.ok().flatten().filter(|p| p.metadata.uid != old_uid).map(|_| ()) }
        })
        .await
    }

    /// `pod-kill-selected(pick)`: the `[pod_kill_selected]` pods the plan's pick chooses,
    /// deleted together with grace period 0, then verified: each one gone or replaced (its name
    /// now another UID) and at least as many matching pods Ready as before the kill.
    pub(super) async fn pod_kill_selected(&mut self, pick: u32) -> Result<(), TargetError> {
        let Some(sel) = self.spec.app_profile.pod_kill_selected.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [pod_kill_selected]".into()));
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed = bounded("pods", pods.list(&ListParams::default().labels(&sel.selector))).await.map_err(env)?.items;
        let live: Vec<&Pod> = listed.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        let ready_before = live.iter().filter(|p| is_ready(p)).count();
        let mut names: Vec<String> = live.iter().filter_map(|p| p.metadata.name.clone()).collect();
        names.sort();
        let chosen = sel.choose(&names, pick);
        if chosen.is_empty() {
            return Err(TargetError::Stack(format!("no pod matches {} in {}", sel.selector, self.ns())));
        }
        let killed: Vec<(String, Option<String>)> = chosen
            .iter()
            .map(|n| (n.clone(), live.iter().find(|p| p.metadata.name.as_ref() == Some(n)).and_then(|p| p.metadata.uid.clone())))
            .collect();
        let text = format!(
            "pod-kill-selected(pick {pick}): {} of the {} pods matching {} — {}",
            killed.len(),
            names.len(),
            sel.selector,
            chosen.join(", ")
        );
        if self.dry_run {
            for (name, _) in &killed {
                self.dry_write(|| format!("DELETE {}/{name} (grace period 0)", pods.resource_url()));
            }
            self.dry_wait(&format!("{} replaced and {ready_before} pods of {} Ready again", chosen.join(", "), sel.selector));
            return Ok(());
        }
        tracing::info!("{text}");
        self.log.push(crate::targets::Note {
            kind: "app-kill".into(),
            detail: serde_json::json!({"selector": sel.selector, "matching": names, "killed": chosen, "ready-before": ready_before}),
        });
        let deletes = killed.iter().map(|(name, _)| {
            let pods = pods.clone();
            async move {
                bounded(
                    &format!("delete pod {name}"),
                    pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }),
                )
                .await
            }
        });
        for r in futures::future::join_all(deletes).await {
            // A pod already gone counts as killed; anything else is the environment's.
            if let Err(e) = r {
                if !e.is_not_found() {
                    return Err(env(e));
                }
            }
        }
        // Verified: none of the killed pods is left (gone, or its name now another UID), and the
        // selector's Ready pods are back to what they were.
        let selector = sel.selector.clone();
        self.wait(&format!("{} replaced and {ready_before} pods of {selector} Ready again", chosen.join(", ")), || {
            let (pods, killed, selector) = (pods.clone(), killed.clone(), selector.clone());
            async move {
                let now = pods.list(&ListParams::default().labels(&selector)).await.ok()?.items;
                let survivor =
                    killed.iter().any(|(name, uid)| now.iter().any(|p| p.metadata.name.as_ref() == Some(name) && p.metadata.uid == *uid));
                let ready = now.iter().filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p)).count();
                (!survivor && ready >= ready_before).then_some(())
            }
        })
        .await
    }

    /// `pod-failure(m)`: the replica's containers run the `[pod_failure]` image (the pod
    /// annotated with the run and its own images first), verified not Ready on the same pod,
    /// left so for `duration`, then given their own images back — whatever came of the failure —
    /// and verified Ready again on them. An `app-pod-failure` event says how long each took.
    pub(super) async fn pod_failure(&mut self, m: MemberId) -> Result<(), TargetError> {
        let Some(pf) = self.spec.app_profile.pod_failure.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [pod_failure] image".into()));
        };
        let name = self.pod_name(m);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let pod = bounded("get pod", pods.get(&name)).await.map_err(env)?;
        let uid = pod.metadata.uid.clone();
        let own = own_images(&pod);
        if self.dry_run {
            let url = pods.resource_url();
            self.dry_write(|| {
                format!("PATCH {url}/{name} (strategic merge patch) {}", failure_patch(Some(&self.run_id), &own, Some(&pf.image)))
            });
            self.dry_wait(&format!("{name} failed (the same pod not Ready on image {})", pf.image));
            println!("dry-run: wait {}s (the failure's duration)", pf.duration.as_secs());
            self.dry_write(|| format!("PATCH {url}/{name} (strategic merge patch) {}", failure_patch(None, &own, None)));
            self.dry_wait(&format!("{name} Ready again on its own images"));
            return Ok(());
        }
        let t0 = Instant::now();
        bounded(
            &format!("fail pod {name}"),
            pods.patch(&name, &PatchParams::default(), &Patch::Strategic(failure_patch(Some(&self.run_id), &own, Some(&pf.image)))),
        )
        .await
        .map_err(env)?;
        // Verified: the same pod, not Ready.
        let failed = self
            .wait(&format!("{name} failed (the same pod not Ready on image {})", pf.image), || {
                let (pods, name, uid) = (pods.clone(), name.clone(), uid.clone());
                async move { pods.get(&name).await.ok().filter(|p| p.metadata.uid == uid && !is_ready(p)).map(|_| ()) }
            })
            .await;
        let not_ready_ms = t0.elapsed().as_millis() as u64;
        if failed.is_ok() {
            tokio::time::sleep(pf.duration).await;
        }
        let t1 = Instant::now();
        let put_back = bounded(
            &format!("give pod {name} its images back"),
            pods.patch(&name, &PatchParams::default(), &Patch::Strategic(failure_patch(None, &own, None))),
        )
        .await;
        failed?;
        put_back.map_err(env)?;
        // Verified: Ready again on its own images.
        let same = self
            .wait(&format!("{name} Ready again on its own images"), || {
                let (pods, name, own, uid) = (pods.clone(), name.clone(), own.clone(), uid.clone());
                async move { pods.get(&name).await.ok().filter(|p| is_ready(p) && own_images(p) == own).map(|p| p.metadata.uid == uid) }
            })
            .await?;
        let ready_ms = t1.elapsed().as_millis() as u64;
        tracing::info!(
            "pod-failure({m}): {name} not Ready {:.1}s after its images were replaced, Ready again {:.1}s after they were put back{}",
            not_ready_ms as f64 / 1000.0,
            ready_ms as f64 / 1000.0,
            if same { "" } else { " (on a new pod: something replaced the failed one)" }
        );
        self.log.push(crate::targets::Note {
            kind: "app-pod-failure".into(),
            detail: serde_json::json!({
                "pod": name,
                "image": pf.image,
                "own-images": own,
                "not-ready-after-ms": not_ready_ms,
                "failed-for-ms": pf.duration.as_millis() as u64,
                "ready-again-after-ms": ready_ms,
                "same-pod": same,
            }),
        });
        Ok(())
    }

    pub(super) async fn pvc_loss(&mut self, m: MemberId) -> Result<(), TargetError> {
        let Some(claim) = self.spec.app_profile.claim.clone() else {
            return Err(TargetError::Unsupported("the app profile names no claim".into()));
        };
        let pod = self.pod_name(m);
        let pvc_name = format!("{claim}-{pod}");
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), self.ns());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let old = bounded("get claim", pvcs.get_opt(&pvc_name))
            .await
            .map_err(env)?
            .ok_or_else(|| TargetError::Stack(format!("claim {pvc_name} does not exist")))?;
        let (old_uid, old_volume) = (old.metadata.uid.clone(), old.spec.and_then(|s| s.volume_name));
        if self.dry_write(|| format!("DELETE {}/{pvc_name}", pvcs.resource_url())) {
            self.dry_write(|| format!("DELETE {}/{pod} (grace period 0)", pods.resource_url()));
            self.dry_wait(&format!("claim {pvc_name} recreated empty (another UID and volume) and bound"));
            return Ok(());
        }
        bounded("delete claim", pvcs.delete(&pvc_name, &DeleteParams::default())).await.map_err(env)?;
        bounded("delete pod", pods.delete(&pod, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }))
            .await
            .map_err(env)?;
        // Verified: a new claim of that name (another UID, another volume), bound.
        self.wait(&format!("claim {pvc_name} recreated empty and bound"), || {
            let pvcs = pvcs.clone();
            let (pvc_name, old_uid, old_volume) = (pvc_name.clone(), old_uid.clone(), old_volume.clone());
            async move {
                let c = pvcs.get_opt(&pvc_name).await.ok().flatten()?;
                let bound = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
                let volume = c.spec.as_ref().and_then(|s| s.volume_name.clone());
                (c.metadata.uid != old_uid && bound && volume.is_some() && volume != old_volume).then_some(())
            }
        })
        .await
    }
}

/// A pod's containers' images (name → image).
pub fn own_images(p: &Pod) -> BTreeMap<String, String> {
    p.spec.iter().flat_map(|s| s.containers.iter()).map(|c| (c.name.clone(), c.image.clone().unwrap_or_default())).collect()
}

/// The run whose `pod-failure` left pod `p` failed, if one did.
pub fn failed_by(p: &Pod) -> Option<&str> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(FAILED_BY)).map(String::as_str)
}

/// The strategic merge patch that fails a pod for run `run` — every container on `image`, its
/// own images recorded — or, with `None`s, puts `own` back and drops the annotations.
pub fn failure_patch(run: Option<&str>, own: &BTreeMap<String, String>, image: Option<&str>) -> serde_json::Value {
    let containers: Vec<serde_json::Value> = own.iter().map(|(c, i)| serde_json::json!({"name": c, "image": image.unwrap_or(i)})).collect();
    let recorded = run.map(|_| serde_json::to_string(own).unwrap_or_default());
    serde_json::json!({"metadata": {"annotations": {FAILED_BY: run, OWN_IMAGES: recorded}}, "spec": {"containers": containers}})
}
