//! The kube target: a Cluster API `Cluster` on a management cluster, reached through a kubeconfig.
//!
//! The plan's members are the control-plane Machines of the Cluster's KubeadmControlPlane (KCP),
//! its sites are failure domains. Ops map onto Cluster API objects:
//! - `rolling-upgrade(to V)`: KCP `spec.version` (and `spec.machineTemplate.spec.infrastructureRef`
//!   to the machine template the kube profile names for V) and every MachineDeployment's
//!   `spec.template.spec.version`; waits until the rollouts complete;
//! - `rolling-replace`: KCP `spec.rollout.after` = now; waits the same way;
//! - `crash(m)`: KCP paused (`cluster.x-k8s.io/paused`), m's Machine deleted; `restart(m)`: KCP
//!   resumed, waits for the replacement Machine in m's failure domain to be healthy;
//! - `site-outage(s, power-loss)` / `site-recover(s)`: the same for every Machine of the failure
//!   domain; `isolate` needs a hook;
//! - `disk-detach(m)` / `disk-reattach(m)`: the VolumeAttachment of the kube profile's `[disk]`
//!   volume (a probe workload's, in the workload cluster) deleted / a new one attached;
//! - `backup` / `restore(b)`: Velero `Backup` / `Restore` objects when Velero's CRDs are installed;
//! - pause, resume (and any op, instead of the above): command hooks from the kube profile, else
//!   unsupported (the engine skips them, with the reason).
//!
//! The workload cluster (Nodes, PersistentVolumes, VolumeAttachments) is reached through the
//! kubeconfig in the Cluster's `<name>-kubeconfig` Secret; without it those checks are skipped
//! with a note.
//!
//! Waiting and observing read watch caches (kube-runtime reflectors): no polling requests.
//! Architecture invariant: like every target, this one observes; `shakedown-invariants` judges.

pub mod client;
pub mod conditions;
pub mod profile;
pub mod reap;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use shakedown_faults::{Answers, MemberId, Model, Op, OpKind, OutageMode, Profile, SiteId};
use shakedown_invariants::{Inventory, InvariantId, KubeInventory, ListedMember, MemberStatus, Observation, Probe, ServingSample};
use tokio::sync::watch;
use tokio::time::Instant;

use self::client::{capi, RequestCounter, Watched};
use self::conditions::{condition, deleting, failure_domain, rollout, ETCD_CLUSTER_HEALTHY, ETCD_MEMBER_HEALTHY};
use self::profile::{Hook, KubeProfile};
use self::workload::Workload;
use super::{Target, TargetError};

/// The opt-in: shakedown acts only on a Cluster annotated (or labelled) with this, set to "true".
pub const OPT_IN: &str = "shakedown.dev/allow-chaos";
/// Every object shakedown creates carries its run id under this label.
pub const RUN_LABEL: &str = "shakedown.dev/run-id";
/// Set with the run id on a KubeadmControlPlane shakedown paused (so `reap` can resume it).
pub const PAUSED_BY: &str = "shakedown.dev/paused-by";
/// Cluster API's pause annotation: controllers leave the object alone while it is set.
pub const CAPI_PAUSED: &str = "cluster.x-k8s.io/paused";
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";

/// Why the kube target could not start (each maps to a documented exit code in the CLI).
#[derive(Debug, Clone, thiserror::Error)]
pub enum KubeError {
    /// Bad input: a kubeconfig that does not parse, an unknown context, no such Cluster, a
    /// profile that does not fit the Cluster (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The Cluster has not opted in (exit 4).
    #[error("{0}")]
    Refused(String),
    /// The management cluster cannot be reached, or denies a request (exit 4).
    #[error("{0}")]
    Environment(String),
}

/// What to connect to and how.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: String,
    pub name: String,
    pub dry_run: bool,
    pub profile: KubeProfile,
    pub run_id: String,
}

/// A write the target makes — or, with `--dry-run`, prints instead.
#[derive(Debug, Clone)]
pub enum Write {
    /// A JSON merge patch.
    Patch { ar: ApiResource, ns: String, name: String, body: Value },
    Delete { ar: ApiResource, ns: String, name: String },
    Create { ar: ApiResource, ns: String, body: Value },
    /// A cluster-scoped object in the workload cluster, deleted only while it has `uid`.
    DeleteInWorkload { ar: ApiResource, name: String, uid: String },
}

fn path_of(ar: &ApiResource, ns: &str, name: Option<&str>) -> String {
    let base = if ar.group.is_empty() { format!("/api/{}", ar.version) } else { format!("/apis/{}/{}", ar.group, ar.version) };
    match name {
        Some(n) => format!("{base}/namespaces/{ns}/{}/{n}", ar.plural),
        None => format!("{base}/namespaces/{ns}/{}", ar.plural),
    }
}

impl fmt::Display for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Write::Patch { ar, ns, name, body } => write!(f, "PATCH {} (merge patch) {body}", path_of(ar, ns, Some(name))),
            Write::Delete { ar, ns, name } => write!(f, "DELETE {}", path_of(ar, ns, Some(name))),
            Write::Create { ar, ns, body } => write!(f, "POST {} {body}", path_of(ar, ns, None)),
            Write::DeleteInWorkload { ar, name, uid } => {
                let base = if ar.group.is_empty() { format!("/api/{}", ar.version) } else { format!("/apis/{}/{}", ar.group, ar.version) };
                write!(f, "DELETE (workload cluster) {base}/{}/{name} (precondition uid {uid})", ar.plural)
            }
        }
    }
}

fn api_error(what: &str, e: kube::Error) -> TargetError {
    match &e {
        kube::Error::Api(r) if r.code == 403 => TargetError::Environment(format!("{what}: forbidden ({}): give the identity of the kubeconfig the RBAC of ci/k8s/rbac.yaml", r.message)),
        kube::Error::Api(_) => TargetError::Environment(format!("{what}: {e}")),
        _ => TargetError::Environment(format!("{what}: no answer from the management cluster: {e}")),
    }
}

/// Velero's kinds (group velero.io, version v1).
pub fn velero_ar(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("velero.io", "v1", kind))
}

/// `Ok` when Velero's Backup and Restore kinds are served on the management cluster (API
/// discovery: readable by every authenticated identity, and no 404 for a missing group).
pub(crate) async fn probe_velero(client: &Client) -> Result<(), String> {
    let groups = client.list_api_groups().await.map_err(|e| format!("cannot list the management cluster's API groups: {e}"))?;
    if !groups.groups.iter().any(|g| g.name == "velero.io" && g.versions.iter().any(|v| v.version == "v1")) {
        return Err("Velero's CRDs (backups.velero.io, restores.velero.io) are not installed on the management cluster".into());
    }
    let resources = client.list_api_group_resources("velero.io/v1").await.map_err(|e| format!("cannot list the kinds of velero.io/v1: {e}"))?;
    for plural in ["backups", "restores"] {
        if !resources.resources.iter().any(|r| r.name == plural) {
            return Err(format!("Velero's CRD {plural}.velero.io is not installed on the management cluster"));
        }
    }
    Ok(())
}

/// Serving samples taken from the Machine watch during a step.
#[derive(Default)]
struct Sampler {
    start: Option<std::time::Instant>,
    samples: Vec<ServingSample>,
}

/// A control-plane Machine as observed.
#[derive(Debug, Clone)]
struct CpMachine {
    name: String,
    fd: Option<String>,
    healthy: bool,
    why: String,
    deleting: bool,
    created: String,
    version: Option<String>,
}

fn cp_machines(store: &[Arc<DynamicObject>]) -> Vec<CpMachine> {
    let mut v: Vec<CpMachine> = store
        .iter()
        .filter(|m| m.metadata.labels.as_ref().is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL)))
        .map(|m| {
            let obj = serde_json::to_value(m.as_ref()).unwrap_or_default();
            let c = condition(&obj, ETCD_MEMBER_HEALTHY);
            CpMachine {
                name: m.metadata.name.clone().unwrap_or_default(),
                fd: failure_domain(&obj),
                healthy: c.as_ref().is_some_and(|c| c.is_true()),
                why: c.map(|c| c.text()).unwrap_or_else(|| "no EtcdMemberHealthy condition".into()),
                deleting: deleting(&obj),
                created: m.metadata.creation_timestamp.as_ref().map(|t| t.0.to_rfc3339()).unwrap_or_default(),
                version: obj.pointer("/spec/version").and_then(Value::as_str).map(str::to_string),
            }
        })
        .collect();
    v.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
    v
}

/// The watch caches of the Cluster's objects.
struct Cache {
    cluster: Watched,
    kcp: Watched,
    machines: Watched,
    deployments: Watched,
    infra: Vec<Watched>,
    /// The run's Velero Backups and Restores (when Velero is installed).
    velero: Vec<Watched>,
    /// The workload cluster (when its kubeconfig Secret is there).
    workload: Option<Workload>,
    changed: watch::Receiver<u64>,
    errors: Arc<Mutex<Option<String>>>,
}

impl Cache {
    /// The management cluster's watches.
    fn management(&self) -> impl Iterator<Item = &Watched> {
        [&self.cluster, &self.kcp, &self.machines, &self.deployments].into_iter().chain(self.infra.iter()).chain(self.velero.iter())
    }
    fn all(&self) -> impl Iterator<Item = &Watched> {
        self.management().chain(self.workload.iter().flat_map(|w| w.all()))
    }
    /// `Some(why)` when a watch of the Cluster's own objects (Cluster, KCP, Machines,
    /// MachineDeployments) has failed for longer than `bound` without a success in between: the
    /// management cluster is gone. (Other kinds' watches failing do not end a run.)
    fn lost(&self, bound: Duration) -> Option<String> {
        [&self.cluster, &self.kcp, &self.machines, &self.deployments]
            .into_iter()
            .filter_map(|w| w.failing_for())
            .find(|(d, _)| *d >= bound)
            .map(|(d, e)| format!("no answer from the management cluster for {}s: {e}", d.as_secs()))
    }
    fn kcp(&self) -> Option<Value> {
        self.kcp.objects().first().and_then(|o| serde_json::to_value(o.as_ref()).ok())
    }
    fn last_error(&self) -> Option<String> {
        self.errors.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

pub struct KubeTarget {
    client: Client,
    /// Every request sent, by verb and resource.
    pub counter: RequestCounter,
    cfg: KubeConfig,
    kcp_name: String,
    kcp_ar: ApiResource,
    infra_ref: Option<(String, String)>,
    site_fds: Vec<String>,
    cache: Cache,
    bindings: BTreeMap<MemberId, String>,
    model: Model,
    sampler: Arc<Mutex<Sampler>>,
    events: Vec<(String, Value)>,
    paused: bool,
    versions: BTreeMap<String, String>,
    op_timeout: Duration,
    torn_down: bool,
    lock_created: bool,
    /// `Kind/name` → the generation our last patch gave the object.
    written_generation: BTreeMap<String, i64>,
    /// Machines a rollout was asked to replace: never bound again, so one left behind shows.
    retired: BTreeSet<String>,
    /// The writes a dry run printed.
    pub dry_run_writes: Vec<String>,
    /// What the run should be told at the start (a check skipped, and why).
    notes: Vec<String>,
    /// The PersistentVolume the disk ops act on, or why there is none.
    disk_pv: Result<String, String>,
    /// VolumeAttachments this run deleted (uids): a reattach waits for a new one.
    detached: BTreeSet<String>,
    /// Velero is usable, or why not.
    velero: Result<(), String>,
    /// Velero objects this run created: (kind, name), removed at teardown.
    velero_objects: Vec<(String, String)>,
    /// Set when the management cluster was lost: the run's outcome cannot be trusted.
    lost: Option<String>,
    /// Set by a wait's check when waiting longer cannot help (a Velero Backup that failed).
    wait_failed: Option<String>,
}

impl KubeTarget {
    /// Connects, checks the opt-in and the Cluster's shape, fills the watch caches, takes the
    /// run's lock object (a ConfigMap labelled with the run id) and binds the plan's members
    /// to the control-plane Machines.
    pub async fn connect(cfg: KubeConfig, profile: &Profile, model: &Model) -> Result<KubeTarget, KubeError> {
        let (client, counter, server) = client::connect(cfg.kubeconfig.as_deref(), cfg.context.as_deref()).await?;
        let (ns, name) = (cfg.namespace.clone(), cfg.name.clone());
        let reach = |e: kube::Error, what: String| match &e {
            kube::Error::Api(r) if r.code == 404 => KubeError::Usage(format!("{what} not found on {server}")),
            kube::Error::Api(r) if r.code == 403 => KubeError::Environment(format!("{what}: forbidden ({}): the identity of the kubeconfig needs the RBAC of ci/k8s/rbac.yaml", r.message)),
            _ => KubeError::Environment(format!("cannot reach the management cluster at {server} ({what}): {e}")),
        };
        let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &capi("Cluster"));
        let cluster = clusters.get(&name).await.map_err(|e| reach(e, format!("Cluster {ns}/{name}")))?;
        let opted_in = |m: Option<&BTreeMap<String, String>>| m.and_then(|m| m.get(OPT_IN)).is_some_and(|v| v == "true");
        if !opted_in(cluster.metadata.annotations.as_ref()) && !opted_in(cluster.metadata.labels.as_ref()) {
            return Err(KubeError::Refused(format!(
                "Cluster {ns}/{name} has not opted in to chaos: shakedown acts only on a Cluster annotated {OPT_IN}=\"true\" (kubectl annotate cluster -n {ns} {name} {OPT_IN}=true)"
            )));
        }
        let cref = cluster.data.pointer("/spec/controlPlaneRef").cloned().unwrap_or(Value::Null);
        let kind = cref.get("kind").and_then(Value::as_str).unwrap_or_default();
        let Some(kcp_name) = cref.get("name").and_then(Value::as_str).filter(|_| kind == "KubeadmControlPlane").map(str::to_string) else {
            return Err(KubeError::Usage(format!("Cluster {ns}/{name} has no KubeadmControlPlane as spec.controlPlaneRef (found {cref}): the kube target drives KubeadmControlPlane")));
        };
        let kcp_ar = capi("KubeadmControlPlane");
        let kcps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kcp_ar);
        let kcp = kcps.get(&kcp_name).await.map_err(|e| reach(e, format!("KubeadmControlPlane {ns}/{kcp_name}")))?;
        let replicas = kcp.data.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
        if replicas != profile.members as i64 {
            return Err(KubeError::Usage(format!(
                "the profile has {} members but KubeadmControlPlane {ns}/{kcp_name} has spec.replicas {replicas}: use a profile with members = {replicas}",
                profile.members
            )));
        }
        let infra_ref = kcp.data.pointer("/spec/machineTemplate/spec/infrastructureRef").and_then(|r| {
            Some((r.get("apiGroup")?.as_str()?.to_string(), r.get("kind")?.as_str()?.to_string()))
        });
        let server_version = client.apiserver_version().await.map(|v| v.git_version).unwrap_or_else(|_| "unknown".into());

        // Watch caches.
        let (tx, rx) = watch::channel(0u64);
        let errors = Arc::new(Mutex::new(None));
        let sampler = Arc::new(Mutex::new(Sampler::default()));
        let by_name = |n: &str| ListParams::default().fields(&format!("metadata.name={n}"));
        let by_cluster = ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={name}"));
        let s2 = sampler.clone();
        let on_machines: client::OnChange = Arc::new(move |store| {
            let mut s = s2.lock().unwrap_or_else(|e| e.into_inner());
            let Some(start) = s.start else { return };
            let ms = cp_machines(&store.state());
            let live: Vec<&CpMachine> = ms.iter().filter(|m| !m.deleting).collect();
            let serving: Vec<String> = live.iter().filter(|m| m.healthy).map(|m| m.name.clone()).collect();
            let size = live.len();
            if s.samples.last().is_some_and(|l| l.serving == serving && l.cluster_size == size) {
                return;
            }
            s.samples.push(ServingSample { at_ms: start.elapsed().as_millis() as u64, serving, cluster_size: size });
        });
        // The workload cluster (a note, not an error, when its Secret is missing).
        let mut notes = Vec::new();
        let workload = match workload::client_from_secret(&client, &counter, &ns, &name).await {
            Ok((wc, wserver)) => Some(Workload::watch(wc, wserver, &tx, &errors)),
            Err(note) => {
                notes.push(note);
                None
            }
        };
        // Velero (backup and restore), unless hooks do both.
        let hooks = &cfg.profile.hooks;
        let velero_ns = cfg.profile.velero.namespace.clone();
        let velero = if hooks.contains_key(&OpKind::Backup) && hooks.contains_key(&OpKind::Restore) { Err("hooks set".to_string()) } else { probe_velero(&client).await };
        let mut velero_watches = Vec::new();
        if velero.is_ok() {
            let by_run = ListParams::default().labels(&format!("{RUN_LABEL}={}", cfg.run_id));
            for kind in ["Backup", "Restore"] {
                velero_watches.push(Watched::start(&client, &velero_ar(kind), &velero_ns, by_run.clone(), tx.clone(), errors.clone(), None));
            }
        }
        let mut infra = Vec::new();
        for spec in &cfg.profile.infra_machine_kinds {
            let ar = client::resource_of(spec).map_err(KubeError::Usage)?;
            infra.push(Watched::start(&client, &ar, &ns, by_cluster.clone(), tx.clone(), errors.clone(), None));
        }
        let cache = Cache {
            cluster: Watched::start(&client, &capi("Cluster"), &ns, by_name(&name), tx.clone(), errors.clone(), None),
            kcp: Watched::start(&client, &kcp_ar, &ns, by_name(&kcp_name), tx.clone(), errors.clone(), None),
            machines: Watched::start(&client, &capi("Machine"), &ns, by_cluster.clone(), tx.clone(), errors.clone(), Some(on_machines)),
            deployments: Watched::start(&client, &capi("MachineDeployment"), &ns, by_cluster, tx.clone(), errors.clone(), None),
            infra,
            velero: velero_watches,
            workload,
            changed: rx,
            errors,
        };
        let deadline = Instant::now() + cfg.profile.timeouts.sync;
        let mut changed = cache.changed.clone();
        while !cache.all().all(|w| w.synced()) {
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                let pending: Vec<&str> = cache.all().filter(|w| !w.synced()).map(|w| w.kind.as_str()).collect();
                return Err(KubeError::Environment(format!(
                    "the watches of {} did not start within {}s on {server}: {}",
                    pending.join(", "),
                    cfg.profile.timeouts.sync.as_secs(),
                    cache.last_error().unwrap_or_else(|| "no error reported".into())
                )));
            }
        }

        // Failure domains standing for the sites.
        let mut fds = cfg.profile.failure_domains.clone();
        if fds.is_empty() {
            let fd_field = cluster.data.pointer("/status/failureDomains").cloned().unwrap_or(Value::Null);
            fds = match fd_field {
                Value::Array(a) => a.iter().filter_map(|f| f.get("name").and_then(Value::as_str).map(str::to_string)).collect(),
                Value::Object(o) => o.keys().cloned().collect(),
                _ => vec![],
            };
        }
        if fds.is_empty() {
            fds = cp_machines(&cache.machines.objects()).into_iter().filter_map(|m| m.fd).collect::<BTreeSet<_>>().into_iter().collect();
        }
        fds.sort();
        fds.dedup();
        if fds.len() < profile.sites as usize {
            return Err(KubeError::Usage(format!(
                "the profile has {} sites but Cluster {ns}/{name} has {} failure domain(s) ({}): use a profile with sites = {}, or list them under failure_domains in the kube profile",
                profile.sites,
                fds.len(),
                fds.join(", "),
                fds.len().max(1)
            )));
        }
        if cfg.profile.failure_domains.is_empty() {
            fds.truncate(profile.sites as usize);
        }
        let mut versions = BTreeMap::new();
        versions.insert("kube-apiserver".into(), server_version);
        if let Some(v) = kcp.data.pointer("/spec/version").and_then(Value::as_str) {
            versions.insert("kubernetes".into(), v.to_string());
        }
        versions.insert("cluster".into(), format!("{ns}/{name}"));
        let op_timeout = cfg.profile.timeouts.rollout;
        // The disk ops' volume: the PersistentVolume named, or the one the claim is bound to.
        let disk_pv = match (&cfg.profile.disk, &cache.workload) {
            (None, _) => Err("the kube profile names no [disk] volume (pvc = \"namespace/name\" of a probe workload, or pv = \"name\")".to_string()),
            (Some(_), None) => Err("the workload cluster is not observed (see the note at the start)".to_string()),
            (Some(d), Some(w)) => match (&d.pv, &d.pvc) {
                (Some(pv), _) => Ok(pv.clone()),
                (None, Some(claim)) => Ok(workload::volume_of_claim(&w.client, claim).await.map_err(|e| KubeError::Usage(format!("kube profile [disk]: {e}")))?),
                (None, None) => Err("[disk] names no volume".to_string()),
            },
        };
        if let Err(why) = &velero {
            if why != "hooks set" {
                notes.push(format!("backup and restore: {why}; they need [hooks.backup] and [hooks.restore] in the kube profile"));
            }
        }
        let mut t = KubeTarget {
            client,
            counter,
            cfg,
            kcp_name,
            kcp_ar,
            infra_ref,
            site_fds: fds,
            cache,
            bindings: BTreeMap::new(),
            model: model.clone(),
            sampler,
            events: vec![],
            paused: false,
            versions,
            op_timeout,
            torn_down: false,
            lock_created: false,
            written_generation: BTreeMap::new(),
            retired: BTreeSet::new(),
            dry_run_writes: vec![],
            notes,
            disk_pv,
            detached: BTreeSet::new(),
            velero,
            velero_objects: vec![],
            lost: None,
            wait_failed: None,
        };
        t.take_lock().await.map_err(|e| KubeError::Environment(e.to_string()))?;
        t.rebind();
        Ok(t)
    }

    /// Notes for the start of the run: checks skipped (no workload cluster), ops without a backend.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// `Some(why)` when the management cluster stopped answering during the run: the outcome
    /// of the run cannot be trusted (exit 4).
    pub fn management_lost(&self) -> Option<String> {
        self.lost.clone().or_else(|| self.cache.lost(self.cfg.profile.timeouts.unreachable))
    }

    pub fn server_namespace(&self) -> &str {
        &self.cfg.namespace
    }

    /// The Machine each member stands for.
    pub fn bindings(&self) -> &BTreeMap<MemberId, String> {
        &self.bindings
    }

    fn fd_of(&self, site: SiteId) -> Option<&str> {
        self.site_fds.get(site.0 as usize).map(String::as_str)
    }

    async fn send(&mut self, w: Write) -> Result<(), TargetError> {
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
                let w = self.cache.workload.as_ref().ok_or_else(|| TargetError::Environment(format!("{what}: the workload cluster is not observed")))?;
                let api: Api<DynamicObject> = Api::all_with(w.client.clone(), &ar);
                let dp = DeleteParams { preconditions: Some(kube::api::Preconditions { uid: Some(uid), resource_version: None }), ..Default::default() };
                match api.delete(&name, &dp).await {
                    Ok(_) => Ok(()),
                    // Gone already, or replaced by a new object of that name (uid precondition).
                    Err(kube::Error::Api(r)) if r.code == 404 || r.code == 409 => Ok(()),
                    Err(kube::Error::Api(r)) if r.code == 403 => Err(TargetError::Environment(format!("{what}: forbidden in the workload cluster ({})", r.message))),
                    Err(e) => Err(TargetError::Environment(format!("{what}: workload cluster at {}: {e}", w.server))),
                }
            }
        }
    }

    fn lock_name(&self) -> String {
        format!("shakedown-{}", self.cfg.run_id)
    }

    fn configmap_ar() -> ApiResource {
        ApiResource::erase::<ConfigMap>(&())
    }

    /// The run's object: a ConfigMap labelled with the run id, saying which process runs what
    /// against which Cluster (`reap` reads it).
    async fn take_lock(&mut self) -> Result<(), TargetError> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        let body = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self.lock_name(), "namespace": self.cfg.namespace, "labels": {RUN_LABEL: self.cfg.run_id, "app.kubernetes.io/managed-by": "shakedown"}},
            "data": {"cluster": self.cfg.name, "pid": std::process::id().to_string(), "host": host, "started": crate::record::now_rfc3339()}
        });
        self.send(Write::Create { ar: Self::configmap_ar(), ns: self.cfg.namespace.clone(), body }).await?;
        self.lock_created = !self.cfg.dry_run;
        Ok(())
    }

    /// Binds members to Machines: a binding holds while its Machine exists and is not being
    /// deleted; an unbound member expected to have a Machine takes the oldest unbound Machine
    /// of its site's failure domain.
    fn rebind(&mut self) {
        let ms = cp_machines(&self.cache.machines.objects());
        let retired = &self.retired;
        let live: BTreeMap<&str, &CpMachine> = ms.iter().filter(|m| !m.deleting && !retired.contains(&m.name)).map(|m| (m.name.as_str(), m)).collect();
        let model = &self.model;
        self.bindings.retain(|id, machine| model.members.contains_key(id) && live.contains_key(machine.as_str()));
        let mut taken: BTreeSet<String> = self.bindings.values().cloned().collect();
        for m in model.members.values() {
            if self.bindings.contains_key(&m.id) || model.has_process(m) == Answers::No {
                continue;
            }
            let Some(fd) = self.site_fds.get(m.site.0 as usize) else { continue };
            // Healthy Machines first, then the oldest.
            let pick = ms.iter().filter(|c| live.contains_key(c.name.as_str()) && c.fd.as_deref() == Some(fd.as_str()) && !taken.contains(&c.name)).min_by_key(|c| (!c.healthy, c.created.clone(), c.name.clone()));
            if let Some(c) = pick {
                taken.insert(c.name.clone());
                self.bindings.insert(m.id, c.name.clone());
            }
        }
    }

    /// Waits (on the watch caches, no requests) until `check` passes.
    async fn wait_until(&mut self, what: &str, timeout: Duration, mut check: impl FnMut(&mut KubeTarget) -> Result<(), String>) -> Result<(), TargetError> {
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
        self.events.push(("kube-wait".into(), json!({"until": what, "ms": t0.elapsed().as_millis() as u64, "non_watch_requests": requests})));
        Ok(())
    }

    /// `Ok` when KCP's rollout is complete and every member expected up stands on a healthy Machine.
    fn settled(&mut self) -> Result<(), String> {
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

    async fn set_paused(&mut self, paused: bool) -> Result<(), TargetError> {
        if self.paused == paused {
            return Ok(());
        }
        let body = if paused {
            json!({"metadata": {"annotations": {CAPI_PAUSED: "", PAUSED_BY: self.cfg.run_id}}})
        } else {
            json!({"metadata": {"annotations": {CAPI_PAUSED: null, PAUSED_BY: null}}})
        };
        self.send(Write::Patch { ar: self.kcp_ar.clone(), ns: self.cfg.namespace.clone(), name: self.kcp_name.clone(), body }).await?;
        self.paused = paused;
        Ok(())
    }

    /// Deletes the Machines of `members` with KCP paused, and waits until they are gone.
    async fn delete_machines(&mut self, members: &[MemberId]) -> Result<(), TargetError> {
        let names: Vec<String> = members.iter().filter_map(|m| self.bindings.get(m).cloned()).collect();
        if names.len() != members.len() {
            return Err(TargetError::Stack(format!("no Machine stands for some of {members:?} (bindings {:?})", self.bindings)));
        }
        self.set_paused(true).await?;
        for n in &names {
            self.send(Write::Delete { ar: capi("Machine"), ns: self.cfg.namespace.clone(), name: n.clone() }).await?;
        }
        let timeout = self.op_timeout;
        self.wait_until(&format!("Machine(s) {} deleted", names.join(", ")), timeout, |t| {
            let left: Vec<String> = t.cache.machines.objects().iter().filter_map(|m| m.metadata.name.clone()).filter(|n| names.contains(n)).collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("still there: {}", left.join(", ")))
            }
        })
        .await
    }

    /// Resumes KCP and waits until every member expected up stands on a healthy Machine.
    async fn replace_missing(&mut self, what: &str) -> Result<(), TargetError> {
        self.set_paused(false).await?;
        let timeout = self.op_timeout;
        self.wait_until(what, timeout, |t| t.settled()).await
    }

    /// `disk-detach`: deletes the VolumeAttachment(s) of the `[disk]` volume and waits until
    /// they are gone (a CSI attacher's finalizer holds one until the volume is detached).
    async fn detach_disk(&mut self) -> Result<(), TargetError> {
        let pv = self.disk_pv.clone().map_err(TargetError::Unsupported)?;
        let timeout = self.cfg.profile.disk.as_ref().map(|d| d.timeout).unwrap_or(Duration::from_secs(300));
        let vas = self.cache.workload.as_ref().map(|w| w.attachments_of(&pv)).unwrap_or_default();
        if vas.is_empty() && !self.cfg.dry_run {
            return Err(TargetError::Stack(format!("PersistentVolume {pv} has no VolumeAttachment to delete: the probe workload's volume is not attached")));
        }
        for (name, uid, _) in &vas {
            self.send(Write::DeleteInWorkload { ar: workload::va_ar(), name: name.clone(), uid: uid.clone() }).await?;
            self.detached.insert(uid.clone());
        }
        let uids = self.detached.clone();
        self.wait_until(&format!("the VolumeAttachment(s) of PersistentVolume {pv} deleted"), timeout, |t| {
            let w = t.cache.workload.as_ref().ok_or("the workload cluster is not observed")?;
            let left: Vec<String> = w.attachments.objects().iter().filter(|va| va.metadata.uid.as_ref().is_some_and(|u| uids.contains(u))).filter_map(|va| va.metadata.name.clone()).collect();
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
    async fn reattach_disk(&mut self) -> Result<(), TargetError> {
        let pv = self.disk_pv.clone().map_err(TargetError::Unsupported)?;
        let timeout = self.cfg.profile.disk.as_ref().map(|d| d.timeout).unwrap_or(Duration::from_secs(300));
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
    async fn velero_run(&mut self, kind: &str, id: &str, from: Option<&str>) -> Result<(), TargetError> {
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
            let obj = t.cache.velero.get(watch_ix).and_then(|w| w.objects().into_iter().find(|o| o.metadata.name.as_deref() == Some(name.as_str())));
            let Some(obj) = obj else { return Err("not in the watch cache yet".into()) };
            let phase = obj.data.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
            match phase {
                "Completed" => Ok(()),
                "Failed" | "PartiallyFailed" | "FailedValidation" | "Deleting" => {
                    let why = ["/status/failureReason", "/status/validationErrors"].iter().filter_map(|p| obj.data.pointer(p)).map(|v| v.to_string()).collect::<Vec<_>>().join(" ");
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

    async fn run_hook(&mut self, op: &Op, hook: &Hook) -> Result<(), TargetError> {
        let mut env: Vec<(String, String)> = vec![
            ("SHAKEDOWN_OP".into(), op.kind().to_string()),
            ("SHAKEDOWN_RUN_ID".into(), self.cfg.run_id.clone()),
            ("SHAKEDOWN_CLUSTER".into(), format!("{}/{}", self.cfg.namespace, self.cfg.name)),
        ];
        let member = match op {
            Op::Crash { member } | Op::Restart { member } | Op::Pause { member } | Op::Resume { member } | Op::DiskDetach { member } | Op::DiskReattach { member } => Some(*member),
            _ => None,
        };
        if let Some(m) = member {
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
            _ => {}
        }
        if self.cfg.dry_run {
            println!("dry-run: hook {op}: {:?}", hook.command);
            return Ok(());
        }
        let res = run_command(&hook.command, &env, hook.timeout).await;
        self.events.push(("hook".into(), json!({"op": op.to_string(), "command": hook.command, "exit": res.exit, "ms": res.ms, "stdout": res.stdout, "stderr": res.stderr, "error": res.error})));
        match res.error {
            None => Ok(()),
            Some(e) => Err(TargetError::Environment(format!("hook for {op} ({}): {e}", hook.command.join(" ")))),
        }
    }

    fn current_kcp_version(&self) -> Option<String> {
        self.cache.kcp().and_then(|k| k.pointer("/spec/version").and_then(Value::as_str).map(str::to_string))
    }

    async fn probes(&self) -> Vec<Probe> {
        let mut out = Vec::new();
        for p in &self.cfg.profile.probes {
            let t0 = std::time::Instant::now();
            let res = http_get(&p.url, p.insecure, p.timeout).await;
            out.push(Probe { latency_ms: t0.elapsed().as_millis() as u64, error: res.err().map(|e| format!("HTTP probe GET {}: {e}", p.url)) });
        }
        for c in &self.cfg.profile.commands {
            let t0 = std::time::Instant::now();
            let res = run_command(&c.command, &[], c.timeout).await;
            out.push(Probe { latency_ms: t0.elapsed().as_millis() as u64, error: res.error.map(|e| format!("command probe {}: {e}", c.command.join(" "))) });
        }
        for c in &self.cfg.profile.conditions {
            let t0 = std::time::Instant::now();
            let res = self.condition_check(c).await;
            out.push(Probe { latency_ms: t0.elapsed().as_millis() as u64, error: res.err().map(|e| format!("condition check {} {}={}: {e}", c.kind, c.type_, c.status)) });
        }
        out
    }

    async fn condition_check(&self, c: &profile::ConditionCheck) -> Result<(), String> {
        let (group, version) = c.api_version.rsplit_once('/').unwrap_or(("", c.api_version.as_str()));
        let ar = ApiResource { group: group.into(), version: version.into(), api_version: c.api_version.clone(), kind: c.kind.clone(), plural: c.plural.clone() };
        let ns = c.namespace.clone().unwrap_or_else(|| self.cfg.namespace.clone());
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &ar);
        let objs = match (&c.name, &c.selector) {
            (Some(n), _) => vec![api.get(n).await.map_err(|e| e.to_string())?],
            (None, Some(sel)) => api.list(&ListParams::default().labels(sel)).await.map_err(|e| e.to_string())?.items,
            _ => vec![],
        };
        if objs.is_empty() {
            return Err("no object matches".into());
        }
        let mut wrong = Vec::new();
        for o in objs {
            let v = serde_json::to_value(&o).unwrap_or_default();
            let name = o.metadata.name.clone().unwrap_or_default();
            match condition(&v, &[c.type_.as_str()]) {
                Some(cond) if format!("{:?}", cond.status) == c.status => {}
                Some(cond) => wrong.push(format!("{name}: {}", cond.text())),
                None => wrong.push(format!("{name}: no {} condition", c.type_)),
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }

    fn inventory(&self) -> KubeInventory {
        let machines = self.cache.machines.objects();
        let cp = cp_machines(&machines);
        let by_machine: BTreeMap<&String, MemberId> = self.bindings.iter().map(|(id, m)| (m, *id)).collect();
        let mut inv = KubeInventory { machines: cp.iter().filter(|m| !m.deleting).map(|m| (m.name.clone(), by_machine.get(&m.name).copied())).collect(), ..Default::default() };
        for d in self.cache.deployments.objects() {
            let name = d.metadata.name.clone().unwrap_or_default();
            let want = d.data.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
            let found = machines
                .iter()
                .filter(|m| m.metadata.deletion_timestamp.is_none() && m.metadata.labels.as_ref().and_then(|l| l.get(DEPLOYMENT_NAME_LABEL)) == Some(&name))
                .count();
            inv.machine_deployments.push((name, want, found));
        }
        let referenced: BTreeSet<(String, String)> = machines
            .iter()
            .filter_map(|m| {
                let r = m.data.pointer("/spec/infrastructureRef")?;
                Some((r.get("kind")?.as_str()?.to_string(), r.get("name")?.as_str()?.to_string()))
            })
            .collect();
        let now = std::time::SystemTime::now();
        for w in self.cache.all() {
            for o in w.objects() {
                let name = o.metadata.name.clone().unwrap_or_default();
                if let Some(ts) = &o.metadata.deletion_timestamp {
                    let since: std::time::SystemTime = ts.0.into();
                    inv.deleting.insert(format!("{}/{name}", w.kind), now.duration_since(since).map(|d| d.as_secs()).unwrap_or(0));
                }
            }
        }
        for w in &self.cache.infra {
            for o in w.objects() {
                let name = o.metadata.name.clone().unwrap_or_default();
                if o.metadata.deletion_timestamp.is_none() && !referenced.contains(&(w.kind.clone(), name.clone())) {
                    inv.orphan_infra_machines.push(format!("{}/{name}", w.kind));
                }
            }
        }
        if let Some(w) = &self.cache.workload {
            inv.orphan_nodes = w.orphan_nodes(&machines);
            inv.released_volumes = w.released_volumes();
            inv.orphan_volume_attachments = w.orphan_attachments();
        }
        inv
    }

    fn observe_members(&self, obs: &mut Observation) {
        let ms = cp_machines(&self.cache.machines.objects());
        let kcp = self.cache.kcp();
        // The etcd cluster's health as KCP reports it: without it, nobody is known to see a leader.
        let cluster_cond = kcp.as_ref().and_then(|k| condition(k, ETCD_CLUSTER_HEALTHY));
        let by_machine: BTreeMap<&String, MemberId> = self.bindings.iter().map(|(id, m)| (m, *id)).collect();
        for m in &ms {
            let member = by_machine.get(&m.name).copied();
            obs.members.push(MemberStatus {
                name: member.map(|id| id.to_string()).unwrap_or_else(|| m.name.clone()),
                member,
                reachable: m.healthy && !m.deleting,
                leader: (m.healthy && !m.deleting && cluster_cond.is_some()).then_some(1),
                etcd_id: None,
                revision: 0,
                raft_index: 0,
                version: m.version.clone(),
                hash: None,
                error: (!m.healthy || m.deleting || cluster_cond.is_none()).then(|| {
                    let mut why = format!("Machine {}: {}", m.name, m.why);
                    if m.deleting {
                        why.push_str(", being deleted");
                    }
                    if cluster_cond.is_none() {
                        why.push_str("; KubeadmControlPlane reports no EtcdClusterHealthy condition");
                    }
                    why
                }),
            });
        }
        if kcp.is_some() {
            let mut list: Vec<ListedMember> = ms
                .iter()
                .filter(|m| !m.deleting)
                .enumerate()
                .map(|(i, m)| ListedMember {
                    id: i as u64 + 1,
                    name: by_machine.get(&m.name).map(|id| id.to_string()).unwrap_or_else(|| m.name.clone()),
                    peer_urls: vec![format!("machine/{} ({})", m.name, m.fd.clone().unwrap_or_default())],
                })
                .collect();
            // Only KubeadmControlPlane removes the etcd member of a deleted Machine (its
            // pre-terminate hook); while this run keeps it paused, the members whose Machines
            // were deleted to crash them are still etcd members.
            if self.paused {
                for m in self.model.members.values().filter(|m| self.model.has_process(m) == Answers::No && !self.bindings.contains_key(&m.id)) {
                    list.push(ListedMember { id: 1000 + m.id.0 as u64, name: m.id.to_string(), peer_urls: vec!["machine deleted, KubeadmControlPlane paused".into()] });
                }
            }
            obs.member_list = Some(list);
        }
    }
}

/// The result of a command with a timeout.
pub struct CommandResult {
    pub exit: Option<i32>,
    pub ms: u64,
    pub stdout: String,
    pub stderr: String,
    /// `None` when it exited 0 in time.
    pub error: Option<String>,
}

pub async fn run_command(cmd: &[String], env: &[(String, String)], timeout: Duration) -> CommandResult {
    let t0 = std::time::Instant::now();
    let Some((prog, args)) = cmd.split_first() else {
        return CommandResult { exit: None, ms: 0, stdout: String::new(), stderr: String::new(), error: Some("empty command".into()) };
    };
    let mut c = tokio::process::Command::new(prog);
    c.args(args).envs(env.iter().cloned()).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let s = s.trim();
        if s.len() > 4000 {
            s[s.len() - 4000..].to_string()
        } else {
            s.to_string()
        }
    };
    match tokio::time::timeout(timeout, c.output()).await {
        Err(_) => CommandResult { exit: None, ms: t0.elapsed().as_millis() as u64, stdout: String::new(), stderr: String::new(), error: Some(format!("no exit within {}s (killed)", timeout.as_secs())) },
        Ok(Err(e)) => CommandResult { exit: None, ms: t0.elapsed().as_millis() as u64, stdout: String::new(), stderr: String::new(), error: Some(format!("cannot run {prog}: {e}")) },
        Ok(Ok(out)) => {
            let code = out.status.code();
            let (stdout, stderr) = (tail(&out.stdout), tail(&out.stderr));
            let error = (!out.status.success()).then(|| format!("exit {} ({})", code.map_or("by signal".into(), |c| c.to_string()), if stderr.is_empty() { &stdout } else { &stderr }));
            CommandResult { exit: code, ms: t0.elapsed().as_millis() as u64, stdout, stderr, error }
        }
    }
}

/// GET `url`; `Ok` on a 2xx answer within `timeout`.
pub async fn http_get(url: &str, insecure: bool, timeout: Duration) -> Result<(), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("invalid URL: {e}"))?;
    let mut http = hyper::client::HttpConnector::new();
    http.enforce_http(false);
    let mut ssl = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls()).map_err(|e| e.to_string())?;
    if insecure {
        ssl.set_verify(openssl::ssl::SslVerifyMode::NONE);
    }
    let https = hyper_openssl::HttpsConnector::with_connector(http, ssl).map_err(|e| e.to_string())?;
    let client: hyper::Client<_, hyper::Body> = hyper::Client::builder().build(https);
    match tokio::time::timeout(timeout, client.get(uri)).await {
        Err(_) => Err(format!("no answer within {}ms", timeout.as_millis())),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(r)) if r.status().is_success() => Ok(()),
        Ok(Ok(r)) => Err(format!("status {}", r.status())),
    }
}

impl Target for KubeTarget {
    fn name(&self) -> &'static str {
        "kube"
    }

    fn component_versions(&self) -> BTreeMap<String, String> {
        let mut v = self.versions.clone();
        if let Some(k) = self.current_kcp_version() {
            v.insert("kubernetes".into(), k);
        }
        v
    }

    fn supports(&self, op: &Op) -> Result<(), String> {
        if self.cfg.profile.hooks.contains_key(&op.kind()) {
            return Ok(());
        }
        let one_at_a_time = || {
            if self.model.down() == 0 && self.model.outages.is_empty() {
                Ok(())
            } else {
                Err("the kube target deletes Machines for one fault at a time (KubeadmControlPlane replaces every missing Machine once resumed); set a hook in the kube profile for more".to_string())
            }
        };
        match op {
            Op::Crash { .. } => one_at_a_time(),
            Op::SiteOutage { mode: OutageMode::PowerLoss, .. } => one_at_a_time(),
            Op::SiteOutage { mode: OutageMode::Isolate, .. } => Err("cutting a failure domain's network is provider-specific: set [hooks.site-outage] and [hooks.site-recover] in the kube profile".into()),
            Op::Restart { .. } | Op::SiteRecover { .. } | Op::RollingReplace => Ok(()),
            Op::RollingUpgrade { to } => match self.cfg.profile.versions.contains_key(to) {
                true => Ok(()),
                false => Err(format!("the kube profile names no Kubernetes version for {to}: add [versions.\"{to}\"] kubernetes = \"v1.x.y\"")),
            },
            Op::Pause { .. } | Op::Resume { .. } => Err("stopping an etcd member's process has no Cluster API counterpart: set [hooks.pause] and [hooks.resume] in the kube profile".into()),
            Op::DiskDetach { .. } | Op::DiskReattach { .. } => match &self.disk_pv {
                Err(why) => Err(format!("disk ops need [hooks.disk-detach] and [hooks.disk-reattach], or a [disk] volume in the workload cluster: {why}")),
                Ok(pv) if matches!(op, Op::DiskDetach { .. }) && self.model.members.values().any(|m| m.disk == shakedown_faults::DiskState::Detached) => {
                    Err(format!("the kube profile names one [disk] volume ({pv}), already detached: one disk at a time"))
                }
                Ok(_) => Ok(()),
            },
            Op::Backup | Op::Restore { .. } => match &self.velero {
                Err(why) => Err(format!("backup and restore need Velero or [hooks.backup] and [hooks.restore] in the kube profile: {why}")),
                Ok(()) if matches!(op, Op::Restore { .. }) && self.cfg.profile.hooks.contains_key(&OpKind::Backup) => {
                    Err("the backups were taken by [hooks.backup]: set [hooks.restore] too".into())
                }
                Ok(()) => Ok(()),
            },
        }
    }

    async fn execute(&mut self, op: &Op, before: &Model, after: &Model) -> Result<(), TargetError> {
        {
            let mut s = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
            s.start = Some(std::time::Instant::now());
            s.samples.clear();
        }
        if let Some(lost) = self.management_lost() {
            self.lost = Some(lost.clone());
            return Err(TargetError::Environment(format!("{op}: {lost}")));
        }
        let counts = self.counter.snapshot();
        self.model = before.clone();
        self.rebind();
        let res = self.execute_op(op, after).await;
        self.model = after.clone();
        self.rebind();
        self.events.push(("kube-requests".into(), json!({"op": op.to_string(), "non_watch_requests": self.counter.non_watch_since(&counts)})));
        res
    }

    async fn end_step(&mut self) {
        let mut s = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
        s.start = None;
        s.samples.clear();
    }

    async fn observe(&mut self, model: &Model, _invariants: &[InvariantId]) -> Observation {
        self.model = model.clone();
        self.rebind();
        let mut obs = Observation::default();
        self.observe_members(&mut obs);
        obs.probes = self.probes().await;
        {
            let s = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
            obs.serving_samples = s.samples.clone();
            obs.samples_until_ms = s.start.map(|t| t.elapsed().as_millis() as u64).unwrap_or(0);
        }
        obs.inventory = Some(Inventory { kube: Some(self.inventory()), haproxies: 1, ..Default::default() });
        obs
    }

    fn log_files(&self) -> Vec<(String, std::path::PathBuf)> {
        // The stack's logs are on its machines; hook output is in the event log.
        Vec::new()
    }

    fn workload_stats(&self) -> Value {
        json!({"machines": self.bindings.len(), "requests": self.counter.snapshot().values().sum::<u64>()})
    }

    fn take_events(&mut self) -> Vec<(String, Value)> {
        std::mem::take(&mut self.events)
    }

    fn lost(&self) -> Option<String> {
        self.management_lost().map(|why| format!("lost the management cluster during the run ({why}); what the run created may remain: run `shakedown reap --kube` once the apiserver is back"))
    }

    async fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        // Bounded: an apiserver that stopped answering must not hold the run (reap finishes the job).
        if tokio::time::timeout(TEARDOWN_BOUND, self.teardown_objects()).await.is_err() {
            tracing::warn!("teardown did not finish within {}s; `shakedown reap --kube` removes what is left", TEARDOWN_BOUND.as_secs());
        }
    }
}

/// How long teardown may take before the run ends anyway.
const TEARDOWN_BOUND: Duration = Duration::from_secs(60);

impl KubeTarget {
    /// Resumes KCP if this run paused it; deletes the run's Velero objects and its ConfigMap.
    async fn teardown_objects(&mut self) {
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

impl KubeTarget {
    async fn execute_op(&mut self, op: &Op, after: &Model) -> Result<(), TargetError> {
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
                let v = self.cfg.profile.versions.get(to).cloned().ok_or_else(|| TargetError::Unsupported(format!("no Kubernetes version for {to} in the kube profile")))?;
                let mut spec = json!({"version": v.kubernetes});
                if let Some(tpl) = &v.machine_template {
                    let (group, kind) = self.infra_ref.clone().ok_or_else(|| TargetError::Stack("KubeadmControlPlane has no spec.machineTemplate.spec.infrastructureRef".into()))?;
                    spec["machineTemplate"] = json!({"spec": {"infrastructureRef": {"apiGroup": group, "kind": kind, "name": tpl}}});
                }
                self.send(Write::Patch { ar: self.kcp_ar.clone(), ns: ns.clone(), name: self.kcp_name.clone(), body: json!({"spec": spec}) }).await?;
                let mds: Vec<String> = self.cache.deployments.objects().iter().filter_map(|d| d.metadata.name.clone()).collect();
                for md in mds {
                    let body = json!({"spec": {"template": {"spec": {"version": v.kubernetes}}}});
                    self.send(Write::Patch { ar: capi("MachineDeployment"), ns: ns.clone(), name: md, body }).await?;
                }
                self.model = after.clone();
                let timeout = self.op_timeout;
                self.wait_until(&format!("rollout to {} complete", v.kubernetes), timeout, |t| t.settled()).await
            }
            Op::RollingReplace => {
                let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
                self.send(Write::Patch { ar: self.kcp_ar.clone(), ns, name: self.kcp_name.clone(), body: json!({"spec": {"rollout": {"after": now}}}) }).await?;
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
            other => Err(TargetError::Unsupported(self.supports(other).err().unwrap_or_else(|| format!("{other} is not supported by the kube target")))),
        }
    }

    /// Waits until the Machine watch cache satisfies `pred`; `false` when `timeout` ran out.
    /// For tests and measurements (no requests: the cache is kept by the watch).
    pub async fn wait_machines(&self, timeout: Duration, pred: impl Fn(&[Arc<DynamicObject>]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut changed = self.cache.changed.clone();
        loop {
            if pred(&self.cache.machines.objects()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                return false;
            }
        }
    }

    /// For tests and the measurement: the underlying client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `true` when the op kind has a hook in the kube profile.
    pub fn has_hook(&self, kind: OpKind) -> bool {
        self.cfg.profile.hooks.contains_key(&kind)
    }
}
