//! The application target's test application on a real local node: etcd 3.5 as a 3-replica
//! StatefulSet (claims from the hostPath provisioner; host network, each replica on ports of its
//! own, so its peer address survives a restart without DNS), and an "operator" for it written
//! for the tests: a Deployment (its pod is the operator's presence: scaled to zero, the
//! operator does nothing) and the reconcile loop below, which rebuilds a replica whose claim
//! was lost (removes the old member, adds the replica back empty), takes backups
//! (`EtcdBackup`: an etcd snapshot into the node's backup directory) and restores them
//! (`EtcdRestore`: the StatefulSet scaled to zero, every replica restored from the snapshot as a
//! new cluster when it starts, scaled back). Planted bugs: `PvcLossNeverRebuilt` (the loop
//! ignores lost claims), `RestoreSkipsLastBackup` (asked to restore the newest backup, it
//! restores the one before).
#![allow(dead_code)]

pub mod kv;
pub mod web;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;
use shakedown::k8s::exec::exec;
use shakedown::node::config::{BUSYBOX_IMAGE, ETCD_IMAGE};

pub const NS: &str = "app";

/// The app profile of the test application (etcd 3.5 as a StatefulSet, its operator): the
/// data workload, its probes and its selected kill. `tests/app_target.rs` adds the partition's
/// probe and the operator's backup and restore templates.
pub const ETCD_PROFILE: &str = r#"
namespace = "app"
statefulset = "etcd"
claim = "data"
operator = "etcd-operator"
op_timeout = "180s"

[data]
selector = "app=etcd"
write = ["sh", "-c", "etcdctl --endpoints=$ENDPOINTS --command-timeout=5s put {key} {value}"]
read = ["sh", "-c", "out=$(etcdctl --endpoints=$ENDPOINTS --command-timeout=5s get --prefix {prefix}) && { [ -z \"$out\" ] || printf '%s\\n' \"$out\" | paste -d ' ' - -; }"]
interval = "100ms"
writers = 2

[[probes]]
name = "every member healthy"
selector = "app=etcd"
command = ["sh", "-c", "etcdctl --endpoints=$ENDPOINTS --command-timeout=3s endpoint health"]

[[probes]]
name = "the client Service answers"
http = { service = "etcd", port = "client", path = "/health", contains = "true" }

[[probes]]
name = "the operator is available"
object = { api_version = "apps/v1", kind = "Deployment", name = "etcd-operator", field = "status.conditions[Available].status", equals = "True" }

[pod_kill_selected]
selector = "app=etcd"
percent = 50
"#;

/// The pods' start script: an existing data directory restarts the member; an empty one
/// bootstraps the cluster (nobody answers yet) or joins once the operator added it back.
const START: &str = r#"
i=${POD_NAME##*-}
peer() { echo "http://$NODE_IP:$((32380 + $1 * 10))"; }
cport=$((32379 + i * 10))
common="--name etcd-$i --data-dir /data/etcd --listen-client-urls http://$NODE_IP:$cport --advertise-client-urls http://$NODE_IP:$cport --listen-peer-urls $(peer $i) --initial-advertise-peer-urls $(peer $i) --initial-cluster-token shakedown-app"
rm -f /tmp/waiting-for-join
# A restore the operator asked for (/backups/restore: the snapshot file and the restore's token),
# not yet done on this replica's data: the data becomes the snapshot's, as a new cluster.
# An empty replica joins whatever cluster there is: a pending restore is not its to do.
if [ -f /backups/restore ]; then
  read file token < /backups/restore
  if [ ! -d /data/etcd/member ]; then echo "$token" > /data/restored; fi
  if [ "$(cat /data/restored 2>/dev/null)" != "$token" ]; then
    rm -rf /data/etcd.restore
    etcdctl snapshot restore "/backups/$file" --name etcd-$i --data-dir /data/etcd.restore \
      --initial-cluster "etcd-0=$(peer 0),etcd-1=$(peer 1),etcd-2=$(peer 2)" --initial-advertise-peer-urls $(peer $i) \
      --initial-cluster-token "shakedown-app-$token" || exit 1
    rm -rf /data/etcd && mv /data/etcd.restore /data/etcd && echo "$token" > /data/restored
  fi
fi
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

/// The operator's custom resources' group.
pub const GROUP: &str = "test.shakedown.dev";

fn cr(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1", kind))
}

/// The operator's CRDs: `EtcdBackup` and `EtcdRestore` (any spec and status; no status
/// subresource, so the operator writes its status with a plain patch).
async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (kind, plural) in [("EtcdBackup", "etcdbackups"), ("EtcdRestore", "etcdrestores")] {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": format!("{plural}.{GROUP}")},
            "spec": {
                "group": GROUP, "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
            }
        }))
        .unwrap();
        api.create(&PostParams::default(), &crd).await.unwrap_or_else(|e| panic!("CRD {plural}: {e}"));
        let established = kube::runtime::wait::conditions::is_crd_established();
        tokio::time::timeout(
            Duration::from_secs(30),
            kube::runtime::wait::await_condition(api.clone(), &format!("{plural}.{GROUP}"), established),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {plural} not established within 30s"))
        .unwrap();
        // Discovery of a new group can lag behind Established by a moment.
        let probe: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &cr(kind));
        let deadline = Instant::now() + Duration::from_secs(30);
        while probe.list(&Default::default()).await.is_err() {
            assert!(Instant::now() < deadline, "{kind} not served within 30s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The etcd StatefulSet and the operator's Deployment, in namespace `app` (opted in); the
/// operator's CRDs; backups go to `backups` (a host directory, mounted in every replica).
pub async fn deploy(client: &Client, backups: &std::path::Path) {
    create_namespace(client, NS).await;
    // node-drain acts on every pod of a node: the node opts in too.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for n in nodes.list(&ListParams::default()).await.unwrap().items {
        let patch = json!({"metadata": {"annotations": {"shakedown.dev/allow-chaos": "true"}}});
        nodes.patch(&n.metadata.name.unwrap(), &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    }
    install_crds(client).await;
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
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "backups", "mountPath": "/backups"}],
                        "readinessProbe": {"exec": {"command": ["sh", "-c", "etcdctl --endpoints=http://$NODE_IP:$((32379 + ${POD_NAME##*-} * 10)) --command-timeout=2s endpoint health"]}, "periodSeconds": 1, "timeoutSeconds": 3},
                    }],
                    "volumes": [{"name": "backups", "hostPath": {"path": backups.display().to_string(), "type": "DirectoryOrCreate"}}],
                },
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}}],
        }
    }))
    .unwrap();
    Api::<StatefulSet>::namespaced(client.clone(), NS).create(&PostParams::default(), &sts).await.unwrap();
    // The clients' Service (the replicas are on the host network, each on ports of its own: the
    // Service's port reaches etcd-0's).
    let svc: k8s_openapi::api::core::v1::Service =
        serde_json::from_value(json!({"metadata": {"name": "etcd"}, "spec": {"selector": {"app": "etcd"}, "ports": [{"name": "client", "port": 32379, "targetPort": 32379}]}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), NS).create(&PostParams::default(), &svc).await.unwrap();
    create_operator(client, NS, "etcd-operator").await;
}

/// Namespace `ns`, opted in to chaos.
pub async fn create_namespace(client: &Client, ns: &str) {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns, "annotations": {"shakedown.dev/allow-chaos": "true"}}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

/// A test operator's Deployment `name` in `ns`: its pod is the operator's presence (the
/// reconcile loop runs in the test process while it is available, see [`operator_present`]).
pub async fn create_operator(client: &Client, ns: &str, name: &str) {
    let op: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "operator", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "100000"]}]}}}
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), ns).create(&PostParams::default(), &op).await.unwrap();
}

/// Whether the test operator's Deployment has an available pod (scaled to zero: it does nothing).
pub async fn operator_present(deps: &Api<Deployment>, name: &str) -> bool {
    deps.get(name).await.ok().and_then(|d| d.status).and_then(|s| s.available_replicas).unwrap_or(0) > 0
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
        let restarts =
            p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).and_then(|c| c.first().map(|c| c.restart_count)).unwrap_or(0);
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
    /// Asked to restore a backup, it restores the one taken before the newest (an off-by-one in
    /// its list of completed backups) when there are two or more.
    RestoreSkipsLastBackup,
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
        let mut taken = 0u64;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let present = operator_present(&deps, "etcd-operator").await;
            if !present {
                continue;
            }
            backups(&client, &mut taken).await;
            restores(&client, bug).await;
            if bug == Some(OperatorBug::PvcLossNeverRebuilt) {
                continue;
            }
            let Ok(list) = pods.list(&ListParams::default().labels("app=etcd")).await else { continue };
            let running: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            let ready: Vec<String> =
                list.items.iter().filter(|p| shakedown::targets::app::data::is_ready(p)).filter_map(|p| p.metadata.name.clone()).collect();
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

async fn set_status(api: &Api<DynamicObject>, name: &str, status: serde_json::Value) {
    let _ = api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"status": status}))).await;
}

fn status_of<'a>(o: &'a DynamicObject, field: &str) -> Option<&'a serde_json::Value> {
    o.data.get("status").and_then(|s| s.get(field))
}

/// The `EtcdBackup`s not handled yet: a snapshot of a Ready replica's member into
/// `/backups/<name>.db`; status `phase` Completed (with `file` and `seq`, its place among the
/// backups) or Failed.
async fn backups(client: &Client, taken: &mut u64) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &cr("EtcdBackup"));
    let Ok(list) = api.list(&ListParams::default()).await else { return };
    for b in list.items.into_iter().filter(|b| status_of(b, "phase").is_none()) {
        let name = b.metadata.name.clone().unwrap_or_default();
        let Some(pod) = shakedown::targets::app::data::ready_pod(client, NS, "app=etcd", None).await else { continue };
        let pod = pod.metadata.name.unwrap_or_default();
        let cmd = format!("etcdctl --endpoints=http://$NODE_IP:$((32379 + ${{POD_NAME##*-}} * 10)) --command-timeout=20s snapshot save /backups/{name}.db");
        match exec(client, NS, &pod, None, &["sh", "-c", &cmd], Duration::from_secs(30)).await {
            Ok(o) if o.code == 0 => {
                *taken += 1;
                set_status(&api, &name, json!({"phase": "Completed", "file": format!("{name}.db"), "seq": *taken})).await;
            }
            Ok(o) => set_status(&api, &name, json!({"phase": "Failed", "message": o.stderr})).await,
            Err(e) => set_status(&api, &name, json!({"phase": "Failed", "message": e.to_string()})).await,
        }
    }
}

/// Scales the StatefulSet and waits until it has that many pods, all Ready.
async fn scale_to(client: &Client, replicas: i32, bound: Duration) -> Result<(), String> {
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    sts.patch("etcd", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}}))).await.map_err(|e| e.to_string())?;
    let deadline = Instant::now() + bound;
    loop {
        let list = pods.list(&ListParams::default().labels("app=etcd")).await.map(|l| l.items).unwrap_or_default();
        if list.len() == replicas as usize && list.iter().all(shakedown::targets::app::data::is_ready) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let pods: Vec<String> = list
                .iter()
                .map(|p| {
                    format!(
                        "{} {} ready={}{}",
                        p.metadata.name.clone().unwrap_or_default(),
                        p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
                        shakedown::targets::app::data::is_ready(p),
                        if p.metadata.deletion_timestamp.is_some() { " terminating" } else { "" }
                    )
                })
                .collect();
            return Err(format!("the StatefulSet not at {replicas} Ready replicas within {bound:?}: {}", pods.join(", ")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The `EtcdRestore`s not handled yet: the backup named in `spec.backup` (with the planted bug,
/// the one before the newest) is restored — the restore marker written to `/backups/restore`,
/// the StatefulSet scaled to zero (its pods' etcd stopped), scaled back (each replica restores
/// the snapshot as it starts, `START`), the marker removed — status `phase` Completed or Failed.
async fn restores(client: &Client, bug: Option<OperatorBug>) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &cr("EtcdRestore"));
    let backups: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &cr("EtcdBackup"));
    let Ok(list) = api.list(&ListParams::default()).await else { return };
    for r in list.items.into_iter().filter(|r| status_of(r, "phase").is_none()) {
        let name = r.metadata.name.clone().unwrap_or_default();
        let token = r.metadata.uid.clone().unwrap_or_default();
        let asked = r.data.get("spec").and_then(|s| s.get("backup")).and_then(|b| b.as_str()).unwrap_or_default().to_string();
        let mut done: Vec<DynamicObject> = backups.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        done.retain(|b| status_of(b, "phase").and_then(|p| p.as_str()) == Some("Completed"));
        done.sort_by_key(|b| status_of(b, "seq").and_then(|s| s.as_u64()).unwrap_or(0));
        let chosen = match bug {
            Some(OperatorBug::RestoreSkipsLastBackup) if done.len() >= 2 => done.get(done.len() - 2),
            _ => done.iter().find(|b| b.metadata.name.as_deref() == Some(asked.as_str())),
        };
        let Some(file) = chosen.and_then(|b| status_of(b, "file")).and_then(|f| f.as_str()).map(str::to_string) else {
            set_status(&api, &name, json!({"phase": "Failed", "message": format!("no completed backup {asked}")})).await;
            continue;
        };
        set_status(&api, &name, json!({"phase": "Running", "from": file})).await;
        let result = async {
            let pod = shakedown::targets::app::data::ready_pod(client, NS, "app=etcd", None)
                .await
                .ok_or("no Ready replica to write the restore marker in")?;
            let pod = pod.metadata.name.unwrap_or_default();
            sh(client, &pod, &format!("echo '{file} {token}' > /backups/restore")).await.ok_or("writing the restore marker failed")?;
            // 120 s: kubelet 1.20 may remove a pod whose container already exited ~40 s (seen
            // once over 60 s) late, a second StopContainer failing "ttrpc: closed"
            // (kubernetes/kubernetes#106712).
            scale_to(client, 0, Duration::from_secs(120)).await?;
            scale_to(client, 3, Duration::from_secs(120)).await?;
            let pod =
                shakedown::targets::app::data::ready_pod(client, NS, "app=etcd", None).await.ok_or("no Ready replica after the restore")?;
            sh(client, &pod.metadata.name.unwrap_or_default(), "rm -f /backups/restore")
                .await
                .ok_or("removing the restore marker failed")?;
            Ok::<(), String>(())
        }
        .await;
        match result {
            Ok(()) => set_status(&api, &name, json!({"phase": "Completed"})).await,
            Err(e) => set_status(&api, &name, json!({"phase": "Failed", "message": e})).await,
        }
    }
}
