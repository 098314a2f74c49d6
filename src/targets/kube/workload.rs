//! The workload cluster: reached through the kubeconfig Cluster API writes into the Secret
//! `<cluster>-kubeconfig` (key `value`) in the Cluster's namespace. Its Nodes,
//! PersistentVolumes and VolumeAttachments are watched for the `leaks` inventory and for the
//! disk ops.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::Config as WatchConfig;
use kube::{Client, Config};
use serde_json::Value;
use tokio::sync::watch;

use crate::k8s::client::{self, RequestCounter, Watched};

/// Why the workload cluster is not observed: a note for the run's output and event log; the
/// checks that need it are skipped, the run goes on.
pub type Skipped = String;

/// The workload cluster's client and watch caches.
pub struct Workload {
    pub client: Client,
    pub server: String,
    pub nodes: Watched,
    pub volumes: Watched,
    pub attachments: Watched,
}

pub fn node_ar() -> ApiResource {
    ApiResource::erase::<Node>(&())
}
pub fn pv_ar() -> ApiResource {
    ApiResource::erase::<PersistentVolume>(&())
}
pub fn va_ar() -> ApiResource {
    ApiResource::erase::<VolumeAttachment>(&())
}

/// Reads `<name>-kubeconfig` and builds a client for the workload cluster (counted in
/// `counter`), with its configuration (for clients of its own). `Err(note)` when the Secret is
/// missing, unreadable or holds no usable kubeconfig.
pub async fn client_from_secret(
    mgmt: &Client,
    counter: &RequestCounter,
    ns: &str,
    name: &str,
) -> Result<(Client, String, Config), Skipped> {
    let secret_name = format!("{name}-kubeconfig");
    let secrets: Api<Secret> = Api::namespaced(mgmt.clone(), ns);
    let skipped = |why: String| {
        format!("workload cluster not observed ({why}): the checks of Nodes without a Machine, Released/Failed PersistentVolumes and VolumeAttachments of gone Nodes are skipped, and disk ops need hooks")
    };
    let secret = match secrets.get(&secret_name).await {
        Ok(s) => s,
        Err(kube::Error::Api(r)) if r.code == 404 => {
            return Err(skipped(format!("no Secret {ns}/{secret_name}, where Cluster API keeps the workload cluster's kubeconfig")))
        }
        Err(kube::Error::Api(r)) if r.code == 403 => {
            return Err(skipped(format!(
                "reading Secret {ns}/{secret_name} is forbidden ({}); ci/k8s/rbac.yaml grants `get` on secrets",
                r.message
            )))
        }
        Err(e) => return Err(skipped(format!("cannot read Secret {ns}/{secret_name}: {e}"))),
    };
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get("value")).map(|b| b.0.clone()) else {
        return Err(skipped(format!("Secret {ns}/{secret_name} has no key `value`")));
    };
    let text = String::from_utf8(bytes).map_err(|_| skipped(format!("Secret {ns}/{secret_name}: `value` is not UTF-8")))?;
    let kc = Kubeconfig::from_yaml(&text).map_err(|e| skipped(format!("Secret {ns}/{secret_name}: `value` is not a kubeconfig: {e}")))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| skipped(format!("Secret {ns}/{secret_name}: cannot use its kubeconfig: {e}")))?;
    let (client, server) = client::build(config.clone(), counter).map_err(|e| skipped(format!("Secret {ns}/{secret_name}: {e}")))?;
    Ok((client, server, config))
}

impl Workload {
    /// Starts the watches (their changes bump `changed`, as the management cluster's do).
    pub fn watch(client: Client, server: String, changed: &watch::Sender<u64>, errors: &Arc<Mutex<Option<String>>>) -> Workload {
        let start = |ar: ApiResource| Watched::start_cluster_scoped(&client, &ar, WatchConfig::default(), changed.clone(), errors.clone());
        let (nodes, volumes, attachments) = (start(node_ar()), start(pv_ar()), start(va_ar()));
        Workload { client, server, nodes, volumes, attachments }
    }

    pub fn all(&self) -> impl Iterator<Item = &Watched> {
        [&self.nodes, &self.volumes, &self.attachments].into_iter()
    }

    /// Nodes that no Machine names in `status.nodeRef.name`.
    pub fn orphan_nodes(&self, machines: &[Arc<DynamicObject>]) -> Vec<String> {
        let referenced: BTreeSet<&str> =
            machines.iter().filter_map(|m| m.data.pointer("/status/nodeRef/name").and_then(Value::as_str)).collect();
        let mut v: Vec<String> =
            self.nodes.objects().iter().filter_map(|n| n.metadata.name.clone()).filter(|n| !referenced.contains(n.as_str())).collect();
        v.sort();
        v
    }

    /// PersistentVolumes in phase Released or Failed, as `name (Phase)`.
    pub fn released_volumes(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .volumes
            .objects()
            .iter()
            .filter_map(|pv| {
                let phase = pv.data.pointer("/status/phase").and_then(Value::as_str)?;
                matches!(phase, "Released" | "Failed").then(|| format!("{} ({phase})", pv.metadata.name.clone().unwrap_or_default()))
            })
            .collect();
        v.sort();
        v
    }

    /// VolumeAttachments whose `spec.nodeName` names no Node, as `name (node N)`.
    pub fn orphan_attachments(&self) -> Vec<String> {
        let nodes: BTreeSet<String> = self.nodes.objects().iter().filter_map(|n| n.metadata.name.clone()).collect();
        let mut v: Vec<String> = self
            .attachments
            .objects()
            .iter()
            .filter_map(|va| {
                let node = va.data.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
                (!nodes.contains(node)).then(|| format!("{} (node {node})", va.metadata.name.clone().unwrap_or_default()))
            })
            .collect();
        v.sort();
        v
    }

    /// The VolumeAttachments of PersistentVolume `pv` (not being deleted): (name, uid, attached).
    pub fn attachments_of(&self, pv: &str) -> Vec<(String, String, bool)> {
        self.attachments
            .objects()
            .iter()
            .filter(|va| {
                va.metadata.deletion_timestamp.is_none()
                    && va.data.pointer("/spec/source/persistentVolumeName").and_then(Value::as_str) == Some(pv)
            })
            .map(|va| {
                (
                    va.metadata.name.clone().unwrap_or_default(),
                    va.metadata.uid.clone().unwrap_or_default(),
                    va.data.pointer("/status/attached").and_then(Value::as_bool).unwrap_or(false),
                )
            })
            .collect()
    }
}

/// The PersistentVolume a claim is bound to (`spec.volumeName`).
pub async fn volume_of_claim(client: &Client, claim: &str) -> Result<String, super::DiscoveryError> {
    use super::DiscoveryError;
    let (ns, name) = claim.split_once('/').ok_or_else(|| DiscoveryError::BadClaim { claim: claim.to_string() })?;
    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = api
        .get(name)
        .await
        .map_err(|source| DiscoveryError::Kube { what: format!("PersistentVolumeClaim {claim} in the workload cluster"), source })?;
    pvc.spec.and_then(|s| s.volume_name).filter(|v| !v.is_empty()).ok_or_else(|| DiscoveryError::Unbound { claim: claim.to_string() })
}
