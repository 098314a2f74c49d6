//! The application target (root) against a real application on a real local node: etcd as a
//! StatefulSet with an operator written for the tests (`tests/app_common`). A seeded plan of
//! pod kills, operator restarts, claim losses, a node drain, a backup and a restore passes with every fault verified and
//! `app-ready`, `app-durability` and `leaks` checked after every step; the operator's planted
//! bugs (a restore that skips the newest backup, a lost claim never rebuilt) are caught by
//! `app-durability` and `app-ready`, recorded and replayed; a drain a PodDisruptionBudget blocks
//! fails naming it and lifts its cordon; a partition of a pod-network replica is made by the
//! node's NetworkPolicy engine, verified and healed, two replicas are cut apart while the third
//! still reaches both (`partition-groups`), while a partition whose probe never connects, or one
//! on a network enforcing no policy
//! (the engine stopped) or of a host-network pod is an environment error, not a silent pass, and
//! leaves no policy behind.

mod app_common;
mod common;

use std::path::Path;
use std::time::Duration;

use app_common::{deploy, kv, settled, start_operator, web, OperatorBug, ETCD_PROFILE, GROUP, NS};
use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use shakedown::node::config::BUSYBOX_IMAGE;
use shakedown::node::{Node, NodeBinaries, NodeOptions};

#[path = "common/hostnet.rs"]
mod hostnet;

/// The test application's app profile (app_common's), with the partition's probe and the
/// operator's backup and restore templates.
fn app_profile() -> String {
    format!("{ETCD_PROFILE}{APP_EXTRA}")
}

const APP_EXTRA: &str = r#"
[partition]
command = ["sh", "-c", "nc -w 2 {ip} 32379 </dev/null"]

[backup]
done = { field = "status.phase", equals = "Completed" }
failed = { field = "status.phase", equals = "Failed" }
[backup.template]
apiVersion = "test.shakedown.dev/v1"
kind = "EtcdBackup"
spec = { cluster = "{statefulset}" }

[restore]
done = { field = "status.phase", equals = "Completed" }
failed = { field = "status.phase", equals = "Failed" }
[restore.template]
apiVersion = "test.shakedown.dev/v1"
kind = "EtcdRestore"
spec = { backup = "{backup}", cluster = "{statefulset}" }
"#;

fn profile(name: &str, ops: &[&str], steps: usize) -> String {
    format!(
        "name = \"{name}\"\nversions = [\"3.5\"]\nsteps = {steps}\nmembers = 3\nsites = 1\nstack = \"app\"\nops = [{}]\ninvariants = [\"leaks\", \"app-ready\", \"app-durability\", \"app-linearizability\"]\n\n[timeouts]\nconverge = \"60s\"\nliveness = \"90s\"\nop = \"240s\"\n",
        ops.iter().map(|o| format!("\"{o}\"")).collect::<Vec<_>>().join(", ")
    )
}

/// A seed whose plan holds every op of `wanted`.
fn seed_with(profile: &Path, wanted: &[&str]) -> u64 {
    seed_where(profile, |ops| wanted.iter().all(|w| ops.iter().any(|l| l.contains(w))))
        .unwrap_or_else(|| panic!("no seed below 500 plans all of {wanted:?}"))
}

/// The first seed whose plan's ops (one line each, as `shakedown plan` prints them) pass `ok`.
fn seed_where(profile: &Path, ok: impl Fn(&[String]) -> bool) -> Option<u64> {
    (1..500u64).find(|seed| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
            .args(["plan", "--seed", &seed.to_string(), "--profile"])
            .arg(profile)
            .output()
            .unwrap();
        assert!(out.status.success(), "plan: {}", String::from_utf8_lossy(&out.stderr));
        let ops: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().skip(1).map(str::to_string).collect();
        ok(&ops)
    })
}

/// `shakedown run --target app` with `args` passes, each of its `steps` checked; what it printed
/// is shown (`--nocapture`) under `what`.
fn passes_checked(args: &[&str], steps: usize, files: &Path, what: &str) {
    let (code, out, err) = shakedown(&[&["run", "--target", "app"], args].concat(), files);
    assert_eq!(code, 0, "{what}: {out}\n{err}");
    for step in 1..=steps {
        assert!(
            err.lines().any(|l| l.contains(&format!("[{step}/{steps}]")) && l.contains("checks ok")),
            "{what}: step {step} checked: {err}"
        );
    }
    eprintln!("{what}:\n{err}");
}

/// The newest run's events (`events.jsonl` of the last run directory under `files/runs`).
fn last_run_events(files: &Path) -> String {
    let run_dir = std::fs::read_dir(files.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap();
    std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap()
}

fn shakedown(args: &[&str], files: &Path) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
        .args(args)
        .arg("--runs-dir")
        .arg(files.join("runs"))
        .arg("--seeds-dir")
        .arg(files.join("seeds"))
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// How long a run the test will kill may take to reach the op it is killed in: its bring-up (the
/// data workload's first write, the first checks) and the steps before, each within the run's
/// own bounds. 60 s was too short on a loaded machine: one run was still in its first step
/// after 44 s of bring-up (24 s to the stack, 19 s of first checks).
const RUN_REACHES_OP: Duration = Duration::from_secs(300);

/// Fails the test if the run it waits on ended, or `deadline` passed, before it `did` what the
/// test waits for.
/// `shakedown run --target app` of `profile` with `app_profile`, seed `seed`.
fn run_app(files: &Path, kubeconfig: &str, app_profile: &str, profile: &Path, seed: u64) -> (i32, String, String) {
    let (profile, seed) = (profile.display().to_string(), seed.to_string());
    shakedown(
        &["run", "--target", "app", "--kubeconfig", kubeconfig, "--app-profile", app_profile, "--profile", &profile, "--seed", &seed],
        files,
    )
}

fn still_running(child: &mut std::process::Child, deadline: std::time::Instant, did: &str) {
    if let Some(status) = child.try_wait().unwrap() {
        panic!("the run ended ({status}) before it {did}");
    }
    assert!(std::time::Instant::now() < deadline, "the run never {did} within {RUN_REACHES_OP:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_faults_run_verified_and_a_planted_operator_bug_is_caught_and_replayed() {
    let bins = NodeBinaries::find().unwrap_or_else(|e| panic!("the node's binaries: {e}"));
    let dir = tempfile::tempdir().unwrap();
    // The host's network, compared after the node's teardown: every run of the app target
    // below (partitions, policies, pod kills, drains) happened inside the node's namespace.
    let net_before = hostnet::snapshot();
    let tunables = NodeOptions { set_kernel_tunables: true, workers: 0 };
    let mut node = Node::up(&format!("sd-apptest{}", std::process::id()), dir.path(), &bins, &tunables)
        .await
        .unwrap_or_else(|e| panic!("node up: {e}"));
    let client = node.client().await.unwrap();
    deploy(&client, &dir.path().join("backups")).await;
    let mut operator = start_operator(client.clone(), None);
    settled(&client, Duration::from_secs(180)).await;
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    // Its runs' directories, records and profiles, should it fail: under load it once failed
    // where nothing was left to read.
    let _keep = common::KeepOnFailure::new(files.clone(), format!("app-target-{}", std::process::id()));
    std::fs::write(files.join("app.toml"), app_profile()).unwrap();
    let kubeconfig = node.kubeconfig.display().to_string();
    let app = files.join("app.toml").display().to_string();

    // A dry run connects and reads (the StatefulSet's replicas against the profile's members),
    // prints every write and wait of the plan, and changes nothing: the same pods (UIDs), claims,
    // scale, cordons, and no policy, ConfigMap or custom resource of a run.
    dry_run_changes_nothing(&client, &files, &kubeconfig, &app).await;

    // A seeded plan with a pod kill, a kill of half the app's pods by label selector, an
    // operator restart, a claim loss, a backup and a restore through the operator's custom
    // resources passes, checked after every step (after the restore, app-durability expects
    // the backup's writes and not those acknowledged after it).
    let p = files.join("faults.toml");
    let ops = ["pod-kill", "pod-kill-selected", "operator-restart", "pvc-loss", "node-drain", "backup", "restore"];
    std::fs::write(&p, profile("app-faults", &ops, 8)).unwrap();
    let seed = seed_with(&p, &ops);
    let (code, out, err) = run_app(&files, &kubeconfig, &app, &p, seed);
    assert_eq!(code, 0, "{out}\n{err}");
    eprintln!("the seeded plan (seed {seed}):\n{err}");
    for step in 1..=8 {
        assert!(err.lines().any(|l| l.contains(&format!("[{step}/8]")) && l.contains("checks ok")), "step {step} checked: {err}");
    }
    // The selected kill took 2 of the 3 etcd pods (50 %, rounded up), named in the event log.
    let run_dir =
        std::fs::read_dir(files.join("runs")).unwrap().flatten().map(|e| e.path()).find(|p| p.is_dir()).expect("the run's directory");
    // The data workload's history: writes and reads in the epochs before, during and after the
    // restore, judged by app-linearizability at every step and again whole by check-history.
    let history = std::fs::read_to_string(run_dir.join("app-history.jsonl")).expect("app-history.jsonl");
    let ops: Vec<serde_json::Value> = history.lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    let (writes, reads) = (ops.iter().filter(|o| o["type"] == "write").count(), ops.iter().filter(|o| o["type"] == "read").count());
    assert!(writes > 20 && reads > 20, "{writes} writes, {reads} reads in the history");
    assert!(ops.iter().any(|o| o["type"] == "read" && o["epoch"] == 2), "reads after the restore (epoch 2)");
    // Two writers ([data] writers = 2), each its own client of the history, their writes
    // overlapping in time.
    let writers: std::collections::BTreeSet<u64> =
        ops.iter().filter(|o| o["type"] == "write").filter_map(|o| o["client"].as_u64()).collect();
    assert_eq!(writers.len(), 2, "two writing clients: {writers:?}");
    let spans: Vec<(u64, u64, u64)> = ops
        .iter()
        .filter(|o| o["type"] == "write")
        .filter_map(|o| Some((o["client"].as_u64()?, o["call"].as_u64()?, o["return"].as_u64()?)))
        .collect();
    assert!(spans.iter().any(|a| spans.iter().any(|b| a.0 != b.0 && a.1 < b.2 && b.1 < a.2)), "writes of the two writers overlap in time");
    // Each write is also a sample of workload.csv, the report's latency chart: as many as the
    // history's writes that ended, acknowledged as many as the run says.
    let samples = std::fs::read_to_string(run_dir.join("workload.csv")).expect("workload.csv");
    let acked_samples = samples.lines().skip(1).filter(|l| l.ends_with(",1")).count();
    let last_stats = std::fs::read_to_string(run_dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("workload").and_then(|w| w.get("data_acked")).and_then(|a| a.as_u64()))
        .next_back()
        .expect("the data workload's counters");
    assert!(acked_samples as u64 >= last_stats && acked_samples > 20, "{acked_samples} acknowledged samples, data_acked {last_stats}");
    let report = std::fs::read_to_string(run_dir.join("report.html")).unwrap();
    let legend = report.split("class=\"legend\">").nth(1).and_then(|l| l.split(" acknowledged").next()).unwrap_or_default();
    assert!(legend.ends_with(&format!(", {acked_samples}")), "the report charts the writes: {legend}");
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
        .arg("check-history")
        .arg(run_dir.join("app-history.jsonl"))
        .output()
        .unwrap();
    assert!(check.status.success(), "{}\n{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    let events = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    let kills: Vec<serde_json::Value> =
        events.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["kind"] == "app-kill").collect();
    assert!(!kills.is_empty(), "an app-kill event: {events}");
    for k in &kills {
        let killed = k["detail"]["killed"].as_array().unwrap();
        assert_eq!(killed.len(), 2, "{k}");
        assert!(killed.iter().all(|n| n.as_str().unwrap().starts_with("etcd-")), "{k}");
        assert_eq!(k["detail"]["matching"].as_array().unwrap().len(), 3, "{k}");
    }
    // The drain evicted the node's pods (the three replicas and the operator) and lifted its
    // cordon.
    let drains: Vec<serde_json::Value> =
        events.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["kind"] == "app-drain").collect();
    assert!(!drains.is_empty(), "an app-drain event: {events}");
    for d in &drains {
        let evicted: Vec<&str> = d["detail"]["evictable"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
        assert!(
            ["app/etcd-0", "app/etcd-1", "app/etcd-2"].iter().all(|p| evicted.contains(p))
                && evicted.iter().any(|p| p.starts_with("app/etcd-operator-")),
            "{d}"
        );
        assert!(d["detail"]["error"].is_null(), "{d}");
    }
    // When each evicted pod went (a slow kubelet holds the whole drain: the event names it).
    let gone: Vec<serde_json::Value> =
        events.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["kind"] == "app-drained").collect();
    assert_eq!(gone.len(), drains.len(), "{events}");
    for g in &gone {
        assert!(["app/etcd-0", "app/etcd-1", "app/etcd-2"].iter().all(|p| g["detail"]["gone-after-ms"][p].is_u64()), "{g}");
    }
    let nodes: Api<KubeNode> = Api::all(client.clone());
    assert!(
        nodes.list(&ListParams::default()).await.unwrap().items.iter().all(|n| n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)),
        "no node left cordoned"
    );
    // The backup and the restore were the operator's: done, named in the event log; the run's
    // objects removed at its end.
    for kind in ["app-backup", "app-restore"] {
        let done: Vec<serde_json::Value> =
            events.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["kind"] == kind).collect();
        assert!(!done.is_empty() && done.iter().all(|e| e["detail"]["error"].is_null()), "{kind}: {events}");
    }
    for kind in ["EtcdBackup", "EtcdRestore"] {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), NS, &ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1", kind)));
        assert!(api.list(&ListParams::default()).await.unwrap().items.is_empty(), "the run's {kind}s removed");
    }
    settled(&client, Duration::from_secs(120)).await;

    // The operator's planted bug: asked to restore the newest backup, it restores the one
    // before. app-durability catches the writes acknowledged between the two as lost (a pod
    // kill between the backups gives the writer seconds to write them); the record replays it.
    operator.abort();
    operator = start_operator(client.clone(), Some(OperatorBug::RestoreSkipsLastBackup));
    let p = files.join("restore.toml");
    std::fs::write(&p, profile("app-restore", &["backup", "pod-kill", "restore"], 4)).unwrap();
    let seed = seed_where(&p, |ops| {
        ops.len() == 4
            && ops[0].contains("backup")
            && ops[1].contains("pod-kill(")
            && ops[2].contains("backup")
            && ops[3].contains("restore(b1)")
    })
    .expect("a seed planning backup, pod-kill, backup, restore(b1)");
    let (code, out, err) = run_app(&files, &kubeconfig, &app, &p, seed);
    assert_eq!(code, 1, "caught: {out}\n{err}");
    assert!(
        out.contains("app-durability")
            && out.contains("at step 4 (restore(b1))")
            && out.contains("acknowledged writes lost")
            && out.contains("b1 restored"),
        "by app-durability: {out}"
    );
    eprintln!("the planted restore bug, caught:\n{out}");
    // The failed run's forensics hold what lives in the cluster: every pod's log and the
    // namespace's events.
    let forensics =
        std::path::PathBuf::from(out.lines().find_map(|l| l.strip_prefix("run directory: ")).expect("run directory")).join("forensics");
    let names: Vec<String> =
        std::fs::read_dir(&forensics).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().any(|n| n.starts_with("pod-etcd-0-") && n.ends_with(".log.tail")), "{names:?}");
    assert!(std::fs::read_to_string(forensics.join("events.txt")).unwrap().contains("Normal"), "{names:?}");
    let record =
        out.lines().find_map(|l| l.strip_prefix("seed record: ")).unwrap_or_else(|| panic!("a seed record: {out}")).trim().to_string();
    settled(&client, Duration::from_secs(120)).await;
    let (code, out, err) = shakedown(&["replay", &record, "--kubeconfig", &kubeconfig], &files);
    assert_eq!(code, 1, "replayed: {out}\n{err}");
    assert!(out.contains("acknowledged writes lost"), "{out}\n{err}");
    settled(&client, Duration::from_secs(120)).await;

    // A drain that a PodDisruptionBudget blocks (one replica may be down; on this single node the
    // evicted one cannot come back while the node is cordoned): the op fails after its bound,
    // naming the refusal, and the node is uncordoned.
    let pdbs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NS,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("policy", "v1beta1", "PodDisruptionBudget")),
    );
    let pdb: DynamicObject = serde_json::from_value(serde_json::json!({"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "etcd"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "etcd"}}}})).unwrap();
    pdbs.create(&Default::default(), &pdb).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pdbs.get("etcd").await.unwrap().data["status"]["disruptionsAllowed"] != 1 {
        assert!(std::time::Instant::now() < deadline, "the PodDisruptionBudget's status not computed within 30s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(files.join("app-quick.toml"), app_profile().replace("op_timeout = \"180s\"", "op_timeout = \"10s\"")).unwrap();
    let p = files.join("drain.toml");
    std::fs::write(&p, profile("app-drain", &["node-drain"], 1)).unwrap();
    let quick = files.join("app-quick.toml").display().to_string();
    let (code, out, err) = run_app(&files, &kubeconfig, &quick, &p, 1);
    assert_eq!(code, 1, "a blocked drain fails: {out}\n{err}");
    assert!(out.contains("is blocked") && out.contains("disruption budget"), "{out}\n{err}");
    eprintln!("the blocked drain:\n{out}");
    assert!(
        nodes.list(&ListParams::default()).await.unwrap().items.iter().all(|n| n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)),
        "the blocked drain's cordon lifted"
    );
    pdbs.delete("etcd", &Default::default()).await.unwrap();
    settled(&client, Duration::from_secs(120)).await;

    // A NoExecute taint on the node (the only one: every replica's): the pods without a
    // toleration are deleted by the node lifecycle controller — no eviction API, so no
    // PodDisruptionBudget asked — and come back once the taint is removed; a pod that tolerates
    // it stays, the same pod. The run passes its checks, and no node keeps the taint.
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let tolerant: Pod = serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tolerant"},
        "spec": {"terminationGracePeriodSeconds": 0, "tolerations": [{"key": "shakedown.dev/tainted-by", "operator": "Exists", "effect": "NoExecute"}],
            "containers": [{"name": "sleep", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "100000"]}]}}))
    .unwrap();
    let uid = pods.create(&Default::default(), &tolerant).await.unwrap().metadata.uid;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pods.get("tolerant").await.unwrap().status.and_then(|s| s.phase).as_deref() != Some("Running") {
        assert!(std::time::Instant::now() < deadline, "the tolerating pod not running within 60s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(files.join("app-taint.toml"), format!("{}\n[taint]\nduration = \"2s\"\n", app_profile())).unwrap();
    let p = files.join("taint.toml");
    std::fs::write(&p, profile("app-taint", &["taint"], 1)).unwrap();
    let taint_app = files.join("app-taint.toml").display().to_string();
    let (code, out, err) = run_app(&files, &kubeconfig, &taint_app, &p, 1);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.lines().any(|l| l.contains("[1/1] taint(m") && l.contains("checks ok")), "the taint step checked: {err}");
    let events = last_run_events(&files);
    let taints: Vec<serde_json::Value> =
        events.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["kind"] == "app-taint").collect();
    assert_eq!(taints.len(), 1, "an app-taint event: {events}");
    let t = &taints[0]["detail"];
    assert!(["app/etcd-0", "app/etcd-1", "app/etcd-2"].iter().all(|p| t["evicted-gone-after-ms"][p].is_u64()), "the replicas evicted: {t}");
    assert!(
        t["tolerating"].as_object().unwrap().contains_key("app/tolerant") && t["tolerating-gone"].as_array().unwrap().is_empty(),
        "{t}"
    );
    assert_eq!(pods.get("tolerant").await.unwrap().metadata.uid, uid, "the tolerating pod stayed");
    assert!(
        nodes.list(&ListParams::default()).await.unwrap().items.iter().all(|n| n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_none_or(|ts| ts.iter().all(|t| t.key != "shakedown.dev/tainted-by"))),
        "no node left tainted"
    );
    pods.delete("tolerant", &Default::default()).await.unwrap();
    settled(&client, Duration::from_secs(120)).await;

    // The operator's planted bug: a lost claim is never rebuilt. app-ready catches it; the
    // record replays it.
    operator.abort();
    operator = start_operator(client.clone(), Some(OperatorBug::PvcLossNeverRebuilt));
    let p = files.join("pvc.toml");
    std::fs::write(&p, profile("app-pvc", &["pvc-loss"], 1).replace("converge = \"60s\"", "converge = \"15s\"")).unwrap();
    let (code, out, err) = run_app(&files, &kubeconfig, &app, &p, 1);
    assert_eq!(code, 1, "caught: {out}\n{err}");
    assert!(out.contains("app-ready"), "by app-ready: {out}");
    let record =
        out.lines().find_map(|l| l.strip_prefix("seed record: ")).unwrap_or_else(|| panic!("a seed record: {out}")).trim().to_string();
    // Fixed by hand (the operator without its bug), then the record replayed against the buggy one.
    operator.abort();
    operator = start_operator(client.clone(), None);
    settled(&client, Duration::from_secs(120)).await;
    operator.abort();
    operator = start_operator(client.clone(), Some(OperatorBug::PvcLossNeverRebuilt));
    let (code, out, err) = shakedown(&["replay", &record, "--kubeconfig", &kubeconfig], &files);
    assert_eq!(code, 1, "replayed: {out}\n{err}");
    assert!(out.contains("app-ready") || err.contains("app-ready"), "{out}\n{err}");
    operator.abort();
    operator = start_operator(client.clone(), None);
    settled(&client, Duration::from_secs(120)).await;

    // A partition of a pod on the host's network (the etcd app's): no network plugin can cut
    // it with a NetworkPolicy, so the op refuses (an environment error that says why), creating
    // no policy.
    let p = files.join("partition.toml");
    std::fs::write(&p, profile("app-partition", &["partition", "partition-heal"], 1)).unwrap();
    let (code, out, err) = run_app(&files, &kubeconfig, &app, &p, 1);
    assert_eq!(code, 4, "an environment error: {out}\n{err}");
    assert!(format!("{out}{err}").contains("runs on the host's network"), "{out}\n{err}");
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), NS);
    assert!(policies.list(&ListParams::default()).await.unwrap().items.is_empty(), "no NetworkPolicy left");

    // On the pod network (the web app), with the node's NetworkPolicy engine: a replica cut off
    // (verified: the partition probe from another replica no longer connects) and healed
    // (verified: it connects again), every step checked, no policy left.
    web::deploy(&client).await;
    std::fs::write(files.join("web.toml"), web::PROFILE).unwrap();
    let web_app = files.join("web.toml").display().to_string();
    std::fs::write(
        &p,
        profile("web-partition", &["partition", "partition-heal"], 2).replace(", \"app-durability\", \"app-linearizability\"", ""),
    )
    .unwrap();
    let seed = seed_where(&p, |ops| ops.len() == 2 && ops[0].contains("partition(") && ops[1].contains("partition-heal"))
        .expect("a seed planning partition, partition-heal");
    passes_checked(
        &["--kubeconfig", &kubeconfig, "--app-profile", &web_app, "--profile", &p.display().to_string(), "--seed", &seed.to_string()],
        2,
        &files,
        "a partition on the pod network, healed",
    );
    let web_policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), web::NS);
    assert!(web_policies.list(&ListParams::default()).await.unwrap().items.is_empty(), "no NetworkPolicy left");

    // Two groups cut apart, other traffic flowing on: web-0 and web-1 no longer reach each other
    // (verified both ways), web-2 (in neither) still reaches both; healed (both ways again).
    let pg = files.join("groups.toml");
    std::fs::write(
        &pg,
        profile("web-groups", &["partition-groups", "partition-groups-heal"], 2)
            .replace(", \"app-durability\", \"app-linearizability\"", ""),
    )
    .unwrap();
    let groups_seed =
        seed_where(&pg, |ops| ops.len() == 2 && ops[0].contains("partition-groups(") && ops[1].contains("partition-groups-heal("))
            .expect("a seed planning partition-groups, partition-groups-heal");
    passes_checked(
        &[
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &web_app,
            "--profile",
            &pg.display().to_string(),
            "--seed",
            &groups_seed.to_string(),
        ],
        2,
        &files,
        "two groups cut apart, healed",
    );
    let events = last_run_events(&files);
    let cut: serde_json::Value = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["kind"] == "app-partition-groups")
        .unwrap_or_else(|| panic!("an app-partition-groups event: {events}"));
    assert_eq!(
        (cut["detail"]["a-pods"].clone(), cut["detail"]["b-pods"].clone(), cut["detail"]["outside"].clone()),
        (serde_json::json!(["web-0"]), serde_json::json!(["web-1"]), serde_json::json!("web-2")),
        "{cut}"
    );
    assert!(web_policies.list(&ListParams::default()).await.unwrap().items.is_empty(), "no NetworkPolicy left");

    // A probe that never connects (a port nothing listens on) would pass every cut: the partition
    // refuses it before making a policy, an environment error that says why.
    std::fs::write(files.join("web-deaf.toml"), web::PROFILE.replace("{ip}:8080", "{ip}:9999")).unwrap();
    let (code, out, err) = shakedown(
        &[
            "run",
            "--target",
            "app",
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &files.join("web-deaf.toml").display().to_string(),
            "--profile",
            &p.display().to_string(),
            "--seed",
            &seed.to_string(),
        ],
        &files,
    );
    assert_eq!(code, 4, "an environment error: {out}\n{err}");
    assert!(
        format!("{out}{err}").contains("the [partition] probe does not connect from web-")
            && format!("{out}{err}").contains("before any policy is made"),
        "{out}\n{err}"
    );
    assert!(web_policies.list(&ListParams::default()).await.unwrap().items.is_empty(), "no NetworkPolicy made");

    // A replica failing in place: the same pod not Ready on the pause image for 3 s, then Ready
    // again on its own image; every step checked (leaks: no pod left failed).
    let pf = files.join("pod-failure.toml");
    std::fs::write(&pf, profile("web-pod-failure", &["pod-failure"], 2).replace(", \"app-durability\", \"app-linearizability\"", ""))
        .unwrap();
    let (code, out, err) = shakedown(
        &[
            "run",
            "--target",
            "app",
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &web_app,
            "--profile",
            &pf.display().to_string(),
            "--seed",
            "1",
        ],
        &files,
    );
    assert_eq!(code, 0, "failed and recovered: {out}\n{err}");
    eprintln!("two pod failures:\n{err}");
    let events = last_run_events(&files);
    let failures: Vec<serde_json::Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "app-pod-failure")
        .collect();
    assert_eq!(failures.len(), 2, "{events}");
    for f in &failures {
        assert_eq!(f["detail"]["same-pod"], true, "failed in place: {f}");
        assert_eq!(f["detail"]["own-images"]["web"], BUSYBOX_IMAGE, "{f}");
    }

    // A run killed (-9) while a replica is failed: `reap --kube` gives it its own image back.
    std::fs::write(files.join("web-long.toml"), web::PROFILE.replace("duration = \"3s\"", "duration = \"300s\"")).unwrap();
    std::fs::write(&pf, profile("web-pod-failure", &["pod-failure"], 1).replace(", \"app-durability\", \"app-linearizability\"", ""))
        .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
        .args([
            "run",
            "--target",
            "app",
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &files.join("web-long.toml").display().to_string(),
            "--profile",
            &pf.display().to_string(),
            "--seed",
            "1",
            "--runs-dir",
        ])
        .arg(files.join("runs"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let web_pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), web::NS);
    let failed = || async {
        web_pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| shakedown::targets::app::failed_by(p).is_some())
            .collect::<Vec<_>>()
    };
    // Killed once the failure took effect (the pod not Ready).
    let deadline = std::time::Instant::now() + RUN_REACHES_OP;
    while !failed().await.iter().any(|p| !shakedown::targets::app::data::is_ready(p)) {
        still_running(&mut child, deadline, "failed a pod");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = failed().await;
    assert_eq!(left.len(), 1, "the killed run left its failed pod");
    assert_eq!(shakedown::targets::app::own_images(&left[0])["web"], "shakedown.local/pause:3.4");
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_shakedown")).args(["reap", "--kube", "--kubeconfig", &kubeconfig]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success() && text.contains("its own images back"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(failed().await.is_empty(), "reap put the images back");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let running_own = |p: &k8s_openapi::api::core::v1::Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|c| c.iter().all(|c| c.ready && c.image.contains("busybox")))
    };
    while !web_pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .all(|p| shakedown::targets::app::data::is_ready(p) && running_own(p))
    {
        assert!(std::time::Instant::now() < deadline, "the web pods Ready on their own image after reap");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The same on a network that enforces no policy (the engine stopped, as a cluster whose
    // network plugin has none): the policy cut nothing, so the partition does not count — an
    // environment error that says so, and the policy removed.
    node.stop_policy_engine().unwrap();
    let (code, out, err) = run_app(&files, &kubeconfig, &web_app, &p, seed);
    assert_eq!(code, 4, "an environment error: {out}\n{err}");
    assert!(format!("{out}{err}").contains("does not enforce NetworkPolicy"), "{out}\n{err}");
    assert!(web_policies.list(&ListParams::default()).await.unwrap().items.is_empty(), "no NetworkPolicy left");
    let (code, out, err) = shakedown(
        &[
            "run",
            "--target",
            "app",
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &web_app,
            "--profile",
            &pg.display().to_string(),
            "--seed",
            &groups_seed.to_string(),
        ],
        &files,
    );
    assert_eq!(code, 4, "an environment error: {out}\n{err}");
    assert!(
        format!("{out}{err}").contains("does not enforce NetworkPolicy")
            && format!("{out}{err}").contains("still connects from statefulset.kubernetes.io/pod-name=web-0 to"),
        "{out}\n{err}"
    );
    assert!(web_policies.list(&ListParams::default()).await.unwrap().items.is_empty(), "no NetworkPolicy left");

    // A run killed (-9) while the operator is scaled to zero, after a backup: `reap --kube`
    // scales it back, deletes the run's backup object and removes the run's ConfigMap.
    let p = files.join("operator.toml");
    std::fs::write(&p, profile("app-operator", &["operator-restart", "backup"], 2)).unwrap();
    let seed = seed_where(&p, |ops| ops.len() == 2 && ops[0].contains("backup") && ops[1].contains("operator-restart"))
        .expect("a seed planning backup, operator-restart");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
        .args([
            "run",
            "--target",
            "app",
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &app,
            "--profile",
            &p.display().to_string(),
            "--seed",
            &seed.to_string(),
            "--runs-dir",
        ])
        .arg(files.join("runs"))
        .stdout(std::fs::File::create(files.join("killed.out")).unwrap())
        .stderr(std::fs::File::create(files.join("killed.err")).unwrap())
        .spawn()
        .unwrap();
    let deps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client.clone(), NS);
    let deadline = std::time::Instant::now() + RUN_REACHES_OP;
    while deps.get("etcd-operator").await.unwrap().spec.and_then(|s| s.replicas) != Some(0) {
        if std::time::Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            panic!(
                "the run never scaled the operator down: {}{}",
                std::fs::read_to_string(files.join("killed.out")).unwrap_or_default(),
                std::fs::read_to_string(files.join("killed.err")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_shakedown")).args(["reap", "--kube", "--kubeconfig", &kubeconfig]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("scaled the operator app/etcd-operator back to 1") && text.contains("reaped 1 kube run(s)"), "{text}");
    assert!(text.contains(&format!("deleted {GROUP}/v1/EtcdBackup {NS}/shakedown-")), "the killed run's backup object: {text}");
    let backups: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1", "EtcdBackup")));
    assert!(backups.list(&ListParams::default()).await.unwrap().items.is_empty(), "no backup object left");
    assert_eq!(deps.get("etcd-operator").await.unwrap().spec.and_then(|s| s.replicas), Some(1));
    settled(&client, Duration::from_secs(120)).await;

    // A run killed (-9) in the middle of a drain, and one while its taint is on the node:
    // `reap --kube` lifts the cordon, takes the taint off.
    fn left_on(n: &KubeNode, op: &str) -> bool {
        let spec = n.spec.as_ref();
        match op {
            "node-drain" => spec.and_then(|s| s.unschedulable) == Some(true),
            _ => spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == "shakedown.dev/tainted-by")),
        }
    }
    for (op, reaped) in [("node-drain", "uncordoned node sd-apptest"), ("taint", "took the run's taint off node sd-apptest")] {
        let p = files.join(format!("{op}-killed.toml"));
        std::fs::write(&p, profile(&format!("app-{op}-killed"), &[op], 1)).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
            .args(["run", "--target", "app", "--kubeconfig", &kubeconfig, "--app-profile", &app, "--profile"])
            .arg(&p)
            .args(["--seed", "1", "--runs-dir"])
            .arg(files.join("runs"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let left = || async { nodes.list(&ListParams::default()).await.unwrap().items.iter().any(|n| left_on(n, op)) };
        let deadline = std::time::Instant::now() + RUN_REACHES_OP;
        while !left().await {
            still_running(&mut child, deadline, &format!("changed the node ({op})"));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(left().await, "the killed run left its {op}'s change on the node");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
            .args(["reap", "--kube", "--kubeconfig", &kubeconfig])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success() && text.contains(reaped), "{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(!left().await, "reap undid the {op}");
        settled(&client, Duration::from_secs(120)).await;
    }

    // The second test application, with a primary its operator fails over (tests/app_common/kv.rs):
    // the primary killed twice by its label, each time the sync standby promoted; no
    // acknowledged write lost.
    let kv_cluster = dir.path().join("kv-cluster");
    kv::deploy(&client, &kv_cluster).await;
    let mut kv_operator = kv::start_operator(client.clone(), kv_cluster.clone(), false);
    kv::settled(&client, Duration::from_secs(60)).await;
    std::fs::write(files.join("kv.toml"), kv::PROFILE).unwrap();
    let kv_app = files.join("kv.toml").display().to_string();
    let p = files.join("failover.toml");
    std::fs::write(&p, profile("kv-failover", &["pod-kill-selected"], 2)).unwrap();
    let (code, out, err) = run_app(&files, &kubeconfig, &kv_app, &p, 1);
    assert_eq!(code, 0, "two failovers by the operator pass: {out}\n{err}");
    eprintln!("two failovers:\n{err}");
    let events = last_run_events(&files);
    let killed: Vec<String> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "app-kill")
        .map(|k| k["detail"]["killed"][0].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(killed, ["kv-0", "kv-2"], "the primary each time (kv-2 promoted after kv-0, then kv-0 back): {events}");

    // The primary failing in place (pod-failure: the same pod, not Ready for 10 s, then back on
    // its data): the operator fails over on a primary that is there but not Ready, the old
    // primary rejoins as a standby; no acknowledged write lost.
    let p = files.join("kv-failure.toml");
    std::fs::write(&p, profile("kv-failure", &["pod-failure"], 1)).unwrap();
    let seed = seed_where(&p, |ops| ops.len() == 1 && ops[0].contains("pod-failure(m0)")).expect("a seed failing kv-0");
    let (code, out, err) = run_app(&files, &kubeconfig, &kv_app, &p, seed);
    assert_eq!(code, 0, "a failover on a primary failing in place: {out}\n{err}");
    eprintln!("the primary failing in place:\n{err}");

    // The planted bug: the failover promotes the delayed standby (kv-1, 5 s behind). app-durability
    // catches the writes acknowledged in those seconds as lost; the record replays it.
    kv_operator.abort();
    kv::reset(&client, &kv_cluster).await;
    kv_operator = kv::start_operator(client.clone(), kv_cluster.clone(), true);
    kv::settled(&client, Duration::from_secs(60)).await;
    let p = files.join("stale.toml");
    std::fs::write(&p, profile("kv-stale", &["pod-kill-selected"], 1)).unwrap();
    let (code, out, err) = run_app(&files, &kubeconfig, &kv_app, &p, 1);
    assert_eq!(code, 1, "caught: {out}\n{err}");
    assert!(
        out.contains("app-durability") && out.contains("at step 1 (pod-kill-selected") && out.contains("acknowledged writes lost"),
        "by app-durability: {out}"
    );
    eprintln!("the planted failover bug, caught:\n{out}");
    let record =
        out.lines().find_map(|l| l.strip_prefix("seed record: ")).unwrap_or_else(|| panic!("a seed record: {out}")).trim().to_string();
    kv_operator.abort();
    kv::reset(&client, &kv_cluster).await;
    kv_operator = kv::start_operator(client.clone(), kv_cluster.clone(), true);
    kv::settled(&client, Duration::from_secs(60)).await;
    let (code, out, err) = shakedown(&["replay", &record, "--kubeconfig", &kubeconfig], &files);
    assert_eq!(code, 1, "replayed: {out}\n{err}");
    assert!(out.contains("acknowledged writes lost"), "{out}\n{err}");
    kv_operator.abort();

    // A checker Job as a probe: created for each check, complete, deleted.
    let checker = |cmd: &str| {
        format!(
            "\n[[probes]]\nname = \"the checker Job\"\n[probes.job.template.spec]\nrestartPolicy = \"Never\"\ncontainers = [{{ name = \"check\", image = \"{BUSYBOX_IMAGE}\", imagePullPolicy = \"Never\", command = [\"sh\", \"-c\", \"{cmd}\"], env = [{{ name = \"NODE_IP\", valueFrom = {{ fieldRef = {{ fieldPath = \"status.hostIP\" }} }} }}] }}]\n"
        )
    };
    std::fs::write(
        files.join("job.toml"),
        format!("{}{}", app_profile(), checker("wget -q -O - http://$NODE_IP:32379/health | grep true")),
    )
    .unwrap();
    let p = files.join("probe.toml");
    std::fs::write(&p, profile("app-probe", &["operator-restart"], 1)).unwrap();
    let (code, out, err) = shakedown(
        &[
            "run",
            "--target",
            "app",
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &files.join("job.toml").display().to_string(),
            "--profile",
            &p.display().to_string(),
            "--seed",
            "1",
        ],
        &files,
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), NS);
    assert!(jobs.list(&ListParams::default()).await.unwrap().items.is_empty(), "no checker Job left");

    // Probes that fail say why: the service proxy's answer, the object's field, the Job's log.
    let failing =
        app_profile().replace("path = \"/health\"", "path = \"/no-such-path\"").replace("equals = \"True\" }", "equals = \"False\" }");
    std::fs::write(files.join("failing.toml"), format!("{failing}{}", checker("echo the checker says no; exit 3"))).unwrap();
    std::fs::write(&p, profile("app-probe", &["operator-restart"], 1).replace("converge = \"60s\"", "converge = \"3s\"")).unwrap();
    let (code, out, err) = shakedown(
        &[
            "run",
            "--target",
            "app",
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &files.join("failing.toml").display().to_string(),
            "--profile",
            &p.display().to_string(),
            "--seed",
            "1",
        ],
        &files,
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("probe the client Service answers: GET /api/v1/namespaces/app/services/etcd:client/proxy/no-such-path"), "{out}");
    assert!(out.contains("probe the operator is available: Deployment app/etcd-operator: status.conditions[Available].status = \"True\" (wanted \"False\")"), "{out}");
    assert!(
        out.contains("probe the checker Job: Job shakedown-") && out.contains("failed: ") && out.contains("the checker says no"),
        "{out}"
    );
    assert!(jobs.list(&ListParams::default()).await.unwrap().items.is_empty(), "no checker Job left");

    // A write command that never succeeds: the run does not start (exit 4), saying what it answered.
    let broken = app_profile()
        .replace("op_timeout = \"180s\"", "op_timeout = \"3s\"")
        .replace("--command-timeout=5s put {key} {value}", "--command-timeout=5s put {key} {value} --no-such-flag");
    std::fs::write(files.join("broken.toml"), broken).unwrap();
    let p = files.join("one.toml");
    std::fs::write(&p, profile("app-one", &["pod-kill"], 1)).unwrap();
    let (code, out, err) = shakedown(
        &[
            "run",
            "--target",
            "app",
            "--kubeconfig",
            &kubeconfig,
            "--app-profile",
            &files.join("broken.toml").display().to_string(),
            "--profile",
            &p.display().to_string(),
            "--seed",
            "1",
        ],
        &files,
    );
    assert_eq!(code, 4, "{out}\n{err}");
    assert!(
        err.contains("write command was not acknowledged once within 3s") && err.contains("no-such-flag"),
        "says what the write answered: {out}\n{err}"
    );

    hostnet::assert_same(&net_before, &hostnet::snapshot(), "while the app target's runs were on the node");
    operator.abort();
    let left = node.teardown();
    assert!(left.is_empty(), "left behind: {left}");
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by the app target's runs and the node's teardown");
}

/// What a run could change in the app's namespace and on the node, as text to compare.
async fn app_state(client: &kube::Client) -> String {
    use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
    use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
    let lp = ListParams::default();
    let uids = |v: Vec<(Option<String>, Option<String>)>| {
        v.into_iter().map(|(n, u)| format!("{}={}", n.unwrap_or_default(), u.unwrap_or_default())).collect::<Vec<_>>().join(",")
    };
    let pods = Api::<Pod>::namespaced(client.clone(), NS).list(&lp).await.unwrap().items;
    let pods = uids(pods.into_iter().map(|p| (p.metadata.name, p.metadata.uid)).collect());
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS).list(&lp).await.unwrap().items;
    let claims = uids(claims.into_iter().map(|p| (p.metadata.name, p.metadata.uid)).collect());
    let policies = Api::<NetworkPolicy>::namespaced(client.clone(), NS).list(&lp).await.unwrap().items.len();
    let cms: Vec<String> = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.starts_with("shakedown-"))
        .collect();
    let sts = Api::<StatefulSet>::namespaced(client.clone(), NS).get("etcd").await.unwrap().spec.and_then(|s| s.replicas);
    let op = Api::<Deployment>::namespaced(client.clone(), NS).get("etcd-operator").await.unwrap().spec.and_then(|s| s.replicas);
    let nodes: Vec<String> = Api::<KubeNode>::all(client.clone())
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| format!("{}:{:?}", n.metadata.name.unwrap_or_default(), n.spec.and_then(|s| s.unschedulable)))
        .collect();
    format!("pods {pods}\nclaims {claims}\npolicies {policies}\nconfigmaps {cms:?}\nstatefulset {sts:?}\noperator {op:?}\nnodes {nodes:?}")
}

/// `run --target app --dry-run` of a plan of every kind of write: it prints the writes and the
/// waits and ends with their count, and the cluster is as it was.
async fn dry_run_changes_nothing(client: &kube::Client, files: &Path, kubeconfig: &str, app: &str) {
    let dry = files.join("dry");
    std::fs::create_dir_all(&dry).unwrap();
    let p = dry.join("dry.toml");
    let ops = ["pod-kill", "pod-kill-selected", "operator-restart", "pvc-loss", "node-drain", "partition", "backup"];
    std::fs::write(&p, profile("app-dry", &ops, 10)).unwrap();
    let seed = seed_with(&p, &["pod-kill", "operator-restart", "pvc-loss", "node-drain"]);
    let before = app_state(client).await;
    let (code, out, err) = shakedown(
        &[
            "run",
            "--target",
            "app",
            "--dry-run",
            "--kubeconfig",
            kubeconfig,
            "--app-profile",
            app,
            "--profile",
            &p.display().to_string(),
            "--seed",
            &seed.to_string(),
        ],
        &dry,
    );
    assert_eq!(code, 0, "{out}\n{err}");
    eprintln!("the dry run (seed {seed}):\n{out}");
    for write in [
        "dry-run: DELETE /api/v1/namespaces/app/pods/etcd-",
        "dry-run: PATCH /apis/apps/v1/namespaces/app/deployments/etcd-operator (merge patch) {\"spec\":{\"replicas\":0}}",
        "dry-run: DELETE /api/v1/namespaces/app/persistentvolumeclaims/data-etcd-",
        "dry-run: PATCH /api/v1/nodes/",
        "dry-run: POST /api/v1/namespaces/app/configmaps",
        "dry-run: wait (up to 180s) until",
    ] {
        assert!(out.contains(write), "the dry run prints {write:?}: {out}");
    }
    let printed = out.lines().filter(|l| l.starts_with("dry-run: ") && !l.starts_with("dry-run: wait")).count();
    assert!(
        out.contains(&format!("dry run: {printed} write request(s) printed, none sent")),
        "the dry run counts the {printed} writes it printed: {out}"
    );
    assert_eq!(app_state(client).await, before, "a dry run changed the cluster");
}

/// The reference application (`examples/postgres-patroni`, software nobody here wrote):
/// PostgreSQL 15 and Patroni 3.0.2 from Debian's packages, its image built by its script and
/// loaded with `node load`, applied with kubectl as its README says (Patroni reaches the
/// apiserver by its in-cluster configuration, through the node's kube-proxy). A seeded plan that
/// kills replicas and the primary by its label and switches over through `patronictl` passes,
/// every step checked: the primary's pod was killed, every loss of the primary was followed to a
/// new one (or the same one back), the switchover moved the lead to another pod, writes went on
/// across it all, and no acknowledged write was lost (strict synchronous replication). Then
/// backups and point-in-time restores by pgBackRest's commands: a plan of them passes with
/// writes acknowledged after each restore's instant that the restore had to take away, and the
/// same plan with a restore command that restores nothing fails `app-durability`, naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_database_fails_over_and_restores_to_a_point_in_time_under_seeded_plans() {
    let bins = NodeBinaries::find().unwrap_or_else(|e| panic!("the node's binaries: {e}"));
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/postgres-patroni");
    let archive = Path::new("/var/cache/shakedown/images/postgres-patroni.tar");
    // Cached by ./scripts/install-deps.sh --all; built here otherwise (about 3 minutes).
    let built = std::process::Command::new("bash").arg(example.join("build-image.sh")).arg(archive).output().unwrap();
    assert!(built.status.success(), "{}{}", String::from_utf8_lossy(&built.stdout), String::from_utf8_lossy(&built.stderr));
    let dir = tempfile::tempdir().unwrap();
    let net_before = hostnet::snapshot();
    let tunables = NodeOptions { set_kernel_tunables: true, workers: 0 };
    let mut node = Node::up(&format!("sd-pgtest{}", std::process::id()), dir.path(), &bins, &tunables)
        .await
        .unwrap_or_else(|e| panic!("node up: {e}"));
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    let _keep = common::KeepOnFailure::new(files.clone(), format!("pg-{}", std::process::id()));
    let loaded = shakedown::node::images::import(&bins.ctr, &node.layout.containerd_socket(), archive, None).await.unwrap();
    assert_eq!(loaded, vec!["shakedown.local/postgres-patroni:15-3.0.2-pgbackrest".to_string()]);
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new("kubectl").args(args).env("KUBECONFIG", &node.kubeconfig).output().unwrap();
        assert!(out.status.success(), "kubectl {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    kubectl(&["apply", "-f", example.join("patroni.yaml").to_str().unwrap()]);
    // The StatefulSet's pods appear one at a time; each is Ready once its PostgreSQL runs.
    let client = node.client().await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "pg");
    let primary = || async {
        let l = pods.list(&ListParams::default().labels("role=master")).await.ok()?;
        l.items.into_iter().find(shakedown::targets::app::data::is_ready).and_then(|p| p.metadata.uid)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let ready =
            pods.list(&ListParams::default()).await.map(|l| l.items.iter().filter(|p| shakedown::targets::app::data::is_ready(p)).count());
        if ready.as_ref().is_ok_and(|n| *n == 3) && primary().await.is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "3 Ready replicas and a primary within 300 s: {ready:?}\n{}",
            kubectl(&["-n", "pg", "get", "pods", "-o", "wide"])
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let first_primary = primary().await.unwrap();

    let p = files.join("pg.toml");
    std::fs::write(&p, profile("pg-failover", &["pod-kill", "pod-kill-selected", "switchover"], 5)).unwrap();
    let seed = seed_with(&p, &["pod-kill(", "pod-kill-selected", "switchover("]);
    let app = example.join("app.toml");
    passes_checked(
        &[
            "--kubeconfig",
            node.kubeconfig.to_str().unwrap(),
            "--app-profile",
            app.to_str().unwrap(),
            "--profile",
            p.to_str().unwrap(),
            "--seed",
            &seed.to_string(),
        ],
        5,
        &files,
        "the reference database under a seeded plan",
    );
    let events = last_run_events(&files);
    let kills: Vec<serde_json::Value> =
        events.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["kind"] == "app-kill").collect();
    assert!(
        kills.iter().any(|k| k["detail"]["selector"] == "role=master" && k["detail"]["killed"].as_array().is_some_and(|a| a.len() == 1)),
        "the primary killed by its label: {kills:?}"
    );
    // Every kill of the primary was followed to its end: another pod primary (a failover) or
    // the same one back, with the time no Ready pod was primary.
    let failovers: Vec<serde_json::Value> =
        events.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["kind"] == "app-failover").collect();
    let primary_kills = kills.iter().filter(|k| k["detail"]["selector"] == "role=master").count();
    assert!(
        failovers.len() >= primary_kills,
        "{} app-failover events for {primary_kills} kills of the primary: {failovers:?}",
        failovers.len()
    );
    for f in &failovers {
        assert!(f["detail"]["after"].is_string() && f["detail"]["without_leader_ms"].as_u64().is_some(), "a primary again, timed: {f}");
    }
    eprintln!("failovers: {failovers:?}");
    // The planned failover went through Patroni's own command, to another pod.
    let switchovers: Vec<serde_json::Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "app-switchover")
        .collect();
    assert!(!switchovers.is_empty() && switchovers.iter().all(|s| s["detail"]["from"] != s["detail"]["to"]), "{switchovers:?}");
    let after = primary().await.expect("a primary after the run");
    assert_ne!(after, first_primary, "the primary's pod was replaced (a killed pod comes back with a new UID)");
    let acked = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("workload").and_then(|w| w.get("data_acked")).and_then(|a| a.as_u64()))
        .next_back()
        .expect("the data workload's counters");
    assert!(acked > 20, "{acked} writes acknowledged");

    // Backups and point-in-time restores through pgBackRest (patroni.yaml's scripts).
    let p = files.join("pitr.toml");
    std::fs::write(&p, profile("pg-pitr", &["backup", "restore-pitr", "switchover"], 4)).unwrap();
    let seed = seed_where(&p, |ops| {
        let at = |w: &str| ops.iter().position(|l| l.contains(w));
        matches!((at("backup"), at("restore-pitr(")), (Some(b), Some(r)) if b < r)
    })
    .expect("a seed plans a backup, then a point-in-time restore");
    let args = ["--kubeconfig", node.kubeconfig.to_str().unwrap(), "--profile", p.to_str().unwrap(), "--seed", &seed.to_string()];
    passes_checked(&[&args[..], &["--app-profile", app.to_str().unwrap()]].concat(), 4, &files, "backups and point-in-time restores");
    let events = last_run_events(&files);
    let restores: Vec<serde_json::Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "app-restore-pitr")
        .collect();
    assert!(!restores.is_empty() && restores.iter().all(|r| r["detail"]["error"].is_null()), "{restores:?}");
    // Writes were acknowledged after the instant and before the restore: it had something to
    // take away, which app-durability (which passed) saw gone.
    assert!(
        restores.iter().any(|r| r["detail"]["acked_when_asked"].as_u64() > r["detail"]["acked_before"].as_u64().map(|n| n + 1)),
        "writes acknowledged between the instant and the restore: {restores:?}"
    );
    // The same plan with a restore that restores nothing: the writes after the instant stay.
    let noop = files.join("app-noop-restore.toml");
    let text = std::fs::read_to_string(&app).unwrap();
    let pitr_command = "command = [\"/etc/patroni/restore.sh\", \"{backup}\", \"{time}\"]";
    assert!(text.contains(pitr_command), "the app profile's [restore_pitr] command: {text}");
    std::fs::write(&noop, text.replace(pitr_command, "command = [\"sh\", \"-c\", \"sleep 2\"]")).unwrap();
    let (code, out, err) =
        shakedown(&[&["run", "--target", "app"], &args[..], &["--app-profile", noop.to_str().unwrap()]].concat(), &files);
    assert_eq!(code, 1, "a restore that restores nothing fails the run: {out}\n{err}");
    assert!(
        err.contains("VIOLATION app-durability") && err.contains("are still there") && err.contains("recovered to the instant after ack #"),
        "app-durability names the writes after the instant: {err}"
    );

    let left = node.teardown();
    assert!(left.is_empty(), "left behind: {left}");
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by the reference application's runs and the node's teardown");
}

/// With a worker node beside the control-plane node (`node up --workers 1`), a drain has
/// somewhere to send the pods: the drain holds the node cordoned until each evicted web replica's
/// replacement is scheduled on the other node, every step's checks (app-ready: all three Ready)
/// pass, and the event log names where each went (two drains: seed 1 drains each node once). The node's teardown leaves nothing of either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_nodes_replicas_are_rescheduled_on_the_worker_node() {
    let bins = NodeBinaries::find().unwrap_or_else(|e| panic!("the node's binaries: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let net_before = hostnet::snapshot();
    let opts = NodeOptions { set_kernel_tunables: true, workers: 1 };
    let mut node =
        Node::up(&format!("sd-wdrain{}", std::process::id()), dir.path(), &bins, &opts).await.unwrap_or_else(|e| panic!("node up: {e}"));
    let client = node.client().await.unwrap();
    let nodes: Api<KubeNode> = Api::all(client.clone());
    let names: Vec<String> = nodes.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|n| n.metadata.name).collect();
    assert_eq!(names.len(), 2, "the node and its worker registered: {names:?}");
    for n in &names {
        let opt_in = serde_json::json!({"metadata": {"annotations": {shakedown::k8s::OPT_IN: "true"}}});
        nodes.patch(n, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(opt_in)).await.unwrap();
    }
    web::deploy(&client).await;
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    let _keep = common::KeepOnFailure::new(files.clone(), format!("worker-drain-{}", std::process::id()));
    // kubelet 1.20 takes 7-17 s here to remove an evicted pod (its grace period is 1 s), more
    // when the machine is busy: the drain's bound is 120 s rather than the profile's 30 s.
    std::fs::write(files.join("web.toml"), web::PROFILE.replace("op_timeout = \"30s\"", "op_timeout = \"120s\"")).unwrap();
    let web_app = files.join("web.toml").display().to_string();
    let p = files.join("drain.toml");
    std::fs::write(&p, profile("worker-drain", &["node-drain"], 2).replace(", \"app-durability\", \"app-linearizability\"", "")).unwrap();
    passes_checked(
        &[
            "--kubeconfig",
            &node.kubeconfig.display().to_string(),
            "--app-profile",
            &web_app,
            "--profile",
            &p.display().to_string(),
            "--seed",
            "1",
        ],
        2,
        &files,
        "two drains with a worker node",
    );
    let events: Vec<serde_json::Value> = last_run_events(&files).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let drained: Vec<&serde_json::Value> = events.iter().filter(|e| e["kind"] == "app-drained").collect();
    let drains: Vec<&serde_json::Value> = events.iter().filter(|e| e["kind"] == "app-drain").collect();
    assert_eq!(drained.len(), 2, "two drains: {events:?}");
    let mut moved = 0;
    for (drain, done) in drains.iter().zip(&drained) {
        let from = done["detail"]["node"].as_str().unwrap();
        let rescheduled = &done["detail"]["rescheduled"];
        assert!(rescheduled["nowhere"].is_null(), "the worker was there to take the pods: {done}");
        assert_eq!(rescheduled["unscheduled"], serde_json::json!([]), "every replacement scheduled: {done}");
        let evicted: Vec<&str> = drain["detail"]["evictable"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        for pod in evicted.iter().filter(|p| p.starts_with("web/")) {
            let to = rescheduled["pods"][*pod].as_str().unwrap_or_else(|| panic!("{pod} replaced: {done}"));
            assert_ne!(to, from, "{pod} rescheduled off the drained node: {done}");
            assert!(names.iter().any(|n| n == to), "{pod} on a node of the cluster: {to}");
            moved += 1;
        }
    }
    assert!(moved > 0, "the drains evicted web replicas: {drains:?}");
    eprintln!("{moved} web replicas rescheduled onto the other node across 2 drains");
    // Ready where they went (the last step's app-ready said so; seen here as well).
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), web::NS);
    let ready =
        pods.list(&ListParams::default()).await.unwrap().items.iter().filter(|p| shakedown::targets::app::data::is_ready(p)).count();
    assert_eq!(ready, 3, "three web replicas Ready after the drains");
    let left = node.teardown();
    assert!(left.is_empty(), "the node and its worker left: {left}");
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by the drains and the teardown of a node with a worker");
}
