//! The application target's test application on a real local node: etcd 3.5 as a 3-replica
//! StatefulSet (claims from the hostPath provisioner; host network, each replica on ports of its
//! own, so its peer address survives a restart without DNS), and an "operator" for it written
//! for the tests: a Deployment (its pod is the operator's presence: scaled to zero, the
//! operator does nothing) and the reconcile loop below, which rebuilds a replica whose claim
//! was lost (removes the old member, adds the replica back empty). Planted bug:
//! `PvcLossNeverRebuilt` (the loop ignores lost claims).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use serde_json::json;
use shakedown::node::config::{BUSYBOX_IMAGE, ETCD_IMAGE};
use shakedown::targets::exec::exec;

pub const NS: &str = "app";

/// The pods' start script: an existing data directory restarts the member; an empty one
/// bootstraps the cluster (nobody answers yet) or joins once the operator added it back.
const START: &str = r#"
i=${POD_NAME##*-}
peer() { echo "http://$NODE_IP:$((32380 + $1 * 10))"; }
cport=$((32379 + i * 10))
common="--name etcd-$i --data-dir /data/etcd --listen-client-urls http://$NODE_IP:$cport --advertise-client-urls http://$NODE_IP:$cport --listen-peer-urls $(peer $i) --initial-advertise-peer-urls $(peer $i) --initial-cluster-token shakedown-app"
rm -f /tmp/waiting-for-join
if [ -d /data/etcd/member ]; then exec etcd $common; fi
others=""
for j in 0 1 2; do [ $j != $i ] && others="$others,http://$NODE_IP:$((32379 + j * 10))"; done
others=${others#,}
if ! etcdctl --endpoints=$others --dial-timeout=1s --command-timeout=2s member list >/tmp/ml 2>/dev/null; then
  exec etcd $common --initial-cluster "etcd-0=$(peer 0),etcd-1=$(peer 1),etcd-2=$(peer 2)" --initial-cluster-state new
fi
while true; do
  if etcdctl --endpoints=$others --dial-timeout=1s --command-timeout=2s member list >/tmp/ml 2>/dev/null && grep -q "unstarted, , $(peer $i)," /tmp/ml; then
    cluster=$(awk -F', ' -v me=etcd-$i '{ n = $3; if (n == "") n = me; printf "%s%s=%s", (NR > 1 ? "," : ""), n, $4 }' /tmp/ml)
    # No longer waiting: the operator must not take the new member for the lost one.
    rm -f /tmp/waiting-for-join
    exec etcd $common --initial-cluster "$cluster" --initial-cluster-state existing
  fi
  touch /tmp/waiting-for-join
  sleep 1
done
"#;

/// The etcd StatefulSet and the operator's Deployment, in namespace `app` (opted in).
pub async fn deploy(client: &Client) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS, "annotations": {"shakedown.dev/allow-chaos": "true"}}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    let endpoints = "http://$(NODE_IP):32379,http://$(NODE_IP):32389,http://$(NODE_IP):32399";
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "etcd"},
        "spec": {
            "replicas": 3, "serviceName": "etcd", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "etcd"}},
            "template": {
                "metadata": {"labels": {"app": "etcd"}},
                "spec": {
                    "hostNetwork": true, "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "etcd", "image": ETCD_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", START],
                        "env": [
                            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                            // With the host's network, HOSTNAME is the node's name.
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "ENDPOINTS", "value": endpoints},
                            {"name": "ETCDCTL_API", "value": "3"},
                        ],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "readinessProbe": {"exec": {"command": ["sh", "-c", "etcdctl --endpoints=http://$NODE_IP:$((32379 + ${POD_NAME##*-} * 10)) --command-timeout=2s endpoint health"]}, "periodSeconds": 1, "timeoutSeconds": 3},
                    }],
                },
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}}],
        }
    }))
    .unwrap();
    Api::<StatefulSet>::namespaced(client.clone(), NS).create(&PostParams::default(), &sts).await.unwrap();
    let op: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "etcd-operator"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "etcd-operator"}}, "template": {
            "metadata": {"labels": {"app": "etcd-operator"}},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "operator", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "100000"]}]}}}
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), NS).create(&PostParams::default(), &op).await.unwrap();
}

/// Waits until every replica and the operator are Ready.
pub async fn settled(client: &Client, bound: Duration) {
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + bound;
    loop {
        let s = sts.get("etcd").await.ok().and_then(|s| s.status).and_then(|s| s.ready_replicas).unwrap_or(0);
        let d = deps.get("etcd-operator").await.ok().and_then(|d| d.status).and_then(|s| s.available_replicas).unwrap_or(0);
        if s == 3 && d == 1 {
            return;
        }
        if Instant::now() > deadline {
            panic!("the application did not settle within {bound:?}: etcd {s}/3 Ready, operator {d}/1\n{}", diagnose(client).await);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the replicas say: their phase, readiness, last log lines, and the member list.
pub async fn diagnose(client: &Client) -> String {
    use kube::api::LogParams;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut out = String::new();
    for p in pods.list(&ListParams::default().labels("app=etcd")).await.map(|l| l.items).unwrap_or_default() {
        let name = p.metadata.name.clone().unwrap_or_default();
        let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        let restarts = p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).and_then(|c| c.first().map(|c| c.restart_count)).unwrap_or(0);
        let logs = pods.logs(&name, &LogParams { tail_lines: Some(6), ..Default::default() }).await.unwrap_or_default();
        out.push_str(&format!("--- {name} {phase} ready={} restarts={restarts}\n{logs}\n", shakedown::targets::app::data::is_ready(&p)));
        if let Some(ml) = sh(client, &name, "cat /tmp/ml; ls /tmp").await {
            out.push_str(&format!("member list seen by {name}:\n{ml}\n"));
        }
    }
    out
}

/// The operator's planted bugs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorBug {
    /// A replica whose claim was lost is never rebuilt (it waits to be added back forever).
    PvcLossNeverRebuilt,
}

async fn sh(client: &Client, pod: &str, cmd: &str) -> Option<String> {
    let out = exec(client, NS, pod, None, &["sh", "-c", cmd], Duration::from_secs(10)).await.ok()?;
    (out.code == 0).then_some(out.stdout)
}

/// The operator's reconcile loop (runs while its Deployment has an available pod): a replica
/// waiting to join (its claim was lost: empty data, its old member still listed) gets its old
/// member removed and is added back as a new member, which it then joins as.
pub fn start_operator(client: Client, bug: Option<OperatorBug>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let present = deps.get("etcd-operator").await.ok().and_then(|d| d.status).and_then(|s| s.available_replicas).unwrap_or(0) > 0;
            if !present || bug == Some(OperatorBug::PvcLossNeverRebuilt) {
                continue;
            }
            let Ok(list) = pods.list(&ListParams::default().labels("app=etcd")).await else { continue };
            let running: Vec<String> = list.items.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).filter_map(|p| p.metadata.name.clone()).collect();
            let ready: Vec<String> = list.items.iter().filter(|p| shakedown::targets::app::data::is_ready(p)).filter_map(|p| p.metadata.name.clone()).collect();
            for pod in &running {
                if sh(&client, pod, "test -f /tmp/waiting-for-join").await.is_none() {
                    continue;
                }
                let Some(healthy) = ready.iter().find(|p| *p != pod) else { continue };
                let i: u32 = pod.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let peer = format!("http://$NODE_IP:{}", 32380 + i * 10);
                // The member with the replica's peer address: removed, then added back.
                let fix = format!(
                    "line=$(etcdctl --endpoints=$ENDPOINTS --command-timeout=5s member list | grep \", {peer},\"); \
                     case \"$line\" in *unstarted*) exit 0;; esac; \
                     id=${{line%%,*}}; \
                     [ -z \"$id\" ] || etcdctl --endpoints=$ENDPOINTS --command-timeout=5s member remove $id && \
                     etcdctl --endpoints=$ENDPOINTS --command-timeout=5s member add etcd-{i} --peer-urls={peer}"
                );
                let _ = sh(&client, healthy, &fix).await;
            }
        }
    })
}
