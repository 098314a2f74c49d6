//! ci/k8s as real pods (issue 31): the in-cluster jobs run on the local node (tests/node.rs) —
//! kubelet, containerd and runc start the image of scripts/build-image.sh, made from this
//! build's own shakedown binary and loaded with `node load`'s import — against a Cluster API
//! Cluster on the node's own apiserver (the test CRDs installed there, the stand-in controllers
//! of tests/kube_common/standin.rs running in this process).
//!
//! What apiserver 1.20 (the node's) cannot take of ci/k8s, and how this test stands in for it:
//! - `batch/v1` CronJob is 1.21+: the CronJob is created as `batch/v1beta1` (the same schema),
//!   suspended (its schedule must not start a run of its own), and the soak runs as a Job made
//!   from its jobTemplate, as `kubectl create job --from=cronjob/…` makes one;
//! - `completionMode: Indexed` is 1.21+ (1.22 beta): 1.20 drops the field and would run the
//!   pods without their index. The Indexed Job's pods are run as one Job per index instead, each
//!   pod template the manifest's with what the Job controller of 1.22+ adds to its pods: the
//!   annotation `batch.kubernetes.io/job-completion-index` (the manifest reads its
//!   JOB_COMPLETION_INDEX from it) and JOB_COMPLETION_INDEX appended to the container's env; one
//!   after the other (the manifest's parallelism: 1).
//!
//! And ci/k8s-app (`--target app` in a pod) against the test application of tests/app_common.
#![allow(clippy::await_holding_lock, reason = "a std Mutex serializes the tests that share the machine: held across awaits on purpose")]

mod app_common;
mod kube_common;

#[path = "common/wait.rs"]
mod wait;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use wait::until;

use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::Client;
use kube_common::standin;
use kube_common::{cluster, install_capi_crds, namespace, CrdVersions};
use serde_json::{json, Value};
use shakedown::node::{Node, NodeBinaries, NodeOptions};
use shakedown::targets::kube::capi::{capi, CapiVersion};
use shakedown::targets::kube::conditions::{condition, rollout, ETCD_CLUSTER_HEALTHY};
use shakedown::targets::kube::{CAPI_PAUSED, PAUSED_BY, RUN_LABEL};

/// One node at a time (the `node` test group runs one such test binary at a time too).
static SERIAL: Mutex<()> = Mutex::new(());

const NS: &str = "chaos";
const CLUSTER: &str = "c";

/// The plan profile of the pods (a file of the ConfigMap): the kube target's ops without hooks,
/// short steps, as tests/kube_target.rs's. A soak's seeds all run on the one Cluster: once one
/// upgraded it, a later seed's upgrade to that version is skipped (found here: it waited for a
/// rollout that never came and failed `membership`).
fn profile() -> String {
    kube_common::plan_profile("in-cluster-test", "ci/k8s on the node: rolling ops, crash/restart, power loss of a site", 4)
}

/// The kube profile of the ConfigMap: ci/k8s/kube-profile.toml's shape (the condition by name,
/// which the Role's resourceNames cover), with a probe of the node's apiserver by its node
/// address (a pod's traffic off the Service's ClusterIP).
fn kube_profile(server: &str) -> String {
    format!(
        r#"
[versions."3.5"]
kubernetes = "v1.30.0"
machine_template = "c-cp-v1.30.0"
[[probes]]
url = "{server}/readyz"
insecure = true
[[conditions]]
api_version = "controlplane.cluster.x-k8s.io/v1beta2"
kind = "KubeadmControlPlane"
plural = "kubeadmcontrolplanes"
name = "c-cp"
type = "Available"
[timeouts]
rollout = "60s"
"#
    )
}

/// Waits until the KubeadmControlPlane's rollout is complete with every Machine healthy.
async fn settled(client: &Client) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi("KubeadmControlPlane", CapiVersion::V1Beta2));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let kcp = serde_json::to_value(api.get("c-cp").await.unwrap()).unwrap();
        if rollout(&kcp).complete().is_ok() && condition(&kcp, ETCD_CLUSTER_HEALTHY).is_some_and(|c| c.is_true()) {
            return;
        }
        assert!(Instant::now() < deadline, "the stand-in did not settle c within 90s: {}", standin::diagnostics(NS, CLUSTER));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn kcp_annotations(client: &Client) -> BTreeMap<String, String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi("KubeadmControlPlane", CapiVersion::V1Beta2));
    api.get("c-cp").await.unwrap().metadata.annotations.unwrap_or_default()
}

async fn run_configmaps(client: &Client) -> Vec<String> {
    let api: Api<ConfigMap> = Api::all(client.clone());
    api.list(&ListParams::default().labels(RUN_LABEL)).await.unwrap().items.into_iter().filter_map(|c| c.metadata.name).collect()
}

/// A seed whose plan (profile file `profile`) starts with `first` and holds every op of
/// `wanted`, without an isolation.
fn seed_in(profile: &Path, wanted: &[&str], first: &str) -> u64 {
    for seed in 1..400u64 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
            .args(["plan", "--seed", &seed.to_string(), "--profile"])
            .arg(profile)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let ops: Vec<&str> = text.lines().skip(1).collect();
        if ops.first().is_some_and(|l| l.contains(first))
            && wanted.iter().all(|w| ops.iter().any(|l| l.contains(w)))
            && !ops.iter().any(|l| l.contains("isolate"))
        {
            return seed;
        }
    }
    panic!("no seed below 400 starts with {first} and has all of {wanted:?}");
}

/// Replaces the value after `flag` in a container's args (adds the pair when missing).
fn set_arg(container: &mut Value, flag: &str, value: &str) {
    let args = container["args"].as_array_mut().expect("args");
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = json!(value),
        None => args.extend([json!(flag), json!(value)]),
    }
}

/// The host directory of a claim's volume (the hostPath provisioner's, inside the node's mount
/// namespace a bind of a directory of the node's own).
async fn claim_dir(client: &Client, node: &Node, ns: &str, claim: &str) -> PathBuf {
    let pvc: PersistentVolumeClaim = Api::namespaced(client.clone(), ns).get(claim).await.unwrap();
    let pv_name = pvc.spec.and_then(|s| s.volume_name).unwrap_or_else(|| panic!("claim {claim} is bound"));
    let pv: PersistentVolume = Api::all(client.clone()).get(&pv_name).await.unwrap();
    let path = pv.spec.and_then(|s| s.host_path).map(|h| h.path).unwrap_or_else(|| panic!("{pv_name} is a hostPath volume"));
    let rel = Path::new(&path).strip_prefix(shakedown::node::volumes::PROVISIONER_DIR).unwrap_or_else(|_| panic!("{path}"));
    node.layout.host_path_dir(shakedown::node::volumes::PROVISIONER_DIR).join(rel)
}

/// What the host sees of a pod's container process: its /proc status lines, whether `/` is
/// mounted read-only, what writing to its root does, its environment, its ServiceAccount token.
#[derive(Debug, Default, Clone)]
struct Seen {
    pid: i32,
    uid: String,
    gid: String,
    cap_eff: String,
    no_new_privs: String,
    seccomp: String,
    root_options: String,
    root_write: String,
    data_write: String,
    env: Vec<String>,
    token: String,
}

/// The process of the pod's container (`/usr/local/bin/shakedown <verb> …` in the node's
/// cgroup), looked at from the host while it runs.
fn container_process(cgroup_root: &str, verb: &str) -> Option<Seen> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let p = e.path();
        let Ok(cmd) = std::fs::read(p.join("cmdline")) else { continue };
        let argv: Vec<String> = cmd.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if argv.first().map(String::as_str) != Some("/usr/local/bin/shakedown") || argv.get(1).map(String::as_str) != Some(verb) {
            continue;
        }
        if !std::fs::read_to_string(p.join("cgroup")).is_ok_and(|c| c.contains(cgroup_root)) {
            continue;
        }
        let status = std::fs::read_to_string(p.join("status")).ok()?;
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{k}:")))
                .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        let mountinfo = std::fs::read_to_string(p.join("mountinfo")).ok()?;
        // id parent major:minor root mountpoint options …: the last mount on `/` is what the
        // process sees there.
        let root_options = mountinfo
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .rfind(|f| f.get(4) == Some(&"/"))
            .and_then(|f| f.get(5).map(|o| o.to_string()))
            .unwrap_or_default();
        let attempt = |path: PathBuf| match std::fs::write(&path, b"x") {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
                "written".to_string()
            }
            Err(e) => e.to_string(),
        };
        let env = std::fs::read(p.join("environ"))
            .map(|b| b.split(|c| *c == 0).map(|a| String::from_utf8_lossy(a).into_owned()).filter(|a| !a.is_empty()).collect())
            .unwrap_or_default();
        return Some(Seen {
            pid,
            uid: field("Uid"),
            gid: field("Gid"),
            cap_eff: field("CapEff"),
            no_new_privs: field("NoNewPrivs"),
            seccomp: field("Seccomp"),
            root_options,
            // As root, through the process's own mounts: only a read-only mount refuses root.
            root_write: attempt(p.join("root/shakedown-probe")),
            data_write: attempt(p.join("root/var/lib/shakedown/.probe")),
            env,
            token: std::fs::read_to_string(p.join("root/var/run/secrets/kubernetes.io/serviceaccount/token")).unwrap_or_default(),
        });
    }
    None
}

/// Looks for the container process every 100 ms (bounded) in a blocking task.
fn watch_process(cgroup_root: String, verb: &'static str, bound: Duration) -> tokio::task::JoinHandle<Option<Seen>> {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if let Some(s) = container_process(&cgroup_root, verb) {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    })
}

/// Waits (bounded) for a Job to finish; panics with its pods' logs when it failed.
async fn job_finished(client: &Client, ns: &str, name: &str, bound: Duration) -> (Pod, String) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + bound;
    loop {
        let job = jobs.get(name).await.unwrap();
        let st = job.status.unwrap_or_default();
        let (ok, failed) = (st.succeeded.unwrap_or(0), st.failed.unwrap_or(0));
        if ok > 0 || failed > 0 || Instant::now() > deadline {
            let list = pods.list(&ListParams::default().labels(&format!("job-name={name}"))).await.unwrap().items;
            let pod = list.into_iter().next().unwrap_or_else(|| panic!("Job {name}: no pod"));
            let logs = pods.logs(pod.metadata.name.as_deref().unwrap(), &LogParams::default()).await.unwrap_or_default();
            assert!(ok == 1 && failed == 0, "Job {name}: succeeded {ok}, failed {failed} (within {bound:?}); its pod's log:\n{logs}");
            return (pod, logs);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The text of every file under `dir`.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else if let Ok(t) = std::fs::read_to_string(&p) {
            out.push(t);
        }
    }
    out
}

fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()?.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
}

/// A client of the node's apiserver with `token` (the host's way in, its CA not checked).
async fn token_client(node: &Node, token: &str) -> Client {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: node\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: sa\n  context:\n    cluster: node\n    user: sa\ncurrent-context: sa\n",
        node.layout.host_server()
    );
    let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    Client::try_from(cfg).unwrap()
}

fn status_code<T: std::fmt::Debug>(r: &Result<T, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("not an answer of the apiserver: {e}"),
    }
}

/// A node with shakedown's image loaded: built by scripts/build-image.sh from this build's
/// binary (the one the node's helpers run too), imported into the node's containerd.
async fn node_with_image(run_prefix: &str) -> (tempfile::TempDir, NodeBinaries, Node) {
    let bins = NodeBinaries::find().unwrap_or_else(|e| panic!("the node's binaries: {e}"));
    let work = tempfile::Builder::new().prefix("shakedown-in-cluster-").tempdir().unwrap();

    // The image, from this build's shakedown (the one the node's helpers run too).
    let archive = work.path().join("shakedown-image.tar");
    let t0 = Instant::now();
    let built = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-image.sh"))
        .arg(&archive)
        .env("SHAKEDOWN_BIN", &bins.shakedown)
        .output()
        .unwrap();
    assert!(built.status.success(), "build-image.sh: {}{}", String::from_utf8_lossy(&built.stdout), String::from_utf8_lossy(&built.stderr));
    let image_build = t0.elapsed();

    let node = Node::up(
        &format!("{run_prefix}{}", std::process::id()),
        &work.path().join("runs"),
        &bins,
        &NodeOptions { set_kernel_tunables: true, workers: 0 },
    )
    .await
    .unwrap_or_else(|e| panic!("node up: {e}"));
    let t0 = Instant::now();
    let loaded = shakedown::node::images::import(&bins.ctr, &node.layout.containerd_socket(), &archive, None).await.unwrap();
    let image_load = t0.elapsed();
    assert!(
        loaded.iter().any(|n| n == "docker.io/library/shakedown:latest"),
        "the image is there by the name a pod's `image: shakedown:latest` means: {loaded:?}"
    );
    println!(
        "image built in {:.1}s ({} MB), loaded in {:.1}s; node Ready in {} ms",
        image_build.as_secs_f64(),
        std::fs::metadata(&archive).unwrap().len() / 1_000_000,
        image_load.as_secs_f64(),
        node.ready_ms
    );
    (work, bins, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ci_k8s_soak_and_seed_jobs_run_as_restricted_pods_on_the_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t_test = Instant::now();
    let (work, bins, mut node) = node_with_image("sd-incluster").await;

    // The management cluster: the Cluster API CRDs, an opted-in Cluster c in chaos, the stand-in
    // controllers (this process) driving it.
    let client = node.client().await.unwrap();
    install_capi_crds(&client, CrdVersions::Both).await;
    namespace(&client, NS).await;
    cluster(&client, NS, CLUSTER, 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _standin = standin::start(client.clone(), NS, CLUSTER, Duration::from_millis(200), None);
    settled(&client).await;

    // ci/k8s as `kubectl kustomize` renders it with kustomization.yaml's values (← there) set.
    let k8s = work.path().join("ci-k8s");
    std::fs::create_dir(&k8s).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/k8s");
    // Its files (ci/k8s/farm, a directory, is a kustomization of its own).
    for e in std::fs::read_dir(&src).unwrap().flatten().filter(|e| e.path().is_file()) {
        std::fs::copy(e.path(), k8s.join(e.file_name())).unwrap();
    }
    let kz = std::fs::read_to_string(src.join("kustomization.yaml")).unwrap();
    let kz = kz
        .replace("namespace: capi-clusters", &format!("namespace: {NS}"))
        .replace("cluster-name=my-cluster", &format!("cluster-name={CLUSTER}"))
        .replace("profile=nightly", "profile=/etc/shakedown/profile.toml")
        .replace("  - kube-profile.toml", "  - kube-profile.toml\n  - profile.toml");
    assert!(!kz.contains("my-cluster") && !kz.contains("capi-clusters"), "every value of kustomization.yaml was set:\n{kz}");
    std::fs::write(k8s.join("kustomization.yaml"), kz).unwrap();
    let names = std::fs::read_to_string(src.join("role-names.patch"))
        .unwrap()
        .replace("[my-cluster-control-plane]", "[c-cp]")
        .replace("[my-cluster-kubeconfig]", "[c-kubeconfig]")
        .replace("[my-cluster]", "[c]");
    std::fs::write(k8s.join("role-names.patch"), names).unwrap();
    std::fs::write(k8s.join("kube-profile.toml"), kube_profile(&node.layout.server())).unwrap();
    std::fs::write(k8s.join("profile.toml"), profile()).unwrap();
    let rendered = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&k8s)
        .output()
        .unwrap_or_else(|e| panic!("kubectl (for its kustomize) is needed to render ci/k8s: {e}"));
    assert!(rendered.status.success(), "kubectl kustomize: {}", String::from_utf8_lossy(&rendered.stderr));
    let mut cronjob = Value::Null;
    let mut indexed = Value::Null;
    for mut v in serde_saphyr::from_multiple::<Value>(&String::from_utf8(rendered.stdout).unwrap()).unwrap() {
        // The loaded image, without a registry (`:latest` would mean imagePullPolicy Always).
        for tpl in ["/spec/jobTemplate/spec/template/spec/containers", "/spec/template/spec/containers"] {
            for c in v.pointer_mut(tpl).and_then(Value::as_array_mut).into_iter().flatten() {
                assert_eq!(c["image"], "shakedown:latest");
                c["imagePullPolicy"] = json!("Never");
            }
        }
        match v["kind"].as_str().unwrap() {
            "CronJob" => {
                v["apiVersion"] = json!("batch/v1beta1");
                v["spec"]["suspend"] = json!(true);
            }
            "Job" => {
                assert_eq!(v["spec"]["completionMode"], "Indexed");
                indexed = v;
                continue;
            }
            _ => {}
        }
        let (av, kind) = (v["apiVersion"].as_str().unwrap().to_string(), v["kind"].as_str().unwrap().to_string());
        let (g, ver) = av.rsplit_once('/').unwrap_or(("", av.as_str()));
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(g, ver, &kind));
        let obj: DynamicObject = serde_json::from_value(v.clone()).unwrap();
        let back = Api::<DynamicObject>::namespaced_with(client.clone(), NS, &ar)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        if kind == "CronJob" {
            cronjob = serde_json::to_value(back).unwrap();
        }
    }
    assert!(cronjob.is_object() && indexed.is_object(), "ci/k8s has the CronJob and the Indexed Job");
    // Pods of the ServiceAccount are admitted once its token Secret exists (1.20).
    until("the ServiceAccount's token", Duration::from_secs(30), || {
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
        async move { sa.get("shakedown").await.ok().filter(|s| s.secrets.as_ref().is_some_and(|v| !v.is_empty())) }
    })
    .await;

    // 1. The nightly soak, as a Job of the CronJob's jobTemplate: 30 s of seeds from seed 1.
    let mut job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "shakedown-nightly-manual", "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
            "ownerReferences": [{"apiVersion": "batch/v1beta1", "kind": "CronJob", "name": "shakedown-nightly", "uid": cronjob["metadata"]["uid"], "controller": true}]},
        "spec": cronjob["spec"]["jobTemplate"]["spec"].clone(),
    });
    let template = job["spec"]["template"].clone();
    let container = &mut job["spec"]["template"]["spec"]["containers"][0];
    set_arg(container, "--for", "30s");
    set_arg(container, "--seed", "1");
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let watch = watch_process(node.layout.cgroup_root.clone(), "soak", Duration::from_secs(120));
    let t0 = Instant::now();
    jobs.create(&PostParams::default(), &serde_json::from_value(job).unwrap()).await.unwrap();
    let seen = watch.await.unwrap().expect("the soak's container process, seen from the host within 120s");
    let (pod, logs) = job_finished(&client, NS, "shakedown-nightly-manual", Duration::from_secs(300)).await;
    let soak_took = t0.elapsed();
    println!("--- the soak pod's log\n{logs}---");
    println!("the container's process (pid {} on the host) as the host sees it: {seen:?}", seen.pid);
    assert_eq!(exit_code(&pod), Some(0), "the soak passed");
    // Restricted, as the kernel has it: uid/gid 65532 (real, effective, saved, fs), no
    // capabilities, no_new_privs, seccomp filtering, and `/` read-only — root itself cannot
    // write there through the container's mounts — while the claim is writable.
    assert_eq!(seen.uid, "65532 65532 65532 65532");
    assert_eq!(seen.gid, "65532 65532 65532 65532");
    assert_eq!(seen.cap_eff, "0000000000000000");
    assert_eq!(seen.no_new_privs, "1");
    assert_eq!(seen.seccomp, "2", "RuntimeDefault: a seccomp filter");
    assert!(seen.root_options.split(',').any(|o| o == "ro"), "/ is mounted read-only: {}", seen.root_options);
    assert!(seen.root_write.contains("Read-only file system"), "writing to / fails with EROFS: {}", seen.root_write);
    assert_eq!(seen.data_write, "written", "the claim at /var/lib/shakedown is writable");
    // The ServiceAccount's own credentials, by the in-cluster configuration: no kubeconfig.
    assert!(seen.env.iter().any(|e| e.starts_with("KUBERNETES_SERVICE_HOST=")), "{:?}", seen.env);
    assert!(!seen.env.iter().any(|e| e.starts_with("KUBECONFIG=")), "{:?}", seen.env);
    let review: TokenReview = Api::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": seen.token.trim()}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let user = review.status.and_then(|s| s.user).and_then(|u| u.username).unwrap_or_default();
    assert_eq!(user, format!("system:serviceaccount:{NS}:shakedown"), "the pod's token is the ServiceAccount's");
    assert!(!logs.contains("forbidden") && !logs.contains("Forbidden"), "every request of the soak was allowed: {logs}");

    // What the soak left on the claim: its directory (soak.jsonl, one line per seed), the run
    // directories, and the JUnit file, written as uid 65532.
    let nightly = claim_dir(&client, &node, NS, "shakedown-nightly").await;
    let junit = std::fs::read_to_string(nightly.join("junit/nightly-soak.xml")).expect("the JUnit file on the claim");
    assert!(junit.contains("<testsuites") && junit.contains("<testcase"), "{junit}");
    let runs: Vec<PathBuf> = std::fs::read_dir(nightly.join("runs")).unwrap().flatten().map(|e| e.path()).collect();
    let soak_dir = runs.iter().find(|p| p.join("soak.jsonl").is_file()).unwrap_or_else(|| panic!("a soak directory in {runs:?}"));
    let seeds: Vec<Value> =
        std::fs::read_to_string(soak_dir.join("soak.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!seeds.is_empty(), "the soak ran seeds");
    for s in &seeds {
        assert!(junit.contains(&format!("seed {}", s["seed"])), "seed {} is a case of the JUnit file: {junit}", s["seed"]);
    }
    // Seed 1 upgrades the Cluster to v1.30.0 and seed 2's plan starts with an upgrade to it: skipped
    // with the reason, in the run's events (the seed passes).
    assert!(seeds.len() >= 2 && seeds[1]["verdict"] == "PASS", "{seeds:?}");
    let seed2 = soak_dir.join(seeds[1]["run_dir"].as_str().unwrap().rsplit('/').next().unwrap());
    assert!(
        files_under(&seed2).iter().any(|t| t.contains("already runs v1.30.0")),
        "seed 2's upgrade to the version seed 1 left is skipped, said so in {}",
        seed2.display()
    );
    let owner = |p: &Path| std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(p).unwrap());
    assert_eq!(owner(&nightly.join("junit/nightly-soak.xml")), 65532);
    assert_eq!(owner(soak_dir), 65532);
    println!(
        "the soak: {} seeds ({}) in {:.1}s from Job creation to its end; {} directories under runs/",
        seeds.len(),
        seeds
            .iter()
            .map(|s| format!("{} {} ({} steps)", s["seed"], s["verdict"].as_str().unwrap_or("?"), s["steps"]))
            .collect::<Vec<_>>()
            .join(", "),
        soak_took.as_secs_f64(),
        runs.len()
    );
    assert!(run_configmaps(&client).await.is_empty(), "the soak's teardown deleted its runs' ConfigMaps");
    assert!(!kcp_annotations(&client).await.contains_key(CAPI_PAUSED));

    // 2. RBAC: the pod's own token may do what a run does and no more.
    let sa = token_client(&node, seen.token.trim()).await;
    let clusters: Api<DynamicObject> = Api::namespaced_with(sa.clone(), NS, &capi("Cluster", CapiVersion::V1Beta2));
    assert_eq!(status_code(&clusters.get(CLUSTER).await), 200, "the token reads its Cluster");
    assert_eq!(status_code(&clusters.delete(CLUSTER, &DeleteParams::default()).await), 403, "deleting the Cluster is refused");
    assert_eq!(
        status_code(&Api::<Secret>::all(sa.clone()).list(&ListParams::default()).await),
        403,
        "listing Secrets cluster-wide is refused"
    );
    let token_secret =
        Api::<ServiceAccount>::namespaced(client.clone(), NS).get("shakedown").await.unwrap().secrets.unwrap()[0].name.clone().unwrap();
    assert_eq!(
        status_code(&Api::<Secret>::namespaced(sa.clone(), NS).get(&token_secret).await),
        403,
        "reading a Secret other than the workload kubeconfig is refused"
    );
    assert_eq!(status_code(&Api::<Pod>::namespaced(sa.clone(), NS).list(&ListParams::default()).await), 403, "pods are not the run's");
    let other: Api<DynamicObject> = Api::namespaced_with(sa.clone(), "default", &capi("Cluster", CapiVersion::V1Beta2));
    assert_eq!(status_code(&other.list(&ListParams::default()).await), 403, "Clusters of another namespace are refused");
    assert!(Api::<Secret>::all(client.clone()).list(&ListParams::default()).await.is_ok(), "(the admin may: the 403s are RBAC's)");

    // 3. SIGTERM, twice: the soak's pod from a seed that starts with a crash, stopped while the
    // crash waits for its Machine (held by a finalizer, as a provider's is while it deletes the
    // VM) — first a pod of its own, deleted (a Job's deleted pod would be replaced at once by a
    // new run: docs/kube-target.md), then a Job of the jobTemplate, the Job deleted (what the
    // docs say to do: its pod gets the SIGTERM, and nothing replaces it).
    let profile_file = work.path().join("profile.toml");
    std::fs::write(&profile_file, profile()).unwrap();
    let crash_first = seed_in(&profile_file, &["restart"], "crash(");
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi("Machine", CapiVersion::V1Beta2));
    let hold_all = |on: bool| {
        let machines = machines.clone();
        async move {
            let fin = if on { json!(["standin.test/hold"]) } else { Value::Null };
            for m in machines.list(&Default::default()).await.unwrap() {
                machines
                    .patch(&m.metadata.name.unwrap(), &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": fin}})))
                    .await
                    .unwrap();
            }
        }
    };
    for stop in ["pod", "job"] {
        let mut tpl = template.clone();
        let container = &mut tpl["spec"]["containers"][0];
        set_arg(container, "--for", "10m");
        set_arg(container, "--seed", &crash_first.to_string());
        set_arg(container, "--junit", &format!("/var/lib/shakedown/junit/sigterm-{stop}.xml"));
        let grace = tpl["spec"]["terminationGracePeriodSeconds"].as_u64().expect("the manifest's grace period");
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let selector = format!("shakedown-stop={stop}");
        tpl["metadata"] = json!({"labels": {"shakedown-stop": stop}});
        hold_all(true).await;
        if stop == "pod" {
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "shakedown-sigterm", "labels": {"shakedown-stop": stop}}, "spec": tpl["spec"].clone()});
            pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
        } else {
            let mut spec = cronjob["spec"]["jobTemplate"]["spec"].clone();
            spec["template"] = tpl.clone();
            let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "shakedown-stop"}, "spec": spec});
            jobs.create(&PostParams::default(), &serde_json::from_value(job).unwrap()).await.unwrap();
        }
        let api_kcp: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi("KubeadmControlPlane", CapiVersion::V1Beta2));
        until("the KubeadmControlPlane paused by the pod's run", Duration::from_secs(120), || {
            let api = api_kcp.clone();
            async move { api.get("c-cp").await.ok().filter(|k| k.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(PAUSED_BY))) }
        })
        .await;
        until("the crash deleting a Machine", Duration::from_secs(60), || {
            let machines = machines.clone();
            async move { machines.list(&Default::default()).await.ok()?.items.into_iter().find(|m| m.metadata.deletion_timestamp.is_some()) }
        })
        .await;
        let cm_during = run_configmaps(&client).await;
        assert_eq!(cm_during.len(), 1, "the run's ConfigMap while it runs: {cm_during:?}");
        // The kubelet reports the running container's id a moment after it started.
        let (pod_name, uid, container_id) = until("the container's id in the pod's status", Duration::from_secs(30), || {
            let (pods, selector) = (pods.clone(), selector.clone());
            async move {
                let p = pods.list(&ListParams::default().labels(&selector)).await.ok()?.items.into_iter().next()?;
                let id = p.status?.container_statuses?.first()?.container_id.clone()?;
                Some((p.metadata.name?, p.metadata.uid?, id.strip_prefix("containerd://")?.to_string()))
            }
        })
        .await;
        let log_file = node.layout.host_path_dir("/var/log/pods").join(format!("{NS}_{pod_name}_{uid}/shakedown/0.log"));
        // The container's exit status, from containerd's own task events (kubelet 1.20 removes the
        // container of a deleted pod at once and reports it as waiting, not terminated).
        let mut events = tokio::process::Command::new(&bins.ctr)
            .arg("--address")
            .arg(node.layout.containerd_socket())
            .arg("events")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("ctr events");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let deleted = Instant::now();
        let deleted_at = std::time::SystemTime::now();
        if stop == "pod" {
            pods.delete(&pod_name, &DeleteParams::default()).await.unwrap();
        } else {
            // `kubectl delete job`: background propagation, the garbage collector deletes the pod.
            jobs.delete("shakedown-stop", &DeleteParams::background()).await.unwrap();
        }
        // The Machine is held until shakedown says it got the signal: the crash step is still
        // running then (the KubeadmControlPlane paused by it), whatever the kubelet's delay.
        until("shakedown told of SIGTERM (its log)", Duration::from_secs(60), || {
            let f = log_file.clone();
            async move { std::fs::read_to_string(f).ok().filter(|l| l.contains("stopping after the current step")) }
        })
        .await;
        let signalled = deleted.elapsed();
        let ann = kcp_annotations(&client).await;
        assert!(ann.contains_key(PAUSED_BY), "the signal came while the crash step ran: {ann:?}");
        hold_all(false).await;
        let mut logs_after = String::new();
        let mut names = std::collections::BTreeSet::new();
        let mut objects_gone = None;
        let pod_gone = loop {
            let left = run_configmaps(&client).await;
            let ann = kcp_annotations(&client).await;
            if objects_gone.is_none() && left.is_empty() && !ann.contains_key(CAPI_PAUSED) && !ann.contains_key(PAUSED_BY) {
                objects_gone = Some(deleted.elapsed());
            }
            let now = pods.list(&ListParams::default().labels(&selector)).await.unwrap().items;
            names.extend(now.iter().filter_map(|p| p.metadata.name.clone()));
            match now.is_empty() {
                // The container's log as the kubelet writes it (CRI format), read from the host
                // until the pod is gone: the API stops serving it once the container is removed.
                false => {
                    if let Ok(l) = std::fs::read_to_string(&log_file) {
                        logs_after = l;
                    }
                }
                true => break deleted.elapsed(),
            }
            assert!(deleted.elapsed() < Duration::from_secs(grace), "the pod was not gone within its grace period ({grace}s)");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let objects_gone = match objects_gone {
            Some(t) => t,
            None => panic!(
                "the run's objects were still there when its pod was gone: ConfigMaps {:?}, KubeadmControlPlane annotations {:?}",
                run_configmaps(&client).await,
                kcp_annotations(&client).await
            ),
        };
        println!("--- the SIGTERM pod's log (last read; {stop} deleted)\n{logs_after}---");
        println!(
            "SIGTERM ({stop} deleted): deletion → the signal in shakedown's log in {:.1}s (the step released then), the run's ConfigMap gone and the KubeadmControlPlane resumed in {:.1}s, the pod gone in {:.1}s (grace period {grace}s)",
            signalled.as_secs_f64(),
            objects_gone.as_secs_f64(),
            pod_gone.as_secs_f64()
        );
        events.start_kill().unwrap();
        let said = tokio::time::timeout(Duration::from_secs(10), events.wait_with_output()).await.expect("ctr events ended").unwrap();
        let said = String::from_utf8_lossy(&said.stdout).to_string();
        let exited = said
            .lines()
            .filter(|l| l.contains("/tasks/exit"))
            .filter_map(|l| serde_json::from_str::<Value>(&l[l.find('{')?..]).ok())
            .find(|v| v["container_id"] == container_id.as_str())
            .unwrap_or_else(|| panic!("no exit of the container in containerd's events:\n{said}"));
        assert_eq!(exited["exit_status"], 130, "shakedown exited 130 (interrupted) on SIGTERM: {exited}");
        let exited_at = humantime::parse_rfc3339(exited["exited_at"].as_str().unwrap()).unwrap();
        let exited_after = exited_at.duration_since(deleted_at).unwrap_or_default();
        println!("SIGTERM ({stop} deleted): the container exited (130) {:.1}s after the deletion", exited_after.as_secs_f64());
        // On its own, long before the grace period (then the kubelet would SIGKILL it: 137).
        assert!(exited_after < Duration::from_secs(60), "{exited_after:?}");
        assert!(
            logs_after.contains("cut short after 1 step") && logs_after.contains("(interrupted)"),
            "the soak finished the crash step and cut its seed short there: {logs_after}"
        );
        assert!(run_configmaps(&client).await.is_empty(), "nothing of the run is left");
        let ann = kcp_annotations(&client).await;
        assert!(!ann.contains_key(CAPI_PAUSED) && !ann.contains_key(PAUSED_BY), "the KubeadmControlPlane resumed: {ann:?}");
        assert_eq!(names.len(), 1, "no pod replaced the stopped one: {names:?}");
        settled(&client).await;
    }

    // 4. The Indexed Job's pods (completions 2 here, parallelism 1): one Job per index, seeds
    // 1000 + i of `--seed 1000 --count 1` in partition i/2, each pod's JUnit on the claim.
    let seeds_dir = claim_dir(&client, &node, NS, "shakedown-seeds").await;
    for i in 0..2 {
        let mut job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": format!("shakedown-seeds-{i}")},
            "spec": {"completions": 1, "parallelism": 1, "backoffLimit": 0, "activeDeadlineSeconds": indexed["spec"]["activeDeadlineSeconds"], "template": indexed["spec"]["template"].clone()}});
        job["spec"]["template"]["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = json!(i.to_string());
        let c = &mut job["spec"]["template"]["spec"]["containers"][0];
        set_arg(c, "--count", "1");
        let env = c["env"].as_array_mut().unwrap();
        for e in env.iter_mut() {
            if e["name"] == "SHAKEDOWN_PARTITION" {
                assert_eq!(e["value"], "$(JOB_COMPLETION_INDEX)/8");
                e["value"] = json!("$(JOB_COMPLETION_INDEX)/2");
            }
        }
        env.push(json!({"name": "JOB_COMPLETION_INDEX", "value": i.to_string()}));
        let t0 = Instant::now();
        jobs.create(&PostParams::default(), &serde_json::from_value(job).unwrap()).await.unwrap();
        let (pod, logs) = job_finished(&client, NS, &format!("shakedown-seeds-{i}"), Duration::from_secs(300)).await;
        println!("--- index {i}: seed {} in {:.1}s\n{logs}---", 1000 + i, t0.elapsed().as_secs_f64());
        assert_eq!(exit_code(&pod), Some(0));
        let xml = std::fs::read_to_string(seeds_dir.join(format!("junit/seeds-1000-{i}.xml"))).expect("the pod's JUnit file on the claim");
        assert!(xml.contains(&format!("seed {}", 1000 + i)) && !xml.contains(&format!("seed {}", 1001 - i)), "index {i}: {xml}");
        assert_eq!(owner(&seeds_dir.join(format!("junit/seeds-1000-{i}.xml"))), 65532);
    }
    assert!(run_configmaps(&client).await.is_empty());

    drop(_standin);
    let left = node.teardown();
    assert!(left.is_empty(), "the node left {left:?}");
    println!("in-cluster test: {:.0}s in all", t_test.elapsed().as_secs_f64());
}

/// The app profile of the test application (app_common's), without the backup and restore
/// templates of tests/app_target.rs (their custom resources are not in ci/k8s-app's Role).
const APP_PROFILE: &str = app_common::ETCD_PROFILE;

/// The plan profile of the app Job: the namespaced ops of ci/k8s-app's Role.
const APP_PLAN: &str = r#"
name = "in-cluster-app"
versions = ["3.5"]
steps = 4
members = 3
sites = 1
stack = "app"
ops = ["pod-kill", "pod-kill-selected", "operator-restart", "pvc-loss"]
invariants = ["leaks", "app-ready", "app-durability", "app-linearizability"]

[timeouts]
converge = "60s"
liveness = "90s"
op = "240s"
"#;

/// ci/k8s-app (`--target app` in a pod) on the node against the test application: the Job's
/// pod runs as uid 65532 with a read-only root, its run passes with the ServiceAccount's own
/// rights (namespaced Role, the Namespace readable by name), the JUnit file lands on the claim,
/// and the token is refused outside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ci_k8s_app_job_runs_the_app_target_as_a_restricted_pod_on_the_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t_test = Instant::now();
    let (work, _bins, mut node) = node_with_image("sd-inclapp").await;
    let client = node.client().await.unwrap();
    let app_ns = app_common::NS;
    app_common::deploy(&client, &work.path().join("backups")).await;
    let operator = app_common::start_operator(client.clone(), None);
    app_common::settled(&client, Duration::from_secs(180)).await;

    // ci/k8s-app rendered with its values (←) set for namespace `app`.
    let k8s = work.path().join("ci-k8s-app");
    std::fs::create_dir(&k8s).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/k8s-app");
    // Its files (ci/k8s/farm, a directory, is a kustomization of its own).
    for e in std::fs::read_dir(&src).unwrap().flatten().filter(|e| e.path().is_file()) {
        std::fs::copy(e.path(), k8s.join(e.file_name())).unwrap();
    }
    let kz = std::fs::read_to_string(src.join("kustomization.yaml"))
        .unwrap()
        .replace("namespace: my-db", &format!("namespace: {app_ns}"))
        .replace("profile=app-smoke", "profile=/etc/shakedown/profile.toml")
        .replace("  - app-profile.toml", "  - app-profile.toml\n  - profile.toml");
    assert!(!kz.contains("my-db"), "every value of kustomization.yaml was set:\n{kz}");
    std::fs::write(k8s.join("kustomization.yaml"), kz).unwrap();
    std::fs::write(
        k8s.join("namespace-name.patch"),
        std::fs::read_to_string(src.join("namespace-name.patch")).unwrap().replace("[my-db]", &format!("[{app_ns}]")),
    )
    .unwrap();
    std::fs::write(k8s.join("app-profile.toml"), APP_PROFILE).unwrap();
    std::fs::write(k8s.join("profile.toml"), APP_PLAN).unwrap();
    let rendered = std::process::Command::new("kubectl").arg("kustomize").arg(&k8s).output().expect("kubectl");
    assert!(rendered.status.success(), "kubectl kustomize: {}", String::from_utf8_lossy(&rendered.stderr));
    let mut job = Value::Null;
    for v in serde_saphyr::from_multiple::<Value>(&String::from_utf8(rendered.stdout).unwrap()).unwrap() {
        if v["kind"] == "Job" {
            job = v;
            continue;
        }
        let (av, kind) = (v["apiVersion"].as_str().unwrap().to_string(), v["kind"].as_str().unwrap().to_string());
        let (g, ver) = av.rsplit_once('/').unwrap_or(("", av.as_str()));
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(g, ver, &kind));
        let api = match v["metadata"]["namespace"].as_str() {
            Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar),
            None => Api::<DynamicObject>::all_with(client.clone(), &ar),
        };
        api.create(&PostParams::default(), &serde_json::from_value(v.clone()).unwrap()).await.unwrap_or_else(|e| panic!("{kind}: {e}"));
        if kind == "ClusterRole" {
            assert_eq!(v["rules"][0]["resourceNames"], json!([app_ns]));
        }
    }
    until("the ServiceAccount's token", Duration::from_secs(30), || {
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), app_ns);
        async move { sa.get("shakedown-app").await.ok().filter(|s| s.secrets.as_ref().is_some_and(|v| !v.is_empty())) }
    })
    .await;
    let c = &mut job["spec"]["template"]["spec"]["containers"][0];
    c["imagePullPolicy"] = json!("Never");
    set_arg(c, "--count", "1");
    let watch = watch_process(node.layout.cgroup_root.clone(), "run", Duration::from_secs(120));
    let t0 = Instant::now();
    Api::<Job>::namespaced(client.clone(), app_ns).create(&PostParams::default(), &serde_json::from_value(job).unwrap()).await.unwrap();
    let seen = watch.await.unwrap().expect("the run's container process, seen from the host within 120s");
    let (pod, logs) = job_finished(&client, app_ns, "shakedown-app", Duration::from_secs(600)).await;
    println!("--- the app Job's pod log ({:.1}s)\n{logs}---", t0.elapsed().as_secs_f64());
    assert_eq!(exit_code(&pod), Some(0), "the run passed");
    assert!(logs.contains("PASS: seed 1000"), "{logs}");
    assert!(!logs.contains("forbidden") && !logs.contains("Forbidden"), "every request of the run was allowed: {logs}");
    assert_eq!(seen.uid, "65532 65532 65532 65532");
    assert_eq!(seen.cap_eff, "0000000000000000");
    assert!(seen.root_write.contains("Read-only file system"), "{}", seen.root_write);
    let claim = claim_dir(&client, &node, app_ns, "shakedown-app").await;
    let xml = std::fs::read_to_string(claim.join("junit/app-1000.xml")).expect("the JUnit file on the claim");
    assert!(xml.contains("seed 1000"), "{xml}");

    // The token may not act outside the namespace's application objects.
    let sa = token_client(&node, seen.token.trim()).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(sa.clone());
    assert_eq!(status_code(&namespaces.get(app_ns).await), 200, "the token reads its namespace (the opt-in)");
    assert_eq!(status_code(&namespaces.get("default").await), 403, "no other namespace");
    assert_eq!(status_code(&namespaces.delete(app_ns, &DeleteParams::default()).await), 403, "deleting the namespace is refused");
    assert_eq!(status_code(&Api::<Secret>::namespaced(sa.clone(), app_ns).list(&ListParams::default()).await), 403, "Secrets are refused");
    assert_eq!(
        status_code(&Api::<Pod>::namespaced(sa.clone(), "default").list(&ListParams::default()).await),
        403,
        "pods of another namespace"
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(sa.clone());
    let patch = Patch::Merge(json!({"spec": {"unschedulable": true}}));
    assert_eq!(
        status_code(&nodes.patch(&node.layout.node_name, &PatchParams::default(), &patch).await),
        403,
        "cordoning the node is refused"
    );
    assert!(run_configmaps(&client).await.is_empty(), "the run's ConfigMap was removed");

    operator.abort();
    let left = node.teardown();
    assert!(left.is_empty(), "the node left {left:?}");
    println!("in-cluster app test: {:.0}s in all", t_test.elapsed().as_secs_f64());
}
