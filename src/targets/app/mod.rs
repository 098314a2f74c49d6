//! The application target (`--target app`): an application on a Kubernetes cluster — a
//! StatefulSet whose replicas are the plan's members, the operator that runs it, a
//! data-integrity workload of its own commands — faulted through the Kubernetes API only (no
//! agent on the nodes), every fault verified to have happened before the step counts.
//!
//! Ops: `pod-kill` (grace 0; a pod of that name with a new UID), `pod-kill-selected` (`count` or
//! `percent` of the pods of a label selector at once, grace 0; each gone or replaced, as many
//! Ready as before; which ones is named in an `app-kill` event), `operator-restart` (scaled to
//! zero, its pods gone, back, available), `pvc-loss` (claim and pod deleted; a new claim of that
//! name, new UID, another volume, bound), `partition` (a NetworkPolicy cutting the replica off;
//! the profile's probe from another replica must fail to connect, else the op is an
//! environment error: a network that does not enforce NetworkPolicy cannot be partitioned this
//! way, and a partition that cut nothing must not pass; the probe must connect before the policy
//! is made, or it could show nothing), `partition-heal`, `partition-groups` (two label groups of
//! `[[partition.groups]]` cut apart by a NetworkPolicy on each side admitting everyone but the
//! other side; verified both ways, and from a replica in neither group), `partition-groups-heal`,
//! `node-drain` (the
//! node of a replica cordoned, its pods evicted through the eviction API respecting
//! PodDisruptionBudgets, verified drained, uncordoned; the node must have opted in),
//! `pod-failure` (the replica's containers on the `[pod_failure]` image for its duration: the
//! same pod not Ready, then Ready on its own images again), `backup` and
//! `restore(b)` (the operator's own custom resources from the app profile's templates; done
//! when the operator says so in the object, an `app-backup` / `app-restore` event each; the data
//! workload marks where they fall, so that `app-durability` expects a restored backup's writes
//! and not those acknowledged after it).
//! Invariants: `app-ready`, `app-durability`, `leaks` (the run's NetworkPolicies, the operator's
//! scale, its cordons, its failed pods).

pub mod data;
pub mod spec;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use shakedown_faults::{BackupId, MemberId, Model, Op, OpKind, Stack};
use shakedown_invariants::{AppInventory, AppObservation, AppWorkload, InvariantId, Inventory, MemberStatus, Observation};

use super::exec::exec;
use super::kube::{OPT_IN, RUN_LABEL};
use super::{Coverage, StartContext, Started, Target, TargetError};
use crate::exit::Fatal;
use data::{is_ready, ready_pod, Writer};
use spec::{fill, AppSpec, GroupCut, HttpProbe, ObjectProbe, ProbeCheck, ResourceOp};

type Labels = BTreeMap<String, String>;

/// The label the apiserver gives every namespace, its name (Kubernetes 1.21 and later).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn group_policy_name(pick: u32, side: char) -> String {
    format!("shakedown-partition-groups-p{pick}-{side}")
}

/// The pick of a group partition's policy, from its name.
fn group_policy_pick(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("shakedown-partition-groups-p")?;
    let (pick, side) = rest.split_once('-')?;
    matches!(side, "a" | "b").then_some(())?;
    pick.parse().ok()
}

/// Whether pod `p` has every label of `labels`.
fn has_labels(p: &Pod, labels: &Labels) -> bool {
    let own = p.metadata.labels.as_ref();
    labels.iter().all(|(k, v)| own.and_then(|l| l.get(k)) == Some(v))
}

/// The NetworkPolicy of one side of a group partition: it selects the side's pods (`own`) and
/// admits ingress from every pod of the namespace that lacks one of the other side's labels
/// (`NotIn` holds for a missing label too), and from every pod of the other namespaces when
/// they carry their name label (`other_namespaces_than`: the app's namespace). Ingress only:
/// with both sides' policies, a connection between them is refused whichever side opens it,
/// and each side's own egress is left alone.
fn group_policy(name: &str, run_id: &str, own: &Labels, other: &Labels, other_namespaces_than: Option<&str>) -> serde_json::Value {
    let mut from: Vec<serde_json::Value> = other
        .iter()
        .map(|(k, v)| serde_json::json!({"podSelector": {"matchExpressions": [{"key": k, "operator": "NotIn", "values": [v]}]}}))
        .collect();
    if let Some(ns) = other_namespaces_than {
        from.push(serde_json::json!({"namespaceSelector": {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": [ns]}]}}));
    }
    serde_json::json!({
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id, "app.kubernetes.io/managed-by": "shakedown"}},
        "spec": {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"], "ingress": [{"from": from}]},
    })
}

const POLL: Duration = Duration::from_millis(250);
/// How long one API request of the target may take.
const REQUEST_BOUND: Duration = Duration::from_secs(15);
/// How long one probe of `app-ready` may take.
const PROBE_BOUND: Duration = Duration::from_secs(15);
/// How long a checker Job (a `job` probe) may take to complete.
const PROBE_JOB_BOUND: Duration = Duration::from_secs(60);
/// How long the data workload has to get its first write acknowledged before the run starts
/// (at most the profile's `op_timeout`).
const FIRST_ACK_BOUND: Duration = Duration::from_secs(60);
/// How long a partition probe keeps trying to see the traffic cut (policies can take a moment
/// to apply) or flowing again.
const PARTITION_SETTLE: Duration = Duration::from_secs(10);
/// The annotation a node the run cordoned carries (the run id), for teardown, `leaks` and `reap --kube`.
pub const CORDONED_BY: &str = "shakedown.dev/cordoned-by";
/// The annotations of a pod a `pod-failure` failed: the run id, and its containers' own images
/// (a JSON object, container name → image) to put back — by the op, teardown or `reap --kube`.
pub const FAILED_BY: &str = "shakedown.dev/failed-by";
pub const OWN_IMAGES: &str = "shakedown.dev/own-images";

pub struct AppTarget {
    client: Client,
    /// The same cluster without kube-rs's retry of 429 answers (evictions).
    evict_client: Client,
    server: String,
    spec: AppSpec,
    run_id: String,
    /// The operator's replicas when the run started (restored at teardown).
    operator_replicas: Option<i32>,
    /// The StatefulSet's label selector (`k=v,…`).
    sts_selector: String,
    writer: Option<Writer>,
    notes: Vec<String>,
    version: String,
    /// What the ops did beyond their name (the pods `pod-kill-selected` chose), for the event log.
    events: Vec<crate::events::Event>,
    /// The backups' objects by the plan's backup ids.
    backups: BTreeMap<BackupId, String>,
    /// How many restores the run has asked for (their objects' names).
    restores: usize,
    /// How many checker Jobs the probes have created (their names).
    probe_jobs: std::sync::atomic::AtomicU32,
    torn_down: bool,
}

fn env(e: impl std::fmt::Display) -> TargetError {
    TargetError::Environment(e.to_string())
}

async fn bounded<T, E: std::fmt::Display>(what: &str, f: impl std::future::Future<Output = Result<T, E>>) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_BOUND, f).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {}s", REQUEST_BOUND.as_secs())),
    }
}

impl AppTarget {
    pub async fn start_spec(spec: &AppSpec, ctx: &StartContext<'_>) -> Result<AppTarget, Fatal> {
        let p = &spec.app_profile;
        if ctx.profile.stack != Stack::App {
            return Err(Fatal::usage(format!(
                "--target app runs profiles with stack = \"app\" (the application ops); profile {} has stack = {:?}",
                ctx.profile.name, ctx.profile.stack
            )));
        }
        let config = super::kube::client::load_config(ctx.options.kube.kubeconfig.as_deref(), spec.context.as_deref())
            .await
            .map_err(super::kube::spec::fatal)?;
        let counter = super::kube::client::RequestCounter::default();
        let (client, server) = super::kube::client::build(config.clone(), &counter).map_err(Fatal::environment)?;
        // Evictions answer 429 when a PodDisruptionBudget refuses them: that answer is the
        // drain's to see, not kube-rs's own retry's (429, 503, 504; on by default).
        let mut no_retry = config;
        no_retry.default_retry = false;
        let (evict_client, _) = super::kube::client::build(no_retry, &counter).map_err(Fatal::environment)?;
        let ns: Api<Namespace> = Api::all(client.clone());
        let namespace = bounded(&format!("namespace {}", p.namespace), ns.get_opt(&p.namespace))
            .await
            .map_err(|e| Fatal::environment(format!("{server}: {e}")))?;
        let Some(namespace) = namespace else { return Err(Fatal::usage(format!("namespace {} does not exist on {server}", p.namespace))) };
        if namespace.metadata.annotations.as_ref().and_then(|a| a.get(OPT_IN)).map(String::as_str) != Some("true") {
            return Err(Fatal::environment(format!(
                "namespace {} has not opted in to chaos: annotate it with {OPT_IN}=\"true\" (kubectl annotate namespace {} {OPT_IN}=true)",
                p.namespace, p.namespace
            )));
        }
        let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &p.namespace);
        let set = bounded("statefulset", sts.get_opt(&p.statefulset))
            .await
            .map_err(Fatal::environment)?
            .ok_or_else(|| Fatal::usage(format!("StatefulSet {}/{} does not exist", p.namespace, p.statefulset)))?;
        let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let sts_selector = set
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        if replicas as u32 != ctx.profile.members {
            return Err(Fatal::usage(format!(
                "StatefulSet {}/{} has {replicas} replicas; the profile {} has members = {}: they must match",
                p.namespace, p.statefulset, ctx.profile.name, ctx.profile.members
            )));
        }
        let operator_replicas = match &p.operator {
            Some(name) => {
                let d: Api<Deployment> = Api::namespaced(client.clone(), &p.namespace);
                let dep = bounded("operator", d.get_opt(name))
                    .await
                    .map_err(Fatal::environment)?
                    .ok_or_else(|| Fatal::usage(format!("the operator's Deployment {}/{name} does not exist", p.namespace)))?;
                Some(dep.spec.and_then(|s| s.replicas).unwrap_or(1).max(1))
            }
            None => None,
        };
        let version = client.apiserver_version().await.map(|v| v.git_version).unwrap_or_else(|_| "unknown".into());
        let mut notes = vec![];
        if p.data.is_none() {
            notes.push("app-durability not checked: the app profile has no [data] commands".into());
        }
        // The run's object, for `reap --kube` after a kill -9: which process runs, and the
        // operator's replicas to scale it back to.
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        let mut data = serde_json::json!({"app": p.statefulset, "pid": std::process::id().to_string(), "host": host, "started": crate::record::now_rfc3339()});
        if let (Some(op), Some(r)) = (&p.operator, operator_replicas) {
            data["app-operator"] = op.clone().into();
            data["app-operator-replicas"] = r.to_string().into();
        }
        let kinds = resource_kinds(p);
        if !kinds.is_empty() {
            // The operator's objects this run may create (`backup`, `restore`), for `reap --kube`.
            data["app-resources"] = kinds.iter().map(|(v, k)| format!("{v}/{k}")).collect::<Vec<_>>().join(",").into();
        }
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("shakedown-{}", ctx.run_id), "labels": {RUN_LABEL: ctx.run_id, "app.kubernetes.io/managed-by": "shakedown"}},
            "data": data,
        }))
        .map_err(|e| Fatal::internal(e.to_string()))?;
        // The data workload writes before the first fault: durability is checked on writes made
        // before it and under it, not on nothing.
        let writer = p.data.clone().map(|d| Writer::start(client.clone(), &p.namespace, d, ctx.run_id));
        if let Some(w) = &writer {
            w.first_ack(p.op_timeout.min(FIRST_ACK_BOUND)).await.map_err(Fatal::environment)?;
        }
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &p.namespace);
        bounded("create the run's ConfigMap", cms.create(&PostParams::default(), &cm)).await.map_err(Fatal::environment)?;
        Ok(AppTarget {
            client,
            evict_client,
            server,
            spec: spec.clone(),
            run_id: ctx.run_id.to_string(),
            operator_replicas,
            sts_selector,
            writer,
            notes,
            version,
            events: vec![],
            backups: BTreeMap::new(),
            restores: 0,
            probe_jobs: Default::default(),
            torn_down: false,
        })
    }

    /// The labels of the objects the run creates.
    fn run_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (RUN_LABEL.to_string(), self.run_id.clone()),
            ("app.kubernetes.io/managed-by".to_string(), "shakedown".to_string()),
        ])
    }

    fn ns(&self) -> &str {
        &self.spec.app_profile.namespace
    }

    fn pod_name(&self, m: MemberId) -> String {
        format!("{}-{}", self.spec.app_profile.statefulset, m.0)
    }

    fn policy_name(&self, m: MemberId) -> String {
        format!("shakedown-partition-{m}")
    }

    async fn wait<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T, TargetError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let bound = self.spec.app_profile.op_timeout;
        let deadline = Instant::now() + bound;
        loop {
            if let Some(t) = f().await {
                return Ok(t);
            }
            if Instant::now() > deadline {
                return Err(TargetError::Stack(format!("{what}: not within {}s", bound.as_secs())));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn pod_kill(&mut self, m: MemberId) -> Result<(), TargetError> {
        let name = self.pod_name(m);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let old = bounded("get pod", pods.get_opt(&name))
            .await
            .map_err(env)?
            .ok_or_else(|| TargetError::Stack(format!("pod {name} does not exist")))?;
        let old_uid = old.metadata.uid.clone();
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
    async fn pod_kill_selected(&mut self, pick: u32) -> Result<(), TargetError> {
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
        tracing::info!("{text}");
        self.events.push(crate::events::Event::Target {
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
                if !e.contains("NotFound") && !e.contains("not found") {
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
    async fn pod_failure(&mut self, m: MemberId) -> Result<(), TargetError> {
        let Some(pf) = self.spec.app_profile.pod_failure.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [pod_failure] image".into()));
        };
        let name = self.pod_name(m);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let pod = bounded("get pod", pods.get(&name)).await.map_err(env)?;
        let uid = pod.metadata.uid.clone();
        let own = own_images(&pod);
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
        self.events.push(crate::events::Event::Target {
            kind: "app-pod-failure".into(),
            detail: serde_json::json!({"pod": name, "image": pf.image, "own-images": own, "not-ready-after-ms": not_ready_ms, "failed-for-ms": pf.duration.as_millis() as u64, "ready-again-after-ms": ready_ms, "same-pod": same}),
        });
        Ok(())
    }

    /// The pods of the app's namespace a `pod-failure` of this run left failed.
    async fn failed_pods(&self) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed = bounded("pods", pods.list(&ListParams::default())).await.map(|l| l.items).unwrap_or_default();
        listed.into_iter().filter(|p| failed_by(p) == Some(self.run_id.as_str())).collect()
    }

    async fn operator_restart(&mut self) -> Result<(), TargetError> {
        let (Some(name), Some(replicas)) = (self.spec.app_profile.operator.clone(), self.operator_replicas) else {
            return Err(TargetError::Unsupported("the app profile names no operator".into()));
        };
        let deps: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        let dep = bounded("get operator", deps.get(&name)).await.map_err(env)?;
        let selector = dep
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let before: BTreeSet<String> = bounded("operator pods", pods.list(&ListParams::default().labels(&selector)))
            .await
            .map_err(env)?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.uid)
            .collect();
        let scale = |n: i32| serde_json::json!({"spec": {"replicas": n}});
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

    async fn pvc_loss(&mut self, m: MemberId) -> Result<(), TargetError> {
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

    /// `node-drain(m)`: the node of `m`'s pod cordoned (annotated with the run), every pod on it
    /// but DaemonSets' and static ones evicted through the eviction API — an eviction a
    /// PodDisruptionBudget refuses (429) is tried again every second until the op's bound, then
    /// the op fails naming it — verified drained (those pods gone), then uncordoned (verified).
    async fn node_drain(&mut self, m: MemberId) -> Result<(), TargetError> {
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
        if node.metadata.annotations.as_ref().and_then(|a| a.get(OPT_IN)).map(String::as_str) != Some("true") {
            return Err(TargetError::Environment(format!(
                "node {node_name} (of {pod}) has not opted in to chaos: a drain evicts every pod on it, of every namespace; annotate it with {OPT_IN}=\"true\" (kubectl annotate node {node_name} {OPT_IN}=true) or leave node-drain out of the profile"
            )));
        }
        if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
            return Err(TargetError::Environment(format!(
                "node {node_name} is already cordoned, not by this run: draining it is someone else's maintenance"
            )));
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
            async move { nodes.get(&node_name).await.ok().filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)).map(|_| ()) }
        })
        .await?;
        let (evicted, last) = evicted;
        let last =
            last.map(|(pod, ms)| format!("; the last gone {:.1}s after its eviction: {pod}", ms as f64 / 1000.0)).unwrap_or_default();
        tracing::info!("node-drain({m}): node {node_name} drained ({} pods evicted{last}) and uncordoned", evicted.len());
        Ok(())
    }

    /// Evicts every pod of `node` a drain evicts and waits until they are gone: the pods, or why not.
    /// With the pods, the one that took longest to go after the evictions, and how long (ms).
    async fn evict_all(&mut self, node: &str) -> Result<(Vec<String>, Option<(String, u64)>), TargetError> {
        let all: Api<Pod> = Api::all(self.client.clone());
        let on_node = bounded("pods on the node", all.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))))
            .await
            .map_err(env)?
            .items;
        // What `kubectl drain --ignore-daemonsets` evicts: not a DaemonSet's pod (its controller
        // ignores the cordon), not a static pod (its mirror cannot be evicted), nothing finished.
        let evictable: Vec<(String, String, Option<String>)> = on_node
            .iter()
            .filter(|p| !p.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|o| o.kind == "DaemonSet")))
            .filter(|p| !p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")))
            .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")))
            .map(|p| {
                (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default(), p.metadata.uid.clone())
            })
            .collect();
        let names: Vec<String> = evictable.iter().map(|(ns, n, _)| format!("{ns}/{n}")).collect();
        let deadline = Instant::now() + self.spec.app_profile.op_timeout;
        let mut refused = 0u32;
        let mut result = Ok(());
        'pods: for (ns, name, _) in &evictable {
            let api: Api<Pod> = Api::namespaced(self.evict_client.clone(), ns);
            loop {
                match tokio::time::timeout(REQUEST_BOUND, api.evict(name, &EvictParams::default())).await {
                    Ok(Ok(_)) => break,
                    Ok(Err(kube::Error::Api(r))) if r.code == 404 => break,
                    // A PodDisruptionBudget would be violated: what `kubectl drain` retries.
                    Ok(Err(kube::Error::Api(r))) if r.code == 429 => {
                        refused += 1;
                        if Instant::now() > deadline {
                            result = Err(TargetError::Stack(format!(
                                "the drain of node {node} is blocked: evicting {ns}/{name} was refused for {}s ({}) — a PodDisruptionBudget that the pods already evicted cannot satisfy again while the node is cordoned",
                                self.spec.app_profile.op_timeout.as_secs(),
                                r.message
                            )));
                            break 'pods;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Ok(Err(e)) => {
                        result = Err(env(format!("evicting {ns}/{name}: {e}")));
                        break 'pods;
                    }
                    Err(_) => {
                        result = Err(env(format!("evicting {ns}/{name}: no answer within {}s", REQUEST_BOUND.as_secs())));
                        break 'pods;
                    }
                }
            }
        }
        self.events.push(crate::events::Event::Target {
            kind: "app-drain".into(),
            detail: serde_json::json!({"node": node, "evictable": names, "refused-evictions": refused, "error": result.as_ref().err().map(|e| e.to_string())}),
        });
        result?;
        // Verified: every evicted pod is gone from the node (its replacement, if any, is another
        // pod). When each went is kept: a pod whose kubelet takes long to remove it holds the
        // whole drain, and the event log names it.
        let wanted = evictable.clone();
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
        let last = gone.iter().max_by_key(|(_, ms)| **ms).map(|(p, ms)| (p.clone(), *ms));
        self.events.push(crate::events::Event::Target {
            kind: "app-drained".into(),
            detail: serde_json::json!({"node": node, "gone-after-ms": gone}),
        });
        Ok((names, last))
    }

    /// The API of a custom resource kind (its plural from discovery).
    async fn resource_api(&self, r: &ResourceOp, section: &str) -> Result<Api<DynamicObject>, TargetError> {
        let (api_version, kind) = r.kind(section).map_err(TargetError::Environment)?;
        bounded(&format!("discover {api_version} {kind}"), resource_api_of(&self.client, self.ns(), &format!("{api_version}/{kind}")))
            .await
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
        let t = Instant::now();
        bounded(&format!("create {name}"), api.create(&PostParams::default(), &obj)).await.map_err(env)?;
        // Verified: the operator says it is done; a failure it reports ends the wait at once.
        let what = format!("the operator's {section} {name} done ({} = {:?})", r.done.field, r.done.equals);
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
        self.events.push(crate::events::Event::Target {
            kind: format!("app-{section}"),
            detail: serde_json::json!({"object": name, "kind": body.get("kind"), "ms": t.elapsed().as_millis() as u64, "error": waited.as_ref().err().map(|e| e.to_string())}),
        });
        waited
    }

    /// `backup`: the operator's backup object; the data workload marks what the backup may hold
    /// (writes acknowledged before it was asked for must be in it).
    async fn backup(&mut self, after: &Model) -> Result<(), TargetError> {
        let Some(r) = self.spec.app_profile.backup.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [backup]".into()));
        };
        // The model numbers backups as it takes them: this one is the newest.
        let b =
            *after.backups.iter().next_back().ok_or_else(|| TargetError::Environment("the model holds no backup after backup".into()))?;
        let name = format!("shakedown-{}-{b}", self.run_id.trim_start_matches("sd-"));
        let start = self.writer.as_ref().map(Writer::position);
        self.resource_op(&r, "backup", &name, BTreeMap::new()).await?;
        if let (Some(w), Some(start)) = (&self.writer, start) {
            w.mark_backup(b, start, w.position());
        }
        self.backups.insert(b, name);
        Ok(())
    }

    /// `restore(b)`: the operator's restore object naming backup `b`'s; the data workload then
    /// expects the backup's writes and not those acknowledged after it (`app-durability`).
    async fn restore(&mut self, b: BackupId) -> Result<(), TargetError> {
        let Some(r) = self.spec.app_profile.restore.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [restore]".into()));
        };
        let backup = self.backups.get(&b).cloned().ok_or_else(|| TargetError::Environment(format!("{b} was not taken by this run")))?;
        self.restores += 1;
        let name = format!("shakedown-{}-restore-{}", self.run_id.trim_start_matches("sd-"), self.restores);
        let start = self.writer.as_ref().map(Writer::position);
        self.resource_op(&r, "restore", &name, BTreeMap::from([("backup", backup)])).await?;
        if let (Some(w), Some(start)) = (&self.writer, start) {
            w.mark_restore(b, start, w.position());
        }
        Ok(())
    }

    /// Where the partition probe of `m` runs (another Ready replica) and `m`'s pod IP.
    async fn probe_ends(&self, m: MemberId) -> Result<(String, String), TargetError> {
        let target = self.pod_name(m);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let ip = bounded("get pod", pods.get(&target))
            .await
            .map_err(env)?
            .status
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| TargetError::Stack(format!("pod {target} has no IP")))?;
        let selector = format!("{},statefulset.kubernetes.io/pod-name!={target}", self.sts_selector);
        let Some(from) = ready_pod(&self.client, self.ns(), &selector, Some(&target)).await else {
            return Err(TargetError::Stack(format!("no other Ready replica to probe {target} from")));
        };
        Ok((from.metadata.name.unwrap_or_default(), ip))
    }

    /// The partition probe from another Ready replica to `m`'s pod: `Ok(true)` connected.
    async fn probe_to(&self, m: MemberId) -> Result<bool, TargetError> {
        let (from, ip) = self.probe_ends(m).await?;
        self.probe_between(&from, &ip).await
    }

    /// The partition probe exec'd in pod `from` towards `ip`.
    async fn probe_exec(&self, from: &str, ip: &str) -> Result<super::exec::ExecOutput, TargetError> {
        let Some(probe) = self.spec.app_profile.partition.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [partition] probe".into()));
        };
        let cmd = fill(&probe.command, &BTreeMap::from([("ip", ip.to_string())]));
        let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
        exec(&self.client, self.ns(), from, probe.container.as_deref(), &refs, Duration::from_secs(15)).await.map_err(env)
    }

    /// The partition probe exec'd in pod `from` towards `ip`: `Ok(true)` connected.
    async fn probe_between(&self, from: &str, ip: &str) -> Result<bool, TargetError> {
        Ok(self.probe_exec(from, ip).await?.code == 0)
    }

    /// Before a partition, with no policy of it in place: the probe must connect from `from` to
    /// `to` (at `ip`), or its failing afterwards would show nothing — a probe that never
    /// connects (a wrong port, a command the pod lacks) would pass every cut. Tried for up to
    /// [`PARTITION_SETTLE`]; then an environment error naming the probe's answer.
    async fn probe_baseline(&self, from: &str, to: &str, ip: &str) -> Result<(), TargetError> {
        let deadline = Instant::now() + PARTITION_SETTLE;
        loop {
            let out = self.probe_exec(from, ip).await?;
            if out.code == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let said: String = format!("{} {}", out.stderr.trim(), out.stdout.trim()).trim().chars().take(300).collect();
                return Err(TargetError::Environment(format!(
                    "the [partition] probe does not connect from {from} to {to} ({ip}) before any policy is made (exit {}{}): a probe that never connects cannot show a cut, so the partition would verify nothing; fix the probe (its command, its port, a container that has the command); no policy was created",
                    out.code,
                    if said.is_empty() { String::new() } else { format!(": {said}") }
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn partition(&mut self, m: MemberId) -> Result<(), TargetError> {
        if self.spec.app_profile.partition.is_none() {
            return Err(TargetError::Unsupported("the app profile has no [partition] probe".into()));
        }
        let target = self.pod_name(m);
        let name = self.policy_name(m);
        // A pod on the host's network has the node's address: no network plugin applies a
        // NetworkPolicy to it, so such a partition could only pass silently or fail.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let pod = bounded("get pod", pods.get(&target)).await.map_err(env)?;
        if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            return Err(TargetError::Environment(format!(
                "{target} runs on the host's network (hostNetwork: true): a NetworkPolicy cannot cut it off on any network plugin, so partition cannot be done to this application; no policy was created"
            )));
        }
        let (from, ip) = self.probe_ends(m).await?;
        self.probe_baseline(&from, &target, &ip).await?;
        let policy: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {RUN_LABEL: self.run_id}},
            "spec": {"podSelector": {"matchLabels": {"statefulset.kubernetes.io/pod-name": target}}, "policyTypes": ["Ingress", "Egress"]},
        }))
        .map_err(env)?;
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        bounded("create NetworkPolicy", api.create(&PostParams::default(), &policy)).await.map_err(env)?;
        // Verified: the probe no longer connects (policies may apply after a moment).
        let t0 = Instant::now();
        let deadline = t0 + PARTITION_SETTLE;
        loop {
            match self.probe_to(m).await {
                Ok(false) => {
                    tracing::info!("partition({m}): {target} cut off by NetworkPolicy {name}: the partition probe no longer connects to it ({:.1}s after the policy was created)", t0.elapsed().as_secs_f64());
                    return Ok(());
                }
                Ok(true) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
                Ok(true) => {
                    let _ = bounded("delete NetworkPolicy", api.delete(&name, &DeleteParams::default())).await;
                    return Err(TargetError::Environment(format!(
                        "this cluster does not enforce NetworkPolicy: {}s after NetworkPolicy {name} cut {target} off, the partition probe still connects to it (a CNI without a policy engine, such as the bridge plugin, ignores policies); the policy was removed and the partition counts as not done",
                        PARTITION_SETTLE.as_secs()
                    )));
                }
                Err(e) => {
                    let _ = bounded("delete NetworkPolicy", api.delete(&name, &DeleteParams::default())).await;
                    return Err(e);
                }
            }
        }
    }

    async fn partition_heal(&mut self, m: MemberId) -> Result<(), TargetError> {
        let name = self.policy_name(m);
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        match bounded("delete NetworkPolicy", api.delete(&name, &DeleteParams::default())).await {
            Ok(_) => {}
            Err(e) if e.contains("NotFound") || e.contains("not found") => {}
            Err(e) => return Err(env(e)),
        }
        // Verified: traffic flows again.
        let deadline = Instant::now() + self.spec.app_profile.op_timeout;
        loop {
            if self.probe_to(m).await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(TargetError::Stack(format!(
                    "the partition probe does not connect to {} after its NetworkPolicy was removed",
                    self.pod_name(m)
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Cut `pick` of `[[partition.groups]]` (modulo their number) and each side's labels.
    fn group_cut(&self, pick: u32) -> Result<(GroupCut, Labels, Labels), TargetError> {
        let cuts = self.spec.app_profile.partition.as_ref().map(|p| p.groups.as_slice()).unwrap_or_default();
        if cuts.is_empty() {
            return Err(TargetError::Unsupported("the app profile has no [[partition.groups]]".into()));
        }
        let cut = cuts[pick as usize % cuts.len()].clone();
        let (a, b) = (GroupCut::labels(&cut.a).map_err(env)?, GroupCut::labels(&cut.b).map_err(env)?);
        Ok((cut, a, b))
    }

    /// The first Ready pod of `selector`: its name and IP.
    async fn group_end(&self, selector: &str) -> Result<(String, String), TargetError> {
        let pod = ready_pod(&self.client, self.ns(), selector, None)
            .await
            .ok_or_else(|| TargetError::Stack(format!("no Ready pod matches {selector}")))?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ip = pod.status.and_then(|s| s.pod_ip).ok_or_else(|| TargetError::Stack(format!("pod {name} has no IP")))?;
        Ok((name, ip))
    }

    /// Whether the probe connects from group `a` to group `b` and from `b` to `a` (a Ready pod
    /// of each: the first by name; both ways at once, a cut way costing the probe's own timeout).
    async fn probe_groups(&self, cut: &GroupCut) -> Result<(bool, bool), TargetError> {
        let (a, b) = (self.group_end(&cut.a).await?, self.group_end(&cut.b).await?);
        let (ab, ba) = tokio::join!(self.probe_between(&a.0, &b.1), self.probe_between(&b.0, &a.1));
        Ok((ab?, ba?))
    }

    async fn delete_group_policies(&self, pick: u32) -> Result<(), TargetError> {
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        for side in ['a', 'b'] {
            match bounded("delete NetworkPolicy", api.delete(&group_policy_name(pick, side), &DeleteParams::default())).await {
                Ok(_) => {}
                Err(e) if e.contains("NotFound") || e.contains("not found") => {}
                Err(e) => return Err(env(e)),
            }
        }
        Ok(())
    }

    /// `partition-groups(pick)`: the pods of the cut's two groups no longer reach each other,
    /// other traffic flows on. A NetworkPolicy on each side admits every peer but the other
    /// side; verified with the `[partition]` probe both ways between the groups (cut) and from
    /// a StatefulSet replica outside both to each (still flowing), when there is one.
    async fn partition_groups(&mut self, pick: u32) -> Result<(), TargetError> {
        let (cut, a, b) = self.group_cut(pick)?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed = bounded("pods", pods.list(&ListParams::default())).await.map_err(env)?.items;
        let live: Vec<&Pod> = listed.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        let (in_a, in_b): (Vec<&Pod>, Vec<&Pod>) =
            (live.iter().copied().filter(|p| has_labels(p, &a)).collect(), live.iter().copied().filter(|p| has_labels(p, &b)).collect());
        for (side, members) in [(&cut.a, &in_a), (&cut.b, &in_b)] {
            if members.is_empty() {
                return Err(TargetError::Stack(format!("no pod of {} matches {side}", self.ns())));
            }
        }
        if let Some(p) = in_a.iter().find(|p| has_labels(p, &b)) {
            return Err(TargetError::Environment(format!(
                "pod {} is in both groups ({} and {}): a pod cannot be cut off from itself; no policy was created",
                name(p),
                cut.a,
                cut.b
            )));
        }
        if let Some(p) = in_a.iter().chain(&in_b).find(|p| p.spec.as_ref().and_then(|s| s.host_network) == Some(true)) {
            return Err(TargetError::Environment(format!(
                "{} runs on the host's network (hostNetwork: true): a NetworkPolicy cannot cut it off on any network plugin, so partition-groups cannot be done to these groups; no policy was created",
                name(p)
            )));
        }
        // Pods of other namespaces are admitted by the namespace's name label, which the
        // apiserver sets from Kubernetes 1.21; without it they are cut off from both groups too.
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let named = bounded("namespace", nss.get(self.ns()))
            .await
            .map_err(env)?
            .metadata
            .labels
            .is_some_and(|l| l.contains_key(NAMESPACE_NAME_LABEL));
        let other_namespaces = named.then(|| self.ns().to_string());
        let (a_end, b_end) = (self.group_end(&cut.a).await?, self.group_end(&cut.b).await?);
        self.probe_baseline(&a_end.0, &b_end.0, &b_end.1).await?;
        self.probe_baseline(&b_end.0, &a_end.0, &a_end.1).await?;
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        for (side, own, other) in [('a', &a, &b), ('b', &b, &a)] {
            let policy: NetworkPolicy =
                serde_json::from_value(group_policy(&group_policy_name(pick, side), &self.run_id, own, other, other_namespaces.as_deref()))
                    .map_err(env)?;
            if let Err(e) = bounded("create NetworkPolicy", api.create(&PostParams::default(), &policy)).await {
                let _ = self.delete_group_policies(pick).await;
                return Err(env(e));
            }
        }
        let me: &AppTarget = self;
        let undo = |e: TargetError| async move {
            let _ = me.delete_group_policies(pick).await;
            e
        };
        // Verified: cut both ways (policies may apply after a moment).
        let t0 = Instant::now();
        let cut_after = loop {
            match self.probe_groups(&cut).await {
                Ok((false, false)) => break t0.elapsed(),
                Ok((ab, ba)) if Instant::now() >= t0 + PARTITION_SETTLE => {
                    let ways = [(ab, format!("from {} to {}", cut.a, cut.b)), (ba, format!("from {} to {}", cut.b, cut.a))]
                        .into_iter()
                        .filter(|(c, _)| *c)
                        .map(|(_, w)| w)
                        .collect::<Vec<_>>()
                        .join(" and ");
                    return Err(undo(TargetError::Environment(format!(
                        "this cluster does not enforce NetworkPolicy: {}s after the policies of partition-groups(pick {pick}) were created, the partition probe still connects {ways} (a CNI without a policy engine, such as the bridge plugin, ignores policies); the policies were removed and the partition counts as not done",
                        PARTITION_SETTLE.as_secs()
                    )))
                    .await);
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                Err(e) => return Err(undo(e).await),
            }
        };
        // Verified: other traffic flows on — a replica in neither group still reaches both.
        let outside = live
            .iter()
            .filter(|p| is_ready(p) && has_labels(p, &self.sts_labels()) && !has_labels(p, &a) && !has_labels(p, &b))
            .map(|p| name(p))
            .min();
        if let Some(c) = &outside {
            let ends = match (self.group_end(&cut.a).await, self.group_end(&cut.b).await) {
                (Ok(x), Ok(y)) => [x, y],
                (Err(e), _) | (_, Err(e)) => return Err(undo(e).await),
            };
            for (end, ip) in &ends {
                let deadline = Instant::now() + PARTITION_SETTLE;
                loop {
                    match self.probe_between(c, ip).await {
                        Ok(true) => break,
                        Ok(false) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
                        Ok(false) => {
                            return Err(undo(TargetError::Environment(format!(
                                "partition-groups(pick {pick}) cut more than the two groups: {c}, in neither, no longer reaches {end} (the policies admit it; the network plugin does not); the policies were removed"
                            )))
                            .await)
                        }
                        Err(e) => return Err(undo(e).await),
                    }
                }
            }
        }
        let (a_pods, b_pods): (Vec<String>, Vec<String>) = (in_a.iter().map(|p| name(p)).collect(), in_b.iter().map(|p| name(p)).collect());
        tracing::info!(
            "partition-groups(pick {pick}): {} ({}) cut from {} ({}) {:.1}s after the policies were created; {}{}",
            cut.a,
            a_pods.join(", "),
            cut.b,
            b_pods.join(", "),
            cut_after.as_secs_f64(),
            outside.as_ref().map_or("no replica outside both groups to show other traffic flowing".to_string(), |c| format!(
                "{c}, in neither, still reaches both"
            )),
            if named {
                ""
            } else {
                "; pods of other namespaces are cut off from both groups too (namespaces here carry no kubernetes.io/metadata.name label: Kubernetes before 1.21)"
            }
        );
        self.events.push(crate::events::Event::Target {
            kind: "app-partition-groups".into(),
            detail: serde_json::json!({"pick": pick, "a": cut.a, "b": cut.b, "a-pods": a_pods, "b-pods": b_pods, "cut-after-ms": cut_after.as_millis() as u64, "outside": outside, "other-namespaces-admitted": named}),
        });
        Ok(())
    }

    /// `partition-groups-heal(pick)`: the cut's policies removed; verified: the probe connects
    /// both ways again.
    async fn partition_groups_heal(&mut self, pick: u32) -> Result<(), TargetError> {
        let (cut, _, _) = self.group_cut(pick)?;
        self.delete_group_policies(pick).await?;
        let deadline = Instant::now() + self.spec.app_profile.op_timeout;
        loop {
            if self.probe_groups(&cut).await? == (true, true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(TargetError::Stack(format!(
                    "the partition probe does not connect both ways between {} and {} after their NetworkPolicies were removed",
                    cut.a, cut.b
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The StatefulSet's selector as labels.
    fn sts_labels(&self) -> Labels {
        self.sts_selector.split(',').filter_map(|t| t.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// How many of the StatefulSet's live pods are in the groups of the group partition in
    /// place (`app-ready` excuses them).
    async fn in_cut_groups(&self, model: &Model) -> i32 {
        let Some(Ok((_, a, b))) = model.groups_partitioned.map(|pick| self.group_cut(pick)) else { return 0 };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed =
            bounded("pods", pods.list(&ListParams::default().labels(&self.sts_selector))).await.map(|l| l.items).unwrap_or_default();
        listed.iter().filter(|p| has_labels(p, &a) || has_labels(p, &b)).count() as i32
    }

    async fn inventory(&self) -> AppInventory {
        let mut inv = AppInventory::default();
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        if let Ok(list) = bounded("NetworkPolicies", api.list(&ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id)))).await
        {
            for p in list.items {
                let name = p.metadata.name.unwrap_or_default();
                if let Some(i) = name.strip_prefix("shakedown-partition-m").and_then(|n| n.parse::<u32>().ok()) {
                    inv.partitioned.insert(MemberId(i));
                } else if let Some(pick) = group_policy_pick(&name) {
                    inv.groups_partitioned = Some(pick);
                } else {
                    inv.stray_policies.push(name);
                }
            }
        }
        inv.cordoned = self.cordoned_nodes().await;
        inv.failed_pods = self.failed_pods().await.into_iter().filter_map(|p| p.metadata.name).collect();
        if let (Some(name), Some(replicas)) = (&self.spec.app_profile.operator, self.operator_replicas) {
            let deps: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
            if let Ok(d) = bounded("operator", deps.get(name)).await {
                let now = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                if now < replicas {
                    inv.operator_scaled_down = Some(format!("the operator {name} is scaled to {now}, not its {replicas}"));
                }
            }
        }
        inv
    }

    /// The nodes this run cordoned that are still cordoned.
    async fn cordoned_nodes(&self) -> Vec<String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let list = bounded("nodes", nodes.list(&ListParams::default())).await.map(|l| l.items).unwrap_or_default();
        list.into_iter()
            .filter(|n| cordoned_by(n) == Some(self.run_id.as_str()) && n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
            .filter_map(|n| n.metadata.name)
            .collect()
    }

    async fn workloads(&self) -> Vec<AppWorkload> {
        let p = &self.spec.app_profile;
        let mut out = vec![];
        let sts: Api<StatefulSet> = Api::namespaced(self.client.clone(), self.ns());
        match bounded("statefulset", sts.get(&p.statefulset)).await {
            Ok(s) => out.push(AppWorkload {
                name: format!("statefulset/{}", p.statefulset),
                desired: s.spec.and_then(|s| s.replicas).unwrap_or(1),
                ready: s.status.and_then(|s| s.ready_replicas).unwrap_or(0),
            }),
            Err(_) => out.push(AppWorkload { name: format!("statefulset/{} (unreadable)", p.statefulset), desired: 1, ready: 0 }),
        }
        if let Some(name) = &p.operator {
            let deps: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
            match bounded("operator", deps.get(name)).await {
                Ok(d) => out.push(AppWorkload {
                    name: format!("deployment/{name}"),
                    desired: d.spec.and_then(|s| s.replicas).unwrap_or(1),
                    ready: d.status.and_then(|s| s.available_replicas).unwrap_or(0),
                }),
                Err(_) => out.push(AppWorkload { name: format!("deployment/{name} (unreadable)"), desired: 1, ready: 0 }),
            }
        }
        out
    }

    async fn probes(&self) -> Vec<(String, Option<String>)> {
        let mut out = vec![];
        for p in &self.spec.app_profile.probes {
            let result = match p.check() {
                Ok(ProbeCheck::Exec { selector, container, command }) => self.exec_probe(selector, container, command).await,
                Ok(ProbeCheck::Http(h)) => self.http_probe(h).await,
                Ok(ProbeCheck::Object(o)) => self.object_probe(o).await,
                Ok(ProbeCheck::Job(spec)) => self.job_probe(spec).await,
                Err(e) => Some(e),
            };
            out.push((p.name.clone(), result));
        }
        out
    }

    /// `command` in the first Ready pod of `selector`: why it failed, if it did.
    async fn exec_probe(&self, selector: &str, container: Option<&str>, command: &[String]) -> Option<String> {
        let Some(pod) = ready_pod(&self.client, self.ns(), selector, None).await else {
            return Some(format!("no Ready pod of {selector}"));
        };
        let pod = pod.metadata.name.unwrap_or_default();
        let refs: Vec<&str> = command.iter().map(String::as_str).collect();
        match exec(&self.client, self.ns(), &pod, container, &refs, PROBE_BOUND).await {
            Ok(o) if o.code == 0 => None,
            Ok(o) => Some(format!("in {pod}: exit {}: {}", o.code, o.stderr.trim())),
            Err(e) => Some(e),
        }
    }

    /// A GET through the apiserver's service proxy: why it failed, if it did.
    async fn http_probe(&self, h: &HttpProbe) -> Option<String> {
        let path = format!("/api/v1/namespaces/{}/services/{}:{}/proxy/{}", self.ns(), h.service, h.port, h.path.trim_start_matches('/'));
        let request = match http::Request::get(&path).body(Vec::new()) {
            Ok(r) => r,
            Err(e) => return Some(format!("GET {path}: {e}")),
        };
        match tokio::time::timeout(PROBE_BOUND, self.client.request_text(request)).await {
            Err(_) => Some(format!("GET {path}: no answer within {}s", PROBE_BOUND.as_secs())),
            Ok(Err(e)) => Some(format!("GET {path}: {e}")),
            Ok(Ok(body)) => match &h.contains {
                Some(want) if !body.contains(want.as_str()) => {
                    Some(format!("GET {path}: the answer does not contain {want:?}: {}", body.chars().take(200).collect::<String>()))
                }
                _ => None,
            },
        }
    }

    /// A checker Job: created from the probe's spec, waited for, deleted (with its pods). Why it
    /// did not complete, if it did not: its pod's last log lines.
    async fn job_probe(&self, spec: &serde_json::Value) -> Option<String> {
        let n = self.probe_jobs.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let name = format!("shakedown-{}-check-{n}", self.run_id.trim_start_matches("sd-"));
        let template = serde_json::json!({"apiVersion": "batch/v1", "kind": "Job", "spec": spec});
        let mut body = spec::instantiate(
            &template,
            &name,
            &self.run_labels(),
            &BTreeMap::from([("namespace", self.ns().to_string()), ("statefulset", self.spec.app_profile.statefulset.clone())]),
        );
        // A checker runs once: the checks are retried until the step converges.
        if body["spec"].get("backoffLimit").is_none() {
            body["spec"]["backoffLimit"] = 0.into();
        }
        let job: Job = match serde_json::from_value(body) {
            Ok(j) => j,
            Err(e) => return Some(format!("the job's spec: {e}")),
        };
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), self.ns());
        if let Err(e) = bounded(&format!("create Job {name}"), jobs.create(&PostParams::default(), &job)).await {
            return Some(e);
        }
        let deadline = Instant::now() + PROBE_JOB_BOUND;
        let result = loop {
            let status = jobs.get_opt(&name).await.ok().flatten().and_then(|j| j.status).unwrap_or_default();
            let failed = status.conditions.as_ref().is_some_and(|c| c.iter().any(|c| c.type_ == "Failed" && c.status == "True"));
            if status.succeeded.unwrap_or(0) > 0 {
                break None;
            }
            if failed || Instant::now() > deadline {
                let how = if failed { "failed".to_string() } else { format!("not complete within {}s", PROBE_JOB_BOUND.as_secs()) };
                break Some(format!("Job {name} {how}: {}", self.job_logs(&name).await));
            }
            tokio::time::sleep(POLL).await;
        };
        let _ = bounded(&format!("delete Job {name}"), jobs.delete(&name, &DeleteParams::background())).await;
        result
    }

    /// The last log lines of a Job's newest pod.
    async fn job_logs(&self, job: &str) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed = bounded("the job's pods", pods.list(&ListParams::default().labels(&format!("job-name={job}"))))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let Some(pod) = listed.into_iter().max_by_key(|p| p.metadata.creation_timestamp.clone()).and_then(|p| p.metadata.name) else {
            return "no pod".into();
        };
        let params = kube::api::LogParams { tail_lines: Some(5), ..Default::default() };
        match bounded("logs", pods.logs(&pod, &params)).await {
            Ok(l) if !l.trim().is_empty() => format!("{pod}: {}", l.trim().replace('\n', " | ")),
            Ok(_) => format!("{pod}: no output"),
            Err(e) => format!("{pod}: {e}"),
        }
    }

    /// An object's field: why it is not `equals`, if it is not.
    async fn object_probe(&self, o: &ObjectProbe) -> Option<String> {
        let what = format!("{} {}/{}", o.kind, self.ns(), o.name);
        let api = match resource_api_of(&self.client, self.ns(), &format!("{}/{}", o.api_version, o.kind)).await {
            Ok(api) => api,
            Err(e) => return Some(e),
        };
        match bounded(&what, api.get_opt(&o.name)).await {
            Err(e) => Some(e),
            Ok(None) => Some(format!("{what} does not exist")),
            Ok(Some(obj)) => {
                let value = serde_json::to_value(&obj).unwrap_or_default();
                let m = spec::FieldMatch { field: o.field.clone(), equals: o.equals.clone() };
                (!m.matches(&value)).then(|| {
                    format!(
                        "{what}: {} = {} (wanted {:?})",
                        o.field,
                        m.value(&value).map_or("absent".into(), |v| format!("{v:?}")),
                        o.equals
                    )
                })
            }
        }
    }
}

#[async_trait::async_trait]
impl Target for AppTarget {
    fn name(&self) -> &'static str {
        "app"
    }

    fn component_versions(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("kubernetes".to_string(), self.version.clone())])
    }

    fn started(&self) -> Started {
        let p = &self.spec.app_profile;
        Started {
            line: format!(
                "app {}/{} on {} (Kubernetes {}){}",
                p.namespace,
                p.statefulset,
                self.server,
                self.version,
                p.operator.as_ref().map(|o| format!(" · operator {o}")).unwrap_or_default()
            ),
            fields: serde_json::json!({"namespace": p.namespace, "statefulset": p.statefulset, "server": self.server}),
            notes: self.notes.clone(),
        }
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    fn coverage(&self, id: InvariantId) -> Coverage {
        match id {
            InvariantId::Leaks | InvariantId::AppReady => Coverage::Checked,
            InvariantId::AppDurability if self.spec.app_profile.data.is_some() => Coverage::Checked,
            InvariantId::AppDurability => Coverage::Unchecked("needs [data] write and read commands in the app profile".into()),
            InvariantId::Membership
            | InvariantId::Members
            | InvariantId::Quorum
            | InvariantId::Consistency
            | InvariantId::Reachability
            | InvariantId::Durability
            | InvariantId::Watch
            | InvariantId::Leases
            | InvariantId::ApiReachability
            | InvariantId::ApiDurability
            | InvariantId::ApiWatch => Coverage::Unchecked(
                "the app target checks the application (app-ready, app-durability, leaks), not an etcd or API stack".into(),
            ),
        }
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    fn supports(&self, op: &Op) -> Result<(), String> {
        let p = &self.spec.app_profile;
        match op.kind() {
            OpKind::PodKill => Ok(()),
            OpKind::PodKillSelected if p.pod_kill_selected.is_some() => Ok(()),
            OpKind::PodKillSelected => Err("the app profile has no [pod_kill_selected] (a label selector and a count or percent)".into()),
            OpKind::OperatorRestart if p.operator.is_some() => Ok(()),
            OpKind::OperatorRestart => Err("the app profile names no operator Deployment".into()),
            OpKind::PvcLoss if p.claim.is_some() => Ok(()),
            OpKind::PvcLoss => Err("the app profile names no claim (volumeClaimTemplate)".into()),
            OpKind::Partition | OpKind::PartitionHeal if p.partition.is_some() => Ok(()),
            OpKind::Partition | OpKind::PartitionHeal => Err("the app profile has no [partition] probe".into()),
            OpKind::PartitionGroups | OpKind::PartitionGroupsHeal if p.partition.as_ref().is_some_and(|p| !p.groups.is_empty()) => Ok(()),
            OpKind::PartitionGroups | OpKind::PartitionGroupsHeal => Err("the app profile has no [[partition.groups]] (two label groups to cut apart, and the [partition] probe)".into()),
            OpKind::NodeDrain => Ok(()),
            OpKind::PodFailure if p.pod_failure.is_some() => Ok(()),
            OpKind::PodFailure => Err("the app profile has no [pod_failure] image (one the nodes have that does not run the application: the cluster's pause image, say)".into()),
            OpKind::Backup if p.backup.is_some() => Ok(()),
            OpKind::Backup => Err("the app profile has no [backup] (the operator's backup custom resource)".into()),
            OpKind::Restore if p.restore.is_some() => Ok(()),
            OpKind::Restore => Err("the app profile has no [restore] (the operator's restore custom resource)".into()),
            k @ (OpKind::Crash
            | OpKind::Restart
            | OpKind::Pause
            | OpKind::Resume
            | OpKind::RollingUpgrade
            | OpKind::RollingReplace
            | OpKind::SiteOutage
            | OpKind::SiteRecover
            | OpKind::DiskDetach
            | OpKind::DiskReattach
            | OpKind::DiskReplace) => Err(format!("{k} is not an application op")),
        }
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    async fn execute(&mut self, op: &Op, _before: &Model, after: &Model) -> Result<(), TargetError> {
        match *op {
            Op::PodKill { member } => self.pod_kill(member).await,
            Op::PodKillSelected { pick } => self.pod_kill_selected(pick).await,
            Op::OperatorRestart => self.operator_restart().await,
            Op::PvcLoss { member } => self.pvc_loss(member).await,
            Op::Partition { member } => self.partition(member).await,
            Op::PartitionHeal { member } => self.partition_heal(member).await,
            Op::NodeDrain { member } => self.node_drain(member).await,
            Op::PodFailure { member } => self.pod_failure(member).await,
            Op::PartitionGroups { pick } => self.partition_groups(pick).await,
            Op::PartitionGroupsHeal { pick } => self.partition_groups_heal(pick).await,
            Op::Backup => self.backup(after).await,
            Op::Restore { backup } => self.restore(backup).await,
            Op::Crash { .. }
            | Op::Restart { .. }
            | Op::Pause { .. }
            | Op::Resume { .. }
            | Op::RollingUpgrade { .. }
            | Op::RollingReplace
            | Op::SiteOutage { .. }
            | Op::SiteRecover { .. }
            | Op::DiskDetach { .. }
            | Op::DiskReattach { .. }
            | Op::DiskReplace { .. } => Err(TargetError::Unsupported(format!("{op} is not an application op"))),
        }
    }

    fn take_events(&mut self) -> Vec<crate::events::Event> {
        std::mem::take(&mut self.events)
    }

    async fn end_step(&mut self) {}

    async fn observe(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation {
        let mut app = AppObservation {
            workloads: self.workloads().await,
            probes: self.probes().await,
            in_cut_groups: self.in_cut_groups(model).await,
            data: None,
        };
        if invariants.contains(&InvariantId::AppDurability) {
            if let Some(w) = &self.writer {
                app.data = Some(w.read().await);
            }
        }
        let inventory = if invariants.contains(&InvariantId::Leaks) { Some(Inventory::App(self.inventory().await)) } else { None };
        // A replica serves when its pod is Ready (what the engine asks of healed members).
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed =
            bounded("pods", pods.list(&ListParams::default().labels(&self.sts_selector))).await.map(|l| l.items).unwrap_or_default();
        let members = model
            .members
            .keys()
            .map(|&m| {
                let name = self.pod_name(m);
                let pod = listed.iter().find(|p| p.metadata.name.as_deref() == Some(name.as_str()));
                MemberStatus {
                    reachable: pod.is_some_and(is_ready),
                    error: if pod.is_some() { None } else { Some(format!("no pod {name}")) },
                    ..MemberStatus::without_status(m.to_string(), Some(m))
                }
            })
            .collect();
        Observation { members, app: Some(app), inventory, quorum_throughout: true, ..Default::default() }
    }

    fn log_files(&self) -> Vec<(String, PathBuf)> {
        vec![]
    }

    fn workload_stats(&self) -> serde_json::Value {
        self.writer.as_ref().map(|w| w.stats()).unwrap_or(serde_json::Value::Null)
    }

    fn interrupted(&self) -> &'static str {
        "interrupted: the run's NetworkPolicies, backups and restores were removed, its cordons lifted, its failed pods given their own images back and the operator scaled back"
    }

    async fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        if let Some(w) = &self.writer {
            w.stop();
        }
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        let _ = bounded(
            "delete the run's NetworkPolicies",
            api.delete_collection(&DeleteParams::default(), &ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id))),
        )
        .await;
        // A checker Job a stop interrupted (with its pods).
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), self.ns());
        let _ = bounded(
            "delete the run's checker Jobs",
            jobs.delete_collection(&DeleteParams::background(), &ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id))),
        )
        .await;
        if let (Some(name), Some(replicas)) = (self.spec.app_profile.operator.clone(), self.operator_replicas) {
            let deps: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
            if let Ok(d) = bounded("operator", deps.get(&name)).await {
                if d.spec.and_then(|s| s.replicas).unwrap_or(1) < replicas {
                    let _ = bounded(
                        "scale the operator back",
                        deps.patch(&name, &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}}))),
                    )
                    .await;
                }
            }
        }
        let _ = bounded("give failed pods their images back", restore_failed_pods(&self.client, self.ns(), &self.run_id)).await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        for n in self.cordoned_nodes().await {
            let _ = bounded("uncordon", nodes.patch(&n, &PatchParams::default(), &Patch::Merge(cordon_patch(None)))).await;
        }
        for (r, section) in [(self.spec.app_profile.backup.clone(), "backup"), (self.spec.app_profile.restore.clone(), "restore")] {
            if let Some(r) = r.filter(|_| !self.backups.is_empty()) {
                if let Ok(api) = self.resource_api(&r, section).await {
                    let _ = bounded(
                        "delete the run's objects",
                        api.delete_collection(
                            &DeleteParams::default(),
                            &ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id)),
                        ),
                    )
                    .await;
                }
            }
        }
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.ns());
        let _ = bounded("delete the run's ConfigMap", cms.delete(&format!("shakedown-{}", self.run_id), &DeleteParams::default())).await;
    }
}

/// The merge patch that cordons a node for run `run` (annotated with it), or with `None`
/// uncordons it (and drops the annotation).
pub fn cordon_patch(run: Option<&str>) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {CORDONED_BY: run}}, "spec": {"unschedulable": run.map(|_| true)}})
}

/// A pod's containers' images (name → image).
pub fn own_images(p: &Pod) -> BTreeMap<String, String> {
    p.spec.iter().flat_map(|s| s.containers.iter()).map(|c| (c.name.clone(), c.image.clone().unwrap_or_default())).collect()
}

/// The run whose `pod-failure` left pod `p` failed, if one did.
pub fn failed_by(p: &Pod) -> Option<&str> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(FAILED_BY)).map(String::as_str)
}

/// The own images a failed pod's annotation recorded.
fn recorded_images(p: &Pod) -> BTreeMap<String, String> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(OWN_IMAGES)).and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default()
}

/// Gives every pod of `ns` that a `pod-failure` of run `run` left failed its own images back
/// (teardown, `reap --kube`); returns their names.
pub async fn restore_failed_pods(client: &Client, ns: &str, run: &str) -> Result<Vec<String>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut done = vec![];
    for p in pods.list(&ListParams::default()).await.map_err(|e| format!("listing pods in {ns}: {e}"))?.items {
        if failed_by(&p) == Some(run) {
            let name = p.metadata.name.clone().unwrap_or_default();
            let patch = failure_patch(None, &recorded_images(&p), None);
            pods.patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .map_err(|e| format!("giving pod {ns}/{name} its images back: {e}"))?;
            done.push(name);
        }
    }
    Ok(done)
}

/// The strategic merge patch that fails a pod for run `run` — every container on `image`, its
/// own images recorded — or, with `None`s, puts `own` back and drops the annotations.
pub fn failure_patch(run: Option<&str>, own: &BTreeMap<String, String>, image: Option<&str>) -> serde_json::Value {
    let containers: Vec<serde_json::Value> = own.iter().map(|(c, i)| serde_json::json!({"name": c, "image": image.unwrap_or(i)})).collect();
    let recorded = run.map(|_| serde_json::to_string(own).unwrap_or_default());
    serde_json::json!({"metadata": {"annotations": {FAILED_BY: run, OWN_IMAGES: recorded}}, "spec": {"containers": containers}})
}

/// The run that cordoned node `n` for a drain, if one did.
pub fn cordoned_by(n: &Node) -> Option<&str> {
    n.metadata.annotations.as_ref().and_then(|a| a.get(CORDONED_BY)).map(String::as_str)
}

/// The (apiVersion, kind) of the app profile's `[backup]` and `[restore]` objects.
pub fn resource_kinds(p: &spec::AppProfile) -> BTreeSet<(String, String)> {
    [("backup", &p.backup), ("restore", &p.restore)].into_iter().filter_map(|(s, r)| r.as_ref().and_then(|r| r.kind(s).ok())).collect()
}

/// The API of `apiVersion/kind` (`group/version/Kind`, as `reap` reads it from a run's
/// ConfigMap) by discovery.
pub async fn resource_api_of(client: &Client, ns: &str, gvk: &str) -> Result<Api<DynamicObject>, String> {
    let mut parts = gvk.rsplitn(2, '/');
    let (kind, api_version) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    // `v1/Pod`: the core group.
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    if version.is_empty() || kind.is_empty() {
        return Err(format!("{gvk}: not group/version/Kind"));
    }
    let (ar, _): (ApiResource, _) =
        kube::discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind)).await.map_err(|e| format!("{gvk}: {e}"))?;
    Ok(Api::namespaced_with(client.clone(), ns, &ar))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::netpol::{compute, Peer, PodInfo};

    fn pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            ns: ns.into(),
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ip: ip.parse().unwrap(),
            ports: BTreeMap::new(),
        }
    }

    fn labels(l: &[(&str, &str)]) -> Labels {
        l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The two policies of a group partition, read by the node's policy engine: each side is
    /// isolated for ingress and admits every pod but the other side's — its own, a replica in
    /// neither group, a pod of another namespace (when namespaces carry their name label) — and
    /// no side is isolated for egress.
    #[test]
    fn a_group_partition_admits_everyone_but_the_other_side() {
        let pods = [
            pod("kv", "kv-0", "10.0.0.10", &[("app", "kv"), ("role", "primary")]),
            pod("kv", "kv-1", "10.0.0.11", &[("app", "kv"), ("role", "standby")]),
            pod("kv", "kv-2", "10.0.0.12", &[("app", "kv"), ("role", "standby")]),
            pod("kv", "kv-3", "10.0.0.13", &[("app", "kv")]),
            pod("kv", "client", "10.0.0.14", &[("role", "client")]),
            pod("other", "tool", "10.0.0.20", &[("app", "kv"), ("role", "standby")]),
        ];
        let (a, b) = (labels(&[("app", "kv"), ("role", "primary")]), labels(&[("app", "kv"), ("role", "standby")]));
        let policies = |ns_label: bool| -> Vec<NetworkPolicy> {
            [('a', &a, &b), ('b', &b, &a)]
                .into_iter()
                .map(|(side, own, other)| {
                    let mut v = group_policy(&group_policy_name(4, side), "sd-1", own, other, ns_label.then_some("kv"));
                    v["metadata"]["namespace"] = "kv".into();
                    serde_json::from_value(v).unwrap()
                })
                .collect()
        };
        let nss = |named: bool| -> BTreeMap<String, Labels> {
            ["kv", "other"]
                .iter()
                .map(|n| (n.to_string(), if named { labels(&[(NAMESPACE_NAME_LABEL, n)]) } else { Labels::new() }))
                .collect()
        };
        let admitted = |rs: &crate::node::netpol::Ruleset, pod: &str| -> Vec<String> {
            let iso = rs.ingress.iter().find(|i| i.pod == pod).unwrap_or_else(|| panic!("{pod} isolated for ingress"));
            let mut ips: Vec<String> = iso
                .allows
                .iter()
                .flat_map(|a| match &a.peer {
                    Peer::Ips(ips) => ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                    other => panic!("only pods are admitted: {other:?}"),
                })
                .collect();
            ips.sort();
            ips.dedup();
            ips
        };
        let rs = compute(&pods, &nss(true), &policies(true));
        assert!(rs.egress.is_empty(), "egress is left alone");
        assert_eq!(rs.ingress.iter().map(|i| i.pod.as_str()).collect::<Vec<_>>(), ["kv/kv-0", "kv/kv-1", "kv/kv-2"]);
        assert_eq!(
            admitted(&rs, "kv/kv-0"),
            ["10.0.0.10", "10.0.0.13", "10.0.0.14", "10.0.0.20"],
            "the primary: everyone but the standbys of its namespace"
        );
        assert_eq!(
            admitted(&rs, "kv/kv-1"),
            ["10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14", "10.0.0.20"],
            "a standby: everyone but the primary"
        );
        // Without the namespace name label (Kubernetes < 1.21): other namespaces' pods are not admitted.
        let rs = compute(&pods, &nss(false), &policies(false));
        assert_eq!(admitted(&rs, "kv/kv-0"), ["10.0.0.10", "10.0.0.13", "10.0.0.14"]);
    }

    #[test]
    fn group_policies_are_known_by_their_names() {
        assert_eq!(group_policy_pick(&group_policy_name(7, 'a')), Some(7));
        assert_eq!(group_policy_pick(&group_policy_name(0, 'b')), Some(0));
        assert_eq!(group_policy_pick("shakedown-partition-groups-p1-c"), None);
        assert_eq!(group_policy_pick("shakedown-partition-m1"), None);
    }
}
