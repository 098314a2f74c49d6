//! The kube target's API workload (`[api]` in the kube profile): the workload of
//! [`crate::targets::api`] against the workload cluster (the kubeconfig Cluster API keeps in
//! `<cluster>-kubeconfig`), in a namespace of the run (`shakedown-<run id>`, labelled with the run
//! id, deleted at teardown) or one the kube profile names (then only the run's ConfigMaps are
//! deleted). Its requests go through the workload cluster's API endpoint — the control-plane
//! load balancer — on a client of their own: they are the load, not the target's observation,
//! and are not counted in `reads_since_connect`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, Config};
use shakedown_faults::Model;
use shakedown_invariants::{ApiObservation, InvariantId};

use super::profile::ApiSpec;

/// What the API workload's teardown left in the workload cluster (`reap --kube` removes it).
#[derive(Debug, thiserror::Error)]
pub enum TeardownError {
    #[error("cannot delete the API workload's objects in namespace {namespace}: {}", describe(source))]
    Delete {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting the API workload's objects in namespace {namespace} got no answer within {}s", bound.as_secs())]
    Timeout { namespace: String, bound: Duration },
}
use super::{KubeError, RUN_LABEL};
use crate::targets::api::probe::ApiProbes;
use crate::targets::api::{describe, observe, ApiWorkload};

/// How long creating or deleting the run's namespace may take.
const NAMESPACE_BOUND: Duration = Duration::from_secs(30);
/// Requests through the endpoint per check.
const ENDPOINT_PROBES: usize = 4;

pub struct KubeApi {
    pub workload: ApiWorkload,
    probes: ApiProbes,
    client: Client,
    pub namespace: String,
    /// The run created the namespace (and deletes it at teardown).
    created: bool,
    /// Backups and restores act on the workload cluster's data (`[api] restores_api`): they
    /// move the workload's marks.
    pub restores_api: bool,
    run_id: String,
    /// The bound of one probe (the workload's request timeout).
    timeout: Duration,
    /// Where the workload's history goes at teardown (`api-history.jsonl` in the run directory).
    history: Option<std::path::PathBuf>,
}

/// The namespace a run creates in the workload cluster.
pub fn run_namespace(run_id: &str) -> String {
    format!("shakedown-{run_id}")
}

impl KubeApi {
    /// Checks, before the run writes anything, that a namespace the kube profile names exists in
    /// the workload cluster (`Err(Usage)` when it does not).
    pub async fn check(config: &Config, spec: &ApiSpec) -> Result<(), KubeError> {
        let Some(ns) = &spec.namespace else { return Ok(()) };
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config.clone())
            .map_err(|e| KubeError::Environment(format!("cannot build a client for the workload cluster: {e}")))?;
        let namespaces: Api<Namespace> = Api::all(client);
        match tokio::time::timeout(NAMESPACE_BOUND, namespaces.get(ns)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(KubeError::Usage(format!(
                "kube profile [api]: namespace {ns} does not exist in the workload cluster ({server}): create it, or leave namespace out and the run creates its own"
            ))),
            Ok(Err(e)) => Err(KubeError::Environment(format!("cannot read namespace {ns} in the workload cluster ({server}): {}", describe(&e)))),
            Err(_) => Err(KubeError::Environment(format!("the workload cluster ({server}) did not answer within {}s", NAMESPACE_BOUND.as_secs()))),
        }
    }

    /// Creates the run's namespace (unless the kube profile names one) and starts the workload;
    /// `Err` says why the API invariants cannot be checked here.
    pub async fn start(config: Config, spec: &ApiSpec, run_id: &str, run_dir: Option<&Path>) -> Result<KubeApi, KubeError> {
        // The workload and the probes judge each answer themselves (a 503 or 504 may be a write
        // the apiserver applied): kube-rs's own retry of 429/503/504 would replay writes.
        let mut config = config;
        config.default_retry = false;
        let server = config.cluster_url.to_string();
        let env = KubeError::Environment;
        let client = Client::try_from(config.clone()).map_err(|e| env(format!("cannot build a client for the workload cluster: {e}")))?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let (namespace, created) = match &spec.namespace {
            // Checked to exist by `check` before the run wrote anything.
            Some(ns) => (ns.clone(), false),
            None => {
                let ns = run_namespace(run_id);
                let body = Namespace {
                    metadata: ObjectMeta {
                        name: Some(ns.clone()),
                        labels: Some(BTreeMap::from([
                            (RUN_LABEL.to_string(), run_id.to_string()),
                            ("app.kubernetes.io/managed-by".into(), "shakedown".into()),
                        ])),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                match tokio::time::timeout(NAMESPACE_BOUND, namespaces.create(&PostParams::default(), &body)).await {
                    Ok(Ok(_)) => (ns, true),
                    Ok(Err(e)) => {
                        return Err(env(format!("cannot create namespace {ns} in the workload cluster ({server}): {}", describe(&e))))
                    }
                    Err(_) => {
                        return Err(env(format!("the workload cluster ({server}) did not answer within {}s", NAMESPACE_BOUND.as_secs())))
                    }
                }
            }
        };
        let samples = run_dir.map(|d| d.join("api-workload.csv"));
        let workload = ApiWorkload::start(client.clone(), &namespace, run_id, &spec.load, samples.as_deref());
        let probes = ApiProbes::new(config, &namespace, None).map_err(|e| env(e.to_string()))?;
        Ok(KubeApi {
            workload,
            probes,
            client,
            namespace,
            created,
            restores_api: spec.restores_api,
            run_id: run_id.to_string(),
            timeout: spec.load.timeout,
            history: run_dir.map(|d| d.join("api-history.jsonl")),
        })
    }

    /// What the API invariants among `invariants` need (no single apiservers: the kube target
    /// reaches only the endpoint).
    pub async fn observe(&self, model: &Model, invariants: &[InvariantId]) -> ApiObservation {
        observe(&self.workload, &self.probes, model, invariants, ENDPOINT_PROBES, &[], self.timeout).await
    }

    /// Stops the workload and removes what it wrote: the run's namespace, or its ConfigMaps in
    /// the named one. `Err` names what is left (for `reap --kube`).
    pub async fn teardown(&mut self) -> Result<(), TeardownError> {
        self.workload.stop().await;
        if let Some(path) = &self.history {
            self.workload.write_history(path);
        }
        let res = if self.created {
            let namespaces: Api<Namespace> = Api::all(self.client.clone());
            tokio::time::timeout(NAMESPACE_BOUND, namespaces.delete(&self.namespace, &DeleteParams::default())).await.map(|r| r.map(|_| ()))
        } else {
            let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
            let lp = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id));
            tokio::time::timeout(NAMESPACE_BOUND, cms.delete_collection(&DeleteParams::default(), &lp)).await.map(|r| r.map(|_| ()))
        };
        match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(()),
            Ok(Err(source)) => Err(TeardownError::Delete { namespace: self.namespace.clone(), source }),
            Err(_) => Err(TeardownError::Timeout { namespace: self.namespace.clone(), bound: NAMESPACE_BOUND }),
        }
    }
}
