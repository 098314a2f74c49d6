//! The local testbed: real etcd members (one per site, each on its own loop-mounted ext4 disk,
//! each site its own loopback subnet) behind a real HAProxy with health checks; with the
//! `control-plane` stack each member's machine also runs a kube-apiserver talking to it
//! ([`super::apiserver`]), behind the same HAProxy as the API load balancer. A machine's
//! apiserver lives and dies with its member: a kill, a stop, a signal take both.
//!
//! Addresses: run slot S (unique per live run, held by a lock file) gives the endpoint
//! `127.S.0.1:2379` (the API load balancer `127.S.0.1:6443`) and member `mN` of site `k` the
//! address `127.S.(k+1).(10+N)` (its apiserver: port 6443 there).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use shakedown_faults::{MemberId, Model, SiteId, Stack, Version};
use tokio::time::Instant;

use super::apiserver::{ApiPki, API_PORT};
use super::disk::{Disk, DiskMode};
use super::{reap, LocalError, PlantedBug};
use crate::binaries::Binaries;

pub const CLIENT_PORT: u16 = 2379;
pub const PEER_PORT: u16 = 2380;
/// How long HAProxy may take to accept connections after it is (re)started.
pub const HAPROXY_START_BOUND: Duration = Duration::from_secs(2);
/// How long a SIGKILLed process may take to be reaped (it may be finishing a disk write).
pub const REAP_BOUND: Duration = Duration::from_secs(10);
/// How long bring-up waits for a started member's peer port to answer before starting the next.
const PEER_ANSWER_BOUND: Duration = Duration::from_secs(3);
/// How often a process that was signalled (or a port that should open) is polled.
const EXIT_POLL: Duration = Duration::from_millis(5);
/// How often bring-up asks a starting apiserver's `/readyz`.
const READYZ_POLL: Duration = Duration::from_millis(200);
/// How long the control-plane stack's kube-apiservers may take to answer `/readyz` with 200 once
/// etcd is up, on top of the stack's own bring-up bound: three start at once, each bootstrapping
/// its RBAC policy, and until that policy is written their `/readyz` refuses the anonymous probe
/// (403). Beside CI's other test lanes on 2 cores that took longer than the 30 s the whole
/// bring-up once had.
const APISERVERS_READY_BOUND: Duration = Duration::from_secs(120);
/// How often teardown's sweep checks whether the processes it killed are gone (100 times at most).
pub const REAP_POLL: Duration = Duration::from_millis(10);

#[derive(Debug, Clone)]
pub struct TestbedConfig {
    pub run_id: String,
    pub run_dir: PathBuf,
    pub binaries: Binaries,
    pub disks: DiskMode,
    pub bug: Option<PlantedBug>,
    pub heartbeat_ms: u32,
    pub election_ms: u32,
    pub stack: Stack,
    /// etcd's flags the plan runs with (the profile's `[etcd]`, with those drawn for the seed),
    /// on every member started.
    pub etcd: shakedown_faults::EtcdFlags,
}

/// etcd's raft heartbeat on the testbed: etcd's default, as kubeadm runs it. (It was 50 ms, with
/// a 500 ms election timeout: on a loaded 2-core machine the leader then missed its heartbeats
/// and elections churned for 30 s, terms 3 to 18, reported as lost members and quorum.)
pub const HEARTBEAT_MS: u32 = 100;
/// etcd's election timeout on the testbed: etcd's default, ten heartbeats.
pub const ELECTION_MS: u32 = 1000;

impl TestbedConfig {
    /// A testbed with the default raft timing.
    pub fn new(run_id: &str, run_dir: &std::path::Path, binaries: Binaries, disks: DiskMode, bug: Option<PlantedBug>) -> TestbedConfig {
        TestbedConfig {
            run_id: run_id.into(),
            run_dir: run_dir.into(),
            binaries,
            disks,
            bug,
            heartbeat_ms: HEARTBEAT_MS,
            election_ms: ELECTION_MS,
            stack: Stack::Etcd,
            etcd: Default::default(),
        }
    }
}

#[derive(Debug)]
pub struct MemberProc {
    pub id: MemberId,
    pub site: SiteId,
    pub version: Version,
    pub ip: Ipv4Addr,
    pub disk: Disk,
    child: Option<Child>,
    /// The machine's kube-apiserver (the control-plane stack).
    apiserver: Option<Child>,
    /// What the machine's kubelet knows of that apiserver: when it last started, how often it
    /// exited in a row, and when it may be started again (see [`Testbed::supervise_apiservers`]).
    apiserver_restarts: Restarts,
}

/// kubelet's record of one static pod's container: its CrashLoopBackOff.
#[derive(Debug, Default)]
struct Restarts {
    started: Option<Instant>,
    exits: u32,
    due: Option<Instant>,
    /// How the last one ended (`exit status: 1`).
    last_exit: Option<String>,
}

/// kubelet's CrashLoopBackOff: 10 s after the first exit, doubling up to 5 minutes; forgotten
/// once the container has run for 10 minutes.
const BACKOFF_FIRST: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
const BACKOFF_RESET: Duration = Duration::from_secs(600);

fn crash_loop_backoff(exits: u32) -> Duration {
    BACKOFF_FIRST.saturating_mul(1u32 << exits.saturating_sub(1).min(5)).min(BACKOFF_MAX)
}

impl MemberProc {
    pub fn name(&self) -> String {
        self.id.to_string()
    }
    pub fn client_url(&self) -> String {
        format!("http://{}:{CLIENT_PORT}", self.ip)
    }
    pub fn peer_url(&self) -> String {
        format!("http://{}:{PEER_PORT}", self.ip)
    }
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }
    /// The machine's apiserver, `https://ip:6443`.
    pub fn api_url(&self) -> String {
        format!("https://{}:{API_PORT}", self.ip)
    }
    pub fn apiserver_pid(&self) -> Option<i32> {
        self.apiserver.as_ref().map(|c| c.id() as i32)
    }
}

pub struct Testbed {
    pub cfg: TestbedConfig,
    pub slot: u8,
    _slot_lock: File,
    pub members: BTreeMap<MemberId, MemberProc>,
    /// The control-plane stack's CA, keys and tokens (`None`: the etcd stack).
    pub api: Option<ApiPki>,
    /// Whether `spawn_member` also starts the machine's apiserver (off during bring-up, which
    /// starts them once etcd is healthy).
    start_apiservers: bool,
    /// What [`Testbed::supervise_apiservers`] did (an apiserver that exited, one restarted),
    /// for the target to put in the event log.
    supervision: Vec<String>,
    haproxy: Option<Child>,
    /// HAProxy processes replaced by a reload; they exit on their own (hard-stop-after).
    retired: Vec<Child>,
    torn_down: bool,
}

/// Takes a free run slot: a lock file held for the life of the run, and a free endpoint address.
fn take_slot(run_id: &str) -> Result<(u8, File), LocalError> {
    let dir = std::env::temp_dir().join("shakedown-slots");
    std::fs::create_dir_all(&dir).map_err(|e| LocalError::Environment(format!("cannot create {}: {e}", dir.display())))?;
    // Shared by every user's runs, like /tmp itself.
    let _ = std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    run_id.hash(&mut h);
    let start = (h.finish() % 180) as u8;
    for i in 0..180u8 {
        let slot = 64 + (start + i) % 180;
        let path = dir.join(format!("slot-{slot}.lock"));
        let Ok(file) = OpenOptions::new().create(true).truncate(false).write(true).open(&path) else { continue };
        let _ = std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666));
        // SAFETY: flock on a file descriptor we own; released when the file closes or we die.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        let endpoint = SocketAddrV4::new(Ipv4Addr::new(127, slot, 0, 1), CLIENT_PORT);
        if TcpListener::bind(endpoint).is_ok() {
            return Ok((slot, file));
        }
    }
    Err(LocalError::Environment("no free run slot (127.64-243.x.x): too many shakedown runs on this machine?".into()))
}

/// Waits (bounded) until `addr` answers an HTTP request; gives up silently at the bound (the
/// health wait that follows reports what is wrong).
async fn wait_http(addr: SocketAddrV4, limit: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let attempt = async {
            let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
            s.write_all(b"GET /version HTTP/1.0\r\n\r\n").await.ok()?;
            let mut buf = [0u8; 8];
            s.read_exact(&mut buf).await.ok()?;
            buf.starts_with(b"HTTP/1.").then_some(())
        };
        if let Ok(Some(())) = tokio::time::timeout(EXIT_POLL * 20, attempt).await {
            return;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// A failpoint build serves gofail's endpoint at the member's own address
/// ([`super::failpoint::FAILPOINT_PORT`]), and dies with every goroutine's stack
/// (`GOTRACEBACK=all`): a failpoint's panic runs the raft loop's deferred shutdown, and another
/// goroutine that trips over it can be the one whose panic Go prints (`panic: transport
/// stopped`), so the failpoint's frames are looked for among the others. A plain etcd gets
/// nothing.
fn failpoint_endpoint(failpoint_build: bool, ip: Ipv4Addr) -> Vec<(&'static str, String)> {
    match failpoint_build {
        true => vec![("GOFAIL_HTTP", format!("{ip}:{}", super::failpoint::FAILPOINT_PORT)), ("GOTRACEBACK", "all".into())],
        false => vec![],
    }
}

fn log_file(run_dir: &Path, name: &str) -> Result<(File, File), LocalError> {
    let path = run_dir.join("logs").join(format!("{name}.log"));
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| LocalError::Environment(format!("cannot open {}: {e}", path.display())))?;
    let g = f.try_clone().map_err(|e| LocalError::Environment(e.to_string()))?;
    Ok((f, g))
}

impl Testbed {
    pub fn member_ip(&self, id: MemberId, site: SiteId) -> Ipv4Addr {
        Ipv4Addr::new(127, self.slot, site.0 + 1, 10 + (id.0 % 240) as u8)
    }

    pub fn endpoint_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(127, self.slot, 0, 1), CLIENT_PORT)
    }

    pub fn endpoint_url(&self) -> String {
        format!("http://{}", self.endpoint_addr())
    }

    /// Starts the stack the model describes and waits until it is healthy (bounded by `limit`).
    /// On any failure everything created so far is torn down.
    pub async fn up(cfg: TestbedConfig, model: &Model, limit: Duration) -> Result<Testbed, LocalError> {
        for sub in ["logs", "members"] {
            let d = cfg.run_dir.join(sub);
            std::fs::create_dir_all(&d).map_err(|e| LocalError::Environment(format!("cannot create {}: {e}", d.display())))?;
        }
        let (slot, lock) = take_slot(&cfg.run_id)?;
        let mut tb = Testbed {
            cfg,
            slot,
            _slot_lock: lock,
            members: BTreeMap::new(),
            api: None,
            start_apiservers: false,
            supervision: vec![],
            haproxy: None,
            retired: vec![],
            torn_down: false,
        };
        match tb.bring_up(model, limit).await {
            Ok(()) => Ok(tb),
            Err(e) => {
                tb.teardown();
                Err(e)
            }
        }
    }

    async fn bring_up(&mut self, model: &Model, limit: Duration) -> Result<(), LocalError> {
        let deadline = Instant::now() + limit;
        // Disks in parallel: mkfs dominates.
        let run_dir = self.cfg.run_dir.clone();
        let mode = self.cfg.disks;
        let ids: Vec<MemberId> = model.members.keys().copied().collect();
        let names: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        let disks = futures::future::join_all(names.iter().map(|name| Disk::create(&run_dir, name, mode))).await;
        let mut first_err = None;
        for (m, disk) in model.members.values().zip(disks) {
            match disk {
                Ok(disk) => {
                    let ip = self.member_ip(m.id, m.site);
                    self.members.insert(
                        m.id,
                        MemberProc {
                            id: m.id,
                            site: m.site,
                            version: m.version,
                            ip,
                            disk,
                            child: None,
                            apiserver: None,
                            apiserver_restarts: Restarts::default(),
                        },
                    );
                }
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let cluster = self.initial_cluster();
        let ids: Vec<MemberId> = self.members.keys().copied().collect();
        // One after the other, each once its peer port answers HTTP: a new member first asks its
        // peers whether it is already bootstrapped, and a peer whose port is open but not yet
        // serving holds that question for etcd's 1 s bootstrap timeout.
        for id in ids {
            self.spawn_member(id, &cluster, "new")?;
            let addr = SocketAddrV4::new(self.members[&id].ip, PEER_PORT);
            wait_http(addr, deadline.saturating_duration_since(Instant::now()).min(PEER_ANSWER_BOUND)).await;
        }
        self.start_haproxy().await?;
        let urls: Vec<String> = self.members.values().map(|m| m.client_url()).collect();
        for url in &urls {
            let left = deadline.saturating_duration_since(Instant::now());
            super::etcd::wait_caught_up(url, &urls, left).await.map_err(|e| {
                LocalError::Environment(format!("stack did not become healthy: {e} (see {}/logs)", self.cfg.run_dir.display()))
            })?;
        }
        if self.cfg.stack == Stack::ControlPlane {
            self.api = Some(ApiPki::create(&self.cfg.run_dir, &self.cfg.run_id)?);
            self.start_apiservers = true;
            let ids: Vec<MemberId> = self.members.keys().copied().collect();
            for id in ids {
                self.spawn_apiserver(id)?;
            }
            self.wait_apiservers_ready(Instant::now() + APISERVERS_READY_BOUND).await?;
        }
        Ok(())
    }

    /// Waits (until `deadline`, polling every [`READYZ_POLL`]) for every apiserver's `/readyz`;
    /// one that exits is started again as kubelet would (see [`Testbed::wait_apiserver_ready`]).
    pub async fn wait_apiservers_ready(&mut self, deadline: Instant) -> Result<(), LocalError> {
        let ids: Vec<MemberId> = self.members.keys().copied().collect();
        for id in ids {
            self.wait_apiserver_ready(id, deadline).await?;
        }
        Ok(())
    }

    /// Waits (until `deadline`, polling every [`READYZ_POLL`]) for machine `id`'s apiserver to
    /// answer `/readyz` with 200, as kubeadm waits for a restarted static pod before it moves
    /// to the next machine. One that exits meanwhile is started again after kubelet's back-off
    /// ([`Testbed::supervise_apiservers`]), as on a kubeadm machine: kube-apiserver exits when
    /// its RBAC bootstrap does not finish in time (`PostStartHook "rbac/bootstrap-roles" failed:
    /// unable to initialize roles: timed out`), which a loaded 2-core machine met at bring-up,
    /// its etcd leaderless for a while. Nothing to wait for without apiservers.
    pub async fn wait_apiserver_ready(&mut self, id: MemberId, deadline: Instant) -> Result<(), LocalError> {
        let Some(api) = &self.api else { return Ok(()) };
        if !self.start_apiservers || !self.members.contains_key(&id) {
            return Ok(());
        }
        let prober = crate::targets::kube::command::HttpProber::new(Some(&api.ca_file()), false)
            .map_err(|e| LocalError::Environment(e.to_string()))?;
        let (name, url) = (id.to_string(), format!("{}/readyz", self.members[&id].api_url()));
        let logs = format!("see {}/logs/{name}-apiserver.log", self.cfg.run_dir.display());
        loop {
            let last = match prober.answer(&url, READYZ_POLL * 10).await {
                Ok(a) if a.status == 200 => return Ok(()),
                Ok(a) if a.status == 403 => {
                    "status 403: the anonymous /readyz is refused until the apiserver's RBAC bootstrap has written its roles".into()
                }
                Ok(a) => format!("status {}: {}", a.status, crate::targets::api::probe::failing_checks(&a.body)),
                Err(e) => e.to_string(),
            };
            self.supervise_apiservers();
            if Instant::now() > deadline {
                let down = self.apiserver_down_why(id).map(|why| format!("; {why}")).unwrap_or_default();
                return Err(LocalError::Environment(format!("{name}'s kube-apiserver not ready ({last}{down}); {logs}")));
            }
            tokio::time::sleep(READYZ_POLL).await;
        }
    }

    /// The API load balancer, `https://127.S.0.1:6443` (the control-plane stack).
    pub fn api_endpoint_url(&self) -> String {
        format!("https://{}", super::apiserver::lb_addr(self.slot))
    }

    /// Starts machine `id`'s kube-apiserver unless it runs (the control-plane stack; nothing for
    /// the etcd stack).
    pub fn spawn_apiserver(&mut self, id: MemberId) -> Result<(), LocalError> {
        let Some(api) = &self.api else { return Ok(()) };
        let bin = self
            .cfg
            .binaries
            .kube_apiserver
            .as_ref()
            .map(|b| b.0.clone())
            .ok_or_else(|| LocalError::Environment("the control-plane stack needs kube-apiserver (--kube-apiserver PATH)".into()))?;
        let m = self.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        let name = m.name();
        let (cert, key) = api.serving_cert(&name, m.ip, *super::apiserver::lb_addr(self.slot).ip())?;
        let flags = api.flags(&name, m.ip, &m.client_url(), &cert, &key);
        let gid = self.process_gid(m.site);
        let m = self.members.get_mut(&id).expect("checked above");
        if m.apiserver.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None))) {
            return Ok(());
        }
        let (out, err) = log_file(&self.cfg.run_dir, &format!("{name}-apiserver"))?;
        let child = Command::new(&bin)
            .args(&flags)
            .gid(gid)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| LocalError::Environment(format!("cannot start {} ({name}): {e}", bin.display())))?;
        tracing::debug!(member = %id, pid = child.id(), "started kube-apiserver");
        m.apiserver = Some(child);
        m.apiserver_restarts.started = Some(Instant::now());
        m.apiserver_restarts.due = None;
        Ok(())
    }

    /// Why machine `id`'s apiserver is not running, when it exited on its own and waits for its
    /// restart: for the verdict that finds it unreachable.
    pub fn apiserver_down_why(&self, id: MemberId) -> Option<String> {
        let m = self.members.get(&id)?;
        let r = &m.apiserver_restarts;
        match (&m.apiserver, &r.last_exit, r.due) {
            (None, Some(exit), Some(due)) => Some(format!(
                "its process exited ({exit}; {} in a row, see logs/{id}-apiserver.log) and kubelet's back-off restarts it in {} s",
                r.exits,
                due.saturating_duration_since(Instant::now()).as_secs()
            )),
            _ => None,
        }
    }

    /// What a kubeadm machine's kubelet does for its kube-apiserver static pod, which the
    /// testbed otherwise lacks: an apiserver that exited on its own (not one an op stopped) while
    /// its machine's etcd runs is started again after kubelet's CrashLoopBackOff. kube-apiserver
    /// ≥ 1.19 exits when it cannot reach etcd while it starts (kubernetes/kubernetes#89858) — its
    /// only etcd is its machine's member, which a rolling upgrade or a restart starts a moment
    /// before it — and on a real machine kubelet brings it back; without this, one slow member
    /// start left a machine's API down for the rest of a run (control-plane test, seed 22).
    /// Called whenever the target is observed and while an apiserver is waited for; what it did
    /// waits in [`Testbed::take_supervision`] for the event log.
    pub fn supervise_apiservers(&mut self) {
        if self.api.is_none() || !self.start_apiservers {
            return;
        }
        let now = Instant::now();
        let mut done = vec![];
        let ids: Vec<MemberId> = self.members.keys().copied().collect();
        for id in ids {
            let m = self.members.get_mut(&id).expect("listed above");
            let etcd_runs = m.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)));
            if let Some(Ok(Some(status))) = m.apiserver.as_mut().map(|c| c.try_wait()) {
                m.apiserver = None;
                let r = &mut m.apiserver_restarts;
                if r.started.is_some_and(|t| now.duration_since(t) >= BACKOFF_RESET) {
                    r.exits = 0;
                }
                r.exits += 1;
                let wait = crash_loop_backoff(r.exits);
                r.due = Some(now + wait);
                r.last_exit = Some(status.to_string());
                done.push(format!(
                    "{id}'s kube-apiserver exited ({status}; exit {} in a row; see logs/{id}-apiserver.log): kubelet's back-off restarts it in {} s",
                    r.exits,
                    wait.as_secs()
                ));
            }
            let m = self.members.get_mut(&id).expect("listed above");
            if m.apiserver.is_none() && etcd_runs && m.apiserver_restarts.due.is_some_and(|t| now >= t) {
                match self.spawn_apiserver(id) {
                    Ok(()) => done.push(format!("{id}'s kube-apiserver restarted (as kubelet restarts a static pod)")),
                    Err(e) => done.push(format!("{id}'s kube-apiserver could not be restarted: {e}")),
                }
            }
        }
        self.supervision.extend(done);
    }

    /// What [`Testbed::supervise_apiservers`] did since the last call.
    pub fn take_supervision(&mut self) -> Vec<String> {
        std::mem::take(&mut self.supervision)
    }

    /// `name=peer-url,…` for the members the testbed runs.
    pub fn initial_cluster(&self) -> String {
        self.members.values().map(|m| format!("{}={}", m.name(), m.peer_url())).collect::<Vec<_>>().join(",")
    }

    /// Adds a member process record with a fresh disk (not started).
    pub async fn add_member(&mut self, id: MemberId, site: SiteId, version: Version) -> Result<&MemberProc, LocalError> {
        let disk = Disk::create(&self.cfg.run_dir, &id.to_string(), self.cfg.disks).await?;
        let ip = self.member_ip(id, site);
        self.members
            .insert(id, MemberProc { id, site, version, ip, disk, child: None, apiserver: None, apiserver_restarts: Restarts::default() });
        Ok(&self.members[&id])
    }

    /// The group id a process of `site` runs with: the site's with loop disks (root), else ours.
    fn process_gid(&self, site: SiteId) -> u32 {
        if self.cfg.disks == DiskMode::Loop {
            self.site_gid(site)
        } else {
            // SAFETY: getegid has no preconditions.
            unsafe { libc::getegid() }
        }
    }

    /// The group id every etcd of `site` runs with (site isolation drops traffic by it).
    pub fn site_gid(&self, site: SiteId) -> u32 {
        2_000_000 + self.slot as u32 * 16 + site.0 as u32
    }

    /// The /24 of `site`.
    pub fn site_subnet(&self, site: SiteId) -> Ipv4Addr {
        Ipv4Addr::new(127, self.slot, site.0 + 1, 0)
    }

    /// The nftables table of this run.
    pub fn nft_table(&self) -> String {
        super::nft::table_name(&self.cfg.run_id)
    }

    /// Shuts member `id`'s filesystem down (FS_IOC_SHUTDOWN, freeze first: see
    /// [`super::disk::shutdown`]): every read and write fails with EIO from now on, as when a disk
    /// is detached under a running machine; what was fsync'd stays on the device.
    pub fn shutdown_disk(&mut self, id: MemberId) -> Result<(), LocalError> {
        let m = self.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        let Disk::Loop { mount, .. } = &m.disk else {
            return Err(LocalError::Unsupported("disk faults need loop-mounted disks (root)".into()));
        };
        super::disk::shutdown(mount)
    }

    /// Unmounts member `id`'s disk, checks it (e2fsck -p) and mounts it again.
    pub async fn remount_disk(&mut self, id: MemberId) -> Result<(), LocalError> {
        let m = self.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        m.disk.remount().await
    }

    /// Gives member `id` a fresh, empty disk in place of its old one.
    pub async fn replace_disk(&mut self, id: MemberId) -> Result<(), LocalError> {
        let m = self.members.get_mut(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        m.disk.release();
        m.disk = Disk::create(&self.cfg.run_dir, &id.to_string(), self.cfg.disks).await?;
        Ok(())
    }

    /// Starts member `id`'s etcd (its version's binary) on its data directory.
    pub fn spawn_member(&mut self, id: MemberId, initial_cluster: &str, state: &str) -> Result<(), LocalError> {
        let m = self.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        let binary =
            self.cfg.binaries.etcd.get(&m.version).ok_or_else(|| LocalError::Environment(format!("no etcd {} binary", m.version)))?;
        let (bin, bin_failpoints) = (&binary.path, binary.failpoints.is_some());
        let (out, err) = log_file(&self.cfg.run_dir, &m.name())?;
        let data = m.disk.data_dir();
        let child = Command::new(bin)
            .args(["--name", &m.name()])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &m.client_url(), "--advertise-client-urls", &m.client_url()])
            .args(["--listen-peer-urls", &m.peer_url(), "--initial-advertise-peer-urls", &m.peer_url()])
            .args(["--initial-cluster", initial_cluster, "--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.cfg.run_id])
            .args(["--heartbeat-interval", &self.cfg.heartbeat_ms.to_string()])
            .args(["--election-timeout", &self.cfg.election_ms.to_string()])
            .args(self.cfg.etcd.args())
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .envs(failpoint_endpoint(bin_failpoints, m.ip))
            .gid(self.process_gid(m.site))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| LocalError::Environment(format!("cannot start {} ({}): {e}", bin.display(), m.name())))?;
        tracing::debug!(member = %id, pid = child.id(), version = %m.version, "started etcd");
        self.members.get_mut(&id).expect("checked above").child = Some(child);
        if self.start_apiservers {
            self.spawn_apiserver(id)?;
        }
        Ok(())
    }

    /// The exit status of member `id`'s process if it has exited (reaped; `None` while it runs
    /// or when it has no process).
    pub fn exit_status(&mut self, id: MemberId) -> Option<std::process::ExitStatus> {
        self.members.get_mut(&id)?.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Sends `sig` to member `id`'s process (and to its machine's apiserver).
    pub fn signal(&mut self, id: MemberId, sig: i32) -> Result<(), LocalError> {
        let m = self.members.get(&id);
        let pid = m.and_then(|m| m.pid()).ok_or_else(|| LocalError::Stack(format!("{id} has no process")))?;
        for pid in [Some(pid), m.and_then(|m| m.apiserver_pid())].into_iter().flatten() {
            // SAFETY: kill(2) on our own child's pid.
            if unsafe { libc::kill(pid, sig) } != 0 {
                return Err(LocalError::Environment(format!("kill({pid}, {sig}) failed: {}", std::io::Error::last_os_error())));
            }
        }
        Ok(())
    }

    /// `kill -9` and reap member `id`'s process and its machine's apiserver (polled, so the
    /// runtime keeps running).
    pub async fn kill(&mut self, id: MemberId) -> Result<(), LocalError> {
        self.kill_apiserver(id).await?;
        self.kill_member_only(id).await
    }

    /// `kill -9` and reap member `id`'s etcd only (its apiserver keeps running).
    pub async fn kill_member_only(&mut self, id: MemberId) -> Result<(), LocalError> {
        let m = self.members.get_mut(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        if let Some(mut c) = m.child.take() {
            let _ = c.kill();
            reap_child(id, c).await;
        }
        Ok(())
    }

    /// `kill -9` and reap machine `id`'s apiserver, if it has one.
    pub async fn kill_apiserver(&mut self, id: MemberId) -> Result<(), LocalError> {
        let m = self.members.get_mut(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        // The machine went down (or the op stopped the pod on purpose): kubelet's back-off
        // starts afresh.
        m.apiserver_restarts = Restarts::default();
        if let Some(mut c) = m.apiserver.take() {
            let _ = c.kill();
            reap_child(id, c).await;
        }
        Ok(())
    }

    /// Graceful stop: SIGCONT + SIGTERM (etcd hands leadership over), SIGKILL after `grace`.
    /// The machine's apiserver goes first, the same way.
    pub async fn stop(&mut self, id: MemberId, grace: Duration) -> Result<(), LocalError> {
        let m = self.members.get_mut(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        m.apiserver_restarts = Restarts::default();
        if let Some(c) = m.apiserver.take() {
            stop_child(id, c, grace).await;
        }
        let m = self.members.get_mut(&id).expect("checked above");
        let Some(c) = m.child.take() else { return Ok(()) };
        stop_child(id, c, grace).await;
        Ok(())
    }

    /// Removes member `id` from the testbed: kills its process and releases its disk.
    pub async fn remove_member(&mut self, id: MemberId) -> Result<(), LocalError> {
        self.kill(id).await?;
        if let Some(m) = self.members.remove(&id) {
            m.disk.release();
        }
        Ok(())
    }
}

/// SIGCONT + SIGTERM, SIGKILL after `grace`; reaped.
async fn stop_child(id: MemberId, mut c: Child, grace: Duration) {
    let pid = c.id() as i32;
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(pid, libc::SIGCONT);
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
    tracing::warn!(member = %id, pid, "did not stop within {}ms of SIGTERM; killing it", grace.as_millis());
    let _ = c.kill();
    reap_child(id, c).await;
}

impl Testbed {
    /// HAProxy in front of the members (and of the apiservers): it takes a server out after three
    /// failed checks in a row and cuts its sessions, as a cloud or kubeadm-style load balancer
    /// does. A check may take 1 s: with 300 ms and two failures, healthy members and apiservers
    /// answering slowly on a loaded 2-core machine were marked down, all at once (`backend
    /// 'apiservers' has no server available!`, 84 member and 13 apiserver checks timed out at
    /// 300 ms in one control-plane run), and the load balancer closed the workload's connections
    /// — a false alarm of the testbed's own. kubeadm's HA guide gives HAProxy 10 s; the testbed
    /// keeps a paused server's detection within a few seconds (3 checks × (inter + 1 s)).
    fn haproxy_config(&self) -> String {
        let check = if self.cfg.bug == Some(PlantedBug::EndpointNoHealthCheck) { "" } else { " check" };
        let mut cfg = format!(
            "# shakedown run {run}\n\
             global\n  maxconn 2000\n  hard-stop-after 2s\n  log stderr format raw daemon notice\n\n\
             defaults\n  mode tcp\n  log global\n  timeout connect 500ms\n  timeout client 60s\n  timeout server 60s\n  timeout check 1s\n  retries 2\n  option redispatch\n\n\
             frontend etcd\n  bind {ep}\n  default_backend members\n\n\
             backend members\n  balance roundrobin\n  option httpchk GET /health\n  http-check expect status 200\n  \
             default-server inter 100ms fall 3 rise 1 on-marked-down shutdown-sessions\n",
            run = self.cfg.run_id,
            ep = self.endpoint_addr(),
        );
        for m in self.members.values() {
            cfg.push_str(&format!("  server {} {}:{CLIENT_PORT}{check}\n", m.name(), m.ip));
        }
        if self.cfg.stack == Stack::ControlPlane {
            // TLS passes through (mode tcp); the check speaks TLS to /readyz, as a cloud load
            // balancer in front of kubeadm's apiservers does.
            let check = if self.cfg.bug == Some(PlantedBug::ApiLbNoHealthCheck) { "" } else { " check check-ssl verify none" };
            cfg.push_str(&format!(
                "\nfrontend api\n  bind {lb}\n  default_backend apiservers\n\n\
                 backend apiservers\n  balance roundrobin\n  option httpchk GET /readyz\n  http-check expect status 200\n  \
                 default-server inter 200ms fall 3 rise 1 on-marked-down shutdown-sessions\n",
                lb = super::apiserver::lb_addr(self.slot),
            ));
            for m in self.members.values() {
                cfg.push_str(&format!("  server {}-apiserver {}:{API_PORT}{check}\n", m.name(), m.ip));
            }
        }
        cfg
    }

    /// Writes the HAProxy config for the current members and (re)starts HAProxy; a reload hands
    /// over from the old process with -sf.
    pub async fn start_haproxy(&mut self) -> Result<(), LocalError> {
        let path = self.cfg.run_dir.join("haproxy.cfg");
        std::fs::write(&path, self.haproxy_config())
            .map_err(|e| LocalError::Environment(format!("cannot write {}: {e}", path.display())))?;
        let (out, err) = log_file(&self.cfg.run_dir, "haproxy")?;
        let mut cmd = Command::new(&self.cfg.binaries.haproxy);
        cmd.arg("-db").arg("-f").arg(&path);
        if let Some(old) = &self.haproxy {
            cmd.args(["-sf", &old.id().to_string()]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| LocalError::Environment(format!("cannot start haproxy ({}): {e}", self.cfg.binaries.haproxy.display())))?;
        if let Some(old) = self.haproxy.replace(child) {
            self.retired.push(old);
        }
        self.retired.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
        // Bounded wait for the frontend to accept connections.
        let addr = self.endpoint_addr();
        let deadline = Instant::now() + HAPROXY_START_BOUND;
        while Instant::now() < deadline {
            if let Ok(Ok(_)) = tokio::time::timeout(EXIT_POLL * 10, tokio::net::TcpStream::connect(addr)).await {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.haproxy.as_mut().map(|c| c.try_wait()) {
                return Err(LocalError::Environment(format!(
                    "haproxy exited ({status}); see {}/logs/haproxy.log",
                    self.cfg.run_dir.display()
                )));
            }
            tokio::time::sleep(EXIT_POLL * 2).await;
        }
        Err(LocalError::Environment(format!("haproxy does not accept connections on {addr} after {}s", HAPROXY_START_BOUND.as_secs())))
    }

    /// Leaves the stack running after this value is dropped (`shakedown testbed up`);
    /// `shakedown testbed down` or `shakedown reap` removes it later by its run directory.
    pub fn detach(mut self) {
        self.torn_down = true;
        for m in self.members.values_mut() {
            m.child.take();
            m.apiserver.take();
        }
        self.haproxy.take();
        self.retired.clear();
    }

    /// Kills every process, releases every disk, then sweeps the run directory for anything
    /// left. Idempotent; runs from Drop too, so a panic or an early return still cleans up.
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        let mut children: Vec<Child> = self.members.values_mut().flat_map(|m| [m.apiserver.take(), m.child.take()]).flatten().collect();
        children.extend(self.haproxy.take());
        children.append(&mut self.retired);
        for c in &mut children {
            let _ = c.kill();
        }
        for c in &mut children {
            let _ = c.wait();
        }
        for m in self.members.values() {
            m.disk.release();
        }
        self.members.clear();
        super::nft::delete_table(&self.nft_table());
        let left = reap::sweep(&self.cfg.run_dir);
        if !left.is_empty() {
            tracing::warn!("teardown swept leftovers: {left:?}");
        }
        let _ = std::fs::remove_dir_all(self.cfg.run_dir.join("disks"));
        let _ = std::fs::remove_dir_all(self.cfg.run_dir.join("members"));
    }
}

/// Waits (polling, bounded by [`REAP_BOUND`]) for a child that was sent SIGKILL to exit; one
/// that does not is left to teardown's sweep.
async fn reap_child(id: MemberId, mut c: Child) {
    let deadline = Instant::now() + REAP_BOUND;
    while Instant::now() < deadline {
        if !matches!(c.try_wait(), Ok(None)) {
            return;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
    tracing::warn!(member = %id, pid = c.id(), "not reaped within {}s of SIGKILL", REAP_BOUND.as_secs());
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apiserver_restarts_back_off_as_kubelet_does() {
        let secs: Vec<u64> = (1..=8).map(|n| crash_loop_backoff(n).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 300, 300, 300]);
    }
}
