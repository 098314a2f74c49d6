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
//! - pause, resume, disk-replace (and any op, instead of the above): command hooks from the kube
//!   profile, else unsupported (the engine skips them, with the reason).
//!
//! The workload cluster (Nodes, PersistentVolumes, VolumeAttachments) is reached through the
//! kubeconfig in the Cluster's `<name>-kubeconfig` Secret; without it those checks are skipped
//! with a note.
//!
//! Waiting and observing read watch caches (kube-runtime reflectors): no polling requests.
//! Architecture invariant: like every target, this one observes; `shakedown-invariants` judges.

pub mod api;
mod cache;
pub mod capi;
pub mod command;
pub mod conditions;
mod connect;
pub mod etcd;
pub mod etcd_view;
mod observe;
mod ops;
pub mod profile;
pub mod reap;
pub mod spec;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject};
use kube::Client;
use serde_json::{json, Value};
use shakedown_faults::{MemberId, Model, Op, OpKind};
use shakedown_invariants::{InvariantId, Observation};
use tokio::time::Instant;

use self::cache::{cp_machines, Cache, CpMachine, Sampler};
use self::capi::CapiVersion;
use self::command::run_command;
use self::ops::TEARDOWN_BOUND;
use self::profile::KubeProfile;
use super::{Coverage, StartContext, Started, Target, TargetError};
use crate::exit::Fatal;
use crate::k8s::client::RequestCounter;
pub use spec::{KubeOptions, KubeSpec};

pub use crate::k8s::{OPT_IN, RUN_LABEL};
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

impl From<crate::k8s::client::ConnectError> for KubeError {
    fn from(e: crate::k8s::client::ConnectError) -> KubeError {
        match e {
            crate::k8s::client::ConnectError::Usage(m) => KubeError::Usage(m),
            crate::k8s::client::ConnectError::Environment(m) => KubeError::Environment(m),
        }
    }
}

/// What a cluster does not offer that some ops need: Velero's kinds on the management cluster,
/// the PersistentVolume of the `[disk]` claim in the workload cluster.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A request to find out failed (`what` says which).
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Velero's CRDs (backups.velero.io, restores.velero.io) are not installed on the management cluster")]
    NoVelero,
    #[error("Velero's CRD {plural}.velero.io is not installed on the management cluster")]
    NoVeleroKind { plural: &'static str },
    #[error("[disk] pvc {claim:?}: expected namespace/name")]
    BadClaim { claim: String },
    #[error("PersistentVolumeClaim {claim} is not bound to a PersistentVolume (spec.volumeName empty)")]
    Unbound { claim: String },
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
    /// Where the run writes its files (the API workload's samples); `None`: nowhere.
    pub run_dir: Option<PathBuf>,
}

/// A write the target makes — or, with `--dry-run`, prints instead.
#[derive(Debug, Clone)]
pub enum Write {
    /// A JSON merge patch.
    Patch {
        ar: ApiResource,
        ns: String,
        name: String,
        body: Value,
    },
    Delete {
        ar: ApiResource,
        ns: String,
        name: String,
    },
    Create {
        ar: ApiResource,
        ns: String,
        body: Value,
    },
    /// A cluster-scoped object in the workload cluster, deleted only while it has `uid`.
    DeleteInWorkload {
        ar: ApiResource,
        name: String,
        uid: String,
    },
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
        kube::Error::Api(r) if r.code == 403 => TargetError::Environment(format!(
            "{what}: forbidden ({}): give the identity of the kubeconfig the RBAC of ci/k8s/rbac.yaml",
            r.message
        )),
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
pub(crate) async fn probe_velero(client: &Client) -> Result<(), DiscoveryError> {
    let kube = |what: &str| {
        let what = what.to_string();
        move |source| DiscoveryError::Kube { what, source }
    };
    let groups = client.list_api_groups().await.map_err(kube("cannot list the management cluster's API groups"))?;
    if !groups.groups.iter().any(|g| g.name == "velero.io" && g.versions.iter().any(|v| v.version == "v1")) {
        return Err(DiscoveryError::NoVelero);
    }
    let resources = client.list_api_group_resources("velero.io/v1").await.map_err(kube("cannot list the kinds of velero.io/v1"))?;
    for plural in ["backups", "restores"] {
        if !resources.resources.iter().any(|r| r.name == plural) {
            return Err(DiscoveryError::NoVeleroKind { plural });
        }
    }
    Ok(())
}

pub struct KubeTarget {
    client: Client,
    /// Every request sent, by verb and resource.
    pub counter: RequestCounter,
    cfg: KubeConfig,
    kcp_name: String,
    kcp_ar: ApiResource,
    /// The Cluster API version the management cluster serves (discovered at connect).
    capi_version: CapiVersion,
    /// KubeadmControlPlane's infrastructure machine template reference, as found at connect.
    infra_ref: Option<serde_json::Value>,
    /// One HTTP client per probe of the kube profile (same order), built at connect.
    probers: Vec<command::HttpProber>,
    site_fds: Vec<String>,
    cache: Cache,
    bindings: BTreeMap<MemberId, String>,
    model: Model,
    sampler: Arc<Mutex<Sampler>>,
    log: Vec<crate::targets::Note>,
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
    /// The request counts once connected: everything after is a step's (see `reads_since_connect`).
    connected: BTreeMap<String, u64>,
    /// The API workload in the workload cluster, or why there is none.
    api: Result<api::KubeApi, String>,
    /// etcd read through Cluster API's path (`[etcd]`), or why it is not.
    etcd: Result<etcd_view::EtcdView, String>,
}

impl KubeTarget {
    /// Connects to the Cluster `spec` names (see [`KubeTarget::connect`]).
    pub async fn start_spec(spec: &KubeSpec, ctx: &StartContext<'_>) -> Result<KubeTarget, Fatal> {
        crate::targets::stack_fits(crate::targets::TargetKind::Kube, ctx.profile)?;
        let (ns, name) = spec.namespace_name();
        let cfg = KubeConfig {
            kubeconfig: ctx.options.kube.kubeconfig.clone(),
            context: spec.context.clone(),
            namespace: ns.into(),
            name: name.into(),
            dry_run: ctx.options.kube.dry_run,
            profile: spec.kube_profile.clone(),
            run_id: ctx.run_id.into(),
            run_dir: Some(ctx.run_dir.to_path_buf()),
        };
        KubeTarget::connect(cfg, ctx.profile, ctx.model).await.map_err(spec::fatal)
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

    /// GET and LIST requests made since the target connected, by resource. Waiting and
    /// observing read watch caches, so this stays empty unless a watch had to relist.
    pub fn reads_since_connect(&self) -> BTreeMap<String, u64> {
        self.counter.non_watch_since(&self.connected).into_iter().filter(|(k, _)| k.starts_with("GET ") || k.starts_with("LIST ")).collect()
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

#[async_trait::async_trait]
impl Target for KubeTarget {
    fn name(&self) -> &'static str {
        "kube"
    }

    fn started(&self) -> Started {
        let bindings: Vec<String> = self.bindings.iter().map(|(m, n)| format!("{m}={n}")).collect();
        Started { line: format!("members {}", bindings.join(" ")), fields: json!({"bindings": bindings}), notes: self.notes.clone() }
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    fn coverage(&self, id: InvariantId) -> Coverage {
        let p = &self.cfg.profile;
        match id {
            InvariantId::Membership | InvariantId::Leaks | InvariantId::Members | InvariantId::Quorum => Coverage::Checked,
            InvariantId::Consistency => match &self.etcd {
                Ok(_) => Coverage::Checked,
                Err(why) => Coverage::Unchecked(why.clone()),
            },
            InvariantId::Durability | InvariantId::Watch | InvariantId::Leases | InvariantId::Linearizability => Coverage::Unchecked(
                "needs etcd KV traffic, which the kube target never sends (its [etcd] reads are read-only; [api] checks the API's durability and watches)".into(),
            ),
            InvariantId::ApiReachability | InvariantId::ApiDurability | InvariantId::ApiWatch | InvariantId::ApiLinearizability => {
                match &self.api {
                    Ok(_) => Coverage::Checked,
                    Err(why) => Coverage::Unchecked(why.clone()),
                }
            }
            InvariantId::AppReady | InvariantId::AppDurability | InvariantId::AppLinearizability => {
                Coverage::Unchecked("only the application target (--target app) checks an application".into())
            }
            InvariantId::Reachability if p.probes.is_empty() && p.commands.is_empty() && p.conditions.is_empty() => {
                Coverage::Unchecked("needs [[probes]], [[commands]] or [[conditions]] in the kube profile".into())
            }
            InvariantId::Reachability => Coverage::Checked,
        }
    }

    fn interrupted(&self) -> &'static str {
        "interrupted: shakedown's objects were removed and the control plane resumed"
    }

    fn component_versions(&self) -> BTreeMap<String, String> {
        let mut v = self.versions.clone();
        if let Some(k) = self.current_kcp_version() {
            v.insert("kubernetes".into(), k);
        }
        v
    }

    fn supports(&self, op: &Op) -> Result<(), super::Unsupported> {
        self.supports_op(op)
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
        // Backups and restores that act on the API's data move the API workload's marks.
        let marks_api = matches!(op, Op::Backup | Op::Restore { .. });
        let api_start = match &mut self.api {
            Ok(api) if marks_api && api.restores_api => {
                let at = api.workload.acked_len();
                if let Op::Restore { backup } = op {
                    api.workload.restore_begins(*backup, true);
                    api.workload.store_being_replaced();
                }
                Some(at)
            }
            Ok(_) | Err(_) => None,
        };
        let res = self.execute_op(op, after).await;
        if let (Ok(api), Some(start)) = (&mut self.api, api_start) {
            // Only a backup or a restore set `api_start`.
            if let Op::Backup = op {
                if let (Ok(()), Some(b)) = (&res, after.backups.last()) {
                    api.workload.backup_taken(*b, start);
                }
            } else {
                api.workload.store_replaced();
                api.workload.restore_ends(true);
            }
        }
        self.model = after.clone();
        self.rebind();
        self.log.push(crate::targets::Note {
            kind: "kube-requests".into(),
            detail: json!({"op": op.to_string(), "non_watch_requests": self.counter.non_watch_since(&counts)}),
        });
        res
    }

    async fn end_step(&mut self) {
        let mut s = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
        s.start = None;
        s.samples.clear();
    }

    async fn observe(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation {
        let mut obs = self.observation(model, invariants).await;
        if let Ok(api) = &self.api {
            if InvariantId::API.iter().any(|i| invariants.contains(i)) {
                obs.api = Some(api.observe(model, invariants).await);
            }
        }
        obs
    }

    fn log_files(&self) -> Vec<(String, std::path::PathBuf)> {
        // The stack's logs are on its machines; hook output is in the event log.
        Vec::new()
    }

    fn workload_stats(&self) -> Value {
        let mut v = json!({"machines": self.bindings.len(), "requests": self.counter.snapshot().values().sum::<u64>(), "reads_since_connect": self.reads_since_connect()});
        if let Ok(api) = &self.api {
            v["api"] = json!(api.workload.stats());
        }
        v
    }

    fn take_notes(&mut self) -> Vec<crate::targets::Note> {
        std::mem::take(&mut self.log)
    }

    fn lost(&self) -> Option<String> {
        self.management_lost().map(|why| format!("lost the management cluster during the run ({why}); what the run created may remain: run `shakedown reap --kube` once the apiserver is back"))
    }

    async fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        if self.cfg.dry_run {
            println!("dry run: {} write request(s) printed, none sent", self.dry_run_writes.len());
        }
        // Bounded: an apiserver that stopped answering must not hold the run (reap finishes the job).
        if tokio::time::timeout(TEARDOWN_BOUND, self.teardown_objects()).await.is_err() {
            tracing::warn!("teardown did not finish within {}s; `shakedown reap --kube` removes what is left", TEARDOWN_BOUND.as_secs());
        }
    }
}
