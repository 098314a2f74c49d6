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
use kube_common::{cluster, namespace, require_apiserver, shakedown, KubeEnv, NOBODY_TOKEN, SA_TOKEN};
use serde_json::{json, Value};
use shakedown::target::kube::client::capi;
use shakedown::target::kube::conditions::{condition, rollout, ETCD_CLUSTER_HEALTHY, ETCD_MEMBER_HEALTHY};
use shakedown::target::kube::{CAPI_PAUSED, PAUSED_BY, RUN_LABEL};

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
        assert!(Instant::now() < deadline, "stand-in did not settle {ns}/{name} within 60s: {:?}", rollout(&kcp).complete());
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
    for seed in 1..400u64 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown")).args(["plan", "--seed", &seed.to_string(), "--profile", &files.p("profile.toml")]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let ops: Vec<&str> = text.lines().skip(1).collect();
        if wanted.iter().all(|w| ops.iter().any(|l| l.contains(w))) && !ops.iter().any(|l| l.contains("isolate")) {
            return seed;
        }
    }
    panic!("no seed below 400 has all of {wanted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_plan_passes_then_a_planted_failure_is_recorded_and_replayed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(bin) = require_apiserver() else { return };
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
    assert!(run_configmaps(&client).await.is_empty(), "teardown removed the run's ConfigMap");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED), "teardown left KCP paused");
    // The event log counts the requests made while waiting on rollouts.
    let run_dir = std::fs::read_dir(&runs).unwrap().flatten().next().unwrap().path();
    let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    assert!(events.contains("\"event\":\"kube-wait\""), "{events}");

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
    assert!(text.contains("target = \"kube\"") && text.contains("cluster = \"bug/c\""), "{text}");
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
    let Some(bin) = require_apiserver() else { return };
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
    let Some(bin) = require_apiserver() else { return };
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
