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
//!
//! Files by concern: `connect` (start, the run's ConfigMap), `pods`, `drain`, `partition` (and
//! its probe), `resources` (the operator and its custom resources), `probes` (of `app-ready`),
//! `observe`, `cleanup` (teardown); `data` (the data workload), `spec` (the app profile).

mod cleanup;
mod connect;
pub mod data;
mod drain;
mod failover;
mod observe;
mod partition;
mod pods;
mod probes;
mod resources;
pub mod spec;
mod taint;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;
use shakedown_faults::{BackupId, MemberId, Model, Op};
use shakedown_invariants::{InvariantId, Observation};

use super::{Coverage, StartContext, Started, Target, TargetError};
use crate::exit::Fatal;
use crate::k8s::{OPT_IN, RUN_LABEL};
use data::Writer;
use spec::AppSpec;

pub use cleanup::{clean_up, Cleaned};
pub use connect::RunRecord;
pub use drain::{cordon_patch, cordoned_by};
pub use pods::{failed_by, failure_patch, own_images};
pub use resources::{resource_api_of, resource_kinds};

type Labels = BTreeMap<String, String>;

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
/// The key of the `NoExecute` taint a `taint` of a run puts on a node (its value: the run id).
pub const TAINTED_BY: &str = "shakedown.dev/tainted-by";
pub const FAILED_BY: &str = "shakedown.dev/failed-by";
pub const OWN_IMAGES: &str = "shakedown.dev/own-images";

pub struct AppTarget {
    client: Client,
    /// The same cluster without kube-rs's retry of 429 answers (evictions).
    evict_client: Client,
    server: String,
    spec: AppSpec,
    run_id: String,
    /// Where the data workload's history goes at teardown (`app-history.jsonl`).
    run_dir: std::path::PathBuf,
    /// The operator's replicas when the run started (restored at teardown).
    operator_replicas: Option<i32>,
    /// The StatefulSet's label selector (`k=v,…`).
    sts_selector: String,
    writer: Option<Writer>,
    notes: Vec<String>,
    version: String,
    /// What the ops did beyond their name (the pods `pod-kill-selected` chose), for the event log.
    log: Vec<crate::targets::Note>,
    /// The backups by the plan's backup ids: their objects' names (the name a command was
    /// given), and when each was done.
    backups: BTreeMap<BackupId, (String, std::time::SystemTime)>,
    /// When the last restore was done.
    last_restore: Option<std::time::SystemTime>,
    /// How many restores the run has asked for (their objects' names).
    restores: usize,
    /// How many checker Jobs the probes have created (their names).
    probe_jobs: std::sync::atomic::AtomicU32,
    torn_down: bool,
    /// `--dry-run`: every write is printed (and counted here) instead of sent, every wait
    /// printed instead of waited for; reads are still done.
    dry_run: bool,
    dry_run_writes: std::sync::Mutex<Vec<String>>,
}

fn env(e: impl std::fmt::Display) -> TargetError {
    TargetError::Environment(e.to_string())
}

/// A request to the API, bounded by [`REQUEST_BOUND`]; its error keeps the API's answer.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = Result<T, kube::Error>>) -> Result<T, crate::k8s::CallError> {
    crate::k8s::bounded(what, REQUEST_BOUND, f).await
}

/// Whether an object's annotations opt it in to chaos (`OPT_IN` = "true": the namespace, and a
/// node a drain may cordon).
fn opted_in(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.and_then(|a| a.get(OPT_IN)).map(String::as_str) == Some("true")
}

/// A label selector's `matchLabels` as `k=v,…` (none: empty).
fn selector_of(selector: Option<&LabelSelector>) -> String {
    let labels = selector.and_then(|s| s.match_labels.as_ref());
    labels.into_iter().flatten().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

impl AppTarget {
    /// Starts the target on the spec's cluster (`connect.rs`).
    pub async fn start_spec(spec: &AppSpec, ctx: &StartContext<'_>) -> Result<AppTarget, Fatal> {
        AppTarget::connect(spec, ctx).await
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

    /// With `--dry-run`: prints the write (`METHOD path …`) instead of sending it, counts it,
    /// and says so (`true`: the caller sends nothing). Without: `false`, nothing printed.
    fn dry_write(&self, write: impl FnOnce() -> String) -> bool {
        if !self.dry_run {
            return false;
        }
        let w = write();
        println!("dry-run: {w}");
        self.dry_run_writes.lock().unwrap_or_else(|e| e.into_inner()).push(w);
        true
    }

    /// With `--dry-run`: prints the wait (or the check) the op would make, with its bound.
    fn dry_wait(&self, what: &str) {
        println!("dry-run: wait (up to {}s) until {what}", self.spec.app_profile.op_timeout.as_secs());
    }

    /// The writes a dry run printed, in order.
    pub fn dry_run_writes(&self) -> Vec<String> {
        self.dry_run_writes.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
}

impl AppTarget {
    #[deny(clippy::wildcard_enum_match_arm)]
    async fn execute_op(&mut self, op: &Op, after: &Model) -> Result<(), TargetError> {
        match *op {
            Op::PodKill { member } => self.pod_kill(member).await,
            Op::PodKillSelected { pick } => self.pod_kill_selected(pick).await,
            Op::OperatorRestart => self.operator_restart().await,
            Op::PvcLoss { member } => self.pvc_loss(member).await,
            Op::Partition { member } => self.partition(member).await,
            Op::PartitionHeal { member } => self.partition_heal(member).await,
            Op::NodeDrain { member } => self.node_drain(member).await,
            Op::Taint { member } => self.taint(member).await,
            Op::PodFailure { member } => self.pod_failure(member).await,
            Op::Switchover { member } => self.switchover(member, after).await,
            Op::PartitionGroups { pick } => self.partition_groups(pick).await,
            Op::PartitionGroupsHeal { pick } => self.partition_groups_heal(pick).await,
            Op::Backup => self.backup(after).await,
            Op::Restore { backup } => self.restore(backup).await,
            Op::RestorePitr { backup, at } => self.restore_pitr(backup, at).await,
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
            | Op::DiskReplace { .. }
            | Op::Defrag { .. }
            | Op::PartitionUntilSnapshot { .. }
            | Op::Failpoint { .. } => Err(TargetError::Unsupported(format!("{op} is not an application op"))),
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
            InvariantId::AppLinearizability if self.spec.app_profile.data.is_some() => Coverage::Checked,
            InvariantId::AppLinearizability => Coverage::Unchecked("needs [data] write and read commands in the app profile".into()),
            InvariantId::Membership
            | InvariantId::Linearizability
            | InvariantId::Members
            | InvariantId::Quorum
            | InvariantId::Consistency
            | InvariantId::Reachability
            | InvariantId::Durability
            | InvariantId::Watch
            | InvariantId::Leases
            | InvariantId::ApiReachability
            | InvariantId::ApiDurability
            | InvariantId::ApiWatch
            | InvariantId::ApiLinearizability => Coverage::Unchecked(
                "the app target checks the application (app-ready, app-durability, app-linearizability, leaks), not an etcd or API stack"
                    .into(),
            ),
        }
    }

    fn supports(&self, op: &Op) -> Result<(), super::Unsupported> {
        self.spec.app_profile.supports(op.kind()).map_err(super::Unsupported)
    }

    async fn execute(&mut self, op: &Op, _before: &Model, after: &Model) -> Result<(), TargetError> {
        // With `[leader]`, the op is watched for what it does to the leader (not in a dry run:
        // nothing happens there).
        let watch = match self.spec.app_profile.leader.clone() {
            Some(l) if !self.dry_run => {
                Some((failover::LeaderWatch::start(self.client.clone(), self.ns(), &l.selector, self.spec.app_profile.op_timeout).await, l))
            }
            _ => None,
        };
        let result = self.execute_op(op, after).await;
        if let Some((watch, l)) = watch {
            if let Some((detail, line)) = watch.finish().await.report(&l.selector) {
                tracing::info!("{op}: {line}");
                self.log.push(crate::targets::Note { kind: "app-failover".into(), detail });
            }
        }
        result
    }

    fn take_notes(&mut self) -> Vec<crate::targets::Note> {
        std::mem::take(&mut self.log)
    }

    async fn end_step(&mut self) {}

    async fn observe(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation {
        self.observation(model, invariants).await
    }

    fn log_files(&self) -> Vec<(String, PathBuf)> {
        vec![]
    }

    /// Every pod of the application's namespace: the last lines of each container's log (and of
    /// its previous instance when it restarted), and the namespace's events, newest last.
    async fn forensic_extras(&mut self) -> Vec<(String, String)> {
        observe::forensics(&self.client, self.ns()).await
    }

    fn workload_stats(&self) -> serde_json::Value {
        self.writer.as_ref().map(|w| w.stats()).unwrap_or(serde_json::Value::Null)
    }

    fn interrupted(&self) -> &'static str {
        "interrupted: the run's NetworkPolicies, backups and restores were removed, its cordons lifted, its failed pods given their own \
        images back and the operator scaled back"
    }

    async fn teardown(&mut self) {
        self.teardown_run().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A pod of the StatefulSet `db`, Ready, on node `n1`.
    fn pod(name: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "app", "uid": format!("uid-{name}"),
                "labels": {"app": "db", "statefulset.kubernetes.io/pod-name": name}},
            "spec": {"nodeName": "n1", "containers": [{"name": "db", "image": "db:1"}]},
            "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        })
    }

    /// What a cluster answers to the reads of the ops (a 404 to anything else); every request
    /// it was sent is kept, as `METHOD path`.
    fn cluster(sent: Arc<Mutex<Vec<String>>>) -> Client {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let sent = sent.clone();
            async move {
                let path = req.uri().path().to_string();
                sent.lock().unwrap().push(format!("{} {}", req.method(), req.uri()));
                let list =
                    |items: Vec<serde_json::Value>| serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items});
                let body = match (req.method().as_str(), path.as_str()) {
                    ("GET", "/api/v1/namespaces/app/pods") | ("GET", "/api/v1/pods") => {
                        Some(list(vec![pod("db-0"), pod("db-1"), pod("db-2")]))
                    }
                    ("GET", p) if p.starts_with("/api/v1/namespaces/app/pods/") => Some(pod(p.rsplit('/').next().unwrap_or_default())),
                    ("GET", "/api/v1/namespaces/app/persistentvolumeclaims/data-db-0") => Some(serde_json::json!({
                        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": "data-db-0", "uid": "pvc-uid"}, "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}})),
                    ("GET", "/apis/apps/v1/namespaces/app/deployments/op") => Some(serde_json::json!({
                        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "op"},
                        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "op"}}, "template": {}}})),
                    ("GET", "/api/v1/nodes/n1") => Some(serde_json::json!({
                        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {OPT_IN: "true"}}})),
                    ("GET", "/api/v1/namespaces/app") => Some(serde_json::json!({
                        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app", "labels": {"kubernetes.io/metadata.name": "app"}}})),
                    _ => None,
                };
                let (status, body) = match body {
                    Some(b) => (200, b),
                    None => (
                        404,
                        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
                    ),
                };
                let resp = http::Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body.to_string().into_bytes()));
                Ok::<_, std::convert::Infallible>(resp.expect("a response"))
            }
        });
        Client::new(service, "app")
    }

    fn target(client: Client) -> AppTarget {
        let app_profile = spec::AppProfile::from_toml(
            "namespace = \"app\"\nstatefulset = \"db\"\nclaim = \"data\"\noperator = \"op\"\nop_timeout = \"1s\"\n\
             [partition]\ncommand = [\"nc\", \"{ip}\", \"1\"]\n[[partition.groups]]\na = \"statefulset.kubernetes.io/pod-name=db-0\"\nb = \"statefulset.kubernetes.io/pod-name=db-1\"\n\
             [pod_kill_selected]\nselector = \"app=db\"\ncount = 2\n[pod_failure]\nimage = \"pause\"\nduration = \"1ms\"\n",
        )
        .unwrap();
        AppTarget {
            evict_client: client.clone(),
            client,
            server: "https://cluster.test".into(),
            spec: AppSpec { context: None, app_profile },
            run_id: "sd-dry".into(),
            run_dir: std::env::temp_dir(),
            operator_replicas: Some(1),
            sts_selector: "app=db".into(),
            writer: None,
            notes: vec![],
            version: "v1.30.0".into(),
            log: vec![],
            backups: BTreeMap::new(),
            last_restore: None,
            restores: 0,
            probe_jobs: Default::default(),
            torn_down: false,
            dry_run: true,
            dry_run_writes: Default::default(),
        }
    }

    /// A dry run of every op that needs no custom resource sends reads only: each write is
    /// printed and counted (the deletes, the scale, the cordon, the evictions, the policies, the
    /// pod's images) and none reaches the cluster; no wait is waited for (a 1 s bound on each
    /// would fail the ops, the cluster never changing); the teardown sends nothing either.
    #[tokio::test]
    async fn a_dry_run_prints_every_write_and_sends_none() {
        let sent = Arc::new(Mutex::new(vec![]));
        let mut t = target(cluster(sent.clone()));
        let m0 = MemberId(0);
        let ops = [
            Op::PodKill { member: m0 },
            Op::PodKillSelected { pick: 0 },
            Op::PvcLoss { member: m0 },
            Op::OperatorRestart,
            Op::NodeDrain { member: m0 },
            Op::PodFailure { member: m0 },
            Op::Partition { member: m0 },
            Op::PartitionHeal { member: m0 },
            Op::PartitionGroups { pick: 0 },
            Op::PartitionGroupsHeal { pick: 0 },
        ];
        let profile = shakedown_faults::Profile::from_toml("name = \"t\"\nsteps = 1\nversions = [\"3.5\"]\nstack = \"app\"\n").unwrap();
        let model = profile.initial_model();
        for op in &ops {
            t.execute(op, &model, &model).await.unwrap_or_else(|e| panic!("{op}: {e}"));
        }
        t.teardown().await;
        let sent = sent.lock().unwrap().clone();
        let writes: Vec<&String> = sent.iter().filter(|r| !r.starts_with("GET ")).collect();
        assert!(writes.is_empty(), "a dry run sent writes: {writes:?}");
        assert!(!sent.is_empty(), "the reads are still done");
        let printed = t.dry_run_writes();
        let want = [
            "DELETE /api/v1/namespaces/app/pods/db-0 (grace period 0)",
            "DELETE /api/v1/namespaces/app/pods/db-1 (grace period 0)",
            "DELETE /api/v1/namespaces/app/persistentvolumeclaims/data-db-0",
            "PATCH /apis/apps/v1/namespaces/app/deployments/op (merge patch) {\"spec\":{\"replicas\":0}}",
            "PATCH /apis/apps/v1/namespaces/app/deployments/op (merge patch) {\"spec\":{\"replicas\":1}}",
            "PATCH /api/v1/nodes/n1 (merge patch)",
            "POST /api/v1/namespaces/app/pods/db-2/eviction",
            "PATCH /api/v1/namespaces/app/pods/db-0 (strategic merge patch)",
            "POST /apis/networking.k8s.io/v1/namespaces/app/networkpolicies {",
            "DELETE /apis/networking.k8s.io/v1/namespaces/app/networkpolicies/shakedown-partition-m0",
            "DELETE /apis/networking.k8s.io/v1/namespaces/app/networkpolicies/shakedown-partition-groups-p0-b",
        ];
        for w in want {
            assert!(printed.iter().any(|p| p.starts_with(w)), "{w} not printed: {printed:#?}");
        }
        // Per op: 1 + 2 + 2 + 2 + (2 + 3 evictions) + 2 + 1 + 1 + 2 + 2.
        assert_eq!(printed.len(), 20, "{printed:#?}");
    }
}
