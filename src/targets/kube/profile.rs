//! The kube profile: what the kube target needs to know about a provider's stack beyond the
//! plan's profile — Kubernetes versions for the plan's versions, failure domains in site order,
//! command hooks for what only the provider can do, probes and profile-defined checks.
//! TOML, `--kube-profile FILE`; see docs/kube-target.md.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shakedown_faults::profile::duration_schema;
use shakedown_faults::{OpKind, Version};

/// What the kube target needs to know about a provider's stack beyond the plan's profile
/// (`--kube-profile FILE`, TOML; unknown fields are an error). Every field is optional: a run
/// without a kube profile maps the plan's ops onto Cluster API objects alone, and skips, with
/// the reason, the ops that need something named here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KubeProfile {
    /// Plan version (`"3.5"`, one of the profile's `versions`) → what a rolling upgrade to it
    /// sets (`[versions."3.5"]`). An upgrade to a version not listed is skipped with the reason.
    #[serde(default)]
    #[schemars(extend("x-key" = "version"))]
    pub versions: BTreeMap<Version, KubeVersion>,
    /// The failure domains standing for the plan's sites, in site order. Default: the Cluster's
    /// `status.failureDomains`, else those of its control-plane Machines, sorted.
    #[serde(default)]
    pub failure_domains: Vec<String>,
    /// InfraMachine kinds to take inventory of for `leaks` (one without a Machine is a leak), as
    /// `Kind.group/version` (e.g. `DevMachine.infrastructure.cluster.x-k8s.io/v1beta2`). Empty:
    /// InfraMachines are not inventoried.
    #[serde(default)]
    pub infra_machine_kinds: Vec<String>,
    /// Command hooks by op kind (`[hooks.site-outage]`, `[hooks.crash]`, `[hooks.backup]`, …): run
    /// instead of the generic Cluster API mapping, or for ops that have none (`pause`,
    /// `resume`, `site-outage` with `isolate`, `disk-replace`).
    #[serde(default)]
    #[schemars(extend("x-key" = "op kind"))]
    pub hooks: BTreeMap<OpKind, Hook>,
    /// HTTP probes for `reachability` (`[[probes]]`: the workload API server's `/readyz`, a
    /// LoadBalancer Service). With no probes, conditions or commands, `reachability` is not
    /// checked (said in a note).
    #[serde(default)]
    pub probes: Vec<HttpProbe>,
    /// Profile-defined condition checks (`[[conditions]]`: a provider's own condition on any
    /// object, read from a watch cache), reported under `reachability`.
    #[serde(default)]
    pub conditions: Vec<ConditionCheck>,
    /// Profile-defined command probes (`[[commands]]`: pass when the command exits 0 within its
    /// timeout), reported under `reachability`.
    #[serde(default)]
    pub commands: Vec<Hook>,
    /// The probe workload's volume that `disk-detach` / `disk-reattach` act on (in the workload
    /// cluster), when no hooks are set for them. Absent: the disk ops are skipped unless hooked.
    #[serde(default)]
    pub disk: Option<DiskSpec>,
    /// Velero on the management cluster, used for `backup` / `restore` when its CRDs are
    /// installed and no hooks are set for them (without either, they are skipped). Fields left
    /// out keep their defaults.
    #[serde(default)]
    pub velero: VeleroSpec,
    /// The bounds of the kube target's waits (`[timeouts]`); fields left out keep their
    /// defaults. The plan profile's `[timeouts]` bound the checks as on every target.
    #[serde(default)]
    pub timeouts: KubeTimeouts,
    /// Kubernetes API traffic in the workload cluster during the run (`[api]`), judged by
    /// `api-durability`, `api-watch`, `api-linearizability` and `api-reachability`. Absent: no API traffic, and those
    /// invariants are not checked (said in a note).
    #[serde(default)]
    pub api: Option<ApiSpec>,
    /// Read the workload cluster's etcd members directly, as Cluster API does (`[etcd]`): the
    /// etcd CA of the Cluster's `<name>-etcd` Secret signs the run's client certificate, and
    /// each control-plane member is reached by a port-forward to its etcd pod, read-only
    /// (status, member list, HashKV). `members`, `quorum` and `membership` then judge etcd's own
    /// answers, and `consistency` is checked. Absent: etcd's health comes from Cluster API's
    /// conditions and `consistency` is not checked (said in a note).
    #[serde(default)]
    pub etcd: Option<EtcdSpec>,
}

/// `[etcd]`: where the workload cluster's etcd members and their CA are (the defaults are
/// Cluster API's and kubeadm's layout).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdSpec {
    /// The Secret on the management cluster, in the Cluster's namespace, holding the etcd CA
    /// (`tls.crt`, `tls.key`). Absent: `<cluster name>-etcd`, Cluster API's name.
    pub secret: Option<String>,
    /// The workload cluster's namespace of the etcd pods (`etcd-<node name>`, kubeadm's static
    /// pods).
    pub namespace: String,
    /// The port the members serve clients on, inside their pods.
    pub port: u16,
    /// The bound of one request to a member (the port-forward, TLS and the answer).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub timeout: Duration,
}

impl Default for EtcdSpec {
    fn default() -> Self {
        EtcdSpec { secret: None, namespace: "kube-system".into(), port: 2379, timeout: Duration::from_secs(5) }
    }
}

/// `[api]`: the API workload in the workload cluster (reached through the kubeconfig in the
/// Cluster's `<name>-kubeconfig` Secret, i.e. through the control-plane endpoint).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiSpec {
    /// An existing namespace of the workload cluster to write in (the run deletes only its own
    /// ConfigMaps there). Absent: the run creates `shakedown-<run id>`, labelled with the run id,
    /// and deletes it at teardown.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Whether `restore` restores the workload cluster's API data (a restore hook that restores
    /// its etcd from the backup hook's snapshot): what was acknowledged after the backup must
    /// then be gone. `false` (the default): restores act elsewhere (Velero restores the
    /// management cluster's namespace), and every acknowledged write must stay.
    #[serde(default)]
    pub restores_api: bool,
    /// The clients and watches (`[api.load]`); fields left out keep their defaults.
    #[serde(default)]
    pub load: shakedown_faults::ApiLoad,
}

/// `[disk]`: the PersistentVolume of a probe workload in the workload cluster, named by its
/// claim (`pvc = "namespace/name"`) or directly (`pv = "name"`). `disk-detach` deletes its
/// VolumeAttachment; `disk-reattach` waits until a new one is attached (the attach/detach
/// controller and the CSI attacher recreate it while a pod uses the volume).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    /// The PersistentVolumeClaim whose bound volume is used, as `"namespace/name"` in the
    /// workload cluster. Exactly one of `pvc` and `pv`.
    #[serde(default)]
    pub pvc: Option<String>,
    /// The PersistentVolume's name in the workload cluster. Exactly one of `pvc` and `pv`.
    #[serde(default)]
    pub pv: Option<String>,
    /// How long a detach (the VolumeAttachment gone) or a reattach (a new one attached) may take.
    #[schemars(schema_with = "duration_schema")]
    #[serde(with = "human", default = "default_disk_timeout")]
    pub timeout: Duration,
}

/// `[velero]`: where Velero's objects go and how long they may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct VeleroSpec {
    /// The namespace Velero watches for Backups and Restores; shakedown creates them there.
    pub namespace: String,
    /// `spec.storageLocation` of the Backups. Absent: Velero's default location.
    pub storage_location: Option<String>,
    /// `spec.ttl` of the Backups: Velero removes a Backup (object and data) after it.
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub ttl: Duration,
    /// How long a Backup or Restore may take to reach `Completed`; longer, or `Failed`,
    /// `PartiallyFailed`, `FailedValidation`, is a liveness failure (exit 3).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub timeout: Duration,
}

impl Default for VeleroSpec {
    fn default() -> Self {
        VeleroSpec {
            namespace: "velero".into(),
            storage_location: None,
            ttl: Duration::from_secs(24 * 3600),
            timeout: Duration::from_secs(1800),
        }
    }
}

/// `[versions."V"]`: what a `rolling-upgrade` to the plan's version V writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KubeVersion {
    /// The Kubernetes version written to the KubeadmControlPlane's `spec.version` and every
    /// MachineDeployment's `spec.template.spec.version` (`"v1.30.1"`).
    pub kubernetes: String,
    /// The machine template (same kind and group as the current one) the control plane moves
    /// to, written to `spec.machineTemplate.spec.infrastructureRef.name`. Absent: the template
    /// is left as it is.
    #[serde(default)]
    pub machine_template: Option<String>,
}

/// A command with a timeout. Its output goes to the event log. Environment: `SHAKEDOWN_OP`,
/// `SHAKEDOWN_RUN_ID`, `SHAKEDOWN_CLUSTER` (`ns/name`), and per op `SHAKEDOWN_MEMBER`,
/// `SHAKEDOWN_MACHINE`, `SHAKEDOWN_SITE`, `SHAKEDOWN_FAILURE_DOMAIN`, `SHAKEDOWN_MODE`,
/// `SHAKEDOWN_BACKUP`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Hook {
    /// The program and its arguments (not a shell line: `["sh", "-c", "…"]` for one); not empty.
    pub command: Vec<String>,
    /// How long the command may run; it is killed then. A hook that exits non-zero or runs out
    /// of time ends the run as an environment failure (exit 4); a command probe fails its check.
    #[schemars(schema_with = "duration_schema")]
    #[serde(with = "human", default = "default_hook_timeout")]
    pub timeout: Duration,
}

/// `[[probes]]`: an HTTP GET that passes on a 2xx answer within its timeout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpProbe {
    /// The URL to GET (`https://my-cluster.example:6443/readyz`).
    pub url: String,
    /// Accept any serving certificate (self-signed test endpoints).
    #[serde(default)]
    pub insecure: bool,
    /// Trust the CA certificates of this PEM file (instead of the system's roots) for the
    /// serving certificate of an `https` URL. Read when the run connects: a missing or empty
    /// file is a usage error (exit 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Deadline of one probe request.
    #[schemars(schema_with = "duration_schema")]
    #[serde(with = "human", default = "default_probe_timeout")]
    pub timeout: Duration,
}

/// A condition on any object: `group/version`, `kind`, `plural`, a `name` or a label
/// `selector`, the condition `type` and its expected `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConditionCheck {
    /// The object's `group/version` (`"infrastructure.cluster.x-k8s.io/v1beta2"`).
    pub api_version: String,
    /// The object's kind (`"DevCluster"`).
    pub kind: String,
    /// The resource's plural name, as in its URL (`"devclusters"`).
    pub plural: String,
    /// The object's namespace on the management cluster. Absent: the Cluster's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The object's name. Exactly one of `name` and `selector`.
    #[serde(default)]
    pub name: Option<String>,
    /// A label selector (`"app=probe"`): every object it selects must have the condition.
    /// Exactly one of `name` and `selector`.
    #[serde(default)]
    pub selector: Option<String>,
    /// The condition's `type` (`"Ready"`).
    #[serde(rename = "type")]
    pub type_: String,
    /// The condition's expected `status`.
    #[serde(default = "default_true")]
    pub status: String,
}

impl ConditionCheck {
    /// The API resource the check reads.
    pub fn resource(&self) -> kube::api::ApiResource {
        let (group, version) = self.api_version.rsplit_once('/').unwrap_or(("", self.api_version.as_str()));
        kube::api::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }
}

/// `[timeouts]` of the kube profile: the bounds of the kube target's own waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KubeTimeouts {
    /// How long an op's rollout may take (upgrade, replace, the replacement Machines after a
    /// crash or power loss), until every member stands on a healthy Machine; longer is a
    /// liveness failure (exit 3).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub rollout: Duration,
    /// How long the watch caches may take to fill at start; longer is an environment failure
    /// (exit 4).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub sync: Duration,
    /// How long a watch may keep failing during a wait before the run ends: the management (or
    /// workload) cluster is gone (exit 4).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub unreachable: Duration,
}

impl Default for KubeTimeouts {
    fn default() -> Self {
        KubeTimeouts { rollout: Duration::from_secs(600), sync: Duration::from_secs(30), unreachable: Duration::from_secs(30) }
    }
}

/// How long a disk op waits for its VolumeAttachment when `[disk]` sets no `timeout`.
pub const DEFAULT_DISK_TIMEOUT: Duration = Duration::from_secs(300);

fn default_disk_timeout() -> Duration {
    DEFAULT_DISK_TIMEOUT
}

fn default_hook_timeout() -> Duration {
    Duration::from_secs(120)
}
fn default_probe_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_true() -> String {
    "True".into()
}

pub(crate) use crate::clock::human;

/// Why a kube profile was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read kube profile {}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or not the profile's fields.
    #[error("kube profile is not valid: {0}")]
    Parse(#[source] toml::de::Error),
    /// It parses but breaks a rule (`detail` says which).
    #[error("kube profile: {detail}")]
    Invalid { detail: String },
}

fn invalid(detail: String) -> ProfileError {
    ProfileError::Invalid { detail }
}

impl KubeProfile {
    pub fn from_toml(text: &str) -> Result<KubeProfile, ProfileError> {
        let p: KubeProfile = toml::from_str(text).map_err(ProfileError::Parse)?;
        p.validate()?;
        Ok(p)
    }

    /// The rules a kube profile must keep beyond its shape, checked offline: what `from_toml` and a
    /// seed record's embedded copy are both held to.
    pub fn validate(&self) -> Result<(), ProfileError> {
        for (op, h) in
            self.hooks.iter().map(|(k, h)| (k.to_string(), h)).chain(self.commands.iter().map(|h| ("command probe".to_string(), h)))
        {
            if h.command.is_empty() {
                return Err(invalid(format!("the {op} command is empty")));
            }
        }
        // A bound of zero fails every wait at once, and a probe URL that is no URL fails only
        // after connecting: both refused here, offline.
        let t = &self.timeouts;
        let bounds = [("[timeouts] rollout", t.rollout), ("[timeouts] sync", t.sync), ("[timeouts] unreachable", t.unreachable)]
            .into_iter()
            .map(|(n, d)| (n.to_string(), d))
            .chain(self.hooks.iter().map(|(k, h)| (format!("[hooks.{k}] timeout"), h.timeout)))
            .chain(self.commands.iter().map(|h| ("[[commands]] timeout".to_string(), h.timeout)))
            .chain(self.probes.iter().map(|h| (format!("the timeout of probe {}", h.url), h.timeout)));
        for (name, d) in bounds {
            if d.is_zero() {
                return Err(invalid(format!("{name} must be more than zero")));
            }
        }
        for probe in &self.probes {
            let uri: Option<http::Uri> = probe.url.parse().ok();
            let web =
                uri.as_ref().is_some_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some_and(|h| !h.is_empty()));
            if !web {
                return Err(invalid(format!(
                    "probe url = {:?} is not an http:// or https:// URL with a host (e.g. \"https://my-cluster.example:6443/readyz\")",
                    probe.url
                )));
            }
        }
        for c in &self.conditions {
            if c.name.is_some() == c.selector.is_some() {
                return Err(invalid(format!("condition check {} {} needs exactly one of name and selector", c.kind, c.type_)));
            }
        }
        if let Some(d) = &self.disk {
            if d.pvc.is_some() == d.pv.is_some() {
                return Err(invalid("[disk] needs exactly one of pvc = \"namespace/name\" and pv = \"name\"".into()));
            }
            if d.pvc
                .as_ref()
                .is_some_and(|c| !matches!(c.split_once('/'), Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/')))
            {
                return Err(invalid(format!("[disk] pvc = {:?}: expected \"namespace/name\"", d.pvc.clone().unwrap_or_default())));
            }
        }
        if let Some(problem) = self.api.as_ref().and_then(|a| a.load.problem("[api.load]")) {
            return Err(invalid(problem.to_string()));
        }
        Ok(())
    }

    pub fn load(path: &std::path::Path) -> Result<KubeProfile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read { path: path.to_path_buf(), source })?;
        KubeProfile::from_toml(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_bounds_and_probe_urls_that_are_no_urls_are_refused_offline() {
        for (toml, want) in [
            ("[timeouts]\nrollout = \"0s\"\n", "[timeouts] rollout must be more than zero"),
            ("[timeouts]\nunreachable = \"0s\"\n", "[timeouts] unreachable must be more than zero"),
            ("[[probes]]\nurl = \"https://a.example/readyz\"\ntimeout = \"0s\"\n", "the timeout of probe https://a.example/readyz"),
            ("[[commands]]\ncommand = [\"true\"]\ntimeout = \"0s\"\n", "[[commands]] timeout must be more than zero"),
            ("[[probes]]\nurl = \"not a url\"\n", "probe url = \"not a url\" is not an http:// or https:// URL"),
            ("[[probes]]\nurl = \"ftp://a.example/\"\n", "is not an http:// or https:// URL"),
            ("[[probes]]\nurl = \"/readyz\"\n", "is not an http:// or https:// URL"),
        ] {
            let err = KubeProfile::from_toml(toml).unwrap_err().to_string();
            assert!(err.contains(want), "{toml}: {err}");
        }
        assert!(KubeProfile::from_toml("[[probes]]\nurl = \"http://127.0.0.1:8080/healthz\"\n").is_ok());
    }

    #[test]
    fn parses_a_full_profile() {
        let p = KubeProfile::from_toml(
            r#"
failure_domains = ["fd-a", "fd-b", "fd-c"]
infra_machine_kinds = ["DevMachine.infrastructure.cluster.x-k8s.io/v1beta2"]
[versions."3.5"]
kubernetes = "v1.30.1"
machine_template = "dev-1-30"
[hooks.site-outage]
command = ["sh", "-c", "echo down $SHAKEDOWN_FAILURE_DOMAIN"]
timeout = "30s"
[[probes]]
url = "https://127.0.0.1:6443/readyz"
insecure = true
[[conditions]]
api_version = "infrastructure.cluster.x-k8s.io/v1beta2"
kind = "DevCluster"
plural = "devclusters"
name = "c1"
type = "Ready"
[[commands]]
command = ["true"]
"#,
        )
        .unwrap();
        assert_eq!(p.versions[&Version::new(3, 5)].kubernetes, "v1.30.1");
        assert_eq!(p.hooks[&OpKind::SiteOutage].timeout, Duration::from_secs(30));
        assert_eq!(p.conditions[0].status, "True");
        assert_eq!(p.timeouts.rollout, Duration::from_secs(600));
    }

    #[test]
    fn disk_and_velero_sections() {
        let p = KubeProfile::from_toml("[disk]\npvc = \"probe/data\"\ntimeout = \"30s\"\n[velero]\nnamespace = \"backup\"\nttl = \"1h\"")
            .unwrap();
        let d = p.disk.unwrap();
        assert_eq!((d.pvc.as_deref(), d.timeout), (Some("probe/data"), Duration::from_secs(30)));
        assert_eq!(
            (p.velero.namespace.as_str(), p.velero.ttl, p.velero.timeout),
            ("backup", Duration::from_secs(3600), Duration::from_secs(1800))
        );
        assert_eq!(KubeProfile::default().velero.namespace, "velero");
        assert!(KubeProfile::from_toml("[disk]\n").unwrap_err().to_string().contains("exactly one of pvc"));
        assert!(KubeProfile::from_toml("[disk]\npvc = \"a\"\npv = \"b\"").unwrap_err().to_string().contains("exactly one of pvc"));
        assert!(KubeProfile::from_toml("[disk]\npvc = \"nons\"").unwrap_err().to_string().contains("expected \"namespace/name\""));
    }

    #[test]
    fn rejects_unknown_fields_and_empty_commands() {
        assert!(KubeProfile::from_toml("nope = 1").unwrap_err().to_string().contains("unknown field"));
        assert!(KubeProfile::from_toml("[hooks.crash]\ncommand = []").unwrap_err().to_string().contains("crash command is empty"));
    }
}
