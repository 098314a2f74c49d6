//! The Kubernetes layer the kube-facing parts share (the kube target, the application target,
//! the local node, `reap --kube`): clients and watch caches ([`client`]), exec in a pod
//! ([`exec`]), bounded requests that keep `kube::Error` ([`bounded`], [`CallError`]),
//! delete-if-present, the labels every object shakedown makes carries, and the run's ConfigMap
//! ([`RunOwner`]). It knows nothing of targets, ops or invariants.

pub mod client;
pub mod exec;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams};

/// The opt-in: shakedown acts only on an object (a Cluster, a namespace, a node) annotated (or
/// labelled) with this, set to "true".
pub const OPT_IN: &str = "shakedown.dev/allow-chaos";
/// Every object shakedown creates carries its run id under this label.
pub const RUN_LABEL: &str = "shakedown.dev/run-id";
/// The label that says shakedown made an object.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "shakedown");

/// A request to the Kubernetes API that did not get its answer: the API's own error, kept
/// whole (its status code decides what a caller does), or no answer within the bound.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: no answer within {}s", bound.as_secs_f64())]
    Timeout { what: String, bound: Duration },
}

impl CallError {
    /// The API's status code, when it answered with one.
    pub fn code(&self) -> Option<u16> {
        match self {
            CallError::Api { source: kube::Error::Api(r), .. } => Some(r.code),
            CallError::Api { .. } | CallError::Timeout { .. } => None,
        }
    }

    /// The object (or its kind) does not exist: 404.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }
}

/// `request` (named `what` in its error), bounded by `bound`.
pub async fn bounded<T>(what: &str, bound: Duration, request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, CallError> {
    match tokio::time::timeout(bound, request).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(source)) => Err(CallError::Api { what: what.to_string(), source }),
        Err(_) => Err(CallError::Timeout { what: what.to_string(), bound }),
    }
}

/// Deletes `name` if it exists, bounded: `Ok(true)` when it was deleted, `Ok(false)` when it was
/// already gone.
pub async fn delete_if_present<K>(api: &Api<K>, name: &str, params: &DeleteParams, what: &str, bound: Duration) -> Result<bool, CallError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match bounded(what, bound, api.delete(name, params)).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Which process a run is (its ConfigMap's `host`, `pid` and `started`): what `reap --kube`
/// reads to tell a dead run from a live one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOwner {
    pub host: String,
    pub pid: String,
    pub started: String,
}

impl RunOwner {
    /// This process, now.
    pub fn this_process() -> RunOwner {
        RunOwner { host: hostname(), pid: std::process::id().to_string(), started: crate::clock::now_rfc3339() }
    }

    /// The owner a run's ConfigMap data names (missing keys: empty).
    pub fn read(data: &BTreeMap<String, String>) -> RunOwner {
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        RunOwner { host: get("host"), pid: get("pid"), started: get("started") }
    }

    /// The ConfigMap `name` labelled with run `run_id`, holding this owner and `data`.
    pub fn configmap(&self, name: &str, run_id: &str, mut data: BTreeMap<String, String>) -> ConfigMap {
        data.insert("host".into(), self.host.clone());
        data.insert("pid".into(), self.pid.clone());
        data.insert("started".into(), self.started.clone());
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(BTreeMap::from([(RUN_LABEL.to_string(), run_id.to_string()), (MANAGED_BY.0.into(), MANAGED_BY.1.into())])),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }
    }

    /// Whether the run may still be running: a run on another host (its process cannot be asked
    /// from here), or on this host a live shakedown process with its pid other than this one.
    /// Only `reap --kube --all` takes the objects of a run that may be alive.
    pub fn may_be_alive(&self) -> bool {
        self.host != hostname()
            || (self.pid.parse::<u32>().is_ok_and(|p| p != std::process::id())
                && std::fs::read(format!("/proc/{}/cmdline", self.pid)).is_ok_and(|c| String::from_utf8_lossy(&c).contains("shakedown")))
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_owner_reads_back_from_its_configmap() {
        let me = RunOwner::this_process();
        let cm = me.configmap("shakedown-r1", "r1", BTreeMap::from([("cluster".to_string(), "c".to_string())]));
        assert_eq!(cm.metadata.labels.as_ref().unwrap()[RUN_LABEL], "r1");
        let data = cm.data.unwrap();
        assert_eq!(data["cluster"], "c");
        assert_eq!(RunOwner::read(&data), me);
        // On this host: this process is not another run's owner, and a pid that is no shakedown
        // is dead. On another host nothing can be asked: the run may be alive.
        assert!(!me.may_be_alive());
        assert!(!RunOwner { pid: "1".into(), ..me.clone() }.may_be_alive());
        assert!(!RunOwner { pid: "not a pid".into(), ..me.clone() }.may_be_alive());
        assert!(RunOwner { host: "another-host".into(), ..me }.may_be_alive());
    }

    #[tokio::test]
    async fn a_bound_ends_a_request_that_never_answers() {
        let never = std::future::pending::<Result<(), kube::Error>>();
        let e = bounded("get pod p", Duration::from_millis(10), never).await.unwrap_err();
        assert!(matches!(e, CallError::Timeout { .. }) && !e.is_not_found(), "{e}");
        assert_eq!(e.to_string(), "get pod p: no answer within 0.01s");
    }

    #[tokio::test]
    async fn a_404_is_not_found_and_keeps_the_apis_answer() {
        let status = kube::core::Status::failure("pods \"p\" not found", "NotFound").with_code(404);
        let e = bounded("get pod p", Duration::from_secs(1), async { Err::<(), _>(kube::Error::Api(status.boxed())) }).await.unwrap_err();
        assert!(e.is_not_found() && e.code() == Some(404));
        assert!(e.to_string().starts_with("get pod p: "), "{e}");
    }
}
