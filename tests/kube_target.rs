//! The kube target against a real kube-apiserver (1.20, built by scripts/build-kube-apiserver.sh)
//! with the real Cluster API CRDs, and a test-side stand-in for the Cluster API controllers
//! (tests/kube_common/standin.rs). One apiserver per test; each test tears it down on drop.
#![allow(clippy::await_holding_lock, reason = "a std Mutex serializes the tests that share the machine: held across awaits on purpose")]

mod kube_common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use kube_common::standin::{self, Bug};
use kube_common::{
    cluster, namespace, plan_profile, require_apiserver, shakedown, shakedown_spawn, shakedown_wait, CrdVersions, KubeEnv, NOBODY_TOKEN,
};
use serde_json::{json, Value};
use shakedown::targets::kube::capi::{capi, CapiVersion};
use shakedown::targets::kube::conditions::{condition, rollout, ETCD_CLUSTER_HEALTHY, ETCD_MEMBER_HEALTHY};
use shakedown::targets::kube::{CAPI_PAUSED, PAUSED_BY, RUN_LABEL};

/// One apiserver at a time: on 2 cores three at once starve each other (and the stand-in's
/// timing) enough to make the waits flaky.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The plan profile of these tests (kube_common's).
fn profile() -> String {
    plan_profile("kube-test", "kube target tests: rolling ops, crash/restart, power loss of a site", 6)
}

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
        std::fs::write(dir.path().join("profile.toml"), profile()).unwrap();
        std::fs::write(dir.path().join("kube.toml"), kube_profile(env)).unwrap();
        Files { dir }
    }
    fn p(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().to_string()
    }
}

/// Waits until the KCP's rollout is complete with every Machine healthy.
async fn settled(client: &Client, ns: &str, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi("KubeadmControlPlane", CapiVersion::V1Beta2));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let kcp = serde_json::to_value(api.get(&format!("{name}-cp")).await.unwrap()).unwrap();
        let ok = rollout(&kcp).complete().is_ok() && condition(&kcp, ETCD_CLUSTER_HEALTHY).is_some_and(|c| c.is_true());
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "stand-in did not settle {ns}/{name} within 60s: {:?}; {}",
            rollout(&kcp).complete(),
            standin::diagnostics(ns, name)
        );
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
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi(kind, CapiVersion::V1Beta2));
        for o in api.list(&Default::default()).await.unwrap() {
            out.insert(format!("{kind}/{}", o.metadata.name.unwrap()), o.metadata.resource_version.unwrap());
        }
    }
    out
}

async fn kcp_annotations(client: &Client, ns: &str, name: &str) -> BTreeMap<String, String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi("KubeadmControlPlane", CapiVersion::V1Beta2));
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
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
            .args(["plan", "--seed", &seed.to_string(), "--profile", profile])
            .output()
            .unwrap();
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
    let base = [
        "--target",
        "kube",
        "--kubeconfig",
        &kc,
        "--cluster",
        "chaos/c",
        "--profile",
        &files.p("profile.toml"),
        "--kube-profile",
        &files.p("kube.toml"),
        "--runs-dir",
        &runs,
        "--seeds-dir",
        &seeds,
    ];
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
    assert!(
        out.contains("FAIL: seed") && (out.contains("invariant membership violated") || out.contains("invariant leaks violated")),
        "{out}"
    );
    let record = out.lines().find_map(|l| l.strip_prefix("seed record: ")).expect("a seed record path").to_string();
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains("[target]\nkind = \"kube\"") && text.contains("cluster = \"bug/c\""), "{text}");
    // Replayed against a fresh Cluster with the same controller (the first one keeps its leaked Machine).
    namespace(&client, "bug2").await;
    cluster(&client, "bug2", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _buggy2 = standin::start(client.clone(), "bug2", "c", Duration::from_millis(300), Some(Bug::LeaveOldMachine));
    settled(&client, "bug2", "c").await;
    let (code, out, _) =
        shakedown(&["replay", &record, "--kubeconfig", &kc, "--cluster", "bug2/c", "--runs-dir", &runs, "--seeds-dir", &seeds]).await;
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
        let mut a: Vec<String> =
            ["run", "--seed", "7", "--target", "kube", "--cluster", cluster, "--profile"].iter().map(|s| s.to_string()).collect();
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
    // Of all these runs only the dry run started: the refused ones left no run directory.
    let left: Vec<_> = std::fs::read_dir(&runs).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 1, "only the dry run's directory: {left:?}");

    // Reap: a killed run's ConfigMap and the KCP it paused.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "chaos");
    let cm = serde_json::from_value(json!({"metadata": {"name": "shakedown-sd-dead", "labels": {RUN_LABEL: "sd-dead"}}, "data": {"pid": "999999999", "host": this_host()}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    // A run on another host may be alive (its process cannot be asked from here): only --all takes it.
    let other = serde_json::from_value(json!({"metadata": {"name": "shakedown-sd-elsewhere", "labels": {RUN_LABEL: "sd-elsewhere"}}, "data": {"pid": "999999999", "host": "elsewhere"}})).unwrap();
    cms.create(&PostParams::default(), &other).await.unwrap();
    let kcps: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("KubeadmControlPlane", CapiVersion::V1Beta2));
    kcps.patch(
        "c-cp",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {CAPI_PAUSED: "", PAUSED_BY: "sd-dead"}}})),
    )
    .await
    .unwrap();
    let (code, out, _) = shakedown(&["reap", "--kube", "--kubeconfig", &kc]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("deleted run ConfigMap chaos/shakedown-sd-dead") && out.contains("resumed KubeadmControlPlane chaos/c-cp"),
        "{out}"
    );
    assert!(!out.contains("sd-elsewhere"), "a run on another host is left without --all: {out}");
    assert_eq!(run_configmaps(&client).await, vec!["shakedown-sd-elsewhere".to_string()]);
    let (code, out, _) = shakedown(&["reap", "--kube", "--kubeconfig", &kc, "--all"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("deleted run ConfigMap chaos/shakedown-sd-elsewhere"), "{out}");
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
    api1.replace_status("old", &PostParams::default(), &s).await.unwrap();
    let back = serde_json::to_value(api1.get("old").await.unwrap()).unwrap();
    let c = condition(&back, ETCD_MEMBER_HEALTHY).expect("v1beta1 condition read back");
    assert_eq!(c.text(), "EtcdMemberHealthy=False (Unhealthy: member down)");
    // A v1beta1 condition without a message is valid; a v1beta2 one must have `message`.
    let api2: Api<DynamicObject> = Api::namespaced_with(client.clone(), "v", &capi("Machine", CapiVersion::V1Beta2));
    let m2: DynamicObject = serde_json::from_value(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": "new"},
        "spec": {"clusterName": "c", "bootstrap": {"dataSecretName": "x"}, "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachine", "name": "new"}}})).unwrap();
    let created = api2.create(&PostParams::default(), &m2).await.unwrap();
    let mut s = created.clone();
    s.data["status"] = json!({"conditions": [{"type": "EtcdMemberHealthy", "status": "True", "reason": "Healthy", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let rejected = api2.replace_status("new", &PostParams::default(), &s).await;
    assert!(rejected.is_err(), "the schema requires message on v1beta2 conditions");
    // (apiserver 1.20 takes an empty string for null here, so the message is not empty.)
    s.data["status"]["conditions"][0]["message"] = json!("member healthy");
    api2.replace_status("new", &PostParams::default(), &s).await.unwrap();
    let back = serde_json::to_value(api2.get("new").await.unwrap()).unwrap();
    assert!(condition(&back, ETCD_MEMBER_HEALTHY).unwrap().is_true());
    // Writing the old status again: a resourceVersion conflict.
    let stale = api2.replace_status("new", &PostParams::default(), &s).await;
    assert!(matches!(stale, Err(kube::Error::Api(ref r)) if r.code == 409), "{stale:?}");

    // ci/k8s as `kubectl apply -k` would create it for the Cluster chaos/c: kustomization.yaml's
    // values (marked ← there) set, rendered by kubectl's own kustomize, every object created. The
    // Roles are namespaced and no ClusterRole exists; apiserver 1.20 serves CronJob only as
    // batch/v1beta1 (batch/v1 from 1.21, same schema), so the CronJob alone is created at that
    // version.
    let files = Files::new(&env);
    namespace(&client, "chaos").await;
    namespace(&client, "velero").await;
    let k8s = tempfile::Builder::new().prefix("shakedown-ci-k8s-").tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/k8s");
    // Its files (ci/k8s/farm, a directory, is a kustomization of its own).
    for e in std::fs::read_dir(&src).unwrap().flatten().filter(|e| e.path().is_file()) {
        std::fs::copy(e.path(), k8s.path().join(e.file_name())).unwrap();
    }
    let kz = std::fs::read_to_string(src.join("kustomization.yaml")).unwrap();
    let kz = kz
        .replace("namespace: capi-clusters", "namespace: chaos")
        .replace("cluster-name=my-cluster", "cluster-name=c")
        .replace("profile=nightly", "profile=/etc/shakedown/profile.toml")
        .replace("  - kube-profile.toml", "  - kube-profile.toml\n  - profile.toml");
    assert!(!kz.contains("my-cluster") && !kz.contains("capi-clusters"), "every value of kustomization.yaml was set:\n{kz}");
    std::fs::write(k8s.path().join("kustomization.yaml"), kz).unwrap();
    let names = std::fs::read_to_string(src.join("role-names.patch")).unwrap();
    let names = names
        .replace("[my-cluster-control-plane]", "[c-cp]")
        .replace("[my-cluster-kubeconfig]", "[c-kubeconfig]")
        .replace("[my-cluster]", "[c]");
    assert!(
        !names.lines().filter(|l| !l.starts_with('#')).any(|l| l.contains("my-cluster")),
        "every name of role-names.patch was set:\n{names}"
    );
    std::fs::write(k8s.path().join("role-names.patch"), names).unwrap();
    // The kube profile of the ConfigMap: the tests' one, its condition check by name (what the
    // Role's resourceNames cover, as in ci/k8s/kube-profile.toml).
    let kp = kube_profile(&env).replace("selector = \"cluster.x-k8s.io/cluster-name\"", "name = \"c-cp\"");
    std::fs::write(k8s.path().join("kube-profile.toml"), &kp).unwrap();
    std::fs::write(k8s.path().join("profile.toml"), profile()).unwrap();
    let rendered = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(k8s.path())
        .output()
        .unwrap_or_else(|e| panic!("kubectl (for its kustomize) is needed to render ci/k8s: {e}"));
    assert!(rendered.status.success(), "kubectl kustomize ci/k8s: {}", String::from_utf8_lossy(&rendered.stderr));
    let velero = std::fs::read_to_string(src.join("velero-rbac.yaml")).unwrap().replace("namespace: capi-clusters", "namespace: chaos");
    let mut created = vec![];
    let mut pods = vec![];
    let mut cms: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for text in [String::from_utf8(rendered.stdout).unwrap(), velero] {
        for mut v in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
            if v["kind"] == "CronJob" {
                v["apiVersion"] = json!("batch/v1beta1");
            }
            let (av, kind) = (v["apiVersion"].as_str().unwrap().to_string(), v["kind"].as_str().unwrap().to_string());
            let (g, ver) = av.rsplit_once('/').unwrap_or(("", av.as_str()));
            let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(g, ver, &kind));
            let obj: DynamicObject = serde_json::from_value(v.clone()).unwrap();
            let ns = v["metadata"]["namespace"].as_str().expect("every object of ci/k8s is namespaced").to_string();
            let back = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ar)
                .create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            let back = serde_json::to_value(back).unwrap();
            match kind.as_str() {
                "CronJob" => pods.push(("CronJob", back["spec"]["jobTemplate"]["spec"]["template"].clone())),
                "Job" => pods.push(("Job", back["spec"]["template"].clone())),
                "ConfigMap" => {
                    let data =
                        back["data"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect();
                    cms.insert(back["metadata"]["name"].as_str().unwrap().to_string(), data);
                }
                _ => {}
            }
            created.push(format!("{kind} {ns}/{}", v["metadata"]["name"].as_str().unwrap()));
        }
    }
    created.sort();
    assert_eq!(
        created,
        [
            "ConfigMap chaos/shakedown-target",
            "CronJob chaos/shakedown-nightly",
            "Job chaos/shakedown-seeds",
            "PersistentVolumeClaim chaos/shakedown-nightly",
            "PersistentVolumeClaim chaos/shakedown-seeds",
            "Role chaos/shakedown-cluster",
            "Role chaos/shakedown-run",
            "Role velero/shakedown-velero",
            "RoleBinding chaos/shakedown-cluster",
            "RoleBinding chaos/shakedown-run",
            "RoleBinding velero/shakedown-velero",
            "ServiceAccount chaos/shakedown",
        ]
    );

    // The pods' commands, run as the pods run them, with the ServiceAccount's namespaced Roles
    // only: the binary itself, as uid/gid 65532, with exactly the container's environment
    // (configMapKeyRef, fieldRef and $(VAR) resolved as the kubelet does) plus what the kubelet
    // adds (KUBERNETES_SERVICE_HOST/PORT, and a token of the ServiceAccount from the TokenRequest
    // API with the apiserver's CA at /var/run/secrets/kubernetes.io/serviceaccount, in a private
    // mount namespace), so the client's in-cluster configuration is what authenticates. The
    // volumes' mount paths stand for their directories here (the claim owned by the fsGroup,
    // 65532). The workload cluster's kubeconfig Secret is there (the Role's resourceNames must let
    // the run read it); its credentials are the workload cluster's own (here: the admin of the
    // same apiserver), which is what reads Nodes, PersistentVolumes and VolumeAttachments.
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    env.workload_secret(&client, "chaos", "c").await;
    let _standin = standin::start(client.clone(), "chaos", "c", Duration::from_millis(200), None);
    settled(&client, "chaos", "c").await;
    let sa = tokio::time::timeout(Duration::from_secs(30), sa_token(&client, "chaos", "shakedown"))
        .await
        .expect("a ServiceAccount token within 30s");
    let want = seed_with(&files, &["rolling-replace", "crash"]).await;
    let sandbox = PodSandbox::new(&env, &sa, &cms["shakedown-target"]);
    for (kind, template) in &pods {
        let pod = &template["spec"];
        assert_eq!(pod["securityContext"]["runAsUser"], 65532, "{kind}");
        assert_eq!(pod["serviceAccountName"], "shakedown");
        let index = (want % 8).to_string();
        // What the Job controller gives an Indexed Job's pod: the index annotation, and
        // JOB_COMPLETION_INDEX appended after the container's own env.
        let extra: &[(&str, &str)] = if *kind == "Job" { &[("JOB_COMPLETION_INDEX", &index)] } else { &[] };
        let annotations: &[(&str, &str)] = if *kind == "Job" { &[("batch.kubernetes.io/job-completion-index", &index)] } else { &[] };
        let (mut argv, penv) = pod_command(&pod["containers"][0], "chaos", &cms, annotations, extra);
        // Shortened to test length: the soak's 8 h to 1 s (its first seed starts, stops after a
        // step, tears down), the Job's 4 seeds to 1, its base seed to one whose plan in partition
        // want % 8 is the seed `want` (a rolling replace and a crash: patches and deletes).
        for w in argv
            .windows(2)
            .enumerate()
            .filter_map(|(i, w)| (["--for", "--count", "--seed"].contains(&w[0].as_str())).then_some(i + 1))
            .collect::<Vec<_>>()
        {
            argv[w] = match argv[w - 1].as_str() {
                "--for" => "1s".into(),
                "--count" => "1".into(),
                _ => (want - want % 8).to_string(),
            };
        }
        let (code, out, err) = sandbox.run(&argv, &penv).await;
        assert_eq!(code, 0, "{kind}: `{}` as uid 65532 with the ServiceAccount's token passes", argv.join(" "));
        assert!(!err.contains("forbidden") && !out.contains("workload cluster not observed"), "{kind}: {out}{err}");
        let junit = argv.iter().position(|a| a == "--junit").map(|i| argv[i + 1].clone()).expect("--junit");
        let junit = sandbox.data_path(&junit);
        let xml = std::fs::read_to_string(&junit).unwrap_or_else(|e| panic!("{kind}: JUnit at {}: {e}", junit.display()));
        assert!(xml.contains("<testsuites") && xml.contains("testcase"), "{kind}: {xml}");
        if *kind == "Job" {
            assert!(out.contains("PASS") && xml.contains(&format!("seed {want}")), "{kind}: {out}\n{xml}");
        }
        let runs = sandbox.data_path("/var/lib/shakedown/runs");
        let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&runs).unwrap());
        assert_eq!(owner, 65532, "{kind}: the run directories were written by uid 65532");
    }
    assert!(run_configmaps(&client).await.is_empty(), "teardown deleted the runs' ConfigMaps");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED));
}

/// A token of ServiceAccount `ns/name` from the TokenRequest API (what the kubelet mounts).
async fn sa_token(client: &Client, ns: &str, name: &str) -> String {
    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}});
    let tr: Value = api.create_subresource("token", name, &PostParams::default(), &req).await.unwrap();
    tr["status"]["token"].as_str().expect("a token").to_string()
}

/// A container's command line and environment as the kubelet makes them: configMapKeyRef and
/// fieldRef (metadata.namespace, the pod's `annotations`) resolved, `$(VAR)` expanded in env
/// values with the variables defined before them, in command and args with all of them;
/// `appended` are what a controller adds after the container's own env (an Indexed Job's
/// JOB_COMPLETION_INDEX), so no value of the manifest's env sees them.
fn pod_command(
    c: &Value,
    ns: &str,
    cms: &BTreeMap<String, BTreeMap<String, String>>,
    annotations: &[(&str, &str)],
    appended: &[(&str, &str)],
) -> (Vec<String>, Vec<(String, String)>) {
    let mut env: Vec<(String, String)> = vec![];
    let expand = |s: &str, env: &[(String, String)]| env.iter().fold(s.to_string(), |acc, (k, v)| acc.replace(&format!("$({k})"), v));
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = match (
            e["value"].as_str(),
            e.pointer("/valueFrom/configMapKeyRef"),
            e.pointer("/valueFrom/fieldRef/fieldPath").and_then(Value::as_str),
        ) {
            (Some(v), _, _) => expand(v, &env),
            (None, Some(r), _) => cms[r["name"].as_str().unwrap()][r["key"].as_str().unwrap()].clone(),
            (None, None, Some("metadata.namespace")) => ns.to_string(),
            (None, None, Some(p)) if p.starts_with("metadata.annotations['") => {
                let key = p.trim_start_matches("metadata.annotations['").trim_end_matches("']");
                annotations.iter().find(|(k, _)| *k == key).map(|(_, v)| v.to_string()).unwrap_or_default()
            }
            _ => panic!("env {name}: a source this test does not resolve: {e}"),
        };
        env.push((name, value));
    }
    // What a controller appends (the kubelet expands a value only from variables before it).
    for (k, v) in appended {
        if !env.iter().any(|(n, _)| n == k) {
            env.push((k.to_string(), v.to_string()));
        }
    }
    let argv = c["command"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(c["args"].as_array().into_iter().flatten())
        .map(|a| expand(a.as_str().unwrap(), &env))
        .collect();
    (argv, env)
}

/// What a pod of ci/k8s gets from the kubelet, on this machine: a data directory owned by uid
/// 65532 for the claim at /var/lib/shakedown, the ConfigMap's files for /etc/shakedown,
/// and the ServiceAccount token directory (mounted by [`PodSandbox::run`] in a private mount
/// namespace over /run, which is /var/run).
struct PodSandbox {
    dir: tempfile::TempDir,
    server: String,
}

impl PodSandbox {
    fn new(env: &KubeEnv, token: &str, config: &BTreeMap<String, String>) -> PodSandbox {
        let dir = tempfile::Builder::new().prefix("shakedown-pod-").tempdir().unwrap();
        let d = dir.path();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        for sub in ["data", "etc", "sa"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        std::os::unix::fs::chown(d.join("data"), Some(65532), Some(65532)).unwrap();
        // The ConfigMap volume: one file per key.
        for (k, v) in config {
            std::fs::write(d.join("etc").join(k), v).unwrap();
            std::fs::set_permissions(d.join("etc").join(k), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        std::fs::write(d.join("sa/token"), token).unwrap();
        std::fs::write(d.join("sa/namespace"), "chaos").unwrap();
        std::fs::copy(env.dir.path().join("certs/apiserver.crt"), d.join("sa/ca.crt")).unwrap();
        for f in ["sa/token", "sa/namespace", "sa/ca.crt"] {
            std::fs::set_permissions(d.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        PodSandbox { dir, server: env.server.clone() }
    }

    /// Where a path of the pod is here.
    fn data_path(&self, pod_path: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(self.map(pod_path))
    }

    fn map(&self, s: &str) -> String {
        let d = self.dir.path().display();
        s.replace("/var/lib/shakedown", &format!("{d}/data")).replace("/etc/shakedown", &format!("{d}/etc"))
    }

    /// Runs `argv` (argv[0] the image's /usr/local/bin/shakedown, here the test binary) as uid and
    /// gid 65532 with exactly `penv` and the kubelet's service variables.
    async fn run(&self, argv: &[String], penv: &[(String, String)]) -> (i32, String, String) {
        assert_eq!(argv[0], "/usr/local/bin/shakedown");
        let port = self.server.rsplit(':').next().unwrap().to_string();
        let sa = self.dir.path().join("sa");
        let script = format!(
            "set -e; mount -t tmpfs -o mode=755 tmpfs /run; mkdir -p /run/secrets/kubernetes.io/serviceaccount; cp {}/token {}/ca.crt {}/namespace /run/secrets/kubernetes.io/serviceaccount/; exec setpriv --reuid 65532 --regid 65532 --clear-groups -- \"$@\"",
            sa.display(),
            sa.display(),
            sa.display()
        );
        let mut cmd = tokio::process::Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c", &script, "sh", env!("CARGO_BIN_EXE_shakedown")]);
        cmd.args(argv[1..].iter().map(|a| self.map(a)));
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("RUST_LOG", "warn")
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", &port);
        for (k, v) in penv {
            cmd.env(k, self.map(v));
        }
        cmd.current_dir("/").kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
            .await
            .expect("the pod's command finished within 300s")
            .expect("unshare runs");
        let (o, e) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
        eprintln!(
            "$ (pod, uid 65532) {}\n--- env {penv:?}\n--- exit {:?}\n--- stdout\n{o}--- stderr\n{e}",
            argv.join(" "),
            out.status.code()
        );
        (out.status.code().unwrap_or(-1), o, e)
    }
}

/// The plan profile of the storage test: disk ops and Velero, with Machine churn between them.
fn storage_profile() -> String {
    let weights =
        [("rolling-replace", 1), ("crash", 1), ("restart", 3), ("disk-detach", 3), ("disk-reattach", 3), ("backup", 2), ("restore", 2)];
    kube_common::plan_profile_weighted(
        "kube-storage",
        "kube target tests: disk detach/reattach in the workload cluster, Velero backup and restore",
        8,
        &weights,
    )
}

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
            va.spec.source.persistent_volume_name.as_deref() == Some(pv)
                && va.status.as_ref().is_some_and(|s| s.attached)
                && va.metadata.deletion_timestamp.is_none()
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
    std::fs::write(files.p("storage.toml"), storage_profile()).unwrap();
    std::fs::write(files.p("kube-storage.toml"), storage_kube_profile(&env)).unwrap();
    for ns in ["chaos", "probe", "velero"] {
        namespace(&client, ns).await;
    }
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    // One worker (the stand-in runs no MachineSet: the test makes the worker's Machine).
    let mds: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("MachineDeployment", CapiVersion::V1Beta2));
    mds.patch("c-md-0", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await.unwrap();
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("Machine", CapiVersion::V1Beta2));
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
        let mut a: Vec<String> = [
            "run",
            "--seed",
            &seed,
            "--target",
            "kube",
            "--kubeconfig",
            &kc,
            "--cluster",
            "chaos/c",
            "--profile",
            &profile,
            "--kube-profile",
            &kube_profile,
            "--runs-dir",
            &runs,
            "--seeds-dir",
            &seeds,
        ]
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
    assert!(
        out.contains("skipped: unavailable on the kube target here: backup and restore need Velero")
            && out.contains("Velero's CRDs (backups.velero.io, restores.velero.io) are not installed"),
        "{out}"
    );

    // 2. With the Secret, the workload cluster is in the inventory: a Node without a Machine, a
    // Released PersistentVolume and a VolumeAttachment of a gone Node are leaks.
    env.workload_secret(&client, "chaos", "c").await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = api_of(&client);
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ghost-node"}})).unwrap(),
        )
        .await
        .unwrap();
    pvs.create(&PostParams::default(), &pv("released-pv")).await.unwrap();
    pvs.patch_status("released-pv", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Released"}}))).await.unwrap();
    let vas: Api<k8s_openapi::api::storage::v1::VolumeAttachment> = api_of(&client);
    let orphan =
        serde_json::from_value(json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "orphan-va"},
        "spec": {"attacher": "standin.csi.example", "nodeName": "gone-node", "source": {"persistentVolumeName": "released-pv"}}}))
        .unwrap();
    vas.create(&PostParams::default(), &orphan).await.unwrap();
    let (code, out, err) = call(run(&[])).await;
    assert_eq!(code, 1, "workload leaks are a violation");
    assert!(out.contains("invariant leaks violated"), "{out}");
    let text = format!("{out}{err}");
    // (Only ghost-node: the worker's and the control plane's Nodes have their Machines.)
    for leak in [
        "Node(s) without a Machine: ghost-node; ",
        "PersistentVolume(s) Released or Failed: released-pv (Released)",
        "VolumeAttachment(s) whose Node is gone: orphan-va (node gone-node)",
    ] {
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
    let run_dir = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap())
        .unwrap();
    let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    assert!(
        events.contains("PersistentVolume probe-pv attached again")
            && events.contains("VolumeAttachment(s) of PersistentVolume probe-pv deleted"),
        "{events}"
    );
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
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "shakedown-sd-dead", "labels": {RUN_LABEL: "sd-dead"}}, "data": {"pid": "999999999", "host": this_host()}})).unwrap())
        .await
        .unwrap();
    let b: DynamicObject = serde_json::from_value(json!({"apiVersion": "velero.io/v1", "kind": "Backup", "metadata": {"name": "shakedown-sd-dead-b0", "labels": {RUN_LABEL: "sd-dead"}}, "spec": {}})).unwrap();
    velero_api(&client, "Backup").create(&PostParams::default(), &b).await.unwrap();
    let (code, out, _) = shakedown(&["reap", "--kube", "--kubeconfig", &kc]).await;
    assert_eq!(code, 0);
    assert!(out.contains("deleted Velero Backup velero/shakedown-sd-dead-b0"), "{out}");
    assert!(velero_api(&client, "Backup").list(&Default::default()).await.unwrap().items.is_empty());
}

/// This machine's host name, as a run's ConfigMap records it.
fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string()
}

/// Sends SIGINT to a running shakedown.
fn sigint(child: &tokio::process::Child) {
    let pid = child.id().expect("shakedown still running") as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
}

/// Waits (bounded) until `pred` holds for Cluster c's KubeadmControlPlane in chaos.
async fn kcp_until(client: &Client, what: &str, pred: impl Fn(&DynamicObject) -> bool) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("KubeadmControlPlane", CapiVersion::V1Beta2));
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
    let args = |seed: &str, kube: &str| kube_common::run_args(seed, &kc, &profile, kube, &runs, &seeds);
    let spawn = |a: Vec<String>| {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        shakedown_spawn(&refs)
    };
    let paused = |k: &DynamicObject| k.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PAUSED_BY));
    let crash_first = seed_in(&profile, &["restart"], Some("crash(")).to_string();

    // A finalizer holds the crashed Machine (as a provider's does while it deletes the VM), so
    // that the crash step is still running when the test signals: a 16 ms step between two
    // 50 ms polls let the signal land steps later (CI: "stopped after 4 checked steps").
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), "chaos", &capi("Machine", CapiVersion::V1Beta2));
    let hold = |on: bool| json!({"metadata": {"finalizers": if on { json!(["standin.test/hold"]) } else { Value::Null }}});
    let hold_all = |on: bool| {
        let machines = machines.clone();
        async move {
            for m in machines.list(&Default::default()).await.unwrap() {
                machines.patch(&m.metadata.name.unwrap(), &PatchParams::default(), &Patch::Merge(hold(on))).await.unwrap();
            }
        }
    };
    let crash_waiting = || async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !machines.list(&Default::default()).await.unwrap().items.iter().any(|m| m.metadata.deletion_timestamp.is_some()) {
            assert!(Instant::now() < deadline, "the crash never deleted a Machine");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };

    // Once: the crash step finishes and is checked, then the run stops and cleans up.
    hold_all(true).await;
    let child = spawn(args(&crash_first, &files.p("kube.toml")));
    kcp_until(&client, "paused by the run", paused).await;
    crash_waiting().await;
    sigint(&child);
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold_all(false).await;
    let (code, _, err) = shakedown_wait(child, Duration::from_secs(120)).await;
    assert_eq!(code, 130, "interrupted");
    assert!(err.contains("stopped on request after 1 checked steps"), "{err}");
    assert!(run_configmaps(&client).await.is_empty(), "the run's ConfigMap was removed");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED), "KubeadmControlPlane resumed");
    settled(&client, "chaos", "c").await;

    // Twice, while the crash waits (KubeadmControlPlane paused) for a Machine that a finalizer
    // holds (as a provider's finalizer does while it deletes the VM): stops at once, cleans up.
    hold_all(true).await;
    let child = spawn(args(&crash_first, &files.p("kube.toml")));
    kcp_until(&client, "paused by the run", paused).await;
    crash_waiting().await;
    let t0 = Instant::now();
    sigint(&child);
    tokio::time::sleep(Duration::from_millis(300)).await;
    sigint(&child);
    let (code, _, err) = shakedown_wait(child, Duration::from_secs(60)).await;
    assert_eq!(code, 130);
    assert!(t0.elapsed() < Duration::from_secs(20), "a second Ctrl-C stops at once: {:?}", t0.elapsed());
    assert!(
        err.contains("stopping now") && !err.lines().any(|l| l.contains("crash(") && l.contains("checks ok")),
        "stopped inside the crash step: {err}"
    );
    assert!(run_configmaps(&client).await.is_empty(), "the run's ConfigMap was removed");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED), "KubeadmControlPlane resumed");
    hold_all(false).await;
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
    let target = [
        "--target",
        "kube",
        "--kubeconfig",
        &kc,
        "--cluster",
        "chaos/c",
        "--profile",
        &profile_s,
        "--kube-profile",
        &kp,
        "--runs-dir",
        &runs,
        "--seeds-dir",
        &seeds,
    ];
    let mut args = vec!["run", "--seed", &seed_s];
    args.extend_from_slice(&target);
    let (code, out, _) = shakedown(&args).await;
    assert_eq!(code, 1, "the hook-paused member still reports healthy: {out}");
    assert!(out.contains("invariant members violated") && out.contains("(pause(m"), "{out}");
    let record = out.lines().find_map(|l| l.strip_prefix("seed record: ")).expect("a seed record").to_string();

    // Shrink: candidates against the same Cluster.
    let (code, out, err) =
        shakedown(&["shrink", &record, "--kubeconfig", &kc, "--max-runs", "12", "--runs-dir", &runs, "--seeds-dir", &seeds]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Cluster chaos/c") && out.contains("→ 1 ops"), "{out}");
    let shrunk = shakedown::record::SeedRecord::load(std::path::Path::new(&record)).unwrap().shrunk.expect("a shrunk plan");
    assert_eq!(shrunk.ops.len(), 1);
    assert_eq!(shrunk.ops[0].kind(), shakedown::faults::OpKind::Pause);
    // Every candidate ran on the kube target.
    let group = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("shrink-"))
        .expect("the shrink's directory");
    let candidates: Vec<_> =
        std::fs::read_dir(&group).unwrap().flatten().map(|e| e.path()).filter(|p| p.join("events.jsonl").is_file()).collect();
    assert!(!candidates.is_empty());
    for c in &candidates {
        let start = shakedown::events::read(&c.join("events.jsonl")).unwrap().into_iter().next().expect("run-start").event;
        assert!(
            matches!(start, shakedown::events::Event::RunStart { target: shakedown::targets::TargetSpec::Kube(_), .. }),
            "{}: {start:?}",
            c.display()
        );
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
    let soak = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("soak-"))
        .expect("the soak's directory");
    let junit = std::fs::read_to_string(soak.join("junit.xml")).unwrap();
    assert!(junit.contains("classname=\"shakedown.kube-pause.kube\""), "{junit}");
    assert!(run_configmaps(&client).await.is_empty(), "every run removed its ConfigMap");
    assert!(!kcp_annotations(&client, "chaos", "c").await.contains_key(CAPI_PAUSED), "no run left KCP paused");
}

/// A management cluster of Cluster API before 1.10 serves only v1beta1: shakedown finds that by
/// discovery and speaks v1beta1 — its reads (the Cluster's failure domains as a map, KCP's
/// machine template reference by apiVersion, v1beta1 conditions) and its writes (a dry run
/// prints them: `rolloutAfter`, the template reference with `apiVersion`, v1beta1 paths). The
/// probes' HTTPS client verifies the serving certificate against a CA file it is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_v1beta1_by_discovery_and_https_probes_with_a_ca_file() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = require_apiserver();
    let env = KubeEnv::start_serving(&bin, CrdVersions::V1Beta1Only).await;
    let client = env.client().await;
    namespace(&client, "old").await;
    let v1 = |kind: &str| capi(kind, CapiVersion::V1Beta1);
    let create = |kind: &'static str, body: Value| {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "old", &v1(kind));
        async move {
            api.create(&PostParams::default(), &serde_json::from_value(body).unwrap())
                .await
                .unwrap_or_else(|e| panic!("creating {kind}: {e}"))
        }
    };
    assert!(
        Api::<DynamicObject>::namespaced_with(client.clone(), "old", &capi("Cluster", CapiVersion::V1Beta2))
            .list(&ListParams::default())
            .await
            .is_err(),
        "v1beta2 is not served"
    );
    create("Cluster", json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "metadata": {"name": "c", "annotations": {"shakedown.dev/allow-chaos": "true"}},
        "spec": {"controlPlaneRef": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane", "name": "c-cp"},
                 "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DevCluster", "name": "c"}}})).await;
    let fds = json!({"fd-a": {"controlPlane": true}, "fd-b": {"controlPlane": true}, "fd-c": {"controlPlane": true}});
    Api::<DynamicObject>::namespaced_with(client.clone(), "old", &v1("Cluster"))
        .patch_status("c", &PatchParams::default(), &Patch::Merge(json!({"status": {"failureDomains": fds}})))
        .await
        .unwrap();
    create("KubeadmControlPlane", json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane", "metadata": {"name": "c-cp", "labels": {"cluster.x-k8s.io/cluster-name": "c"}},
        "spec": {"replicas": 3, "version": "v1.29.0",
                 "machineTemplate": {"infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DevMachineTemplate", "name": "c-cp-v1.29.0"}},
                 "kubeadmConfigSpec": {"format": "cloud-config"}}})).await;
    for (i, fd) in ["fd-a", "fd-b", "fd-c"].iter().enumerate() {
        let m = create("Machine", json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "metadata": {"name": format!("c-cp-{i}"), "labels": {"cluster.x-k8s.io/cluster-name": "c", "cluster.x-k8s.io/control-plane": ""}},
            "spec": {"clusterName": "c", "version": "v1.29.0", "failureDomain": fd, "bootstrap": {"dataSecretName": "x"},
                     "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DevMachine", "name": format!("c-cp-{i}")}}})).await;
        let mut s = m.clone();
        s.data["status"] =
            json!({"conditions": [{"type": "EtcdMemberHealthy", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        Api::<DynamicObject>::namespaced_with(client.clone(), "old", &v1("Machine"))
            .replace_status(&format!("c-cp-{i}"), &PostParams::default(), &s)
            .await
            .unwrap();
    }
    let files = Files::new(&env);
    let ca = env.dir.path().join("certs/apiserver.crt");
    std::fs::write(
        files.p("kube.toml"),
        format!("[versions.\"3.5\"]\nkubernetes = \"v1.30.0\"\nmachine_template = \"c-cp-v1.30.0\"\n[[probes]]\nurl = \"{}/readyz\"\nca_file = \"{}\"\n", env.server, ca.display()),
    )
    .unwrap();
    let seed = seed_with(&files, &["rolling-replace", "rolling-upgrade"]).await.to_string();
    let kc = env.kubeconfig.to_string_lossy().to_string();
    let args = |kube: &str| -> Vec<String> {
        [
            "run",
            "--seed",
            &seed,
            "--target",
            "kube",
            "--kubeconfig",
            &kc,
            "--cluster",
            "old/c",
            "--profile",
            &files.p("profile.toml"),
            "--kube-profile",
            kube,
            "--dry-run",
            "--runs-dir",
            &files.p("runs"),
            "--seeds-dir",
            &files.p("seeds"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let a = args(&files.p("kube.toml"));
    let (code, out, err) = shakedown(&a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let kcp = "PATCH /apis/controlplane.cluster.x-k8s.io/v1beta1/namespaces/old/kubeadmcontrolplanes/c-cp";
    assert!(out.lines().any(|l| l.contains(kcp) && l.contains(r#""rolloutAfter""#)), "a v1beta1 rollout request: {out}");
    assert!(
        out.lines().any(|l| l.contains(kcp) && l.contains(r#""machineTemplate":{"infrastructureRef":{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"DevMachineTemplate","name":"c-cp-v1.30.0"}}"#)),
        "a v1beta1 machine template reference: {out}"
    );
    assert!(!out.contains("v1beta2"), "nothing asked of v1beta2: {out}");

    // The probe's CA file: read before anything is asked of the cluster; a missing one is the
    // profile's error (exit 2).
    std::fs::write(files.p("bad-ca.toml"), format!("[[probes]]\nurl = \"{}/readyz\"\nca_file = \"/nonexistent/ca.pem\"\n", env.server))
        .unwrap();
    let a = args(&files.p("bad-ca.toml"));
    let (code, _, err) = shakedown(&a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot read the CA file /nonexistent/ca.pem"), "{err}");
    // The apiserver's self-signed serving certificate: trusted through the CA file, refused by
    // the system's roots, accepted unverified only with `insecure`.
    use shakedown::targets::kube::command::HttpProber;
    let readyz = format!("{}/readyz", env.server);
    let t = Duration::from_secs(5);
    HttpProber::new(Some(&ca), false).unwrap().get(&readyz, t).await.expect("verified against the CA file");
    let refused = HttpProber::new(None, false)
        .unwrap()
        .get(&readyz, t)
        .await
        .expect_err("a self-signed certificate is not trusted by the system's roots")
        .to_string();
    assert!(refused.to_lowercase().contains("certificate"), "{refused}");
    HttpProber::new(None, true).unwrap().get(&readyz, t).await.expect("insecure accepts it");
    std::fs::write(files.p("empty.pem"), "not a certificate\n").unwrap();
    let e = HttpProber::new(Some(std::path::Path::new(&files.p("empty.pem"))), false)
        .err()
        .expect("a CA file without certificates is an error")
        .to_string();
    assert!(e.contains("holds no PEM certificate"), "{e}");
}

/// Issue 13 on the kube target: with `[api]` in the kube profile, the API workload writes and
/// watches ConfigMaps in the workload cluster (the Cluster's `<name>-kubeconfig`) during
/// rollouts, a failure domain's power loss and a Velero restore (which restores the management
/// cluster's namespace: every acknowledged write must stay); `api-reachability`, `api-durability` and `api-watch` are checked after
/// every step; the run's namespace is gone after teardown, and after a `kill -9` `reap --kube`
/// removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_workload_in_the_workload_cluster_is_checked_and_cleaned_up() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = require_apiserver();
    let env = KubeEnv::start(&bin).await;
    let client = env.client().await;
    let files = Files::new(&env);
    let api_profile = format!(
        "{}[velero]\ntimeout = \"30s\"\n[api]\n[api.load]\nclients = 2\nobjects = 8\nwatches = 2\ninterval = \"10ms\"\n",
        kube_profile(&env)
    );
    std::fs::write(files.p("kube-api.toml"), api_profile).unwrap();
    // The test profile with Velero's backup and restore on, and room for them.
    let plan_profile =
        profile().replace("steps = 6", "steps = 9").replace("backup = 0", "backup = 2").replace("restore = 0", "restore = 3");
    std::fs::write(files.p("api.toml"), plan_profile).unwrap();
    for ns in ["chaos", "velero"] {
        namespace(&client, ns).await;
    }
    cluster(&client, "chaos", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    env.workload_secret(&client, "chaos", "c").await;
    env.install_velero_crds().await;
    let (_velero, _) = standin::velero(client.clone(), "velero", standin::VeleroEnd::Completed);
    let _standin = standin::start(client.clone(), "chaos", "c", Duration::from_millis(200), None);
    settled(&client, "chaos", "c").await;
    let (profile, kube, runs, seeds) = (files.p("api.toml"), files.p("kube-api.toml"), files.p("runs"), files.p("seeds"));
    let kc = env.kubeconfig.to_string_lossy().to_string();
    // Rollouts, a failure domain's power loss and a Velero restore, each under API traffic.
    let seed = seed_in(&profile, &["restart(", "rolling-", "power-loss", "restore("], None).to_string();
    let args: Vec<String> = [
        "run",
        "--seed",
        &seed,
        "--target",
        "kube",
        "--kubeconfig",
        &kc,
        "--cluster",
        "chaos/c",
        "--profile",
        &profile,
        "--kube-profile",
        &kube,
        "--runs-dir",
        &runs,
        "--seeds-dir",
        &seeds,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    // A namespace the kube profile names must exist: bad input, said before anything is written.
    std::fs::write(files.p("kube-api-nons.toml"), format!("{}[api]\nnamespace = \"nope\"\n", kube_profile(&env))).unwrap();
    let nons: Vec<&str> =
        refs.iter()
            .map(|a| {
                if *a == kube.as_str() {
                    files.dir.path().join("kube-api-nons.toml").to_str().unwrap().to_string().leak() as &str
                } else {
                    a
                }
            })
            .collect();
    let (code, _, err) = shakedown(&nons).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("kube profile [api]: namespace nope does not exist in the workload cluster"), "{err}");
    assert!(run_configmaps(&client).await.is_empty(), "refused before the run's ConfigMap");
    let (code, out, err) = shakedown(&refs).await;
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("api-durability ("), "the API invariants are checked: {err}");
    let run_dir = std::path::PathBuf::from(out.lines().find_map(|l| l.strip_prefix("run directory: ")).unwrap());
    let events: Vec<Value> =
        std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let checks: Vec<&Value> = events.iter().filter(|e| e["event"] == "check").collect();
    assert!(checks.len() > 3);
    for c in &checks {
        let passed: Vec<&str> = c["invariants"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["verdict"] == "pass")
            .map(|i| i["invariant"].as_str().unwrap())
            .collect();
        for a in ["api-reachability", "api-durability", "api-watch", "api-linearizability"] {
            assert!(passed.contains(&a), "step {}: {passed:?}", c["step"]);
        }
    }
    let end = events.iter().find(|e| e["event"] == "teardown").unwrap();
    assert!(end["workload"]["api"]["acked"].as_u64().unwrap() > 20, "{end}");
    assert!(end["workload"]["api"]["watch_events"].as_u64().unwrap() > 0, "{end}");
    // The API workload's requests are not the target's observation: still no polling reads.
    assert_eq!(end["workload"]["reads_since_connect"], json!({}), "{end}");
    let run_namespaces = |client: Client| async move {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
        api.list(&ListParams::default().labels(RUN_LABEL))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .filter_map(|n| n.metadata.name)
            .collect::<Vec<_>>()
    };
    // (Deleted: terminating. The test apiserver runs no namespace controller to finish it.)
    assert!(run_namespaces(client.clone()).await.is_empty(), "the run's namespace was deleted");
    let locks: Api<ConfigMap> = Api::namespaced(client.clone(), "chaos");
    assert!(locks.list(&ListParams::default().labels(RUN_LABEL)).await.unwrap().items.is_empty(), "the run's ConfigMap was deleted");

    // kill -9 after the first checks: the namespace stays; reap --kube removes it.
    let child = shakedown_spawn(&refs);
    let deadline = Instant::now() + Duration::from_secs(60);
    while run_namespaces(client.clone()).await.is_empty() {
        assert!(Instant::now() < deadline, "the run never created its namespace");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGKILL) };
    let _ = shakedown_wait(child, Duration::from_secs(30)).await;
    assert_eq!(run_namespaces(client.clone()).await.len(), 1, "a killed run leaves its namespace");
    let (code, out, _) = shakedown(&["reap", "--kube", "--kubeconfig", &kc]).await;
    assert_eq!(code, 0);
    assert!(out.contains("deleted API workload namespace shakedown-sd-"), "{out}");
    assert!(run_namespaces(client.clone()).await.is_empty());
}
