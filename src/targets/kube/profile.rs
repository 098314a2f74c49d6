//! The kube profile: what the kube target needs to know about a provider's stack beyond the
//! plan's profile — Kubernetes versions for the plan's versions, failure domains in site order,
//! command hooks for what only the provider can do, probes and profile-defined checks.
//! TOML, `--kube-profile FILE`; see the README.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shakedown_faults::{OpKind, Version};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeProfile {
    /// Plan version (`"3.5"`) → what a rolling upgrade to it sets.
    #[serde(default)]
    pub versions: BTreeMap<Version, KubeVersion>,
    /// The failure domains standing for the plan's sites, in site order. Default: the Cluster's
    /// `status.failureDomains`, else those of its control-plane Machines, sorted.
    #[serde(default)]
    pub failure_domains: Vec<String>,
    /// InfraMachine kinds to take inventory of, as `Kind.group/version`
    /// (e.g. `DevMachine.infrastructure.cluster.x-k8s.io/v1beta2`).
    #[serde(default)]
    pub infra_machine_kinds: Vec<String>,
    /// Command hooks by op name (`site-outage`, `crash`, `backup`, …): run instead of the
    /// generic Cluster API mapping, or for ops that have none.
    #[serde(default)]
    pub hooks: BTreeMap<OpKind, Hook>,
    /// HTTP probes for `reachability` (the workload API server's `/readyz`, a LoadBalancer Service).
    #[serde(default)]
    pub probes: Vec<HttpProbe>,
    /// Profile-defined condition checks, reported under `reachability`.
    #[serde(default)]
    pub conditions: Vec<ConditionCheck>,
    /// Profile-defined command probes (exit 0 within the timeout), reported under `reachability`.
    #[serde(default)]
    pub commands: Vec<Hook>,
    /// The probe workload's volume that `disk-detach` / `disk-reattach` act on (in the workload
    /// cluster), when no hooks are set for them.
    #[serde(default)]
    pub disk: Option<DiskSpec>,
    /// Velero on the management cluster, used for `backup` / `restore` when its CRDs are
    /// installed and no hooks are set for them.
    #[serde(default)]
    pub velero: VeleroSpec,
    #[serde(default)]
    pub timeouts: KubeTimeouts,
}

/// `[disk]`: the PersistentVolume of a probe workload in the workload cluster, named by its
/// claim (`pvc = "namespace/name"`) or directly (`pv = "name"`). `disk-detach` deletes its
/// VolumeAttachment; `disk-reattach` waits until a new one is attached (the attach/detach
/// controller and the CSI attacher recreate it while a pod uses the volume).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    #[serde(default)]
    pub pvc: Option<String>,
    #[serde(default)]
    pub pv: Option<String>,
    /// How long a detach (the VolumeAttachment gone) or a reattach (a new one attached) may take.
    #[serde(with = "human", default = "default_disk_timeout")]
    pub timeout: Duration,
}

/// `[velero]`: where Velero's objects go and how long they may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VeleroSpec {
    /// The namespace Velero watches for Backups and Restores.
    pub namespace: String,
    /// `spec.storageLocation` of the Backups (Velero's default location when unset).
    pub storage_location: Option<String>,
    /// `spec.ttl` of the Backups: Velero removes a Backup (object and data) after it.
    #[serde(with = "human")]
    pub ttl: Duration,
    /// How long a Backup or Restore may take to reach `Completed`.
    #[serde(with = "human")]
    pub timeout: Duration,
}

impl Default for VeleroSpec {
    fn default() -> Self {
        VeleroSpec { namespace: "velero".into(), storage_location: None, ttl: Duration::from_secs(24 * 3600), timeout: Duration::from_secs(1800) }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeVersion {
    /// The Kubernetes version for KubeadmControlPlane and MachineDeployments (`v1.30.1`).
    pub kubernetes: String,
    /// The machine template (same kind and group as the current one) the control plane moves to.
    #[serde(default)]
    pub machine_template: Option<String>,
}

/// A command with a timeout. Its output goes to the event log. Environment: `SHAKEDOWN_OP`,
/// `SHAKEDOWN_RUN_ID`, `SHAKEDOWN_CLUSTER` (`ns/name`), and per op `SHAKEDOWN_MEMBER`,
/// `SHAKEDOWN_MACHINE`, `SHAKEDOWN_SITE`, `SHAKEDOWN_FAILURE_DOMAIN`, `SHAKEDOWN_MODE`,
/// `SHAKEDOWN_BACKUP`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hook {
    pub command: Vec<String>,
    #[serde(with = "human", default = "default_hook_timeout")]
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpProbe {
    pub url: String,
    /// Accept any serving certificate (self-signed test endpoints).
    #[serde(default)]
    pub insecure: bool,
    #[serde(with = "human", default = "default_probe_timeout")]
    pub timeout: Duration,
}

/// A condition on any object: `group/version`, `kind`, `plural`, a `name` or a label
/// `selector`, the condition `type` and its expected `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionCheck {
    pub api_version: String,
    pub kind: String,
    pub plural: String,
    /// Defaults to the Cluster's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub selector: Option<String>,
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default = "default_true")]
    pub status: String,
}

impl ConditionCheck {
    /// The API resource the check reads.
    pub fn resource(&self) -> kube::api::ApiResource {
        let (group, version) = self.api_version.rsplit_once('/').unwrap_or(("", self.api_version.as_str()));
        kube::api::ApiResource { group: group.into(), version: version.into(), api_version: self.api_version.clone(), kind: self.kind.clone(), plural: self.plural.clone() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeTimeouts {
    /// How long a rollout (upgrade, replace, replacements after a crash) may take.
    #[serde(with = "human")]
    pub rollout: Duration,
    /// How long the watch caches may take to fill at start.
    #[serde(with = "human")]
    pub sync: Duration,
    /// How long a watch may keep failing during a wait before the run ends: the management (or
    /// workload) cluster is gone (exit 4).
    #[serde(with = "human")]
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

mod human {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

impl KubeProfile {
    pub fn from_toml(text: &str) -> Result<KubeProfile, String> {
        let p: KubeProfile = toml::from_str(text).map_err(|e| format!("kube profile is not valid: {e}"))?;
        for (op, h) in p.hooks.iter().map(|(k, h)| (k.to_string(), h)).chain(p.commands.iter().map(|h| ("command probe".to_string(), h))) {
            if h.command.is_empty() {
                return Err(format!("kube profile: the {op} command is empty"));
            }
        }
        for c in &p.conditions {
            if c.name.is_some() == c.selector.is_some() {
                return Err(format!("kube profile: condition check {} {} needs exactly one of name and selector", c.kind, c.type_));
            }
        }
        if let Some(d) = &p.disk {
            if d.pvc.is_some() == d.pv.is_some() {
                return Err("kube profile: [disk] needs exactly one of pvc = \"namespace/name\" and pv = \"name\"".into());
            }
            if d.pvc.as_ref().is_some_and(|c| !matches!(c.split_once('/'), Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/'))) {
                return Err(format!("kube profile: [disk] pvc = {:?}: expected \"namespace/name\"", d.pvc.clone().unwrap_or_default()));
            }
        }
        Ok(p)
    }

    pub fn load(path: &std::path::Path) -> Result<KubeProfile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read kube profile {}: {e}", path.display()))?;
        KubeProfile::from_toml(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let p = KubeProfile::from_toml("[disk]\npvc = \"probe/data\"\ntimeout = \"30s\"\n[velero]\nnamespace = \"backup\"\nttl = \"1h\"").unwrap();
        let d = p.disk.unwrap();
        assert_eq!((d.pvc.as_deref(), d.timeout), (Some("probe/data"), Duration::from_secs(30)));
        assert_eq!((p.velero.namespace.as_str(), p.velero.ttl, p.velero.timeout), ("backup", Duration::from_secs(3600), Duration::from_secs(1800)));
        assert_eq!(KubeProfile::default().velero.namespace, "velero");
        assert!(KubeProfile::from_toml("[disk]\n").unwrap_err().contains("exactly one of pvc"));
        assert!(KubeProfile::from_toml("[disk]\npvc = \"a\"\npv = \"b\"").unwrap_err().contains("exactly one of pvc"));
        assert!(KubeProfile::from_toml("[disk]\npvc = \"nons\"").unwrap_err().contains("expected \"namespace/name\""));
    }

    #[test]
    fn rejects_unknown_fields_and_empty_commands() {
        assert!(KubeProfile::from_toml("nope = 1").unwrap_err().contains("unknown field"));
        assert!(KubeProfile::from_toml("[hooks.crash]\ncommand = []").unwrap_err().contains("crash command is empty"));
    }
}
