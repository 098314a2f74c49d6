//! Where a node keeps everything: one directory (`<run dir>/node`), named on the command line of
//! every process it starts, so `sweep` finds them after a `kill -9`; the names it gives things
//! outside that directory (bridge, cgroup root, nftables table) derived from the run id.

use std::path::{Path, PathBuf};

use super::config::NodeNet;

/// Host paths kubelet, containerd, CNI and the hostPath provisioner write to whatever their
/// configuration says. Inside the node's mount namespace each is a bind mount of a directory of
/// the node's own: the host's directories are never written. (A missing one is created as an
/// empty mount point, and removed at teardown.)
pub const HOST_PATHS: &[&str] =
    &["/run/containerd", "/var/lib/cni", "/var/log/pods", "/var/log/containers", "/var/lib/kubelet", "/tmp/hostpath_pv"];

/// The process-wide sysctls kubelet wants (`setupKernelTunables`) and the values it wants. The
/// node's kubelet runs with `protectKernelDefaults`: it checks them and never changes them.
/// Bring-up checks them first and refuses with the command that sets them, unless `node up
/// --set-kernel-tunables` asked it to set them for the node's life (recorded, restored).
pub const KERNEL_TUNABLES: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The port of the node's apiserver, inside the node's network namespace and on the host's
/// loopback forward.
pub const API_PORT: u16 = 6443;

#[derive(Debug, Clone)]
pub struct Layout {
    /// `<run dir>/node`.
    pub dir: PathBuf,
    pub run_id: String,
    /// The Node's name (also kubelet's `--hostname-override` and its token's user).
    pub node_name: String,
    /// The bridge pods attach to, inside the node's network namespace (at most 15 characters).
    pub bridge: String,
    /// The cgroup root of kubelet and its pods, in every hierarchy (no leading slash).
    pub cgroup_root: String,
    /// The nftables table of the off-machine guard and the policy chains, inside the node's
    /// network namespace.
    pub nft_table: String,
    pub net: NodeNet,
    /// Where the CNI plugins are.
    pub cni_bin: PathBuf,
    /// Worker nodes beside the control-plane node (`node up --workers N`): each a kubelet and
    /// containerd of its own ([`Member`]).
    pub workers: u8,
}

/// The most workers a node may have: their addresses (`.2` …) stay below the pods' (`.10` …).
pub const MAX_WORKERS: u8 = 8;

/// One kubelet of a node and the containerd it runs pods with: the control-plane node's
/// (`index` 0, in the node directory) or a worker's (`index` 1…, in `worker-<index>` of it).
/// Every member shares the node's network namespace (one bridge, one pod /24, one kube-proxy,
/// one NetworkPolicy engine); each has a mount namespace, a cgroup subtree, an address and a
/// share of the pods' addresses of its own. The hostPath provisioner's directory is the same
/// directory in every member's mount namespace (a volume is reachable from every node, as
/// network storage would be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub index: u8,
    pub dir: PathBuf,
    /// The Node's name (kubelet's `--hostname-override`, its token's user).
    pub node_name: String,
    /// Its address on the node's bridge (kubelet serves there; the Node's InternalIP).
    pub ip: std::net::Ipv4Addr,
    /// Its kubelet's cgroup root (a worker's is inside the node's, so one walk finds them all).
    pub cgroup_root: String,
    /// The first and last host number of its pods' addresses in the node's /24.
    pub pod_range: (u8, u8),
    /// The file its mount namespace is held by (`tail -f` of it).
    pub holder_file: PathBuf,
}

impl Member {
    pub fn containerd_root(&self) -> PathBuf {
        self.dir.join("containerd/root")
    }
    pub fn containerd_state(&self) -> PathBuf {
        self.dir.join("containerd/state")
    }
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni/net.d")
    }
    pub fn cni_ipam_dir(&self) -> PathBuf {
        self.dir.join("cni/ipam")
    }
    pub fn flex_dir(&self) -> PathBuf {
        self.dir.join("flex")
    }
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    /// The directory bound over `host` inside this member's mount namespace.
    pub fn host_path_dir(&self, host: &str) -> PathBuf {
        self.dir.join("host").join(host.trim_start_matches('/').replace('/', "_"))
    }
    /// A component's name in the node's `logs/` (`kubelet`, a worker's `kubelet-w1`).
    pub fn component(&self, name: &str) -> String {
        if self.index == 0 {
            name.to_string()
        } else {
            format!("{name}-w{}", self.index)
        }
    }
    /// The directories a teardown deletes (the member's data).
    fn data_dirs(&self) -> Vec<PathBuf> {
        ["containerd", "kubelet", "host", "cni/ipam", "flex"].iter().map(|d| self.dir.join(d)).collect()
    }
}

impl Layout {
    pub fn new(run_dir: &Path, run_id: &str, slot: u8, cni_bin: &Path) -> Layout {
        let short = short_id(run_id);
        Layout {
            dir: run_dir.join("node"),
            run_id: run_id.to_string(),
            node_name: format!("sd-{short}"),
            bridge: format!("sdn{short}"),
            cgroup_root: format!("shakedown-node-{run_id}"),
            nft_table: format!("shakedown-node-{short}"),
            net: NodeNet { slot },
            cni_bin: cni_bin.to_path_buf(),
            workers: 0,
        }
    }

    /// The same layout with `n` workers.
    pub fn with_workers(mut self, n: u8) -> Layout {
        self.workers = n;
        self
    }

    /// Every member: the control-plane node's, then each worker's.
    pub fn members(&self) -> Vec<Member> {
        (0..=self.workers).map(|i| self.member(i)).collect()
    }

    /// Member `i` (0: the control-plane node).
    pub fn member(&self, i: u8) -> Member {
        let n = self.workers as u16 + 1;
        // The pods' addresses .10 … .250, in equal shares, the last taking what is left.
        let span = 241 / n;
        let first = 10 + span * i as u16;
        let last = if i as u16 + 1 == n { 250 } else { first + span - 1 };
        let (dir, node_name, cgroup_root, holder_file) = if i == 0 {
            (self.dir.clone(), self.node_name.clone(), self.cgroup_root.clone(), self.holder_file())
        } else {
            let dir = self.dir.join(format!("worker-{i}"));
            let holder = dir.join("holder");
            (dir, format!("{}-w{i}", self.node_name), format!("{}/w{i}", self.cgroup_root), holder)
        };
        Member { index: i, dir, node_name, ip: self.net.host(1 + i), cgroup_root, pod_range: (first as u8, last as u8), holder_file }
    }

    /// The layout of an existing node directory (for `node down`, `reap`): from its `node.json`.
    pub fn load(node_dir: &Path) -> Option<Layout> {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(node_dir.join("node.json")).ok()?).ok()?;
        Layout::from_json(node_dir, &v)
    }

    /// The layout of `to_json` for the node in `node_dir` (which may be gone).
    pub fn from_json(node_dir: &Path, v: &serde_json::Value) -> Option<Layout> {
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
        Some(Layout {
            dir: node_dir.to_path_buf(),
            run_id: s("run_id")?,
            node_name: s("node_name")?,
            bridge: s("bridge")?,
            cgroup_root: s("cgroup_root")?,
            nft_table: s("nft_table")?,
            net: NodeNet { slot: v.get("slot")?.as_u64()? as u8 },
            cni_bin: PathBuf::from(s("cni_bin")?),
            // A node of an earlier shakedown had none.
            workers: v.get("workers").and_then(|w| w.as_u64()).unwrap_or(0) as u8,
        })
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "run_id": self.run_id, "node_name": self.node_name, "bridge": self.bridge,
            "cgroup_root": self.cgroup_root, "nft_table": self.nft_table, "slot": self.net.slot,
            "cni_bin": self.cni_bin, "workers": self.workers,
        })
    }

    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }
    /// The kubeconfig of the node's admin (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    /// The directory bound over `host` inside the control-plane node's mount namespace.
    pub fn host_path_dir(&self, host: &str) -> PathBuf {
        self.member(0).host_path_dir(host)
    }
    /// The control-plane node's containerd (where `node load` and the tests reach images).
    pub fn containerd_socket(&self) -> PathBuf {
        self.member(0).containerd_socket()
    }
    /// The record of what bring-up changed on the host (sysctls, created mount points), until a
    /// teardown has put it back (then it is `host.restored.json`).
    pub fn host_record(&self) -> PathBuf {
        self.dir.join("host.json")
    }
    /// The directories a teardown deletes (the node's data; its logs and configuration stay).
    pub fn data_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = ["etcd", "images"].iter().map(|d| self.dir.join(d)).collect();
        dirs.extend(self.members().iter().flat_map(Member::data_dirs));
        dirs
    }
    /// The apiserver as the node's components (inside its network namespace) reach it.
    pub fn server(&self) -> String {
        format!("https://{}:{API_PORT}", self.net.node_ip())
    }
    /// The apiserver as the host reaches it: the node's forward on a loopback address (the
    /// admin's kubeconfig names it; inside the namespace the apiserver answers there too).
    pub fn host_server(&self) -> String {
        format!("https://{}", self.net.forward())
    }
    /// The file the node's mount and network namespaces are held by: `tail -f` of it is the
    /// holder process.
    pub fn holder_file(&self) -> PathBuf {
        self.dir.join("holder")
    }
}

/// The part of a run id the names outside the node directory carry (the bridge's is at most 15
/// characters: `sdn` + 12). A run id that fits is kept as it is (shakedown's own, `sd-1a2b3c4d`,
/// does); a longer one is not cut short, which made two runs whose ids share a prefix share a
/// bridge (tests named `sd-apptest<pid>` did, and a bridge left by a killed run then failed every
/// later run whose pid began with the same digit): its first four characters and eight hex digits
/// of an FNV-1a hash of the whole id.
pub fn short_id(run_id: &str) -> String {
    let alnum: String = run_id.trim_start_matches("sd-").chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    if alnum.len() <= 12 && !alnum.is_empty() {
        return alnum;
    }
    let hash = run_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    format!("{}{:08x}", &alnum[..alnum.len().min(4)], (hash ^ (hash >> 32)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_the_node_directory_stay_apart_for_ids_sharing_a_prefix() {
        let a = Layout::new(Path::new("/r"), "sd-apptest2171717", 1, Path::new("/c"));
        let b = Layout::new(Path::new("/r"), "sd-apptest2999999", 2, Path::new("/c"));
        assert_ne!(a.bridge, b.bridge);
        assert_ne!(a.nft_table, b.nft_table);
        assert!(a.bridge.len() <= 15 && b.bridge.len() <= 15, "{} {}", a.bridge, b.bridge);
        // A run id that fits is kept readable; the hash is a function of the id (a replayed
        // teardown from node.json and a fresh layout agree).
        assert_eq!(short_id("sd-1a2b3c4d"), "1a2b3c4d");
        assert_eq!(short_id("sd-apptest2171717"), short_id("sd-apptest2171717"));
        assert!(short_id("sd-apptest2171717").starts_with("appt"));
    }
}
