//! The kube target's ops: writes (or, in a dry run, printed writes), waits on the watch caches,
//! Machine deletion under a paused KubeadmControlPlane, disk ops, Velero, hooks; and teardown.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use shakedown_faults::{Answers, MemberId, Model, Op, OutageMode, SiteId};
use tokio::time::Instant;

use super::capi::capi;
use super::conditions::rollout;
use super::profile::Hook;
use super::*;
use crate::targets::TargetError;

impl KubeTarget {
    /// Whether this Cluster can run `op` (hooks win; otherwise what Cluster API, the workload
    /// cluster and Velero make possible), with the reason when not.
    #[deny(clippy::wildcard_enum_match_arm)]
    pub(super) fn supports_op(&self, op: &Op) -> Result<(), crate::targets::Unsupported> {
        if self.cfg.profile.hooks.contains_key(&op.kind()) {
            return Ok(());
        }
        let one_at_a_time = || {
            if self.model.down() == 0 && self.model.outages.is_empty() {
                Ok(())
            } else {
                Err("the kube target deletes Machines for one fault at a time (KubeadmControlPlane replaces every missing Machine once resumed); set a hook in the kube profile for more".into())
            }
        };
        match op {
            Op::PodKill { .. } | Op::OperatorRestart | Op::PvcLoss { .. } | Op::Partition { .. } | Op::PartitionHeal { .. } | Op::PodKillSelected { .. } | Op::NodeDrain { .. } | Op::PodFailure { .. } | Op::Switchover { .. } | Op::Taint { .. } | Op::RestorePitr { .. } | Op::PartitionGroups { .. } | Op::PartitionGroupsHeal { .. } => Err("an application op: it runs on --target app".into()),
            Op::Crash { .. } => one_at_a_time(),
            Op::SiteOutage { mode: OutageMode::PowerLoss, .. } => one_at_a_time(),
            Op::SiteOutage { mode: OutageMode::Isolate, .. } => Err("cutting a failure domain's network is provider-specific: set [hooks.site-outage] and [hooks.site-recover] in the kube profile".into()),
            Op::Restart { .. } | Op::SiteRecover { .. } | Op::RollingReplace => Ok(()),
            Op::RollingUpgrade { to } => match self.cfg.profile.versions.get(to) {
                None => Err(format!("the kube profile names no Kubernetes version for {to}: add [versions.\"{to}\"] kubernetes = \"v1.x.y\"").into()),
                // The seeds of a soak (and of `run --count`) share the Cluster, and Cluster API
                // does not downgrade: once one upgraded it, an upgrade to the same version rolls
                // nothing out (waiting for a rollout that never comes failed `membership`).
                Some(v) if self.current_kcp_version().as_deref() == Some(v.kubernetes.as_str()) => Err(format!(
                    "the KubeadmControlPlane already runs {} (an earlier run upgraded it; Cluster API does not downgrade): nothing to roll out",
                    v.kubernetes
                )
                .into()),
                Some(_) => Ok(()),
            },
            Op::Pause { .. } | Op::Resume { .. } => Err("stopping an etcd member's process has no Cluster API counterpart: set [hooks.pause] and [hooks.resume] in the kube profile".into()),
            Op::DiskDetach { .. } | Op::DiskReattach { .. } => match &self.disk_pv {
                Err(why) => Err(format!("disk ops need [hooks.disk-detach] and [hooks.disk-reattach], or a [disk] volume in the workload cluster: {why}").into()),
                Ok(pv) if matches!(op, Op::DiskDetach { .. }) && self.model.members.values().any(|m| m.disk == shakedown_faults::DiskState::Detached) => {
                    Err(format!("the kube profile names one [disk] volume ({pv}), already detached: one disk at a time").into())
                }
                Ok(_) => Ok(()),
            },
            Op::Defrag { .. } => Err("defragmenting one etcd member has no Cluster API counterpart (kubeadm's etcd is a static pod): set [hooks.defrag] in the kube profile (etcdctl defrag on the etcd of $SHAKEDOWN_MACHINE, say)".into()),
            Op::PartitionUntilSnapshot { .. } => Err("cutting one member's peer traffic until the leader sends it a snapshot is provider-specific: set [hooks.partition-until-snapshot] in the kube profile".into()),
            Op::Failpoint { .. } => Err("etcd's failpoints need a failpoint build of etcd running as the member (not kubeadm's image): set [hooks.failpoint] in the kube profile (it is told SHAKEDOWN_FAILPOINT and SHAKEDOWN_ACTION)".into()),
            Op::DiskReplace { .. } => Err("replacing a member's data (fresh disk, member removed and re-added) is an operator's manual recovery with no Cluster API object to express it: set [hooks.disk-replace] in the kube profile".into()),
            Op::Backup | Op::Restore { .. } => match &self.velero {
                Err(why) => Err(format!("backup and restore need Velero or [hooks.backup] and [hooks.restore] in the kube profile: {why}").into()),
                Ok(()) if matches!(op, Op::Restore { .. }) && self.cfg.profile.hooks.contains_key(&OpKind::Backup) => {
                    Err("the backups were taken by [hooks.backup]: set [hooks.restore] too".into())
                }
                Ok(()) => Ok(()),
            },
        }
    }

    pub(super) fn fd_of(&self, site: SiteId) -> Option<&str> {
        self.site_fds.get(site.0 as usize).map(String::as_str)
    }

    pub(super) async fn send(&mut self, w: Write) -> Result<(), TargetError> {
        if self.cfg.dry_run {
            println!("dry-run: {w}");
            self.dry_run_writes.push(w.to_string());
            return Ok(());
        }
        let what = w.to_string();
        let what = what.split(" {").next().unwrap_or(&what).to_string();
        match w {
            Write::Patch { ar, ns, name, body } => {
                let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &ar);
                let obj = api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await.map_err(|e| api_error(&what, e))?;
                // A wait must not pass on a cached object older than this write.
                if let Some(g) = obj.metadata.generation {
                    self.written_generation.insert(format!("{}/{name}", ar.kind), g);
                }
                Ok(())
            }
            Write::Delete { ar, ns, name } => {
                let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &ar);
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(r)) if r.code == 404 => Ok(()),
                    Err(e) => Err(api_error(&what, e)),
                }
            }
            Write::Create { ar, ns, body } => {
                let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &ar);
                let obj: DynamicObject = serde_json::from_value(body).map_err(|e| TargetError::Environment(format!("{what}: {e}")))?;
                api.create(&PostParams::default(), &obj).await.map(|_| ()).map_err(|e| api_error(&what, e))
            }
            Write::DeleteInWorkload { ar, name, uid } => {
                let w = self
                    .cache
                    .workload
                    .as_ref()
                    .ok_or_else(|| TargetError::Environment(format!("{what}: the workload cluster is not observed")))?;
                let api: Api<DynamicObject> = Api::all_with(w.client.clone(), &ar);
                let dp = DeleteParams {
                    preconditions: Some(kube::api::Preconditions { uid: Some(uid), resource_version: None }),
                    ..Default::default()
                };
                match api.delete(&name, &dp).await {
                    Ok(_) => Ok(()),
                    // Gone already, or replaced by a new object of that name (uid precondition).
                    Err(kube::Error::Api(r)) if r.code == 404 || r.code == 409 => Ok(()),
                    Err(kube::Error::Api(r)) if r.code == 403 => {
                        Err(TargetError::Environment(format!("{what}: forbidden in the workload cluster ({})", r.message)))
                    }
                    Err(e) => Err(TargetError::Environment(format!("{what}: workload cluster at {}: {e}", w.server))),
                }
            }
        }
    }

    pub(super) fn lock_name(&self) -> String {
        format!("shakedown-{}", self.cfg.run_id)
    }

    pub(super) fn configmap_ar() -> ApiResource {
        ApiResource::erase::<ConfigMap>(&())
    }

    /// The run's object: a ConfigMap labelled with the run id, saying which process runs what
    /// against which Cluster (`reap` reads it).
    pub(super) async fn take_lock(&mut self) -> Result<(), TargetError> {
        let data = BTreeMap::from([("cluster".to_string(), self.cfg.name.clone())]);
        let mut cm = crate::k8s::RunOwner::this_process().configmap(&self.lock_name(), &self.cfg.run_id, data);
        cm.metadata.namespace = Some(self.cfg.namespace.clone());
        let mut body = serde_json::to_value(&cm).map_err(|e| TargetError::Environment(format!("the run's ConfigMap: {e}")))?;
        body["apiVersion"] = "v1".into();
        body["kind"] = "ConfigMap".into();
        self.send(Write::Create { ar: Self::configmap_ar(), ns: self.cfg.namespace.clone(), body }).await?;
        self.lock_created = !self.cfg.dry_run;
        Ok(())
    }

    /// Binds members to Machines: a binding holds while its Machine exists and is not being
    /// deleted; an unbound member expected to have a Machine takes the oldest unbound Machine
    /// of its site's failure domain.
    pub(super) fn rebind(&mut self) {
        let ms = cp_machines(&self.cache.machines.objects());
        let retired = &self.retired;
        let live: BTreeMap<&str, &CpMachine> =
            ms.iter().filter(|m| !m.deleting && !retired.contains(&m.name)).map(|m| (m.name.as_str(), m)).collect();
        let model = &self.model;
        self.bindings.retain(|id, machine| model.members.contains_key(id) && live.contains_key(machine.as_str()));
        let mut taken: BTreeSet<String> = self.bindings.values().cloned().collect();
        for m in model.members.values() {
            if self.bindings.contains_key(&m.id) || model.has_process(m) == Answers::No {
                continue;
            }
            let Some(fd) = self.site_fds.get(m.site.0 as usize) else { continue };
            // Healthy Machines first, then the oldest.
            let pick = ms
                .iter()
                .filter(|c| live.contains_key(c.name.as_str()) && c.fd.as_deref() == Some(fd.as_str()) && !taken.contains(&c.name))
                .min_by_key(|c| (!c.healthy, c.created.clone(), c.name.clone()));
            if let Some(c) = pick {
                taken.insert(c.name.clone());
                self.bindings.insert(m.id, c.name.clone());
            }
        }
    }

    /// Waits (on the watch caches, no requests) until `check` passes.
    pub(super) async fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&mut KubeTarget) -> Result<(), String>,
    ) -> Result<(), TargetError> {
        if self.cfg.dry_run {
            println!("dry-run: wait (watch) until {what}");
            return Ok(());
        }
        let before = self.counter.snapshot();
        let t0 = Instant::now();
        let deadline = t0 + timeout;
        let mut changed = self.cache.changed.clone();
        let mut last;
        let unreachable = self.cfg.profile.timeouts.unreachable;
        loop {
            match check(self) {
                Ok(()) => break,
                Err(e) => last = e,
            }
            if let Some(failed) = self.wait_failed.take() {
                return Err(TargetError::Stack(format!("{what}: {failed}")));
            }
            if let Some(lost) = self.cache.lost(unreachable) {
                self.lost = Some(lost.clone());
                return Err(TargetError::Environment(format!("{what}: {lost}")));
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                let watch_err = self.cache.last_error().map(|e| format!(" (last watch error: {e})")).unwrap_or_default();
                return Err(TargetError::Stack(format!("{what}: not done within {}s: {last}{watch_err}", timeout.as_secs())));
            }
        }
        let requests = self.counter.non_watch_since(&before);
        self.log.push(crate::targets::Note {
            kind: "kube-wait".into(),
            detail: json!({"until": what, "ms": t0.elapsed().as_millis() as u64, "non_watch_requests": requests}),
        });
        Ok(())
    }

    /// `Ok` when KCP's rollout is complete and every member expected up stands on a healthy Machine.
    pub(super) fn settled(&mut self) -> Result<(), String> {
        self.rebind();
        let kcp = self.cache.kcp().ok_or("KubeadmControlPlane not in the cache")?;
        let seen = |kind: &str, name: &str, obj: &Value| {
            let want = self.written_generation.get(&format!("{kind}/{name}")).copied().unwrap_or(0);
            let have = obj.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            if have < want {
                Err(format!("{kind} {name}: the watch has not delivered generation {want} yet"))
            } else {
                Ok(())
            }
        };
        seen("KubeadmControlPlane", &self.kcp_name, &kcp)?;
        rollout(&kcp).complete().map_err(|e| format!("KubeadmControlPlane {}: {e}", self.kcp_name))?;
        for d in self.cache.deployments.objects() {
            let obj = serde_json::to_value(d.as_ref()).unwrap_or_default();
            let name = d.metadata.name.clone().unwrap_or_default();
            seen("MachineDeployment", &name, &obj)?;
            rollout(&obj).complete().map_err(|e| format!("MachineDeployment {name}: {e}"))?;
        }
        let ms = cp_machines(&self.cache.machines.objects());
        let mut waiting = Vec::new();
        for m in self.model.members.values().filter(|m| self.model.has_process(m) == Answers::Yes) {
            match self.bindings.get(&m.id).and_then(|b| ms.iter().find(|c| &c.name == b)) {
                Some(c) if c.healthy => {}
                Some(c) => waiting.push(format!("{} on {} ({})", m.id, c.name, c.why)),
                None => waiting.push(format!("{} has no Machine in {}", m.id, self.fd_of(m.site).unwrap_or("?"))),
            }
        }
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(waiting.join(", "))
        }
    }

    pub(super) async fn set_paused(&mut self, paused: bool) -> Result<(), TargetError> {
        if self.paused == paused {
            return Ok(());
        }
        let body = if paused {
            json!({"metadata": {"annotations": {CAPI_PAUSED: "", PAUSED_BY: self.cfg.run_id}}})
        } else {
            json!({"metadata": {"annotations": {CAPI_PAUSED: null, PAUSED_BY: null}}})
        };
        // A controller that reports a `Paused` condition (Cluster API 1.9 on) is waited for: until
        // it has seen the pause, it may still act on its cached, unpaused view, e.g. replace a
        // Machine deleted right after the patch (seen with the test stand-in: a "crash" whose
        // Machine came straight back). Controllers without the condition are not waited for.
        let acknowledges = self.cache.kcp().is_some_and(|k| super::conditions::condition(&k, super::conditions::PAUSED).is_some());
        self.send(Write::Patch { ar: self.kcp_ar.clone(), ns: self.cfg.namespace.clone(), name: self.kcp_name.clone(), body }).await?;
        self.paused = paused;
        if paused && acknowledges && !self.cfg.dry_run {
            let timeout = self.op_timeout;
            self.wait_until("KubeadmControlPlane reports Paused", timeout, |t| {
                match t.cache.kcp().and_then(|k| super::conditions::condition(&k, super::conditions::PAUSED)) {
                    Some(c) if c.is_true() => Ok(()),
                    Some(c) => Err(format!("Paused is {}", c.text())),
                    None => Err("no Paused condition".into()),
                }
            })
            .await?;
        }
        Ok(())
    }

    /// Deletes the Machines of `members` with KCP paused, and waits until they are gone.
    pub(super) async fn delete_machines(&mut self, members: &[MemberId]) -> Result<(), TargetError> {
        let names: Vec<String> = members.iter().filter_map(|m| self.bindings.get(m).cloned()).collect();
        if names.len() != members.len() {
            return Err(TargetError::Stack(format!("no Machine stands for some of {members:?} (bindings {:?})", self.bindings)));
        }
        self.set_paused(true).await?;
        for n in &names {
            self.send(Write::Delete { ar: capi("Machine", self.capi_version), ns: self.cfg.namespace.clone(), name: n.clone() }).await?;
        }
        let timeout = self.op_timeout;
        self.wait_until(&format!("Machine(s) {} deleted", names.join(", ")), timeout, |t| {
            let left: Vec<String> =
                t.cache.machines.objects().iter().filter_map(|m| m.metadata.name.clone()).filter(|n| names.contains(n)).collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("still there: {}", left.join(", ")))
            }
        })
        .await
    }

    /// Resumes KCP and waits until every member expected up stands on a healthy Machine.
    pub(super) async fn replace_missing(&mut self, what: &str) -> Result<(), TargetError> {
        self.set_paused(false).await?;
        let timeout = self.op_timeout;
        self.wait_until(what, timeout, |t| t.settled()).await
    }

    /// `disk-detach`: deletes the VolumeAttachment(s) of the `[disk]` volume and waits until
    /// they are gone (a CSI attacher's finalizer holds one until the volume is detached).
    pub(super) async fn detach_disk(&mut self) -> Result<(), TargetError> {
        let pv = self.disk_pv.clone().map_err(TargetError::Unsupported)?;
        let timeout = self.cfg.profile.disk.as_ref().map(|d| d.timeout).unwrap_or(profile::DEFAULT_DISK_TIMEOUT);
        let vas = self.cache.workload.as_ref().map(|w| w.attachments_of(&pv)).unwrap_or_default();
        if vas.is_empty() && !self.cfg.dry_run {
            return Err(TargetError::Stack(format!(
                "PersistentVolume {pv} has no VolumeAttachment to delete: the probe workload's volume is not attached"
            )));
        }
        for (name, uid, _) in &vas {
            self.send(Write::DeleteInWorkload { ar: workload::va_ar(), name: name.clone(), uid: uid.clone() }).await?;
            self.detached.insert(uid.clone());
        }
        let uids = self.detached.clone();
        self.wait_until(&format!("the VolumeAttachment(s) of PersistentVolume {pv} deleted"), timeout, |t| {
            let w = t.cache.workload.as_ref().ok_or("the workload cluster is not observed")?;
            let left: Vec<String> = w
                .attachments
                .objects()
                .iter()
                .filter(|va| va.metadata.uid.as_ref().is_some_and(|u| uids.contains(u)))
                .filter_map(|va| va.metadata.name.clone())
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("still there: {}", left.join(", ")))
            }
        })
        .await
    }

    /// `disk-reattach`: waits until a VolumeAttachment of the `[disk]` volume that this run did
    /// not delete reports `status.attached: true`.
    pub(super) async fn reattach_disk(&mut self) -> Result<(), TargetError> {
        let pv = self.disk_pv.clone().map_err(TargetError::Unsupported)?;
        let timeout = self.cfg.profile.disk.as_ref().map(|d| d.timeout).unwrap_or(profile::DEFAULT_DISK_TIMEOUT);
        let old = self.detached.clone();
        self.wait_until(&format!("PersistentVolume {pv} attached again"), timeout, |t| {
            let w = t.cache.workload.as_ref().ok_or("the workload cluster is not observed")?;
            let vas = w.attachments_of(&pv);
            if vas.iter().any(|(_, uid, attached)| *attached && !old.contains(uid)) {
                Ok(())
            } else if vas.is_empty() {
                Err("no VolumeAttachment yet".into())
            } else {
                Err(format!("VolumeAttachment {} not attached yet", vas.iter().map(|v| v.0.as_str()).collect::<Vec<_>>().join(", ")))
            }
        })
        .await
    }

    /// Creates a Velero Backup (of the Cluster's namespace) or a Restore (from this run's backup
    /// `from`), labelled with the run id, and waits until its `status.phase` is `Completed`.
    pub(super) async fn velero_run(&mut self, kind: &str, id: &str, from: Option<&str>) -> Result<(), TargetError> {
        self.velero.clone().map_err(TargetError::Unsupported)?;
        let v = self.cfg.profile.velero.clone();
        let run = self.cfg.run_id.clone();
        let name = format!("shakedown-{run}-{id}");
        let mut spec = json!({"includedNamespaces": [self.cfg.namespace]});
        match from {
            None => {
                spec["ttl"] = json!(format!("{}s", v.ttl.as_secs()));
                if let Some(loc) = &v.storage_location {
                    spec["storageLocation"] = json!(loc);
                }
            }
            Some(b) => spec["backupName"] = json!(format!("shakedown-{run}-{b}")),
        }
        let body = json!({"apiVersion": "velero.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": v.namespace, "labels": {RUN_LABEL: run, "shakedown.dev/id": id, "app.kubernetes.io/managed-by": "shakedown"}},
            "spec": spec});
        self.send(Write::Create { ar: velero_ar(kind), ns: v.namespace.clone(), body }).await?;
        if !self.cfg.dry_run {
            self.velero_objects.push((kind.to_string(), name.clone()));
        }
        let watch_ix = if kind == "Backup" { 0 } else { 1 };
        self.wait_until(&format!("Velero {kind} {}/{name} Completed", v.namespace), v.timeout, |t| {
            let obj = t
                .cache
                .velero
                .get(watch_ix)
                .and_then(|w| w.objects().into_iter().find(|o| o.metadata.name.as_deref() == Some(name.as_str())));
            let Some(obj) = obj else { return Err("not in the watch cache yet".into()) };
            let phase = obj.data.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
            match phase {
                "Completed" => Ok(()),
                "Failed" | "PartiallyFailed" | "FailedValidation" | "Deleting" => {
                    let why = ["/status/failureReason", "/status/validationErrors"]
                        .iter()
                        .filter_map(|p| obj.data.pointer(p))
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(" ");
                    // Final: a failed backup stays failed.
                    t.wait_failed = Some(format!("phase {phase} {why}").trim_end().to_string());
                    Err(format!("phase {phase}"))
                }
                "" => Err("no status.phase yet".into()),
                other => Err(format!("phase {other}")),
            }
        })
        .await
    }

    /// What every hook and command probe is told: the run id and the Cluster.
    pub(super) fn hook_env(&self) -> Vec<(String, String)> {
        vec![
            ("SHAKEDOWN_RUN_ID".into(), self.cfg.run_id.clone()),
            ("SHAKEDOWN_CLUSTER".into(), format!("{}/{}", self.cfg.namespace, self.cfg.name)),
        ]
    }

    pub(super) async fn run_hook(&mut self, op: &Op, hook: &Hook) -> Result<(), TargetError> {
        let mut env = self.hook_env();
        env.push(("SHAKEDOWN_OP".into(), op.kind().to_string()));
        if let Some(m) = op.member() {
            env.push(("SHAKEDOWN_MEMBER".into(), m.to_string()));
            if let Some(machine) = self.bindings.get(&m) {
                env.push(("SHAKEDOWN_MACHINE".into(), machine.clone()));
            }
            if let Some(fd) = self.model.members.get(&m).and_then(|mm| self.fd_of(mm.site)) {
                env.push(("SHAKEDOWN_FAILURE_DOMAIN".into(), fd.to_string()));
            }
        }
        match op {
            Op::SiteOutage { site, mode } => {
                env.push(("SHAKEDOWN_SITE".into(), site.to_string()));
                env.push(("SHAKEDOWN_MODE".into(), mode.to_string()));
                env.push(("SHAKEDOWN_FAILURE_DOMAIN".into(), self.fd_of(*site).unwrap_or_default().to_string()));
            }
            Op::SiteRecover { site } => {
                env.push(("SHAKEDOWN_SITE".into(), site.to_string()));
                env.push(("SHAKEDOWN_FAILURE_DOMAIN".into(), self.fd_of(*site).unwrap_or_default().to_string()));
            }
            Op::Restore { backup } => env.push(("SHAKEDOWN_BACKUP".into(), backup.to_string())),
            Op::Backup => env.push(("SHAKEDOWN_BACKUP".into(), format!("b{}", self.model.backups.len()))),
            Op::Failpoint { failpoint, action, .. } => {
                env.push(("SHAKEDOWN_FAILPOINT".into(), failpoint.to_string()));
                env.push(("SHAKEDOWN_ACTION".into(), action.terms(failpoint.name())));
            }
            // A member op's variables are set above; the rest have none of their own.
            Op::Crash { .. }
            | Op::Restart { .. }
            | Op::Pause { .. }
            | Op::Resume { .. }
            | Op::RollingUpgrade { .. }
            | Op::RollingReplace
            | Op::DiskDetach { .. }
            | Op::DiskReattach { .. }
            | Op::DiskReplace { .. }
            | Op::PodKill { .. }
            | Op::OperatorRestart
            | Op::PvcLoss { .. }
            | Op::Partition { .. }
            | Op::PartitionHeal { .. }
            | Op::PodKillSelected { .. }
            | Op::NodeDrain { .. }
            | Op::PodFailure { .. }
            | Op::Switchover { .. }
            | Op::Taint { .. }
            | Op::RestorePitr { .. }
            | Op::PartitionGroups { .. }
            | Op::PartitionGroupsHeal { .. }
            | Op::Defrag { .. }
            | Op::PartitionUntilSnapshot { .. } => {}
        }
        if self.cfg.dry_run {
            println!("dry-run: hook {op}: {:?}", hook.command);
            return Ok(());
        }
        let res = run_command(&hook.command, &env, hook.timeout).await;
        self.log.push(crate::targets::Note { kind: "hook".into(), detail: json!({"op": op.to_string(), "command": hook.command, "exit": res.exit, "ms": res.ms, "stdout": res.stdout, "stderr": res.stderr, "error": res.error})});
        match res.error {
            None => Ok(()),
            Some(e) => Err(TargetError::Environment(format!("hook for {op} ({}): {e}", hook.command.join(" ")))),
        }
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    pub(super) async fn execute_op(&mut self, op: &Op, after: &Model) -> Result<(), TargetError> {
        if let Some(hook) = self.cfg.profile.hooks.get(&op.kind()).cloned() {
            return self.run_hook(op, &hook).await;
        }
        let ns = self.cfg.namespace.clone();
        if matches!(op, Op::RollingUpgrade { .. } | Op::RollingReplace) {
            // A rollout replaces every control-plane Machine.
            let names: Vec<String> = cp_machines(&self.cache.machines.objects()).into_iter().map(|m| m.name).collect();
            self.retired.extend(names);
        }
        match op {
            Op::Crash { member } => self.delete_machines(&[*member]).await,
            Op::SiteOutage { site, mode: OutageMode::PowerLoss } => {
                let members: Vec<MemberId> = self.model.site_members(*site).map(|m| m.id).collect();
                self.delete_machines(&members).await
            }
            Op::Restart { .. } | Op::SiteRecover { .. } => {
                self.model = after.clone();
                self.replace_missing(&format!("{op}: replacement Machines healthy")).await
            }
            Op::RollingUpgrade { to } => {
                let v = self
                    .cfg
                    .profile
                    .versions
                    .get(to)
                    .cloned()
                    .ok_or_else(|| TargetError::Unsupported(format!("no Kubernetes version for {to} in the kube profile")))?;
                let mut spec = json!({"version": v.kubernetes});
                if let Some(tpl) = &v.machine_template {
                    let r = self.infra_ref.as_ref().ok_or_else(|| {
                        TargetError::Stack(format!(
                            "KubeadmControlPlane has no infrastructure machine template reference ({})",
                            self.capi_version.as_str()
                        ))
                    })?;
                    spec["machineTemplate"] = self.capi_version.kcp_template_patch(r, tpl);
                }
                self.send(Write::Patch {
                    ar: self.kcp_ar.clone(),
                    ns: ns.clone(),
                    name: self.kcp_name.clone(),
                    body: json!({"spec": spec}),
                })
                .await?;
                let mds: Vec<String> = self.cache.deployments.objects().iter().filter_map(|d| d.metadata.name.clone()).collect();
                for md in mds {
                    let body = json!({"spec": {"template": {"spec": {"version": v.kubernetes}}}});
                    self.send(Write::Patch { ar: capi("MachineDeployment", self.capi_version), ns: ns.clone(), name: md, body }).await?;
                }
                self.model = after.clone();
                let timeout = self.op_timeout;
                self.wait_until(&format!("rollout to {} complete", v.kubernetes), timeout, |t| t.settled()).await
            }
            Op::RollingReplace => {
                let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
                self.send(Write::Patch {
                    ar: self.kcp_ar.clone(),
                    ns,
                    name: self.kcp_name.clone(),
                    body: self.capi_version.rollout_after(&now),
                })
                .await?;
                self.model = after.clone();
                let timeout = self.op_timeout;
                self.wait_until("rollout after now complete", timeout, |t| t.settled()).await
            }
            Op::DiskDetach { .. } => self.detach_disk().await,
            Op::DiskReattach { .. } => self.reattach_disk().await,
            Op::Backup => {
                let id = after.backups.last().copied().ok_or_else(|| TargetError::Stack("the model took no backup".into()))?;
                self.velero_run("Backup", &id.to_string(), None).await
            }
            Op::Restore { backup } => {
                let n = after.restores.len().saturating_sub(1);
                self.velero_run("Restore", &format!("r{n}"), Some(&backup.to_string())).await
            }
            // Without a hook (which ran above), these have no Cluster API counterpart: the engine
            // skipped them already (supports_op); reaching here is a caller's mistake.
            Op::Pause { .. }
            | Op::Resume { .. }
            | Op::SiteOutage { mode: OutageMode::Isolate, .. }
            | Op::DiskReplace { .. }
            | Op::Defrag { .. }
            | Op::PartitionUntilSnapshot { .. }
            | Op::Failpoint { .. }
            | Op::PodKill { .. }
            | Op::OperatorRestart
            | Op::PvcLoss { .. }
            | Op::Partition { .. }
            | Op::PartitionHeal { .. }
            | Op::PodKillSelected { .. }
            | Op::NodeDrain { .. }
            | Op::PodFailure { .. }
            | Op::Switchover { .. }
            | Op::Taint { .. }
            | Op::RestorePitr { .. }
            | Op::PartitionGroups { .. }
            | Op::PartitionGroupsHeal { .. } => Err(TargetError::Unsupported(
                self.supports_op(op).err().map_or_else(|| format!("{op} is not supported by the kube target"), |u| u.0),
            )),
        }
    }
}

/// How long teardown may take before the run ends anyway.
pub(super) const TEARDOWN_BOUND: Duration = Duration::from_secs(60);

impl KubeTarget {
    /// Resumes KCP if this run paused it; deletes the run's Velero objects and its ConfigMap.
    pub(super) async fn teardown_objects(&mut self) {
        if let Ok(api) = &mut self.api {
            if let Err(e) = api.teardown().await {
                tracing::warn!("teardown: {e}; `shakedown reap --kube` will");
            }
        }
        if self.paused {
            if let Err(e) = self.set_paused(false).await {
                tracing::warn!("teardown: cannot resume KubeadmControlPlane {}: {e}; `shakedown reap --kube` will", self.kcp_name);
            }
        }
        for (kind, name) in std::mem::take(&mut self.velero_objects) {
            let w = Write::Delete { ar: velero_ar(&kind), ns: self.cfg.profile.velero.namespace.clone(), name: name.clone() };
            if let Err(e) = self.send(w).await {
                tracing::warn!("teardown: cannot delete Velero {kind} {name}: {e}; `shakedown reap --kube` will");
            }
        }
        if self.lock_created {
            let w = Write::Delete { ar: Self::configmap_ar(), ns: self.cfg.namespace.clone(), name: self.lock_name() };
            if let Err(e) = self.send(w).await {
                tracing::warn!("teardown: cannot delete the run's ConfigMap {}: {e}; `shakedown reap --kube` will", self.lock_name());
            }
            self.lock_created = false;
        }
    }
}
