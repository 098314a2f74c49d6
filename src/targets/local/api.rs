//! The control-plane stack's API side for the local target: a kubeconfig for the run's API
//! load balancer (`<run dir>/api/kubeconfig`, usable with kubectl while the stack runs), the
//! API workload's namespace, the workload itself and the probes of `api-reachability`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Config};
use shakedown_faults::{ApiLoad, Model};
use shakedown_invariants::{ApiObservation, InvariantId};

use super::apiserver::{ApiPki, WORKLOAD_NAMESPACE};
use super::testbed::Testbed;
use super::LocalError;
use crate::targets::api::probe::{ApiProbes, ApiServer};
use crate::targets::api::{describe, observe, ApiWorkload};

/// How long creating the workload's namespace may take at bring-up.
const NAMESPACE_BOUND: Duration = Duration::from_secs(10);
/// Pause between two attempts to create it.
const NAMESPACE_RETRY: Duration = Duration::from_millis(200);

/// The API of a control-plane stack, as the local target uses it.
pub struct LocalApi {
    pub workload: ApiWorkload,
    probes: ApiProbes,
    pub kubeconfig: PathBuf,
}

/// Writes a kubeconfig for `server` (the run's CA, the admin token) at `api/kubeconfig`.
fn write_kubeconfig(pki: &ApiPki, server: &str, run_id: &str) -> Result<PathBuf, LocalError> {
    let path = pki.dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {run_id}\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\ncontexts:\n- name: {run_id}\n  context:\n    cluster: {run_id}\n    user: admin\n    namespace: {WORKLOAD_NAMESPACE}\ncurrent-context: {run_id}\nusers:\n- name: admin\n  user:\n    token: {token}\n",
        ca = pki.ca_file().display(),
        token = pki.token,
    );
    crate::private::write(&path, text).map_err(|e| LocalError::Environment(format!("cannot write {}: {e}", path.display())))?;
    Ok(path)
}

/// The client configuration of the kubeconfig's server, with `timeout` to connect.
async fn config(kubeconfig: &Path, timeout: Duration) -> Result<Config, LocalError> {
    // The kubeconfig is the run's own: a file it cannot use is the machine's problem.
    let mut config = crate::k8s::client::config_of_file(kubeconfig).await.map_err(|e| LocalError::Environment(e.to_string()))?;
    config.connect_timeout = Some(timeout);
    // The workload and the probes judge each answer themselves: a 503 or 504 may be a write the
    // apiserver applied (an unknown outcome), a 503 from the load balancer an API not reachable.
    // kube-rs's own retry of 429/503/504 (on by default) would replay writes and hide both.
    config.default_retry = false;
    Ok(config)
}

impl LocalApi {
    /// Creates the workload's namespace through the load balancer and starts the API workload
    /// (its samples in `api-workload.csv`).
    pub async fn start(testbed: &Testbed, cfg: &ApiLoad) -> Result<LocalApi, LocalError> {
        let pki = testbed.api.as_ref().ok_or_else(|| LocalError::Environment("the control-plane stack has no API".into()))?;
        let server = testbed.api_endpoint_url();
        let kubeconfig = write_kubeconfig(pki, &server, &testbed.cfg.run_id)?;
        let config = config(&kubeconfig, cfg.timeout).await?;
        let client = Client::try_from(config.clone()).map_err(|e| LocalError::Environment(format!("cannot build the API client: {e}")))?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace { metadata: ObjectMeta { name: Some(WORKLOAD_NAMESPACE.into()), ..Default::default() }, ..Default::default() };
        // Through the load balancer, which marks an apiserver up only after its next health
        // check once it is ready: retried (every NAMESPACE_RETRY) until NAMESPACE_BOUND.
        let deadline = tokio::time::Instant::now() + NAMESPACE_BOUND;
        loop {
            let last = match tokio::time::timeout_at(deadline, namespaces.create(&PostParams::default(), &ns)).await {
                Ok(Ok(_)) => break,
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => break,
                Ok(Err(e)) => describe(&e),
                Err(_) => "no answer".to_string(),
            };
            if tokio::time::Instant::now() + NAMESPACE_RETRY >= deadline {
                return Err(LocalError::Environment(format!(
                    "cannot create namespace {WORKLOAD_NAMESPACE} through the API load balancer {server} within {}s: {last}",
                    NAMESPACE_BOUND.as_secs()
                )));
            }
            tokio::time::sleep(NAMESPACE_RETRY).await;
        }
        let samples = testbed.cfg.run_dir.join("api-workload.csv");
        let workload = ApiWorkload::start(client, WORKLOAD_NAMESPACE, &testbed.cfg.run_id, cfg, Some(&samples));
        let probes =
            ApiProbes::new(config, WORKLOAD_NAMESPACE, Some(&pki.ca_file())).map_err(|e| LocalError::Environment(e.to_string()))?;
        Ok(LocalApi { workload, probes, kubeconfig })
    }

    /// What the API invariants among `invariants` need: also each machine's apiserver.
    pub async fn observe(&self, testbed: &Testbed, model: &Model, invariants: &[InvariantId], timeout: Duration) -> ApiObservation {
        let apiservers: Vec<ApiServer> = testbed
            .members
            .values()
            .map(|m| ApiServer { name: format!("{}-apiserver", m.name()), member: Some(m.id), url: m.api_url() })
            .collect();
        observe(&self.workload, &self.probes, model, invariants, 2 * apiservers.len(), &apiservers, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A stand-in for an apiserver that answers every request with `503` — a mock, because a
    /// real apiserver cannot be made to answer a write with 503 or 504 on demand (it does when
    /// etcd times out, after it may have applied the write).
    async fn always_503(count: Arc<AtomicUsize>) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    // One request per read (the client's requests are small); keep-alive.
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        count.fetch_add(1, Ordering::SeqCst);
                        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd timeout","reason":"ServiceUnavailable","code":503}"#;
                        let resp = format!(
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if s.write_all(resp.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    /// The API workload's client sends a write once: a 503 (or 504) is the workload's to judge
    /// (an outcome it does not know), not kube-rs's to replay — a replay of a write the apiserver
    /// had applied would come back as a conflict and be counted as never written.
    #[tokio::test]
    async fn the_workloads_client_does_not_replay_a_write_answered_503() {
        let count = Arc::new(AtomicUsize::new(0));
        let addr = always_503(count.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n")).unwrap();
        let client = Client::try_from(config(&kubeconfig, Duration::from_secs(2)).await.unwrap()).unwrap();
        let api: Api<ConfigMap> = Api::namespaced(client, "ns");
        let r = tokio::time::timeout(Duration::from_secs(10), api.create(&PostParams::default(), &ConfigMap::default()))
            .await
            .expect("an answer, not a retry loop");
        assert!(matches!(r, Err(kube::Error::Api(ref s)) if s.code == 503), "{r:?}");
        assert_eq!(count.load(Ordering::SeqCst), 1, "the write was sent once");
    }
}
