//! The operator and its custom resources: `operator-restart` (scaled to zero, its pods gone,
//! back, available on new pods), `backup` and `restore(b)` (an object from the app profile's
//! template, its kind's plural by discovery, done when its `done` field says so; the data
//! workload marks where each falls).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Instant, SystemTime};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use shakedown_faults::{BackupId, Model};

use super::data::{is_ready, ready_pod, Writer};
use super::spec::{self, CommandOp, OperatorOp, ResourceOp};
use super::{bounded, env, selector_of, AppTarget, REQUEST_BOUND};
use crate::k8s::exec::exec;
use crate::targets::TargetError;

impl AppTarget {
    pub(super) async fn operator_restart(&mut self) -> Result<(), TargetError> {
        let (Some(name), Some(replicas)) = (self.spec.app_profile.operator.clone(), self.operator_replicas) else {
            return Err(TargetError::Unsupported("the app profile names no operator".into()));
        };
        let deps: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        let dep = bounded("get operator", deps.get(&name)).await.map_err(env)?;
        let selector = selector_of(dep.spec.as_ref().map(|s| &s.selector));
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let before: BTreeSet<String> = bounded("operator pods", pods.list(&ListParams::default().labels(&selector)))
            .await
            .map_err(env)?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.uid)
            .collect();
        let scale = |n: i32| serde_json::json!({"spec": {"replicas": n}});
        if self.dry_run {
            let url = deps.resource_url();
            self.dry_write(|| format!("PATCH {url}/{name} (merge patch) {}", scale(0)));
            self.dry_wait(&format!("the operator {name}'s pods gone ({} now)", before.len()));
            self.dry_write(|| format!("PATCH {url}/{name} (merge patch) {}", scale(replicas)));
            self.dry_wait(&format!("the operator {name} available again ({replicas} Ready on new pods)"));
            return Ok(());
        }
        bounded("scale the operator to 0", deps.patch(&name, &PatchParams::default(), &Patch::Merge(scale(0)))).await.map_err(env)?;
        // Verified: every operator pod is gone.
        let gone = self
            .wait(&format!("the operator {name}'s pods gone"), || {
                let pods = pods.clone();
                let selector = selector.clone();
                async move { pods.list(&ListParams::default().labels(&selector)).await.ok().filter(|l| l.items.is_empty()).map(|_| ()) }
            })
            .await;
        bounded("scale the operator back", deps.patch(&name, &PatchParams::default(), &Patch::Merge(scale(replicas))))
            .await
            .map_err(env)?;
        gone?;
        // Verified: available again, on new pods.
        self.wait(&format!("the operator {name} available again"), || {
            let (deps, pods, name, selector, before) = (deps.clone(), pods.clone(), name.clone(), selector.clone(), before.clone());
            async move {
                let d = deps.get(&name).await.ok()?;
                let available = d.status.and_then(|s| s.available_replicas).unwrap_or(0);
                let fresh = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .ok()?
                    .items
                    .iter()
                    .filter(|p| is_ready(p) && !p.metadata.uid.as_ref().is_some_and(|u| before.contains(u)))
                    .count();
                (available >= replicas && fresh as i32 >= replicas).then_some(())
            }
        })
        .await
    }

    /// The API of a custom resource kind (its plural from discovery).
    async fn resource_api(&self, r: &ResourceOp, section: &str) -> Result<Api<DynamicObject>, TargetError> {
        let (api_version, kind) = r.kind(section).map_err(|e| TargetError::Environment(e.to_string()))?;
        let gvk = format!("{api_version}/{kind}");
        let discovered = resource_api_of(&self.client, self.ns(), &gvk);
        tokio::time::timeout(REQUEST_BOUND, discovered)
            .await
            .map_err(|_| format!("discover {api_version} {kind}: no answer within {}s", REQUEST_BOUND.as_secs()))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| {
                TargetError::Environment(format!(
                    "the [{section}] template's kind is not served by {}: {e} (is the operator's CRD installed?)",
                    self.server
                ))
            })
    }

    /// Creates `r`'s object named `name` and waits until its `done` field says so (its
    /// `failed` field, or the op bound, fails the op).
    async fn resource_op(&mut self, r: &ResourceOp, section: &str, name: &str, vars: BTreeMap<&str, String>) -> Result<(), TargetError> {
        let api = self.resource_api(r, section).await?;
        let mut vars = vars;
        vars.insert("namespace", self.ns().to_string());
        vars.insert("statefulset", self.spec.app_profile.statefulset.clone());
        let body = r.object(name, &self.run_labels(), &vars);
        let obj: DynamicObject =
            serde_json::from_value(body.clone()).map_err(|e| TargetError::Environment(format!("[{section}.template]: {e}")))?;
        let what = format!("the operator's {section} {name} done ({} = {:?})", r.done.field, r.done.equals);
        if self.dry_write(|| format!("POST {} {body}", api.resource_url())) {
            self.dry_wait(&what);
            return Ok(());
        }
        let t = Instant::now();
        bounded(&format!("create {name}"), api.create(&PostParams::default(), &obj)).await.map_err(env)?;
        // Verified: the operator says it is done; a failure it reports ends the wait at once.
        let waited = self
            .wait(&what, || {
                let (api, r) = (api.clone(), r.clone());
                async move {
                    let got = serde_json::to_value(api.get_opt(name).await.ok()??).ok()?;
                    match r.failed.as_ref().filter(|f| f.matches(&got)) {
                        Some(f) => Some(Err(TargetError::Stack(format!(
                            "the operator failed {section} {name}: {} = {:?}; status: {}",
                            f.field,
                            f.equals,
                            got.get("status").map(|s| s.to_string()).unwrap_or_default()
                        )))),
                        None => r.done.matches(&got).then_some(Ok(())),
                    }
                }
            })
            .await
            .and_then(|done| done);
        self.log.push(crate::targets::Note {
            kind: format!("app-{section}"),
            detail: serde_json::json!({
                "object": name,
                "kind": body.get("kind"),
                "ms": t.elapsed().as_millis() as u64,
                "error": waited.as_ref().err().map(|e| e.to_string()),
            }),
        });
        waited
    }

    /// A `[backup]`, `[restore]` or `[restore_pitr]` command exec'd in a Ready pod of its
    /// selector, within `op_timeout`; exit 0 is done. An `app-<kind>` event names the pod, the
    /// command and how long it took, with `extra`'s fields.
    async fn command_op(
        &mut self,
        c: &CommandOp,
        section: &str,
        kind: &str,
        vars: BTreeMap<&str, String>,
        extra: serde_json::Value,
    ) -> Result<(), TargetError> {
        let mut vars = vars;
        vars.insert("namespace", self.ns().to_string());
        vars.insert("statefulset", self.spec.app_profile.statefulset.clone());
        let cmd = spec::fill(&c.command, &vars);
        let leader = self.spec.app_profile.leader.as_ref().map(|l| l.selector.clone());
        let selector = c.selector.clone().or(leader).unwrap_or_else(|| self.sts_selector.clone());
        if self.dry_write(|| format!("exec in a Ready pod of {selector}: {cmd:?}")) {
            self.dry_wait(&format!("the [{section}] command exits"));
            return Ok(());
        }
        let pod = ready_pod(&self.client, self.ns(), &selector, None)
            .await
            .and_then(|p| p.metadata.name)
            .ok_or_else(|| TargetError::Stack(format!("no Ready pod of {selector} to run the [{section}] command in")))?;
        let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let t = Instant::now();
        let out = exec(&self.client, self.ns(), &pod, c.container.as_deref(), &refs, self.spec.app_profile.op_timeout).await;
        let said = |o: &crate::k8s::exec::ExecOutput| {
            let both = format!("{} {}", o.stdout.trim(), o.stderr.trim());
            let both = both.trim();
            // The end of what it said: where a failing command says why.
            both.char_indices().rev().nth(1500).map_or(both.to_string(), |(i, _)| format!("…{}", &both[i..]))
        };
        let result = match &out {
            Ok(o) if o.code == 0 => Ok(()),
            Ok(o) => Err(TargetError::Stack(format!("the [{section}] command in {pod} exited {}: {}", o.code, said(o)))),
            Err(e) => Err(TargetError::Stack(format!("the [{section}] command: {e}"))),
        };
        let mut detail = serde_json::json!({
            "pod": pod,
            "command": cmd,
            "ms": t.elapsed().as_millis() as u64,
            "error": result.as_ref().err().map(|e| e.to_string()),
        });
        if let (Some(d), serde_json::Value::Object(extra)) = (detail.as_object_mut(), extra) {
            d.extend(extra);
        }
        self.log.push(crate::targets::Note { kind: kind.to_string(), detail });
        result
    }

    /// `backup`: the operator's backup object, or the `[backup]` command; the data workload
    /// marks what the backup may hold (writes acknowledged before it was asked for must be in it).
    pub(super) async fn backup(&mut self, after: &Model) -> Result<(), TargetError> {
        let Some(r) = self.spec.app_profile.backup.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [backup]".into()));
        };
        // The model numbers backups as it takes them: this one is the newest.
        let b =
            *after.backups.iter().next_back().ok_or_else(|| TargetError::Environment("the model holds no backup after backup".into()))?;
        let name = format!("shakedown-{}-{b}", self.run_id.trim_start_matches("sd-"));
        let start = self.writer.as_ref().map(Writer::position);
        match &r {
            OperatorOp::Resource(r) => self.resource_op(r, "backup", &name, BTreeMap::new()).await?,
            OperatorOp::Command(c) => {
                self.command_op(c, "backup", "app-backup", BTreeMap::from([("backup", name.clone())]), serde_json::Value::Null).await?
            }
        }
        if let (Some(w), Some(start)) = (&self.writer, start) {
            w.mark_backup(b, start, w.position());
        }
        self.backups.insert(b, (name, SystemTime::now()));
        Ok(())
    }

    /// `restore(b)`: the operator's restore object naming backup `b`'s, or the `[restore]`
    /// command given its name; the data workload then expects the backup's writes and not those
    /// acknowledged after it (`app-durability`).
    pub(super) async fn restore(&mut self, b: BackupId) -> Result<(), TargetError> {
        let Some(r) = self.spec.app_profile.restore.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [restore]".into()));
        };
        let backup = self
            .backups
            .get(&b)
            .map(|(n, _)| n.clone())
            .ok_or_else(|| TargetError::Environment(format!("{b} was not taken by this run")))?;
        self.restores += 1;
        let name = format!("shakedown-{}-restore-{}", self.run_id.trim_start_matches("sd-"), self.restores);
        let start = self.writer.as_ref().map(Writer::position);
        if let Some(w) = &self.writer {
            w.restore_begins();
        }
        let vars = BTreeMap::from([("backup", backup)]);
        let done = match &r {
            OperatorOp::Resource(r) => self.resource_op(r, "restore", &name, vars).await,
            OperatorOp::Command(c) => self.command_op(c, "restore", "app-restore", vars, serde_json::Value::Null).await,
        };
        if let Some(w) = &self.writer {
            w.restore_ended();
        }
        done?;
        if let (Some(w), Some(start)) = (&self.writer, start) {
            w.mark_restore(b, start, w.position());
        }
        self.last_restore = Some(SystemTime::now());
        Ok(())
    }

    /// `restore-pitr(b, at)`: the `[restore_pitr]` command given backup `b`'s name and an
    /// instant `at` tenths (and a half) of the way from the later of the backup's end and the
    /// last restore's to now; the data workload then expects exactly the writes acknowledged
    /// before that instant (`app-durability`), those in flight across it (or within the
    /// profile's `clock_skew` of it) either way.
    pub(super) async fn restore_pitr(&mut self, b: BackupId, at: u32) -> Result<(), TargetError> {
        let Some(p) = self.spec.app_profile.restore_pitr.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [restore_pitr]".into()));
        };
        let (backup, taken) =
            self.backups.get(&b).cloned().ok_or_else(|| TargetError::Environment(format!("{b} was not taken by this run")))?;
        let from = self.last_restore.map_or(taken, |r| r.max(taken));
        let span = SystemTime::now().duration_since(from).unwrap_or_default();
        let instant = from + span.mul_f64(f64::from(shakedown_faults::pitr_percent(at)) / 100.0);
        let time = humantime::format_rfc3339_micros(instant).to_string();
        let (acked, sent_after) = match &self.writer {
            Some(w) => (w.acked_before(instant - p.clock_skew), w.acked_before(instant + p.clock_skew) + 1),
            None => (0, 0),
        };
        let start = self.writer.as_ref().map(Writer::position);
        if let Some(w) = &self.writer {
            w.restore_begins();
        }
        tracing::info!("restore-pitr: {backup} to {time} ({acked} writes acknowledged before it)");
        let vars = BTreeMap::from([("backup", backup.clone()), ("time", time.clone())]);
        let extra = serde_json::json!({"time": time, "acked_before": acked, "acked_when_asked": start});
        let done = self.command_op(&p.as_command(), "restore_pitr", "app-restore-pitr", vars, extra).await;
        if let Some(w) = &self.writer {
            w.restore_ended();
        }
        done?;
        if let (Some(w), Some(start)) = (&self.writer, start) {
            w.mark_pitr(b, start, acked, sent_after, w.position());
        }
        self.last_restore = Some(SystemTime::now());
        Ok(())
    }
}

/// The (apiVersion, kind) of the app profile's `[backup]` and `[restore]` objects.
pub fn resource_kinds(p: &spec::AppProfile) -> BTreeSet<(String, String)> {
    [("backup", &p.backup), ("restore", &p.restore)]
        .into_iter()
        .filter_map(|(s, r)| match r {
            Some(OperatorOp::Resource(r)) => r.kind(s).ok(),
            Some(OperatorOp::Command(_)) | None => None,
        })
        .collect()
}

/// Why the API of a kind was not found.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    #[error("{gvk}: not group/version/Kind")]
    NotGvk { gvk: String },
    /// Discovery failed, or the cluster does not serve the kind.
    #[error("{gvk}: {source}")]
    Discovery {
        gvk: String,
        #[source]
        source: kube::Error,
    },
}

/// The API of `apiVersion/kind` (`group/version/Kind`, as `reap` reads it from a run's
/// ConfigMap) by discovery.
pub async fn resource_api_of(client: &Client, ns: &str, gvk: &str) -> Result<Api<DynamicObject>, ResourceError> {
    let mut parts = gvk.rsplitn(2, '/');
    let (kind, api_version) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    // `v1/Pod`: the core group.
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    if version.is_empty() || kind.is_empty() {
        return Err(ResourceError::NotGvk { gvk: gvk.to_string() });
    }
    let (ar, _): (ApiResource, _) = kube::discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
        .await
        .map_err(|source| ResourceError::Discovery { gvk: gvk.to_string(), source })?;
    Ok(Api::namespaced_with(client.clone(), ns, &ar))
}
