//! Tests of the ci/k8s manifests that need no cluster: every pod template meets the
//! **restricted** Pod Security Standard, and every container's command line, with the
//! environment the manifests give it, is a valid command line of this shakedown.
//!
//! The Pod Security checks are the documented ones of the restricted level (which includes the
//! baseline level), Kubernetes "Pod Security Standards" (policy version latest, as of 1.33),
//! encoded here because the test apiserver (1.20) has no PodSecurity admission.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde_json::Value;

use super::{Cli, Command, Partition};
use crate::targets::TargetKind;

/// The tests that set SHAKEDOWN_* variables take turns (one process under `cargo test`).
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// `argv` parsed by clap with exactly `env` as the SHAKEDOWN_ environment (the caller holds the
/// tests' environment lock); fails the test, naming `what`, if it does not parse.
fn parse_with_env(what: &str, argv: &[String], env: &[(String, String)]) -> Cli {
    let keys: Vec<String> = std::env::vars().map(|(k, _)| k).filter(|k| k.starts_with("SHAKEDOWN_")).collect();
    for k in &keys {
        std::env::remove_var(k);
    }
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    let parsed = Cli::try_parse_from(argv);
    for (k, _) in env {
        std::env::remove_var(k);
    }
    parsed.unwrap_or_else(|e| panic!("{what}: `{}` with {env:?} does not parse: {e}", argv.join(" ")))
}

/// The annotation an Indexed Job's controller puts on each pod: its completion index.
const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/k8s")
}

/// ci/k8s-app: the app target's Job.
fn app_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/k8s-app")
}

/// Every document of every manifest in ci/k8s (not the kustomization itself).
fn manifests() -> Vec<(String, Value)> {
    manifests_in(&dir())
}

/// Every document of every manifest in `dir` (not its subdirectories, not the kustomization).
fn manifests_in(dir: &Path) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml") && !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for v in serde_saphyr::from_multiple::<Value>(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display())) {
            out.push((f.file_name().unwrap().to_string_lossy().to_string(), v));
        }
    }
    out
}

/// The kustomization's namespace and the literals of its ConfigMap generators (name → key → value).
fn kustomization() -> (String, BTreeMap<String, BTreeMap<String, String>>) {
    kustomization_in(&dir())
}

/// The namespace and the generated ConfigMaps (name → key → value) of `dir/kustomization.yaml`.
fn kustomization_in(dir: &Path) -> (String, BTreeMap<String, BTreeMap<String, String>>) {
    let k: Value = serde_saphyr::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap()).unwrap();
    let ns = k["namespace"].as_str().expect("kustomization.yaml sets namespace").to_string();
    let mut maps = BTreeMap::new();
    for g in k["configMapGenerator"].as_array().into_iter().flatten() {
        let mut m = BTreeMap::new();
        for l in g["literals"].as_array().into_iter().flatten() {
            let (key, value) = l.as_str().unwrap().split_once('=').unwrap();
            m.insert(key.to_string(), value.to_string());
        }
        for f in g["files"].as_array().into_iter().flatten() {
            let f = f.as_str().unwrap();
            assert!(dir.join(f).is_file(), "the ConfigMap generator's file {f} is in {}", dir.display());
            m.insert(f.to_string(), std::fs::read_to_string(dir.join(f)).unwrap());
        }
        maps.insert(g["name"].as_str().unwrap().to_string(), m);
    }
    (ns, maps)
}

/// The pod templates of Jobs, CronJobs and bare Pods: (what, pod spec).
fn pod_templates(docs: &[(String, Value)]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (file, v) in docs {
        let what = format!("{file}: {} {}", v["kind"].as_str().unwrap_or("?"), v["metadata"]["name"].as_str().unwrap_or("?"));
        let spec = match v["kind"].as_str() {
            Some("CronJob") => v.pointer("/spec/jobTemplate/spec/template/spec"),
            Some("Job" | "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet") => v.pointer("/spec/template/spec"),
            Some("Pod") => v.pointer("/spec"),
            _ => None,
        };
        if let Some(s) = spec {
            out.push((what, s.clone()));
        }
    }
    out
}

/// What keeps `pod` (a pod spec, with `annotations` of its template) from the restricted Pod
/// Security Standard: empty when it meets it.
pub(crate) fn restricted_violations(pod: &Value, annotations: &Value) -> Vec<String> {
    let mut v = Vec::new();
    let s = |p: &str| pod.pointer(p);
    let t = |x: Option<&Value>| x.and_then(Value::as_bool) == Some(true);
    let containers: Vec<(String, &Value)> = ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().into_iter().flatten().map(move |c| (format!("{k} {}", c["name"].as_str().unwrap_or("?")), c)))
        .collect();
    // Baseline.
    for ns in ["hostNetwork", "hostPID", "hostIPC"] {
        if t(pod.get(ns)) {
            v.push(format!("host namespaces: {ns} is true"));
        }
    }
    if t(s("/securityContext/windowsOptions/hostProcess")) {
        v.push("HostProcess: pod securityContext.windowsOptions.hostProcess".into());
    }
    let psc = &pod["securityContext"];
    let selinux = |what: &str, o: &Value| {
        let mut e = Vec::new();
        if let Some(ty) = o.pointer("/seLinuxOptions/type").and_then(Value::as_str) {
            if !["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"].contains(&ty) {
                e.push(format!("SELinux: {what} seLinuxOptions.type {ty}"));
            }
        }
        for f in ["user", "role"] {
            if o.pointer(&format!("/seLinuxOptions/{f}")).and_then(Value::as_str).is_some_and(|x| !x.is_empty()) {
                e.push(format!("SELinux: {what} seLinuxOptions.{f} is set"));
            }
        }
        e
    };
    v.extend(selinux("pod", psc));
    let apparmor_ok = |ty: &str| ty != "Unconfined";
    if let Some(ty) = psc.pointer("/appArmorProfile/type").and_then(Value::as_str) {
        if !apparmor_ok(ty) {
            v.push("AppArmor: pod appArmorProfile Unconfined".into());
        }
    }
    for (k, val) in annotations.as_object().into_iter().flatten() {
        let val = val.as_str().unwrap_or_default();
        if k.starts_with("container.apparmor.security.beta.kubernetes.io/") && !(val == "runtime/default" || val.starts_with("localhost/"))
        {
            v.push(format!("AppArmor: annotation {k}={val}"));
        }
    }
    const SAFE_SYSCTLS: [&str; 10] = [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    ];
    for sc in psc["sysctls"].as_array().into_iter().flatten() {
        let n = sc["name"].as_str().unwrap_or_default();
        if !SAFE_SYSCTLS.contains(&n) {
            v.push(format!("sysctls: {n} is not in the safe set"));
        }
    }
    // Restricted: volume types.
    const VOLUMES: [&str; 8] = ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];
    for vol in pod["volumes"].as_array().into_iter().flatten() {
        let name = vol["name"].as_str().unwrap_or("?");
        for k in vol.as_object().into_iter().flatten().map(|(k, _)| k.as_str()).filter(|k| *k != "name") {
            if !VOLUMES.contains(&k) {
                v.push(format!("volume types: volume {name} is {k} (hostPath and other types are not allowed)"));
            }
        }
    }
    // Restricted: non-root, seccomp at pod level (or every container).
    let pod_nonroot = t(psc.get("runAsNonRoot"));
    if psc.get("runAsUser").and_then(Value::as_i64) == Some(0) {
        v.push("running as non-root user: pod runAsUser is 0".into());
    }
    let seccomp = |o: &Value| o.pointer("/seccompProfile/type").and_then(Value::as_str).map(str::to_string);
    let pod_seccomp = seccomp(psc);
    if pod_seccomp.as_deref() == Some("Unconfined") {
        v.push("seccomp: pod seccompProfile Unconfined".into());
    }
    if containers.is_empty() {
        v.push("no containers".into());
    }
    const BASELINE_CAPS: [&str; 13] = [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ];
    for (name, c) in &containers {
        let sc = &c["securityContext"];
        if t(sc.get("privileged")) {
            v.push(format!("privileged: {name}"));
        }
        if t(sc.pointer("/windowsOptions/hostProcess")) {
            v.push(format!("HostProcess: {name}"));
        }
        for p in c["ports"].as_array().into_iter().flatten() {
            if p["hostPort"].as_i64().is_some_and(|h| h != 0) {
                v.push(format!("host ports: {name} hostPort {}", p["hostPort"]));
            }
        }
        v.extend(selinux(name, sc));
        if sc.pointer("/appArmorProfile/type").and_then(Value::as_str).is_some_and(|ty| !apparmor_ok(ty)) {
            v.push(format!("AppArmor: {name} Unconfined"));
        }
        if sc.get("procMount").and_then(Value::as_str).is_some_and(|m| m != "Default") {
            v.push(format!("/proc mount: {name} procMount {}", sc["procMount"]));
        }
        if sc.get("allowPrivilegeEscalation").and_then(Value::as_bool) != Some(false) {
            v.push(format!("privilege escalation: {name} does not set allowPrivilegeEscalation: false"));
        }
        match sc.get("runAsNonRoot").and_then(Value::as_bool) {
            Some(false) => v.push(format!("running as non-root: {name} sets runAsNonRoot: false")),
            None if !pod_nonroot => v.push(format!("running as non-root: neither the pod nor {name} sets runAsNonRoot: true")),
            _ => {}
        }
        if sc.get("runAsUser").and_then(Value::as_i64) == Some(0) {
            v.push(format!("running as non-root user: {name} runAsUser is 0"));
        }
        match seccomp(sc).or_else(|| pod_seccomp.clone()).as_deref() {
            Some("RuntimeDefault" | "Localhost") => {}
            Some(other) => v.push(format!("seccomp: {name} seccompProfile {other}")),
            None => v.push(format!("seccomp: neither the pod nor {name} sets seccompProfile RuntimeDefault or Localhost")),
        }
        let caps = |k: &str| -> Vec<String> {
            sc.pointer(&format!("/capabilities/{k}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        };
        if !caps("drop").iter().any(|d| d == "ALL") {
            v.push(format!("capabilities: {name} does not drop ALL"));
        }
        for a in caps("add") {
            if a != "NET_BIND_SERVICE" {
                let level = if BASELINE_CAPS.contains(&a.as_str()) { "restricted" } else { "baseline" };
                v.push(format!("capabilities ({level}): {name} adds {a}"));
            }
        }
    }
    v
}

/// A container's command line and environment as the kubelet gives them: configMapKeyRef and
/// fieldRef resolved (`annotations`: the pod's), `$(VAR)` expanded in values (only variables
/// defined earlier in env: the kubelet expands in order) and in command and args (every
/// variable). `appended` are what a controller adds to the container's env after the
/// manifest's own — an Indexed Job's controller (1.21+) appends JOB_COMPLETION_INDEX, unless the
/// container declares it — so a value of the manifest's env never sees them.
fn resolve(
    c: &Value,
    namespace: &str,
    maps: &BTreeMap<String, BTreeMap<String, String>>,
    annotations: &[(&str, &str)],
    appended: &[(&str, &str)],
) -> (Vec<String>, Vec<(String, String)>) {
    let mut env: Vec<(String, String)> = vec![];
    let expand = |s: &str, env: &[(String, String)]| {
        let mut out = s.to_string();
        for (k, v) in env {
            out = out.replace(&format!("$({k})"), v);
        }
        out
    };
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = e["value"].as_str() {
            expand(v, &env)
        } else if let Some(r) = e.pointer("/valueFrom/configMapKeyRef") {
            let (m, k) = (r["name"].as_str().unwrap(), r["key"].as_str().unwrap());
            maps.get(m)
                .and_then(|m| m.get(k))
                .unwrap_or_else(|| panic!("env {name}: ConfigMap {m} has no key {k} in kustomization.yaml"))
                .clone()
        } else if e.pointer("/valueFrom/fieldRef/fieldPath").and_then(Value::as_str) == Some("metadata.namespace") {
            namespace.to_string()
        } else if let Some(a) = e
            .pointer("/valueFrom/fieldRef/fieldPath")
            .and_then(Value::as_str)
            .and_then(|p| p.strip_prefix("metadata.annotations['")?.strip_suffix("']"))
        {
            // A missing annotation is an empty value, as the kubelet gives it.
            annotations.iter().find(|(k, _)| *k == a).map(|(_, v)| v.to_string()).unwrap_or_default()
        } else {
            panic!("env {name}: a source this test does not resolve: {e}")
        };
        env.push((name, value));
    }
    for (k, v) in appended {
        if !env.iter().any(|(name, _)| name == k) {
            env.push((k.to_string(), v.to_string()));
        }
    }
    let argv: Vec<String> = c["command"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(c["args"].as_array().into_iter().flatten())
        .map(|a| expand(a.as_str().unwrap(), &env))
        .collect();
    (argv, env)
}

#[test]
fn every_pod_template_in_ci_k8s_meets_the_restricted_pod_security_standard() {
    let docs = manifests();
    let pods = pod_templates(&docs);
    assert_eq!(pods.len(), 2, "the CronJob and the Indexed Job: {:?}", pods.iter().map(|p| &p.0).collect::<Vec<_>>());
    for (what, pod) in &pods {
        let v = restricted_violations(pod, &Value::Null);
        assert!(v.is_empty(), "{what} does not meet the restricted Pod Security Standard:\n  {}", v.join("\n  "));
        // Beyond the standard: seed records must survive the pod, the grace period must cover
        // the teardown (60 s) after the step a SIGTERM lets finish (the kube profile's rollout
        // bound, 600 s), and the binary runs as PID 1's only process (no shell in between).
        let vols: Vec<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v.get("persistentVolumeClaim").is_some())
            .filter_map(|v| v["name"].as_str())
            .collect();
        let c = &pod["containers"][0];
        let data = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/var/lib/shakedown")
            .unwrap_or_else(|| panic!("{what}: nothing at /var/lib/shakedown"));
        assert!(vols.contains(&data["name"].as_str().unwrap()), "{what}: /var/lib/shakedown is not a PersistentVolumeClaim");
        assert!(
            pod["securityContext"]["fsGroup"].as_i64().is_some_and(|g| g != 0),
            "{what}: fsGroup lets the non-root uid write the claim"
        );
        assert!(pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30) > 600 + 60, "{what}: terminationGracePeriodSeconds");
        assert_eq!(c["command"], serde_json::json!(["/usr/local/bin/shakedown"]), "{what}: the container runs the binary itself");
    }
    // The check finds what it should: a pod with the usual defaults fails it.
    let bad = serde_json::json!({"hostNetwork": true, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}, "ports": [{"hostPort": 80}]}]});
    let v = restricted_violations(&bad, &serde_json::json!({"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}));
    for needle in [
        "hostNetwork",
        "hostPath",
        "allowPrivilegeEscalation",
        "runAsNonRoot",
        "seccomp",
        "drop ALL",
        "adds SYS_ADMIN",
        "hostPort",
        "AppArmor",
    ] {
        assert!(v.iter().any(|x| x.contains(needle)), "{needle} not reported: {v:?}");
    }
    let root = serde_json::json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "Unconfined"}}}]});
    let v = restricted_violations(&root, &Value::Null);
    assert_eq!(v, ["running as non-root user: pod runAsUser is 0", "seccomp: containers c seccompProfile Unconfined"]);
}

/// What the manifests run is a valid command line of this shakedown, with their environment:
/// clap parses it, and it means what the comments say.
#[test]
fn the_manifests_command_lines_parse_with_their_environment() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let (ns, maps) = kustomization();
    let cluster = format!("{ns}/{}", maps["shakedown-target"]["cluster-name"]);
    let docs = manifests();
    let mut seen = Vec::new();
    for (what, pod) in pod_templates(&docs) {
        let indexed = what.contains("Job shakedown-seeds");
        // What the Job controller gives pod 3 of an Indexed Job: its annotation, and
        // JOB_COMPLETION_INDEX appended to the container's env.
        let none: &[(&str, &str)] = &[];
        let (annotations, appended) =
            if indexed { (&[(INDEX_ANNOTATION, "3")][..], &[("JOB_COMPLETION_INDEX", "3")][..]) } else { (none, none) };
        let (argv, env) = resolve(&pod["containers"][0], &ns, &maps, annotations, appended);
        assert_eq!(argv[0], "/usr/local/bin/shakedown");
        let cli = parse_with_env(&what, &argv, &env);
        match cli.command {
            Command::Soak { kind, duration, max_failures, partition, junit, profile, opts, .. } => {
                assert!(matches!(kind, TargetKind::Kube), "{what}");
                assert_eq!(duration, Duration::from_secs(8 * 3600), "{what}");
                assert_eq!(max_failures, Some(5));
                assert_eq!(partition, None);
                assert_eq!(junit.as_deref(), Some(Path::new("/var/lib/shakedown/junit/nightly-soak.xml")));
                assert_eq!(profile, maps["shakedown-target"]["profile"]);
                assert_eq!(opts.target.kube.cluster.as_deref(), Some(cluster.as_str()));
                assert_eq!(opts.target.kube.kube_profile.as_deref(), Some(Path::new("/etc/shakedown/kube-profile.toml")));
                assert_eq!(opts.seeds_dir, Path::new("/var/lib/shakedown/seeds"));
                assert_eq!(opts.runs_dir, Path::new("/var/lib/shakedown/runs"));
                seen.push("soak");
            }
            Command::Run { kind, seed, count, partition, junit, profile, opts, .. } => {
                assert!(matches!(kind, TargetKind::Kube), "{what}");
                assert_eq!((seed, count), (Some(1000), 4));
                let p = partition.expect("the Indexed Job's pods run a partition");
                assert_eq!(p, Partition { index: 3, of: 8 });
                assert_eq!(pod_completions(&docs), Some(p.of), "SHAKEDOWN_PARTITION's n is the Job's completions");
                assert_eq!((0..4).map(|j| p.seed(1000, j)).collect::<Vec<_>>(), [1003, 1011, 1019, 1027]);
                assert_eq!(junit.as_deref(), Some(Path::new("/var/lib/shakedown/junit/seeds-1000-3.xml")));
                assert_eq!(profile, maps["shakedown-target"]["profile"]);
                assert_eq!(opts.target.kube.cluster.as_deref(), Some(cluster.as_str()));
                assert_eq!(opts.seeds_dir, Path::new("/var/lib/shakedown/seeds"));
                seen.push("run");
            }
            _ => panic!("{what}: neither run nor soak"),
        }
    }
    seen.sort();
    assert_eq!(seen, ["run", "soak"]);
}

fn pod_completions(docs: &[(String, Value)]) -> Option<u64> {
    docs.iter().find(|(_, v)| v["kind"] == "Job").and_then(|(_, v)| v["spec"]["completions"].as_u64())
}

/// ci/k8s-app: its Job's pod meets the restricted standard as ci/k8s's do, its command line is
/// `run --target app` with the app profile of its ConfigMap, and its only cluster-wide right is
/// reading the application's Namespace.
#[test]
fn the_app_job_of_ci_k8s_app_is_restricted_and_its_command_line_parses() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let docs = manifests_in(&app_dir());
    let pods = pod_templates(&docs);
    assert_eq!(pods.len(), 1, "the Job: {:?}", pods.iter().map(|p| &p.0).collect::<Vec<_>>());
    let (what, pod) = &pods[0];
    let v = restricted_violations(pod, &Value::Null);
    assert!(v.is_empty(), "{what} does not meet the restricted Pod Security Standard:\n  {}", v.join("\n  "));
    let c = &pod["containers"][0];
    assert_eq!(c["command"], serde_json::json!(["/usr/local/bin/shakedown"]), "{what}");
    assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/var/lib/shakedown"), "{what}");
    assert!(pod["securityContext"]["fsGroup"].as_i64().is_some_and(|g| g != 0), "{what}");
    let cluster_roles: Vec<&Value> = docs.iter().filter(|(_, v)| v["kind"] == "ClusterRole").map(|(_, v)| v).collect();
    assert_eq!(cluster_roles.len(), 1);
    assert_eq!(
        cluster_roles[0]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["my-db"], "verbs": ["get"]}]),
        "the ClusterRole reads the application's Namespace and nothing else"
    );
    let (ns, maps) = kustomization_in(&app_dir());
    assert_eq!(ns, "my-db");
    let (argv, env) = resolve(c, &ns, &maps, &[], &[]);
    let cli = parse_with_env(what, &argv, &env);
    match cli.command {
        Command::Run { kind, seed, count, junit, profile, opts, .. } => {
            assert!(matches!(kind, TargetKind::App), "{what}");
            assert_eq!((seed, count), (Some(1000), 4));
            assert_eq!(junit.as_deref(), Some(Path::new("/var/lib/shakedown/junit/app-1000.xml")));
            assert_eq!(profile, maps["shakedown-app"]["profile"]);
            assert_eq!(opts.target.app.app_profile.as_deref(), Some(Path::new("/etc/shakedown/app-profile.toml")));
            assert!(maps["shakedown-app"].contains_key("app-profile.toml"), "the app profile is a file of the ConfigMap");
            assert_eq!(opts.seeds_dir, Path::new("/var/lib/shakedown/seeds"));
            assert_eq!(opts.runs_dir, Path::new("/var/lib/shakedown/runs"));
        }
        _ => panic!("{what}: not run"),
    }
}

/// The soak farm (ci/k8s/farm): its Job's pod 3 soaks the local target on partition 3 of N (N
/// the Job's completions, parallelism and maxFailedIndexes alike) from the ConfigMap's base seed,
/// for the ConfigMap's time, its runs in farm/pod-3 of the claim and its JUnit file in junit/;
/// the merge Job merges the claim's farm directory into merged/. Its pods are privileged (the
/// local stack's loop devices, mounts and nftables), in a namespace labelled for that.
#[test]
fn the_farm_manifests_command_lines_parse_with_their_environment() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let farm = dir().join("farm");
    let (ns, maps) = kustomization_in(&farm);
    let config = &maps["shakedown-farm"];
    let docs = manifests_in(&farm);
    let namespace = docs.iter().find(|(_, v)| v["kind"] == "Namespace").expect("the farm's namespace");
    assert_eq!(namespace.1["metadata"]["name"].as_str(), Some(ns.as_str()));
    assert_eq!(namespace.1["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged");
    let job = docs.iter().find(|(_, v)| v["kind"] == "Job" && v["metadata"]["name"] == "shakedown-farm").expect("the farm's Job").1.clone();
    let n = job["spec"]["completions"].as_u64().unwrap();
    assert_eq!(job["spec"]["completionMode"], "Indexed");
    assert_eq!((job["spec"]["parallelism"].as_u64(), job["spec"]["maxFailedIndexes"].as_u64()), (Some(n), Some(n)));
    assert_eq!(job["spec"]["backoffLimitPerIndex"], 0, "a failed index is not run again");
    let mut seen = vec![];
    for (what, pod) in pod_templates(&docs) {
        let c = &pod["containers"][0];
        let none: &[(&str, &str)] = &[];
        let (annotations, appended) = if what.contains("Job shakedown-farm-merge") {
            (none, none)
        } else {
            assert_eq!(c["securityContext"]["privileged"], true, "{what}");
            (&[(INDEX_ANNOTATION, "3")][..], &[("JOB_COMPLETION_INDEX", "3")][..])
        };
        let (argv, env) = resolve(c, &ns, &maps, annotations, appended);
        let cli = parse_with_env(&what, &argv, &env);
        match cli.command {
            Command::Soak { kind, duration, partition, junit, profile, opts, .. } => {
                assert!(matches!(kind, TargetKind::Local), "{what}");
                assert_eq!(duration, humantime::parse_duration(&config["for"]).unwrap());
                assert_eq!(partition, Some(Partition { index: 3, of: n }), "SHAKEDOWN_PARTITION's n is the Job's completions");
                assert_eq!(junit.as_deref(), Some(Path::new("/var/lib/shakedown/junit/farm-3.xml")));
                assert_eq!(profile, config["profile"]);
                assert_eq!(opts.runs_dir, Path::new("/var/lib/shakedown/farm/pod-3"));
                assert_eq!(opts.seeds_dir, Path::new("/var/lib/shakedown/seeds"));
                let seed = argv.iter().position(|a| a == "--seed").map(|i| argv[i + 1].clone());
                assert_eq!(seed.as_deref(), Some(config["first-seed"].as_str()));
                seen.push("soak");
            }
            Command::Merge { dirs, out, .. } => {
                assert_eq!(dirs, [PathBuf::from("/var/lib/shakedown/farm")]);
                assert_eq!(out, Path::new("/var/lib/shakedown/merged"));
                seen.push("merge");
            }
            _ => panic!("{what}: neither soak nor merge"),
        }
    }
    seen.sort();
    assert_eq!(seen, ["merge", "soak"]);
}
