//! The probes of `api-reachability`: quorum reads through the API load balancer, each on a
//! fresh connection (a load balancer balances connections: each goes to the next backend), and
//! `GET /readyz` of each apiserver the target reaches on its own.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use shakedown_faults::MemberId;
use shakedown_invariants::{ApiServerReady, Probe};

use super::describe;
use crate::targets::kube::command::{HttpProber, ProbeError};

/// An apiserver the target reaches directly.
#[derive(Debug, Clone)]
pub struct ApiServer {
    pub name: String,
    pub member: Option<MemberId>,
    /// `https://host:port`
    pub url: String,
}

pub struct ApiProbes {
    /// How the workload reaches the API (its load balancer): each probe builds its own client
    /// from it, so each opens its own connection.
    config: kube::Config,
    namespace: String,
    /// `/readyz` of single apiservers (trusting the stack's CA); `None` where the target reaches
    /// none on its own.
    readyz: Option<HttpProber>,
}

impl ApiProbes {
    /// Probes of the API `config` points at, reading `namespace`; `/readyz` of single apiservers
    /// trusting `ca_file` when given.
    pub fn new(config: kube::Config, namespace: &str, readyz_ca: Option<&Path>) -> Result<ApiProbes, ProbeError> {
        let readyz = readyz_ca.map(|ca| HttpProber::fresh_connections(Some(ca), false)).transpose()?;
        Ok(ApiProbes { config, namespace: namespace.to_string(), readyz })
    }

    /// `n` quorum reads (a LIST of one ConfigMap of the namespace) through the load balancer,
    /// concurrently, each on a new client and so a new connection.
    pub async fn through_endpoint(&self, n: usize, timeout: Duration) -> Vec<Probe> {
        let what = format!("LIST configmaps in {} through {}", self.namespace, self.config.cluster_url);
        let probes = (0..n.max(1)).map(|_| async {
            let t0 = Instant::now();
            let res = async {
                let client = kube::Client::try_from(self.config.clone()).map_err(|e| format!("cannot build a client: {e}"))?;
                let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &self.namespace);
                match tokio::time::timeout(timeout, api.list(&ListParams::default().limit(1))).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(describe(&e)),
                    Err(_) => Err(format!("no answer within {}ms", timeout.as_millis())),
                }
            }
            .await;
            Probe { latency_ms: t0.elapsed().as_millis() as u64, error: res.err().map(|e| format!("{what}: {e}")) }
        });
        futures::future::join_all(probes).await
    }

    /// `/readyz` of every apiserver, concurrently.
    pub async fn readyz(&self, apiservers: &[ApiServer], timeout: Duration) -> Vec<ApiServerReady> {
        let Some(prober) = &self.readyz else { return vec![] };
        let probes = apiservers.iter().map(|a| async move {
            match prober.answer(&format!("{}/readyz", a.url), timeout).await {
                Ok(ans) => ApiServerReady {
                    name: a.name.clone(),
                    member: a.member,
                    answered: true,
                    ready: ans.status == 200,
                    detail: (ans.status != 200).then(|| format!("status {}: {}", ans.status, failing_checks(&ans.body))),
                },
                Err(e) => {
                    ApiServerReady { name: a.name.clone(), member: a.member, answered: false, ready: false, detail: Some(e.to_string()) }
                }
            }
        });
        futures::future::join_all(probes).await
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

/// The checks `/readyz` lists as failed (`[-]etcd failed: reason withheld`), else its first line.
pub(crate) fn failing_checks(body: &str) -> String {
    let failed: Vec<&str> = body.lines().filter(|l| l.starts_with("[-]")).collect();
    if failed.is_empty() {
        first_line(body).to_string()
    } else {
        failed.join(", ")
    }
}
