//! The kube target against a real kube-apiserver (1.20, built by scripts/build-kube-apiserver.sh)
//! with the real Cluster API CRDs, and a test-side stand-in for the Cluster API controllers
//! (tests/kube_common/standin.rs). One apiserver per test; each test tears it down on drop.

mod kube_common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use kube_common::standin::{self, Bug};
use kube_common::{cluster, namespace, require_apiserver, shakedown, shakedown_spawn, shakedown_wait, KubeEnv, NOBODY_TOKEN, SA_TOKEN};
use serde_json::{json, Value};
use shakedown::targets::kube::client::capi;
use shakedown::targets::kube::conditions::{condition, rollout, ETCD_CLUSTER_HEALTHY, ETCD_MEMBER_HEALTHY};
use shakedown::targets::kube::{CAPI_PAUSED, PAUSED_BY, RUN_LABEL};

/// One apiserver at a time: on 2 cores three at once starve each other (and the stand-in's
/// timing) enough to make the waits flaky.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The plan profile of these tests: the ops the kube target runs without hooks.
const PROFILE: &str = r#"
name = "kube-test"
description = "kube target tests: rolling ops, crash/restart, power loss of a site"
steps = 6
versions = ["3.4", "3.5"]
[weights]
rolling-upgrade = 3
rolling-replace = 3
crash = 2
restart = 4
site-outage = 1
site-recover = 4
pause = 0
resume = 0
disk-detach = 0
disk-reattach = 0
backup = 0
restore = 0
disk-replace = 0
[timeouts]
converge = "20s"
liveness = "60s"
op = "60s"
"#;

fn kube_profile(env: &KubeEnv) -> String {
    format!(
        r#"
[versions."3.5"]
kubernetes = "v1.30.0"
machine_template = "c-cp-v1.30.0"
[[probes]]
url = "{}/readyz"
insecure = true
[[conditions]]
api_version = "controlplane.cluster.x-k8s.io/v1beta2"
kind = "KubeadmControlPlane"
plural = "kubeadmcontrolplanes"
selector = "cluster.x-k8s.io/cluster-name"
type = "Available"
[timeouts]
rollout = "60s"
"#,
        env.server
    )
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(env: &KubeEnv) -> Files {
        let dir = tempfile::Builder::new().prefix("shakedown-kube-files-").tempdir().unwrap();
        std::fs::write(dir.path().join("profile.toml"), PROFILE).unwrap();
        std::fs::write(dir.path().join("kube.toml"), kube_profile(env)).unwrap();
        Files { dir }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().to_string()
    }
}

/// Waits until the KCP's rollout is complete with every Machine healthy.
async fn settled(client: &Client, ns: &str, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi("KubeadmControlPlane"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let kcp = serde_json::to_value(api.get(&format!("{name}-cp")).await.unwrap()).unwrap();
        let ok = rollout(&kcp).complete().is_ok() && condition(&kcp, ETCD_CLUSTER_HEALTHY).is_some_and(|c| c.is_true());
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "stand-in did not settle {ns}/{name} within 60s: {:?}; {}", rollout(&kcp).complete(), standin::diagnostics(ns, name));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_configmaps(client: &Client) -> Vec<String> {
    let api: Api<ConfigMap> = Api::all(client.clone());
    api.list(&ListParams::default().labels(RUN_LABEL)).await.unwrap().items.into_iter().filter_map(|c| c.metadata.name).collect()
}

async fn resource_versions(client: &Client, ns: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for kind in ["Cluster", "KubeadmControlPlane", "Machine", "MachineDeployment"] {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi(kind));
        for o in api.list(&Default::default()).await.unwrap() {
            out.insert(format!("{kind}/{}", o.metadata.name.unwrap()), o.metadata.resource_version.unwrap());
        }
    }
    out
}

async fn kcp_annotations(client: &Client, ns: &str, name: &str) -> BTreeMap<String, String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi("KubeadmControlPlane"));
    api.get(&format!("{name}-cp")).await.unwrap().metadata.annotations.unwrap_or_default()
}

/// A seed whose plan (kube-test profile) holds every op in `wanted`.
async fn seed_with(files: &Files, wanted: &[&str]) -> u64 {
    seed_in(&files.p("profile.toml"), wanted, None)
}

/// A seed whose plan (profile file `profile`) holds every op in `wanted` (and starts with
/// `first`, when given), without an isolation.
fn seed_in(profile: &str, wanted: &[&str], first: Option<&str>) -> u64 {
    for seed in 1..400u64 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown")).args(["plan", "--seed", &seed.to_string(), "--profile", profile]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let ops: Vec<&str> = text.lines().skip(1).collect();
        let first_ok = match first {
            Some(f) => ops.first().is_some_and(|l| l.contains(f)),
            None => true,
        };
        if first_ok && wanted.iter().all(|w| ops.iter().any(|l| l.contains(w))) && !ops.iter().any(|l| l.contains("isolate")) {
            return seed;
        }
    }
    panic!("no seed below 400 has all of {wanted:?} (first {first:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_plan_passes_then_a_planted_failure_is_recorded_and_replayed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = require_apiserver();
    let env = KubeEnv::start(&bin).await;
    let client = env.client().await;
    let files = Files::new(&env);
    namespace(&client, "chaos").await;
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _standin = standin::start(client.clone(), "chaos", "c", Duration::from_millis(300), None);
    settled(&client, "chaos", "c").await;

    // A seeded plan with a rolling upgrade, a rolling replace and a crash passes, checked after every step.
    let seed = seed_with(&files, &["rolling-upgrade", "rolling-replace", "crash"]).await;
    let kc = env.kubeconfig.to_string_lossy().to_string();
    let runs = files.p("runs");
    let seeds = files.p("seeds");
    let base = ["--target", "kube", "--kubeconfig", &kc, "--cluster", "chaos/c", "--profile", &files.p("profile.toml"), "--kube-profile", &files.p("kube.toml"), "--runs-dir", &runs, "--seeds-dir", &seeds];
    let seed_s = seed.to_string();
    let mut args = vec!["run", "--seed", &seed_s];
    args.extend_from_slice(&base);
    let (code, out, err) = shakedown(&args).await;
    assert_eq!(code, 0, "the seeded plan passes");
    assert!(out.contains("PASS: seed"), "{out}");
    assert!(err.contains("rolling-upgrade(to 3.5)") && err.contains("checks ok"), "{err}");
    // No `<cluster>-kubeconfig` Secret here: the workload checks are skipped, said so, not failed.
    assert!(err.contains("note: workload cluster not observed (no Secret chaos/c-kubeconfig"), "{err}");
    assert!(run_configmaps(&client).await.is_empty(), "teardown removed the run's ConfigMap");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED), "teardown left KCP paused");
    // The event log counts the requests made while waiting on rollouts.
    let run_dir = std::fs::read_dir(&runs).unwrap().flatten().next().unwrap().path();
    let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    let typed = shakedown::events::parse(&events);
    assert!(typed.iter().any(|l| matches!(&l.event, shakedown::events::Event::Target { kind, .. } if kind == "kube-wait")), "{events}");
    // Architecture invariant: waiting and observing read watch caches. Over the whole run
    // (rollouts waited on, probes and a KCP condition check after every step) no GET or LIST
    // was sent after connecting: the only non-watch requests of a step are its writes.
    let teardown = typed.iter().find_map(|l| match &l.event {
        shakedown::events::Event::Teardown { workload, .. } => Some(workload.clone()),
        _ => None,
    });
    let reads = teardown.as_ref().map(|w| w["reads_since_connect"].clone()).expect("a teardown event with the request counts");
    assert_eq!(reads, json!({}), "reads after connecting (the checks must read watch caches): {reads}");

    // The same plan on a Cluster whose controller leaves the old Machine behind during a
    // rollout (and claims it done): detected, recorded, replayed.
    namespace(&client, "bug").await;
    cluster(&client, "bug", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _buggy = standin::start(client.clone(), "bug", "c", Duration::from_millis(300), Some(Bug::LeaveOldMachine));
    settled(&client, "bug", "c").await;
    let base_bug: Vec<&str> = base.iter().map(|a| if *a == "chaos/c" { "bug/c" } else { *a }).collect();
    let mut args = vec!["run", "--seed", &seed_s];
    args.extend_from_slice(&base_bug);
    let (code, out, _) = shakedown(&args).await;
    assert_eq!(code, 1, "a violation");
    assert!(out.contains("FAIL: seed") && (out.contains("invariant membership violated") || out.contains("invariant leaks violated")), "{out}");
    let record = out.lines().find_map(|l| l.strip_prefix("seed record: ")).expect("a seed record path").to_string();
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains("[target]\nkind = \"kube\"") && text.contains("cluster = \"bug/c\""), "{text}");
    // Replayed against a fresh Cluster with the same controller (the first one keeps its leaked Machine).
    namespace(&client, "bug2").await;
    cluster(&client, "bug2", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _buggy2 = standin::start(client.clone(), "bug2", "c", Duration::from_millis(300), Some(Bug::LeaveOldMachine));
    settled(&client, "bug2", "c").await;
    let (code, out, _) = shakedown(&["replay", &record, "--kubeconfig", &kc, "--cluster", "bug2/c", "--runs-dir", &runs, "--seeds-dir", &seeds]).await;
    assert_eq!(code, 1, "the replay fails the same way");
    assert!(out.contains("reproduced 1 of 1"), "{out}");
    assert!(run_configmaps(&client).await.is_empty(), "teardown after failures removed the run's ConfigMaps");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusal_dry_run_reap_and_bad_input() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = require_apiserver();
    let env = KubeEnv::start(&bin).await;
    let client = env.client().await;
    let files = Files::new(&env);
    namespace(&client, "chaos").await;
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    cluster(&client, "chaos", "shy", 3, &["fd-a", "fd-b", "fd-c"], false, "v1.29.0").await;
    let _standin = standin::start(client.clone(), "chaos", "c", Duration::from_millis(200), None);
    settled(&client, "chaos", "c").await;
    let kc = env.kubeconfig.to_string_lossy().to_string();
    let (runs, seeds) = (files.p("runs"), files.p("seeds"));
    let run = |cluster: &'static str, extra: Vec<String>| {
        let mut a: Vec<String> = ["run", "--seed", "7", "--target", "kube", "--cluster", cluster, "--profile"].iter().map(|s| s.to_string()).collect();
        a.push(files.p("profile.toml"));
        a.extend(["--kube-profile".into(), files.p("kube.toml"), "--runs-dir".into(), runs.clone(), "--seeds-dir".into(), seeds.clone()]);
        a.extend(extra);
        a
    };
    let kcargs = vec!["--kubeconfig".to_string(), kc.clone()];
    let call = |a: Vec<String>| async move {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        shakedown(&refs).await
    };

    // Not opted in: refused with exit 4, nothing written.
    let before = resource_versions(&client, "chaos").await;
    let (code, _, err) = call(run("chaos/shy", kcargs.clone())).await;
    assert_eq!(code, 4, "refusal is an environment exit");
    assert!(err.contains("has not opted in") && err.contains("shakedown.dev/allow-chaos"), "{err}");
    assert!(run_configmaps(&client).await.is_empty());

    // Dry run: prints the writes, makes none.
    let mut extra = kcargs.clone();
    extra.push("--dry-run".into());
    let (code, out, _) = call(run("chaos/c", extra)).await;
    assert_eq!(code, 0);
    assert!(out.contains("dry-run: POST /api/v1/namespaces/chaos/configmaps"), "{out}");
    assert!(out.contains("dry-run: PATCH /apis/controlplane.cluster.x-k8s.io/v1beta2/namespaces/chaos/kubeadmcontrolplanes/c-cp"), "{out}");
    assert!(out.contains("none sent"), "{out}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(resource_versions(&client, "chaos").await, before, "a dry run changed objects");
    assert!(run_configmaps(&client).await.is_empty(), "a dry run created its ConfigMap");

    // Bad input: missing Cluster (2), unknown context (2), unparsable kubeconfig (2), a user
    // without RBAC (4).
    let (code, _, err) = call(run("chaos/nope", kcargs.clone())).await;
    assert_eq!(code, 2);
    assert!(err.contains("Cluster chaos/nope not found"), "{err}");
    let mut extra = kcargs.clone();
    extra.extend(["--context".into(), "nope".into()]);
    let (code, _, err) = call(run("chaos/c", extra)).await;
    assert_eq!(code, 2);
    assert!(err.contains("context \"nope\" is not in the kubeconfig"), "{err}");
    std::fs::write(files.p("bad-kubeconfig"), "clusters: [this is: not yaml").unwrap();
    let (code, _, err) = call(run("chaos/c", vec!["--kubeconfig".into(), files.p("bad-kubeconfig")])).await;
    assert_eq!(code, 2);
    assert!(err.contains("cannot load the kubeconfig"), "{err}");
    std::fs::write(files.p("nobody"), env.kubeconfig_text("nobody", NOBODY_TOKEN)).unwrap();
    let (code, _, err) = call(run("chaos/c", vec!["--kubeconfig".into(), files.p("nobody")])).await;
    assert_eq!(code, 4);
    assert!(err.contains("forbidden"), "{err}");

    // Reap: a killed run's ConfigMap and the KCP it paused.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "chaos");
    let cm = serde_json::from_value(json!({"metadata": {"name": "shakedown-sd-dead", "labels": {RUN_LABEL: "sd-dead"}}, "data": {"pid": "999999999", "host": "elsewhere"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let kcps: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("KubeadmControlPlane"));
    kcps.patch("c-cp", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {CAPI_PAUSED: "", PAUSED_BY: "sd-dead"}}}))).await.unwrap();
    let (code, out, _) = shakedown(&["reap", "--kube", "--kubeconfig", &kc]).await;
    assert_eq!(code, 0);
    assert!(out.contains("deleted run ConfigMap chaos/shakedown-sd-dead") && out.contains("resumed KubeadmControlPlane chaos/c-cp"), "{out}");
    assert!(run_configmaps(&client).await.is_empty());
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_in_both_api_versions_and_ci_manifests_on_the_apiserver() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = require_apiserver();
    let env = KubeEnv::start(&bin).await;
    let client = env.client().await;
    namespace(&client, "v").await;

    // A Machine written and read through v1beta1 (conditions with severity, and the v1beta2
    // ones under status.v1beta2), and one through v1beta2.
    let v1 = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Machine"));
    let api1: Api<DynamicObject> = Api::namespaced_with(client.clone(), "v", &v1);
    let m: DynamicObject = serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": "old"},
        "spec": {"clusterName": "c", "bootstrap": {"dataSecretName": "x"}, "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DevMachine", "name": "old"}}})).unwrap();
    let created = api1.create(&PostParams::default(), &m).await.unwrap();
    let mut s = created.clone();
    s.data["status"] = json!({"conditions": [{"type": "EtcdMemberHealthy", "status": "False", "severity": "Error", "reason": "Unhealthy", "message": "member down", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    api1.replace_status("old", &PostParams::default(), serde_json::to_vec(&s).unwrap()).await.unwrap();
    let back = serde_json::to_value(api1.get("old").await.unwrap()).unwrap();
    let c = condition(&back, ETCD_MEMBER_HEALTHY).expect("v1beta1 condition read back");
    assert_eq!(c.text(), "EtcdMemberHealthy=False (Unhealthy: member down)");
    // A v1beta1 condition without a message is valid; a v1beta2 one must have `message`.
    let api2: Api<DynamicObject> = Api::namespaced_with(client.clone(), "v", &capi("Machine"));
    let m2: DynamicObject = serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "new"},
        "spec": {"clusterName": "c", "bootstrap": {"dataSecretName": "x"}, "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachine", "name": "new"}}})).unwrap();
    let created = api2.create(&PostParams::default(), &m2).await.unwrap();
    let mut s = created.clone();
    s.data["status"] = json!({"conditions": [{"type": "EtcdMemberHealthy", "status": "True", "reason": "Healthy", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let rejected = api2.replace_status("new", &PostParams::default(), serde_json::to_vec(&s).unwrap()).await;
    assert!(rejected.is_err(), "the schema requires message on v1beta2 conditions");
    // (apiserver 1.20 takes an empty string for null here, so the message is not empty.)
    s.data["status"]["conditions"][0]["message"] = json!("member healthy");
    api2.replace_status("new", &PostParams::default(), serde_json::to_vec(&s).unwrap()).await.unwrap();
    let back = serde_json::to_value(api2.get("new").await.unwrap()).unwrap();
    assert!(condition(&back, ETCD_MEMBER_HEALTHY).unwrap().is_true());
    // Writing the old status again: a resourceVersion conflict.
    let stale = api2.replace_status("new", &PostParams::default(), serde_json::to_vec(&s).unwrap()).await;
    assert!(matches!(stale, Err(kube::Error::Api(ref r)) if r.code == 409), "{stale:?}");

    // ci/k8s: every manifest is accepted by the apiserver. apiserver 1.20 serves CronJob only as
    // batch/v1beta1 (batch/v1 from 1.21), so the CronJob is created at that version here.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/k8s");
    let mut created = vec![];
    for f in ["rbac.yaml", "cronjob.yaml", "indexed-job.yaml"] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut v: Value = serde::Deserialize::deserialize(doc).unwrap();
            if v["kind"] == "CronJob" {
                v["apiVersion"] = json!("batch/v1beta1");
            }
            let (av, kind) = (v["apiVersion"].as_str().unwrap().to_string(), v["kind"].as_str().unwrap().to_string());
            let (g, ver) = av.rsplit_once('/').unwrap_or(("", av.as_str()));
            let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(g, ver, &kind));
            let obj: DynamicObject = serde_json::from_value(v.clone()).unwrap();
            let api: Api<DynamicObject> = match v["metadata"]["namespace"].as_str() {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            api.create(&PostParams::default(), &obj).await.unwrap_or_else(|e| panic!("{f}: {kind}: {e}"));
            created.push(kind);
        }
    }
    assert_eq!(created, ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CronJob", "Job"]);

    // The ServiceAccount's RBAC is enough for a whole run (token of that ServiceAccount).
    let files = Files::new(&env);
    namespace(&client, "chaos").await;
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _standin = standin::start(client.clone(), "chaos", "c", Duration::from_millis(200), None);
    settled(&client, "chaos", "c").await;
    std::fs::write(files.p("sa"), env.kubeconfig_text("sa", SA_TOKEN)).unwrap();
    let seed = seed_with(&files, &["rolling-replace", "crash"]).await.to_string();
    let (code, out, _) = shakedown(&[
        "run", "--seed", &seed, "--target", "kube", "--kubeconfig", &files.p("sa"), "--cluster", "chaos/c", "--profile", &files.p("profile.toml"), "--kube-profile", &files.p("kube.toml"),
        "--runs-dir", &files.p("runs"), "--seeds-dir", &files.p("seeds"),
    ])
    .await;
    assert_eq!(code, 0, "a run with the ServiceAccount of ci/k8s/rbac.yaml passes");
    assert!(out.contains("PASS"));
}

/// The plan profile of the storage test: disk ops and Velero, with Machine churn between them.
const STORAGE_PROFILE: &str = r#"
name = "kube-storage"
description = "kube target tests: disk detach/reattach in the workload cluster, Velero backup and restore"
steps = 8
versions = ["3.4", "3.5"]
[weights]
rolling-upgrade = 0
rolling-replace = 1
crash = 1
restart = 3
site-outage = 0
site-recover = 0
pause = 0
resume = 0
disk-detach = 3
disk-reattach = 3
backup = 2
restore = 2
disk-replace = 0
[timeouts]
converge = "20s"
liveness = "60s"
op = "60s"
"#;

fn storage_kube_profile(env: &KubeEnv) -> String {
    format!(
        r#"
[disk]
pvc = "probe/data"
timeout = "30s"
[velero]
timeout = "30s"
[[probes]]
url = "{}/readyz"
insecure = true
[timeouts]
rollout = "60s"
"#,
        env.server
    )
}

fn api_of<K>(client: &Client) -> Api<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    Api::all(client.clone())
}

fn velero_api(client: &Client, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), "velero", &shakedown::targets::kube::velero_ar(kind))
}

/// (name, uid) of the attached VolumeAttachment of `pv`, waiting up to 30s for one.
async fn attached(client: &Client, pv: &str) -> (String, String) {
    let api: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = api_of(client);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = api.list(&ListParams::default()).await.unwrap().items.into_iter().find(|va| {
            va.spec.source.persistent_volume_name.as_deref() == Some(pv) && va.status.as_ref().is_some_and(|s| s.attached) && va.metadata.deletion_timestamp.is_none()
        });
        if let Some(va) = found {
            return (va.metadata.name.unwrap(), va.metadata.uid.unwrap());
        }
        assert!(Instant::now() < deadline, "no attached VolumeAttachment of {pv} within 30s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Gaps closed here: the workload cluster (from the `<cluster>-kubeconfig` Secret) in the leak
/// inventory; disk detach/reattach through VolumeAttachments; backup/restore through Velero
/// objects (minimal test CRDs, a Velero stand-in); all against the real apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_cluster_leaks_disks_and_velero() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = require_apiserver();
    let env = KubeEnv::start(&bin).await;
    let client = env.client().await;
    let files = Files::new(&env);
    std::fs::write(files.p("storage.toml"), STORAGE_PROFILE).unwrap();
    std::fs::write(files.p("kube-storage.toml"), storage_kube_profile(&env)).unwrap();
    for ns in ["chaos", "probe", "velero"] {
        namespace(&client, ns).await;
    }
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    // One worker (the stand-in runs no MachineSet: the test makes the worker's Machine).
    let mds: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("MachineDeployment"));
    mds.patch("c-md-0", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await.unwrap();
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("Machine"));
    let worker: DynamicObject = serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "c-md-0-w0", "labels": {"cluster.x-k8s.io/cluster-name": "c", "cluster.x-k8s.io/deployment-name": "c-md-0"}},
        "spec": {"clusterName": "c", "version": "v1.29.0", "bootstrap": {"dataSecretName": "w0"},
                 "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachine", "name": "c-md-0-w0"}}}))
    .unwrap();
    machines.create(&PostParams::default(), &worker).await.unwrap();
    let _standin = standin::start_with(client.clone(), "chaos", "c", Duration::from_millis(300), None, true);
    settled(&client, "chaos", "c").await;

    // The probe workload's volume: a CSI PersistentVolume, the claim probe/data bound to it,
    // attached to the worker's Node by the attacher stand-in.
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = api_of(&client);
    let pv = |name: &str| {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
                     "csi": {"driver": "standin.csi.example", "volumeHandle": name}}}))
        .unwrap()
    };
    pvs.create(&PostParams::default(), &pv("probe-pv")).await.unwrap();
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(client.clone(), "probe");
    let pvc = serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "probe-pv", "storageClassName": ""}}))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    let attacher = standin::attacher(client.clone(), "probe-pv", "c-md-0-w0", Duration::from_millis(500));
    let (_, uid_before) = attached(&client, "probe-pv").await;

    let seed = seed_in(&files.p("storage.toml"), &["disk-detach", "disk-reattach", "backup", "restore"], None).to_string();
    let kc = env.kubeconfig.to_string_lossy().to_string();
    let (runs, seeds) = (files.p("runs"), files.p("seeds"));
    let (profile, kube_profile) = (files.p("storage.toml"), files.p("kube-storage.toml"));
    let run = |extra: &[&str]| {
        let mut a: Vec<String> = ["run", "--seed", &seed, "--target", "kube", "--kubeconfig", &kc, "--cluster", "chaos/c", "--profile", &profile, "--kube-profile", &kube_profile, "--runs-dir", &runs, "--seeds-dir", &seeds]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let call = |a: Vec<String>| async move {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        shakedown(&refs).await
    };

    // 1. No Secret, no Velero: said at the start; disk and backup ops skipped with the reason.
    let (code, out, _) = call(run(&["--dry-run"])).await;
    assert_eq!(code, 0);
    assert!(out.contains("note: workload cluster not observed (no Secret chaos/c-kubeconfig"), "{out}");
    assert!(out.contains("skipped: unavailable on the kube target here: disk ops need [hooks.disk-detach] and [hooks.disk-reattach], or a [disk] volume in the workload cluster"), "{out}");
    assert!(out.contains("skipped: unavailable on the kube target here: backup and restore need Velero") && out.contains("Velero's CRDs (backups.velero.io, restores.velero.io) are not installed"), "{out}");

    // 2. With the Secret, the workload cluster is in the inventory: a Node without a Machine, a
    // Released PersistentVolume and a VolumeAttachment of a gone Node are leaks.
    env.workload_secret(&client, "chaos", "c").await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = api_of(&client);
    nodes.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ghost-node"}})).unwrap()).await.unwrap();
    pvs.create(&PostParams::default(), &pv("released-pv")).await.unwrap();
    pvs.patch_status("released-pv", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Released"}}))).await.unwrap();
    let vas: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = api_of(&client);
    let orphan = serde_json::from_value(json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "orphan-va"},
        "spec": {"attacher": "standin.csi.example", "nodeName": "gone-node", "source": {"persistentVolumeName": "released-pv"}}}))
    .unwrap();
    vas.create(&PostParams::default(), &orphan).await.unwrap();
    let (code, out, err) = call(run(&[])).await;
    assert_eq!(code, 1, "workload leaks are a violation");
    assert!(out.contains("invariant leaks violated"), "{out}");
    let text = format!("{out}{err}");
    // (Only ghost-node: the worker's and the control plane's Nodes have their Machines.)
    for leak in ["Node(s) without a Machine: ghost-node; ", "PersistentVolume(s) Released or Failed: released-pv (Released)", "VolumeAttachment(s) whose Node is gone: orphan-va (node gone-node)"] {
        assert!(text.contains(leak), "{leak} not reported: {text}");
    }
    nodes.delete("ghost-node", &Default::default()).await.unwrap();
    vas.delete("orphan-va", &Default::default()).await.unwrap();
    pvs.delete("released-pv", &Default::default()).await.unwrap();
    // The apiserver's admission put kubernetes.io/pv-protection on it; no controller here takes it off.
    pvs.patch("released-pv", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();

    // 3. With Velero: the plan passes; the disk op deleted the VolumeAttachment and waited for a
    // new one; Backup and Restore objects were created, completed, and removed at teardown.
    env.install_velero_crds().await;
    let (velero, seen) = standin::velero(client.clone(), "velero", standin::VeleroEnd::Completed);
    let (code, out, err) = call(run(&[])).await;
    assert_eq!(code, 0, "the storage plan passes");
    assert!(out.contains("PASS: seed"), "{out}");
    assert!(err.contains("disk-detach(") && err.contains("disk-reattach(") && err.contains("backup") && err.contains("restore(b"), "{err}");
    assert!(!err.contains("disk ops need") && !err.contains("backup and restore need"), "{err}");
    let (_, uid_after) = attached(&client, "probe-pv").await;
    assert_ne!(uid_before, uid_after, "the VolumeAttachment was deleted and a new one attached");
    assert!(attacher.writes.load(std::sync::atomic::Ordering::Relaxed) >= 4, "the attacher stand-in recreated the attachment");
    let run_dir = std::fs::read_dir(&runs).unwrap().flatten().map(|e| e.path()).max_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap()).unwrap();
    let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    assert!(events.contains("PersistentVolume probe-pv attached again") && events.contains("VolumeAttachment(s) of PersistentVolume probe-pv deleted"), "{events}");
    assert!(events.contains("Velero Backup velero/shakedown-") && events.contains("Velero Restore velero/shakedown-"), "{events}");
    {
        let seen = seen.lock().unwrap();
        let backup = seen.iter().find(|o| o["kind"] == "Backup").expect("a Backup reached Velero");
        assert_eq!(backup["spec"]["includedNamespaces"], json!(["chaos"]));
        let run_id = backup["metadata"]["labels"][RUN_LABEL].as_str().expect("labelled with the run id").to_string();
        let restore = seen.iter().find(|o| o["kind"] == "Restore").expect("a Restore reached Velero");
        assert!(restore["spec"]["backupName"].as_str().unwrap().starts_with(&format!("shakedown-{run_id}-b")), "{restore}");
    }
    assert!(velero_api(&client, "Backup").list(&Default::default()).await.unwrap().items.is_empty(), "teardown removed the Backups");
    assert!(velero_api(&client, "Restore").list(&Default::default()).await.unwrap().items.is_empty(), "teardown removed the Restores");
    assert!(run_configmaps(&client).await.is_empty());
    drop(velero);

    // 4. A Backup that ends PartiallyFailed fails the step at once (not at the timeout).
    let (_velero, _) = standin::velero(client.clone(), "velero", standin::VeleroEnd::BackupsPartiallyFailed);
    let (code, out, err) = call(run(&[])).await;
    assert_eq!(code, 3, "a failed backup is a liveness failure");
    let text = format!("{out}{err}");
    assert!(text.contains("Completed: phase PartiallyFailed"), "{text}");
    assert!(!text.contains("not done within"), "a failed Backup ends the wait, not the timeout: {text}");
    assert!(velero_api(&client, "Backup").list(&Default::default()).await.unwrap().items.is_empty(), "teardown removed the failed Backup");

    // 5. reap removes the Velero objects of a run whose process is gone.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "chaos");
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "shakedown-sd-dead", "labels": {RUN_LABEL: "sd-dead"}}, "data": {"pid": "999999999", "host": "elsewhere"}})).unwrap())
        .await
        .unwrap();
    let b: DynamicObject = serde_json::from_value(json!({"apiVersion": "velero.io/v1", "kind": "Backup", "metadata": {"name": "shakedown-sd-dead-b0", "labels": {RUN_LABEL: "sd-dead"}}, "spec": {}})).unwrap();
    velero_api(&client, "Backup").create(&PostParams::default(), &b).await.unwrap();
    let (code, out, _) = shakedown(&["reap", "--kube", "--kubeconfig", &kc]).await;
    assert_eq!(code, 0);
    assert!(out.contains("deleted Velero Backup velero/shakedown-sd-dead-b0"), "{out}");
    assert!(velero_api(&client, "Backup").list(&Default::default()).await.unwrap().items.is_empty());
}

/// Sends SIGINT to a running shakedown.
fn sigint(child: &tokio::process::Child) {
    let pid = child.id().expect("shakedown still running") as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
}

/// Waits (bounded) until `pred` holds for Cluster c's KubeadmControlPlane in chaos.
async fn kcp_until(client: &Client, what: &str, pred: impl Fn(&DynamicObject) -> bool) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("KubeadmControlPlane"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if api.get("c-cp").await.is_ok_and(|k| pred(&k)) {
            return;
        }
        assert!(Instant::now() < deadline, "KubeadmControlPlane never {what} within 60s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Ctrl-C during a kube run (once: the step finishes, then teardown; twice: at once) removes
/// the pause annotation and the run's ConfigMap, exit 130. An apiserver killed mid-wait ends
/// the run with exit 4 within the `unreachable` bound; `reap --kube` against the restarted
/// apiserver removes what the run could not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_runs_and_a_lost_apiserver_clean_up() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = require_apiserver();
    let mut env = KubeEnv::start(&bin).await;
    let client = env.client().await;
    let files = Files::new(&env);
    std::fs::write(files.p("kube-lost.toml"), format!("{}unreachable = \"5s\"\n", kube_profile(&env))).unwrap();
    namespace(&client, "chaos").await;
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    // Slow Machines (1.5s to healthy), so that a rollout is still being waited on when the test acts.
    let _standin = standin::start(client.clone(), "chaos", "c", Duration::from_millis(1500), None);
    settled(&client, "chaos", "c").await;
    let kc = env.kubeconfig.to_string_lossy().to_string();
    let (runs, seeds, profile) = (files.p("runs"), files.p("seeds"), files.p("profile.toml"));
    let args = |seed: &str, kube: &str| -> Vec<String> {
        ["run", "--seed", seed, "--target", "kube", "--kubeconfig", &kc, "--cluster", "chaos/c", "--profile", &profile, "--kube-profile", kube, "--runs-dir", &runs, "--seeds-dir", &seeds].iter().map(|s| s.to_string()).collect()
    };
    let spawn = |a: Vec<String>| {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        shakedown_spawn(&refs)
    };
    let paused = |k: &DynamicObject| k.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PAUSED_BY));
    let crash_first = seed_in(&profile, &["restart"], Some("crash(")).to_string();

    // Once: the crash step finishes and is checked, then the run stops and cleans up.
    let child = spawn(args(&crash_first, &files.p("kube.toml")));
    kcp_until(&client, "paused by the run", paused).await;
    sigint(&child);
    let (code, _, err) = shakedown_wait(child, Duration::from_secs(120)).await;
    assert_eq!(code, 130, "interrupted");
    assert!(err.contains("stopped on request after 1 checked steps"), "{err}");
    assert!(run_configmaps(&client).await.is_empty(), "the run's ConfigMap was removed");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED), "KubeadmControlPlane resumed");
    settled(&client, "chaos", "c").await;

    // Twice, while the crash waits (KubeadmControlPlane paused) for a Machine that a finalizer
    // holds (as a provider's finalizer does while it deletes the VM): stops at once, cleans up.
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("Machine"));
    let hold = |on: bool| json!({"metadata": {"finalizers": if on { json!(["standin.test/hold"]) } else { Value::Null }}});
    for m in machines.list(&Default::default()).await.unwrap() {
        machines.patch(&m.metadata.name.unwrap(), &PatchParams::default(), &Patch::Merge(hold(true))).await.unwrap();
    }
    let child = spawn(args(&crash_first, &files.p("kube.toml")));
    kcp_until(&client, "paused by the run", paused).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !machines.list(&Default::default()).await.unwrap().items.iter().any(|m| m.metadata.deletion_timestamp.is_some()) {
        assert!(Instant::now() < deadline, "the crash never deleted a Machine");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t0 = Instant::now();
    sigint(&child);
    tokio::time::sleep(Duration::from_millis(300)).await;
    sigint(&child);
    let (code, _, err) = shakedown_wait(child, Duration::from_secs(60)).await;
    assert_eq!(code, 130);
    assert!(t0.elapsed() < Duration::from_secs(20), "a second Ctrl-C stops at once: {:?}", t0.elapsed());
    assert!(err.contains("stopping now") && !err.lines().any(|l| l.contains("crash(") && l.contains("checks ok")), "stopped inside the crash step: {err}");
    assert!(run_configmaps(&client).await.is_empty(), "the run's ConfigMap was removed");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED), "KubeadmControlPlane resumed");
    for m in machines.list(&Default::default()).await.unwrap() {
        machines.patch(&m.metadata.name.unwrap(), &PatchParams::default(), &Patch::Merge(hold(false))).await.unwrap();
    }
    settled(&client, "chaos", "c").await;

    // The apiserver goes away while the run waits on a rollout: exit 4, bounded, said clearly.
    let replace_first = seed_in(&profile, &[], Some("rolling-replace")).to_string();
    let child = spawn(args(&replace_first, &files.p("kube-lost.toml")));
    kcp_until(&client, "asked to roll out", |k| k.data.pointer("/spec/rollout/after").is_some()).await;
    env.kill_apiserver();
    let t0 = Instant::now();
    let (code, _, err) = shakedown_wait(child, Duration::from_secs(120)).await;
    assert_eq!(code, 4, "a lost apiserver is an environment failure");
    assert!(err.contains("management cluster"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(60), "ended within the bound: {:?}", t0.elapsed());
    assert!(!err.contains("panicked"), "{err}");
    // Back again: the run could not remove its ConfigMap; reap does.
    env.restart_apiserver().await;
    let client = env.client().await;
    assert_eq!(run_configmaps(&client).await.len(), 1, "the lost run's ConfigMap is still there");
    let (code, out, _) = shakedown(&["reap", "--kube", "--kubeconfig", &kc]).await;
    assert_eq!(code, 0);
    assert!(out.contains("deleted run ConfigMap chaos/shakedown-sd-"), "{out}");
    assert!(run_configmaps(&client).await.is_empty());
}

/// Issue 11: `shrink` and `soak` run on the kube target (never on the local stack): a plan whose
/// `pause` hook claims to pause a member that keeps reporting healthy fails `members`; shrink
/// reduces it to that one op, each candidate a run against the Cluster; a soak of the same
/// profile stops at its first failure with a record and JUnit naming the kube target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrink_and_soak_run_on_the_kube_target() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = require_apiserver();
    let env = KubeEnv::start(&bin).await;
    let client = env.client().await;
    let files = Files::new(&env);
    namespace(&client, "chaos").await;
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _standin = standin::start(client.clone(), "chaos", "c", Duration::from_millis(200), None);
    settled(&client, "chaos", "c").await;
    let profile = files.dir.path().join("pause.toml");
    std::fs::write(
        &profile,
        "name = \"kube-pause\"\nsteps = 5\nversions = [\"3.4\"]\nops = [\"crash\", \"restart\", \"pause\"]\n[weights]\ncrash = 2\nrestart = 3\npause = 1\n[timeouts]\nconverge = \"3s\"\nliveness = \"60s\"\nop = \"60s\"\n",
    )
    .unwrap();
    let kube_pause = files.dir.path().join("kube-pause.toml");
    std::fs::write(&kube_pause, format!("{}\n[hooks.pause]\ncommand = [\"true\"]\n", kube_profile(&env))).unwrap();
    let profile_s = profile.to_string_lossy().to_string();
    // A plan where something comes before the pause, so there is something to shrink away.
    let seed = (1..400u64)
        .find(|&s| {
            let p = shakedown::profiles::load(&profile_s).unwrap();
            let ops = shakedown::faults::generate(s, &p).ops;
            ops.iter().position(|o| o.kind() == shakedown::faults::OpKind::Pause).is_some_and(|i| i >= 2)
        })
        .expect("a seed with a pause after two other ops");
    let kc = env.kubeconfig.to_string_lossy().to_string();
    let (runs, seeds) = (files.p("runs"), files.p("seeds"));
    let kp = kube_pause.to_string_lossy().to_string();
    let seed_s = seed.to_string();
    let target = ["--target", "kube", "--kubeconfig", &kc, "--cluster", "chaos/c", "--profile", &profile_s, "--kube-profile", &kp, "--runs-dir", &runs, "--seeds-dir", &seeds];
    let mut args = vec!["run", "--seed", &seed_s];
    args.extend_from_slice(&target);
    let (code, out, _) = shakedown(&args).await;
    assert_eq!(code, 1, "the hook-paused member still reports healthy: {out}");
    assert!(out.contains("invariant members violated") && out.contains("(pause(m"), "{out}");
    let record = out.lines().find_map(|l| l.strip_prefix("seed record: ")).expect("a seed record").to_string();

    // Shrink: candidates against the same Cluster.
    let (code, out, err) = shakedown(&["shrink", &record, "--kubeconfig", &kc, "--max-runs", "12", "--runs-dir", &runs, "--seeds-dir", &seeds]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Cluster chaos/c") && out.contains("→ 1 ops"), "{out}");
    let shrunk = shakedown::record::SeedRecord::load(std::path::Path::new(&record)).unwrap().shrunk.expect("a shrunk plan");
    assert_eq!(shrunk.ops.len(), 1);
    assert_eq!(shrunk.ops[0].kind(), shakedown::faults::OpKind::Pause);
    // Every candidate ran on the kube target.
    let group = std::fs::read_dir(&runs).unwrap().flatten().map(|e| e.path()).find(|p| p.file_name().unwrap().to_string_lossy().starts_with("shrink-")).expect("the shrink's directory");
    let candidates: Vec<_> = std::fs::read_dir(&group).unwrap().flatten().map(|e| e.path()).filter(|p| p.join("events.jsonl").is_file()).collect();
    assert!(!candidates.is_empty());
    for c in &candidates {
        let start = shakedown::events::read(&c.join("events.jsonl")).unwrap().into_iter().next().expect("run-start").event;
        assert!(matches!(start, shakedown::events::Event::RunStart { target: shakedown::targets::TargetSpec::Kube(_), .. }), "{}: {start:?}", c.display());
    }
    // The shrunk record replays on the kube target.
    let (code, out, _) = shakedown(&["replay", &record, "--kubeconfig", &kc, "--runs-dir", &runs, "--seeds-dir", &seeds]).await;
    assert_eq!(code, 1);
    assert!(out.contains("shrunk plan, 1 of") && out.contains("reproduced 1 of 1"), "{out}");

    // Soak on the kube target, stopping at the first failure.
    let mut args = vec!["soak", "--for", "5m", "--max-failures", "1", "--seed", &seed_s];
    args.extend_from_slice(&target);
    let (code, out, err) = shakedown(&args).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("Cluster chaos/c") && out.contains("--max-failures reached"), "{out}{err}");
    let soak = std::fs::read_dir(&runs).unwrap().flatten().map(|e| e.path()).find(|p| p.file_name().unwrap().to_string_lossy().starts_with("soak-")).expect("the soak's directory");
    let junit = std::fs::read_to_string(soak.join("junit.xml")).unwrap();
    assert!(junit.contains("classname=\"shakedown.kube-pause.kube\""), "{junit}");
    assert!(run_configmaps(&client).await.is_empty(), "every run removed its ConfigMap");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED), "no run left KCP paused");
}
