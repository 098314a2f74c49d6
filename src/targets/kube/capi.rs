//! The Cluster API versions the kube target speaks, found by discovery at connect, and the
//! shapes that differ between them.

use kube::api::{ApiResource, GroupVersionKind};
use kube::Client;

/// The Cluster API version the kube target speaks: `v1beta2` (Cluster API 1.10 and later), or
/// `v1beta1` on a management cluster that serves only that (Cluster API before 1.10). Found by
/// discovery at connect ([`discover_capi`]); the shapes that differ between the two are in
/// [`CapiVersion`]'s methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapiVersion {
    V1Beta1,
    V1Beta2,
}

impl CapiVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            CapiVersion::V1Beta1 => "v1beta1",
            CapiVersion::V1Beta2 => "v1beta2",
        }
    }

    /// The KubeadmControlPlane patch that asks for a rollout of every Machine created before `now`.
    pub fn rollout_after(self, now: &str) -> serde_json::Value {
        match self {
            CapiVersion::V1Beta1 => serde_json::json!({"spec": {"rolloutAfter": now}}),
            CapiVersion::V1Beta2 => serde_json::json!({"spec": {"rollout": {"after": now}}}),
        }
    }

    /// KubeadmControlPlane's reference to its infrastructure machine template, as found
    /// (v1beta2: `spec.machineTemplate.spec.infrastructureRef` with `apiGroup`; v1beta1:
    /// `spec.machineTemplate.infrastructureRef` with `apiVersion`).
    pub fn kcp_infra_ref(self, kcp: &serde_json::Value) -> Option<serde_json::Value> {
        let path = match self {
            CapiVersion::V1Beta1 => "/spec/machineTemplate/infrastructureRef",
            CapiVersion::V1Beta2 => "/spec/machineTemplate/spec/infrastructureRef",
        };
        kcp.pointer(path).filter(|r| r.get("kind").is_some()).cloned()
    }

    /// The `spec.machineTemplate` of a KubeadmControlPlane patch pointing `infra_ref` (what
    /// [`CapiVersion::kcp_infra_ref`] found) at the template `name`.
    pub fn kcp_template_patch(self, infra_ref: &serde_json::Value, name: &str) -> serde_json::Value {
        let mut r = infra_ref.clone();
        r["name"] = name.into();
        match self {
            CapiVersion::V1Beta1 => serde_json::json!({"infrastructureRef": r}),
            CapiVersion::V1Beta2 => serde_json::json!({"spec": {"infrastructureRef": r}}),
        }
    }
}

/// The Cluster API version both groups (`cluster.x-k8s.io`, `controlplane.cluster.x-k8s.io`)
/// serve, preferring `v1beta2`: one discovery request at connect.
pub async fn discover_capi(client: &Client) -> Result<CapiVersion, Discovery> {
    let groups = client.list_api_groups().await.map_err(|e| Discovery::Unreachable(super::command::error_chain(&e)))?;
    let served = |name: &str| -> Vec<String> {
        groups.groups.iter().filter(|g| g.name == name).flat_map(|g| g.versions.iter().map(|v| v.version.clone())).collect()
    };
    let (core, cp) = (served("cluster.x-k8s.io"), served("controlplane.cluster.x-k8s.io"));
    for v in [CapiVersion::V1Beta2, CapiVersion::V1Beta1] {
        if core.iter().any(|s| s == v.as_str()) && cp.iter().any(|s| s == v.as_str()) {
            return Ok(v);
        }
    }
    Err(Discovery::NoClusterApi(format!(
        "the management cluster serves no Cluster API version shakedown speaks (v1beta2, or v1beta1 before Cluster API 1.10): cluster.x-k8s.io serves [{}], controlplane.cluster.x-k8s.io serves [{}]",
        core.join(", "),
        cp.join(", ")
    )))
}

/// Why discovery found no Cluster API version.
#[derive(Debug)]
pub enum Discovery {
    /// The request failed (its error and causes).
    Unreachable(String),
    /// What is served, and that shakedown speaks none of it.
    NoClusterApi(String),
}

/// The `ApiResource` of a Cluster API kind at version `v`.
pub fn capi(kind: &str, v: CapiVersion) -> ApiResource {
    let group = if kind == "KubeadmControlPlane" { "controlplane.cluster.x-k8s.io" } else { "cluster.x-k8s.io" };
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, v.as_str(), kind))
}
