//! The kube target's `[etcd]` (issue 33) against real etcd members reached the way Cluster API
//! reaches them. On the local node (tests/node.rs): three etcd 3.5 pods `etcd-<node>` in
//! `kube-system`, TLS with client-certificate auth from an etcd CA made as Cluster API makes it
//! (RSA, `RSA PRIVATE KEY`), kept in the Cluster's `c-etcd` Secret; the Cluster API test CRDs and
//! the stand-in controllers (tests/kube_common/standin.rs) on the node's apiserver, which is also
//! the workload cluster (`c-kubeconfig`). Each member is named after its Machine's Node, as
//! kubeadm names it; the members reach each other through a Service of fixed ClusterIP each.
//!
//! A run reads every member's status, the member list and HashKV through port-forwards and the
//! members' TLS, while hooks pause and resume members (SIGSTOP/SIGCONT of their etcd) and the API
//! workload runs on the workload cluster. Then the planted bug: a member's data restored from an
//! old snapshot under its own name and member id (`etcdutl snapshot restore`, then every member
//! restarted): it serves, sees the leader and is listed, so Cluster API's conditions, `members`,
//! `quorum` and `membership` are content, and only `consistency` — etcd's own answers compared —
//! sees that its store is not the others'.
//!
//! Not checked here: `leaks` (the node's own Node belongs to no Machine, which `leaks` names;
//! tests/kube_target.rs checks `leaks`).

mod kube_common;

#[path = "common/wait.rs"]
mod wait;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use wait::until;

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::Client;
use kube_common::standin;
use kube_common::{cluster, install_capi_crds, namespace, CrdVersions};
use serde_json::{json, Value};
use shakedown::node::{Node, NodeBinaries, NodeOptions};
use shakedown::targets::kube::capi::{capi, CapiVersion};
use shakedown::targets::kube::conditions::{condition, rollout, ETCD_CLUSTER_HEALTHY};

const NS: &str = "chaos";
const CLUSTER: &str = "c";
/// The members' Services: fixed ClusterIPs of the node's Service range (pki::SERVICE_RANGE).
const IPS: [&str; 3] = ["10.96.0.201", "10.96.0.202", "10.96.0.203"];
/// etcd 3.5 as scripts/install-deps.sh installs it (the image holds it at the same path).
const ETCD_DIR: &str = "/var/cache/shakedown/etcd-3.5";
const TOKEN: &str = "shakedown-etcd-test";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The etcd CA as Cluster API makes it (RSA 2048, PKCS #1), a serving certificate per member
/// (localhost, 127.0.0.1 and its Service address, as kubeadm's holds localhost and the node's
/// addresses) and a client certificate for this test's own etcdctl.
fn make_pki(dir: &Path, machines: &[String]) {
    std::fs::create_dir_all(dir).unwrap();
    openssl(dir, &["genrsa", "-traditional", "-out", "ca.key", "2048"]);
    openssl(dir, &["req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=etcd-ca", "-days", "2", "-out", "ca.crt"]);
    let mut names: Vec<(String, String)> = machines.iter().zip(IPS).map(|(m, ip)| (m.clone(), format!("IP:{ip}"))).collect();
    names.push(("test-client".into(), "IP:127.0.0.1".into()));
    for (name, ip) in names {
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-subj",
                &format!("/CN={name}"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        let ext = format!("subjectAltName=DNS:localhost,IP:127.0.0.1,{ip}\nextendedKeyUsage=serverAuth,clientAuth\n");
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.crt"),
            ],
        );
    }
    // The pods' etcd reads them as root; nothing else on the machine needs them.
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

fn initial_cluster(machines: &[String]) -> String {
    machines.iter().zip(IPS).map(|(m, ip)| format!("{m}=http://{ip}:2380")).collect::<Vec<_>>().join(",")
}

/// The etcd pod of member `i`, named as kubeadm's static pod of its Node.
fn etcd_pod(node_name: &str, machines: &[String], i: usize, pki: &str, data: &str) -> Pod {
    let m = &machines[i];
    let ip = IPS[i];
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("etcd-{m}"), "namespace": "kube-system", "labels": {"app": "etcd-test", "member": i.to_string()}},
        "spec": {
            "nodeName": node_name,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "etcd", "image": "etcd-member:latest", "imagePullPolicy": "Never",
                "command": [format!("{ETCD_DIR}/etcd"), "--name", m, "--data-dir", "/var/lib/etcd",
                    "--listen-client-urls", "https://0.0.0.0:2379", "--advertise-client-urls", format!("https://{ip}:2379"),
                    "--listen-peer-urls", "http://0.0.0.0:2380", "--initial-advertise-peer-urls", format!("http://{ip}:2380"),
                    "--initial-cluster", initial_cluster(machines), "--initial-cluster-state", "new", "--initial-cluster-token", TOKEN,
                    "--cert-file", format!("/pki/{m}.crt"), "--key-file", format!("/pki/{m}.key"),
                    "--client-cert-auth", "--trusted-ca-file", "/pki/ca.crt"],
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}, {"name": "pki", "mountPath": "/pki", "readOnly": true}]
            }],
            "volumes": [
                {"name": "data", "hostPath": {"path": format!("{data}/{m}"), "type": "DirectoryOrCreate"}},
                {"name": "pki", "hostPath": {"path": pki, "type": "Directory"}}
            ]
        }
    }))
    .unwrap()
}

async fn settled(client: &Client) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi("KubeadmControlPlane", CapiVersion::V1Beta2));
    until("the stand-in settles c", Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let kcp = serde_json::to_value(api.get("c-cp").await.ok()?).ok()?;
            (rollout(&kcp).complete().is_ok() && condition(&kcp, ETCD_CLUSTER_HEALTHY).is_some_and(|c| c.is_true())).then_some(())
        }
    })
    .await
}

/// The control-plane Machines' Nodes (the stand-in names each Node after its Machine).
async fn machine_nodes(client: &Client) -> Vec<String> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi("Machine", CapiVersion::V1Beta2));
    until("three control-plane Machines with a Node", Duration::from_secs(60), || {
        let api = api.clone();
        async move {
            let ms = api.list(&ListParams::default().labels("cluster.x-k8s.io/control-plane")).await.ok()?;
            let mut nodes: Vec<String> = ms
                .items
                .iter()
                .filter_map(|m| m.data.pointer("/status/nodeRef/name").and_then(Value::as_str).map(str::to_string))
                .collect();
            nodes.sort();
            (nodes.len() == 3).then_some(nodes)
        }
    })
    .await
}

/// etcdctl in the node's network namespace, as this test's own client, to the pods' addresses
/// (the node routes no Service address of its own; the serving certificates name the Services',
/// so this client skips the name check — it is the test's, not what is tested): `args` after
/// the endpoints and credentials.
fn etcdctl(node: &Node, pki: &Path, endpoint: &str, args: &[&str]) -> String {
    let out = etcdctl_output(node, pki, endpoint, &[&["--command-timeout", "10s"][..], args].concat());
    assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// etcdctl as [`etcdctl`] runs it, whatever it exits with.
fn etcdctl_output(node: &Node, pki: &Path, endpoints: &str, args: &[&str]) -> std::process::Output {
    let p = |f: &str| pki.join(f).display().to_string();
    let (ca, cert, key) = (p("ca.crt"), p("test-client.crt"), p("test-client.key"));
    let creds = ["--endpoints", endpoints, "--cacert", &ca, "--cert", &cert, "--key", &key, "--insecure-skip-tls-verify"];
    shakedown::node::cleanup::in_netns(&node.layout, &format!("{ETCD_DIR}/etcdctl"), &[&creds[..], args].concat()).unwrap()
}

/// Writes `n` keys `prefix<i>` through the member at `endpoint`.
fn write_keys(node: &Node, pki: &Path, endpoint: &str, prefix: &str, n: usize) {
    for i in 0..n {
        etcdctl(node, pki, endpoint, &["put", &format!("{prefix}{i}"), &format!("v{i}")]);
    }
}

/// The etcd pods' addresses (`https://<pod IP>:2379` each), once all three have one.
async fn pod_endpoints(client: &Client) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    until("the etcd pods' addresses", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let l = pods.list(&ListParams::default().labels("app=etcd-test")).await.ok()?;
            let ips: Vec<String> =
                l.items.iter().filter_map(|p| p.status.as_ref()?.pod_ip.clone()).map(|ip| format!("https://{ip}:2379")).collect();
            (ips.len() == 3).then_some(ips)
        }
    })
    .await
}

/// Waits until every member answers `endpoint health`; says what the pods did if they do not.
async fn etcd_healthy(node: &Node, client: &Client, pki: &Path) -> Vec<String> {
    let pod_ips = pod_endpoints(client).await;
    let endpoints = pod_ips.join(",");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = etcdctl_output(node, pki, &endpoints, &["endpoint", "health", "--command-timeout", "3s"]);
        if out.status.success() {
            return pod_ips;
        }
        if Instant::now() > deadline {
            let kc = node.kubeconfig.display().to_string();
            let kubectl = |args: &[&str]| {
                let o = Command::new("kubectl").arg("--kubeconfig").arg(&kc).args(args).output().unwrap();
                format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
            };
            let logs: String = (0..3).map(|i| kubectl(&["-n", "kube-system", "logs", "-l", &format!("member={i}"), "--tail=15"])).collect();
            panic!(
                "the three etcd members not healthy within 120s: {}{}\n{}\n{logs}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                kubectl(&["-n", "kube-system", "get", "pods,svc,endpoints", "-o", "wide"])
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn create_pods(client: &Client, node_name: &str, machines: &[String], pki: &str, data: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    for i in 0..3 {
        pods.create(&PostParams::default(), &etcd_pod(node_name, machines, i, pki, data)).await.unwrap();
    }
}

async fn delete_pods(client: &Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let lp = ListParams::default().labels("app=etcd-test");
    pods.delete_collection(&DeleteParams::default(), &lp).await.unwrap();
    until("the etcd pods gone", Duration::from_secs(60), || {
        let pods = pods.clone();
        let lp = lp.clone();
        async move { pods.list(&lp).await.ok().filter(|l| l.items.is_empty()).map(|_| ()) }
    })
    .await
}

fn plan_profile() -> String {
    // Pauses and resumes only (the stand-in makes no etcd member for a new Machine), every check
    // but `leaks` (see the top of this file).
    kube_common::plan_profile_weighted("etcd-path", "members paused and resumed by hooks, etcd read through Cluster API's path", 6, &[("pause", 3), ("resume", 3)])
        .replace("versions = [\"3.4\", \"3.5\"]", "versions = [\"3.5\"]\ninvariants = [\"membership\", \"members\", \"quorum\", \"consistency\", \"api-reachability\", \"api-durability\", \"api-watch\"]")
        .replace("converge = \"20s\"", "converge = \"30s\"")
}

/// `[etcd]` and `[api]` on; pause and resume stop and continue the member's etcd process.
fn kube_profile() -> String {
    r#"
[etcd]
timeout = "2s"
[api]
[api.load]
clients = 2
objects = 8
watches = 2
interval = "20ms"
[hooks.pause]
command = ["sh", "-c", "pkill -STOP -f -- \"--name $SHAKEDOWN_MACHINE --data-dir\""]
timeout = "10s"
[hooks.resume]
command = ["sh", "-c", "pkill -CONT -f -- \"--name $SHAKEDOWN_MACHINE --data-dir\""]
timeout = "10s"
"#
    .into()
}

fn events(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn run_dir_of(runs: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(runs).unwrap().flatten().map(|e| e.path()).filter(|p| p.join("events.jsonl").is_file()).collect();
    v.sort_by_key(|p| std::fs::metadata(p.join("events.jsonl")).and_then(|m| m.modified()).ok());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_is_read_through_cluster_apis_path_and_a_member_restored_from_an_old_snapshot_is_caught() {
    let bins = NodeBinaries::find().unwrap_or_else(|e| panic!("the node's binaries: {e}"));
    let work = tempfile::Builder::new().prefix("shakedown-kube-etcd-").tempdir().unwrap();
    // The etcd image: etcd 3.5 at its path on this machine (scripts/build-image.sh's extras).
    let archive = work.path().join("etcd-image.tar");
    let built = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-image.sh"))
        .arg(&archive)
        .env("SHAKEDOWN_BIN", &bins.shakedown)
        .env("SHAKEDOWN_IMAGE_TAG", "etcd-member:latest")
        .env("SHAKEDOWN_IMAGE_USER", "0:0")
        .env("SHAKEDOWN_IMAGE_EXTRA", format!("{ETCD_DIR}/etcd"))
        .output()
        .unwrap();
    assert!(built.status.success(), "build-image.sh: {}{}", String::from_utf8_lossy(&built.stdout), String::from_utf8_lossy(&built.stderr));
    let mut node = Node::up(
        &format!("sd-kubeetcd{}", std::process::id()),
        &work.path().join("runs"),
        &bins,
        &NodeOptions { set_kernel_tunables: true, workers: 0 },
    )
    .await
    .unwrap_or_else(|e| panic!("node up: {e}"));
    let _keep = kube_common_keep(&work);
    shakedown::node::images::import(&bins.ctr, &node.layout.containerd_socket(), &archive, None).await.unwrap();
    let client = node.client().await.unwrap();
    let node_name = node.layout.member(0).node_name.clone();

    // The management cluster: CRDs, an opted-in Cluster c, the stand-in with Nodes per Machine.
    install_capi_crds(&client, CrdVersions::Both).await;
    namespace(&client, NS).await;
    cluster(&client, NS, CLUSTER, 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _standin = standin::start_with(client.clone(), NS, CLUSTER, Duration::from_millis(200), None, true);
    settled(&client).await;
    let machines = machine_nodes(&client).await;

    // The etcd members: PKI and data in the hostPath provisioner's directory (the same in the
    // node's mount namespace and here).
    let prov = shakedown::node::volumes::PROVISIONER_DIR;
    let (pki_in_node, data_in_node) = (format!("{prov}/etcd-test/pki"), format!("{prov}/etcd-test/data"));
    let host = |p: &str| node.layout.host_path_dir(prov).join(Path::new(p).strip_prefix(prov).unwrap());
    let (pki, data) = (host(&pki_in_node), host(&data_in_node));
    make_pki(&pki, &machines);
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    for (i, ip) in IPS.iter().enumerate() {
        let svc = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("etcd-test-{i}"), "namespace": "kube-system"},
            "spec": {"clusterIP": ip, "selector": {"app": "etcd-test", "member": i.to_string()}, "publishNotReadyAddresses": true,
                     "ports": [{"name": "client", "port": 2379}, {"name": "peer", "port": 2380}]}}))
        .unwrap();
        services.create(&PostParams::default(), &svc).await.unwrap();
    }
    create_pods(&client, &node_name, &machines, &pki_in_node, &data_in_node).await;
    let endpoints = etcd_healthy(&node, &client, &pki).await;
    write_keys(&node, &pki, &endpoints[0], "/before-backup/", 40);

    // Cluster API's Secrets: the workload cluster's kubeconfig (the node's apiserver) and the
    // etcd CA, as Cluster API writes them.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let kubeconfig = std::fs::read_to_string(&node.kubeconfig).unwrap();
    for (name, data) in [
        (format!("{CLUSTER}-kubeconfig"), json!({"value": kubeconfig})),
        (
            format!("{CLUSTER}-etcd"),
            json!({"tls.crt": std::fs::read_to_string(pki.join("ca.crt")).unwrap(), "tls.key": std::fs::read_to_string(pki.join("ca.key")).unwrap()}),
        ),
    ] {
        let s = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
            "type": "cluster.x-k8s.io/secret", "stringData": data}))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    assert!(std::fs::read_to_string(pki.join("ca.key")).unwrap().contains("BEGIN RSA PRIVATE KEY"), "Cluster API's key format");

    let files = work.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    let (profile, kube) = (files.join("plan.toml"), files.join("kube.toml"));
    std::fs::write(&profile, plan_profile()).unwrap();
    std::fs::write(&kube, kube_profile()).unwrap();
    let runs = files.join("runs");
    let kc = node.kubeconfig.display().to_string();
    let run = |seed: &'static str, kube: PathBuf| {
        let str = |p: &Path| p.to_str().unwrap().to_string();
        let args = kube_common::run_args(seed, &kc, &str(&profile), &str(&kube), &str(&runs), &str(&files.join("seeds")));
        async move { kube_common::shakedown(&args.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };

    // A Secret that is not there is bad input, said before anything is written (exit 2).
    let missing = files.join("kube-missing.toml");
    std::fs::write(&missing, kube_profile().replace("[etcd]\n", "[etcd]\nsecret = \"nope\"\n")).unwrap();
    let (code, out, err) = run("3", missing).await;
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("kube profile [etcd]: no Secret chaos/nope"), "{err}");

    // A healthy etcd: every check passes, consistency among them, from etcd's own answers.
    let (code, out, err) = run("3", kube.clone()).await;
    assert_eq!(code, 0, "a healthy run passes:\n{out}\n{err}");
    let first = run_dir_of(&runs).pop().unwrap();
    let ev = events(&first);
    assert!(
        ev.iter()
            .any(|e| e["kind"] == "note"
                && e["detail"]["note"].as_str().is_some_and(|n| n.starts_with("etcd read through Cluster API's path"))),
        "the run says where etcd is read from"
    );
    let checks: Vec<&Value> = ev.iter().filter(|e| e["event"] == "check").collect();
    assert!(checks.len() >= 6, "a check after every step: {checks:?}");
    for c in &checks {
        for inv in ["consistency", "members", "quorum", "membership", "api-durability", "api-watch"] {
            let v = c["invariants"].as_array().unwrap().iter().find(|i| i["invariant"] == inv).unwrap_or_else(|| panic!("{inv} in {c}"));
            assert_eq!(v["verdict"], "pass", "{inv} checked and passed: {c}");
        }
    }
    assert!(
        !ev.iter().any(|e| e["event"] == "unchecked" && e["invariants"].to_string().contains("consistency")),
        "consistency is checked with [etcd]"
    );
    let up = ev.iter().find(|e| e["event"] == "bring-up").expect("a bring-up event");
    assert_eq!(up["versions"]["etcd"], "3.5.16", "the members' etcd release, read at connect: {up}");
    let paused = ev.iter().filter(|e| e["event"] == "op-start" && e["op"]["op"] == "pause").count();
    assert!(paused >= 1, "the plan paused a member");
    // Extra requests: each member's port-forward once (kept across steps), then nothing new
    // unless a connection broke.
    let forwards: u64 = ev
        .iter()
        .filter(|e| e["event"] == "target" && e["kind"] == "kube-requests")
        .filter_map(|e| e["detail"]["non_watch_requests"]["GET pods/portforward"].as_u64())
        .sum();
    eprintln!("port-forwards opened during the steps: {forwards}");

    // The planted bug: member 2 restored from a snapshot older than the data, under its own
    // name and member id (etcdutl snapshot restore with the cluster's own flags), every member
    // restarted. It serves and sees the leader.
    let snapshot = data.join("old.db");
    // (etcdctl runs in the node's network namespace only: the machine's paths.)
    etcdctl(&node, &pki, &endpoints[0], &["snapshot", "save", snapshot.to_str().unwrap()]);
    assert!(snapshot.is_file());
    write_keys(&node, &pki, &endpoints[0], "/after-backup/", 40);
    delete_pods(&client).await;
    let m2 = data.join(&machines[2]);
    std::fs::remove_dir_all(&m2).unwrap();
    let out = Command::new(format!("{ETCD_DIR}/etcdutl"))
        .args(["snapshot", "restore", snapshot.to_str().unwrap(), "--name", &machines[2], "--data-dir", m2.to_str().unwrap()])
        .args(["--initial-cluster", &initial_cluster(&machines), "--initial-cluster-token", TOKEN])
        .args(["--initial-advertise-peer-urls", &format!("http://{}:2380", IPS[2])])
        .output()
        .unwrap();
    assert!(out.status.success(), "etcdutl snapshot restore: {}", String::from_utf8_lossy(&out.stderr));
    create_pods(&client, &node_name, &machines, &pki_in_node, &data_in_node).await;
    etcd_healthy(&node, &client, &pki).await;

    let (code, out, err) = run("4", kube.clone()).await;
    assert_eq!(code, 1, "the restored member is found:\n{out}\n{err}");
    let planted = run_dir_of(&runs).pop().unwrap();
    let ev = events(&planted);
    let failed: Vec<&Value> = ev.iter().filter(|e| e["event"] == "check" && e["verdict"] == "fail").collect();
    let first_fail = failed.first().unwrap_or_else(|| panic!("a failed check:\n{out}"));
    let by = |inv: &str| first_fail["invariants"].as_array().unwrap().iter().find(|i| i["invariant"] == inv).cloned().unwrap();
    assert_eq!(first_fail["invariant"], "consistency", "consistency fails first: {first_fail}");
    assert!(["fail", "definite"].contains(&by("consistency")["verdict"].as_str().unwrap()), "{first_fail}");
    // The plan member bound to the restored member's Machine (the run's first line names each).
    let restored = format!("{out} {err}")
        .split_whitespace()
        .find_map(|w| w.strip_suffix(&format!("={}", machines[2])))
        .unwrap_or_else(|| panic!("the run names the member of Machine {}:\n{out}\n{err}", machines[2]))
        .to_string();
    let message = first_fail["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("the store out of line is {restored}'s")),
        "…naming the restored member {restored}'s store: {message}"
    );
    for inv in ["members", "quorum", "membership"] {
        assert_eq!(by(inv)["verdict"], "pass", "{inv} is content: the restored member serves and is listed: {first_fail}");
    }

    delete_pods(&client).await;
    let left = node.teardown();
    assert!(left.is_empty(), "the node left: {left}");
}

/// Keeps the test's work directory (runs, records, member logs) if the test fails.
fn kube_common_keep(work: &tempfile::TempDir) -> KeepDir {
    KeepDir(work.path().join("files"))
}

struct KeepDir(PathBuf);

impl Drop for KeepDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let to = Path::new(env!("CARGO_TARGET_TMPDIR")).join("failed-tests").join(format!("kube-etcd-{}", std::process::id()));
            let _ = Command::new("cp").arg("-a").arg(&self.0).arg(&to).status();
            eprintln!("kept in {}", to.display());
        }
    }
}
