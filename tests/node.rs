//! The local node (root): a real single-node Kubernetes 1.20 cluster — kubelet, containerd,
//! runc, the controller manager's Deployment and StatefulSet controllers and hostPath
//! provisioner, the scheduler — brought up, used, and torn down with nothing left behind.
//! Needs the binaries of `./scripts/build-kube-apiserver.sh` (a missing one fails the test with
//! that command, it never passes silently).
//!
//! The node's network lives in a namespace of its own: every test here compares the host's
//! network state (links, addresses, routes, the nftables ruleset, the network sysctls) before,
//! while the node runs, and after — for `node up` / `node down`, for a node torn down by its
//! owner, and for a node whose owner was killed, reaped.
#![allow(clippy::await_holding_lock, reason = "a std Mutex serializes the tests that share the machine: held across awaits on purpose")]

#[path = "common/wait.rs"]
mod wait;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use wait::until;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;
use serde_json::json;
use shakedown::k8s::exec::exec;
use shakedown::node::{cleanup, layout::KERNEL_TUNABLES, Node, NodeBinaries, NodeOptions};

#[path = "common/hostnet.rs"]
mod hostnet;

/// The tests set kubelet's kernel tunables explicitly (a fresh machine's defaults do not suit
/// it), and check that they are put back.
const SET_TUNABLES: NodeOptions = NodeOptions { set_kernel_tunables: true, workers: 0 };

/// One node at a time: each takes about 200 MiB and a core for its bring-up.
static SERIAL: Mutex<()> = Mutex::new(());

fn binaries() -> NodeBinaries {
    NodeBinaries::find().unwrap_or_else(|e| panic!("the node's binaries: {e}"))
}

fn sysctls() -> BTreeMap<String, String> {
    KERNEL_TUNABLES
        .iter()
        .map(|(s, _)| (s.to_string(), std::fs::read_to_string(format!("/proc/sys/{s}")).unwrap().trim().to_string()))
        .collect()
}

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn ready(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn ready_pods(client: &Client, ns: &str, selector: &str, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    until(&format!("{n} Ready pods {selector}"), Duration::from_secs(90), || {
        let pods = pods.clone();
        async move {
            let l = pods.list(&ListParams::default().labels(selector)).await.ok()?;
            let r: Vec<Pod> = l.items.into_iter().filter(|p| ready(p) && p.metadata.deletion_timestamp.is_none()).collect();
            (r.len() == n).then_some(r)
        }
    })
    .await
}

async fn sh(client: &Client, ns: &str, pod: &str, cmd: &str) -> shakedown::k8s::exec::ExecOutput {
    exec(client, ns, pod, None, &["sh", "-c", cmd], Duration::from_secs(30)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_real_pods_and_leaves_nothing_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bins = binaries();
    let before = sysctls();
    let net_before = hostnet::snapshot();
    let host_paths_before: Vec<bool> = shakedown::node::layout::HOST_PATHS.iter().map(|p| std::path::Path::new(p).exists()).collect();
    let dir = tempfile::tempdir().unwrap();
    let run_id = format!("sd-nodetest{}", std::process::id());
    let mut node = Node::up(&run_id, dir.path(), &bins, &SET_TUNABLES).await.unwrap_or_else(|e| panic!("node up: {e}"));
    let memory = node.memory();
    println!("node Ready in {} ms; memory {:?}", node.ready_ms, memory);
    for component in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd", "kubelet"] {
        assert!(memory.contains_key(component), "{component} runs: {memory:?}");
    }
    let mode = |p: &std::path::Path| shakedown::private::mode(p).unwrap();
    assert_eq!(mode(&node.kubeconfig), 0o600, "the admin's kubeconfig holds its token");
    assert_eq!(mode(&node.layout.dir.join("api/tokens.csv")), 0o600);
    let client = node.client().await.unwrap();
    let ns = "app";
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &obj(json!({"metadata": {"name": ns}}))).await.unwrap();
    until("the default ServiceAccount", Duration::from_secs(30), || {
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
        async move { sa.get_opt("default").await.ok().flatten() }
    })
    .await;

    // A Deployment of two busybox web servers and a StatefulSet whose replica keeps a file on
    // its claim (provisioned by the hostPath provisioner), running as a user other than root,
    // as most databases' images do: the node opens each new volume to every user.
    let web = json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "web", "image": shakedown::node::config::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"], "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}}
    });
    Api::<Deployment>::namespaced(client.clone(), ns).create(&PostParams::default(), &obj(web)).await.unwrap();
    let db = json!({
        "metadata": {"name": "db"},
        "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": {
            "metadata": {"labels": {"app": "db"}},
            "spec": {"terminationGracePeriodSeconds": 1, "securityContext": {"runAsUser": 1000, "runAsGroup": 1000}, "containers": [{"name": "db", "image": shakedown::node::config::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo first > /data/first && exec sleep 100000"], "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Mi"}}}}]}
    });
    Api::<StatefulSet>::namespaced(client.clone(), ns).create(&PostParams::default(), &obj(db)).await.unwrap();
    let webs = ready_pods(&client, ns, "app=web", 2).await;
    let dbs = ready_pods(&client, ns, "app=db", 1).await;
    let claim: PersistentVolumeClaim = Api::namespaced(client.clone(), ns).get("data-db-0").await.unwrap();
    assert_eq!(claim.status.and_then(|s| s.phase).as_deref(), Some("Bound"), "the claim bound through the hostPath provisioner");

    // exec, and pod-to-pod traffic on the node's bridge.
    let web0 = webs[0].metadata.name.clone().unwrap();
    let web1_ip = webs[1].status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
    let out = sh(&client, ns, &web0, &format!("timeout 5 wget -q -O- http://{web1_ip}:8080/")).await;
    assert_eq!((out.code, out.stdout.trim()), (0, webs[1].metadata.name.as_deref().unwrap()), "{out:?}");
    let failed = sh(&client, ns, &web0, "exit 3").await;
    assert_eq!(failed.code, 3, "an exec's exit code comes back: {failed:?}");
    // Nothing in a pod reaches off the machine: only the node's /24 and the Services' range
    // (through the node) are routed.
    let routes = sh(&client, ns, &web0, "ip route").await.stdout;
    assert!(!routes.contains("default"), "pods have no default route: {routes}");

    // Services route as on any cluster (kube-proxy): a ClusterIP in front of the web pods
    // answers from one of them, and the `kubernetes` Service that a pod's in-cluster
    // configuration dials (its environment) reaches the apiserver, whose certificate names it.
    let svc = json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}});
    let svc: Service = Api::namespaced(client.clone(), ns).create(&PostParams::default(), &obj(svc)).await.unwrap();
    let cluster_ip = svc.spec.and_then(|s| s.cluster_ip).unwrap();
    let names: Vec<String> = webs.iter().filter_map(|p| p.metadata.name.clone()).collect();
    let answer = until("the web Service answers from a web pod", Duration::from_secs(30), || {
        let (client, web0, cmd) = (client.clone(), web0.clone(), format!("timeout 2 wget -q -O- http://{cluster_ip}/"));
        async move {
            let out = sh(&client, ns, &web0, &cmd).await;
            (out.code == 0).then(|| out.stdout.trim().to_string())
        }
    })
    .await;
    assert!(names.contains(&answer), "{answer} is not one of {names:?}");
    let env = sh(&client, ns, &web0, "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT").await.stdout;
    assert_eq!(env.trim(), format!("{}:443", shakedown::pki::KUBERNETES_SERVICE_IP));
    let version = until("the apiserver through the kubernetes Service", Duration::from_secs(30), || {
        let (client, web0) = (client.clone(), web0.clone());
        let cmd = "timeout 5 wget -q -O- --no-check-certificate https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version";
        async move {
            let out = sh(&client, ns, &web0, cmd).await;
            (out.code == 0).then_some(out.stdout)
        }
    })
    .await;
    assert!(version.contains("gitVersion"), "{version}");
    let cert = node.layout.dir.join("api/apiserver/serving.crt");
    let san = Command::new("openssl").args(["x509", "-noout", "-ext", "subjectAltName", "-in"]).arg(&cert).output().unwrap();
    let san = String::from_utf8_lossy(&san.stdout);
    assert!(
        san.contains(&format!("IP Address:{}", shakedown::pki::KUBERNETES_SERVICE_IP)) && san.contains("DNS:kubernetes.default.svc"),
        "{san}"
    );

    // A replica killed with grace 0 comes back as a new pod (new UID) with its claim's data.
    let db0 = dbs[0].metadata.name.clone().unwrap();
    assert_eq!(
        sh(&client, ns, &db0, "id -u && cat /data/first").await.stdout.split_whitespace().collect::<Vec<_>>(),
        ["1000", "first"],
        "user 1000 wrote its volume"
    );
    assert_eq!(sh(&client, ns, &db0, "echo kept > /data/f && sync && cat /data/f").await.stdout.trim(), "kept");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // An exec the deletion cuts short is no success: its outcome is unknown (an app's write
    // counted as acknowledged, or an empty read counted as the store's answer, would be false
    // findings).
    let cut = {
        let (client, db0) = (client.clone(), db0.clone());
        tokio::spawn(async move { exec(&client, ns, &db0, None, &["sleep", "30"], Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    pods.delete(&db0, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    let cut = cut.await.unwrap();
    assert!(!matches!(&cut, Ok(o) if o.code == 0), "an exec cut by the pod's deletion reads as a success: {cut:?}");
    println!("an exec cut by the pod's deletion: {cut:?}");
    let old_uid = dbs[0].metadata.uid.clone();
    let back = until("db-0 recreated", Duration::from_secs(60), || {
        let pods = pods.clone();
        let old_uid = old_uid.clone();
        async move { pods.get_opt("db-0").await.ok().flatten().filter(|p| p.metadata.uid != old_uid && ready(p)) }
    })
    .await;
    assert_ne!(back.metadata.uid, old_uid);
    // The first exec into the new pod may meet the old one's container still going away (its
    // stream then ends without a status: an error, not an answer): retried, within a bound.
    let read = until("the claim's data read in the new db-0", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            exec(&client, ns, "db-0", None, &["cat", "/data/f"], Duration::from_secs(10)).await.map_err(|e| println!("retried: {e}")).ok()
        }
    })
    .await;
    assert_eq!((read.code, read.stdout.trim()), (0, "kept"), "the claim's data survived the pod: {read:?}");

    // The node enforces NetworkPolicy (its policy engine: the bridge plugin has none). An
    // ingress deny-all on the web pods cuts web0 → web1; a rule allowing the web pods on the
    // named port `http` opens it again, one allowing another port does not; with the policies
    // gone it flows. A policy is applied within a moment: each check retries for up to 10 s.
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let connects = |want: bool, why: &'static str| {
        let (client, web0) = (client.clone(), web0.clone());
        let cmd = format!("timeout 2 wget -q -O- http://{web1_ip}:8080/");
        async move {
            until(why, Duration::from_secs(10), || {
                let (client, web0, cmd) = (client.clone(), web0.clone(), cmd.clone());
                async move { ((sh(&client, ns, &web0, &cmd).await.code == 0) == want).then_some(()) }
            })
            .await
        }
    };
    let create = |v: serde_json::Value| {
        let policies = policies.clone();
        async move { policies.create(&PostParams::default(), &obj(v)).await.unwrap() }
    };
    create(json!({"metadata": {"name": "deny-web"}, "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"]}}))
        .await;
    connects(false, "an ingress deny-all cuts web0 -> web1").await;
    create(json!({"metadata": {"name": "other-port"}, "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": 9090}]}]}})).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    connects(false, "a rule for port 9090 leaves 8080 cut").await;
    create(json!({"metadata": {"name": "allow-web"}, "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": "http"}]}]}})).await;
    connects(true, "a rule for the web pods on port http opens it").await;
    for name in ["deny-web", "other-port", "allow-web"] {
        policies.delete(name, &DeleteParams::default()).await.unwrap();
    }
    connects(true, "with no policy, traffic flows").await;

    // Nothing tried to leave the machine (kubelet's metadata lookup is off; the guard counts).
    assert_eq!(cleanup::guard_drops(&node.layout), 0, "packets dropped by the off-machine guard");
    // A node with pods, a claim and policies came and went, and the host's network is as it
    // was: the bridge, the pods' veths, the table and its chains are all in the node's namespace.
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "while a node runs pods");
    let t0 = Instant::now();
    let left = node.teardown();
    println!("teardown in {} ms", t0.elapsed().as_millis());
    assert!(left.is_empty(), "left behind: {left}");
    assert_eq!(sysctls(), before, "the sysctls kubelet set are restored");
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by a node's life and teardown");
    let host_paths_after: Vec<bool> = shakedown::node::layout::HOST_PATHS.iter().map(|p| std::path::Path::new(p).exists()).collect();
    assert_eq!(
        host_paths_after,
        host_paths_before,
        "the mount points made on the host are gone: {:?}",
        shakedown::node::layout::HOST_PATHS
    );
}

/// Puts a sysctl back to the value it had when this was made.
struct RestoreSysctl(&'static str, String);
impl RestoreSysctl {
    fn set(name: &'static str, value: &str) -> RestoreSysctl {
        let path = format!("/proc/sys/{name}");
        let was = std::fs::read_to_string(&path).unwrap().trim().to_string();
        std::fs::write(&path, value).unwrap();
        RestoreSysctl(name, was)
    }
}
impl Drop for RestoreSysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("/proc/sys/{}", self.0), &self.1);
    }
}

/// `node up`, `node status` and `node down` as a user runs them; `down` works from the node
/// directory alone (the process that brought the node up is gone). kubelet's kernel tunables
/// are not changed behind the user's back: with one that does not suit, `node up` refuses
/// before it makes anything, naming the sysctl and the command; with `--set-kernel-tunables` it
/// sets it for the node's life and `node down` puts it back. The host's network is the same
/// before, while the node is up, and after.
#[test]
fn node_up_status_down_from_the_command_line() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    binaries();
    let runs = tempfile::tempdir().unwrap();
    let sd = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_shakedown")).args(args).arg("--runs-dir").arg(runs.path()).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let net_before = hostnet::snapshot();
    let tunables = sysctls();
    let lowered = RestoreSysctl::set("kernel/keys/root_maxkeys", "200");
    let (code, out, err) = sd(&["node", "up"]);
    assert_eq!(code, Some(4), "a kernel tunable kubelet needs differs: refused (exit 4): {out}{err}");
    assert!(
        err.contains("kubelet needs ")
            && err.split("(this machine has").nth(1).is_some_and(|has| has.contains("kernel.keys.root_maxkeys=200"))
            && err.split("sysctl -w ").nth(1).is_some_and(|cmd| cmd.contains("kernel.keys.root_maxkeys=1000000"))
            && err.contains("--set-kernel-tunables"),
        "{err}"
    );
    assert!(!runs.path().join("current-node").exists(), "nothing was made");
    let (code, out, err) = sd(&["node", "up", "--set-kernel-tunables"]);
    let reap_on_failure = scopeguard(runs.path());
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("Ready in") && out.contains("kubeconfig"), "{out}");
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/keys/root_maxkeys").unwrap().trim(), "1000000", "set for the node's life");
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by `node up`");
    // The host reaches the apiserver on the forward's loopback address, as kubectl would.
    let kubeconfig = std::fs::read_to_string(out.lines().find_map(|l| l.strip_prefix("kubeconfig  ")).unwrap().trim()).unwrap();
    assert!(kubeconfig.contains("server: https://127.213."), "{kubeconfig}");
    let (code, out, err) = sd(&["node", "up"]);
    assert_eq!(code, Some(2), "a second node up in the same runs dir is refused: {out}{err}");
    let (code, out, err) = sd(&["node", "status"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains(" Ready ·") && out.contains("guard dropped 0 packets"), "{out}");
    // The policy engine runs (it applies its first, empty, ruleset once its watches synced).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, out, _) = sd(&["node", "status"]);
        if out.contains("NetworkPolicy engine running: 0 policies, 0 pods isolated") {
            break;
        }
        assert!(Instant::now() < deadline, "the policy engine: {out}");
        std::thread::sleep(Duration::from_millis(200));
    }
    load_an_image_and_run_a_pod_from_it(runs.path(), &sd);
    let (code, out, err) = sd(&["node", "down"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("nothing left behind"), "{out}");
    std::mem::forget(reap_on_failure);
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/keys/root_maxkeys").unwrap().trim(), "200", "`node down` put it back");
    drop(lowered);
    assert_eq!(sysctls(), tunables);
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by `node up` and `node down`");
    let (code, _, err) = sd(&["node", "status"]);
    assert_eq!(code, Some(2), "no node: {err}");
    assert!(err.contains("node up"), "{err}");

    // A node whose run is gone (no `current-node` pointer: as after a `kill -9` of a run that
    // brought one up): `reap` takes it down from its directory alone.
    let (code, out, err) = sd(&["node", "up", "--set-kernel-tunables"]);
    let reap_on_failure = scopeguard(runs.path());
    assert_eq!(code, Some(0), "{out}\n{err}");
    let run_dir = std::fs::read_to_string(runs.path().join("current-node")).unwrap();
    std::fs::remove_file(runs.path().join("current-node")).unwrap();
    let layout = shakedown::node::layout::Layout::load(&std::path::Path::new(run_dir.trim()).join("node")).unwrap();
    assert!(!cleanup::leftovers(&layout).is_empty(), "the node runs");
    let (code, out, err) = sd(&["reap"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains(&format!("node {} removed", layout.node_name)), "{out}");
    let left = cleanup::leftovers(&layout);
    assert!(left.is_empty(), "left behind after reap: {left}");
    std::mem::forget(reap_on_failure);
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by a node reaped from its directory");
}

/// What a shakedown command said: its exit code, stdout and stderr.
type Said = (Option<i32>, String, String);

/// `node load` as a user runs it: an image of their own, in a `docker save` archive, is loaded
/// with its tag, listed by `node status`, and a pod runs it without a registry. A path that is
/// not there, or a file that is not an image archive, is refused (exit 2) naming it.
fn load_an_image_and_run_a_pod_from_it(runs: &std::path::Path, sd: &dyn Fn(&[&str]) -> Said) {
    let work = tempfile::tempdir().unwrap();
    let tag = "example.test/hello:1";
    let image = shakedown::node::images::Image {
        tag: tag.into(),
        files: vec![("/bin/busybox".into(), "bin/busybox".into())],
        links: vec![],
        entrypoint: vec!["/bin/busybox".into(), "echo".into()],
        cmd: vec!["hello from a loaded image".into()],
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let archive = rt.block_on(shakedown::node::images::build(&image, work.path())).unwrap();
    let archive = archive.to_str().unwrap();
    let (code, out, err) = sd(&["node", "status"]);
    assert!(code == Some(0) && !out.contains(tag), "not there before: {out}{err}");
    let (code, out, err) = sd(&["node", "load", archive]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains(&format!("loaded {tag}")), "{out}");
    let (_, out, _) = sd(&["node", "status"]);
    let listed = out.lines().find(|l| l.starts_with("images")).unwrap_or_default();
    assert!(listed.contains(tag) && listed.contains(shakedown::node::config::PAUSE_IMAGE), "{out}");

    let junk = work.path().join("junk.tar");
    std::fs::write(&junk, "not an image").unwrap();
    let (code, _, err) = sd(&["node", "load", junk.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("junk.tar is not an image archive"), "{err}");
    let (code, _, err) = sd(&["node", "load", "/nonexistent/image.tar"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cannot read /nonexistent/image.tar"), "{err}");

    let run_dir = std::fs::read_to_string(runs.join("current-node")).unwrap();
    let kubeconfig = std::path::Path::new(run_dir.trim()).join("node/kubeconfig");
    rt.block_on(async {
        let client = shakedown::node::admin_client(&kubeconfig).await.unwrap();
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let pod = json!({"metadata": {"name": "hello"}, "spec": {"restartPolicy": "Never", "containers": [
            {"name": "hello", "image": tag, "imagePullPolicy": "Never"}]}});
        until("the default ServiceAccount", Duration::from_secs(30), || {
            let pods = pods.clone();
            let pod: Pod = obj(pod.clone());
            async move { pods.create(&PostParams::default(), &pod).await.ok() }
        })
        .await;
        let phase = until("the pod's end", Duration::from_secs(60), || {
            let pods = pods.clone();
            async move {
                let phase = pods.get("hello").await.ok()?.status?.phase?;
                (phase == "Succeeded" || phase == "Failed").then_some(phase)
            }
        })
        .await;
        let log = pods.logs("hello", &Default::default()).await.unwrap();
        assert_eq!((phase.as_str(), log.trim()), ("Succeeded", "hello from a loaded image"));
        pods.delete("hello", &DeleteParams::default()).await.unwrap();
    });
}

/// Takes the node of `runs` down if the test fails half-way (a node outlives `node up`).
fn scopeguard(runs: &std::path::Path) -> impl Drop + '_ {
    struct Down<'a>(&'a std::path::Path);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = Command::new(env!("CARGO_BIN_EXE_shakedown")).args(["node", "down", "--runs-dir"]).arg(self.0).output();
        }
    }
    Down(runs)
}

/// Where the helper below brings its node up (set by the test that kills it).
const HELPER_DIR: &str = "SHAKEDOWN_NODE_TEST_HELPER_DIR";

/// Not a test: the process `a_node_whose_owner_was_killed_is_reaped` starts and kills. Brings a
/// node up in `$SHAKEDOWN_NODE_TEST_HELPER_DIR`, says so on stdout and waits to be killed.
#[test]
#[ignore = "run by a_node_whose_owner_was_killed_is_reaped"]
fn helper_node_up_and_wait() {
    let Some(dir) = std::env::var_os(HELPER_DIR) else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let run_id = format!("sd-killed{}", std::process::id());
        let node = Node::up(&run_id, std::path::Path::new(&dir), &binaries(), &NodeOptions { workers: 1, ..SET_TUNABLES })
            .await
            .unwrap_or_else(|e| panic!("node up: {e}"));
        println!("node-up {}", node.layout.dir.display());
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

/// A process that owns a node is killed with SIGKILL (no teardown runs: a test killed mid-way,
/// a session cut off — what left the bridge that failed a CI run): its node stays on the machine,
/// and `shakedown reap` finds it through its slot's lock file — the node lived in a temporary
/// directory, under no runs directory — and removes it, leaving nothing. The node has a worker
/// (`--workers 1`): its kubelet, containerd, mount namespace and cgroups go too.
#[test]
fn a_node_whose_owner_was_killed_is_reaped() {
    use std::io::{BufRead, BufReader};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    binaries();
    let net_before = hostnet::snapshot();
    let tunables = sysctls();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "helper_node_up_and_wait", "--ignored", "--nocapture"])
        .env(HELPER_DIR, dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    // Whatever happens below, the helper and its node go.
    struct Cleanup(std::process::Child);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            cleanup::reap_strays();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let mut guard = Cleanup(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(d) = line.strip_prefix("node-up ") {
                let _ = tx.send(d.to_string());
            }
        }
    });
    let node_dir = rx.recv_timeout(Duration::from_secs(180)).expect("the helper's node comes up");
    let layout = shakedown::node::layout::Layout::load(std::path::Path::new(&node_dir)).unwrap();
    unsafe { libc::kill(guard.0.id() as i32, libc::SIGKILL) };
    let _ = guard.0.wait();
    let left = cleanup::leftovers(&layout);
    assert!(!left.processes.is_empty(), "a SIGKILL leaves the node running: {left}");
    let worker = layout.member(1).dir.display().to_string();
    assert!(
        ["kubelet", "containerd", "tail"].iter().all(|c| left.processes.iter().any(|(_, cmd)| cmd.contains(c) && cmd.contains(&worker))),
        "the worker's kubelet, containerd and mount namespace's holder run: {left}"
    );
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by a node whose owner was killed");
    let runs = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shakedown")).args(["reap", "--runs-dir"]).arg(runs.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("node {} of a killed run removed", layout.node_name)) && text.contains("reaped 1 stray node"), "{text}");
    let left = cleanup::leftovers(&layout);
    assert!(left.is_empty(), "left behind after reap: {left}");
    let out = Command::new(env!("CARGO_BIN_EXE_shakedown")).args(["reap", "--runs-dir"]).arg(runs.path()).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("stray"), "a reaped node is not reaped twice");
    hostnet::assert_same(&net_before, &hostnet::snapshot(), "by a killed node's owner and `reap`");
    assert_eq!(sysctls(), tunables, "`reap` put kubelet's tunables back");
}
