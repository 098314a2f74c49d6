//! A second test application, with a primary: `kv`, three replicas of a key-value store (each
//! pod its own single-member etcd on the host network, data in an emptyDir), one of them the
//! primary, and an operator for it written for the tests that fails over when the primary is
//! lost.
//!
//! Replication follows the operator's roles (the file `roles` in a host directory mounted at
//! `/cluster` in every replica: `<primary ordinal> <sync standby ordinal or ->`; the operator's
//! stand-in for the state store a real one keeps, Patroni's DCS say). A write goes to the primary
//! and is acknowledged once the sync standby has it too (synchronous replication); with no sync
//! standby the primary refuses writes (Patroni's strict synchronous mode). A standby becomes the
//! sync standby only once it holds every key of the primary. So a failover to the sync standby
//! loses no acknowledged write. `kv-1` is a delayed standby (it applies the primary's
//! writes 5 s after it sees them, as a replica kept for recovering from bad writes; tagged
//! never-to-promote, as Patroni's `nofailover`). The operator labels the primary's pod
//! `role=primary` (the others `role=standby`): shakedown kills it by that selector.
//!
//! Planted bug `FailoverPromotesStaleReplica`: the failover promotes the first Ready standby by
//! ordinal, ignoring the delayed standby's tag — after losing `kv-0` it promotes `kv-1`, which is
//! up to 5 s behind: the writes acknowledged in those seconds are lost.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;
use shakedown::k8s::exec::exec;
use shakedown::node::config::ETCD_IMAGE;
use shakedown::targets::app::data::is_ready;

pub const NS: &str = "kv";
/// The replica that is a delayed standby (never to be promoted).
pub const DELAYED: u32 = 1;

/// The app profile of `kv` for shakedown: writes and reads in the primary, the primary killed by
/// its label.
pub const PROFILE: &str = r#"
namespace = "kv"
statefulset = "kv"
operator = "kv-operator"
op_timeout = "60s"

[data]
selector = "role=primary"
write = ["sh", "/tmp/kv", "put", "{key}", "{value}"]
read = ["sh", "/tmp/kv", "dump", "{prefix}"]
interval = "100ms"

[[probes]]
name = "the primary answers"
selector = "role=primary"
command = ["sh", "/tmp/kv", "dump", "none"]

[[probes]]
name = "a sync standby"
selector = "role=primary"
command = ["sh", "-c", "read p s < /cluster/roles && [ \"$s\" != - ]"]

[pod_kill_selected]
selector = "role=primary"
count = 1

[pod_failure]
image = "shakedown.local/pause:3.4"
duration = "10s"
"#;

/// The replicas' start script: the store's commands (`/tmp/kv put|dump`, run in the primary),
/// replication (`/tmp/replicate`: `etcdctl make-mirror` for a standby, a 5 s delay line fed by
/// `etcdctl watch` for the delayed one), the replica's etcd, and a loop that follows the
/// primary the roles name.
const START: &str = r#"
i=${POD_NAME##*-}
ep() { echo "http://$NODE_IP:$((33379 + $1 * 10))"; }
me=$(ep $i)
cat > /tmp/kv <<'KV'
# kv put KEY VALUE: on the primary; acknowledged once the sync standby has it too.
# kv dump PREFIX: the primary's keys and values, a pair a line.
ep() { echo "http://$NODE_IP:$((33379 + $1 * 10))"; }
read p s < /cluster/roles || exit 3
[ "$p" = "${POD_NAME##*-}" ] || { echo "not the primary (the primary is kv-$p)" >&2; exit 3; }
e="etcdctl --command-timeout=2s --endpoints"
case $1 in
put)
  [ "$s" = - ] && { echo "no sync standby: writes refused" >&2; exit 4; }
  $e $(ep $p) put "$2" "$3" >/dev/null || exit 1
  for t in $(seq 20); do
    [ "$($e $(ep $s) get --print-value-only "$2")" = "$3" ] && exit 0
    sleep 0.1
  done
  echo "the sync standby kv-$s does not have $2" >&2; exit 2;;
dump)
  # The store's answer, or a failure: a failed get must not read as an empty store.
  out=$($e $(ep $p) get --prefix "$2") || exit 1
  [ -z "$out" ] || printf '%s\n' "$out" | paste -d ' ' - -;;
esac
KV
cat > /tmp/replicate <<'REP'
# replicate PRIMARY ME DELAY: the primary's writes copied into this replica's etcd, at once
# (DELAY 0) or DELAY seconds after this replica saw them.
if [ "$3" = 0 ]; then
  while true; do etcdctl --endpoints=$1 make-mirror --no-dest-prefix $2; sleep 1; done
fi
: > /tmp/feed
etcdctl --endpoints=$1 watch --prefix "" --rev=1 | while read -r op && read -r k && read -r v; do
  [ "$op" = PUT ] && echo "$(date +%s) $k $v"; done >> /tmp/feed &
n=0
while true; do
  awk -v cut=$(( $(date +%s) - $3 )) -v n=$n 'NR > n && $1 <= cut { print $2, $3 }' /tmp/feed > /tmp/batch
  while read -r k v; do etcdctl --endpoints=$2 put "$k" "$v" >/dev/null; n=$((n + 1)); done < /tmp/batch
  sleep 1
done
REP
peer=http://127.0.0.1:$((33380 + i * 10))
# The pod a kill replaced may still run a moment (its deletion does not wait for its processes)
# and hold the host's ports: until they are free, its etcd would answer for this replica.
port=$((33379 + i * 10))
while netstat -ltn | grep -qE ":($port|$((port + 1))) "; do sleep 0.2; done
etcd --name kv-$i --data-dir /data/etcd --listen-client-urls $me --advertise-client-urls $me \
  --listen-peer-urls $peer --initial-advertise-peer-urls $peer --initial-cluster kv-$i=$peer \
  --initial-cluster-token kv-$i >/tmp/etcd.log 2>&1 &
etcd=$!
touch /tmp/started
delay=0; [ $i = 1 ] && delay=5
following=""; rep=""
while kill -0 $etcd 2>/dev/null; do
  read p s < /cluster/roles 2>/dev/null
  if [ "$p" != "$following" ]; then
    [ -n "$rep" ] && kill -9 -$rep
    rep=""; following=$p
    if [ -n "$p" ] && [ "$p" != $i ]; then echo "following kv-$p"; setsid sh /tmp/replicate $(ep $p) $me $delay & rep=$!; fi
  fi
  sleep 0.5
done
"#;

/// Writes the roles (`<primary> <sync standby or ->`) atomically.
fn write_roles(cluster: &Path, primary: u32, sync: Option<u32>) {
    let tmp = cluster.join("roles.tmp");
    std::fs::write(&tmp, format!("{primary} {}\n", sync.map_or("-".to_string(), |s| s.to_string()))).unwrap();
    std::fs::rename(&tmp, cluster.join("roles")).unwrap();
}

fn read_roles(cluster: &Path) -> Option<(u32, Option<u32>)> {
    let text = std::fs::read_to_string(cluster.join("roles")).ok()?;
    let mut it = text.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()))
}

/// Whether standby `c` holds every key primary `p` holds (compared in the primary's pod). A
/// get that fails is a no: an unanswered get of the primary once read as an empty primary, which
/// every standby holds.
async fn caught_up(client: &Client, p: u32, c: u32) -> bool {
    let cmd = format!(
        "e='etcdctl --command-timeout=2s --endpoints'; \
         $e http://$NODE_IP:{} get '' --prefix --keys-only > /tmp/p.all && \
         $e http://$NODE_IP:{} get '' --prefix --keys-only > /tmp/c.all && \
         {{ grep . /tmp/p.all | sort > /tmp/p; grep . /tmp/c.all | sort > /tmp/c; \
         ! grep -vxF -f /tmp/c /tmp/p >/dev/null; }}",
        33379 + p * 10,
        33379 + c * 10
    );
    exec(client, NS, &format!("kv-{p}"), None, &["sh", "-c", &cmd], Duration::from_secs(10)).await.is_ok_and(|o| o.code == 0)
}

/// The `kv` StatefulSet (kv-0 the primary, kv-2 its sync standby) and its operator's
/// Deployment, in namespace `kv` (opted in); the roles in `cluster` (a host directory).
pub async fn deploy(client: &Client, cluster: &Path) {
    std::fs::create_dir_all(cluster).unwrap();
    write_roles(cluster, 0, Some(2));
    super::create_namespace(client, NS).await;
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "kv"},
        "spec": {
            "replicas": 3, "serviceName": "kv", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "kv"}},
            "template": {
                "metadata": {"labels": {"app": "kv"}},
                "spec": {
                    "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "kv", "image": ETCD_IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", START],
                        "env": [
                            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "ETCDCTL_API", "value": "3"},
                        ],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "cluster", "mountPath": "/cluster"}],
                        "readinessProbe": {"exec": {"command": ["sh", "-c", "test -f /tmp/started && etcdctl --endpoints=http://$NODE_IP:$((33379 + ${POD_NAME##*-} * 10)) --command-timeout=2s endpoint health"]}, "periodSeconds": 1, "timeoutSeconds": 3},
                    }],
                    "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cluster", "hostPath": {"path": cluster.display().to_string(), "type": "Directory"}}],
                },
            },
        }
    }))
    .unwrap();
    Api::<StatefulSet>::namespaced(client.clone(), NS).create(&PostParams::default(), &sts).await.unwrap();
    super::create_operator(client, NS, "kv-operator").await;
}

/// Waits until the three replicas are Ready, one of them labelled the primary, and the
/// operator is available.
pub async fn settled(client: &Client, bound: Duration) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + bound;
    loop {
        let list = pods.list(&ListParams::default().labels("app=kv")).await.map(|l| l.items).unwrap_or_default();
        let ready = list.iter().filter(|p| is_ready(p)).count();
        let primary = list.iter().filter(|p| is_ready(p) && role(p) == Some("primary")).count();
        let op = deps.get("kv-operator").await.ok().and_then(|d| d.status).and_then(|s| s.available_replicas).unwrap_or(0);
        if ready == 3 && primary == 1 && op == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "kv did not settle within {bound:?}: {ready}/3 Ready, {primary} Ready primary, operator {op}/1");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn role(p: &Pod) -> Option<&str> {
    p.metadata.labels.as_ref().and_then(|l| l.get("role")).map(String::as_str)
}

fn ordinal(p: &Pod) -> Option<u32> {
    p.metadata.name.as_deref()?.strip_prefix("kv-")?.parse().ok()
}

/// Starts over (the operator stopped): roles back to kv-0 primary and kv-2 sync, every replica
/// deleted (its emptyDir with it), until they are Ready again.
pub async fn reset(client: &Client, cluster: &Path) {
    write_roles(cluster, 0, Some(2));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let dp = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    pods.delete_collection(&dp, &ListParams::default().labels("app=kv")).await.unwrap();
}

/// The operator's failover loop (while its Deployment has an available pod): the primary's pod
/// gone, replaced (another UID: its store is empty) or not Ready → the sync standby promoted
/// (with the planted bug: the first Ready standby by ordinal), with no sync standby until a
/// standby that may be promoted (not the delayed one) holds every key of the new primary; every
/// pod labelled with its role.
pub fn start_operator(client: Client, cluster: PathBuf, bug: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let deps: Api<Deployment> = Api::namespaced(client.clone(), NS);
        // The primary's pod UID, once it was Ready.
        let mut primary_uid: Option<String> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let present = super::operator_present(&deps, "kv-operator").await;
            let (Some((p, mut s)), true) = (read_roles(&cluster), present) else { continue };
            let Ok(list) = pods.list(&ListParams::default().labels("app=kv")).await else { continue };
            let list: Vec<Pod> = list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
            let ready = |i: u32| list.iter().find(|x| ordinal(x) == Some(i) && is_ready(x));
            let mut p = p;
            match (ready(p), &primary_uid) {
                (Some(pod), None) => primary_uid = pod.metadata.uid.clone(),
                (Some(pod), Some(uid)) if pod.metadata.uid.as_ref() == Some(uid) => {}
                (_, None) => {}
                _ => {
                    // Lost: promote.
                    let candidate =
                        if bug { (0..3).filter(|i| *i != p).find(|i| ready(*i).is_some()) } else { s.filter(|s| ready(*s).is_some()) };
                    let Some(new) = candidate else { continue };
                    eprintln!("kv operator: kv-{p} lost; promoting kv-{new}");
                    write_roles(&cluster, new, None);
                    primary_uid = ready(new).and_then(|x| x.metadata.uid.clone());
                    (p, s) = (new, None);
                }
            }
            if s.is_none() {
                for c in (0..3).filter(|i| *i != p && *i != DELAYED && ready(*i).is_some()) {
                    if caught_up(&client, p, c).await {
                        eprintln!("kv operator: kv-{c} caught up with kv-{p}: the sync standby");
                        write_roles(&cluster, p, Some(c));
                        break;
                    }
                }
            }
            for pod in &list {
                let want = if ordinal(pod) == Some(p) { "primary" } else { "standby" };
                if role(pod) != Some(want) {
                    let patch = json!({"metadata": {"labels": {"role": want}}});
                    let _ =
                        pods.patch(pod.metadata.name.as_deref().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(patch)).await;
                }
            }
        }
    })
}
