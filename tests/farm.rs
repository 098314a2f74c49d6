//! The soak farm of `ci/k8s/farm` as real pods on the local node (root): the farm's image
//! (`scripts/build-farm-image.sh`, this build's binary with the local stack's programs) loaded
//! into a node with a worker, the kustomization applied, two pods each running a local-target
//! soak — the whole etcd stack, HAProxy, loop devices and nftables inside a privileged pod — on
//! its own share of the seeds, `merge-job.yaml` summing both up from the claim; then a pod
//! deleted mid-seed, whose SIGTERM lets the soak tear its stack down and sum up within the
//! grace period, leaving no loop device on the machine; and the node torn down under a running
//! soak, its loop devices detached by the node's teardown.
//!
//! The node's Kubernetes (1.20) predates Indexed Jobs (1.21+): the test creates the farm's pods
//! as the Job controller of 1.21+ would — one Job per index, each pod annotated with its
//! `batch.kubernetes.io/job-completion-index`, which the manifest's env reads — and drops the
//! fields 1.20 does not know (`completionMode`, `backoffLimitPerIndex`, `maxFailedIndexes`). What
//! the pods do with their index is the manifest's own; only the controller's indexing is stood in.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::Value;
use shakedown::node::{Node, NodeBinaries, NodeOptions};

const NS: &str = "shakedown-farm";
/// The farm's pods in this test.
const N: usize = 2;
/// The farm's base seed here.
const FIRST_SEED: u64 = 7;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl` against the node, its stdout; fails the test on an error.
fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("kubectl (install-deps.sh --all installs it): {e}"));
    child.stdin.take().unwrap().write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "kubectl {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// `ci/k8s/farm` as `kubectl kustomize` renders it, with the ConfigMap's values set to `config`
/// and the Job as the Job controller of 1.21+ runs it on 1.20: one Job per index of `indexes`
/// (named `<name>-<suffix><index>`), its pod annotated with the index, `/20` of the partition
/// made `/n`. Returns a `List` for `kubectl apply`.
fn farm_objects(kubeconfig: &Path, config: &[(&str, &str)], indexes: &[usize], suffix: &str, n: usize) -> Value {
    let rendered = kubectl(kubeconfig, &["kustomize", &repo().join("ci/k8s/farm").display().to_string()], None);
    let mut items = vec![];
    for mut v in serde_saphyr::from_multiple::<Value>(&rendered).unwrap() {
        match v["kind"].as_str().unwrap() {
            "ConfigMap" => {
                for (k, val) in config {
                    v["data"][*k] = Value::from(*val);
                }
                items.push(v);
            }
            "Job" => {
                assert_eq!(v["spec"]["completions"], 20, "the farm's default N");
                for &i in indexes {
                    let mut j = v.clone();
                    let spec = j["spec"].as_object_mut().unwrap();
                    for k in ["completionMode", "backoffLimitPerIndex", "maxFailedIndexes"] {
                        assert!(spec.remove(k).is_some(), "the farm's Job sets {k}");
                    }
                    spec.insert("completions".into(), 1.into());
                    spec.insert("parallelism".into(), 1.into());
                    spec.insert("backoffLimit".into(), 0.into());
                    j["metadata"]["name"] = format!("shakedown-farm-{suffix}{i}").into();
                    j["spec"]["template"]["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = i.to_string().into();
                    let c = &mut j["spec"]["template"]["spec"]["containers"][0];
                    for e in c["env"].as_array_mut().unwrap() {
                        if e["name"] == "SHAKEDOWN_PARTITION" {
                            assert_eq!(e["value"], "$(JOB_COMPLETION_INDEX)/20");
                            e["value"] = format!("$(JOB_COMPLETION_INDEX)/{n}").into();
                        }
                    }
                    items.push(j);
                }
            }
            _ => items.push(v),
        }
    }
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// Waits (bounded) until Job `name` is Complete; fails the test if it Failed.
async fn complete(jobs: &Api<Job>, name: &str, bound: Duration, kubeconfig: &Path) {
    assert!(finished(jobs, name, bound, kubeconfig).await, "job {name} failed:\n{}", job_logs(kubeconfig, name));
}

fn job_logs(kubeconfig: &Path, name: &str) -> String {
    kubectl(kubeconfig, &["-n", NS, "logs", &format!("job/{name}"), "--tail=40"], None)
}

/// Waits (bounded) until Job `name` has ended: `true` when Complete, `false` when Failed.
async fn finished(jobs: &Api<Job>, name: &str, bound: Duration, kubeconfig: &Path) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        let conds = jobs.get(name).await.ok().and_then(|j| j.status?.conditions).unwrap_or_default();
        if conds.iter().any(|c| c.type_ == "Complete" && c.status == "True") {
            return true;
        }
        if conds.iter().any(|c| c.type_ == "Failed" && c.status == "True") {
            return false;
        }
        assert!(Instant::now() < deadline, "job {name} not Complete within {bound:?}:\n{}", job_logs(kubeconfig, name));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The exit code of the (one) pod of Job `name`.
async fn pod_exit_code(pods: &Api<Pod>, name: &str) -> Option<i32> {
    let list = pods.list(&ListParams::default().labels(&format!("job-name={name}"))).await.ok()?;
    let pod = list.items.into_iter().next()?;
    pod.status?.container_statuses?.first()?.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
}

/// Loop devices of the machine whose backing file is on the farm's claim: named as the pod saw
/// it (`/var/lib/shakedown/farm/pod-<i>/…`), or from the claim's root (`/farm/pod-<i>/…`, and
/// `(deleted)`) once the pod's mount namespace is gone.
fn farm_loop_devices() -> Vec<String> {
    let out = Command::new("losetup").arg("-a").output().expect("losetup");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("/farm/pod-")).map(str::to_string).collect()
}

/// The seed lines of one pod's soak (`farm/pod-<i>/soak-*/soak.jsonl`).
fn seed_lines(claim: &Path, i: usize) -> Vec<Value> {
    let pod = claim.join(format!("farm/pod-{i}"));
    let soaks: Vec<PathBuf> = std::fs::read_dir(&pod)
        .unwrap_or_else(|e| panic!("{}: {e}", pod.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("soak.jsonl").is_file())
        .collect();
    assert_eq!(soaks.len(), 1, "one soak in {}: {soaks:?}", pod.display());
    std::fs::read_to_string(soaks[0].join("soak.jsonl")).unwrap().lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).collect()
}

/// What a seed line says failed (`FAIL <what> at step N: …`), if it failed.
fn failed(line: &Value) -> Option<String> {
    line["verdict"].as_str()?.strip_prefix("FAIL ")?.split(" at step ").next().map(str::to_string)
}

/// A node with a worker, the farm's image (built from this build's binary) loaded into both.
async fn farm_node() -> (tempfile::TempDir, Node) {
    let bins = NodeBinaries::find().unwrap_or_else(|e| panic!("the node's binaries: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("farm.tar");
    let t0 = Instant::now();
    let built = Command::new("bash")
        .arg(repo().join("scripts/build-farm-image.sh"))
        .arg(&archive)
        .env("SHAKEDOWN_BIN", env!("CARGO_BIN_EXE_shakedown"))
        .output()
        .unwrap();
    assert!(built.status.success(), "{}{}", String::from_utf8_lossy(&built.stdout), String::from_utf8_lossy(&built.stderr));
    eprintln!("farm image built in {:.1}s", t0.elapsed().as_secs_f64());
    let opts = NodeOptions { set_kernel_tunables: true, workers: 1 };
    let node =
        Node::up(&format!("sd-farm{}", std::process::id()), dir.path(), &bins, &opts).await.unwrap_or_else(|e| panic!("node up: {e}"));
    let t0 = Instant::now();
    for m in node.layout.members() {
        let names = shakedown::node::images::import(&bins.ctr, &m.containerd_socket(), &archive, None).await.unwrap();
        assert!(names.contains(&"docker.io/library/shakedown-local:latest".to_string()), "{names:?}");
    }
    eprintln!("loaded into both nodes in {:.1}s", t0.elapsed().as_secs_f64());
    (dir, node)
}

/// The farm's claim as the machine sees it: the hostPath provisioner's directory of the node.
async fn claim_dir(client: &kube::Client, node: &Node) -> PathBuf {
    let pvc: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pv_name = pvc.get("shakedown-farm").await.unwrap().spec.unwrap().volume_name.expect("the claim bound");
    let pv = Api::<PersistentVolume>::all(client.clone()).get(&pv_name).await.unwrap();
    let path = pv.spec.unwrap().host_path.expect("a hostPath volume").path;
    node.layout
        .host_path_dir(shakedown::node::volumes::PROVISIONER_DIR)
        .join(Path::new(&path).strip_prefix(shakedown::node::volumes::PROVISIONER_DIR).expect("under the provisioner's directory"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soak_farm_runs_local_target_soaks_as_pods_and_merges_them() {
    let (_dir, mut node) = farm_node().await;
    // A failed farm keeps its claims (every pod's soaks, run directories, member logs and seed
    // records, without disk images): the node's teardown removes them.
    let claims = node.layout.host_path_dir(shakedown::node::volumes::PROVISIONER_DIR);
    let _keep = common::KeepOnFailure::new(claims, format!("farm-{}", std::process::id()));
    let kc = node.kubeconfig.clone();
    let client = node.client().await.unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let loops_before = farm_loop_devices();

    // Two pods, each a soak of the smoke profile on its half of the seeds from 7.
    let farm = farm_objects(&kc, &[("for", "20s"), ("profile", "smoke"), ("first-seed", &FIRST_SEED.to_string())], &[0, 1], "", N);
    kubectl(&kc, &["apply", "-f", "-"], Some(&farm.to_string()));
    let t0 = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // A pod whose soak found a failure exits 1 and its index fails (backoffLimitPerIndex 0): a
    // finding of the stack's (etcd 3.4 without pre-vote is leaderless for longer than smoke's
    // 10 s `converge` now and then on a loaded machine), which the farm must report, not hide.
    let mut exited_with_findings = std::collections::BTreeSet::new();
    for i in 0..N {
        let name = format!("shakedown-farm-{i}");
        if !finished(&jobs, &name, Duration::from_secs(300), &kc).await {
            // Exit 1: a seed violated an invariant; 3: a seed's stack did not converge.
            let code = pod_exit_code(&pods, &name).await;
            assert!(matches!(code, Some(1 | 3)), "job {name} failed other than by a finding (exit {code:?}):\n{}", job_logs(&kc, &name));
            eprintln!("pod {i} found a failure (exit {code:?}):\n{}", job_logs(&kc, &name));
            exited_with_findings.insert(i);
        }
    }
    eprintln!("the farm's {N} pods done in {:.1}s", t0.elapsed().as_secs_f64());
    let nodes: std::collections::BTreeSet<String> =
        pods.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|p| p.spec?.node_name).collect();
    eprintln!("on nodes {nodes:?}");
    let claim = claim_dir(&client, &node).await;
    let mut total = 0;
    let mut failures: std::collections::BTreeMap<String, usize> = Default::default();
    for i in 0..N {
        let lines = seed_lines(&claim, i);
        let seeds: Vec<u64> = lines.iter().map(|l| l["seed"].as_u64().expect("a seed")).collect();
        assert!(!seeds.is_empty(), "pod {i} ran seeds");
        assert!(seeds.iter().all(|s| (s - FIRST_SEED) as usize % N == i), "pod {i}'s seeds are its partition's: {seeds:?}");
        let junit = claim.join(format!("junit/farm-{i}.xml"));
        assert!(std::fs::read_to_string(&junit).is_ok_and(|x| x.contains("<testcase")), "{}", junit.display());
        let found: Vec<&Value> = lines.iter().filter(|l| failed(l).is_some()).collect();
        assert_eq!(!found.is_empty(), exited_with_findings.contains(&i), "pod {i} exited 1 exactly when a seed failed: {lines:?}");
        for l in found {
            *failures.entry(failed(l).unwrap()).or_default() += 1;
            let record = l["record"].as_str().unwrap_or_else(|| panic!("a failed seed has a record: {l}"));
            let on_claim = claim.join(Path::new(record).strip_prefix("/var/lib/shakedown").expect("the record is on the claim"));
            assert!(on_claim.is_file(), "the failed seed's record {} is on the claim", on_claim.display());
        }
        total += seeds.len();
    }
    // merge-job.yaml as shipped: one summary of both pods' seeds.
    kubectl(&kc, &["apply", "-f", &repo().join("ci/k8s/farm/merge-job.yaml").display().to_string()], None);
    // The merge exits as a soak does: 0 without failures, else 1 or 3 (its Job then fails).
    let merged_ok = finished(&jobs, "shakedown-farm-merge", Duration::from_secs(120), &kc).await;
    assert_eq!(
        merged_ok,
        exited_with_findings.is_empty(),
        "the merge's Job ends as the pods' did:\n{}",
        job_logs(&kc, "shakedown-farm-merge")
    );
    let summary = kubectl(&kc, &["-n", NS, "logs", "job/shakedown-farm-merge"], None);
    eprintln!("{summary}");
    assert!(summary.contains(&format!("soaks          {N}: ")) && summary.contains(&format!("seeds          {total} (")), "{summary}");
    // The merge reports every pod's failures (none, on a quiet machine).
    let want = if failures.is_empty() {
        "none".to_string()
    } else {
        failures.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(" · ")
    };
    assert!(summary.contains(&format!("failures       {want}\n")), "failures {want}: {summary}");
    let merged = std::fs::read_to_string(claim.join("merged/junit.xml")).unwrap();
    assert_eq!(merged.matches("<testcase").count(), total, "{merged}");
    assert_eq!(merged.matches("<failure").count(), failures.values().sum::<usize>(), "{merged}");
    assert!(claim.join("merged/report.html").is_file());
    assert_eq!(farm_loop_devices(), loops_before, "the soaks detached their loop devices");

    // A soak stopped mid-seed: its Job deleted (what a deadline or a cancelled farm does; a
    // deleted pod alone would be replaced by the Job), the pod gets SIGTERM, the step running
    // finishes, the stack goes (loop devices detached), the soak sums up, within the grace period.
    let long = farm_objects(&kc, &[("for", "10m")], &[0], "term-", N);
    kubectl(&kc, &["apply", "-f", "-"], Some(&long.to_string()));
    let selector = ListParams::default().labels("job-name=shakedown-farm-term-0");
    let deadline = Instant::now() + Duration::from_secs(120);
    while farm_loop_devices().len() <= loops_before.len() {
        assert!(Instant::now() < deadline, "the long pod's stack (its loop devices) up within 120 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t0 = Instant::now();
    jobs.delete("shakedown-farm-term-0", &DeleteParams::foreground()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while !pods.list(&selector).await.unwrap().items.is_empty() {
        assert!(Instant::now() < deadline, "the long pod gone within its grace period (300 s)");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("stopped mid-seed: the pod gone {:.1}s after its Job's deletion", t0.elapsed().as_secs_f64());
    assert_eq!(farm_loop_devices(), loops_before, "the stopped soak detached its loop devices");
    // It summed up on its way out: its report and JUnit file on the claim.
    let soaks: Vec<PathBuf> = std::fs::read_dir(claim.join("farm/pod-0"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("soak.jsonl").is_file())
        .collect();
    assert_eq!(soaks.len(), 2, "a second soak in pod-0's directory: {soaks:?}");
    assert!(soaks.iter().all(|s| s.join("report.html").is_file() && s.join("junit.xml").is_file()), "both summed up: {soaks:?}");
    // The node torn down under a running soak (its pods' processes killed: no teardown of their
    // own): the loop devices they attached are the machine's, and the node's teardown detaches them.
    let again = farm_objects(&kc, &[("for", "10m")], &[1], "killed-", N);
    kubectl(&kc, &["apply", "-f", "-"], Some(&again.to_string()));
    let deadline = Instant::now() + Duration::from_secs(120);
    while farm_loop_devices().len() <= loops_before.len() {
        assert!(Instant::now() < deadline, "the last pod's stack (its loop devices) up within 120 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let attached = farm_loop_devices();
    let left = node.teardown();
    assert!(left.is_empty(), "the node left: {left}");
    assert_eq!(farm_loop_devices(), loops_before, "the killed pod's loop devices {attached:?} detached by the node's teardown");
}

/// Not part of the suite: the farm's rate on this machine. One pod soaks the farm's profile for
/// SHAKEDOWN_FARM_MINUTES (10 by default), then two pods (one per node) for as long; prints the
/// seeds each round finished per hour and the ratio of two pods' to one's. Seeds cut short by the
/// time are not counted. `SHAKEDOWN_FARM_PROFILE` picks the profile (default: the farm's, nightly).
///   cargo test --test farm -- --ignored --nocapture measure
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of several minutes: cargo test --test farm -- --ignored --nocapture measure"]
async fn measure_the_farms_seeds_per_hour_with_one_and_two_pods() {
    let minutes: u64 = std::env::var("SHAKEDOWN_FARM_MINUTES").ok().and_then(|m| m.parse().ok()).unwrap_or(10);
    let profile = std::env::var("SHAKEDOWN_FARM_PROFILE").unwrap_or_else(|_| "nightly".into());
    let (_dir, mut node) = farm_node().await;
    let kc = node.kubeconfig.clone();
    let client = node.client().await.unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let mut rates = vec![];
    for (n, suffix) in [(1usize, "one-"), (2, "two-")] {
        let first = 1000 * n as u64;
        let indexes: Vec<usize> = (0..n).collect();
        let config = [("for", format!("{minutes}m")), ("profile", profile.clone()), ("first-seed", first.to_string())];
        let config: Vec<(&str, &str)> = config.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let farm = farm_objects(&kc, &config, &indexes, suffix, n);
        kubectl(&kc, &["apply", "-f", "-"], Some(&farm.to_string()));
        for i in 0..n {
            complete(&jobs, &format!("shakedown-farm-{suffix}{i}"), Duration::from_secs(minutes * 60 + 900), &kc).await;
        }
        let claim = claim_dir(&client, &node).await;
        let mut done = 0usize;
        for i in 0..n {
            // This round's soak of pod i: the one whose first seed is this round's.
            for soak in std::fs::read_dir(claim.join(format!("farm/pod-{i}"))).unwrap().flatten().map(|e| e.path()) {
                let Ok(text) = std::fs::read_to_string(soak.join("soak.jsonl")) else { continue };
                let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
                if lines.first().and_then(|l| l["seed"].as_u64()) == Some(first + i as u64) {
                    done += lines.iter().filter(|l| !l["verdict"].as_str().unwrap_or("").starts_with("cut short")).count();
                }
            }
        }
        let per_hour = done as f64 * 60.0 / minutes as f64;
        eprintln!("N = {n}: {done} seeds of {profile} finished in {minutes} min: {per_hour:.1} seeds/hour");
        rates.push(per_hour);
    }
    eprintln!("two pods against one: {:.2}x", rates[1] / rates[0].max(f64::MIN_POSITIVE));
    let left = node.teardown();
    assert!(left.is_empty(), "the node left: {left}");
}
