//! A real kube-apiserver for the kube target's tests: etcd and kube-apiserver on free loopback
//! ports, a static admin token, a service-account key pair, the Cluster API CRDs from
//! `tests/fixtures/crds` installed, a kubeconfig written. Everything (processes, the temp
//! directory) goes away on drop, also when a test fails; children also die with the test
//! process (PR_SET_PDEATHSIG).
#![allow(dead_code)]

pub mod standin;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::Client;
use serde_json::{json, Value};
use shakedown::targets::kube::capi::{capi, CapiVersion};

/// Where the kube-apiserver binary is: `SHAKEDOWN_KUBE_APISERVER`, else the cache of
/// scripts/build-kube-apiserver.sh.
pub fn apiserver_binary() -> Option<PathBuf> {
    let p = std::env::var_os("SHAKEDOWN_KUBE_APISERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/shakedown/kube/kube-apiserver"));
    p.is_file().then_some(p)
}

fn etcd_binary() -> PathBuf {
    std::env::var_os("SHAKEDOWN_ETCD_3_4").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free loopback port").local_addr().unwrap().port()
}

pub fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crds")
}

/// The apiserver binary. A missing one fails the test with the command that builds it: a kube
/// test that cannot run must never show as passed. (`./scripts/install-deps.sh --all` builds it; it is
/// cached afterwards.)
pub fn require_apiserver() -> PathBuf {
    match apiserver_binary() {
        Some(p) => p,
        None => panic!(
            "kube-apiserver not found at /var/cache/shakedown/kube/kube-apiserver: build it with ./scripts/build-kube-apiserver.sh (about 7 minutes, then cached; ./scripts/install-deps.sh --all runs it too) or point SHAKEDOWN_KUBE_APISERVER at one"
        ),
    }
}

/// A token authenticating as the ServiceAccount shakedown/shakedown of ci/k8s/rbac.yaml.
pub const SA_TOKEN: &str = "shakedown-sa-token";
/// A token of a user without any permission.
pub const NOBODY_TOKEN: &str = "shakedown-nobody-token";

/// Which versions the Cluster API CRDs of a test apiserver serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdVersions {
    /// v1beta1 and v1beta2 (storage), as the fixtures are: Cluster API 1.10 and later.
    Both,
    /// v1beta1 only (storage): Cluster API before 1.10.
    V1Beta1Only,
}

pub struct KubeEnv {
    pub dir: tempfile::TempDir,
    children: Vec<Child>,
    pub server: String,
    pub kubeconfig: PathBuf,
    pub token: String,
    /// How kube-apiserver was started (children[1]), to start it again.
    apiserver: (PathBuf, Vec<String>),
    /// GET /readyz (the serving certificate is self-signed: not verified).
    readyz: shakedown::targets::kube::command::HttpProber,
}

fn spawn(cmd: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("log file");
    let err = out.try_clone().unwrap();
    cmd.stdout(Stdio::from(out)).stderr(Stdio::from(err)).stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe; the child dies with the test process.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn().unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()))
}

impl KubeEnv {
    /// Starts etcd and kube-apiserver, writes the kubeconfig, installs the CRDs. Panics (the test
    /// fails, everything started is torn down) when any of it does not work within its bound.
    pub async fn start(apiserver: &Path) -> KubeEnv {
        KubeEnv::start_serving(apiserver, CrdVersions::Both).await
    }

    /// Like [`KubeEnv::start`], with the Cluster API CRDs serving `versions`.
    pub async fn start_serving(apiserver: &Path, versions: CrdVersions) -> KubeEnv {
        let dir = tempfile::Builder::new().prefix("shakedown-kube-test-").tempdir().expect("tempdir");
        let d = dir.path().to_path_buf();
        let mut env = KubeEnv {
            dir,
            children: vec![],
            server: String::new(),
            kubeconfig: d.join("kubeconfig"),
            token: "shakedown-admin-token".into(),
            apiserver: (apiserver.to_path_buf(), vec![]),
            readyz: shakedown::targets::kube::command::HttpProber::new(None, true).unwrap(),
        };
        let (client_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        env.children.push(spawn(
            Command::new(etcd_binary())
                .arg("--name=kube-test")
                .arg(format!("--data-dir={}", d.join("etcd").display()))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client_port}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client_port}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
                .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"))
                .arg(format!("--initial-cluster=kube-test=http://127.0.0.1:{peer_port}")),
            &d.join("etcd.log"),
        ));
        // The admin, the ServiceAccount of ci/k8s (its RBAC is what a run needs), and a user
        // without any permission.
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "{},admin,admin-uid,\"system:masters\"\n{SA_TOKEN},system:serviceaccount:shakedown:shakedown,sa-uid,\"system:serviceaccounts,system:serviceaccounts:shakedown\"\n{NOBODY_TOKEN},nobody,nobody-uid\n",
                env.token
            ),
        )
        .unwrap();
        let ok = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(d.join("sa.key"))
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
            && Command::new("openssl")
                .args(["rsa", "-pubout", "-in"])
                .arg(d.join("sa.key"))
                .arg("-out")
                .arg(d.join("sa.pub"))
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok, "openssl could not make the service-account key pair");
        env.apiserver.1 = vec![
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            "--insecure-port=0".into(),
            format!("--cert-dir={}", d.join("certs").display()),
            format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-key-file={}", d.join("sa.pub").display()),
            format!("--service-account-signing-key-file={}", d.join("sa.key").display()),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            "--enable-priority-and-fairness=false".into(),
        ];
        env.children.push(spawn(Command::new(apiserver).args(&env.apiserver.1), &d.join("kube-apiserver.log")));
        env.server = format!("https://127.0.0.1:{api_port}");
        std::fs::write(&env.kubeconfig, env.kubeconfig_text("test", &env.token)).unwrap();
        env.wait_ready("kube-apiserver.log").await;
        env.install_crds(versions).await;
        env
    }

    async fn wait_ready(&self, log: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if self.readyz.get(&format!("{}/readyz", self.server), Duration::from_secs(2)).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
                panic!("kube-apiserver not ready within 90s; its log ends:\n{}", &log[log.len().saturating_sub(3000)..]);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Kills kube-apiserver (etcd keeps running, with everything stored).
    pub fn kill_apiserver(&mut self) {
        let c = &mut self.children[1];
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Starts kube-apiserver again, same flags and port, on the same etcd; waits until it is ready.
    pub async fn restart_apiserver(&mut self) {
        let log = "kube-apiserver-restarted.log";
        let child = spawn(Command::new(&self.apiserver.0).args(&self.apiserver.1), &self.dir.path().join(log));
        self.children[1] = child;
        self.wait_ready(log).await;
    }

    /// Writes the Secret `<cluster>-kubeconfig` (key `value`, as Cluster API does) holding a
    /// kubeconfig for this same apiserver: the "workload cluster" of the tests.
    pub async fn workload_secret(&self, client: &Client, ns: &str, cluster: &str) {
        let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
        let secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("{cluster}-kubeconfig"), "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": self.kubeconfig_text("workload", &self.token)}}))
        .unwrap();
        api.create(&PostParams::default(), &secret).await.unwrap();
    }

    /// Installs the minimal test CRDs for Velero's Backup and Restore (tests/fixtures/velero-crds.yaml).
    pub async fn install_velero_crds(&self) {
        let client = self.client().await;
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/velero-crds.yaml")).unwrap();
        for crd in serde_saphyr::from_multiple::<CustomResourceDefinition>(&text).unwrap() {
            let n = crd.metadata.name.clone().unwrap();
            api.create(&PostParams::default(), &crd).await.unwrap_or_else(|e| panic!("creating CRD {n}: {e}"));
            tokio::time::timeout(
                Duration::from_secs(30),
                kube::runtime::wait::await_condition(api.clone(), &n, kube::runtime::wait::conditions::is_crd_established()),
            )
            .await
            .unwrap_or_else(|_| panic!("CRD {n} not established within 30s"))
            .unwrap();
        }
        let probe: Api<DynamicObject> = Api::namespaced_with(client, "default", &shakedown::targets::kube::velero_ar("Backup"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while probe.list(&Default::default()).await.is_err() {
            assert!(Instant::now() < deadline, "Velero Backup API not served within 30s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn kubeconfig_text(&self, context: &str, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: {context}\n  context:\n    cluster: test\n    user: admin\ncurrent-context: {context}\n",
            self.server
        )
    }

    pub async fn client(&self) -> Client {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        Client::try_from(cfg).unwrap()
    }

    async fn install_crds(&self, versions: CrdVersions) {
        install_capi_crds(&self.client().await, versions).await;
    }
}

/// Installs the Cluster API test CRDs (`tests/fixtures/crds`) on the apiserver of `client`,
/// serving `versions`, and waits (bounded) until they are established and served.
pub async fn install_capi_crds(client: &Client, versions: CrdVersions) {
    let client = client.clone();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = vec![];
    let mut files: Vec<PathBuf> = std::fs::read_dir(crds_dir())
        .expect("tests/fixtures/crds")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let mut crd: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        if versions == CrdVersions::V1Beta1Only
            && crd.spec.group.ends_with("cluster.x-k8s.io")
            && crd.spec.versions.iter().any(|v| v.name == "v1beta1")
        {
            // A management cluster of Cluster API before 1.10: v1beta2 is not served.
            for v in &mut crd.spec.versions {
                v.served = v.name == "v1beta1";
                v.storage = v.name == "v1beta1";
            }
        }
        names.push(crd.metadata.name.clone().unwrap());
        api.create(&PostParams::default(), &crd).await.unwrap_or_else(|e| panic!("creating CRD {}: {e}", f.display()));
    }
    for n in names {
        let cond = kube::runtime::wait::conditions::is_crd_established();
        tokio::time::timeout(Duration::from_secs(30), kube::runtime::wait::await_condition(api.clone(), &n, cond))
            .await
            .unwrap_or_else(|_| panic!("CRD {n} not established within 30s"))
            .unwrap();
    }
    // Discovery of the new groups can lag behind Established by a moment.
    let served = if versions == CrdVersions::V1Beta1Only { CapiVersion::V1Beta1 } else { CapiVersion::V1Beta2 };
    let probe: Api<DynamicObject> = Api::namespaced_with(client, "default", &capi("KubeadmControlPlane", served));
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.list(&Default::default()).await.is_err() {
        assert!(Instant::now() < deadline, "KubeadmControlPlane API not served within 30s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for KubeEnv {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Creates a namespace.
pub async fn namespace(client: &Client, ns: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let obj = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
}

/// A Cluster API Cluster `name` in `ns` with a KubeadmControlPlane of `replicas` over `fds`
/// failure domains and one MachineDeployment of 0 replicas; opted in when `opt_in`.
pub async fn cluster(client: &Client, ns: &str, name: &str, replicas: i64, fds: &[&str], opt_in: bool, version: &str) {
    let annotations = if opt_in { json!({"shakedown.dev/allow-chaos": "true"}) } else { json!({}) };
    let create = |kind: &str, body: Value| {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi(kind, CapiVersion::V1Beta2));
        let obj: DynamicObject = serde_json::from_value(body).unwrap();
        async move {
            api.create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("creating {}: {e}", obj.types.map(|t| t.kind).unwrap_or_default()))
        }
    };
    create(
        "Cluster",
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": {"controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": format!("{name}-cp")},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevCluster", "name": name}}}),
    )
    .await;
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi("Cluster", CapiVersion::V1Beta2));
    let fd_list: Vec<Value> = fds.iter().map(|f| json!({"name": f, "controlPlane": true})).collect();
    clusters
        .patch_status(name, &Default::default(), &kube::api::Patch::Merge(json!({"status": {"failureDomains": fd_list}})))
        .await
        .unwrap();
    create(
        "KubeadmControlPlane",
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane", "metadata": {"name": format!("{name}-cp"), "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": name}},
            "spec": {"replicas": replicas, "version": version,
                     "machineTemplate": {"spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachineTemplate", "name": format!("{name}-cp-{version}")}}},
                     "kubeadmConfigSpec": {"format": "cloud-config"}}}),
    )
    .await;
    create(
        "MachineDeployment",
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment", "metadata": {"name": format!("{name}-md-0"), "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": name}},
            "spec": {"clusterName": name, "replicas": 0,
                     "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": format!("{name}-md-0")}},
                     "template": {"metadata": {"labels": {"cluster.x-k8s.io/deployment-name": format!("{name}-md-0"), "cluster.x-k8s.io/cluster-name": name}},
                                  "spec": {"clusterName": name, "version": version,
                                           "bootstrap": {"dataSecretName": "none"},
                                           "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DevMachineTemplate", "name": "md"}}}}}),
    )
    .await;
}

/// Starts the shakedown binary in the background (stdout and stderr piped); the caller waits.
pub fn shakedown_spawn(args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_shakedown"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("shakedown starts")
}

/// Waits (bounded) for a child started by [`shakedown_spawn`]: (exit code, stdout, stderr).
pub async fn shakedown_wait(child: tokio::process::Child, bound: Duration) -> (i32, String, String) {
    let out = tokio::time::timeout(bound, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("shakedown did not finish within {}s", bound.as_secs()))
        .expect("shakedown ran");
    let (o, e) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    eprintln!("--- exit {:?}\n--- stdout\n{o}--- stderr\n{e}", out.status.code());
    (out.status.code().unwrap_or(-1), o, e)
}

/// Runs the shakedown binary (without blocking the runtime) and returns (exit code, stdout, stderr).
pub async fn shakedown(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_shakedown")).args(args).env("RUST_LOG", "warn").kill_on_drop(true).output();
    let out = tokio::time::timeout(Duration::from_secs(300), out).await.expect("shakedown finished within 300s").expect("shakedown runs");
    let (o, e) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    eprintln!("$ shakedown {}\n--- exit {:?}\n--- stdout\n{o}--- stderr\n{e}", args.join(" "), out.status.code());
    (out.status.code().unwrap_or(-1), o, e)
}

/// The plan profile of the kube target's tests: the ops the kube target runs without hooks
/// (rolling ops, crash/restart, power loss of a site), short bounds.
pub fn plan_profile(name: &str, description: &str, steps: usize) -> String {
    let weights = [("rolling-upgrade", 3), ("rolling-replace", 3), ("crash", 2), ("restart", 4), ("site-outage", 1), ("site-recover", 4)];
    plan_profile_weighted(name, description, steps, &weights)
}

/// A plan profile of the kube target's tests with `weights` (every other op kind 0), versions
/// 3.4 and 3.5, short bounds.
pub fn plan_profile_weighted(name: &str, description: &str, steps: usize, weights: &[(&str, u32)]) -> String {
    const KINDS: [&str; 15] = [
        "rolling-upgrade",
        "rolling-replace",
        "crash",
        "restart",
        "site-outage",
        "site-recover",
        "pause",
        "resume",
        "disk-detach",
        "disk-reattach",
        "backup",
        "restore",
        "disk-replace",
        "defrag",
        "partition-until-snapshot",
    ];
    for (k, _) in weights {
        assert!(KINDS.contains(k), "no op kind {k}");
    }
    let lines: String = KINDS.iter().map(|k| format!("{k} = {}\n", weights.iter().find(|(w, _)| w == k).map_or(0, |(_, n)| *n))).collect();
    format!(
        "\nname = \"{name}\"\ndescription = \"{description}\"\nsteps = {steps}\nversions = [\"3.4\", \"3.5\"]\n[weights]\n{lines}[timeouts]\nconverge = \"20s\"\nliveness = \"60s\"\nop = \"60s\"\n"
    )
}

/// The arguments of `shakedown run` against Cluster `chaos/c` with a plan profile, a kube
/// profile, and the run and seed directories.
pub fn run_args(seed: &str, kubeconfig: &str, profile: &str, kube_profile: &str, runs: &str, seeds: &str) -> Vec<String> {
    [
        "run",
        "--seed",
        seed,
        "--target",
        "kube",
        "--kubeconfig",
        kubeconfig,
        "--cluster",
        "chaos/c",
        "--profile",
        profile,
        "--kube-profile",
        kube_profile,
        "--runs-dir",
        runs,
        "--seeds-dir",
        seeds,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
